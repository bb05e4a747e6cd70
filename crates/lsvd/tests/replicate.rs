//! `lsvd replicate` with real processes: a `--follow` copy killed (SIGKILL) at seeded
//! points while `lsvd serve` takes writes leaves a replica that is a prefix of the
//! volume's history; `lsvd serve` killed and restarted under a running `--follow`
//! leaves replicas that are states the volume had; a finished copy serves the same
//! bytes as the source; bad targets are refused with one line. Under
//! `LSVD_TEST_STORE=s3` the source and the replica are both prefixes in the S3 bucket.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use lsvd_store::testutil::prefix_len;
use lsvd_trace::synthetic::prng::Rng;

use common::*;

const BLOCKS: u64 = 1024; // 4 MiB of 4 KiB blocks

/// Writes whole rounds of stamped blocks (round 1, 2, ...; each round every block once,
/// in the order of [`block_of`]), one write at a time, until the file STOP exists;
/// prints the last round written.
const WRITER: &str = r#"
import os, struct
def stamp(b, v):
    return struct.pack('<QQ', b, v) * 256
h = connect()
v = 0
while not os.path.exists(os.environ['STOP']):
    v += 1
    for i in range(BLOCKS):
        b = (i * (2 * v + 1) * 37 + v * 101) % BLOCKS
        h.pwrite(stamp(b, v), b * 4096)
    h.flush()
print(v)
"#;

/// Prints the round each block holds (0: never written), checking every block is
/// whole and its own.
const VERSIONS: &str = r#"
import struct
h = connect()
out = []
for first in range(0, BLOCKS, 64):
    data = h.pread(64 * 4096, first * 4096)
    for i in range(64):
        blk = data[i * 4096:(i + 1) * 4096]
        b = first + i
        if blk == bytes(4096):
            out.append(0)
            continue
        v = struct.unpack('<QQ', blk[:16])[1]
        assert blk == struct.pack('<QQ', b, v) * 256, "block %d is torn" % b
        out.append(v)
print(" ".join(str(x) for x in out))
"#;

fn script(body: &str) -> String {
    format!("BLOCKS = {BLOCKS}\n{body}")
}

/// `nbdsh` running the writer `body` on `server`'s `vol` until the file `stop` exists,
/// its stdout (the last round written) piped.
fn writer_command(body: &str, server: &Server, stop: &std::path::Path) -> std::process::Command {
    let mut cmd = tool("nbdsh");
    cmd.arg("-n")
        .arg("-c")
        .arg(format!("{NBDSH_PRELUDE}\n{}", script(body)))
        .env("URI", server.uri("vol"))
        .env("STOP", stop)
        .stdout(Stdio::piped());
    cmd
}

/// The rounds each block of `vol` holds, served from `lsvd` (a data dir of its own).
fn served_versions(lsvd: &Lsvd, socket: &std::path::Path) -> Vec<u64> {
    let mut server = lsvd.serve(socket, &["vol"]);
    let out = nbdsh(&server.uri("vol"), &script(VERSIONS));
    server.stop_clean();
    out.split_whitespace()
        .map(|x| x.parse().expect("a number"))
        .collect()
}

/// The block round `round` writes `i`-th (as WRITER computes it): a different stride
/// each round, so every round leaves the previous one's objects partly live and GC
/// has work.
fn block_of(round: u64, i: u64) -> u64 {
    (i * (2 * round + 1) * 37 + round * 101) % BLOCKS
}

/// What a prefix of the writer's history can show: the newest round `a` on the first
/// blocks of its order, round `a - 1` (0: never written) on the rest.
fn assert_prefix_shape(got: &[u64], what: &str) {
    assert_eq!(got.len(), BLOCKS as usize, "{what}");
    let a = got.iter().copied().max().unwrap_or(0);
    let newest = got.iter().filter(|&&v| v == a).count() as u64;
    if let Some(i) = (0..BLOCKS).find(|&i| {
        let v = got[block_of(a, i) as usize];
        if i < newest { v != a } else { v + 1 != a }
    }) {
        panic!(
            "{what}: the replica is not a prefix of the volume's history: round {a} on {newest} blocks, but the {i}-th block of its order, {}, holds round {}",
            block_of(a, i),
            got[block_of(a, i) as usize]
        );
    }
}

