//! Data survives: a clean stop and restart (SIGINT, SIGTERM, mid-write, with a client
//! still connected), the loss of the write log or the whole local data dir (rebuilt
//! from the store), a process crash (SIGKILL) after a completed FLUSH — with the data
//! only in the write log, or mid-upload — and overwrite churn with GC running.
//! The full crash oracle lives elsewhere; these are the end-to-end basics through real
//! clients (nbdcopy, nbdsh).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;

const TOOLS: &[&str] = &["nbdcopy", "nbdsh"];

/// The start of an nbdsh check of what `sigkill_after_flush_keeps_acknowledged_writes`
/// wrote: the same random stream, and the first 2 MiB as they must read back.
const FIRST_WRITES: &str = "
import random
rng = random.Random(99)
M = 1 << 20
h = connect()
first = bytearray(rng.randbytes(2 * M))
first[4096:8192] = bytes(4096)
";

fn info_u64(info: &serde_json::Value, key: &str) -> u64 {
    info[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {info}"))
}

/// Reads the whole volume back with nbdcopy and compares it with `image`.
fn assert_volume_equals(server: &Server, name: &str, image: &Path, scratch: &Path) {
    let _ = std::fs::remove_file(scratch);
    nbdcopy(&server.uri(name), &scratch.display().to_string());
    assert_files_equal(image, scratch);
    let _ = std::fs::remove_file(scratch);
}

/// Overwrites, trims and zeroes a few ranges through nbdsh and applies the same changes
/// to `image`, so the file stays a model of the volume.
fn modify_volume_and_model(uri: &str, image: &Path, seed: u64) {
    nbdsh(
        uri,
        &format!(
            r#"
import random
rng = random.Random({seed})
M = 1 << 20
h = connect()
model = open("{image}", "r+b")
def apply(off, data):
    model.seek(off)
    model.write(data)
h.trim(M, 40 * M); apply(40 * M, bytes(M))
h.zero(64 * 1024, 50 * M); apply(50 * M, bytes(64 * 1024))
h.zero(8192, 60 * M + 4096, nbd.CMD_FLAG_NO_HOLE); apply(60 * M + 4096, bytes(8192))
for i in range(32):
    off = rng.randrange(0, (h.get_size() - 65536) // 512) * 512
    data = rng.randbytes(rng.randrange(1, 129) * 512)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA if i % 4 == 0 else 0)
    apply(off, data)
h.flush()
model.close()
"#,
            image = image.display()
        ),
    );
}

#[test]
fn clean_stop_and_restart_keeps_every_byte() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("clean_restart", "128M");
    let (image, scratch) = random_image_and_scratch(&dir, 0xA11CE, 128 * MIB);

    let mut server = lsvd.serve(&socket, &["vol"]);
    nbdcopy(&image.display().to_string(), &server.uri("vol"));
    modify_volume_and_model(&server.uri("vol"), &image, 1);
    let log = server.stop_clean();
    assert!(!socket.exists(), "socket removed on clean stop\n{log}");

    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], true, "{info}");
    assert!(info_u64(&info, "objects") > 0, "data was uploaded: {info}");
    assert_eq!(info_u64(&info, "size_bytes"), 128 * MIB);
    assert_eq!(info["stranded_objects"], serde_json::json!([]), "{info}");
    let live = info_u64(&info, "live_bytes");
    assert!(
        live > 64 * MIB && live <= 128 * MIB,
        "live_bytes {live} should be most of the 128 MiB image: {info}"
    );
    assert!(info["checkpoint_seq"].is_u64(), "{info}");

    let mut server = lsvd.serve(&socket, &["vol"]);
    assert_volume_equals(&server, "vol", &image, &scratch);
    // SIGTERM stops cleanly too.
    server.stop_clean_with(libc::SIGTERM);
    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], true, "{info}");

    // And a third start still has it all.
    let server = lsvd.serve(&socket, &["vol"]);
    assert_volume_equals(&server, "vol", &image, &scratch);
}

