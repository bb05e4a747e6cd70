//! Encryption at rest through the real binary and real NBD clients: `lsvd create
//! --encrypt --key-file`, `lsvd serve --key-file`, `lsvd key rotate`, snapshots,
//! clones, replication and `lsvd check` on an encrypted volume. The store is read
//! directly, every key of the volume, to show that no client data and no object or
//! checkpoint header is there in the clear; a missing or wrong key is refused with one
//! line and exit 1, and nothing in the store changes.
//! Runs on the S3 pass too (scripts/test-s3.sh).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;

/// A line a test writes all over the volume, to look for in the store afterwards.
const MARKER: &[u8] = b"lsvd-encryption-test-marker: the quick brown fox; ";

/// A key file of 32 random bytes (seeded: the same each run).
fn key_file(dir: &TempDir, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, random_bytes(seed, 32)).expect("write the key file");
    path
}

/// 4 MiB: the marker repeated, with random blocks between (what a real disk holds).
fn image() -> Vec<u8> {
    let mut out = Vec::with_capacity(4 << 20);
    let random = random_bytes(7, 2 << 20);
    let mut i = 0;
    while out.len() < 4 << 20 {
        if i % 2 == 0 {
            while out.len() % 4096 != 0 || out.len() < (i + 1) * 65536 {
                out.extend_from_slice(MARKER);
            }
        } else {
            let at = (i * 65536) % random.len();
            out.extend_from_slice(&random[at..at + 65536]);
        }
        i += 1;
    }
    out.truncate(4 << 20);
    out
}

/// The store `lsvd` uses, opened directly (no key: the bytes as stored).
fn raw_store(lsvd: &Lsvd) -> lsvd_store::DynStore {
    let url = lsvd
        .store
        .clone()
        .unwrap_or_else(|| format!("file://{}", lsvd.data.join("store").display()));
    lsvd_store::open_store(&url).expect("open the test store")
}

/// Every key under `prefix` with its bytes, as stored.
fn stored(lsvd: &Lsvd, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = raw_store(lsvd);
        let mut out = BTreeMap::new();
        for e in store.list(prefix).await.expect("list") {
            let bytes = store.get(&e.key).await.expect("get");
            out.insert(e.key, bytes);
        }
        out
    })
}

/// No key under `volume/` holds the marker, an object or checkpoint magic, or a
/// 512-byte run of the image; the objects are there (sealed).
fn assert_nothing_in_the_clear(lsvd: &Lsvd, volume: &str, image: &[u8]) {
    let keys = stored(lsvd, &format!("{volume}/"));
    let objects = keys.keys().filter(|k| k.contains("/obj/")).count();
    assert!(
        objects >= 2,
        "{volume}: only {objects} objects: {:?}",
        keys.keys()
    );
    let needles: [&[u8]; 4] = [
        &MARKER[..24],
        b"LSVDOBJ\0",
        b"LSVDCKP\0",
        &image[(1 << 20) + 512..(1 << 20) + 1024],
    ];
    for (key, bytes) in &keys {
        for needle in needles {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{key} holds {:?} in the clear",
                String::from_utf8_lossy(&needle[..8])
            );
        }
        if key.contains("/obj/") {
            assert_eq!(&bytes[..8], b"LSVDSEAL", "{key} is not sealed");
        }
    }
}

