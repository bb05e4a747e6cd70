//! Shared harness for the end-to-end tests: temp dirs, running `lsvd` and real NBD
//! clients with timeouts, a server guard that never leaks a process, deterministic
//! data, and file comparison.
//!
//! Every test gets its own temp dir (data dir, store, Unix socket), so the tests in one
//! binary can run concurrently. Servers listen on a Unix socket in that dir only; no
//! fixed TCP ports.
//!
//! # The store under test
//!
//! By default every [`Lsvd`] keeps its volumes in a local directory (`file://`). With
//! `LSVD_TEST_STORE=s3` they live in an S3 bucket instead, under a prefix derived from
//! the store directory's path (see [`store_url_for`]), so the same tests run against a
//! real S3 server:
//!
//! ```text
//! scripts/with-versitygw.sh env LSVD_TEST_STORE=s3 cargo test -p lsvd --test persistence
//! ```
//!
//! `scripts/with-versitygw.sh` starts a throwaway versitygw and exports the
//! `AWS_*` variables and `LSVD_TEST_S3_BUCKET` this needs; `LSVD_TEST_STORE=s3` without
//! them is an error, never a silent fallback to the local store. A test that cannot run
//! against S3 returns early through [`skip_on_s3`], which says why.
//!
//! `LSVD_TEST_STORE=az` does the same in an Azure container (`az://CONTAINER/...`)
//! under `scripts/with-azurite.sh`, which exports `AZURE_STORAGE_USE_EMULATOR`,
//! `AZURITE_BLOB_STORAGE_URL` and `LSVD_TEST_AZ_CONTAINER`. "S3" in [`store_is_s3`]
//! and [`skip_on_s3`] then means any cloud store: not a local directory.
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod pki;
pub mod store_checks;

/// The binary under test.
pub const LSVD: &str = env!("CARGO_BIN_EXE_lsvd");

/// Write-log size for every test server (the 1 GiB default is fallocated).
pub const LOG_SIZE: &str = "64M";
/// Read-cache size for every test server (the 1 GiB default is fallocated too).
pub const READ_CACHE_SIZE: &str = "64M";

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// An nbdsh script (for a volume of 16 MiB or more) writing six marked MiB, a page of
/// 0x77 at 15 MiB and flushing: the chain tests' data, checked by [`CHAIN_CHECK`].
pub const CHAIN_WRITE: &str = "h = connect()\n\
    pattern = bytes(range(256)) * 4096\n\
    for i in range(6):\n    h.pwrite(bytes([i]) + pattern[1:], i << 20)\n\
    h.pwrite(b'\\x77' * 4096, 15 << 20)\n\
    h.flush()\n";

/// The nbdsh script checking what [`CHAIN_WRITE`] wrote (and a page at 10 MiB never
/// written reads as zeros).
pub const CHAIN_CHECK: &str = "h = connect()\n\
    pattern = bytes(range(256)) * 4096\n\
    for i in range(6):\n    assert h.pread(1 << 20, i << 20) == bytes([i]) + pattern[1:], i\n\
    assert h.pread(4096, 15 << 20) == b'\\x77' * 4096\n\
    assert h.pread(4096, 10 << 20) == bytes(4096)\n";

/// Timeout for short commands (create, info, nbdinfo...).
pub const SHORT: Duration = Duration::from_secs(60);
/// Timeout for data-moving commands (nbdcopy, fio, mkfs...).
pub const LONG: Duration = Duration::from_secs(300);

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let clean: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(24)
        .collect();
    format!("lsvd-it-{}-{n}-{clean}", std::process::id())
}

/// A directory under the system temp dir, removed (recursively) on drop unless
/// `keep` is set (a failed run keeps it for post-mortems) or `LSVD_IT_KEEP` is.
pub struct TempDir {
    path: PathBuf,
    pub keep: bool,
}

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique(test));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path, keep: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }

    /// Creates and returns a subdirectory.
    pub fn subdir(&self, name: &str) -> PathBuf {
        let p = self.path.join(name);
        std::fs::create_dir_all(&p).expect("create subdir");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep || std::env::var_os("LSVD_IT_KEEP").is_some() {
            eprintln!("keeping {}", self.path.display());
            if let Some(url) = s3_prefix_url(&self.path) {
                eprintln!("keeping {url}");
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
        // The stores of every `Lsvd` made under this dir live under its S3 prefix.
        remove_s3_prefix(&self.path);
    }
}

// ---------------------------------------------------------------------------------
// The store under test: a local directory, or a prefix in an S3 bucket
// ---------------------------------------------------------------------------------

/// Where the tests keep their volumes (`LSVD_TEST_STORE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestStore {
    /// `file://DIR` (the default; `LSVD_TEST_STORE` unset, empty or `local`).
    Local,
    /// `SCHEME://BUCKET/RUN/PATH` (`LSVD_TEST_STORE=s3`, `s3://`; or `az`, `az://`
    /// with the container as `bucket`): `RUN` is unique to this test process, `PATH`
    /// is the store directory's path under the temp dir.
    S3 {
        scheme: &'static str,
        bucket: String,
        run: String,
    },
    /// `chain:DIR/d0+DIR/m0,DIR/d1+DIR/m1,DIR/d2+DIR/m2?drive_size=24M`
    /// (`LSVD_TEST_STORE=chain`): a mirrored chain of three drives under the store
    /// directory, small enough that the tail moves.
    Chain,
}

