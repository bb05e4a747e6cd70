//! The real `lsvd serve` process: start it, talk NBD to it, SIGKILL it; pause and
//! resume it (SIGSTOP, SIGCONT), run `lsvd sync` against it, and run two of them on
//! one store from two data directories (two hosts).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::record::{LOG_ALIGN_BYTES, RECORD_MAGIC};

use super::nbd::NbdConn;
use crate::common::poll_until_async;

pub const VOLUME: &str = "v";

/// Has the server's write log released every record? Reads the newest cache
/// superblock and looks for a record with the tail sequence number where the next
/// record would be. Only meaningful while the disk is idle.
pub fn log_drained(wlog: &Path) -> io::Result<bool> {
    let f = File::open(wlog)?;
    let mut a = vec![0u8; CACHE_SUPER_BYTES];
    let mut b = vec![0u8; CACHE_SUPER_BYTES];
    f.read_exact_at(&mut a, 0)?;
    f.read_exact_at(&mut b, CACHE_SUPER_BYTES as u64)?;
    let sb = newest_cache_super(&a, &b)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    if sb.local_key_id.is_some() {
        // Its records cannot be read here (`--encrypt-local`): ask `lsvd sync`.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "an encrypted write log: use a Syncer",
        ));
    }
    for at in [sb.tail_offset, sb.log_start] {
        let mut h = vec![0u8; LOG_ALIGN_BYTES as usize];
        if f.read_exact_at(&mut h, at).is_err() {
            continue;
        }
        // magic 0..8, version, flags, header bytes, volume 16..32, seq 32..40
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&h[32..40]);
        if &h[..8] == RECORD_MAGIC
            && h[16..32] == sb.volume.0
            && u64::from_le_bytes(seq) == sb.tail_seq
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Settings of one server.
#[derive(Debug, Clone)]
pub struct ServerArgs {
    pub batch_size: String,
    pub batch_timeout_ms: u64,
    pub uploads: usize,
    pub read_cache_size: String,
    pub gc_start: f64,
    pub gc_policy: String,
    /// `--log-free-target`.
    pub log_free_target: String,
    /// `--gc-headroom`.
    pub gc_headroom: String,
    /// `--gc-defrag-hole`.
    pub gc_defrag_hole: String,
}

pub struct Server {
    pub data: PathBuf,
    /// The store lives outside the data directory, so the data directory can be lost.
    /// Server logs go next to it.
    pub store: PathBuf,
    /// `--store`: `file://STORE`, or under `LSVD_TEST_STORE=s3` the S3 prefix standing
    /// for it (`common::store_url_for`).
    pub store_url: String,
    pub socket: PathBuf,
    args: ServerArgs,
    /// Flags every start of this server adds to `lsvd serve` (a lease timeout).
    pub extra: Vec<String>,
    /// Names this server's logs apart from another's on the same store (`a`, `b`).
    tag: String,
    child: Arc<Mutex<Option<Child>>>,
    starts: u32,
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lsvd")
}

/// The key file every command gets when the oracle runs on an encrypted volume
/// (`LSVD_ORACLE_ENCRYPT=1`): 32 bytes, made once per test process.
fn oracle_key_file() -> Option<&'static Path> {
    static KEY: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let on = std::env::var("LSVD_ORACLE_ENCRYPT").is_ok_and(|v| v == "1");
        on.then(|| {
            let path = std::env::temp_dir().join(format!("lsvd-oracle-{}.key", std::process::id()));
            std::fs::write(&path, crate::common::random_bytes(0x006b_6579, 32))
                .expect("write the oracle's key file");
            path
        })
    })
    .as_deref()
}

/// `lsvd`, with the oracle's key file when it runs encrypted.
fn lsvd_command() -> Command {
    let mut c = Command::new(bin());
    c.env_remove("LSVD_KEY_FILE");
    if let Some(key) = oracle_key_file() {
        c.env("LSVD_KEY_FILE", key);
    }
    c
}

/// Does the oracle run encrypted (`LSVD_ORACLE_ENCRYPT=1`)? Its servers then encrypt
/// their write log and read cache too (`--encrypt-local`), and store barriers are
/// `lsvd sync` (the log's records cannot be read from outside).
pub fn encrypting() -> bool {
    oracle_key_file().is_some()
}

/// What `lsvd create` adds for the volume the oracle crashes: `--encrypt` under
/// `LSVD_ORACLE_ENCRYPT=1`, `--compression C` under `LSVD_ORACLE_COMPRESSION=C`.
fn create_flags() -> Vec<String> {
    let mut flags = Vec::new();
    if oracle_key_file().is_some() {
        flags.push("--encrypt".to_string());
    }
    if let Ok(c) = std::env::var("LSVD_ORACLE_COMPRESSION") {
        flags.extend(["--compression".to_string(), c]);
    }
    flags
}

