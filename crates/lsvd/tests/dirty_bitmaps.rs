//! Dirty bitmaps over NBD with real clients: while `lsvd serve` serves a volume, the
//! meta context `qemu:dirty-bitmap:SNAP` reports what was written (data, trims,
//! zeroing) since snapshot SNAP, as qemu-nbd does with `-B`. Checked with
//! `nbdinfo --map` (what a backup script runs) and with libnbd's block status through
//! `nbdsh`, with `base:allocation` selected beside it; `base:allocation` alone keeps
//! reporting holes.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

/// `(offset, length)` runs, merged where adjacent.
type Runs = Vec<(u64, u64)>;

fn merged(mut runs: Runs) -> Runs {
    runs.sort_unstable();
    let mut out: Runs = Vec::new();
    for (offset, length) in runs {
        match out.last_mut() {
            Some((o, l)) if *o + *l == offset => *l += length,
            _ => out.push((offset, length)),
        }
    }
    out
}

/// The runs whose type has any bit of `mask`, from `nbdinfo --json --map=CONTEXT`
/// (one object per extent: offset, length, type, description); checks that the map
/// covers the export from 0 to `size` without gaps.
fn nbdinfo_map(uri: &str, context: &str, size: u64, mask: u64) -> Runs {
    let map = nbdinfo_json(&[&format!("--map={context}"), uri]);
    let extents = map
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {map}"));
    let mut at = 0;
    let mut runs = Vec::new();
    for e in extents {
        let (offset, length, ty) = (
            e["offset"].as_u64().expect("offset"),
            e["length"].as_u64().expect("length"),
            e["type"].as_u64().expect("type"),
        );
        assert_eq!(offset, at, "the map of {context} has a gap: {map}");
        if ty & mask != 0 {
            runs.push((offset, length));
        }
        at += length;
    }
    assert_eq!(at, size, "the map of {context} ends early: {map}");
    merged(runs)
}

/// Walks the whole export with libnbd's block status, `contexts` selected together;
/// prints, per context, the runs whose flags have any bit of 1 (dirty; hole for
/// `base:allocation`) as JSON. Every reply must answer for every context, from the
/// requested offset.
const WALK: &str = r#"
import json
CONTEXTS = json.loads(os.environ["CONTEXTS"])
h = nbd.NBD()
for c in CONTEXTS:
    h.add_meta_context(c)
h.connect_uri(URI)
for c in CONTEXTS:
    assert h.can_meta_context(c), c
size = h.get_size()
runs = {c: [] for c in CONTEXTS}
covered = {c: 0 for c in CONTEXTS}
pos = 0
while pos < size:
    got = {}
    def cb(ctx, off, entries, err):
        assert getattr(err, "value", err) == 0, err
        got[ctx] = (off, list(zip(entries[0::2], entries[1::2])))
        return 0
    n = min(size - pos, 1 << 30)
    h.block_status(n, pos, cb)
    assert set(got) == set(CONTEXTS), (pos, got)
    for c, (off, entries) in got.items():
        assert off == pos, (c, off, pos)
        assert entries, (c, "no extents")
        assert sum(l for (l, f) in entries) <= n, (c, "past the request")
        at = off
        for (length, flags) in entries:
            start, end = max(at, covered[c]), min(at + length, size)
            if end > start:
                if flags & 1:
                    runs[c].append([start, end - start])
                covered[c] = end
            at += length
    pos = min(covered.values())
print(json.dumps(runs))
"#;

fn nbdsh_walk(uri: &str, contexts: &[&str]) -> Vec<Runs> {
    let full = format!("{NBDSH_PRELUDE}\n{WALK}\n");
    let out = run_ok(
        tool("nbdsh")
            .arg("-n")
            .arg("-c")
            .arg(full)
            .env("URI", uri)
            .env("CONTEXTS", serde_json::to_string(contexts).expect("json")),
        LONG,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("nbdsh printed no JSON: {e}\n{}", stdout(&out)));
    contexts
        .iter()
        .map(|c| {
            let runs = v[*c]
                .as_array()
                .unwrap_or_else(|| panic!("no runs for {c}: {v}"))
                .iter()
                .map(|r| {
                    (
                        r[0].as_u64().expect("offset"),
                        r[1].as_u64().expect("length"),
                    )
                })
                .collect();
            merged(runs)
        })
        .collect()
}

/// `h.pwrite`/`h.trim`/`h.zero` lines for nbdsh, then a flush.
fn nbdsh_ops(uri: &str, ops: &[(&str, u64, u64)]) {
    let mut script = String::from("h = connect()\n");
    for (op, offset, length) in ops {
        script.push_str(&match *op {
            "write" => format!("h.pwrite(pattern({offset}, {length}), {offset})\n"),
            "trim" => format!("h.trim({length}, {offset})\n"),
            "zero" => format!("h.zero({length}, {offset})\n"),
            other => panic!("unknown op {other}"),
        });
    }
    script.push_str("h.flush()\n");
    nbdsh(uri, &script);
}

