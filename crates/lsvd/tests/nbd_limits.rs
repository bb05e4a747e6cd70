//! What one NBD client can make `lsvd serve` hold, end to end with real clients
//! (libnbd through `nbdsh`): a 4 GiB CACHE, NO_HOLE zeroing, large writes and reads
//! from 64 connections at once stay within the memory bound of docs/SEMANTICS.md
//! ("Memory"), idle handshakes and idle connections are closed, and an oversized
//! write is refused, counted and logged.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// The text of `lsvd serve --metrics ADDR`.
fn metrics_text(addr: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to metrics");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: lsvd\r\n\r\n")
        .expect("ask for metrics");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("read metrics");
    text
}

/// The value of the sample `line_start VALUE` (name and labels) in the metrics.
fn sample(addr: &str, line_start: &str) -> f64 {
    let text = metrics_text(addr);
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {line_start} in\n{text}"))
}

/// A raw NBD connection on `socket` after the greeting: a peer in its handshake.
fn half_open(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).expect("greeting");
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    s
}

/// A raw NBD connection in transmission on `export` (fixed newstyle, no zeroes,
/// NBD_OPT_EXPORT_NAME), having sent nothing since.
fn in_transmission(socket: &Path, export: &str) -> UnixStream {
    let mut s = half_open(socket);
    // FIXED_NEWSTYLE | NO_ZEROES
    s.write_all(&export_name_option(3, export))
        .expect("send option");
    let mut info = [0u8; 10];
    s.read_exact(&mut info).expect("export size and flags");
    s
}

/// Waits, on a thread of its own, until the server closes `s`; the handle answers how
/// long after `since` that happened.
fn watch_close(mut s: UnixStream, since: Instant) -> std::thread::JoinHandle<Duration> {
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(0) => since.elapsed(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => since.elapsed(),
            other => panic!("expected the server to close, got {other:?}"),
        }
    })
}

/// Peak and current resident memory of process `pid`, in bytes (VmHWM, VmRSS).
fn memory_of(pid: i32) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            * KIB
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// A 4 GiB CACHE over written and unwritten data succeeds, and the server's peak
/// memory does not grow by anything like 4 GiB (it read the range into one buffer).
#[test]
fn a_4_gib_cache_is_answered_without_holding_it() {
    require_tools(&["nbdsh"]);
    let dir = TempDir::new("cache_4g");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "8G");
    let server = lsvd.serve(&dir.join("nbd.sock"), &["vol"]);
    nbdsh(
        &server.uri("vol"),
        r#"
h = connect()
for off in (0, 3 << 30):
    for i in range(8):
        h.pwrite(pattern(off + i, 1 << 20), off + (i << 20))
h.flush()
"#,
    );
    let (peak_before, rss_before) = memory_of(server.pid());
    let started = Instant::now();
    nbdsh(
        &server.uri("vol"),
        r#"
h = connect()
h.cache((4 << 30) - 512, 0)
assert h.pread(1 << 20, 3 << 30) == pattern(3 << 30, 1 << 20)
"#,
    );
    let (peak_after, _) = memory_of(server.pid());
    eprintln!(
        "4 GiB CACHE: {:.1} s, peak RSS {:.1} MiB before (RSS {:.1} MiB), {:.1} MiB after",
        started.elapsed().as_secs_f64(),
        mib(peak_before),
        mib(rss_before),
        mib(peak_after)
    );
    assert!(
        peak_after < peak_before + 64 * MIB,
        "a 4 GiB CACHE raised the peak RSS from {:.1} to {:.1} MiB",
        mib(peak_before),
        mib(peak_after)
    );
}

/// Peak RSS `lsvd serve` may reach under the storm (docs/SEMANTICS.md, "Memory").
const STORM_RSS_LIMIT: u64 = 512 * MIB;