/// Kill points of [`replicate_follow_killed_at_seeded_points_leaves_prefixes`] that
/// may land in the first pass (before the replica exists); a pass to completion follows
/// them.
const FIRST_PASS_POINTS: usize = 3;

/// `lsvd replicate vol --to TARGET --follow` every 20 ms, its output in `log`.
fn follow(lsvd: &Lsvd, target: &str, log: &std::path::Path) -> std::process::Child {
    let args = [
        "replicate",
        "vol",
        "--to",
        target,
        "--follow",
        "--interval-ms",
        "20",
    ];
    spawn_logging(&mut lsvd.cmd(args), log)
}

#[test]
fn replicate_follow_killed_at_seeded_points_leaves_prefixes() {
    require_tools(&["nbdsh"]);
    let (dir, lsvd, socket) = new_volume("replicate_follow", "16M");
    let mut server = lsvd.serve(
        &socket,
        &[
            "vol",
            "--batch-size",
            "256K",
            "--batch-timeout-ms",
            "50",
            "--checkpoint-every",
            "4",
            // A copy of the replica names this server as the volume's holder: serving
            // it (`replica_blocks`) waits this long for the lease to lapse.
            "--lease-timeout",
            "1s",
        ],
    );
    let target = store_url_for(&dir.join("replica"));
    let stop = dir.join("stop-writing");
    let writer = writer_command(WRITER, &server, &stop)
        .spawn()
        .expect("spawn the writer");

    let mut rng = Rng::new(0x5eed_0014);
    let mut prefixes = 0;
    for point in 0..20 {
        if point == FIRST_PASS_POINTS {
            // The first pass makes the replica; on a loaded machine (CI runs the S3
            // pass beside everything else) it can outlast every kill of the first
            // points, which then leave nothing to check. Finish one pass, so that the
            // later points all kill a follower copying onto an existing replica.
            run_ok(
                &mut lsvd.cmd(["replicate", "vol", "--to", target.as_str()]),
                LONG,
            );
        }
        let mut follow = follow(&lsvd, &target, &dir.join(format!("replicate-{point}.log")));
        let_time_pass(Duration::from_millis(100 + rng.below(900)));
        follow.kill().expect("SIGKILL replicate --follow");
        let _ = follow.wait();
        let Some(got) = replica_blocks(dir.path(), &target, &format!("k{point}")) else {
            continue;
        };
        assert_prefix_shape(&got, &format!("kill point {point}"));
        prefixes += 1;
        eprintln!(
            "kill point {point}: the replica holds round {} on some blocks",
            got.iter().max().unwrap_or(&0)
        );
    }
    assert!(
        prefixes >= 10,
        "only {prefixes} of 20 kill points left a volume"
    );

    std::fs::write(&stop, b"").expect("stop the writer");
    let out = writer.wait_with_output().expect("writer");
    assert!(out.status.success(), "the writer failed");
    let rounds: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("rounds");
    lsvd.run_ok(&["sync", "vol"]);
    let done = lsvd.run_ok(&["replicate", "vol", "--to", &target]);
    assert!(
        stdout(&done).contains("replicated vol to"),
        "{}",
        show("replicate", &done)
    );
    lsvd.assert_stdout_mentions(&[(&["info", "vol"], &["replica:"])]);
    server.stop_clean();
    let source = served_versions(&lsvd, &socket);
    assert_eq!(source, vec![rounds; BLOCKS as usize]);
    let replica = Lsvd {
        data: dir.join("replica-data"),
        store: Some(target.clone()),
    };
    assert_eq!(
        served_versions(&replica, &dir.join("replica.sock")),
        source,
        "the finished replica serves other bytes than the source"
    );
    // Served, the replica is a volume of its own: replication into it stops.
    let out = lsvd.run(&["replicate", "vol", "--to", &target]);
    assert!(
        !out.status.success() && stderr(&out).contains("written by something other"),
        "{}",
        show("replicate into a served replica", &out)
    );
}