impl Server {
    /// Create the volume (`size` like "16M") in a fresh data directory.
    pub fn create(data: &Path, store: &Path, size: &str, args: ServerArgs) -> io::Result<Server> {
        let store_url = crate::common::store_url_for(store);
        let out = lsvd_command()
            .arg("--data")
            .arg(data)
            .arg("--store")
            .arg(&store_url)
            .args(["create", VOLUME, "--size", size])
            .args(create_flags())
            .env("LSVD_LOG", "warn")
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "lsvd create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // What was asked for is what the volume is (a run meant to be encrypted that
        // is not would pass without showing anything).
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            said.contains("encrypted"),
            oracle_key_file().is_some(),
            "lsvd create: {said}"
        );
        if let Ok(c) = std::env::var("LSVD_ORACLE_COMPRESSION") {
            assert!(
                said.contains(&format!("compressed with {c}")),
                "lsvd create: {said}"
            );
        }
        Ok(Server::attach(data, store, args, ""))
    }

    /// A server of the volume already created in `store`, with its own data directory
    /// (another host): `tag` names its logs.
    pub fn attach(data: &Path, store: &Path, args: ServerArgs, tag: &str) -> Server {
        Server {
            data: data.to_path_buf(),
            store: store.to_path_buf(),
            store_url: crate::common::store_url_for(store),
            socket: data.join("nbd.sock"),
            args,
            extra: Vec::new(),
            tag: tag.to_string(),
            child: Arc::new(Mutex::new(None)),
            starts: 0,
        }
    }

    /// Name this server's logs `serve-TAG-N.log`.
    pub fn set_tag(&mut self, tag: &str) {
        self.tag = tag.to_string();
    }

    pub fn wlog(&self) -> PathBuf {
        self.data.join(format!("{VOLUME}.wlog"))
    }

    fn stderr_path(&self, n: u32) -> PathBuf {
        let name = if self.tag.is_empty() {
            format!("serve-{n}.log")
        } else {
            format!("serve-{}-{n}.log", self.tag)
        };
        self.store.parent().unwrap_or(&self.store).join(name)
    }

    /// The last lines the server printed (for failure messages).
    pub fn stderr_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Everything the current (or last) start printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.stderr_path(self.starts)).unwrap_or_default()
    }

    /// Its process id while it runs (or ran, unreaped).
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Send `sig` to the server (SIGSTOP, SIGCONT); false if it is not running.
    pub fn signal(&self, sig: libc::c_int) -> bool {
        signal_child(&self.child, sig)
    }

    /// Has the server exited? (Its status, once.)
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.try_wait()
    }

    /// Wait up to `within` for the server to exit on its own.
    pub async fn wait_exit(&self, within: Duration) -> Option<std::process::ExitStatus> {
        poll_until_async(within, || std::future::ready(self.try_wait())).await
    }

    /// GC passes and bytes moved over the volume's life, from the newest checkpoint in
    /// the store (`lsvd info`; best effort while the server runs).
    pub fn lifetime_gc(&self) -> Option<(u64, u64)> {
        let out = lsvd_command()
            .arg("--data")
            .arg(&self.data)
            .arg("--store")
            .arg(&self.store_url)
            .args(["info", VOLUME, "--json"])
            .env("LSVD_LOG", "error")
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some((v["gc_passes"].as_u64()?, v["gc_moved_bytes"].as_u64()?))
    }

    /// A handle that runs `lsvd sync` against this server's data directory.
    pub fn syncer(&self) -> Syncer {
        Syncer {
            data: self.data.clone(),
            store_url: self.store_url.clone(),
        }
    }

    /// Start the server and connect `conns` NBD connections.
    pub async fn start(&mut self, conns: usize) -> io::Result<Vec<Arc<NbdConn>>> {
        self.spawn()?;
        self.connect(conns).await
    }

    /// Start the server process without waiting for it.
    pub fn spawn(&mut self) -> io::Result<()> {
        self.spawn_with(&[])
    }

    /// Start the server process with `flags` added to `lsvd serve` this time.
    pub fn spawn_with(&mut self, flags: &[&str]) -> io::Result<()> {
        self.starts += 1;
        std::fs::create_dir_all(&self.data)?;
        let log = File::create(self.stderr_path(self.starts))?;
        let gc_stop = if self.args.gc_start == 0.0 {
            0.75
        } else {
            self.args.gc_start + 0.08
        };
        let child = lsvd_command()
            .arg("--data")
            .arg(&self.data)
            .arg("--store")
            .arg(&self.store_url)
            .args(["serve", VOLUME, "--no-probe", "--socket"])
            .arg(&self.socket)
            .args(["--log-size", "16M", "--batch-size", &self.args.batch_size])
            .args([
                "--batch-timeout-ms",
                &self.args.batch_timeout_ms.to_string(),
            ])
            .args(["--uploads", &self.args.uploads.to_string()])
            .args(["--checkpoint-every", "3"])
            .args(["--read-cache-size", &self.args.read_cache_size])
            .args(["--gc-start", &self.args.gc_start.to_string()])
            .args(["--gc-stop", &gc_stop.to_string()])
            .args(["--gc-policy", &self.args.gc_policy])
            .args(["--log-free-target", &self.args.log_free_target])
            .args(["--gc-headroom", &self.args.gc_headroom])
            .args(["--gc-defrag-hole", &self.args.gc_defrag_hole])
            .args(&self.extra)
            .args(flags)
            .args(encrypting().then_some("--encrypt-local"))
            .env("LSVD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    /// Wait until the server accepts connections (recovery done), then connect.
    pub async fn connect(&mut self, conns: usize) -> io::Result<Vec<Arc<NbdConn>>> {
        self.connect_within(conns, Duration::from_secs(120)).await
    }

    /// [`Server::connect`], waiting at most `within` (a standby waits for a takeover).
    pub async fn connect_within(
        &mut self,
        conns: usize,
        within: Duration,
    ) -> io::Result<Vec<Arc<NbdConn>>> {
        let this = &*self;
        let first = poll_until_async(within, || async move {
            if let Some(status) = this.try_wait() {
                return Some(Err(io::Error::other(format!(
                    "lsvd serve exited during startup ({status}):\n{}",
                    this.stderr_tail()
                ))));
            }
            if this.socket.exists()
                && let Ok(c) = NbdConn::connect(&this.socket, VOLUME).await
            {
                return Some(Ok(c));
            }
            None
        })
        .await
        .unwrap_or_else(|| {
            Err(io::Error::other(format!(
                "lsvd serve did not accept connections within {} s:\n{}",
                within.as_secs(),
                self.stderr_tail()
            )))
        })?;
        let mut out = vec![Arc::new(first)];
        for _ in 1..conns {
            out.push(Arc::new(NbdConn::connect(&self.socket, VOLUME).await?));
        }
        Ok(out)
    }

    fn try_wait(&self) -> Option<std::process::ExitStatus> {
        let mut g = self.child.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// A handle that SIGKILLs the server (usable from a crash hook).
    pub fn killer(&self) -> impl Fn() + Send + Sync + 'static {
        let child = self.child.clone();
        move || {
            if let Some(c) = child.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                let _ = c.kill();
            }
        }
    }

    /// A handle that sends `sig` to the server (a crash hook that pauses it).
    pub fn signaller(&self, sig: libc::c_int) -> impl Fn() + Send + Sync + 'static {
        let child = self.child.clone();
        move || {
            signal_child(&child, sig);
        }
    }

    /// SIGKILL the server and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> io::Result<std::process::ExitStatus> {
        let taken = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut c) = taken else {
            return Err(io::Error::other("server not running"));
        };
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        c.wait()
    }
}

