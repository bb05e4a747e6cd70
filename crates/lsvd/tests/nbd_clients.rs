//! lsvd against real NBD clients: nbdinfo, nbdcopy, nbdsh (libnbd), qemu-io, qemu-img,
//! fio's nbd engine, and a raw socket for protocol abuse. Each test runs its own server
//! on a Unix socket in its own temp dir; data written is read back and compared.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::*;

const CLIENT_TOOLS: &[&str] = &[
    "nbdinfo", "nbdcopy", "nbdsh", "nbdkit", "qemu-io", "qemu-img", "fio",
];

/// A fresh data dir with the given volumes created and served on a Unix socket.
struct Fixture {
    server: Server,
    lsvd: Lsvd,
    // Dropped last: the server (above) is killed before its directory goes.
    dir: TempDir,
}

impl Fixture {
    fn new(test: &str, volumes: &[(&str, &str)], extra: &[&str]) -> Fixture {
        require_tools(CLIENT_TOOLS);
        let dir = TempDir::new(test);
        let lsvd = Lsvd::new(dir.join("data"));
        for (name, size) in volumes {
            lsvd.create(name, size);
        }
        let mut args: Vec<&str> = volumes.iter().map(|(n, _)| *n).collect();
        args.extend_from_slice(extra);
        let server = lsvd.serve(&dir.join("nbd.sock"), &args);
        Fixture { server, lsvd, dir }
    }

    fn uri(&self, name: &str) -> String {
        self.server.uri(name)
    }
}

fn as_u64(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

fn as_bool(v: &serde_json::Value, key: &str) -> bool {
    v[key]
        .as_bool()
        .unwrap_or_else(|| panic!("{key} missing or not a bool in {v}"))
}

#[test]
fn nbdinfo_reports_export_capabilities_and_block_sizes() {
    let fx = Fixture::new("nbdinfo_caps", &[("vol", "64M")], &[]);
    let info = nbdinfo_json(&[&fx.uri("vol")]);
    assert_eq!(info["protocol"], "newstyle-fixed", "{info}");
    assert_eq!(info["structured"], true, "{info}");
    let exports = info["exports"].as_array().expect("exports array");
    assert_eq!(exports.len(), 1, "{info}");
    let e = &exports[0];
    assert_eq!(e["export-name"], "vol");
    assert_eq!(as_u64(e, "export-size"), 64 * MIB);
    assert_eq!(e["description"], "lsvd volume vol");
    assert!(!as_bool(e, "is_read_only"));
    for cap in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
        "can_cache",
    ] {
        assert!(as_bool(e, cap), "{cap} should be true: {e}");
    }
    let contexts = e["contexts"].as_array().expect("contexts");
    assert!(
        contexts.iter().any(|c| c == "base:allocation"),
        "base:allocation not offered: {e}"
    );
    assert_eq!(as_u64(e, "block_size_minimum"), 512);
    assert_eq!(as_u64(e, "block_size_preferred"), 4096);
    let max = as_u64(e, "block_size_maximum");
    assert!(
        max.is_power_of_two() && (MIB..=32 * MIB).contains(&max),
        "block_size_maximum {max} should be a power of two in 1M..=32M"
    );

    // The default export (empty name) is the first volume.
    let default = nbdinfo_json(&[&format!(
        "nbd+unix:///?socket={}",
        fx.server.socket.display()
    )]);
    assert_eq!(default["exports"][0]["export-name"], "vol", "{default}");
    assert_eq!(as_u64(&default["exports"][0], "export-size"), 64 * MIB);

    // Asking for an export that does not exist fails cleanly, server keeps serving.
    let out = run_timeout(tool("nbdinfo").arg(fx.uri("nosuch")), SHORT);
    assert!(!out.status.success(), "{}", show("nbdinfo nosuch", &out));
    nbdinfo_json(&[&fx.uri("vol")]);
}