#[test]
fn replicate_refuses_bad_targets_with_one_line() {
    let dir = TempDir::new("replicate_refuse");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "16M");
    let own = lsvd
        .store
        .clone()
        .unwrap_or_else(|| format!("file://{}", dir.join("data").join("store").display()));
    let target = store_url_for(&dir.join("replica"));
    for (args, says) in [
        (
            vec!["replicate", "vol", "--to", own.as_str()],
            "is the source store",
        ),
        (
            vec!["replicate", "nosuch", "--to", target.as_str()],
            "no volume 'nosuch'",
        ),
        (
            vec!["replicate", "vol", "--to", target.as_str(), "--jobs", "0"],
            "--jobs",
        ),
        (vec!["replicate", "vol", "--to", "gecko:a,b"], "scheme"),
        (
            vec!["replicate", "bad@name", "--to", target.as_str()],
            "name",
        ),
    ] {
        let out = lsvd.run(&args);
        let err = stderr(&out);
        assert!(
            !out.status.success() && err.lines().count() == 1 && err.contains(says),
            "{args:?}: {}",
            show("replicate", &out)
        );
    }
    // A volume never served replicates as what it is: empty.
    lsvd.assert_stdout_mentions(&[(&["replicate", "vol", "--to", &target], &["replicated vol"])]);
    let replica = Lsvd {
        data: dir.join("replica-data"),
        store: Some(target),
    };
    assert_eq!(replica.info_json("vol")["size_bytes"], 16 << 20);
}

/// Writes version START, START+1, ... (version `v` to block [`block_of_version`]`(v)`),
/// one at a time, a FLUSH every 64, until the file STOP exists or the server goes
/// away; prints the last version the server acknowledged.
const VERSION_WRITER: &str = r#"
import os, struct
def stamp(b, v):
    return struct.pack('<QQ', b, v) * 256
last = int(os.environ['START']) - 1
try:
    h = connect()
    v = last + 1
    while not os.path.exists(os.environ['STOP']):
        b = (v * 2654435761) % 4294967296 % BLOCKS
        h.pwrite(stamp(b, v), b * 4096)
        last = v
        v += 1
        if v % 64 == 0:
            h.flush()
except Exception:
    pass
print(last)
"#;

/// The block [`VERSION_WRITER`] writes version `v` to.
fn block_of_version(v: u64) -> u64 {
    (v * 2_654_435_761) % (1 << 32) % BLOCKS
}

/// The blocks of `vol` in the replica `target` as it is now, read from a copy of it
/// (a replication of the replica into a store of its own, served from there: serving
/// the replica itself would make it a volume of its own); None while it is no volume.
fn replica_blocks(dir: &std::path::Path, target: &str, point: &str) -> Option<Vec<u64>> {
    let check = dir.join(format!("check-{point}"));
    let reader = Lsvd {
        data: check.join("d1"),
        store: Some(target.to_string()),
    };
    let copy_url = format!("file://{}", check.join("store").display());
    let out = reader.run(&["replicate", "vol", "--to", &copy_url]);
    if !out.status.success() {
        assert!(
            stderr(&out).contains("no volume 'vol'"),
            "{point}: {}",
            show("replicate the replica", &out)
        );
        return None;
    }
    let copy = Lsvd {
        data: check.join("d2"),
        store: Some(copy_url),
    };
    Some(served_versions(&copy, &check.join("nbd.sock")))
}

