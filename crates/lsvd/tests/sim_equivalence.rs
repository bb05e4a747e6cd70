//! The simulator predicts what the engine does: a seeded workload run through
//! `lsvd sim`'s volume model and through a live volume on the in-memory store gives
//! the same objects (sequence numbers and sizes), the same bytes written, and the same
//! store map, byte for byte. Also runs the `lsvd sim` binary end to end.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::TempDir;
use lsvd_core::format::object::ObjectKind;
use lsvd_core::gc::GcConfig;
use lsvd_engine::{EngineConfig, create_volume, open_volume};
use lsvd_sim::volume::{SimConfig, VolumeSim};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_trace::synthetic::prng::Rng;
use lsvd_trace::{Op, Request};

const VOLUME_BYTES: u64 = 64 << 20;
const BATCH_BYTES: u64 = 256 << 10;
const CHECKPOINT_EVERY: u64 = 8;
const REQUESTS: u64 = 20_000;

/// A sequential fill of the first 8 MiB, then mostly 4 KiB writes, some multi-block
/// and sub-block (sector-aligned) writes and some trims, uniformly over the volume,
/// with one trim of the first 8 MiB halfway (so whole objects die); seeded.
fn workload() -> Vec<Request> {
    let mut rng = Rng::new(20_240_601);
    let blocks = VOLUME_BYTES / 4096;
    let mut out = Vec::with_capacity(REQUESTS as usize);
    for i in 0..REQUESTS {
        let roll = rng.below(100);
        let (op, offset, len) = if i < 2048 {
            (Op::Write, i * 4096, 4096)
        } else if i == REQUESTS / 2 {
            (Op::Trim, 0, 8 << 20)
        } else if roll < 88 {
            (Op::Write, rng.below(blocks) * 4096, 4096)
        } else if roll < 93 {
            let n = 1 + rng.below(16);
            (Op::Write, rng.below(blocks - n) * 4096, n * 4096)
        } else if roll < 97 {
            let sectors = 1 + rng.below(7);
            let sector = rng.below(VOLUME_BYTES / 512 - sectors);
            (Op::Write, sector * 512, sectors * 512)
        } else {
            let n = 1 + rng.below(32);
            (Op::Trim, rng.below(blocks - n) * 4096, n * 4096)
        };
        out.push(Request {
            time_ns: i,
            volume: 0,
            op,
            offset_bytes: offset,
            length_bytes: len,
        });
    }
    out
}

fn gc_off() -> GcConfig {
    GcConfig {
        start_utilization: 0.0,
        ..GcConfig::default()
    }
}

fn simulate(requests: &[Request]) -> VolumeSim {
    let mut sim = VolumeSim::new(SimConfig {
        batch_size_bytes: BATCH_BYTES,
        batch_timeout_ns: None,
        checkpoint_every_objects: CHECKPOINT_EVERY,
        checkpoint_interval_ns: None,
        gc: gc_off(),
        volume_size_bytes: Some(VOLUME_BYTES),
        series_points: 0,
    });
    for r in requests {
        sim.request(r);
    }
    sim.finish();
    sim
}