/// 64 connections at once, each with a CACHE of 4 GiB (unwritten: nothing to fetch)
/// and, by connection number modulo 8, a NO_HOLE WRITE_ZEROES, a WRITE, a READ or a
/// CACHE of written data, each of the maximum request size (8 of each: 1 GiB asked
/// of a 128 MiB payload budget), all in flight together.
/// The server's peak RSS stays under 512 MiB, every request succeeds, and what was
/// written and zeroed reads back.
#[test]
fn a_storm_of_64_connections_stays_under_the_memory_bound() {
    require_tools(&["nbdsh"]);
    let dir = TempDir::new("nbd_storm");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "8G");
    // A write log over 128 MiB (its header aside) makes the maximum request 32 MiB, as
    // with the default 1 GiB.
    let server = lsvd.serve(&dir.join("nbd.sock"), &["vol", "--log-size", "160M"]);
    let (peak_before, _) = memory_of(server.pid());
    let started = Instant::now();
    let out = nbdsh(
        &server.uri("vol"),
        r#"
import threading
N = 64
MB = 1 << 20
REGION = 64 * MB
hs = [connect() for _ in range(N)]
mx = hs[0].get_block_size(nbd.SIZE_MAXIMUM)
assert mx == 32 * MB, mx
big = pattern(7, mx)
wbuf = nbd.Buffer.from_bytearray(bytearray(big))
errors = []

def storm(i):
    try:
        h = hs[i]
        base = i * REGION
        cookies = [h.aio_cache((4 << 30) - 512, 4 << 30)]
        kind = i % 8
        if kind == 0:
            cookies.append(h.aio_zero(mx, base, flags=nbd.CMD_FLAG_NO_HOLE))
        elif kind == 1:
            cookies.append(h.aio_pwrite(wbuf, base))
        elif kind == 2:
            cookies.append(h.aio_pread(nbd.Buffer(mx), (i - 1) * REGION))
        elif kind == 3:
            cookies.append(h.aio_cache(mx, (i - 2) * REGION))
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c in cookies:
            assert h.aio_command_completed(c), "command %d of connection %d" % (c, i)
    except Exception as e:
        errors.append("connection %d: %r" % (i, e))

threads = [threading.Thread(target=storm, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
for h in hs:
    h.shutdown()

h = connect(alloc=True)
for i in range(N):
    base = i * REGION
    if i % 8 == 0:
        want, flags = bytes(mx), 0
    elif i % 8 == 1:
        want, flags = big, 0
    else:
        want, flags = bytes(mx), HOLE | ZERO
    assert h.pread(MB, base) == want[:MB], i
    assert h.pread(MB, base + mx - MB) == want[-MB:], i
    if i < 2:
        assert h.pread(mx, base) == want, i
    # NO_HOLE zeros and data alike are allocated, and nothing else.
    assert block_status(h, base, REGION) == [
        (base, mx, flags), (base + mx, REGION - mx, HOLE | ZERO)] if flags == 0 else [
        (base, REGION, flags)], i
print("storm ok")
"#,
    );
    assert!(out.contains("storm ok"), "{out}");
    let (peak_after, rss_after) = memory_of(server.pid());
    eprintln!(
        "storm of 64 connections: {:.1} s, peak RSS {:.1} MiB (before: {:.1} MiB), RSS now {:.1} MiB",
        started.elapsed().as_secs_f64(),
        mib(peak_after),
        mib(peak_before),
        mib(rss_after)
    );
    assert!(
        peak_after < STORM_RSS_LIMIT,
        "peak RSS {:.1} MiB under the storm, bound {:.0} MiB\n{}",
        mib(peak_after),
        mib(STORM_RSS_LIMIT),
        server.log()
    );
}

/// A 64 MiB `vol` served with `extra` flags and `--metrics` on a free port: the test's
/// directory (removed on drop), the server and the metrics address.
fn serve_with_metrics(test: &str, extra: &[&str]) -> (TempDir, Server, String) {
    let dir = TempDir::new(test);
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "64M");
    let metrics = format!("127.0.0.1:{}", free_tcp_port());
    let mut args = vec!["vol", "--metrics", &metrics];
    args.extend_from_slice(extra);
    let server = lsvd.serve(&dir.join("nbd.sock"), &args);
    (dir, server, metrics)
}

/// A 1 s timeout closed the watched connection `took` after it began (not early, not
/// seconds late), `counter` counted it once, and the server logged `logged` (once the
/// connection has ended, just after it closed).
fn assert_closed_by_1s_timeout(
    took: Duration,
    metrics: &str,
    counter: &str,
    server: &Server,
    logged: &str,
) {
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "closed after {took:?}, timeout 1 s"
    );
    assert_eq!(sample(metrics, counter), 1.0, "{counter}");
    assert!(
        wait_until(Duration::from_secs(5), || server.log().contains(logged)),
        "{}",
        server.log()
    );
}

