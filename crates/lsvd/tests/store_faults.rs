//! Store faults on real filesystems and a real S3 server: what a full disk and a
//! refused key look like to lsvd (docs/SEMANTICS.md, "Store error classes").
//!
//! * The local store on a full filesystem (a small tmpfs, filled): a put is `Full`,
//!   not `Transient` (it was, and the engine retried it forever), reads, listings and
//!   deletes still work, and once room is made puts succeed again.
//! * A mirrored chain with one copy on a full filesystem: the put lands on the other
//!   copy and the position serves degraded, also across a restart while the disk is
//!   still full; once it has room, the next open brings the copy in step.
//! * versitygw whose root directory is on a full tmpfs: it answers `507
//!   InsufficientStorage`, which is `Full`; a wrong secret is `403
//!   SignatureDoesNotMatch`, which is `Denied`. This test starts a versitygw of its
//!   own (its root must be on the small filesystem), as the soak does; it needs the
//!   binary (scripts/install-versitygw.sh, or `LSVD_VERSITYGW=PATH`).
//! * A wrong secret against the S3 server of `scripts/with-versitygw.sh` (the
//!   `AWS_*` variables and `LSVD_TEST_S3_BUCKET`, as in `s3_store.rs`): `Denied`.
//!
//! Mounting a tmpfs needs root: without it those tests say SKIPPED and pass. Without a
//! versitygw binary or S3 variables the S3 tests say SKIPPED, unless an S3 server is
//! required (`LSVD_TEST_STORE=s3`, `LSVD_REQUIRE_S3=1`), which makes them fail.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    Lsvd, SmallTmpfs, TempDir, env_nonempty, find_versitygw, free_tcp_port, missing_s3_env, nbdsh,
    s3_required,
};
use lsvd_core::error::ErrorKind;
use lsvd_store::s3::{S3Settings, S3Store, Secret};
use lsvd_store::testutil::store_metric;
use lsvd_store::{DynStore, ObjectStore, PutMode, open_store};

fn obj(seq: u64) -> String {
    format!("v/obj/{seq:016x}.d")
}

fn data(seq: u64, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).wrapping_add(seq) as u8)
        .collect()
}

