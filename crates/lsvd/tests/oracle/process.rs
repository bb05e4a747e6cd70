//! The real `lsvd serve` process: start it, talk NBD to it, SIGKILL it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::record::{LOG_ALIGN_BYTES, RECORD_MAGIC};

use super::nbd::NbdConn;

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
    child: Arc<Mutex<Option<Child>>>,
    starts: u32,
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lsvd")
}

impl Server {
    /// Create the volume (`size` like "16M") in a fresh data directory.
    pub fn create(data: &Path, store: &Path, size: &str, args: ServerArgs) -> io::Result<Server> {
        let store_url = crate::common::store_url_for(store);
        let out = Command::new(bin())
            .arg("--data")
            .arg(data)
            .arg("--store")
            .arg(&store_url)
            .args(["create", VOLUME, "--size", size])
            .env("LSVD_LOG", "warn")
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "lsvd create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(Server {
            data: data.to_path_buf(),
            store: store.to_path_buf(),
            store_url,
            socket: data.join("nbd.sock"),
            args,
            child: Arc::new(Mutex::new(None)),
            starts: 0,
        })
    }

    pub fn wlog(&self) -> PathBuf {
        self.data.join(format!("{VOLUME}.wlog"))
    }

    fn stderr_path(&self, n: u32) -> PathBuf {
        self.store
            .parent()
            .unwrap_or(&self.store)
            .join(format!("serve-{n}.log"))
    }

    /// The last lines the server printed (for failure messages).
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.stderr_path(self.starts)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// GC passes and bytes moved over the volume's life, from the newest checkpoint in
    /// the store (`lsvd info`; best effort while the server runs).
    pub fn lifetime_gc(&self) -> Option<(u64, u64)> {
        let out = Command::new(bin())
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

    /// Start the server and connect `conns` NBD connections.
    pub async fn start(&mut self, conns: usize) -> io::Result<Vec<Arc<NbdConn>>> {
        self.spawn()?;
        self.connect(conns).await
    }

    /// Start the server process without waiting for it.
    pub fn spawn(&mut self) -> io::Result<()> {
        self.starts += 1;
        std::fs::create_dir_all(&self.data)?;
        let log = File::create(self.stderr_path(self.starts))?;
        let gc_stop = if self.args.gc_start == 0.0 {
            0.75
        } else {
            self.args.gc_start + 0.08
        };
        let child = Command::new(bin())
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
        let deadline = Instant::now() + Duration::from_secs(120);
        let first = loop {
            if let Some(status) = self.try_wait() {
                return Err(io::Error::other(format!(
                    "lsvd serve exited during startup ({status}):\n{}",
                    self.stderr_tail()
                )));
            }
            if self.socket.exists()
                && let Ok(c) = NbdConn::connect(&self.socket, VOLUME).await
            {
                break c;
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "lsvd serve did not accept connections within 120 s:\n{}",
                    self.stderr_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
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

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
