//! S3 credentials without a network: with no keys configured, `lsvd serve` on an
//! `s3://` store fails at once with one line naming the missing keys and the options,
//! and makes no request at all, neither to the S3 endpoint nor to the cloud's
//! instance-metadata endpoint. Only `LSVD_S3_CREDENTIALS=instance` (or `[s3]
//! credentials = "instance"`) lets it ask the metadata endpoint. Both endpoints are
//! local TCP listeners that count connections.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// A loopback listener counting the connections it accepts (closing each at once).
struct Counter {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counter {
    fn start() -> Counter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut poll = common::Poller::new(Duration::from_millis(5), common::NO_LIMIT);
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        drop(conn);
                    }
                    Err(_) => _ = poll.tick_blocking(),
                }
            }
        });
        Counter {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn count(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `lsvd --store s3://bucket/prefix serve` with every `AWS_*` and `LSVD_*` variable
/// removed, the S3 endpoint at `s3` and the instance-metadata endpoint at `metadata`.
fn serve_without_keys(dir: &TempDir, s3: &Counter, metadata: &Counter) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lsvd"));
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str()
            && (k.starts_with("AWS_") || k.starts_with("LSVD_"))
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_ENDPOINT_URL", s3.url())
        .env("AWS_METADATA_ENDPOINT", metadata.url())
        .arg("--data")
        .arg(dir.join("data"))
        .args([
            "--store",
            "s3://lsvd-test-bucket/creds",
            "serve",
            "--no-probe",
            "--socket",
        ])
        .arg(dir.join("sock"))
        .stdin(Stdio::null());
    cmd
}

#[test]
fn missing_s3_credentials_are_one_line_before_any_request() {
    let dir = TempDir::new("s3_no_keys");
    let (s3, metadata) = (Counter::start(), Counter::start());
    let out = run_timeout(
        &mut serve_without_keys(&dir, &s3, &metadata),
        Duration::from_secs(60),
    );
    let err = stderr(&out);
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "{}",
        show("serve", &out)
    );
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("lsvd: error: "), "{err}");
    for needle in [
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set",
        "[s3] access_key_id",
        "credentials = \"instance\"",
        "LSVD_S3_CREDENTIALS=instance",
    ] {
        assert!(err.contains(needle), "missing '{needle}' in: {err}");
    }
    // Give a stray request time to land before counting.
    common::let_time_pass(Duration::from_millis(200));
    assert_eq!(s3.count(), 0, "no request to the S3 endpoint");
    assert_eq!(metadata.count(), 0, "no request to instance metadata");
}

/// The control: asked for, the credential chain does go to the metadata endpoint
/// (so the test above would see it if lsvd went there unasked).
#[test]
fn instance_credentials_are_fetched_only_when_asked_for() {
    let dir = TempDir::new("s3_instance_keys");
    let (s3, metadata) = (Counter::start(), Counter::start());
    let mut cmd = serve_without_keys(&dir, &s3, &metadata);
    cmd.env("LSVD_S3_CREDENTIALS", "instance")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn lsvd serve");
    let asked = wait_until(Duration::from_secs(60), || metadata.count() > 0);
    let _ = child.kill();
    let _ = child.wait();
    assert!(asked, "the credential chain asked the metadata endpoint");
    assert_eq!(s3.count(), 0, "no S3 request without credentials");
}