/// A test's directory, an lsvd keeping its data there, and key files made from
/// `seeds`; volume `vol` (16M) is created encrypted with the first.
fn encrypted_vol(test: &str, seeds: &[u64]) -> (TempDir, Lsvd, Vec<PathBuf>) {
    require_tools(&["nbdcopy"]);
    let dir = TempDir::new(test);
    let lsvd = Lsvd::new(dir.join("data"));
    let keys: Vec<PathBuf> = seeds
        .iter()
        .map(|&s| key_file(&dir, &format!("{s}.key"), s))
        .collect();
    let create = ["create", "vol", "--size", "16M", "--encrypt", "--key-file"];
    lsvd.assert_stdout_mentions(&[(&[&create[..], &[arg(&keys[0])]].concat(), &["encrypted"])]);
    (dir, lsvd, keys)
}

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Write `image` through a server with `key`, stop cleanly, read it back through a
/// new one and compare.
fn write_and_read_back(dir: &TempDir, lsvd: &Lsvd, volume: &str, key: &Path, image: &[u8]) {
    let socket = dir.join("nbd.sock");
    let src = dir.join("image.in");
    std::fs::write(&src, image).expect("write the image file");
    let mut server = lsvd.serve(&socket, &[volume, "--key-file", arg(key)]);
    nbdcopy(arg(&src), &server.uri(volume));
    server.stop_clean();
    assert_reads(dir, lsvd, volume, key, image);
}

fn assert_reads(dir: &TempDir, lsvd: &Lsvd, volume: &str, key: &Path, image: &[u8]) {
    let socket = dir.join("nbd.sock");
    let back = dir.join("image.out");
    let mut server = lsvd.serve(&socket, &[volume, "--key-file", arg(key)]);
    nbdcopy(&server.uri(volume), arg(&back));
    server.stop_clean();
    let read = std::fs::read(&back).expect("read back");
    assert!(
        read[..image.len()] == *image,
        "{volume} reads back what was written"
    );
}

/// `lsvd ARGS` fails with exit 1 and one line naming `volume` and saying `why`.
fn assert_refused(lsvd: &Lsvd, args: &[&str], volume: &str, why: &str) {
    let out = lsvd.run(args);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show(&args.join(" "), &out)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!("volume '{volume}'")) && err.contains(why),
        "{}",
        show(&args.join(" "), &out)
    );
}

#[test]
fn encrypted_volume_stores_nothing_in_the_clear_and_reads_back() {
    let (dir, lsvd, keys) = encrypted_vol("encryption-clear", &[1]);
    let key = &keys[0];
    let image = image();
    write_and_read_back(&dir, &lsvd, "vol", key, &image);
    assert_nothing_in_the_clear(&lsvd, "vol", &image);
    let out = lsvd.run_ok(&["check", "vol", "--key-file", arg(key)]);
    assert!(out.status.success(), "{}", show("check", &out));
    let info = lsvd
        .cmd(["info", "vol", "--json", "--key-file", arg(key)])
        .output();
    let info: serde_json::Value =
        serde_json::from_slice(&info.expect("info").stdout).expect("info --json");
    assert_eq!(info["encrypted"], true, "{info}");
    // Compression and encryption together: compressed, then sealed.
    lsvd.run_ok(&["config", "vol", "--compression", "lz4"]);
    write_and_read_back(&dir, &lsvd, "vol", key, &image);
    assert_nothing_in_the_clear(&lsvd, "vol", &image);
}