#[test]
fn volume_is_rebuilt_from_the_store_without_local_state() {
    require_tools(TOOLS);
    let dir = TempDir::new("rebuild_from_store");
    let store = dir.subdir("store");
    let data1 = dir.join("data1");
    let lsvd = Lsvd::with_store(&data1, &store);
    lsvd.create("vol", "128M");
    let socket = dir.join("nbd.sock");
    let (image, scratch) = random_image_and_scratch(&dir, 0xBEEF, 128 * MIB);

    let mut server = lsvd.serve(&socket, &["vol"]);
    nbdcopy(&image.display().to_string(), &server.uri("vol"));
    modify_volume_and_model(&server.uri("vol"), &image, 2);
    server.stop_clean();
    assert!(
        !data1.join("store").exists(),
        "--store outside the data dir must be honoured"
    );

    // 1. Only the write log is lost.
    let wlog = data1.join("vol.wlog");
    assert!(wlog.is_file(), "write log {} expected", wlog.display());
    std::fs::remove_file(&wlog).expect("remove write log");
    let mut server = lsvd.serve(&socket, &["vol"]);
    assert_volume_equals(&server, "vol", &image, &scratch);
    server.stop_clean();

    // 2. The whole data dir is lost: start from an empty one with the same store.
    std::fs::remove_dir_all(&data1).expect("remove data dir");
    let lsvd2 = Lsvd::with_store(dir.join("data2"), &store);
    let mut server = lsvd2.serve(&socket, &["vol"]);
    assert_volume_equals(&server, "vol", &image, &scratch);
    // Keep writing on the rebuilt volume, then lose the local state once more.
    modify_volume_and_model(&server.uri("vol"), &image, 3);
    server.stop_clean();
    assert_eq!(lsvd2.info_json("vol")["closed_cleanly"], true);
    std::fs::remove_dir_all(dir.join("data2")).expect("remove data dir 2");

    let lsvd3 = Lsvd::with_store(dir.join("data3"), &store);
    let server = lsvd3.serve(&socket, &["vol"]);
    assert_volume_equals(&server, "vol", &image, &scratch);
}

#[test]
fn sigkill_after_flush_keeps_acknowledged_writes() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("sigkill_flush", "64M");
    // Big batches and a long timeout: nothing is uploaded, the data lives only in the
    // write log when the process dies.
    let serve_args = ["vol", "--batch-size", "64M", "--batch-timeout-ms", "600000"];
    let mut server = lsvd.serve(&socket, &serve_args);
    nbdsh(
        &server.uri("vol"),
        r#"
import random
rng = random.Random(99)
M = 1 << 20
h = connect()
h.pwrite(rng.randbytes(2 * M), 0)
for i in range(64):
    h.pwrite(rng.randbytes(4096), 8 * M + i * 12288)
h.pwrite(rng.randbytes(65536), 12 * M, nbd.CMD_FLAG_FUA)
h.trim(4096, 4096)
h.flush()
# Written after the last flush: may or may not survive, but never half a request.
for i in range(32):
    h.pwrite(bytes([i + 1]) * 4096, 32 * M + i * 4096)
"#,
    );
    server.kill9();

    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], false, "{info}");
    assert_eq!(
        info_u64(&info, "objects"),
        0,
        "test precondition: the data should only be in the write log: {info}"
    );

    let mut server = lsvd.serve(&socket, &serve_args);
    nbdsh(
        &server.uri("vol"),
        &[
            FIRST_WRITES,
            r#"assert h.pread(2 * M, 0) == first, "flushed 2 MiB write (with trimmed 4K) survived"
for i in range(64):
    assert h.pread(4096, 8 * M + i * 12288) == rng.randbytes(4096), "flushed 4K write %d" % i
assert h.pread(65536, 12 * M) == rng.randbytes(65536), "FUA write survived"
assert h.pread(M, 16 * M) == bytes(M), "never-written range reads zeros"
for i in range(32):
    got = h.pread(4096, 32 * M + i * 4096)
    assert got in (bytes(4096), bytes([i + 1]) * 4096), "unflushed block %d is torn" % i
"#,
        ]
        .concat(),
    );
    let log = server.stop_clean();
    assert!(!log.contains("panicked"), "{log}");
    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], true, "{info}");
    assert!(info_u64(&info, "objects") > 0, "{info}");

    // After the recovery and a clean stop, everything is still there (now from the store).
    std::fs::remove_file(dir.join("data").join("vol.wlog")).expect("remove write log");
    let server = lsvd.serve(&socket, &serve_args);
    nbdsh(
        &server.uri("vol"),
        &[FIRST_WRITES, "assert h.pread(2 * M, 0) == first\n"].concat(),
    );
}