#[test]
fn nbdinfo_lists_every_served_volume() {
    let fx = Fixture::new(
        "nbdinfo_list",
        &[("alpha", "64M"), ("beta", "32M"), ("gamma", "1G")],
        &[],
    );
    let list = nbdinfo_json(&[
        "--list",
        &format!("nbd+unix:///?socket={}", fx.server.socket.display()),
    ]);
    let mut got: Vec<(String, u64)> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().expect("name").to_string(),
                as_u64(e, "export-size"),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("alpha".to_string(), 64 * MIB),
            ("beta".to_string(), 32 * MIB),
            ("gamma".to_string(), GIB),
        ],
        "{list}"
    );
    // Each export is independently reachable by name and has its own contents.
    let alpha = fx.uri("alpha");
    let beta = fx.uri("beta");
    nbdsh(
        &alpha,
        &format!(
            r#"
a = connect("{alpha}"); b = connect("{beta}")
a.pwrite(b"\xaa" * 4096, 0); b.pwrite(b"\xbb" * 4096, 0)
a.flush(); b.flush()
assert a.pread(4096, 0) == b"\xaa" * 4096
assert b.pread(4096, 0) == b"\xbb" * 4096
"#
        ),
    );
}

#[test]
fn nbdcopy_256mib_in_and_out_round_trips() {
    let fx = Fixture::new("nbdcopy_256", &[("vol", "256M")], &[]);
    let image = fx.dir.join("image.raw");
    let back = fx.dir.join("back.raw");
    // Random data with a zero MiB every 16 MiB (nbdcopy turns those into zero requests).
    write_random_image(&image, 0xC0FFEE, 256 * MIB, 16);
    let uri = fx.uri("vol");
    nbdcopy(&image.display().to_string(), &uri);
    nbdcopy(&uri, &back.display().to_string());
    assert_files_equal(&image, &back);
    // A second, independent client agrees (qemu's NBD block driver).
    run_ok(
        tool("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&image)
            .arg(&uri),
        LONG,
    );
    // The zero MiBs really are zero and the rest really is data.
    nbdsh(
        &uri,
        r#"
h = connect(alloc=True)
M = 1 << 20
assert h.pread(M, 15 * M) == bytes(M), "zero MiB reads back as zeros"
assert h.pread(M, 14 * M) != bytes(M)
ext = block_status(h, 0, 256 * M)
assert flags_at(ext, 14 * M) & HOLE == 0, ext
"#,
    );
}

#[test]
fn nbdsh_read_write_flush_fua_trim_zero_cache_against_a_model() {
    let fx = Fixture::new("nbdsh_rw_model", &[("vol", "64M")], &[]);
    let out = nbdsh(
        &fx.uri("vol"),
        r#"
import random
h = connect()
for cap in ("can_flush", "can_fua", "can_trim", "can_zero", "can_cache", "can_multi_conn"):
    assert getattr(h, cap)(), cap
assert not h.is_read_only()
size = h.get_size()
assert size == 64 << 20, size
M = 1 << 20
K = 1024
model = bytearray(size)

def check(off, n):
    got = h.pread(n, off)
    if got != model[off:off + n]:
        i = next(i for i in range(n) if got[i] != model[off + i])
        raise AssertionError("mismatch at byte %d (read of %d at %d)" % (off + i, n, off))

check(0, 4 * M)   # a fresh volume reads as zeros
check(size - M, M)

rng = random.Random(7)
hot = [0, 3 * M, size - 2 * M]   # ops cluster here so they overlap each other
counts = {}
for step in range(500):
    off = rng.choice(hot) + rng.randrange(0, 2 * M // 512) * 512
    n = min(rng.randrange(1, 257) * 512, size - off)
    r = rng.random()
    if r < 0.45:
        data = rng.randbytes(n)
        fua = rng.random() < 0.25
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if fua else 0)
        model[off:off + n] = data
        op = "write_fua" if fua else "write"
    elif r < 0.55:
        h.trim(n, off)
        model[off:off + n] = bytes(n)
        op = "trim"
    elif r < 0.65:
        no_hole = rng.random() < 0.5
        h.zero(n, off, nbd.CMD_FLAG_NO_HOLE if no_hole else 0)
        model[off:off + n] = bytes(n)
        op = "zero_nohole" if no_hole else "zero"
    elif r < 0.70:
        h.flush()
        op = "flush"
    elif r < 0.73:
        h.cache(n, off)
        op = "cache"
    else:
        check(off, n)
        op = "read"
    counts[op] = counts.get(op, 0) + 1

# The largest request the server allows, both ways.
mx = h.get_block_size(nbd.SIZE_MAXIMUM)
assert mx >= M, mx
big = rng.randbytes(mx)
h.pwrite(big, 16 * M)
model[16 * M:16 * M + mx] = big
check(16 * M, mx)

# Many requests in flight: 64 aio writes (some FUA), then 64 aio reads.
bufs = []
cookies = []
for i in range(64):
    off = 40 * M + i * 64 * K + 512 * (i % 7)
    data = bytearray(rng.randbytes(32 * K))
    model[off:off + len(data)] = data
    b = nbd.Buffer.from_bytearray(data)
    bufs.append(b)
    cookies.append(h.aio_pwrite(b, off, flags=nbd.CMD_FLAG_FUA if i % 8 == 0 else 0))
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
fc = h.aio_flush()
while h.aio_in_flight() > 0:
    h.poll(-1)
assert h.aio_command_completed(fc)
reads = []
for i in range(64):
    off = 40 * M + i * 64 * K
    b = nbd.Buffer(64 * K)
    reads.append((off, b, h.aio_pread(b, off)))
while h.aio_in_flight() > 0:
    h.poll(-1)
for (off, b, c) in reads:
    assert h.aio_command_completed(c)
    assert b.to_bytearray() == model[off:off + 64 * K], "aio read at %d" % off

h.flush()
# Whole-volume comparison, on this connection and on a new one.
for off in range(0, size, 4 * M):
    check(off, 4 * M)
h.shutdown()
h = connect()
for off in range(0, size, 4 * M):
    check(off, 4 * M)
print("ops", sorted(counts.items()))
"#,
    );
    for op in [
        "write",
        "write_fua",
        "trim",
        "zero",
        "zero_nohole",
        "flush",
        "cache",
    ] {
        assert!(
            out.contains(&format!("('{op}', ")),
            "op {op} never ran: {out}"
        );
    }
}

/// Block status script shared by lsvd and `nbdkit memory`; prints one JSON object.
const BLOCK_STATUS_SCRIPT: &str = r#"
import json
h = connect(alloc=True)
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
M = 1 << 20
K = 1024
res = {}
res["fresh"] = block_status(h, 0, 4 * M)
h.pwrite(b"\x5a" * (2 * M), 0)
h.flush()
res["written"] = block_status(h, 0, 4 * M)
h.trim(256 * K, 256 * K)                            # [256K, 512K)
assert h.pread(256 * K, 256 * K) == bytes(256 * K), "trimmed range reads zeros"
res["trimmed"] = block_status(h, 0, 4 * M)
h.zero(256 * K, 768 * K)                            # [768K, 1M), may punch
assert h.pread(256 * K, 768 * K) == bytes(256 * K), "zeroed range reads zeros"
res["zeroed"] = block_status(h, 0, 4 * M)
h.zero(256 * K, 1280 * K, nbd.CMD_FLAG_NO_HOLE)     # [1280K, 1536K), must stay allocated
assert h.pread(256 * K, 1280 * K) == bytes(256 * K), "NO_HOLE-zeroed range reads zeros"
res["zeroed_no_hole"] = block_status(h, 0, 4 * M)
assert h.pread(256 * K, 0) == b"\x5a" * (256 * K), "data before the holes intact"
assert h.pread(256 * K, 1536 * K) == b"\x5a" * (256 * K), "data after the holes intact"
# REQ_ONE: exactly one extent, starting at the requested offset.
one = []
h.block_status(4 * M, 0, lambda ctx, o, e, err: one.extend(e) or 0, nbd.CMD_FLAG_REQ_ONE)
assert len(one) == 2, one
res["req_one_first_len"] = one[0]
res["req_one_first_flags"] = one[1]
# The last MiB of the export, unwritten.
size = h.get_size()
res["tail"] = [(o - (size - M), l, f) for (o, l, f) in block_status(h, size - M, M)]
print(json.dumps(res))
"#;

#[test]
fn block_status_trim_and_zero_agree_with_nbdkit_memory() {
    let fx = Fixture::new("block_status", &[("vol", "64M")], &[]);
    let parse = |s: &str| -> serde_json::Value {
        let line = s.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("bad script output {e}: {s}"))
    };
    let ours = parse(&nbdsh(&fx.uri("vol"), BLOCK_STATUS_SCRIPT));
    let reference = parse(&nbdsh_on_nbdkit_memory(64 * MIB, BLOCK_STATUS_SCRIPT));
    let m = MIB;
    let k = KIB;
    let ext = |v: &[(u64, u64, u64)]| serde_json::json!(v);
    // Where both servers have a natural answer they must give the same one.
    assert_eq!(ours["fresh"], ext(&[(0, 4 * m, 3)]), "lsvd fresh");
    assert_eq!(ours["written"], ext(&[(0, 2 * m, 0), (2 * m, 2 * m, 3)]));
    assert_eq!(
        ours["trimmed"],
        ext(&[
            (0, 256 * k, 0),
            (256 * k, 256 * k, 3),
            (512 * k, 1536 * k, 0),
            (2 * m, 2 * m, 3)
        ])
    );
    // After the zeroing, with or without NO_HOLE: the zeroed range reads as data.
    let zeroed = ext(&[
        (0, 256 * k, 0),
        (256 * k, 256 * k, 3),
        (512 * k, 256 * k, 0),
        (768 * k, 256 * k, 3),
        (m, m, 0),
        (2 * m, 2 * m, 3),
    ]);
    assert_eq!(ours["zeroed"], zeroed);
    for stage in ["fresh", "written", "trimmed", "zeroed"] {
        assert_eq!(
            ours[stage], reference[stage],
            "lsvd and nbdkit memory disagree after '{stage}'"
        );
    }
    // NO_HOLE: lsvd writes real zeros, so the range is reported allocated (not a hole).
    // nbdkit memory may punch it anyway (it does), so no comparison here.
    assert_eq!(
        ours["zeroed_no_hole"], zeroed,
        "NO_HOLE zeroing must leave [1280K,1536K) allocated"
    );
    // REQ_ONE: one extent from offset 0, data (the first 256K are written).
    assert_eq!(ours["req_one_first_flags"], 0);
    assert_eq!(ours["req_one_first_len"], 256 * k);
    assert_eq!(ours["tail"], ext(&[(0, m, 3)]));
    assert_eq!(ours["tail"], reference["tail"]);
}