/// (sequence number, kind suffix, size) of every object of volume `v` in the store.
fn store_objects(mem: &MemStore) -> Vec<(u64, char, u64)> {
    mem.snapshot()
        .into_iter()
        .filter_map(|(key, size)| {
            let name = key.strip_prefix("v/obj/")?;
            // `<seq:016x>.<epoch:016x>.<kind>`; the epoch does not matter here.
            let (hex, rest) = name.split_once('.')?;
            let (_epoch, kind) = rest.rsplit_once('.')?;
            let seq = u64::from_str_radix(hex, 16).expect("hex sequence number");
            Some((seq, kind.chars().next().expect("kind"), size))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_matches_the_engine() {
    let requests = workload();
    let sim = simulate(&requests);

    let dir = TempDir::new("equivalence");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    create_volume(&store, "v", VOLUME_BYTES)
        .await
        .expect("create volume");
    let config = EngineConfig {
        batch_size_bytes: BATCH_BYTES,
        batch_timeout_ms: 3_600_000,
        checkpoint_every_objects: CHECKPOINT_EVERY,
        // Large enough that a slow upload never fills the log (a full log closes
        // partial batches, which the simulator does not model).
        log_size_bytes: 256 << 20,
        gc: gc_off(),
        read_cache_bytes: 0,
        ..Default::default()
    };
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), config)
        .await
        .expect("open volume");
    // One request at a time, so each log record holds exactly one request.
    for (i, r) in requests.iter().enumerate() {
        match r.op {
            Op::Write => {
                let data = vec![(i % 251) as u8 + 1; r.length_bytes as usize];
                volume
                    .write(r.offset_bytes, data, false)
                    .await
                    .expect("write");
            }
            Op::Trim => volume
                .write_zeroes(r.offset_bytes, r.length_bytes, false)
                .await
                .expect("trim"),
            Op::Read => unreachable!("the workload has no reads"),
        }
    }
    volume.shutdown().await.expect("clean shutdown");

    let c = sim.counters();
    let stats = volume.stats();
    // Client bytes and every byte put to the store (data and checkpoint objects,
    // headers included): the same write amplification.
    assert_eq!(
        stats.client_write_bytes.load(Ordering::Relaxed),
        c.client_write_bytes
    );
    assert_eq!(
        stats.store_put_bytes.load(Ordering::Relaxed),
        c.store_write_bytes()
    );
    assert_eq!(
        stats.objects_written.load(Ordering::Relaxed),
        c.data_objects
    );
    assert_eq!(
        stats.checkpoints_written.load(Ordering::Relaxed),
        c.checkpoint_objects
    );
    assert!(c.data_objects > 100, "several hundred objects: {c:?}");
    assert!(c.coalesced_bytes > 0 && c.trim_requests > 0);

    // The objects left in the store: data objects still holding live data, the dead
    // ones the newest checkpoint left out (deleted once the next is named; older dead
    // ones were deleted), and the newest two checkpoints, with their sizes.
    let mut expected: Vec<(u64, char, u64)> = sim
        .state()
        .objects()
        .iter()
        .map(|(&seq, o)| {
            assert_eq!(o.kind, ObjectKind::Data);
            (seq, 'd', o.total_bytes)
        })
        .chain(sim.awaiting_delete().into_iter().map(|(seq, kind, bytes)| {
            assert_eq!(kind, ObjectKind::Data);
            (seq, 'd', bytes)
        }))
        .chain(
            sim.retained_checkpoints()
                .into_iter()
                .map(|(seq, bytes)| (seq, 'c', bytes)),
        )
        .collect();
    expected.sort();
    let actual = store_objects(&mem);
    assert_eq!(actual.len(), expected.len());
    assert_eq!(actual, expected);
    assert!(c.deleted_objects > 0, "some objects died and were deleted");

    // The store map, extent for extent.
    let sim_map: Vec<(u64, u64, u64, u64)> = sim
        .state()
        .map()
        .iter()
        .map(|p| (p.lba, p.sectors, p.location.object_seq, p.location.offset))
        .collect();
    let engine_map = volume.store_map_snapshot();
    assert_eq!(engine_map.len(), sim_map.len());
    assert_eq!(engine_map, sim_map);
}

#[test]
fn lsvd_sim_binary_reports_json() {
    let traces = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");
    assert!(
        Path::new(traces).is_dir(),
        "the sample traces are not at {traces}: this test needs the shared/ directory beside the repository"
    );
    let trace: &str = &format!("{traces}/msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace");
    let dir = TempDir::new("binary");
    let svg = dir.path().join("chart.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_lsvd"))
        .args(["sim", trace, "--batch-size", "1M", "--json", "--plot"])
        .arg(&svg)
        .output()
        .expect("run lsvd sim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(v["inputs"][0]["format"], "msr-cut");
    assert_eq!(v["inputs"][0]["requests"], 10_000);
    let vol = &v["volumes"][0];
    assert_eq!(vol["volume"], "dev0");
    assert!(vol["write_amplification"].as_f64().expect("WAF") > 0.5);
    assert!(vol["client_write_bytes"].as_u64().expect("bytes") > 40 << 20);
    assert!(vol.get("series").is_none(), "no series without --series");
    let chart = std::fs::read_to_string(&svg).expect("chart written");
    assert!(chart.starts_with("<svg") && chart.contains("<path"));
    // Not a terminal: no progress output.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