#[test]
fn sigkill_while_uploading_recovers_from_store_and_log() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("sigkill_uploading", "128M");
    let (image, scratch) = random_image_and_scratch(&dir, 0xD00D, 128 * MIB);
    // Small batches: by the time of the crash part of the data is in objects, part only
    // in the write log (128 MiB written through a 64 MiB log), uploads in flight.
    let args = ["vol", "--batch-size", "4M", "--batch-timeout-ms", "100"];
    let mut server = lsvd.serve(&socket, &args);
    nbdcopy(&image.display().to_string(), &server.uri("vol"));
    modify_volume_and_model(&server.uri("vol"), &image, 4); // ends with a FLUSH
    server.kill9();
    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], false, "{info}");
    assert!(info_u64(&info, "objects") > 0, "{info}");

    let mut server = lsvd.serve(&socket, &args);
    assert_volume_equals(&server, "vol", &image, &scratch);
    // Crash again straight after recovery, before anything new is written.
    server.kill9();
    let server = lsvd.serve(&socket, &args);
    assert_volume_equals(&server, "vol", &image, &scratch);
}

/// Random overwrites, trims and zeroes confined to the first `hot_mib` MiB, `passes`
/// times over, each pass ending with a FLUSH. The model of the volume is kept in the
/// file `model` (created full of zeros if missing).
fn churn(uri: &str, model: &Path, seed: u64, passes: u32, hot_mib: u64) {
    nbdsh(
        uri,
        &format!(
            r#"
import random
rng = random.Random({seed})
h = connect()
size = h.get_size()
K = 1024
M = 1 << 20
HOT = {hot_mib} * M
try:
    model = bytearray(open("{model}", "rb").read())
except FileNotFoundError:
    model = bytearray(size)
assert len(model) == size
for p in range({passes}):
    done = 0
    while done < HOT:
        n = rng.randrange(1, 129) * 4 * K
        off = rng.randrange(0, (HOT - n) // (4 * K) + 1) * 4 * K
        r = rng.random()
        if r < 0.8:
            data = rng.randbytes(n)
            h.pwrite(data, off)
            model[off:off + n] = data
        elif r < 0.9:
            h.trim(n, off)
            model[off:off + n] = bytes(n)
        else:
            h.zero(n, off)
            model[off:off + n] = bytes(n)
        done += n
    h.flush()
open("{model}", "wb").write(model)
"#,
            model = model.display()
        ),
    );
}

/// Reads the whole volume and compares it with the model file.
fn verify_model(uri: &str, model: &Path) {
    nbdsh(
        uri,
        &format!(
            r#"
h = connect()
model = open("{model}", "rb").read()
size = h.get_size()
assert len(model) == size
step = 4 << 20
for off in range(0, size, step):
    got = h.pread(step, off)
    if got != model[off:off + step]:
        i = next(i for i in range(step) if got[i] != model[off + i])
        raise AssertionError("volume differs from the model at byte %d (4K block %d)" % (off + i, (off + i) // 4096))
"#,
            model = model.display()
        ),
    );
}

#[test]
fn overwrite_churn_with_gc_survives_crash_restart_and_rebuild() {
    require_tools(TOOLS);
    let dir = TempDir::new("gc_churn");
    let store = dir.subdir("store");
    let lsvd = Lsvd::with_store(dir.join("data1"), &store);
    lsvd.create("vol", "64M");
    let socket = dir.join("nbd.sock");
    let model = dir.join("model.raw");
    // Small objects so overwrites leave many mostly-dead objects for GC to collect.
    let args = ["vol", "--batch-size", "1M", "--batch-timeout-ms", "50"];
    let mut server = lsvd.serve(&socket, &args);
    let uri = server.uri("vol");
    churn(&uri, &model, 1, 6, 16);
    verify_model(&uri, &model);

    // GC must actually have run for this test to mean anything: wait until the store
    // holds much less than the ~96 MiB written (dead objects deleted).
    let mut last = serde_json::Value::Null;
    let reclaimed = wait_until(Duration::from_secs(60), || {
        last = lsvd.info_json("vol");
        last["store_bytes"].as_u64().is_some_and(|b| b < 48 * MIB)
    });
    assert!(
        reclaimed,
        "GC did not reclaim space within 60 s: {last}\n--- server log ---\n{}",
        server.log()
    );
    // More churn while GC may be mid-pass, then a crash right after the FLUSH.
    churn(&uri, &model, 2, 3, 16);
    server.kill9();

    let mut server = lsvd.serve(&socket, &args);
    let uri = server.uri("vol");
    verify_model(&uri, &model);
    churn(&uri, &model, 3, 2, 24);
    verify_model(&uri, &model);
    server.stop_clean();
    let info = lsvd.info_json("vol");
    assert_eq!(info["closed_cleanly"], true, "{info}");

    // Lose all local state: the store alone must give back exactly the model.
    std::fs::remove_dir_all(dir.join("data1")).expect("remove data dir");
    let lsvd2 = Lsvd::with_store(dir.join("data2"), &store);
    let server = lsvd2.serve(&socket, &args);
    verify_model(&server.uri("vol"), &model);
}

#[test]
fn sigint_during_writes_keeps_every_acknowledged_write() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("sigint_mid_write", "128M");
    let progress = dir.join("progress");
    let client_log = dir.join("client.log");
    let mut server = lsvd.serve(&socket, &["vol"]);
    // Synchronous 256 KiB writes, one after another; after each acknowledgement the
    // client records its index. It stops at the first error (the server going away).
    let script = format!(
        r#"{NBDSH_PRELUDE}
import random
B = 256 * 1024
h = connect()
n = h.get_size() // B
f = open("{progress}", "w")
i = -1
try:
    for i in range(n):
        h.pwrite(random.Random(i).randbytes(B), i * B)
        f.write("%d\n" % i)
        f.flush()
    print("wrote everything")
except nbd.Error as e:
    print("stopped at block %d: %s" % (i, e))
"#,
        progress = progress.display()
    );
    let log = std::fs::File::create(&client_log).expect("client log");
    let child = tool("nbdsh")
        .args(["-n", "-c", &script])
        .env("URI", server.uri("vol"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .spawn()
        .expect("spawn nbdsh");
    let mut client = IdleClient { child };
    let acked = || -> Vec<u64> {
        std::fs::read_to_string(&progress)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(120), || acked().len() >= 40),
        "client made no progress: {}",
        std::fs::read_to_string(&client_log).unwrap_or_default()
    );
    server.stop_clean();
    assert!(
        wait_until(Duration::from_secs(60), || matches!(
            client.child.try_wait(),
            Ok(Some(_))
        )),
        "client did not notice the server stopping"
    );
    let client_out = std::fs::read_to_string(&client_log).unwrap_or_default();
    let acked = acked();
    let last = *acked.last().expect("some writes acknowledged");
    assert_eq!(acked.len() as u64, last + 1, "progress file: {acked:?}");
    assert!(
        last < 511,
        "the stop should have interrupted the writes: {client_out}"
    );

    let server = lsvd.serve(&socket, &["vol"]);
    let out = nbdsh(
        &server.uri("vol"),
        &format!(
            r#"
import random
B = 256 * 1024
h = connect()
last = {last}
for i in range(last + 1):
    assert h.pread(B, i * B) == random.Random(i).randbytes(B), "acknowledged block %d lost" % i
got = h.pread(B, (last + 1) * B)
assert got in (bytes(B), random.Random(last + 1).randbytes(B)), "block in flight is torn"
for i in range(last + 2, h.get_size() // B):
    assert h.pread(B, i * B) == bytes(B), "block %d was never sent" % i
print("in-flight block applied:", got != bytes(B))
"#
        ),
    );
    assert!(out.contains("in-flight block applied"), "{out}");
}

/// An nbdsh process that writes, flushes, signals readiness with a file and then keeps
/// its connection open until killed.
struct IdleClient {
    child: Child,
}

impl Drop for IdleClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn clean_stop_while_a_client_stays_connected() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("stop_with_client", "64M");
    let ready = dir.join("client-ready");
    let mut server = lsvd.serve(&socket, &["vol"]);
    let script = format!(
        r#"{NBDSH_PRELUDE}
import time
h = connect()
h.pwrite(b"\x42" * 65536, 0)
h.pwrite(b"\x43" * 65536, 65536)   # not flushed: a clean stop must still keep it
open("{ready}", "w").close()
time.sleep(120)
"#,
        ready = ready.display()
    );
    let child = tool("nbdsh")
        .args(["-n", "-c", &script])
        .env("URI", server.uri("vol"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nbdsh");
    let _client = IdleClient { child };
    assert!(
        wait_until(Duration::from_secs(60), || ready.exists()),
        "client did not get ready"
    );
    // The server must not wait for the idle client to go away.
    server.stop_clean();
    let server = lsvd.serve(&socket, &["vol"]);
    nbdsh(
        &server.uri("vol"),
        r#"
h = connect()
assert h.pread(65536, 0) == b"\x42" * 65536
assert h.pread(65536, 65536) == b"\x43" * 65536, "acknowledged write kept by a clean stop"
"#,
    );
}

/// Writes 1 MiB of `byte` at offset 0 and flushes; false if the server refused.
fn try_write_and_flush(uri: &str, byte: u8) -> bool {
    let script = format!(
        "{NBDSH_PRELUDE}\nh = connect()\nh.pwrite(bytes([{byte}]) * (1 << 20), 0)\nh.flush()\n"
    );
    let out = run_timeout(
        tool("nbdsh")
            .arg("-n")
            .arg("-c")
            .arg(script)
            .env("URI", uri),
        Duration::from_secs(60),
    );
    out.status.success()
}

/// Two `lsvd serve` processes with their own data dirs open one volume in one store.
/// Started at the same moment (rounds 0 and 1), their claims race for one superblock
/// generation: exactly one serves and the other refuses to start, naming the holder.
/// Started one after the other (round 2), the second finds the first renewing its
/// lease and refuses (it never takes a live volume over). Always: exactly one owner,
/// which stops cleanly, the other says why in one line, and the volume then holds the
/// owner's data (a third process reads it from the store alone).
#[test]
fn two_servers_on_one_volume_leave_exactly_one_owner() {
    require_tools(TOOLS);
    for round in 0..3u8 {
        let dir = TempDir::new("persist_race");
        let store = dir.subdir("store");
        let nodes: Vec<Lsvd> = ["a", "b"]
            .iter()
            .map(|n| Lsvd::with_store(dir.join(n), &store))
            .collect();
        nodes[0].create("vol", "16M");
        let order: Vec<usize> = if round == 1 { vec![1, 0] } else { vec![0, 1] };
        let mut servers: Vec<(usize, Server)> = Vec::new();
        for &i in &order {
            let socket = dir.join(format!("{i}.sock"));
            let args = ["vol", "--batch-timeout-ms", "200"];
            let mut s = nodes[i].spawn_serve(&socket, &args);
            if round == 2 && servers.is_empty() {
                s.ready_or_exit(Duration::from_secs(90))
                    .expect("the first server starts alone");
            }
            servers.push((i, s));
        }
        servers.sort_by_key(|(i, _)| *i);
        let mut up = Vec::new();
        for (i, s) in servers.iter_mut() {
            if s.ready_or_exit(Duration::from_secs(90)).is_ok() {
                up.push(*i);
            } else {
                let log = s.log();
                assert!(
                    (log.contains("is served by")
                        || log.contains("is held by")
                        || log.contains("was claimed by"))
                        && log.lines().filter(|l| l.starts_with("lsvd: error")).count() == 1,
                    "round {round}: server {i} refused without one line naming the holder\n{log}"
                );
            }
        }
        assert_eq!(up.len(), 1, "round {round}: servers up {up:?}");
        let owner = up[0];
        if round == 2 {
            assert_eq!(owner, 0, "the live server keeps the volume");
        }
        assert!(try_write_and_flush(
            &servers[owner].1.uri("vol"),
            b'A' + owner as u8
        ));
        let (status, log) = servers[owner].1.interrupt_within(Duration::from_secs(60));
        assert!(
            status.success() && log.contains("lsvd: stopped cleanly"),
            "round {round}: the owner did not stop cleanly\n{log}"
        );
        // A third process opens the volume from the store alone: the owner's data.
        let reader = Lsvd::with_store(dir.join("c"), &store);
        let mut server = reader.serve(&dir.join("c.sock"), &["vol"]);
        let out = nbdsh(
            &server.uri("vol"),
            "h = connect()\nprint(set(h.pread(1 << 20, 0)))",
        );
        assert_eq!(
            out.trim(),
            format!("{{{}}}", b'A' + owner as u8),
            "round {round}: owner {owner}"
        );
        server.stop_clean();
    }
}

/// The read cache's index survives SIGKILL, not only a clean stop: data a client read
/// (so the cache fetched it from the store) before the kill is read after the restart
/// without a single GET (`lsvd_store_gets_total` does not move).
#[test]
fn read_cache_survives_sigkill() {
    require_tools(TOOLS);
    let (_dir, lsvd, socket) = new_volume("sigkill_rcache", "64M");
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    // No admission: the first reads must miss and go to the store, also on S3.
    let args = [
        "vol",
        "--metrics",
        &addr,
        "--batch-timeout-ms",
        "200",
        "--read-cache-admit",
        "never",
    ];
    let gets = |server: &mut Server| -> f64 {
        let mut v = None;
        assert!(
            wait_until(SHORT, || {
                v = metric(&addr, "store_gets_total", "vol");
                v.is_some()
            }),
            "no metrics\n{}",
            server.log()
        );
        v.unwrap_or_default()
    };
    let write = r#"
import random
rng = random.Random(7)
M = 1 << 20
h = connect()
h.pwrite(rng.randbytes(4 * M), 8 * M)
h.flush()
"#;
    let read = r#"
import random
rng = random.Random(7)
M = 1 << 20
h = connect()
want = rng.randbytes(4 * M)
for i in range(64):
    assert h.pread(65536, 8 * M + i * 65536) == want[i * 65536:(i + 1) * 65536], i
"#;
    // Written and uploaded; a clean stop empties the write log.
    let mut server = lsvd.serve(&socket, &args);
    nbdsh(&server.uri("vol"), write);
    server.stop_clean();
    // Read: from the store, through the read cache. Then SIGKILL.
    let mut server = lsvd.serve(&socket, &args);
    let before = gets(&mut server);
    nbdsh(&server.uri("vol"), read);
    assert!(
        gets(&mut server) > before,
        "test precondition: the reads went to the store"
    );
    server.kill9();
    // After the restart the same reads need no GET.
    let mut server = lsvd.serve(&socket, &args);
    let before = gets(&mut server);
    nbdsh(&server.uri("vol"), read);
    assert_eq!(gets(&mut server), before, "the read cache survived SIGKILL");
    server.stop_clean();
}