#[test]
fn no_key_or_a_wrong_key_is_refused_and_nothing_is_written() {
    let (dir, lsvd, keys) = encrypted_vol("encryption-refused", &[2, 3]);
    let (key, wrong) = (&keys[0], &keys[1]);
    write_and_read_back(&dir, &lsvd, "vol", key, &image());
    let before = stored(&lsvd, "vol/");
    // Another host (a fresh data directory) tries without the key, then a wrong one.
    let other = Lsvd {
        data: dir.join("other-data"),
        store: Some(
            lsvd.store
                .clone()
                .unwrap_or_else(|| format!("file://{}", lsvd.data.join("store").display())),
        ),
    };
    let socket = dir.join("other.sock");
    let s = arg(&socket);
    for (args, why) in [
        (
            vec!["serve", "vol", "--no-probe", "--socket", s],
            "is encrypted",
        ),
        (
            vec![
                "serve",
                "vol",
                "--no-probe",
                "--socket",
                s,
                "--key-file",
                arg(wrong),
            ],
            "does not unlock it",
        ),
        (vec!["check", "vol"], "is encrypted"),
        (
            vec!["info", "vol", "--key-file", arg(wrong)],
            "does not unlock it",
        ),
        (vec!["snapshot", "create", "vol", "s1"], "is encrypted"),
        (vec!["clone", "vol@s0", "copy"], "is encrypted"),
    ] {
        assert_refused(&other, &args, "vol", why);
    }
    assert!(
        stored(&lsvd, "vol/") == before,
        "a refused command changed the store"
    );
    assert!(
        !other.data.join("vol.wlog").exists(),
        "a refused serve made a write log"
    );
    // A key file that is not a key is a usage error (exit 2), naming how to make one.
    let bad = dir.join("bad.key");
    std::fs::write(&bad, "secret\n").expect("write");
    let out = other.run(&["check", "vol", "--key-file", arg(&bad)]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        show("check with a bad key", &out)
    );
    assert!(
        stderr(&out).contains("head -c 32 /dev/urandom"),
        "{}",
        stderr(&out)
    );
    // --encrypt without a key is refused before anything is created.
    let out = lsvd.run(&["create", "v2", "--size", "16M", "--encrypt"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        show("create --encrypt", &out)
    );
    assert!(stored(&lsvd, "v2/").is_empty());
    // What needs no key (docs/SEMANTICS.md): list, snapshot list, rename, delete.
    other.run_ok(&["list"]);
    other.run_ok(&["snapshot", "list", "vol"]);
    other.run_ok(&["rename", "vol", "moved"]);
    other.run_ok(&["check", "moved", "--key-file", arg(key)]);
    other.run_ok(&["delete", "moved", "--yes"]);
    assert!(
        stored(&lsvd, "moved/")
            .keys()
            .all(|k| !k.contains("/obj/") && !k.ends_with("/keys")),
        "delete left objects or the key record"
    );
}

#[test]
fn rotation_snapshots_clones_and_replicas_keep_working() {
    let (dir, lsvd, keys) = encrypted_vol("encryption-life", &[4, 5]);
    let (old, new) = (&keys[0], &keys[1]);
    let image = image();
    write_and_read_back(&dir, &lsvd, "vol", old, &image);
    // A snapshot and a clone of it, made with the key; the clone keeps the base's key.
    lsvd.run_ok(&["snapshot", "create", "vol", "s1", "--key-file", arg(old)]);
    lsvd.run_ok(&["clone", "vol@s1", "copy", "--key-file", arg(old)]);
    let mut changed = image.clone();
    changed[..MARKER.len()].copy_from_slice(&MARKER.to_ascii_uppercase());
    write_and_read_back(&dir, &lsvd, "copy", old, &changed);
    assert_nothing_in_the_clear(&lsvd, "copy", &image);
    // Rotation, while a server started with the old key serves the volume: the new
    // key unlocks it, the old one no longer does; no object is rewritten; the server
    // (it holds the unwrapped data key) goes on writing, and the new key reads that.
    let socket = dir.join("rotating.sock");
    let mut server = lsvd.serve(&socket, &["vol", "--key-file", arg(old)]);
    let objects_before: Vec<_> = stored(&lsvd, "vol/obj/").into_iter().collect();
    lsvd.assert_stdout_mentions(&[(
        &[
            "key",
            "rotate",
            "vol",
            "--key-file",
            arg(old),
            "--new-key-file",
            arg(new),
        ],
        &["now unlocked by"],
    )]);
    assert!(stored(&lsvd, "vol/obj/").into_iter().collect::<Vec<_>>() == objects_before);
    let src = dir.join("changed.in");
    std::fs::write(&src, &changed).expect("write the image file");
    nbdcopy(arg(&src), &server.uri("vol"));
    server.stop_clean();
    assert_refused(
        &lsvd,
        &["check", "vol", "--key-file", arg(old)],
        "vol",
        "does not unlock it",
    );
    lsvd.run_ok(&["check", "vol", "--key-file", arg(new)]);
    assert_reads(&dir, &lsvd, "vol", new, &changed);
    // The clone kept its own record: still the old key.
    assert_reads(&dir, &lsvd, "copy", old, &changed);
    // A replica stays encrypted, with the volume's key record; it reads the same.
    // Without the key the objects are copied as stored (sealed); with it they are
    // opened, checked and sealed again.
    for (target, with_key) in [("replica-sealed", false), ("replica-keyed", true)] {
        let replica_dir = dir.join(target);
        let url = store_url_for(&replica_dir);
        let mut args = vec!["replicate", "vol", "--to", url.as_str()];
        if with_key {
            args.extend(["--key-file", arg(new)]);
        }
        lsvd.run_ok(&args);
        let replica = Lsvd::with_store(dir.join(format!("{target}-data")), &replica_dir);
        assert_nothing_in_the_clear(&replica, "vol", &image);
        let source_objects = stored(&lsvd, "vol/obj/");
        let copied = stored(&replica, "vol/obj/");
        assert!(!copied.is_empty());
        for (key, bytes) in &copied {
            let same = source_objects.get(key) == Some(bytes);
            assert_eq!(same, !with_key, "{target}: {key} copied as stored: {same}");
        }
        assert_refused(&replica, &["check", "vol"], "vol", "is encrypted");
        lsvd.run_ok(&["check", "vol", "--store", &url, "--key-file", arg(new)]);
        assert_reads(&dir, &replica, "vol", new, &changed);
    }
}

/// Every file of the data directory that holds client data (write log, read cache and
/// its table), with the needles of [`assert_nothing_in_the_clear`] found in each.
fn local_files_in_the_clear(lsvd: &Lsvd, image: &[u8]) -> Vec<(String, usize)> {
    let needles: [&[u8]; 2] = [&MARKER[..24], &image[(1 << 20) + 512..(1 << 20) + 1024]];
    let mut found = Vec::new();
    for path in files_under(&lsvd.data) {
        let name = path.display().to_string();
        if !(name.ends_with(".wlog") || name.contains(".rcache")) {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read a local file");
        let hits = needles
            .iter()
            .filter(|n| bytes.windows(n.len()).any(|w| w == **n))
            .count();
        found.push((name, hits));
    }
    found
}

/// `--encrypt-local`: the write log and read cache hold no client data in the clear,
/// a crash with writes only in the log recovers them through the encryption, `check`
/// and `inspect log` read the log with the key (and refuse without it), and a start
/// without the flag after a clean stop makes the files anew in the clear (which the
/// same search then finds: the search can fail).
#[test]
fn encrypt_local_keeps_the_write_log_and_read_cache_out_of_the_clear() {
    let (dir, lsvd, keys) = encrypted_vol("encryption-local", &[5]);
    let key = arg(&keys[0]);
    let image = image();
    let src = dir.join("image.in");
    std::fs::write(&src, &image).expect("write the image file");
    let socket = dir.join("nbd.sock");
    // Nothing is uploaded before the crash: the image is in the write log only.
    let serve = ["vol", "--key-file", key, "--encrypt-local"];
    let hold = ["--batch-timeout-ms", "600000", "--batch-size", "64M"];
    let mut server = lsvd.serve(&socket, &[&serve[..], &hold[..]].concat());
    nbdcopy(arg(&src), &server.uri("vol"));
    let back = dir.join("image.out");
    nbdcopy(&server.uri("vol"), arg(&back));
    server.kill9();
    let files = local_files_in_the_clear(&lsvd, &image);
    assert!(files.iter().any(|(f, _)| f.ends_with(".wlog")), "{files:?}");
    assert!(files.iter().all(|(_, hits)| *hits == 0), "{files:?}");

    // The log is read with the key, and refused without it.
    let out = lsvd.run_ok(&["inspect", "log", "vol", "--key-file", key]);
    assert!(
        stdout(&out).contains("records on the chain") && stdout(&out).contains("data lba"),
        "{}",
        show("inspect log", &out)
    );
    let out = lsvd.run(&["inspect", "log", "vol"]);
    assert!(
        !out.status.success() && stderr(&out).contains("encrypted"),
        "{}",
        show("inspect log without the key", &out)
    );
    let out = lsvd.run_ok(&["check", "vol", "--key-file", key]);
    assert!(
        stdout(&out).contains("not yet in the store"),
        "{}",
        show("check", &out)
    );

    // Recovery replays the encrypted records; everything reads back. The start has
    // no --encrypt-local, but the log was not closed cleanly: it stays encrypted (a
    // warning says so). Once uploaded and released from the log (`lsvd sync`,
    // `--log-free-target all`), reads go through the read cache.
    let release = ["vol", "--key-file", key, "--log-free-target", "all"];
    let mut server = lsvd.serve(&socket, &release);
    assert!(
        server.log().contains("recovered vol") && server.log().contains("stays encrypted"),
        "{}",
        server.log()
    );
    lsvd.run_ok(&["sync", "vol"]);
    nbdcopy(&server.uri("vol"), arg(&back));
    server.stop_clean();
    let read = std::fs::read(&back).expect("read back");
    assert!(read[..image.len()] == *image, "the image reads back");
    let files = local_files_in_the_clear(&lsvd, &image);
    assert!(files.iter().all(|(_, hits)| *hits == 0), "{files:?}");
    // The read cache was filled by the reads after the upload (so its encryption
    // was used, not merely its file made).
    let rcache = std::fs::read(lsvd.data.join("vol.rcache")).expect("the read cache");
    let filled = rcache.iter().filter(|&&b| b != 0).count();
    assert!(
        filled > 1 << 20,
        "the read cache holds {filled} non-zero bytes"
    );

    // Without the flag, after that clean stop: the files are made anew in the clear,
    // where the image written again is found.
    let mut server = lsvd.serve(&socket, &["vol", "--key-file", key, hold[0], hold[1]]);
    assert!(server.log().contains("made anew"), "{}", server.log());
    nbdcopy(arg(&src), &server.uri("vol"));
    server.kill9();
    let files = local_files_in_the_clear(&lsvd, &image);
    assert!(
        files
            .iter()
            .any(|(f, hits)| f.ends_with(".wlog") && *hits == 2),
        "a plain write log holds the image in the clear: {files:?}"
    );
    // The other way: a plain log left by a crash stays plain under --encrypt-local
    // until a clean stop, and its records are replayed.
    let mut server = lsvd.serve(&socket, &serve);
    assert!(
        server.log().contains("recovered vol") && server.log().contains("stays in the clear"),
        "{}",
        server.log()
    );
    nbdcopy(&server.uri("vol"), arg(&back));
    server.stop_clean();
    let read = std::fs::read(&back).expect("read back");
    assert!(read[..image.len()] == *image, "the image reads back");
    let mut server = lsvd.serve(&socket, &serve);
    assert!(server.log().contains("made anew"), "{}", server.log());
    server.stop_clean();
    let files = local_files_in_the_clear(&lsvd, &image);
    assert!(files.iter().all(|(_, hits)| *hits == 0), "{files:?}");

    // A plain volume has nothing to derive local keys from: refused, one line.
    lsvd.run_ok(&["create", "plain", "--size", "16M"]);
    let out = lsvd.run(&[
        "serve",
        "plain",
        "--encrypt-local",
        "--no-probe",
        "--socket",
        arg(&dir.join("plain.sock")),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", show("serve plain", &out));
    assert!(
        stderr(&out).contains("--encrypt-local") && stderr(&out).contains("not encrypted"),
        "{}",
        show("serve plain --encrypt-local", &out)
    );
}