/// Variables `LSVD_TEST_STORE=az` needs (exported by `scripts/with-azurite.sh`).
pub const AZ_ENV: [&str; 2] = ["AZURE_STORAGE_USE_EMULATOR", "LSVD_TEST_AZ_CONTAINER"];

/// Variables `LSVD_TEST_STORE=s3` needs (exported by `scripts/with-versitygw.sh`).
pub const S3_ENV: [&str; 4] = [
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "LSVD_TEST_S3_BUCKET",
];

/// The variable `name`, or None when it is unset or empty.
pub fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Why a test needing an S3 server (or the versitygw binary) fails rather than skips
/// when there is none, if it does: `LSVD_TEST_STORE=s3`, `LSVD_REQUIRE_S3` (not 0),
/// or `LSVD_TEST_S3=require`.
pub fn s3_required() -> Option<&'static str> {
    if env_nonempty("LSVD_TEST_STORE").as_deref() == Some("s3") {
        Some("LSVD_TEST_STORE=s3")
    } else if env_nonempty("LSVD_REQUIRE_S3").is_some_and(|v| v != "0") {
        Some("LSVD_REQUIRE_S3 is set")
    } else if env_nonempty("LSVD_TEST_S3").as_deref() == Some("require") {
        Some("LSVD_TEST_S3=require")
    } else {
        None
    }
}

/// A test that cannot run here (`msg` says why and how to run it): a failure when
/// `required` says why it must run, else a loud SKIPPED banner on stderr (straight
/// there: libtest captures `eprintln!` of passing tests).
pub fn skip_loudly(msg: &str, required: Option<String>) {
    if let Some(why) = required {
        panic!("{msg}\nNot skipped: {why}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n{0}\nSKIPPED {msg}\n{0}",
        "=".repeat(78)
    );
}

/// Which of `names` are unset (or empty).
pub fn missing_env(names: &[&'static str]) -> Vec<&'static str> {
    names
        .iter()
        .copied()
        .filter(|v| env_nonempty(v).is_none())
        .collect()
}

/// Which of the [`S3_ENV`] variables a test against a real S3 server needs are unset.
pub fn missing_s3_env() -> Vec<&'static str> {
    missing_env(&S3_ENV)
}

/// The versitygw binary: `LSVD_VERSITYGW`, else where scripts/install-versitygw.sh
/// puts it (`$LSVD_TOOLS_DIR/bin` or `<repo>/.tools/bin`), else `versitygw` on PATH.
pub fn find_versitygw() -> Option<PathBuf> {
    if let Some(p) = env_nonempty("LSVD_VERSITYGW") {
        return Some(PathBuf::from(p));
    }
    let tools = env_nonempty("LSVD_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools"));
    let p = tools.join("bin/versitygw");
    if p.is_file() {
        return Some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("versitygw"))
        .find(|p| p.is_file())
}

/// The store selected by `LSVD_TEST_STORE`. Panics, naming what is missing, when it
/// says `s3` but the server's variables are not set, or when it names no known store.
pub fn test_store() -> &'static TestStore {
    static STORE: OnceLock<TestStore> = OnceLock::new();
    let run = || {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("it-{nanos:x}-{}", std::process::id())
    };
    STORE.get_or_init(|| match env_nonempty("LSVD_TEST_STORE").as_deref() {
        None | Some("local") | Some("file") => TestStore::Local,
        Some("chain") => TestStore::Chain,
        Some(scheme @ ("az" | "s3")) => {
            // The variables it needs, the one naming the bucket, the script setting them.
            let (scheme, needed, bucket, script): (_, &[&'static str], _, _) = match scheme {
                "az" => (
                    "az",
                    &AZ_ENV,
                    "LSVD_TEST_AZ_CONTAINER",
                    "scripts/with-azurite.sh (it starts Azurite and sets them)",
                ),
                _ => (
                    "s3",
                    &S3_ENV,
                    "LSVD_TEST_S3_BUCKET",
                    "scripts/with-versitygw.sh (it starts an S3 server and sets them)",
                ),
            };
            let missing = missing_env(needed);
            assert!(
                missing.is_empty(),
                "LSVD_TEST_STORE={scheme} but {} unset: run the tests through {script}, e.g. \
                 {} env LSVD_TEST_STORE={scheme} cargo test -p lsvd --test cli",
                missing.join(", "),
                script.split(' ').next().unwrap_or_default()
            );
            TestStore::S3 {
                scheme,
                bucket: env_nonempty(bucket).expect("checked above"),
                run: run(),
            }
        }
        Some(other) => {
            panic!("LSVD_TEST_STORE={other}: expected `s3`, `az`, `chain` or `local`")
        }
    })
}

/// True when volumes live in a cloud store (S3, or Azure under `LSVD_TEST_STORE=az`).
pub fn store_is_s3() -> bool {
    matches!(test_store(), TestStore::S3 { .. })
}

/// Returns true (after saying so on stderr) when the tests run against S3, for a test
/// that only makes sense on the local store: `if skip_on_s3("why") { return; }`.
pub fn skip_on_s3(reason: &str) -> bool {
    if !store_is_s3() {
        return false;
    }
    // Straight to stderr: libtest captures `eprintln!` of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED on a cloud store (LSVD_TEST_STORE=s3 or az): {reason}"
    );
    true
}

