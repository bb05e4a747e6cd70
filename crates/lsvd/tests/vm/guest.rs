//! The guest: a Debian cloud kernel and a busybox initramfs (built by
//! `scripts/vm/build-assets.sh`) under `qemu-system-x86_64 -accel tcg`, its disk an lsvd
//! export attached as virtio-blk over NBD. The guest's `/init` (`scripts/vm/init.sh`)
//! reports on its second serial port (qemu's stdout here) in lines starting with `@@ `
//! and waits at each barrier for one line on the same port (qemu's stdin); its first
//! serial port, the kernel console, goes to a log file.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::{Duration, Instant};

use crate::common::{require_tools, run_timeout};

/// What `LSVD_VM_SKIP` must be set to for the test to skip (instead of fail) when the
/// guest cannot be built or run.
pub const SKIP_ENV: &str = "LSVD_VM_SKIP";

/// Longest wait for one line from the guest. Booting takes about 5 s under TCG, and a
/// 512 KiB file about 2 s, on an idle machine; a loaded 2-core machine is much slower.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(180);

/// The kernel and initramfs the guest boots.
pub struct Assets {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// Builds (or finds, when nothing changed) the guest's assets under
/// `target/vm-assets`. `None` only when they cannot be built and `LSVD_VM_SKIP=1` says
/// that is fine; otherwise a missing tool fails the test, naming what to install.
pub fn assets() -> Option<Assets> {
    match try_assets() {
        Ok(a) => Some(a),
        Err(why) if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED ({SKIP_ENV}=1): the VM crash test cannot run here: {why}"
            );
            None
        }
        Err(why) => panic!(
            "the VM crash test cannot run: {why}\n\
             Install its tools with scripts/install-test-deps.sh (qemu-system-x86, \
             linux-image-cloud-amd64, busybox-static, e2fsprogs, cpio), or set \
             {SKIP_ENV}=1 to skip it on a machine that cannot run a VM."
        ),
    }
}

fn repo_root() -> PathBuf {
    // crates/lsvd -> the workspace root
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn try_assets() -> Result<Assets, String> {
    let path = format!(
        "/usr/bin:/usr/sbin:/bin:/sbin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    if !std::env::split_paths(&path).any(|d| d.join("qemu-system-x86_64").is_file()) {
        return Err("qemu-system-x86_64 is not installed".into());
    }
    let root = repo_root();
    let out_dir = root.join("target/vm-assets");
    let script = root.join("scripts/vm/build-assets.sh");
    let out = run_timeout(
        Command::new("bash")
            .arg(&script)
            .arg(&out_dir)
            .env("PATH", &path),
        Duration::from_secs(300),
    );
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Assets {
        kernel: out_dir.join("vmlinuz"),
        initrd: out_dir.join("initramfs.cpio.gz"),
    })
}

/// How a boot starts: format the disk, or check it first (and, for `Final`, stop after
/// the check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Mkfs,
    Check,
    Final,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Mkfs => "mkfs",
            Mode::Check => "check",
            Mode::Final => "final",
        }
    }
}

/// A running qemu. Killed (SIGKILL) on drop.
pub struct Guest {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub console: PathBuf,
    /// Every `@@` line received, for failure messages.
    pub transcript: Vec<String>,
}

/// Parameters of one boot.
pub struct Boot<'a> {
    pub mode: Mode,
    pub round: u32,
    pub seed: u32,
    /// A second barrier after this many synced files (0: none).
    pub barrier: u32,
    pub socket: &'a Path,
    pub export: &'a str,
    pub console: PathBuf,
}

impl Guest {
    pub fn boot(assets: &Assets, b: Boot<'_>) -> Guest {
        require_tools(&["qemu-system-x86_64"]);
        let append = format!(
            "console=ttyS0 loglevel=4 panic=-1 lsvd.mode={} lsvd.round={} lsvd.seed={} lsvd.barrier={}",
            b.mode.arg(),
            b.round,
            b.seed,
            b.barrier
        );
        // cache=none: the guest sees a write-back cache, so its fsyncs become virtio
        // flushes and qemu sends them to lsvd as NBD_CMD_FLUSH.
        let drive = format!(
            "file=nbd+unix:///{}?socket={},format=raw,if=virtio,cache=none",
            b.export,
            b.socket.display()
        );
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "512", "-smp", "1"])
            .args(["-nodefaults", "-no-reboot", "-display", "none"])
            .arg("-kernel")
            .arg(&assets.kernel)
            .arg("-initrd")
            .arg(&assets.initrd)
            .args(["-append", &append])
            .arg("-serial")
            .arg(format!("file:{}", b.console.display()))
            .args(["-serial", "stdio", "-drive", &drive])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn qemu-system-x86_64");
        let stdout = child.stdout.take().expect("qemu stdout");
        let stdin = child.stdin.take();
        // Bounded: the guest prints a few hundred lines per boot at most, and the test
        // reads them as they come.
        let (tx, rx) = sync_channel(4096);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let line = line.trim_end_matches('\r');
                if let Some(rest) = line.strip_prefix("@@ ")
                    && tx.send(rest.to_string()).is_err()
                {
                    break;
                }
            }
        });
        Guest {
            child: Some(child),
            stdin,
            lines: rx,
            console: b.console,
            transcript: Vec::new(),
        }
    }

    /// The next `@@` line, or `None` once qemu closed its output (it exited or was
    /// killed). Panics after `timeout`.
    pub fn next_line_within(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => {
                self.transcript.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!(
                    "no line from the guest within {timeout:?}\n{}",
                    self.describe()
                )
            }
        }
    }

    /// The next `@@` line, if one arrives before `deadline` and qemu's output is
    /// still open.
    pub fn line_before(&mut self, deadline: Instant) -> Option<String> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let l = self.lines.recv_timeout(wait).ok()?;
        self.transcript.push(l.clone());
        Some(l)
    }

    /// The next line, which must start with `word`; returns the rest. A `FATAL` line or
    /// the end of output fails the test.
    pub fn expect(&mut self, word: &str) -> String {
        let line = self.next_line_within(LINE_TIMEOUT);
        match line {
            Some(l) if l.split(' ').next() == Some(word) => {
                l[word.len()..].trim_start().to_string()
            }
            other => panic!(
                "expected `{word}` from the guest, got {other:?}\n{}",
                self.describe()
            ),
        }
    }

    /// Lets the guest go on from a barrier.
    pub fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("qemu stdin");
        stdin
            .write_all(b"GO\n")
            .and_then(|()| stdin.flush())
            .expect("write to the guest's serial port");
    }

    /// SIGKILL (the VM's power is cut) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for qemu to exit by itself (the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) {
        let mut child = self.child.take().expect("qemu running");
        match crate::common::poll_until(timeout, || child.try_wait().expect("try_wait qemu")) {
            Some(st) => assert!(st.success(), "qemu exited with {st}\n{}", self.describe()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("qemu did not exit within {timeout:?}\n{}", self.describe());
            }
        }
    }

    /// The protocol transcript and the tail of the kernel console, for failures.
    pub fn describe(&self) -> String {
        let console = std::fs::read_to_string(&self.console).unwrap_or_default();
        let tail: Vec<&str> = console.lines().rev().take(40).collect();
        let lines: Vec<&str> = tail.into_iter().rev().collect();
        let start = self.transcript.len().saturating_sub(60);
        format!(
            "--- guest protocol (last {} lines) ---\n{}\n--- kernel console {} (tail) ---\n{}",
            self.transcript.len() - start,
            self.transcript[start..].join("\n"),
            self.console.display(),
            lines.join("\n")
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}