#[test]
fn dirty_bitmaps_report_what_changed_since_a_snapshot() {
    require_tools(&["nbdinfo", "nbdsh"]);
    let size = 64 * MIB;
    let (dir, lsvd, socket) = new_volume("dirty_bitmaps", "64M");
    let mut server = lsvd.serve(&socket, &["vol"]);
    let uri = server.uri("vol");

    // Before the snapshot: data at 0..1M, 4M..6M, 10M..11M, 12M..13M.
    nbdsh_ops(
        &uri,
        &[
            ("write", 0, MIB),
            ("write", 4 * MIB, 2 * MIB),
            ("write", 10 * MIB, MIB),
            ("write", 12 * MIB, MIB),
        ],
    );
    lsvd.run_ok(&["snapshot", "create", "vol", "s1"]);
    // Nothing written since: all clean.
    let clean: Runs = Vec::new();
    assert_eq!(
        nbdinfo_map(&uri, "qemu:dirty-bitmap:s1", size, 1),
        clean,
        "right after the snapshot"
    );

    // After it: new data in a hole, an overwrite inside old data, a trim and a
    // zeroing of data the snapshot holds.
    nbdsh_ops(
        &uri,
        &[
            ("write", 2 * MIB, 64 * KIB),
            ("write", 4 * MIB + 512 * KIB, 256 * KIB),
            ("trim", 10 * MIB, MIB),
            ("zero", 12 * MIB + 4 * KIB, 8 * KIB),
        ],
    );
    lsvd.run_ok(&["snapshot", "create", "vol", "s2"]);
    nbdsh_ops(&uri, &[("write", 30 * MIB, 4 * KIB)]);

    let since_s1: Runs = vec![
        (2 * MIB, 64 * KIB),
        (4 * MIB + 512 * KIB, 256 * KIB),
        (10 * MIB, MIB),
        (12 * MIB + 4 * KIB, 8 * KIB),
        (30 * MIB, 4 * KIB),
    ];
    let since_s2: Runs = vec![(30 * MIB, 4 * KIB)];
    // Holes now: everything but 0..1M, 2M..2M+64K, 4M..6M, 12M..13M (less the zeroed
    // 8K, which a zeroing without NO_HOLE leaves as a hole), 30M..30M+4K.
    let holes: Runs = vec![
        (MIB, MIB),
        (2 * MIB + 64 * KIB, 2 * MIB - 64 * KIB),
        (6 * MIB, 6 * MIB),
        (12 * MIB + 4 * KIB, 8 * KIB),
        (13 * MIB, 17 * MIB),
        (30 * MIB + 4 * KIB, size - 30 * MIB - 4 * KIB),
    ];

    assert_eq!(
        nbdinfo_map(&uri, "qemu:dirty-bitmap:s1", size, 1),
        since_s1,
        "nbdinfo, since s1"
    );
    assert_eq!(
        nbdinfo_map(&uri, "qemu:dirty-bitmap:s2", size, 1),
        since_s2,
        "nbdinfo, since s2"
    );
    assert_eq!(
        nbdinfo_map(&uri, "base:allocation", size, 1),
        holes,
        "nbdinfo, holes"
    );

    // libnbd with both contexts selected: the same answers, one chunk each per reply.
    let walked = nbdsh_walk(&uri, &["base:allocation", "qemu:dirty-bitmap:s1"]);
    assert_eq!(walked, vec![holes.clone(), since_s1.clone()], "nbdsh, s1");
    let walked = nbdsh_walk(
        &uri,
        &[
            "qemu:dirty-bitmap:s2",
            "base:allocation",
            "qemu:dirty-bitmap:s1",
        ],
    );
    assert_eq!(walked, vec![since_s2, holes, since_s1], "nbdsh, s1 and s2");

    // Listing: the volume's snapshots, by the qemu namespace and the bitmap prefix; an
    // unknown snapshot is not offered (nbdinfo then has nothing to map).
    let listed = nbdsh(
        &uri,
        r#"
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(URI)
for q in ["qemu:", "qemu:dirty-bitmap:"]:
    h.clear_meta_contexts()
    h.add_meta_context(q)
    names = []
    h.opt_list_meta_context(lambda name: names.append(name) or 0)
    print(q, sorted(names))
h.clear_meta_contexts()
h.add_meta_context("qemu:dirty-bitmap:nope")
h.add_meta_context("base:allocation")
h.opt_go()
assert not h.can_meta_context("qemu:dirty-bitmap:nope")
assert h.can_meta_context("base:allocation")
"#,
    );
    let want = "['qemu:dirty-bitmap:s1', 'qemu:dirty-bitmap:s2']";
    assert!(
        listed.contains(&format!("qemu: {want}"))
            && listed.contains(&format!("qemu:dirty-bitmap: {want}")),
        "{listed}"
    );
    let out = run_timeout(
        tool("nbdinfo").args(["--map=qemu:dirty-bitmap:nope", &uri]),
        SHORT,
    );
    assert!(!out.status.success(), "{}", show("nbdinfo", &out));

    server.stop_clean();
    drop(dir);
}