/// The part of an S3 key a local path stands for: its path under the temp dir (or the
/// whole path), each component reduced to `[A-Za-z0-9._-]`.
fn s3_path_part(path: &Path) -> String {
    let rel = path.strip_prefix(std::env::temp_dir()).unwrap_or(path);
    let parts: Vec<String> = rel
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => Some(
                s.to_string_lossy()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect::<String>(),
            ),
            _ => None,
        })
        .filter(|s| !s.is_empty() && s != "." && s != "..")
        .collect();
    parts.join("/")
}

/// `s3://BUCKET/RUN/PATH` for a local path under S3, `None` on the local store.
fn s3_prefix_url(path: &Path) -> Option<String> {
    match test_store() {
        TestStore::Local | TestStore::Chain => None,
        TestStore::S3 {
            scheme,
            bucket,
            run,
        } => Some(format!("{scheme}://{bucket}/{run}/{}", s3_path_part(path))),
    }
}

/// The `--store` URL standing for the store directory `store_dir`: `file://DIR`, or
/// under `LSVD_TEST_STORE=s3` a prefix in the test bucket that is the same every time
/// for the same directory (so a restart or a fresh data dir finds the volumes) and
/// different for every directory.
pub fn store_url_for(store_dir: &Path) -> String {
    if *test_store() == TestStore::Chain {
        let d = store_dir.display();
        return format!("chain:{d}/d0+{d}/m0,{d}/d1+{d}/m1,{d}/d2+{d}/m2?drive_size=24M");
    }
    s3_prefix_url(store_dir).unwrap_or_else(|| format!("file://{}", store_dir.display()))
}

/// Deletes every object under the S3 prefix standing for `path` (nothing on the local
/// store). Best effort: a leftover only costs space in a throwaway bucket.
pub fn remove_s3_prefix(path: &Path) {
    let Some(url) = s3_prefix_url(path) else {
        return;
    };
    // A thread with its own runtime: callers may be inside an async runtime already.
    let worker = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let store = lsvd_store::open_store(&url).map_err(|e| e.to_string())?;
            let entries = store.list("").await.map_err(|e| e.to_string())?;
            for e in entries {
                store.delete(&e.key).await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        })
    });
    match worker.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("warning: cleaning up the test's S3 prefix: {e}"),
        Err(_) => eprintln!("warning: cleaning up the test's S3 prefix panicked"),
    }
}

// ---------------------------------------------------------------------------------
// Running commands
// ---------------------------------------------------------------------------------

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn clip(bytes: &[u8]) -> String {
    const MAX: usize = 6000;
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX {
        return text.into_owned();
    }
    let mut cut = text.len() - MAX;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...[{cut} bytes clipped]...{}", &text[cut..])
}

/// Human-readable summary of a finished command, for assertion messages.
pub fn show(cmd: &str, out: &Output) -> String {
    format!(
        "command: {cmd}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        clip(&out.stdout),
        clip(&out.stderr)
    )
}

/// Runs `cmd` (stdin closed, output captured) and kills it if it outlives `timeout`.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{what}`: {e} (is the tool installed? run scripts/install-test-deps.sh)"
            )
        });
    let mut so = child.stdout.take().expect("stdout pipe");
    let mut se = child.stderr.take().expect("stderr pipe");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let exited = poll_until(timeout, || child.try_wait().expect("try_wait"));
    let timed_out = exited.is_none();
    let status = exited.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait after kill")
    });
    let out = Output {
        status,
        stdout: t_out.join().expect("stdout reader"),
        stderr: t_err.join().expect("stderr reader"),
    };
    if timed_out {
        panic!("timed out after {timeout:?}\n{}", show(&what, &out));
    }
    out
}

/// Runs `cmd` and panics with its output unless it exits 0.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Output {
    let what = describe(cmd);
    let out = run_timeout(cmd, timeout);
    assert!(
        out.status.success(),
        "command failed\n{}",
        show(&what, &out)
    );
    out
}

