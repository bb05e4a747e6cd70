//! What is verified where, with the real binary and a real client (nbdsh): a record
//! whose bytes change on the cache device after it was acknowledged is never
//! uploaded (the volume fails, naming its LBAs; writes get EIO; the metric counts it;
//! `lsvd check` reports it), and a corrupt newest checkpoint in the store is passed
//! over for the previous one with the data read back identical.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};

use common::*;

const TOOLS: &[&str] = &["nbdcopy", "nbdsh"];

/// The marker block's place: 4 MiB into the volume, LBA 8192.
const MARKER_OFFSET: u64 = 4 * MIB;

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).expect("read file");
    bytes[offset as usize] ^= 0x20;
    std::fs::write(path, bytes).expect("write file");
}

#[test]
fn a_record_corrupted_on_the_cache_device_is_refused_and_reported() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("integrity_record", "64M");
    let metrics = format!("127.0.0.1:{}", free_tcp_port());
    // One batch holds everything written below until it is full (32 MiB): nothing
    // is uploaded before the byte is flipped. Uploads read their records back from
    // the log (--upload-memory 0; by default they take them from memory, where the
    // flipped byte does not reach).
    let mut server = lsvd.serve(
        &socket,
        &[
            "vol",
            "--batch-size",
            "32M",
            "--batch-timeout-ms",
            "600000",
            "--upload-memory",
            "0",
            "--metrics",
            &metrics,
        ],
    );
    let marker = random_bytes(0x5EED, 4096);
    let marker_path = dir.join("marker.bin");
    std::fs::write(&marker_path, &marker).expect("write marker");
    // The marker first, then 10 MiB more (past an eighth of the 64 MiB log, so a
    // write-log index lists the marker's record as durable), flushed.
    nbdsh(
        &server.uri("vol"),
        &format!(
            r#"
import random
h = connect()
h.pwrite(open("{marker}", "rb").read(), {MARKER_OFFSET})
rng = random.Random(7)
for i in range(10):
    h.pwrite(rng.randbytes(1 << 20), (8 + i) << 20)
h.flush()
"#,
            marker = marker_path.display()
        ),
    );
    let wlog = dir.join("data").join("vol.wlog");
    let at = find(&std::fs::read(&wlog).expect("read wlog"), &marker)
        .expect("the marker is in the write log") as u64;
    flip_byte(&wlog, at + 100);
    // Fill the batch: it closes, the uploader reads the marker's record back, and
    // the volume fails. The client sees EIO on a later write or flush.
    let out = nbdsh(
        &server.uri("vol"),
        r#"
import errno, random
h = connect()
rng = random.Random(8)
failed = None
for i in range(200):
    try:
        h.pwrite(rng.randbytes(1 << 20), (20 + i % 40) << 20)
        h.flush()
    except nbd.Error as e:
        failed = e
        break
    if i >= 24:
        import time
        time.sleep(0.1)
eio = failed is not None and (
    getattr(failed, "errno", None) == errno.EIO or "Input/output error" in str(failed))
print("EIO" if eio else "no EIO: %r" % failed)
"#,
    );
    assert!(
        out.contains("EIO"),
        "writes after the failure get EIO: {out}\n{}",
        server.log()
    );
    assert_eq!(
        metric(&metrics, "log_records_corrupt_total", "vol"),
        Some(1.0),
        "{}",
        server.log()
    );
    let (_, log) = server.interrupt_within(std::time::Duration::from_secs(120));
    let line = log
        .lines()
        .find(|l| l.contains("volume vol failed") && l.contains("fails verification"))
        .unwrap_or_else(|| panic!("no failure line naming the record\n{log}"));
    assert!(
        line.contains("LBAs 8192..8200") && line.contains("write-log record"),
        "the line names the record and its LBAs: {line}"
    );
    // Nothing of the marker, rotten or intact, went to the store.
    if !store_is_s3() {
        for f in files_under(&dir.join("data").join("store")) {
            let bytes = std::fs::read(&f).expect("read object");
            assert!(
                find(&bytes, &marker[..512]).is_none() && find(&bytes, &marker[512..]).is_none(),
                "{} holds the marker",
                f.display()
            );
        }
    }
    // `lsvd check` finds the record: the index lists it as durable.
    let out = lsvd.run(&["check", "vol"]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{}", show("check", &out));
    let problem = text
        .lines()
        .find(|l| l.starts_with("problem:") && l.contains("fails verification"))
        .unwrap_or_else(|| panic!("check reports the record\n{}", show("check", &out)));
    assert!(
        problem.contains("LBAs 8192..8200") && problem.contains("acknowledged"),
        "{problem}"
    );
}

#[test]
fn a_corrupt_newest_checkpoint_file_falls_back_to_the_previous_one() {
    require_tools(TOOLS);
    if skip_on_s3("corrupts a checkpoint file in a file:// store") {
        return;
    }
    let (dir, lsvd, socket) = new_volume("integrity_checkpoint", "32M");
    let (image, scratch) = random_image_and_scratch(&dir, 0xC4EC, 32 * MIB);
    let args = ["vol", "--batch-size", "1M", "--checkpoint-every", "4"];
    let mut server = lsvd.serve(&socket, &args);
    nbdcopy(&image.display().to_string(), &server.uri("vol"));
    server.stop_clean();
    let mut checkpoints: Vec<PathBuf> = files_under(&dir.join("data").join("store"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    checkpoints.sort();
    assert!(
        checkpoints.len() >= 2,
        "two kept checkpoints: {checkpoints:?}"
    );
    let newest = checkpoints.last().expect("newest").clone();
    let len = std::fs::metadata(&newest).expect("stat").len();
    flip_byte(&newest, len - 1);
    // Lose the write log too: the store alone must give the data back.
    std::fs::remove_file(dir.join("data").join("vol.wlog")).expect("remove write log");
    let mut server = lsvd.serve(&socket, &args);
    let log = server.log();
    let name = newest
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    assert!(
        log.lines()
            .any(|l| l.contains("skipping checkpoint") && l.contains(&name)),
        "a warning names the skipped checkpoint {name}\n{log}"
    );
    let _ = std::fs::remove_file(&scratch);
    nbdcopy(&server.uri("vol"), &scratch.display().to_string());
    assert_files_equal(&image, &scratch);
    server.stop_clean();
}