/// Range errors, sent with libnbd's client-side checks off. Same script runs against
/// nbdkit memory: the error numbers must match it (EINVAL for reads/trim/cache past the
/// end, ENOSPC for writes and write-zeroes past the end, as the NBD spec says).
const RANGE_ERRORS_SCRIPT: &str = r#"
h = connect(strict=False)
size = h.get_size()
h.pwrite(b"\xab" * 4096, 0)
def alive():
    assert h.pread(4096, 0) == b"\xab" * 4096, "connection still works"
for (what, fn, err) in [
    ("read past end", lambda: h.pread(512, size), errno.EINVAL),
    ("read straddling end", lambda: h.pread(1024, size - 512), errno.EINVAL),
    ("write past end", lambda: h.pwrite(b"x" * 512, size), errno.ENOSPC),
    ("write straddling end", lambda: h.pwrite(b"x" * 1024, size - 512), errno.ENOSPC),
    ("zero past end", lambda: h.zero(512, size), errno.ENOSPC),
    ("trim past end", lambda: h.trim(512, size), errno.EINVAL),
    ("cache past end", lambda: h.cache(512, size), errno.EINVAL),
]:
    expect_err(what, fn, err)
    alive()
assert h.pread(512, size - 512) == bytes(512), "straddling write left no partial data"
"#;