/// `--handshake-timeout`: a peer that connects and says nothing is closed when its
/// own deadline passes, while another client connects and works meanwhile; counted in
/// the metrics and logged.
#[test]
fn an_idle_handshake_is_closed_while_another_client_works() {
    require_tools(&["nbdsh"]);
    let (_dir, server, metrics) = serve_with_metrics("hs_timeout", &["--handshake-timeout", "1s"]);
    let idle = watch_close(half_open(&server.socket), Instant::now());
    let opened = Instant::now();
    let out = nbdsh(
        &server.uri("vol"),
        r#"
h = connect()
h.pwrite(pattern(1, 65536), 0)
assert h.pread(65536, 0) == pattern(1, 65536)
print("other client ok")
"#,
    );
    assert!(out.contains("other client ok"), "{out}");
    let worked_after = opened.elapsed();
    let took = idle.join().expect("watcher");
    eprintln!(
        "idle handshake closed {:.2} s after it connected (--handshake-timeout 1s); \
         the other client was done after {:.2} s",
        took.as_secs_f64(),
        worked_after.as_secs_f64()
    );
    let counter = "lsvd_nbd_handshake_timeouts_total";
    assert_closed_by_1s_timeout(took, &metrics, counter, &server, "not done after 1000 ms");
}

/// `--idle-timeout`: a connection in transmission that sends nothing is closed after
/// the timeout, one that keeps sending is not; counted and logged. Off with `0`.
#[test]
fn an_idle_connection_is_closed_after_the_idle_timeout() {
    require_tools(&["nbdsh"]);
    let (_dir, server, metrics) = serve_with_metrics("idle_timeout", &["--idle-timeout", "1s"]);
    let quiet = watch_close(in_transmission(&server.socket, "vol"), Instant::now());
    // Busy for 2 s, never quiet for a second.
    let out = nbdsh(
        &server.uri("vol"),
        r#"
import time
h = connect()
for i in range(8):
    h.pwrite(pattern(i, 4096), 4096 * i)
    time.sleep(0.25)
for i in range(8):
    assert h.pread(4096, 4096 * i) == pattern(i, 4096)
print("busy client ok")
"#,
    );
    assert!(out.contains("busy client ok"), "{out}");
    let took = quiet.join().expect("watcher");
    eprintln!(
        "idle connection closed {:.2} s after its handshake (--idle-timeout 1s)",
        took.as_secs_f64()
    );
    let counter = "lsvd_nbd_idle_timeouts_total";
    assert_closed_by_1s_timeout(
        took,
        &metrics,
        counter,
        &server,
        "(the idle timeout): closed",
    );
}

/// A WRITE over the advertised maximum is refused with EINVAL, its payload skipped:
/// the connection goes on and nothing was written. The refusal is counted in
/// `lsvd_nbd_requests_refused_total{reason="too_large"}` and logged.
#[test]
fn an_oversized_write_is_refused_counted_and_logged() {
    require_tools(&["nbdsh"]);
    let (_dir, server, metrics) = serve_with_metrics("oversized", &[]);
    let out = nbdsh(
        &server.uri("vol"),
        r#"
h = connect(strict=False)
mx = h.get_block_size(nbd.SIZE_MAXIMUM)
h.pwrite(pattern(3, 4096), 0)
expect_err("oversized write", lambda: h.pwrite(pattern(4, mx + 512), 0), errno.EINVAL)
assert h.pread(4096, 0) == pattern(3, 4096), "refused write changed nothing"
assert h.pread(4096, mx) == bytes(4096)
print("max", mx)
"#,
    );
    let max: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let refused = r#"lsvd_nbd_requests_refused_total{reason="too_large"}"#;
    assert_eq!(sample(&metrics, refused), 1.0);
    let line = format!("refused WRITE of {} bytes at 0", max + 512);
    assert!(server.log().contains(&line), "{line}\n{}", server.log());
}

/// The timeouts' flags take durations; one that cannot be read, or an off handshake
/// deadline, is one line and exit status 2 before anything is opened.
#[test]
fn timeout_flags_are_checked_before_serving() {
    let dir = TempDir::new("timeout_flags");
    let lsvd = Lsvd::new(dir.join("data"));
    for (flag, value, says) in [
        ("--idle-timeout", "5x", "invalid --idle-timeout '5x'"),
        ("--idle-timeout", "1.5s", "invalid --idle-timeout '1.5s'"),
        ("--handshake-timeout", "off", "cannot be off"),
        ("--handshake-timeout", "0", "cannot be off"),
    ] {
        let out = lsvd.run(&["serve", "--no-probe", "--socket", "x.sock", flag, value]);
        let err = usage_error(&out, &format!("serve {flag} {value}"));
        assert!(err.contains(says), "{flag} {value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