/// Spawns `cmd` with no stdin and its stdout and stderr both going to a new file `log`.
pub fn spawn_logging(cmd: &mut Command, log: &Path) -> Child {
    let out = File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let err = out.try_clone().expect("dup the log file");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", describe(cmd)))
}

/// Checks that `out` (of `what`) is a usage error, exit status 2; returns its stderr.
pub fn usage_error(out: &Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(2), "{}", show(what, out));
    stderr(out)
}

/// The client's flags, then NBD_OPT_EXPORT_NAME for `export`: the end of a newstyle
/// handshake for a client that asks for nothing else.
pub fn export_name_option(client_flags: u32, export: &str) -> Vec<u8> {
    let mut msg = client_flags.to_be_bytes().to_vec();
    msg.extend_from_slice(b"IHAVEOPT");
    msg.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    msg.extend_from_slice(&(export.len() as u32).to_be_bytes());
    msg.extend_from_slice(export.as_bytes());
    msg
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A command for a Debian tool, with `/usr/bin` first in PATH (a pyenv `python3`
/// earlier in PATH would hide `python3-libnbd` from `nbdsh`).
pub fn tool(program: &str) -> Command {
    let mut c = Command::new(program);
    let path = std::env::var("PATH").unwrap_or_default();
    c.env("PATH", format!("/usr/bin:/usr/sbin:/bin:/sbin:{path}"));
    c
}

/// Panics unless every named command is on PATH (with `/usr/bin` first).
pub fn require_tools(names: &[&str]) {
    let path = format!(
        "/usr/bin:/usr/sbin:/bin:/sbin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            !std::env::split_paths(&path).any(|d| {
                let p = d.join(n);
                p.is_file()
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "missing test tools {missing:?}: run scripts/install-test-deps.sh (needs libnbd-bin, python3-libnbd, qemu-utils, fio, nbdkit, fuse3, e2fsprogs, openssl)"
    );
}

// ---------------------------------------------------------------------------------
// The lsvd CLI and server
// ---------------------------------------------------------------------------------

/// The global options of one `lsvd` installation: a data dir and, optionally, a store
/// URL outside it.
#[derive(Clone, Debug)]
pub struct Lsvd {
    pub data: PathBuf,
    /// `None`: lsvd's default, `file://DATA/store`.
    pub store: Option<String>,
}

impl Lsvd {
    /// The data dir `data` with lsvd's default store, `DATA/store`; under
    /// `LSVD_TEST_STORE=s3` the S3 prefix standing for that directory instead.
    pub fn new(data: impl Into<PathBuf>) -> Lsvd {
        let data = data.into();
        let store = store_is_s3().then(|| store_url_for(&data.join("store")));
        Lsvd { data, store }
    }

    /// The data dir `data` with its store in `store_dir` (or, under
    /// `LSVD_TEST_STORE=s3`, the S3 prefix standing for `store_dir`).
    pub fn with_store(data: impl Into<PathBuf>, store_dir: &Path) -> Lsvd {
        Lsvd {
            data: data.into(),
            store: Some(store_url_for(store_dir)),
        }
    }

    /// `lsvd --data DATA [--store URL] ARGS...`, hermetic against LSVD_* in the
    /// environment.
    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new(LSVD);
        c.env_remove("LSVD_DATA")
            .env_remove("LSVD_STORE")
            .env_remove("LSVD_LOG")
            .arg("--data")
            .arg(&self.data);
        if let Some(s) = &self.store {
            c.arg("--store").arg(s);
        }
        c.args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        run_timeout(&mut self.cmd(args), SHORT)
    }

    pub fn run_ok(&self, args: &[&str]) -> Output {
        run_ok(&mut self.cmd(args), SHORT)
    }

    /// Runs `lsvd ARGS` for each `(ARGS, needles)` case: it must succeed and print
    /// every needle on stdout.
    pub fn assert_stdout_mentions(&self, cases: &[(&[&str], &[&str])]) {
        for (args, needles) in cases {
            let out = self.run(args);
            let text = stdout(&out);
            assert!(out.status.success(), "{}", show(&format!("{args:?}"), &out));
            for n in *needles {
                assert!(
                    text.contains(n),
                    "`lsvd {args:?}` should mention {n}:\n{text}"
                );
            }
        }
    }

    pub fn create(&self, name: &str, size: &str) {
        self.run_ok(&["create", name, "--size", size]);
    }

    pub fn info_json(&self, name: &str) -> serde_json::Value {
        let out = self.run_ok(&["info", name, "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("info --json is not JSON: {e}\n{}", stdout(&out)))
    }

    /// `lsvd serve ARGS --socket SOCKET --log-size 64M --read-cache-size 64M` (either
    /// size left out if ARGS sets it), and `--no-probe` (no disk measurement on first
    /// start, the built-in defaults) unless ARGS has `--probe-profiles` (which is taken
    /// out): tests/probe_settings.rs.
    pub fn serve_cmd(&self, socket: &Path, args: &[&str]) -> Command {
        let mut cmd = self.cmd(["serve"]);
        let use_profiles = args.contains(&"--probe-profiles");
        let args: Vec<&str> = args
            .iter()
            .copied()
            .filter(|a| *a != "--probe-profiles")
            .collect();
        if !use_profiles {
            cmd.arg("--no-probe");
        }
        cmd.args(&args).arg("--socket").arg(socket);
        for (flag, size) in [
            ("--log-size", LOG_SIZE),
            ("--read-cache-size", READ_CACHE_SIZE),
        ] {
            if !args.contains(&flag) {
                cmd.args([flag, size]);
            }
        }
        cmd
    }

    /// Starts [`Lsvd::serve_cmd`] with output to a log file and waits for the socket.
    pub fn serve(&self, socket: &Path, args: &[&str]) -> Server {
        let mut server = self.spawn_serve(socket, args);
        server.wait_ready(Duration::from_secs(90));
        server
    }

    /// Starts [`Lsvd::serve_cmd`] with output to a log file, without waiting.
    pub fn spawn_serve(&self, socket: &Path, args: &[&str]) -> Server {
        assert!(
            socket.as_os_str().len() < 100,
            "socket path {} is too long for a Unix socket (set TMPDIR to a shorter dir)",
            socket.display()
        );
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let log_path = PathBuf::from(format!("{}.server-{n}.log", socket.display()));
        let log = File::create(&log_path).expect("create server log");
        let mut cmd = self.serve_cmd(socket, args);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log);
        let what = describe(&cmd);
        let child = cmd.spawn().expect("spawn lsvd serve");
        Server {
            child: Some(child),
            socket: socket.to_path_buf(),
            log_path,
            what,
        }
    }
}

/// The usual start of a test: a temp dir named after `test`, an [`Lsvd`] keeping its
/// data in `data` there, a new volume `vol` of `size`, and the path of the Unix
/// socket a server of it listens on.
pub fn new_volume(test: &str, size: &str) -> (TempDir, Lsvd, PathBuf) {
    let dir = TempDir::new(test);
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", size);
    let socket = dir.join("nbd.sock");
    (dir, lsvd, socket)
}

/// A running `lsvd serve`. Killed (SIGKILL) on drop if still running.
pub struct Server {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log_path: PathBuf,
    what: String,
}

impl Server {
    fn wait_ready(&mut self, timeout: Duration) {
        if let Err(st) = self.ready_or_exit(timeout) {
            panic!(
                "`{}` exited ({st}) before serving\n--- server log ---\n{}",
                self.what,
                self.log()
            );
        }
    }

    /// Waits until the server accepts connections (`Ok`) or exits (`Err` with its
    /// status); panics if neither happens within `timeout`.
    pub fn ready_or_exit(&mut self, timeout: Duration) -> Result<(), ExitStatus> {
        let socket = self.socket.clone();
        let child = self.child.as_mut().expect("child");
        // A stale socket file may exist before the server replaces it: ready means the
        // file is there and accepts connections.
        let outcome = poll_until(timeout, || {
            if socket.exists() && std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Some(Ok(()));
            }
            child.try_wait().expect("try_wait").map(Err)
        });
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(st)) => {
                self.child = None;
                Err(st)
            }
            None => panic!(
                "`{}`: socket {} did not appear within {timeout:?}\n--- server log ---\n{}",
                self.what,
                socket.display(),
                self.log()
            ),
        }
    }

    /// `nbd+unix:///NAME?socket=PATH`
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    /// Panics (showing the log) unless the server prints every one of `needles`
    /// within 20 s. It binds its socket before it prints its startup lines, so a
    /// loaded machine can show a ready server with a log still empty.
    pub fn assert_log_mentions(&self, needles: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            let missing: Vec<&&str> = needles.iter().filter(|n| !log.contains(*n)).collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the log lacks {missing:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything the server printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("server running");
        // SAFETY: kill(2) on the pid of a child we own and have not reaped yet.
        let rc = unsafe { libc::kill(child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
        let Some(status) = poll_until(timeout, || child.try_wait().expect("try_wait")) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "server did not exit within {timeout:?} after signal {sig}\n--- server log ---\n{}",
                self.log()
            );
        };
        (status, self.log())
    }

    /// SIGINT, wait for exit; returns the exit status and the full server log.
    pub fn interrupt(&mut self) -> (ExitStatus, String) {
        self.interrupt_within(Duration::from_secs(180))
    }

    /// [`Server::interrupt`], panicking unless it exits within `timeout`.
    pub fn interrupt_within(&mut self, timeout: Duration) -> (ExitStatus, String) {
        self.signal_and_wait(libc::SIGINT, timeout)
    }

    /// SIGINT and assert a clean stop: exit 0, "stopped cleanly", no panic.
    pub fn stop_clean(&mut self) -> String {
        self.stop_clean_with(libc::SIGINT)
    }

    /// Sends `sig` (SIGINT or SIGTERM) and asserts a clean stop.
    pub fn stop_clean_with(&mut self, sig: i32) -> String {
        let (status, log) = self.signal_and_wait(sig, Duration::from_secs(180));
        assert!(
            status.success(),
            "server exit status {status} after signal {sig}\n--- server log ---\n{log}"
        );
        assert!(
            log.contains("lsvd: stopped cleanly"),
            "no 'stopped cleanly' after signal {sig}\n--- server log ---\n{log}"
        );
        assert!(!log.contains("panicked"), "server panicked\n{log}");
        log
    }

    /// SIGKILL (a process crash); returns the log.
    pub fn kill9(&mut self) -> String {
        let (status, log) = self.signal_and_wait(libc::SIGKILL, Duration::from_secs(30));
        assert_eq!(status.signal(), Some(libc::SIGKILL), "status {status}");
        log
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------------
// Real clients
// ---------------------------------------------------------------------------------

/// Python helpers available to every `nbdsh` script (`URI` is the export under test).
pub const NBDSH_PRELUDE: &str = r#"
import errno, os, sys
import nbd
URI = os.environ["URI"]

def connect(uri=None, alloc=False, strict=True):
    h = nbd.NBD()
    if alloc:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri or URI)
    if not strict:
        h.set_strict_mode(0)
    return h

def pattern(seed, n):
    # deterministic, position-dependent bytes: no two 8-byte words alike within a buffer
    import struct
    x = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
    out = bytearray(n + 8)
    for i in range(0, n, 8):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        struct.pack_into("<Q", out, i, x)
    return bytes(out[:n])

def expect_err(what, fn, err):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == err, "%s: errno %s (%s), expected %s" % (
            what, errno.errorcode.get(e.errnum), e.string, errno.errorcode.get(err))
        print("%s -> %s" % (what, errno.errorcode.get(e.errnum)))
        return
    raise AssertionError("%s: succeeded, expected %s" % (what, errno.errorcode.get(err)))

def block_status(h, off, n):
    # [(offset, length, flags)] for base:allocation over [off, off+n), merged
    out = []
    pos = off
    while pos < off + n:
        got = []
        def cb(ctx, o, entries, err):
            if ctx == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0
        h.block_status(off + n - pos, pos, cb)
        assert got, "empty block status reply"
        for (length, flags) in got:
            length = min(length, off + n - pos)
            if length == 0:
                break
            if out and out[-1][2] == flags and out[-1][0] + out[-1][1] == pos:
                out[-1] = (out[-1][0], out[-1][1] + length, flags)
            else:
                out.append((pos, length, flags))
            pos += length
    return out

def flags_at(extents, off):
    for (o, l, f) in extents:
        if o <= off < o + l:
            return f
    raise AssertionError("offset %d not covered by %r" % (off, extents))

HOLE = nbd.STATE_HOLE
ZERO = nbd.STATE_ZERO
"#;

/// Runs a Python script under `nbdsh` with `URI` set and [`NBDSH_PRELUDE`] loaded;
/// panics (with the traceback) unless it exits 0. Returns stdout.
pub fn nbdsh(uri: &str, script: &str) -> String {
    let full = format!("{NBDSH_PRELUDE}\n{script}\n");
    let out = run_ok(
        tool("nbdsh").arg("-n").arg("-c").arg(full).env("URI", uri),
        LONG,
    );
    stdout(&out)
}

/// Like [`nbdsh`], but against a fresh `nbdkit memory SIZE` (the reference server).
pub fn nbdsh_on_nbdkit_memory(size: u64, script: &str) -> String {
    let full = format!("{NBDSH_PRELUDE}\n{script}\n");
    let out = run_ok(
        tool("nbdkit")
            .args(["-U", "-", "memory"])
            .arg(size.to_string())
            .arg("--run")
            .arg(r#"URI="$uri" nbdsh -n -c "$NBDSH_SCRIPT""#)
            .env("NBDSH_SCRIPT", full),
        LONG,
    );
    stdout(&out)
}

/// `nbdinfo --json ARGS...` parsed.
pub fn nbdinfo_json(args: &[&str]) -> serde_json::Value {
    let out = run_ok(tool("nbdinfo").arg("--json").args(args), SHORT);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("nbdinfo --json output is not JSON: {e}\n{}", stdout(&out)))
}

// ---------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (xorshift64*), different for each seed.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_random(seed, &mut v);
    v
}