#[test]
fn bad_requests_get_errors_and_the_connection_survives() {
    let fx = Fixture::new("bad_requests", &[("vol", "64M")], &[]);
    let ours = nbdsh(&fx.uri("vol"), RANGE_ERRORS_SCRIPT);
    let reference = nbdsh_on_nbdkit_memory(64 * MIB, RANGE_ERRORS_SCRIPT);
    assert_eq!(ours, reference, "error numbers differ from nbdkit memory");
    assert_eq!(ours.lines().count(), 7, "{ours}");

    // Alignment and size limits (nbdkit memory has no 512-byte minimum, so lsvd only).
    nbdsh(
        &fx.uri("vol"),
        r#"
h = connect(strict=False)
h.pwrite(b"\xab" * 4096, 0)
def alive():
    assert h.pread(4096, 0) == b"\xab" * 4096, "connection still works"
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
mx = h.get_block_size(nbd.SIZE_MAXIMUM)
for (what, fn, err) in [
    ("misaligned read offset", lambda: h.pread(512, 100), errno.EINVAL),
    ("misaligned read length", lambda: h.pread(100, 0), errno.EINVAL),
    ("misaligned write offset", lambda: h.pwrite(b"\xee" * 512, 4097), errno.EINVAL),
    ("misaligned write length", lambda: h.pwrite(b"\xee" * 1000, 8192), errno.EINVAL),
    ("misaligned trim", lambda: h.trim(512, 100), errno.EINVAL),
    ("misaligned zero", lambda: h.zero(700, 0), errno.EINVAL),
    ("read longer than the maximum block size", lambda: h.pread(mx + 512, 0), errno.EINVAL),
    ("trim with NO_HOLE flag", lambda: h.trim(512, 0, nbd.CMD_FLAG_NO_HOLE), errno.EINVAL),
    ("read with NO_HOLE flag", lambda: h.pread(512, 0, nbd.CMD_FLAG_NO_HOLE), errno.EINVAL),
]:
    expect_err(what, fn, err)
    alive()
# FUA is valid on every command once negotiated (NBD spec), even where it means nothing.
assert h.pread(4096, 0, nbd.CMD_FLAG_FUA) == b"\xab" * 4096
h.flush(nbd.CMD_FLAG_FUA)
if mx + 512 <= (32 << 20):
    # Over the advertised maximum but under the server's payload cap: refused, not applied.
    expect_err("write longer than the maximum block size",
               lambda: h.pwrite(bytes(mx + 512), 0), errno.EINVAL)
    alive()
# None of the refused writes changed anything.
assert h.pread(8192, 4096) == bytes(8192)
alive()
# Client-side checks in strict mode (the default) refuse before sending.
hs = connect()
expect_err("strict: misaligned read", lambda: hs.pread(100, 3), errno.EINVAL)
expect_err("strict: read past end", lambda: hs.pread(512, hs.get_size()), errno.EINVAL)
assert hs.pread(4096, 0) == b"\xab" * 4096
"#,
    );
}

