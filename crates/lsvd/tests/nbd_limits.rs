//! What one NBD client can make `lsvd serve` hold, end to end with real clients
//! (libnbd through `nbdsh`): a 4 GiB CACHE, NO_HOLE zeroing, large writes and reads
//! from 64 connections at once stay within the memory bound of docs/SEMANTICS.md
//! ("Memory"), idle handshakes and idle connections are closed, and an oversized
//! write is refused, counted and logged.

mod common;

use std::time::Instant;

use common::*;

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