pub fn fill_random(seed: u64, buf: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    let last = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// Writes a `size`-byte image of random data, 1 MiB at a time, with a zero MiB every
/// `zero_every` MiB (0 = none) so clients that detect zeros send zero/trim requests.
pub fn write_random_image(path: &Path, seed: u64, size: u64, zero_every: u64) {
    let mut f = std::io::BufWriter::new(File::create(path).expect("create image"));
    let mut buf = vec![0u8; MIB as usize];
    for i in 0..size.div_ceil(MIB) {
        let n = (size - i * MIB).min(MIB) as usize;
        if zero_every != 0 && i % zero_every == zero_every - 1 {
            buf[..n].fill(0);
        } else {
            fill_random(seed ^ (i + 1).wrapping_mul(0x1000_0001), &mut buf[..n]);
        }
        f.write_all(&buf[..n]).expect("write image");
    }
    f.flush().expect("flush image");
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let entries = lsvd_store::testutil::entries_under(dir).into_iter();
    entries
        .filter(|(_, is_dir)| !is_dir)
        .map(|(p, _)| p)
        .collect()
}

/// In `dir`: `image.raw`, `size` random bytes from `seed` with every 8th MiB zero
/// ([`write_random_image`]), and the path `readback.raw` to read a volume back into.
pub fn random_image_and_scratch(dir: &TempDir, seed: u64, size: u64) -> (PathBuf, PathBuf) {
    let image = dir.join("image.raw");
    write_random_image(&image, seed, size, 8);
    (image, dir.join("readback.raw"))
}

/// Panics (naming the first differing offset) unless the files have equal contents.
pub fn assert_files_equal(a: &Path, b: &Path) {
    let la = std::fs::metadata(a).expect("stat a").len();
    let lb = std::fs::metadata(b).expect("stat b").len();
    assert_eq!(la, lb, "{} and {} differ in size", a.display(), b.display());
    let mut fa = std::io::BufReader::new(File::open(a).expect("open a"));
    let mut fb = std::io::BufReader::new(File::open(b).expect("open b"));
    let mut ba = vec![0u8; MIB as usize];
    let mut bb = vec![0u8; MIB as usize];
    let mut off = 0u64;
    while off < la {
        let n = (la - off).min(MIB) as usize;
        fa.read_exact(&mut ba[..n]).expect("read a");
        fb.read_exact(&mut bb[..n]).expect("read b");
        if ba[..n] != bb[..n] {
            let i = (0..n).find(|&i| ba[i] != bb[i]).unwrap_or(0);
            panic!(
                "{} and {} differ at byte {} (first differing 4K block {})",
                a.display(),
                b.display(),
                off + i as u64,
                (off + i as u64) / 4096
            );
        }
        off += n as u64;
    }
}

/// `nbdcopy --connections 4 SRC DST` (either may be a file or an NBD URI).
pub fn nbdcopy(src: &str, dst: &str) {
    run_ok(
        tool("nbdcopy").args(["--connections", "4", "--requests", "16", src, dst]),
        LONG,
    );
}

/// Binds 127.0.0.1:0 to find a free TCP port (racy, but only briefly).
pub fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// The whole answer (headers and body) of `http://ADDR/metrics`, or None if the
/// endpoint does not answer (yet).
pub fn fetch_metrics(addr: &str) -> Option<String> {
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: lsvd\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The value of metric `lsvd_{name}` of volume `volume` from `lsvd serve --metrics
/// ADDR`, or None if the endpoint does not answer (yet) or lacks it.
pub fn metric(addr: &str, name: &str, volume: &str) -> Option<f64> {
    let text = fetch_metrics(addr)?;
    let prefix = format!("lsvd_{name}{{volume=\"{volume}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------
// Waiting: the only places the integration tests sleep
// ---------------------------------------------------------------------------------

/// How often the polling helpers look again.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// No limit, for [`Poller::new`]: the caller's own stop flag or deadline ends the wait.
pub const NO_LIMIT: Duration = Duration::MAX;

/// The pace of a polling loop: [`Poller::tick`] returns at once the first time, then
/// after one interval each time, and `false` once the limit has passed. Every test
/// that waits for a process, a port, a file or a condition goes through here (mostly
/// through [`poll_until`], [`wait_until`] and [`poll_until_async`]), so the real sleeps
/// of a polling wait exist once.
pub struct Poller {
    every: Duration,
    deadline: Option<Instant>,
    first: bool,
}

impl Poller {
    /// Looks every `every` until `limit` has passed ([`NO_LIMIT`]: never gives up).
    pub fn new(every: Duration, limit: Duration) -> Poller {
        Poller {
            every,
            deadline: Instant::now().checked_add(limit),
            first: true,
        }
    }

    /// Before the next look: false once the limit has passed, else true after one
    /// interval (none before the first look).
    fn next_look(&mut self) -> Option<Duration> {
        if std::mem::take(&mut self.first) {
            return Some(Duration::ZERO);
        }
        match self.deadline {
            Some(at) if Instant::now() >= at => None,
            _ => Some(self.every),
        }
    }

    /// For a blocking test: see [`Poller`].
    pub fn tick_blocking(&mut self) -> bool {
        let Some(pause) = self.next_look() else {
            return false;
        };
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        true
    }

    /// For an async test: see [`Poller`]. Yields to the runtime while it waits.
    pub async fn tick(&mut self) -> bool {
        let Some(pause) = self.next_look() else {
            return false;
        };
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        true
    }
}

/// Calls `probe` every [`POLL_EVERY`] until it returns `Some` or `timeout` passes (then
/// `None`).
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let mut poll = Poller::new(POLL_EVERY, timeout);
    while poll.tick_blocking() {
        if let Some(found) = probe() {
            return Some(found);
        }
    }
    None
}

/// Polls `cond` every [`POLL_EVERY`] until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll_until(timeout, || cond().then_some(())).is_some()
}

/// [`wait_until`] that panics naming `what` when `cond` still fails after `timeout`.
pub fn wait_for(timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(wait_until(timeout, cond), "{what}: not within {timeout:?}");
}

/// [`poll_until`] for async tests: `probe` is awaited each round.
pub async fn poll_until_async<T, F, Fut>(timeout: Duration, probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_every_async(POLL_EVERY, timeout, probe).await
}

/// [`poll_until_async`] looking every `every`: the crash oracle's triggers watch
/// counters every millisecond or two so that a crash lands close to its point.
pub async fn poll_every_async<T, F, Fut>(
    every: Duration,
    limit: Duration,
    mut probe: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut poll = Poller::new(every, limit);
    while poll.tick().await {
        if let Some(found) = probe().await {
            return Some(found);
        }
    }
    None
}

/// [`wait_until`] for async tests, looking every `every`.
pub async fn wait_every_async(
    every: Duration,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> bool {
    poll_every_async(every, limit, || std::future::ready(cond().then_some(())))
        .await
        .is_some()
}

/// [`wait_until`] for async tests.
pub async fn wait_until_async(limit: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_every_async(POLL_EVERY, limit, cond).await
}

/// Lets `length` of real time pass on purpose: a test that checks that nothing happens
/// for a while, or that spaces out events (a pause, a kill after a random delay). Not
/// for waiting on a condition: that is [`Poller`].
pub fn let_time_pass(length: Duration) {
    std::thread::sleep(length);
}

/// [`let_time_pass`] for async tests: yields to the runtime while `length` passes.
pub async fn let_time_pass_async(length: Duration) {
    tokio::time::sleep(length).await;
}

/// [`let_time_pass_async`] of `ms` milliseconds.
pub async fn let_ms_pass(ms: u64) {
    let_time_pass_async(Duration::from_millis(ms)).await;
}

// ---------------------------------------------------------------------------------
// A small filesystem to fill: real ENOSPC for the store fault tests
// ---------------------------------------------------------------------------------

/// A tmpfs of a few MiB mounted on `dir` (created), unmounted on drop, even when the
/// test panics: a filesystem a test can fill to get the real `ENOSPC` a full store
/// disk gives. Mounting needs root; [`SmallTmpfs::mount`] says SKIPPED and returns
/// `None` where it cannot. Drop it before the [`TempDir`] holding `dir` (declare it
/// after), so the directory is removed once unmounted.
pub struct SmallTmpfs {
    path: PathBuf,
}

impl SmallTmpfs {
    /// Mount a tmpfs of `size_mib` MiB on `dir`; `None` (after a SKIPPED line naming
    /// `test`) if this process cannot (not root, no tmpfs, `mount` missing).
    pub fn mount(dir: &Path, size_mib: u64, test: &str) -> Option<SmallTmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let out = if root {
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={size_mib}m"))
                .arg("tmpfs")
                .arg(dir)
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
                    }
                })
        } else {
            Err("not root".to_string())
        };
        match out {
            Ok(()) => Some(SmallTmpfs {
                path: dir.to_path_buf(),
            }),
            Err(why) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED {test}: cannot mount a {size_mib} MiB tmpfs ({why})"
                );
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write a filler file until the filesystem is full (ENOSPC at the last byte a
    /// page can take); returns the bytes written.
    pub fn fill(&self) -> u64 {
        let path = self.path.join("filler");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open filler");
        let mut written = 0u64;
        for chunk in [1usize << 20, 4096, 512, 1] {
            let buf = vec![0x5au8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => written += n as u64,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => panic!("filling {}: {e}", path.display()),
                }
            }
        }
        written
    }

    /// True if a 4 KiB file cannot be created: the filesystem is full.
    pub fn is_full(&self) -> bool {
        let probe = self.path.join("probe");
        let full = std::fs::write(&probe, vec![1u8; 4096]).is_err();
        let _ = std::fs::remove_file(&probe);
        full
    }

    /// Remove the filler: the room it took is free again.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.path.join("filler"));
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Busy (a server still holds a file): detach it now, gone once released.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