// --- A minimal raw NBD client (fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies) ---

const NBDMAGIC: &[u8; 8] = b"NBDMAGIC";
const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;

struct RawConn {
    s: UnixStream,
    size: u64,
}

impl RawConn {
    fn connect(socket: &Path, export: &str) -> RawConn {
        let mut s = UnixStream::connect(socket).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).expect("server greeting");
        assert_eq!(&hello[..8], NBDMAGIC);
        assert_eq!(&hello[8..16], IHAVEOPT);
        let hflags = u16::from_be_bytes([hello[16], hello[17]]);
        assert!(hflags & 1 != 0, "server must be fixed newstyle");
        let no_zeroes = hflags & 2 != 0;
        let cflags: u32 = 1 | if no_zeroes { 2 } else { 0 };
        s.write_all(&export_name_option(cflags, export))
            .expect("send option");
        let mut info = [0u8; 10];
        s.read_exact(&mut info).expect("export info");
        if !no_zeroes {
            let mut z = [0u8; 124];
            s.read_exact(&mut z).expect("zero padding");
        }
        let size = u64::from_be_bytes(info[..8].try_into().expect("8 bytes"));
        RawConn { s, size }
    }

    fn send(&mut self, magic: u32, cmd: u16, cookie: u64, offset: u64, len: u32, data: &[u8]) {
        let mut req = Vec::with_capacity(28 + data.len());
        req.extend_from_slice(&magic.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&cmd.to_be_bytes());
        req.extend_from_slice(&cookie.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(data);
        self.s.write_all(&req).expect("send request");
    }

    /// Reads a simple reply; returns its error field.
    fn reply(&mut self, cookie: u64) -> u32 {
        let mut r = [0u8; 16];
        self.s.read_exact(&mut r).expect("reply");
        assert_eq!(
            u32::from_be_bytes(r[..4].try_into().expect("4")),
            SIMPLE_REPLY_MAGIC
        );
        assert_eq!(u64::from_be_bytes(r[8..].try_into().expect("8")), cookie);
        u32::from_be_bytes(r[4..8].try_into().expect("4"))
    }

    fn write(&mut self, cookie: u64, offset: u64, data: &[u8]) {
        self.send(
            REQUEST_MAGIC,
            CMD_WRITE,
            cookie,
            offset,
            data.len() as u32,
            data,
        );
        assert_eq!(self.reply(cookie), 0, "write at {offset}");
    }

    fn read(&mut self, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        self.send(REQUEST_MAGIC, CMD_READ, cookie, offset, len, &[]);
        assert_eq!(self.reply(cookie), 0, "read at {offset}");
        let mut v = vec![0u8; len as usize];
        self.s.read_exact(&mut v).expect("read payload");
        v
    }

    fn flush(&mut self, cookie: u64) {
        self.send(REQUEST_MAGIC, CMD_FLUSH, cookie, 0, 0, &[]);
        assert_eq!(self.reply(cookie), 0, "flush");
    }

    /// True if the server closed the connection (EOF or reset) within the timeout.
    fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
        }
    }
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let fx = Fixture::new("bad_magic", &[("vol", "64M")], &[]);
    let socket = fx.server.socket.clone();
    let a_data = random_bytes(1, 4096);
    let b_data = random_bytes(2, 8192);

    let mut a = RawConn::connect(&socket, "vol");
    let mut b = RawConn::connect(&socket, "vol");
    assert_eq!(a.size, 64 * MIB);
    a.write(1, 0, &a_data);
    b.write(1, MIB, &b_data);

    // An unknown command is an error reply (EINVAL = 22), not a disconnect.
    a.send(REQUEST_MAGIC, 99, 2, 0, 0, &[]);
    assert_eq!(a.reply(2), 22, "unknown command -> EINVAL");
    assert_eq!(a.read(3, 0, 4096), a_data);

    // A request with a bad magic is a protocol violation: the server hangs up on A.
    a.send(0xDEAD_BEEF, CMD_READ, 4, 0, 512, &[]);
    assert!(
        a.closed_by_server(),
        "server should close a connection that sent a bad request magic"
    );

    // B is unaffected, and sees A's completed write after a flush.
    b.flush(5);
    assert_eq!(b.read(6, 0, 4096), a_data);
    assert_eq!(b.read(7, MIB, 8192), b_data);
    let c_data = random_bytes(3, 4096);
    b.write(8, 2 * MIB, &c_data);
    b.flush(9);

    // New connections still work, and see everything.
    let mut c = RawConn::connect(&socket, "vol");
    assert_eq!(c.read(1, 2 * MIB, 4096), c_data);
    assert_eq!(c.read(2, 0, 4096), a_data);

    // Garbage instead of a handshake reply also only kills that connection.
    let mut g = UnixStream::connect(&socket).expect("connect");
    g.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut hello = [0u8; 18];
    g.read_exact(&mut hello).expect("greeting");
    let _ = g.write_all(&[0xff; 64]);
    let mut rest = Vec::new();
    let closed = match g.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
    };
    assert!(
        closed,
        "server should hang up on a client sending garbage flags"
    );
    assert_eq!(c.read(3, MIB, 8192), b_data);
    assert!(fx.server_running());
}