/// `lsvd serve` killed (SIGKILL) while a writer writes and restarted, again and again,
/// under one `lsvd replicate --follow`: every replica seen meanwhile holds the blocks
/// after some prefix of the writes the volume's history holds at the end (never a mix,
/// never a write the volume lost), and once the writes stop the replica equals the
/// source.
#[test]
fn replicate_follow_while_the_server_is_killed_and_restarted_keeps_states_it_had() {
    require_tools(&["nbdsh"]);
    let (dir, lsvd, socket) = new_volume("replicate_source_crash", "16M");
    let serve_args = [
        "vol",
        "--batch-size",
        "128K",
        "--batch-timeout-ms",
        "50",
        "--checkpoint-every",
        "4",
        "--lease-timeout",
        "2s",
    ];
    let target = store_url_for(&dir.join("replica"));
    let mut follow = follow(&lsvd, &target, &dir.join("follow.log"));

    let mut rng = Rng::new(0x5eed_0040);
    // Every write acknowledged (and the one in flight at each kill), cut back at each
    // restart to what the restarted volume holds: at the end, the volume's history.
    let mut writes: Vec<(u64, u64)> = Vec::new();
    let mut seen: Vec<(String, Vec<u64>)> = Vec::new();
    let mut next_version = 1u64;
    const CRASHES: usize = 4;
    for crash in 0..=CRASHES {
        let mut server = lsvd.serve(&socket, &serve_args);
        let now = nbdsh(&server.uri("vol"), &script(VERSIONS))
            .split_whitespace()
            .map(|x| x.parse().expect("a number"))
            .collect::<Vec<u64>>();
        let held = prefix_len(&writes, &now)
            .unwrap_or_else(|| panic!("restart {crash}: the volume is no prefix of its writes"));
        assert!(
            held + 1 >= writes.len(),
            "restart {crash}: acknowledged writes lost ({held} of {})",
            writes.len()
        );
        writes.truncate(held);
        next_version = writes
            .last()
            .map_or(next_version, |w| w.1 + 1)
            .max(next_version);
        if let Some(state) = replica_blocks(dir.path(), &target, &format!("r{crash}")) {
            seen.push((format!("after restart {crash}"), state));
        }
        if crash == CRASHES {
            server.stop_clean();
            break;
        }
        let stop = dir.join(format!("stop-{crash}"));
        let writer = writer_command(VERSION_WRITER, &server, &stop)
            .env("START", next_version.to_string())
            .spawn()
            .expect("spawn the writer");
        let_time_pass(Duration::from_millis(600 + rng.below(900)));
        if let Some(state) = replica_blocks(dir.path(), &target, &format!("w{crash}")) {
            seen.push((format!("while writing before crash {crash}"), state));
        }
        server.kill9();
        let out = writer.wait_with_output().expect("the writer");
        let last: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the last version acknowledged");
        // The acknowledged writes, and the one in flight (it may have reached the log).
        for v in next_version..=last + 1 {
            writes.push((block_of_version(v), v));
        }
        next_version = last + 2;
        eprintln!("crash {crash}: versions up to {last} acknowledged");
    }
    // The volume is stopped: the replica catches up with it.
    let source = served_versions(&lsvd, &socket);
    assert_eq!(prefix_len(&writes, &source), Some(writes.len()));
    let mut tries = 0;
    let caught_up = wait_until(Duration::from_secs(60), || {
        tries += 1;
        replica_blocks(dir.path(), &target, &format!("e{tries}")).as_ref() == Some(&source)
    });
    let _ = follow.kill();
    let _ = follow.wait();
    let follow_log = std::fs::read_to_string(dir.join("follow.log")).unwrap_or_default();
    assert!(
        caught_up,
        "the replica did not catch up with the stopped volume\n--- replicate --follow ---\n{follow_log}"
    );
    for (what, state) in &seen {
        assert!(
            prefix_len(&writes, state).is_some(),
            "{what}: the replica holds no state of the volume's history"
        );
    }
    assert!(
        seen.len() >= CRASHES,
        "only {} replicas seen\n--- replicate --follow ---\n{follow_log}",
        seen.len()
    );
    eprintln!(
        "{} replicas checked against {} writes; --follow restarted {} passes",
        seen.len(),
        writes.len(),
        follow_log.matches("starting the pass again").count()
    );
}
