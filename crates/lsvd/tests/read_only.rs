//! Read-only commands on a live volume, through the real binary: `lsvd info --json`,
//! `lsvd check`, `lsvd inspect objects` and `lsvd list`, polled over and over while a
//! real `lsvd serve` overwrites the volume under eager GC (`--gc-start 0.9`) with small
//! batches and a checkpoint every few objects, so objects, checkpoints and superblock
//! generations they listed are deleted under them. Every poll must succeed: a key that
//! vanished between a listing and its read is a reason to look again from a fresh
//! listing, never an error (issue 41; it was `HTTP 404 BlobNotFound` on Azurite).
//!
//! The same test runs against S3 and Azure (`LSVD_TEST_STORE=s3|az`) and a mirrored
//! chain (`LSVD_TEST_STORE=chain`).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;

/// How long the writer overwrites the volume while the commands poll it.
const WRITING: Duration = Duration::from_secs(12);

/// Random overwrites of 4-16 KiB in the first 2 MiB for `seconds`, a flush every 8,
/// then everything read back against a model of what was written.
fn writer_script(seconds: u64) -> String {
    format!(
        "import random, time\n\
         h = connect()\n\
         rng = random.Random(41)\n\
         span = 2 << 20\n\
         model = bytearray(span)\n\
         end = time.time() + {seconds}\n\
         n = 0\n\
         while time.time() < end:\n\
         \x20   size = rng.choice([4096, 8192, 16384])\n\
         \x20   off = rng.randrange(0, (span - size) // 4096) * 4096\n\
         \x20   data = pattern(n, size)\n\
         \x20   h.pwrite(data, off)\n\
         \x20   model[off:off + size] = data\n\
         \x20   n += 1\n\
         \x20   if n % 8 == 0:\n\
         \x20       h.flush()\n\
         h.flush()\n\
         assert h.pread(span, 0) == bytes(model), 'read back differs'\n\
         print('writes', n)\n"
    )
}

#[test]
fn read_only_commands_poll_a_live_volume_through_gc_and_checkpoints() {
    require_tools(&["nbdsh"]);
    let (_dir, lsvd, socket) = new_volume("ro_live", "8M");
    let mut server = lsvd.serve(
        &socket,
        &[
            "vol",
            "--batch-size",
            "64K",
            "--batch-timeout-ms",
            "20",
            "--checkpoint-every",
            "4",
            "--gc-start",
            "0.9",
            "--gc-stop",
            "0.95",
            "--gc-rate",
            "0",
        ],
    );
    let uri = server.uri("vol");
    let writer = std::thread::spawn(move || nbdsh(&uri, &writer_script(WRITING.as_secs())));

    let polls: [&[&str]; 4] = [
        &["info", "vol", "--json"],
        &["check", "vol"],
        &["inspect", "objects", "vol"],
        &["list"],
    ];
    let started = Instant::now();
    let mut rounds = 0usize;
    // Looks again, per command.
    let mut looks_again = [0usize; 4];
    let mut why: Option<String> = None;
    while !writer.is_finished() {
        for (i, args) in polls.iter().enumerate() {
            let out = lsvd.run(args);
            assert!(
                out.status.success(),
                "poll {rounds} after {:.1} s: `lsvd {}` failed on a live volume\n{}\n--- server log ---\n{}",
                started.elapsed().as_secs_f64(),
                args.join(" "),
                show(&args.join(" "), &out),
                server.log()
            );
            let err = stderr(&out);
            looks_again[i] += err.matches("looking again").count();
            if why.is_none() {
                why = err
                    .lines()
                    .find(|l| l.contains("looking again"))
                    .map(str::to_string);
            }
            if args[0] == "info" {
                let info: serde_json::Value = serde_json::from_slice(&out.stdout)
                    .unwrap_or_else(|e| panic!("info --json: {e}\n{}", stdout(&out)));
                assert_eq!(info["name"], "vol", "{info:#}");
            }
        }
        rounds += 1;
    }
    let wrote = writer.join().expect("writer thread");
    let gc_passes = lsvd.info_json("vol")["gc_passes"].as_u64().unwrap_or(0);
    // Straight to stderr: libtest captures `eprintln!` of passing tests.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "read_only: {rounds} rounds of {} commands in {:.1} s ({}), {gc_passes} GC passes; looks again: {}{}\n",
            polls.len(),
            started.elapsed().as_secs_f64(),
            wrote.trim(),
            polls
                .iter()
                .zip(looks_again)
                .map(|(args, n)| format!("{} {n}", args.join(" ")))
                .collect::<Vec<_>>()
                .join(", "),
            why.map_or(String::new(), |w| format!(" (the first: {w})")),
        )
        .as_bytes(),
    );
    assert!(rounds >= 5, "only {rounds} rounds of polls");
    assert!(
        gc_passes > 0,
        "GC never ran: the test did not test anything"
    );
    server.stop_clean();
    let check = stdout(&lsvd.run_ok(&["check", "vol"]));
    assert!(check.contains("ok: no problems found"), "{check}");
}