impl Fixture {
    fn server_running(&self) -> bool {
        // nbdinfo succeeding proves the process is alive and accepting.
        run_timeout(tool("nbdinfo").arg("--size").arg(self.uri("vol")), SHORT)
            .status
            .success()
    }
}

#[test]
fn qemu_io_patterns_sync_and_aio() {
    let fx = Fixture::new("qemu_io", &[("vol", "64M")], &[]);
    let uri = fx.uri("vol");
    let qemu_io = |cmds: &[&str]| -> std::process::Output {
        let mut c = tool("qemu-io");
        c.args(["-f", "raw"]);
        for cmd in cmds {
            c.arg("-c").arg(cmd);
        }
        c.arg(&uri);
        run_timeout(&mut c, LONG)
    };
    let ok = |cmds: &[&str]| {
        let out = qemu_io(cmds);
        let text = stdout(&out) + &stderr(&out);
        assert!(
            out.status.success() && !text.contains("failed") && !text.contains("error"),
            "{}",
            show(&format!("qemu-io {cmds:?}"), &out)
        );
        text
    };
    let text = ok(&[
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        // 512-byte aligned, not 4K aligned, overwriting the middle
        "write -P 0xcd 512 4k",
        "read -P 0xab 0 512",
        "read -P 0xcd 512 4k",
        "read -P 0xab 4608 1043968",
        // several writes in flight at different offsets
        "aio_write -P 0x11 2M 64k",
        "aio_write -P 0x22 3M 128k",
        "aio_write -P 0x33 5M 1M",
        "aio_write -P 0x44 7M 4k",
        "aio_flush",
        "read -P 0x11 2M 64k",
        "read -P 0x22 3M 128k",
        "read -P 0x33 5M 1M",
        "read -P 0x44 7M 4k",
        // write zeroes and discard read back as zeros, neighbours intact
        "write -z 5M 256k",
        "read -P 0 5M 256k",
        "read -P 0x33 5376k 768k",
        "discard 3M 64k",
        "read -P 0 3M 64k",
        "read -P 0x22 3136k 64k",
        // vectored and FUA writes
        "writev -P 0x55 8M 4k 8k 512",
        "read -P 0x55 8M 12800",
        "write -f -P 0x66 9M 64k",
        "read -P 0x66 9M 64k",
        "flush",
        // never written
        "read -P 0 32M 1M",
        "read -P 0 63M 1M",
    ]);
    assert!(
        text.contains("wrote 1048576/1048576 bytes at offset 0"),
        "{text}"
    );

    // A new connection (new process) sees the same data.
    ok(&[
        "read -P 0xab 0 512",
        "read -P 0xcd 512 4k",
        "read -P 0x11 2M 64k",
        "read -P 0 3M 64k",
        "read -P 0x33 5376k 768k",
        "read -P 0x44 7M 4k",
        "read -P 0x55 8M 12800",
        "read -P 0x66 9M 64k",
    ]);

    // Negative control: a wrong pattern is detected, so the checks above mean something.
    let out = qemu_io(&["read -P 0x11 0 4k"]);
    let text = stdout(&out) + &stderr(&out);
    assert!(
        !out.status.success() && text.contains("Pattern verification failed"),
        "{}",
        show("qemu-io negative control", &out)
    );
}