/// Send `sig` to a child that has not exited (never to a reaped pid, which another
/// process may have by now).
fn signal_child(child: &Mutex<Option<Child>>, sig: libc::c_int) -> bool {
    let mut g = child.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = g.as_mut() else {
        return false;
    };
    if !matches!(c.try_wait(), Ok(None)) {
        return false;
    }
    // SAFETY: kill(2) on the pid of a child we own that has not been reaped.
    unsafe { libc::kill(c.id() as libc::pid_t, sig) == 0 }
}

/// `lsvd sync` of one server's data directory (usable from a task of its own).
#[derive(Debug, Clone)]
pub struct Syncer {
    data: PathBuf,
    store_url: String,
}

impl Syncer {
    /// Run `lsvd sync`, given up (killed) after `within`: Ok(true) once every write
    /// the server acknowledged before the command is in the store, Ok(false) when the
    /// command failed or took too long.
    pub async fn sync(&self, within: Duration) -> io::Result<bool> {
        let mut child = lsvd_command()
            .arg("--data")
            .arg(&self.data)
            .arg("--store")
            .arg(&self.store_url)
            .args(["sync", VOLUME])
            .env("LSVD_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        match poll_until_async(within, || std::future::ready(child.try_wait().transpose())).await {
            Some(exited) => Ok(exited?.success()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Ok(false)
            }
        }
    }
}

impl Server {
    /// SIGTERM, and wait up to `within` for it to exit (a clean stop uploads
    /// everything first); SIGKILL and an error if it does not.
    pub async fn stop_within(&mut self, within: Duration) -> io::Result<std::process::ExitStatus> {
        if !self.signal(libc::SIGTERM) {
            return match self.exited() {
                Some(st) => Ok(st),
                None => Err(io::Error::other("server not running")),
            };
        }
        match self.wait_exit(within).await {
            Some(st) => Ok(st),
            None => {
                self.kill();
                Err(io::Error::other(format!(
                    "did not stop within {} s of SIGTERM:\n{}",
                    within.as_secs(),
                    self.stderr_tail()
                )))
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