fn skip(test: &str, why: &str) {
    if let Some(required) = s3_required() {
        panic!("{test}: {why}; not skipped: {required}");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// A temp dir (tagged `tag`) with a tmpfs of `size_mib` MiB mounted on `fs` in it; None
/// (`test` skipped, saying why) where no tmpfs can be mounted. The filesystem is
/// unmounted before the dir is removed.
fn dir_with_small_fs(tag: &str, size_mib: u64, test: &str) -> Option<(TempDir, SmallTmpfs)> {
    let dir = TempDir::new(tag);
    let fs = SmallTmpfs::mount(&dir.join("fs"), size_mib, test)?;
    Some((dir, fs))
}

/// The local store on a filesystem that fills up: `Full` at once (no retries: the
/// call returns in well under the retry layer's first delay), no partial object left,
/// reads and deletes unaffected, and puts work again once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_disk_is_full_and_room_brings_puts_back() {
    let test = "a_full_store_disk_is_full_and_room_brings_puts_back";
    let Some((_dir, fs)) = dir_with_small_fs("store-full-disk", 16, test) else {
        return;
    };
    let root = fs.path().join("store");
    let store = open_store(&format!("file://{}", root.display())).expect("open");
    store
        .put(&obj(1), data(1, 2 << 20), PutMode::IfAbsent)
        .await
        .expect("put with room");
    store
        .put("v/meta", data(0, 100), PutMode::Overwrite)
        .await
        .expect("small put");
    fs.fill();

    for (key, len, mode) in [
        (obj(2), 2 << 20, PutMode::IfAbsent),
        (obj(3), 4096, PutMode::IfAbsent),
        ("v/meta".to_string(), 200, PutMode::Overwrite),
    ] {
        let t = Instant::now();
        let e = store
            .put(&key, data(2, len), mode)
            .await
            .expect_err("no room");
        assert_eq!(e.kind, ErrorKind::Full, "{key}: {e}");
        assert!(e.to_string().contains("No space left on device"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{key}: not retried");
        // What an NBD client would be told.
        assert_eq!(
            std::io::Error::from(e).kind(),
            std::io::ErrorKind::StorageFull
        );
    }
    // Nothing half-written is left or listed.
    let keys = lsvd_store::testutil::list_keys(&*store, "v/").await;
    assert_eq!(keys, vec!["v/meta".to_string(), obj(1)]);
    let leftovers = std::fs::read_dir(root.join("v/obj"))
        .expect("read dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
        .count();
    assert_eq!(leftovers, 0, "temporary files left behind");
    assert_eq!(store.get("v/meta").await.expect("get"), data(0, 100));
    assert_eq!(store.get(&obj(1)).await.expect("get"), data(1, 2 << 20));
    assert_eq!(
        store.get_range(&obj(1), 10..20).await.expect("range"),
        data(1, 2 << 20)[10..20]
    );
    // A delete frees room: the small put fits now, the large one still not.
    store.delete(&obj(1)).await.expect("delete on a full disk");
    store
        .put(&obj(3), data(3, 4096), PutMode::IfAbsent)
        .await
        .expect("room made by the delete");
    fs.free();
    store
        .put(&obj(2), data(2, 2 << 20), PutMode::IfAbsent)
        .await
        .expect("room again");
    assert_eq!(store.get(&obj(2)).await.expect("get"), data(2, 2 << 20));
}

/// A mirrored chain (`chain:A+B`) whose copy B is on a full filesystem: the put lands
/// on A and the position degrades (counted), it stays degraded across a restart while
/// B is still full (the open cannot bring B in step: it serves from A instead of
/// refusing to start), and once B has room the next open copies what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_copy_on_a_full_disk_degrades_until_it_has_room() {
    let test = "a_mirror_copy_on_a_full_disk_degrades_until_it_has_room";
    let Some((dir, fs)) = dir_with_small_fs("store-full-mirror", 16, test) else {
        return;
    };
    let a = dir.join("a");
    let b = fs.path().join("b");
    // Room by drive_size, not by free space (which would call the position full as
    // soon as its fuller copy is): the put reaches both copies.
    let url = format!("chain:{}+{}?drive_size=8M", a.display(), b.display());
    let len = 1 << 20;
    {
        let s = open_store(&url).expect("create");
        s.put(&obj(0), data(0, len), PutMode::IfAbsent)
            .await
            .expect("put");
        assert!(b.join(obj(0)).is_file());
        fs.fill();
        s.put(&obj(1), data(1, len), PutMode::IfAbsent)
            .await
            .expect("lands on the copy with room");
        assert!(a.join(obj(1)).is_file() && !b.join(obj(1)).is_file());
        assert_eq!(store_metric(&*s, "degraded_positions"), 1.0);
        assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 1.0);
        s.put(&obj(2), data(2, len), PutMode::IfAbsent)
            .await
            .expect("degraded put");
        s.delete(&obj(0)).await.expect("degraded delete");
    }
    {
        let s = open_store(&url).expect("opens degraded while the copy is full");
        assert_eq!(store_metric(&*s, "degraded_positions"), 1.0);
        for seq in 1..3 {
            assert_eq!(s.get(&obj(seq)).await.expect("get"), data(seq, len));
        }
    }
    fs.free();
    let s = open_store(&url).expect("open brings the copy in step");
    assert_eq!(store_metric(&*s, "degraded_positions"), 0.0);
    assert!(b.join(obj(1)).is_file() && b.join(obj(2)).is_file());
    assert!(!b.join(obj(0)).is_file(), "the delete it missed is applied");
    assert_eq!(s.get(&obj(2)).await.expect("get"), data(2, len));
}

/// A versitygw (posix backend) on 127.0.0.1 keeping its buckets under `root`; killed
/// on drop.
struct Gateway {
    child: Child,
    port: u16,
}

impl Gateway {
    const ACCESS: &str = "storefaults0001";
    const SECRET: &str = "store-faults-secret-4c1d8e";

    fn start(bin: &Path, root: &Path, log: &Path) -> Gateway {
        for _ in 0..10 {
            let port = free_tcp_port();
            let mut gateway = Command::new(bin);
            gateway
                .env("ROOT_ACCESS_KEY", Self::ACCESS)
                .env("ROOT_SECRET_KEY", Self::SECRET)
                .arg("--port")
                .arg(format!("127.0.0.1:{port}"))
                .args([Path::new("posix"), root]);
            let mut child = common::spawn_logging(&mut gateway, log);
            let mut poll = common::Poller::new(Duration::from_millis(20), Duration::from_secs(30));
            while poll.tick_blocking() {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Gateway { child, port };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break; // the port was taken after all: another one
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("versitygw {} did not start", bin.display());
    }

    /// The bucket `bucket` of this gateway, with `secret`; no retries inside the S3
    /// client (a 507 is a 5xx, which it would retry).
    fn store(&self, bucket: &str, secret: &str) -> S3Store {
        let settings = S3Settings {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: Some("us-east-1".into()),
            access_key_id: Some(Secret::new(Self::ACCESS)),
            secret_access_key: Some(Secret::new(secret)),
            max_retries: 0,
            ..S3Settings::default()
        };
        S3Store::open(&format!("s3://{bucket}/faults"), &settings).expect("open (no I/O)")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// versitygw whose root is on a full filesystem answers a put with `507
/// InsufficientStorage` (its `ENOSPC`): `Full`. Reads and deletes still work, and puts
/// again once there is room. A wrong secret is `403 SignatureDoesNotMatch`: `Denied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versitygw_on_a_full_disk_is_full_and_a_wrong_secret_denied() {
    let test = "versitygw_on_a_full_disk_is_full_and_a_wrong_secret_denied";
    let Some(bin) = find_versitygw() else {
        skip(
            test,
            "needs versitygw (scripts/install-versitygw.sh, or LSVD_VERSITYGW=PATH)",
        );
        return;
    };
    let Some((dir, fs)) = dir_with_small_fs("store-full-s3", 16, test) else {
        return;
    };
    let bucket = "faults";
    std::fs::create_dir_all(fs.path().join(bucket)).expect("bucket directory");
    let gw = Gateway::start(&bin, fs.path(), &dir.join("versitygw.log"));
    let s = gw.store(bucket, Gateway::SECRET);
    let len = 1 << 20;
    s.put(&obj(1), data(1, len), PutMode::IfAbsent)
        .await
        .expect("put with room");
    fs.fill();
    for mode in [PutMode::IfAbsent, PutMode::Overwrite] {
        let e = s
            .put(&obj(2), data(2, len), mode)
            .await
            .expect_err("no room");
        assert_eq!(e.kind, ErrorKind::Full, "{mode:?}: {e}");
        assert!(
            e.message.contains("507") && e.message.contains("InsufficientStorage"),
            "{e}"
        );
    }
    assert_eq!(s.get(&obj(1)).await.expect("get"), data(1, len));
    let listed = s.list("").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    s.delete(&obj(1)).await.expect("delete on a full disk");
    fs.free();
    s.put(&obj(2), data(2, len), PutMode::IfAbsent)
        .await
        .expect("room again");

    let wrong = gw.store(bucket, "WRONG-secret-store-faults-9e2a");
    let e = wrong.get(&obj(2)).await.expect_err("wrong secret");
    assert_eq!(e.kind, ErrorKind::Denied, "{e}");
    assert!(e.message.contains("SignatureDoesNotMatch"), "{e}");
    assert!(
        !e.to_string().contains("WRONG-secret"),
        "secret leaked: {e}"
    );
    let e = wrong
        .put(&obj(3), data(3, 10), PutMode::IfAbsent)
        .await
        .expect_err("wrong secret");
    assert_eq!(e.kind, ErrorKind::Denied, "{e}");
    assert_eq!(
        wrong.list("").await.expect_err("wrong secret").kind,
        ErrorKind::Denied
    );
}

/// A wrong secret and an unknown key id against the S3 server of
/// `scripts/with-versitygw.sh` are `Denied`, through `open_store`'s retry layer, after
/// one attempt each (a denial is not retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_denied_at_once() {
    let test = "a_wrong_secret_is_denied_at_once";
    let missing = missing_s3_env();
    if !missing.is_empty() {
        skip(
            test,
            &format!(
                "needs an S3 server ({} unset); run scripts/with-versitygw.sh cargo test -p lsvd --test store_faults",
                missing.join(", ")
            ),
        );
        return;
    }
    let bucket = env_nonempty("LSVD_TEST_S3_BUCKET").expect("checked");
    let url = format!("s3://{bucket}/store-faults-{}", std::process::id());
    let real_key = env_nonempty("AWS_ACCESS_KEY_ID").expect("checked");
    for (what, key) in [
        ("wrong secret", real_key.as_str()),
        ("unknown key", "AKIASTOREFAULTS0"),
    ] {
        let settings = S3Settings {
            access_key_id: Some(Secret::new(key)),
            secret_access_key: Some(Secret::new("WRONG-secret-store-faults-51f0")),
            ..S3Settings::default()
        };
        let store: DynStore = lsvd_store::s3::open_with_retry(
            &url,
            &settings,
            &lsvd_store::retry::RetryPolicy::default(),
        )
        .expect("open (no I/O)");
        let t = Instant::now();
        let e = store.get("k").await.expect_err(what);
        assert_eq!(e.kind, ErrorKind::Denied, "{what}: {e}");
        assert!(!e.message.contains("gave up after"), "{what}: retried: {e}");
        let e = store
            .put("k", Bytes::from_static(b"x"), PutMode::IfAbsent)
            .await
            .expect_err(what);
        assert_eq!(e.kind, ErrorKind::Denied, "{what}: {e}");
        let e = store.list("").await.expect_err(what);
        assert_eq!(e.kind, ErrorKind::Denied, "{what}: {e}");
        assert!(t.elapsed() < Duration::from_secs(20), "{what}: not retried");
    }
}

/// `lsvd serve` with its store on a filesystem that fills up, driven by a real client
/// (libnbd's nbdsh): writes go on into the write log, then, once it is full (or the
/// lease cannot be renewed on the full store) and the stall timeout has passed, fail
/// with ENOSPC, never hanging; nothing acknowledged is lost: once the filesystem has
/// room again writes are accepted and every acknowledged chunk reads back.
#[test]
fn a_served_volume_on_a_full_store_answers_enospc_and_loses_nothing() {
    const TEST: &str = "a_served_volume_on_a_full_store_answers_enospc_and_loses_nothing";
    common::require_tools(&["nbdsh"]);
    let Some((dir, fs)) = dir_with_small_fs("store-full-serve", 48, TEST) else {
        return;
    };
    // The local store on the small filesystem, also on the S3 pass (the fault is the
    // filesystem's).
    let lsvd = Lsvd {
        data: dir.join("data"),
        store: Some(format!("file://{}", fs.path().join("store").display())),
    };
    lsvd.create("vol", "64M");
    let socket = dir.join("nbd.sock");
    let args = [
        "vol",
        "--log-size",
        "16M",
        "--batch-size",
        "1M",
        "--batch-timeout-ms",
        "100",
        "--stall-timeout",
        "3s",
        "--lease-timeout",
        "3s",
    ];
    let mut server = lsvd.serve(&socket, &args);
    let uri = server.uri("vol");
    // Four chunks written and flushed while the store has room.
    nbdsh(
        &uri,
        "h = connect()\nfor i in range(4):\n    h.pwrite(pattern(i, 1 << 20), i << 20)\nh.flush()\n",
    );
    fs.fill();
    // Writes until one fails: it must be ENOSPC, within the stall timeouts.
    let out = nbdsh(
        &uri,
        r#"
import time
h = connect()
acked = 4
t = time.monotonic()
while True:
    assert acked < 64, "64 MiB were acknowledged into a 16 MiB log with a full store"
    try:
        h.pwrite(pattern(acked, 1 << 20), acked << 20)
    except nbd.Error as e:
        assert e.errnum == errno.ENOSPC, "errno %s: %s" % (errno.errorcode.get(e.errnum), e.string)
        break
    acked += 1
print("acked", acked, "refused after", round(time.monotonic() - t, 2))
"#,
    );
    eprintln!("{TEST}: {}", out.trim());
    let (acked, refused_after_s) = match out.split_whitespace().collect::<Vec<_>>()[..] {
        ["acked", n, "refused", "after", s] => (
            n.parse::<u64>().expect("count"),
            s.parse::<f64>().expect("seconds"),
        ),
        _ => panic!("unexpected output: {out}"),
    };
    assert!(
        refused_after_s < 30.0,
        "the refusal took {refused_after_s} s"
    );
    assert!(
        server.log().contains("the store refuses uploads"),
        "no log line for the full store\n{}",
        server.log()
    );
    fs.free();
    // Room again: writes are accepted (within a minute: uploads are tried again every
    // few seconds, the lease renewed), and everything acknowledged reads back.
    nbdsh(
        &uri,
        &format!(
            r#"
import time
deadline = time.monotonic() + 60
while True:
    h = connect()
    try:
        h.pwrite(pattern(1000, 1 << 20), 63 << 20)
        h.flush()
        break
    except nbd.Error as e:
        assert time.monotonic() < deadline, "writes still refused: %s" % e.string
        h.shutdown()
        time.sleep(0.5)
for i in range({acked}):
    assert h.pread(1 << 20, i << 20) == pattern(i, 1 << 20), "chunk %d" % i
assert h.pread(1 << 20, 63 << 20) == pattern(1000, 1 << 20)
"#
        ),
    );
    let log = server.stop_clean();
    assert!(log.contains("lsvd: stopped cleanly"), "{log}");
}