fn fio_json(out: &std::process::Output) -> serde_json::Value {
    let text = stdout(out);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio: {text}"));
    serde_json::from_str(&text[start..])
        .unwrap_or_else(|e| panic!("fio JSON: {e}\n{}", show("fio", out)))
}

#[test]
fn fio_random_4k_writes_verify_before_and_after_restart() {
    let mut fx = Fixture::new("fio_verify", &[("vol", "128M")], &[]);
    let workdir = fx.dir.path().to_path_buf();
    let fio = |uri: &str, verify_only: bool| -> serde_json::Value {
        let mut c = tool("fio");
        c.args([
            "--name=lsvd-randwrite",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=128M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--randrepeat=1",
            "--randseed=4242",
            "--runtime=240",
            "--output-format=json",
            // fio would drop a verify-state file into the working directory otherwise.
            "--verify_state_save=0",
        ]);
        c.current_dir(&workdir);
        if verify_only {
            c.arg("--verify_only");
        } else {
            c.arg("--do_verify=1");
        }
        let out = run_timeout(&mut c, LONG);
        assert!(out.status.success(), "{}", show("fio", &out));
        let v = fio_json(&out);
        let job = &v["jobs"][0];
        assert_eq!(job["error"], 0, "fio job error: {job}");
        assert_eq!(
            job["read"]["io_bytes"].as_u64(),
            Some(128 * MIB),
            "every block verified: {}",
            job["read"]
        );
        v
    };
    let uri = fx.uri("vol");
    let first = fio(&uri, false);
    assert_eq!(
        first["jobs"][0]["write"]["io_bytes"].as_u64(),
        Some(128 * MIB),
        "all 32768 blocks written"
    );
    // Restart the server: the same blocks must verify from what was persisted.
    fx.server.stop_clean();
    let socket = fx.dir.join("nbd.sock");
    fx.server = fx.lsvd.serve(&socket, &["vol"]);
    fio(&fx.uri("vol"), true);
}

