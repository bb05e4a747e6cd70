//! The soak's processes and filesystem: a versitygw that can be stopped and started
//! again on the same port and data, `lsvd serve` with its log kept across restarts,
//! and a small filesystem for `--data` that the test can fill.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::common::{LSVD, Poller, free_tcp_port, poll_until};

fn hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    crate::common::fill_random(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id()),
        &mut b,
    );
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A throwaway versitygw (posix backend) on 127.0.0.1; killed on drop.
pub struct Gateway {
    bin: PathBuf,
    root: PathBuf,
    pub port: u16,
    access: String,
    secret: String,
    pub bucket: String,
    child: Option<Child>,
    starts: u32,
}

impl Gateway {
    /// Start a gateway keeping its buckets under `root` (a bucket is a directory).
    pub fn start(bin: PathBuf, root: &Path) -> Gateway {
        let bucket = format!("soak-{}", hex(4));
        std::fs::create_dir_all(root.join(&bucket)).expect("create bucket dir");
        let mut gw = Gateway {
            bin,
            root: root.to_path_buf(),
            port: 0,
            access: format!("soak{}", hex(6)),
            secret: hex(20),
            bucket,
            child: None,
            starts: 0,
        };
        for _ in 0..10 {
            gw.port = free_tcp_port();
            if gw.spawn(Duration::from_secs(30)) {
                return gw;
            }
        }
        panic!("versitygw {} did not start", gw.bin.display());
    }

    fn log_path(&self) -> PathBuf {
        self.root.join(format!("versitygw-{}.log", self.starts))
    }

    /// Start the server on `self.port`; true once it accepts connections.
    fn spawn(&mut self, timeout: Duration) -> bool {
        self.starts += 1;
        let mut gateway = Command::new(&self.bin);
        gateway
            .env("ROOT_ACCESS_KEY", &self.access)
            .env("ROOT_SECRET_KEY", &self.secret)
            .arg("--port")
            .arg(format!("127.0.0.1:{}", self.port))
            .args([Path::new("posix"), &self.root]);
        let child = crate::common::spawn_logging(&mut gateway, &self.log_path());
        self.child = Some(child);
        let mut poll = Poller::new(Duration::from_millis(50), timeout);
        while poll.tick_blocking() {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            if let Some(c) = self.child.as_mut()
                && c.try_wait().ok().flatten().is_some()
            {
                self.child = None;
                return false;
            }
        }
        self.stop();
        false
    }

    /// Stop the server (SIGKILL: the store vanishes mid-request).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port and data; retried while the port is busy.
    pub fn restart(&mut self) {
        let mut poll = Poller::new(Duration::from_millis(500), Duration::from_secs(60));
        while poll.tick_blocking() {
            if self.spawn(Duration::from_secs(20)) {
                return;
            }
        }
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        panic!("versitygw did not restart on port {}\n{log}", self.port);
    }

    pub fn store_url(&self) -> String {
        format!("s3://{}/soak", self.bucket)
    }

    /// Point `cmd` (an lsvd command) at this server.
    pub fn env(&self, cmd: &mut Command) {
        for v in [
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_ENDPOINT",
            "AWS_ENDPOINT_URL_S3",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
        ] {
            cmd.env_remove(v);
        }
        cmd.env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", self.port),
        )
        .env("AWS_ACCESS_KEY_ID", &self.access)
        .env("AWS_SECRET_ACCESS_KEY", &self.secret)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One `lsvd serve` incarnation after another on the same data dir and store, all
/// logging to one file; SIGKILLed on drop.
pub struct Lsvd {
    pub data: PathBuf,
    pub socket: PathBuf,
    pub metrics: String,
    store: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Lsvd {
    pub fn new(data: &Path, socket: &Path, log: &Path, store: String, args: &[&str]) -> Lsvd {
        Lsvd {
            data: data.to_path_buf(),
            socket: socket.to_path_buf(),
            metrics: String::new(),
            store,
            args: args.iter().map(|s| s.to_string()).collect(),
            log: log.to_path_buf(),
            child: None,
        }
    }

    pub fn cmd(&self, gw: &Gateway, args: &[&str]) -> Command {
        let mut c = Command::new(LSVD);
        c.env_remove("LSVD_DATA")
            .env_remove("LSVD_STORE")
            .env_remove("LSVD_LOG")
            .arg("--data")
            .arg(&self.data)
            .arg("--store")
            .arg(&self.store)
            .args(args);
        gw.env(&mut c);
        c
    }

    /// Start `lsvd serve` and wait until it accepts connections.
    pub fn start(&mut self, gw: &Gateway) {
        self.metrics = format!("127.0.0.1:{}", free_tcp_port());
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let _ = writeln!(log, "===== soak: lsvd serve starts =====");
        let mut c = self.cmd(gw, &["serve"]);
        c.args(&self.args)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--metrics")
            .arg(&self.metrics)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        let _ = std::fs::remove_file(&self.socket);
        self.child = Some(c.spawn().expect("spawn lsvd serve"));
        let mut poll = Poller::new(Duration::from_millis(50), Duration::from_secs(180));
        loop {
            assert!(
                poll.tick_blocking(),
                "lsvd serve did not start\n{}",
                self.log()
            );
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && crate::soak_support::metrics_text(&self.metrics).is_some()
            {
                return;
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!("lsvd serve exited ({st}) before serving\n{}", self.log());
            }
        }
    }

    fn signal(&mut self, sig: i32) -> ExitStatus {
        let mut child = self.child.take().expect("lsvd running");
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let exited = poll_until(Duration::from_secs(180), || {
            child.try_wait().expect("try_wait")
        });
        exited.unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lsvd did not exit after signal {sig}\n{}", self.log());
        })
    }

    /// SIGINT: must exit 0 after "stopped cleanly".
    pub fn stop_clean(&mut self) {
        let st = self.signal(libc::SIGINT);
        let log = self.log();
        let last = log
            .rsplit("===== soak: lsvd serve starts")
            .next()
            .unwrap_or("");
        assert!(
            st.success() && last.contains("lsvd: stopped cleanly"),
            "lsvd did not stop cleanly ({st})\n{log}"
        );
    }

    pub fn kill9(&mut self) {
        let st = self.signal(libc::SIGKILL);
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Lsvd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