#[test]
fn multi_conn_flush_on_one_connection_covers_the_other() {
    let fx = Fixture::new("multi_conn", &[("vol", "64M")], &[]);
    nbdsh(
        &fx.uri("vol"),
        r#"
import random
rng = random.Random(11)
h1 = connect()
h2 = connect()
assert h1.can_multi_conn() and h2.can_multi_conn()
M = 1 << 20
a = rng.randbytes(M)
b = rng.randbytes(M)
h1.pwrite(a, 0)
h2.pwrite(b, M)
h1.flush()
assert h2.pread(M, 0) == a, "h2 sees h1's write after h1's flush"
assert h1.pread(M, M) == b, "h1 sees h2's write after h1's flush"

# Interleaved in-flight writes on both connections, a flush on one, reads on the other.
model = {}
bufs = []
pending = {h1: [], h2: []}
for i in range(48):
    hh = h1 if i % 2 == 0 else h2
    off = 4 * M + i * 128 * 1024
    data = bytearray(rng.randbytes(128 * 1024))
    model[off] = bytes(data)
    buf = nbd.Buffer.from_bytearray(data)
    bufs.append(buf)
    pending[hh].append(hh.aio_pwrite(buf, off))
for hh in (h1, h2):
    while hh.aio_in_flight() > 0:
        hh.poll(-1)
    for c in pending[hh]:
        assert hh.aio_command_completed(c)
h2.flush()
for off, data in model.items():
    assert h1.pread(len(data), off) == data, "h1 reads %d" % off
    assert h2.pread(len(data), off) == data, "h2 reads %d" % off
# Overwrite from the other side and read back crosswise.
h2.pwrite(b"\x77" * 4096, 4 * M)
h2.flush()
assert h1.pread(4096, 4 * M) == b"\x77" * 4096
h3 = connect()
assert h3.pread(M, 0) == a and h3.pread(M, M) == b
"#,
    );
}
