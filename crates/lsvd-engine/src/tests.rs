//! In-process tests of the engine on the in-memory store: data integrity through
//! uploads, restarts and garbage collection.

use std::sync::Arc;

use lsvd_core::gc::GcPolicy;

use crate::test_support::{
    block_data, create_and_open, gc_config, no_gc, open_behind_faults, open_v, pause, poll_until,
    verify, verify_from_store_alone, verify_runs, wait_for_uploads, write_next_versions,
};
use crate::{EngineConfig, Volume, open_volume};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const BLOCK: u64 = 4096;

fn config() -> EngineConfig {
    gc_config()
}

/// A 4 KiB block whose content names (block, version).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Which blocks the overwrite phase of [`overwrite_run`] writes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    /// Uniformly random 4 KiB blocks.
    Uniform,
    /// 80% of the writes go to 20% of the blocks (spread over the volume by a seeded
    /// permutation: `lsvd_trace`'s `hotcold:0.2:0.8`, as `lsvd sim` uses).
    HotCold80_20,
}

impl Workload {
    fn pattern(self) -> lsvd_trace::synthetic::Pattern {
        match self {
            Workload::Uniform => lsvd_trace::synthetic::Pattern::Uniform,
            Workload::HotCold80_20 => lsvd_trace::synthetic::Pattern::HotCold {
                hot_fraction: 0.2,
                hot_share: 0.8,
            },
        }
    }
}

/// An overwrite run: fill the volume sequentially, then `volume_writes` times its size
/// in random 4 KiB writes with GC on.
#[derive(Debug, Clone)]
struct OverwriteSpec {
    /// Volume size in 4 KiB blocks.
    blocks: u64,
    /// Random writes after the fill, in multiples of the volume size.
    volume_writes: u64,
    workload: Workload,
    config: EngineConfig,
    /// Client writes in flight at once (never two to the same block).
    depth: usize,
    /// At the end, reopen from the store alone and verify every block again.
    reopen: bool,
}

impl OverwriteSpec {
    /// Engine settings scaled to the volume: objects of 1/128 of the volume (256 KiB
    /// to the engine's default 8 MiB), GC at the default 0.70-0.75, a GC pass of at
    /// most one batch of live data. The pass size is what the bound needs: a pass's GC
    /// objects are in the store before its victims are deleted, so the store can hold
    /// live/0.70 + one client batch + one pass. (With `lsvd serve`'s default pass of
    /// four batches, at least 32 MiB, 1 GiB x5 exceeded the bound by up to 23 MiB
    /// with a write amplification of 2.27 instead of 3.15: checkpoints, one per pass,
    /// are ~8 MiB on a volume of random 4 KiB writes.)
    fn new(volume_bytes: u64, workload: Workload, policy: GcPolicy) -> Self {
        let batch = (volume_bytes / 128).clamp(256 << 10, 8 << 20);
        OverwriteSpec {
            blocks: volume_bytes / BLOCK,
            volume_writes: 5,
            workload,
            config: EngineConfig {
                batch_size_bytes: batch,
                batch_timeout_ms: 200,
                log_size_bytes: (16 * batch).max(16 << 20),
                read_cache_bytes: 0,
                // The bound checked is live/start + two batches: no GC headroom.
                gc_headroom_bytes: Some(0),
                gc: lsvd_core::gc::GcConfig {
                    policy,
                    pass_bytes: batch,
                    ..Default::default()
                },
                ..EngineConfig::default()
            },
            depth: 8,
            reopen: true,
        }
    }

    /// "Two batches": two batches of data with the headers of the objects carrying
    /// them (a GC pass's batch may be split over two GC objects: three of the largest
    /// headers). No tolerance: client objects used to exceed the batch size by up to a
    /// log-writer group of writes less one (several writes share a record), and the
    /// store then exceeded this by a few KB on loaded machines
    /// (`batches_never_exceed_the_batch_size_when_writes_share_records`).
    fn two_batches(&self) -> u64 {
        let batch = self.config.batch_size_bytes;
        let header = lsvd_core::format::object::header_bytes_for(
            lsvd_core::format::object::ObjectKind::Gc,
            (batch / BLOCK) as usize,
            0,
            batch,
        );
        2 * batch + 3 * header
    }
}

/// What an overwrite run measured (over the random phase, after the fill).
#[derive(Debug)]
struct OverwriteReport {
    /// Client bytes written in the random phase.
    client_bytes: u64,
    /// Store bytes written in the random phase: data, GC and checkpoint objects.
    store_put_bytes: u64,
    /// Cleaning cost alone: 1 + GC moved bytes / client bytes.
    relocation: f64,
    gc_passes: u64,
    /// hylog: bytes GC put into hot and into cold GC objects (this session).
    gc_hot_moved_bytes: u64,
    gc_cold_moved_bytes: u64,
    /// Bytes defragmenting GC moved to plug gaps (this session).
    gc_defrag_bytes: u64,
    /// Extents in the store map at the end.
    map_extents: u64,
    checkpoints: u64,
    /// Store samples checked against the bound.
    samples: usize,
    /// Data and GC object bytes over live bytes, over the second half of the random
    /// phase: mean and maximum.
    steady_ratio_mean: f64,
    steady_ratio_max: f64,
    /// The largest store size seen minus the bound at that moment (negative: margin).
    worst_excess_bytes: i64,
    /// Samples above the bound (the first few are described).
    violations: Vec<String>,
    violation_count: usize,
    elapsed: std::time::Duration,
}

impl OverwriteReport {
    fn waf(&self) -> f64 {
        self.store_put_bytes as f64 / self.client_bytes.max(1) as f64
    }
}

/// Bytes of data and GC objects in the store (what GC bounds; checkpoints apart).
fn data_object_bytes(mem: &MemStore) -> u64 {
    mem.snapshot()
        .iter()
        .filter(|(k, _)| k.ends_with(".d") || k.ends_with(".g"))
        .map(|(_, n)| n)
        .sum()
}

/// Write version `version` of each of `blocks`, one 4 KiB write at a time, and note it
/// in the model.
async fn write_version(
    volume: &Volume,
    model: &mut [u64],
    blocks: impl Iterator<Item = u64>,
    version: u64,
) {
    for b in blocks {
        volume
            .write(b * BLOCK, block_data(b, version), false)
            .await
            .expect("write");
        model[b as usize] = version;
    }
}

/// Fill, overwrite, verify, and check the store bound at every sample: after each
/// MiB of client writes in the random phase, the data and GC objects in the store
/// must not exceed live/gc_start + two batches.
async fn overwrite_run(spec: &OverwriteSpec) -> OverwriteReport {
    use tokio::task::JoinSet;

    let started = std::time::Instant::now();
    let dir = TempDir::new("engine-overwrite");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    let blocks = spec.blocks;
    let (volume, _) =
        create_and_open(&store, "v", blocks * BLOCK, dir.path(), spec.config.clone()).await;
    let mut model = vec![0u64; blocks as usize];
    let mut version = 0u64;

    // Fill: every block once, 64 KiB at a time.
    for first in (0..blocks).step_by(16) {
        let n = 16.min(blocks - first);
        write_next_versions(&volume, &mut model, first..first + n, &mut version).await;
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    let start = volume.status();

    // Random phase.
    let gen_spec = lsvd_trace::synthetic::SyntheticSpec {
        pattern: spec.workload.pattern(),
        volume_size_bytes: blocks * BLOCK,
        io_size_bytes: BLOCK,
        requests: spec.volume_writes * blocks,
        write_fraction: 1.0,
        seed: 0x9e37_79b9_7f4a_7c15,
        precondition: false,
    };
    let requests = lsvd_trace::synthetic::synthetic(gen_spec).expect("workload");
    let bound_slack = spec.two_batches() as f64;
    let start_util = spec.config.gc.start_utilization;
    let sample_every = (1u64 << 20) / BLOCK;
    let half = spec.volume_writes * blocks / 2;
    let mut inflight: JoinSet<(u64, lsvd_core::error::Result<()>)> = JoinSet::new();
    let mut busy = std::collections::HashSet::new();
    let (mut samples, mut violation_count) = (0usize, 0usize);
    let mut violations = Vec::new();
    let mut worst_excess = i64::MIN;
    let (mut steady_sum, mut steady_max, mut steady_n) = (0.0f64, 0.0f64, 0u64);
    let mut sample = |written: u64, final_sample: bool| {
        // Atomically, under the engine's state lock (uploads and deletes still land
        // meanwhile: a PUT counts as on its way until it is applied, a delete only
        // shrinks the store): the data and GC objects the store holds, what the engine
        // accounts for (applied objects plus objects on their way) and live bytes.
        // Objects the newest checkpoint left out stay in the store until the next one
        // is named (the fallback to the previous checkpoint needs them): accounted
        // apart, outside the bound GC keeps.
        let (stored, accounted, deferred, live, gc_state) =
            volume.with_accounting(|live, stored, pending, what| {
                let deferred: u64 = volume
                    .shared
                    .deferred_deletes
                    .lock()
                    .expect("deferred deletes")
                    .iter()
                    .map(|d| d.total_bytes)
                    .sum();
                (
                    data_object_bytes(&mem),
                    stored + pending,
                    deferred,
                    live,
                    what,
                )
            });
        let s = volume.status();
        let bound = live as f64 / start_util + bound_slack;
        samples += 1;
        let stored_needed = stored.saturating_sub(deferred);
        worst_excess = worst_excess.max(stored_needed as i64 - bound as i64);
        if stored_needed as f64 > bound || stored > accounted + deferred {
            violation_count += 1;
            if violations.len() < 5 {
                violations.push(format!(
                    "after {:.2} vw{}: store {stored} (of which {deferred} await the next checkpoint) > bound {bound:.0} or > accounted {accounted} (live {live}, utilization {:.3}, GC passes {}; {gc_state})",
                    written as f64 / blocks as f64,
                    if final_sample { " (settled)" } else { "" },
                    s.utilization,
                    s.gc_passes,
                ));
            }
        }
        if written >= half && !final_sample && s.live_bytes > 0 {
            let r = stored as f64 / s.live_bytes as f64;
            steady_sum += r;
            steady_max = steady_max.max(r);
            steady_n += 1;
        }
    };
    let mut written = 0u64;
    for req in requests {
        let b = req.offset_bytes / BLOCK;
        // Never two writes to one block in flight: their order would be unknown.
        while busy.contains(&b) || inflight.len() >= spec.depth {
            let (done, r) = inflight
                .join_next()
                .await
                .expect("a write in flight")
                .expect("join");
            r.expect("write");
            busy.remove(&done);
        }
        version += 1;
        model[b as usize] = version;
        busy.insert(b);
        let v = volume.clone();
        let data = block_data(b, version);
        inflight.spawn(async move { (b, v.write(b * BLOCK, data, false).await) });
        written += 1;
        if written.is_multiple_of(sample_every) {
            sample(written, false);
        }
    }
    while let Some(r) = inflight.join_next().await {
        r.expect("join").1.expect("write");
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // Let GC catch up: it runs in passes after uploads.
    poll_until(std::time::Duration::from_secs(60), async || {
        let s = volume.status();
        s.utilization >= start_util && s.uploads_pending == 0
    })
    .await;
    sample(written, true);
    let end = volume.status();
    assert!(end.gc_passes > start.gc_passes, "GC ran: {end:?}");
    verify_runs(&volume, &model, "the volume").await;
    volume.shutdown().await.expect("shutdown");
    if spec.reopen {
        let dir2 = TempDir::new("engine-overwrite-reopen");
        let (volume, report) = open_v(&store, dir2.path(), spec.config.clone(), "reopen").await;
        assert!(report.checkpoint_clean);
        verify_runs(&volume, &model, "the volume").await;
        volume.shutdown().await.expect("shutdown");
    }
    let client_bytes = end.client_write_bytes - start.client_write_bytes;
    OverwriteReport {
        client_bytes,
        store_put_bytes: end.store_put_bytes - start.store_put_bytes,
        relocation: 1.0
            + (end.gc_moved_bytes - start.gc_moved_bytes) as f64 / client_bytes.max(1) as f64,
        gc_passes: end.gc_passes - start.gc_passes,
        gc_defrag_bytes: end.gc_defrag_bytes,
        map_extents: end.map_extents,
        gc_hot_moved_bytes: volume
            .stats()
            .gc_hot_moved_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        gc_cold_moved_bytes: volume
            .stats()
            .gc_cold_moved_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        checkpoints: volume
            .stats()
            .checkpoints_written
            .load(std::sync::atomic::Ordering::Relaxed),
        samples,
        steady_ratio_mean: steady_sum / steady_n.max(1) as f64,
        steady_ratio_max: steady_max,
        worst_excess_bytes: worst_excess,
        violations,
        violation_count,
        elapsed: started.elapsed(),
    }
}

/// Run, print the report, and assert the store bound held at every sample.
async fn overwrite_and_check(spec: OverwriteSpec) -> OverwriteReport {
    let r = overwrite_run(&spec).await;
    let mib = (spec.blocks * BLOCK) >> 20;
    println!(
        "overwrite {mib} MiB x{} {:?} {}: WAF {:.3} (store bytes written / client bytes written, checkpoints included), relocation {:.3}, GC passes {}, checkpoints {}; steady store/live mean {:.3} max {:.3} (bound 1/{} = {:.3} + two batches of {} KiB); worst sample vs bound {:+} KiB over {} samples; {:.1}s",
        spec.volume_writes,
        spec.workload,
        spec.config.gc.policy,
        r.waf(),
        r.relocation,
        r.gc_passes,
        r.checkpoints,
        r.steady_ratio_mean,
        r.steady_ratio_max,
        spec.config.gc.start_utilization,
        1.0 / spec.config.gc.start_utilization,
        (spec.two_batches() / 2) >> 10,
        r.worst_excess_bytes / 1024,
        r.samples,
        r.elapsed.as_secs_f64()
    );
    assert!(
        r.violation_count == 0,
        "the store exceeded live/{} + two batches at {} of {} samples:\n  {}",
        spec.config.gc.start_utilization,
        r.violation_count,
        r.samples,
        r.violations.join("\n  ")
    );
    r
}

/// `LSVD_SOAK=1`: the long versions run (the project's soak flag, as in
/// `tests/crash_oracle.rs`).
fn soak() -> bool {
    std::env::var("LSVD_SOAK").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// Overwrite a 1 GiB volume five times over with random 4 KiB writes: every block
/// reads back its latest version (live and after reopening from the store alone), the
/// store stays under live/0.70 + two batches at every sample (after each MiB written,
/// from the first overwrite on), write amplification is reported. About 70 s in a
/// debug build on 2 cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_with_gc_keep_data_and_bound_the_store() {
    let spec = OverwriteSpec::new(1 << 30, Workload::Uniform, GcPolicy::Greedy);
    overwrite_and_check(spec).await;
}

/// The same checks for uniform and 80/20 hot/cold overwrites under each GC policy
/// (greedy, cost-benefit, hylog): 64 MiB volumes in CI, 1 GiB with `LSVD_SOAK=1` (about 5 minutes). Prints a
/// table of write amplification and steady-state store size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_by_workload_and_policy_keep_data_and_bound_the_store() {
    let bytes = if soak() { 1 << 30 } else { 64 << 20 };
    let mut rows = Vec::new();
    for workload in [Workload::Uniform, Workload::HotCold80_20] {
        for policy in [GcPolicy::Greedy, GcPolicy::CostBenefit, GcPolicy::HyLog] {
            let mut spec = OverwriteSpec::new(bytes, workload, policy);
            // The reopen is covered by the 1 GiB test; keep this one shorter.
            spec.reopen = false;
            let r = overwrite_and_check(spec).await;
            let (hot, cold) = (r.gc_hot_moved_bytes, r.gc_cold_moved_bytes);
            if policy != GcPolicy::HyLog {
                assert_eq!((hot, cold), (0, 0), "{policy} has no classes");
            } else if workload == Workload::HotCold80_20 {
                // The hot fifth is found and GC writes both kinds of objects.
                assert!(hot > 0 && cold > 0, "hylog 80/20: hot {hot} cold {cold}");
            }
            rows.push(format!(
                "| {} MiB x5 | {workload:?} | {policy} | {:.3} | {:.3} | {} | {:.3} | {:.3} | {:+} |",
                bytes >> 20,
                r.waf(),
                r.relocation,
                r.gc_passes,
                r.steady_ratio_mean,
                r.steady_ratio_max,
                r.worst_excess_bytes >> 10,
            ));
        }
    }
    println!(
        "| volume | workload | policy | WAF | relocation | GC passes | store/live mean | store/live max | worst vs bound KiB |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n{}",
        rows.join("\n")
    );
}

/// GC on a volume that compresses (lz4): victims' compressed chunks are read and
/// opened, live data is written again compressed, checkpoints are compressed too;
/// every block reads back live and after reopening from the store alone, and the
/// store stays within the bound (which it meets with room to spare: the blocks
/// compress).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_with_gc_on_a_compressing_volume_keep_data() {
    let mut spec = OverwriteSpec::new(32 << 20, Workload::Uniform, GcPolicy::Greedy);
    spec.config.compression = Some(lsvd_core::compression::Compression::Lz4);
    let r = overwrite_and_check(spec).await;
    assert!(r.gc_passes > 0, "GC ran");
}

/// Defragmenting GC (`--gc-defrag-hole 8K`) under 80/20 hot/cold overwrites: the
/// gaps it plugs hold other objects' data, which it copies with the victims' live
/// data. Every block reads back its latest version, live and after reopening from
/// the store alone; the store stays within the same bound; gaps were plugged; and the
/// map ends with fewer extents than the same run without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_with_defragmenting_gc_keep_data_and_shrink_the_map() {
    let run = |hole_bytes| async move {
        let mut spec = OverwriteSpec::new(32 << 20, Workload::HotCold80_20, GcPolicy::Greedy);
        spec.config.gc.defrag_hole_bytes = hole_bytes;
        overwrite_and_check(spec).await
    };
    let plain = run(0).await;
    let defrag = run(8 << 10).await;
    println!(
        "map extents {} -> {}, relocation {:.3} -> {:.3}, defrag bytes {}",
        plain.map_extents,
        defrag.map_extents,
        plain.relocation,
        defrag.relocation,
        defrag.gc_defrag_bytes
    );
    assert_eq!(plain.gc_defrag_bytes, 0, "off unless asked for");
    assert!(
        defrag.gc_passes > 0 && defrag.gc_defrag_bytes > 0,
        "{defrag:?}"
    );
    assert!(
        defrag.map_extents < plain.map_extents,
        "{plain:?}\n{defrag:?}"
    );
}

/// Back-pressure: when GC falls behind (here: its GETs are slowed to a crawl), closed
/// client batches wait instead of growing the store past live/0.70 + two batches;
/// writes still complete (into the write log). A shutdown with batches held uploads
/// them: reopening from the store alone finds every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_objects_wait_while_gc_is_behind_and_go_up_at_shutdown() {
    let dir = TempDir::new("engine-held");
    let mem = MemStore::new();
    let spec = OverwriteSpec::new(16 << 20, Workload::Uniform, GcPolicy::Greedy);
    let blocks = spec.blocks;
    let size = blocks * BLOCK;
    let (volume, faulty) =
        open_behind_faults(Arc::new(mem.clone()), size, &dir, spec.config.clone()).await;
    let mut model = vec![0u64; blocks as usize];
    let mut version = 0;
    for b in 0..blocks {
        write_next_versions(&volume, &mut model, b..b + 1, &mut version).await;
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // GC reads its victims with GETs: make each take a second.
    faulty.set_get_delay_ms(1000);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let bound = |s: &crate::VolumeStatus| s.live_bytes as f64 / 0.70 + spec.two_batches() as f64;
    let (mut held_seen, mut after_held) = (0u64, 0u32);
    for i in 0..8 * blocks {
        let b = rng.next() % blocks;
        write_next_versions(&volume, &mut model, b..b + 1, &mut version).await;
        if i % 64 == 0 {
            let s = volume.status();
            let stored = data_object_bytes(&mem);
            assert!(
                stored as f64 <= bound(&s),
                "store {stored} over live/0.70 + two batches ({:.0}): {s:?}",
                bound(&s)
            );
            held_seen = held_seen.max(s.uploads_held);
            if held_seen > 0 {
                after_held += 1;
                if after_held > 8 {
                    break;
                }
            }
        }
    }
    assert!(
        held_seen > 0,
        "client objects were never held back while GC was slowed"
    );
    // Shut down with batches held and GC still slow: they must all go up.
    volume.shutdown().await.expect("shutdown");
    let dir2 = TempDir::new("engine-held-reopen");
    let plain: DynStore = Arc::new(mem.clone());
    let (volume, report) = open_volume(plain, "v", dir2.path(), spec.config.clone())
        .await
        .expect("reopen from the store alone");
    assert!(report.checkpoint_clean);
    verify_runs(&volume, &model, "the volume").await;
    volume.shutdown().await.expect("shutdown");
}

/// A 16 MiB volume, filled and then every other block overwritten with GC off: every
/// object is half live (utilization below GC's default start). Returns the model.
async fn half_live_volume(store: &DynStore, dir: &TempDir) -> Vec<u64> {
    let blocks = 4096u64; // 16 MiB
    let off = EngineConfig {
        gc: no_gc(),
        ..config()
    };
    let (volume, _) = create_and_open(store, "v", blocks * BLOCK, dir.path(), off).await;
    let mut model = vec![0u64; blocks as usize];
    write_version(&volume, &mut model, 0..blocks, 1).await;
    write_version(&volume, &mut model, (0..blocks).step_by(2), 2).await;
    volume.shutdown().await.expect("shutdown");
    model
}

/// A [`half_live_volume`] (its files in the directory returned, with its model)
/// reopened by [`open_paced`].
async fn paced_half_live_volume(
    tag: &str,
    rate: u64,
) -> (
    TempDir,
    Vec<u64>,
    Arc<Volume>,
    Arc<lsvd_store::clock::ManualClock>,
) {
    let dir = TempDir::new(tag);
    let store: DynStore = Arc::new(MemStore::new());
    let model = half_live_volume(&store, &dir).await;
    let (volume, clock) = open_paced(&store, &dir, rate).await;
    (dir, model, volume, clock)
}

/// [`half_live_volume`] reopened with GC on at `rate` bytes per second (4 MiB passes)
/// on a manual clock.
async fn open_paced(
    store: &DynStore,
    dir: &TempDir,
    rate: u64,
) -> (Arc<Volume>, Arc<lsvd_store::clock::ManualClock>) {
    use lsvd_store::clock::{ManualClock, SharedClock};
    let clock = ManualClock::new();
    let on = EngineConfig {
        gc_min_rate_bytes: rate,
        gc: lsvd_core::gc::GcConfig {
            pass_bytes: 4 << 20,
            ..Default::default()
        },
        clock: SharedClock(clock.clone()),
        ..config()
    };
    let (volume, _) = open_v(store, dir.path(), on, "reopen").await;
    assert!(volume.status().utilization < 0.70);
    (volume, clock)
}

/// Shut `volume` down while its manual clock keeps moving: a pass's last paced step
/// (its checkpoint's share) may still be sleeping on it, and only time ends that
/// sleep. A clock stopped here hung a test.
async fn shutdown_ticking(volume: Arc<Volume>, clock: &Arc<lsvd_store::clock::ManualClock>) {
    use std::time::Duration;
    let ticker = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                clock.advance(Duration::from_millis(100));
                pause().await;
            }
        })
    };
    volume.shutdown().await.expect("shutdown");
    ticker.abort();
}

/// Advance `clock` by `step` at a time (2 ms of real time after each, for the tasks to
/// do what the new time allows), calling `each` with the clock time so far after each
/// step, until GC has reached its stop threshold with nothing left to upload; fail if
/// it does not within 3000 steps, or if it moved under 2 MiB. Returns the clock time
/// it took and the bytes GC moved.
async fn step_until_gc_done(
    volume: &Volume,
    clock: &lsvd_store::clock::ManualClock,
    step: std::time::Duration,
    mut each: impl AsyncFnMut(std::time::Duration),
) -> (std::time::Duration, u64) {
    let mut elapsed = std::time::Duration::ZERO;
    for _ in 0..3000 {
        clock.advance(step);
        elapsed += step;
        pause().await;
        each(elapsed).await;
        let s = volume.status();
        if s.utilization > 0.75 && s.uploads_pending == 0 && !s.gc_pass_in_flight {
            assert!(s.gc_moved_bytes >= 2 << 20, "GC moved too little: {s:?}");
            return (elapsed, s.gc_moved_bytes);
        }
    }
    panic!("GC did not reach its stop threshold: {:?}", volume.status());
}

/// GC is paced while clients do I/O: it moves data at its minimum rate, not as fast as
/// it can (which, on a fragmented volume, took client I/O latency up twentyfold).
/// Reads keep the clients busy here without raising the rate (which follows writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_moves_data_at_its_minimum_rate_while_clients_read() {
    use std::time::Duration;
    // At every point of simulated time GC has moved no more than the rate allows. At
    // 256 KiB/s the 2 MiB or more it moves take several seconds of clock time, more
    // than the two that would make idle clients unpace it: the client reads must be
    // what keeps it paced (a pacer blind to reads failed here).
    let rate = 256u64 << 10;
    let (_dir, model, volume, clock) = paced_half_live_volume("engine-gc-pace", rate).await;
    let mut reads = 0u64;
    step_until_gc_done(
        &volume,
        &clock,
        Duration::from_millis(100),
        async |elapsed| {
            // GC read at least what it moved; its bucket starts empty and holds at most
            // 1 MiB.
            let moved = volume.status().gc_moved_bytes;
            let allowed = rate as f64 * elapsed.as_secs_f64() + (1 << 20) as f64;
            assert!(
                moved as f64 <= allowed,
                "GC moved {moved} bytes in {elapsed:?} of clock time, faster than {rate} bytes/s",
            );
            // A client read in every step: the clients are never idle.
            volume
                .read((reads % 4096) * BLOCK, BLOCK)
                .await
                .expect("client read");
            reads += 1;
        },
    )
    .await;
    verify_runs(&volume, &model, "the volume").await;
    shutdown_ticking(volume, &clock).await;
}

/// Pacing protects client I/O: once clients have done none for two seconds, GC runs
/// as fast as it can, far faster than its rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_runs_unpaced_once_clients_are_idle() {
    use std::time::Duration;
    // 64 KiB/s: paced, the 2 MiB or more this GC moves would take 30 s of clock time.
    let rate = 64u64 << 10;
    let (_dir, model, volume, clock) = paced_half_live_volume("engine-gc-idle", rate).await;
    let (elapsed, moved) =
        step_until_gc_done(&volume, &clock, Duration::from_millis(20), async |_| {}).await;
    let allowed = rate as f64 * elapsed.as_secs_f64() + (1 << 20) as f64;
    assert!(
        moved as f64 > allowed,
        "GC moved {moved} bytes in {elapsed:?} of clock time; paced it could move {allowed}"
    );
    verify_runs(&volume, &model, "the volume").await;
    shutdown_ticking(volume, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_frees_store_space_after_gc() {
    let dir = TempDir::new("engine-trim");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    let blocks = 2048u64;
    let (volume, _) = create_and_open(&store, "v", blocks * BLOCK, dir.path(), config()).await;
    let mut model = vec![0u64; blocks as usize];
    for b in 0..blocks {
        volume
            .write(b * BLOCK, block_data(b, b + 1), false)
            .await
            .expect("write");
        model[b as usize] = b + 1;
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // Trim 90%.
    let keep = blocks / 10;
    volume
        .write_zeroes(keep * BLOCK, (blocks - keep) * BLOCK, false)
        .await
        .expect("trim");
    for m in model.iter_mut().skip(keep as usize) {
        *m = 0;
    }
    volume.flush().await.expect("flush");
    poll_until(std::time::Duration::from_secs(10), async || {
        let s = volume.status();
        s.uploads_pending == 0 && s.store_bytes < 2 * keep * BLOCK + (512 << 10)
    })
    .await;
    let s = volume.status();
    assert_eq!(s.live_bytes, keep * BLOCK);
    assert!(
        s.store_bytes < 2 * keep * BLOCK + (512 << 10),
        "store shrank after trim: {s:?}"
    );
    let alloc = volume.allocation(0, blocks * BLOCK).expect("allocation");
    assert_eq!(
        alloc,
        vec![(keep * BLOCK, true), ((blocks - keep) * BLOCK, false)]
    );
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
    verify_from_store_alone(store, "engine-trim-reopen", config(), &model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_cache_hits_evicts_survives_restart_and_never_serves_stale_data() {
    let dir = TempDir::new("engine-rcache");
    let store: DynStore = Arc::new(MemStore::new());
    let blocks = 1024u64; // 4 MiB volume, 1 MiB read cache (16 chunks of 64 KiB)
    let cfg = EngineConfig {
        read_cache_bytes: 1 << 20,
        gc: no_gc(),
        ..config()
    };
    let (volume, _) = create_and_open(&store, "v", blocks * BLOCK, dir.path(), cfg.clone()).await;
    for b in 0..blocks {
        volume
            .write(b * BLOCK, block_data(b, 1), false)
            .await
            .expect("write");
    }
    volume.shutdown().await.expect("shutdown");
    // Reopen: the log is empty, so reads go to objects.
    let (volume, _) = open_v(&store, dir.path(), cfg.clone(), "open").await;
    let s0 = volume.status();
    assert_eq!(volume.read(0, BLOCK).await.expect("read"), block_data(0, 1));
    let s1 = volume.status();
    assert_eq!(s1.read_cache_misses - s0.read_cache_misses, 1);
    // The rest of the 64 KiB chunk was prefetched: block 1 is a hit.
    assert_eq!(
        volume.read(BLOCK, BLOCK).await.expect("read"),
        block_data(1, 1)
    );
    let s2 = volume.status();
    assert_eq!(s2.read_cache_hits - s1.read_cache_hits, 1);
    // Write after read: the new data wins over the cached chunk, before and after upload.
    volume
        .write(BLOCK, block_data(1, 2), false)
        .await
        .expect("write");
    assert_eq!(
        volume.read(BLOCK, BLOCK).await.expect("read"),
        block_data(1, 2)
    );
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    assert_eq!(
        volume.read(0, 2 * BLOCK).await.expect("read")[BLOCK as usize..],
        block_data(1, 2)[..]
    );
    // Read the whole volume: 64 chunks through a 16-chunk cache forces eviction.
    for b in 0..blocks {
        let want = block_data(b, if b == 1 { 2 } else { 1 });
        assert_eq!(
            volume.read(b * BLOCK, BLOCK).await.expect("read"),
            want,
            "block {b}"
        );
    }
    let s3 = volume.status();
    assert_eq!(s3.read_cache_entries, 16, "cache is full, not larger");
    volume.shutdown().await.expect("shutdown");
    // Warm restart: the last chunks read are still cached.
    let (volume, _) = open_v(&store, dir.path(), cfg, "open").await;
    assert_eq!(volume.status().read_cache_entries, 16);
    let h0 = volume.status().read_cache_hits;
    assert_eq!(
        volume
            .read((blocks - 1) * BLOCK, BLOCK)
            .await
            .expect("read"),
        block_data(blocks - 1, 1)
    );
    assert_eq!(
        volume.status().read_cache_hits,
        h0 + 1,
        "warm hit after restart"
    );
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_volume_does_not_spin() {
    // Regression: the uploader's periodic tick woke the writer, which woke the
    // uploader, which ticked again: a busy loop burning a core while idle. On a manual
    // clock, an idle uploader wakes once per tick it sleeps through and never on its
    // own; the GC task likewise.
    use lsvd_store::clock::{ManualClock, SharedClock};
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::Duration;
    let clock = ManualClock::new();
    let dir = TempDir::new("engine-idle");
    let store: DynStore = Arc::new(MemStore::new());
    let cfg = EngineConfig {
        clock: SharedClock(clock.clone()),
        ..config()
    };
    let (volume, _) = create_and_open(&store, "v", 1 << 20, dir.path(), cfg).await;
    volume
        .write(0, vec![1u8; 4096], false)
        .await
        .expect("write");
    let stats = volume.stats();
    let settle = |what: &str| {
        let what = what.to_string();
        let volume = volume.clone();
        async move {
            let drained = poll_until(Duration::from_secs(10), async || {
                let s = volume.status();
                s.uploads_pending == 0 && s.log_used_bytes == 0
            })
            .await;
            assert!(drained, "{what}: {:?}", volume.status());
        }
    };
    // Let the batch time out and go up.
    clock.advance(Duration::from_secs(3));
    settle("the write was uploaded").await;
    let (uploader0, gc0) = (
        stats.uploader_wakeups.load(SeqCst),
        stats.gc_wakeups.load(SeqCst),
    );
    // Idle: with the clock standing still, give a busy loop every chance to show.
    for _ in 0..2000 {
        tokio::task::yield_now().await;
    }
    let wakeups = || {
        (
            stats.uploader_wakeups.load(SeqCst),
            stats.gc_wakeups.load(SeqCst),
        )
    };
    poll_until(Duration::from_millis(50), async || {
        wakeups() != (uploader0, gc0)
    })
    .await;
    assert_eq!(
        wakeups(),
        (uploader0, gc0),
        "an idle volume woke with the clock standing still"
    );
    // Ten seconds of ticks, one advance each: one wake-up per advance at most.
    for _ in 0..10 {
        let before = stats.uploader_wakeups.load(SeqCst);
        clock.advance(Duration::from_secs(1));
        poll_until(Duration::from_secs(2), async || {
            stats.uploader_wakeups.load(SeqCst) > before
        })
        .await;
    }
    for _ in 0..2000 {
        tokio::task::yield_now().await;
    }
    let uploader = stats.uploader_wakeups.load(SeqCst) - uploader0;
    let gc = stats.gc_wakeups.load(SeqCst) - gc0;
    assert!(
        (1..=10).contains(&uploader) && gc <= 10,
        "uploader woke {uploader} times and GC {gc} times in 10 idle advances of the clock"
    );
    volume.shutdown().await.expect("shutdown");
}

/// Timing: recovery of a volume whose write log holds 1 GiB not yet in the store.
/// `cargo test --release -p lsvd --lib engine::tests::recovery_time -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing measurement"]
async fn recovery_time_with_one_gib_of_log() {
    let dir = TempDir::new("engine-recovery-time");
    let mem = MemStore::new();
    let gib = 1u64 << 30;
    let cfg = EngineConfig {
        log_size_bytes: gib + (256 << 20),
        batch_size_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    let (volume, faulty) =
        open_behind_faults(Arc::new(mem.clone()), 2 * gib, &dir, cfg.clone()).await;
    let store: DynStore = faulty.clone();
    faulty
        .outage
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let chunk = vec![0x5au8; 1 << 20];
    let mut rng = Rng(7);
    for _ in 0..1024 {
        let at = (rng.next() % 2048) << 20;
        volume.write(at, chunk.clone(), false).await.expect("write");
    }
    volume.flush().await.expect("flush");
    let status = volume.status();
    volume.crash();
    drop(volume);
    faulty
        .outage
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let t = std::time::Instant::now();
    let (volume, report) = open_v(&store, dir.path(), cfg, "reopen").await;
    let open = t.elapsed();
    println!(
        "log held {} MiB not in the store; recovery replayed {} records ({} MiB, {} records from the write-log index) in {:?}",
        status.log_used_bytes >> 20,
        report.log_records_replayed,
        report.log_bytes_replayed >> 20,
        report.log_records_from_index,
        open
    );
    assert!(report.log_bytes_replayed >= gib);
    volume.shutdown().await.expect("shutdown");
}

/// The log writer puts a group of concurrent writes into one record, and a batch used
/// to close only after the record that filled it: a client object could exceed the
/// batch size by a group less one write, and the store its GC bound with it. A record
/// that would overflow the open batch now starts the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_never_exceed_the_batch_size_when_writes_share_records() {
    use lsvd_core::format::object::{ObjectKind, header_bytes_for};
    use tokio::task::JoinSet;

    const BATCH: u64 = 64 << 10;
    const WRITES: u64 = 4000;
    let dir = TempDir::new("engine-batch-size");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    let blocks = 1024u64;
    let config = EngineConfig {
        batch_size_bytes: BATCH,
        read_cache_bytes: 0,
        gc: no_gc(),
        ..EngineConfig::default()
    };
    let (volume, _) = create_and_open(&store, "v", blocks * BLOCK, dir.path(), config).await;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut inflight: JoinSet<lsvd_core::error::Result<()>> = JoinSet::new();
    for i in 0..WRITES {
        while inflight.len() >= 32 {
            inflight
                .join_next()
                .await
                .expect("a write in flight")
                .expect("join")
                .expect("write");
        }
        let b = rng.next() % blocks;
        let v = volume.clone();
        inflight.spawn(async move { v.write(b * BLOCK, block_data(b, i + 1), false).await });
    }
    while let Some(r) = inflight.join_next().await {
        r.expect("join").expect("write");
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    let records = volume
        .stats()
        .log_records
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        records < WRITES * 9 / 10,
        "writes must share records for this test to mean anything: {records} records for {WRITES} writes"
    );
    let largest = header_bytes_for(ObjectKind::Data, (BATCH / BLOCK) as usize, 0, BATCH) + BATCH;
    let objects: Vec<(String, u64)> = mem
        .snapshot()
        .into_iter()
        .filter(|(k, _)| k.ends_with(".d"))
        .collect();
    assert!(objects.len() as u64 >= WRITES * BLOCK / BATCH / 4);
    for (key, bytes) in &objects {
        assert!(
            *bytes <= largest,
            "{key}: {bytes} bytes, more than a batch of {BATCH} and its header ({largest})"
        );
    }
    volume.shutdown().await.expect("shutdown");
}

/// GC takes a victim's live data from the read cache when clients read it recently
/// (here: the whole volume, then a restart, so the cache is warm from its saved index),
/// and the data it moves that way is the right data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_reads_live_data_from_the_read_cache() {
    let dir = TempDir::new("engine-gc-cache");
    let store: DynStore = Arc::new(MemStore::new());
    let blocks = 1024u64; // 4 MiB
    let off = EngineConfig {
        read_cache_bytes: 16 << 20,
        gc: no_gc(),
        ..config()
    };
    let (volume, _) = create_and_open(&store, "v", blocks * BLOCK, dir.path(), off.clone()).await;
    let mut model = vec![0u64; blocks as usize];
    write_version(&volume, &mut model, 0..blocks, 1).await;
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // Clients read everything (from the store: the log space was freed by uploads).
    verify_runs(&volume, &model, "the volume").await;
    assert!(volume.status().read_cache_entries > 0);
    // Overwrite every other block: every filled object is half live.
    write_version(&volume, &mut model, (0..blocks).step_by(2), 2).await;
    volume.shutdown().await.expect("shutdown");

    let on = EngineConfig {
        gc: lsvd_core::gc::GcConfig {
            pass_bytes: 1 << 20,
            ..Default::default()
        },
        ..off
    };
    let (volume, _) = open_v(&store, dir.path(), on, "reopen").await;
    assert!(volume.status().utilization < 0.70);
    poll_until(std::time::Duration::from_secs(30), async || {
        let s = volume.status();
        s.utilization > 0.75 && s.uploads_pending == 0 && !s.gc_pass_in_flight
    })
    .await;
    let s = volume.status();
    assert!(s.utilization > 0.75, "GC finished: {s:?}");
    // A pass or two (how much one pass moves depends on when it starts against the
    // reopened volume's uploads): enough that the check below means something.
    assert!(s.gc_moved_bytes >= 256 << 10, "GC moved data: {s:?}");
    assert_eq!(
        s.gc_cache_read_bytes, s.gc_moved_bytes,
        "all live data came from the read cache: {s:?}"
    );
    verify_runs(&volume, &model, "the volume").await;
    volume.shutdown().await.expect("shutdown");
    // And from the store alone.
    verify_from_store_alone(store, "engine-gc-cache-reopen", config(), &model).await;
}

/// Uploaded data admitted to the read cache is read back without a single GET, and
/// stays cached across a crash (the slot table is written as chunks come in), again
/// without a GET, not even for object headers. Without admission, the same reads GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_data_is_read_from_the_read_cache_even_after_a_crash() {
    use crate::config::Admission;
    use std::sync::atomic::Ordering::Relaxed;
    let blocks = 512u64; // 2 MiB: several objects
    for admit in [Admission::Always, Admission::Auto] {
        let dir = TempDir::new("engine-admit");
        let store: DynStore = Arc::new(MemStore::new());
        let cfg = EngineConfig {
            read_cache_bytes: 16 << 20,
            read_cache_admit: admit,
            ..config()
        };
        let (volume, _) =
            create_and_open(&store, "v", blocks * BLOCK, dir.path(), cfg.clone()).await;
        let mut model = vec![0u64; blocks as usize];
        write_version(&volume, &mut model, 0..blocks, 1).await;
        volume.flush().await.expect("flush");
        wait_for_uploads(&volume).await;
        // Admission runs beside the upload; let it finish.
        poll_until(std::time::Duration::from_secs(5), async || {
            admit == Admission::Auto
                || volume.status().read_cache_admitted_chunks >= blocks * BLOCK / (64 << 10)
        })
        .await;
        let gets = volume.stats().store_gets.load(Relaxed);
        verify_runs(&volume, &model, "the volume").await;
        let after = volume.stats().store_gets.load(Relaxed);
        match admit {
            Admission::Always => assert_eq!(after, gets, "reads of admitted data GET nothing"),
            // The memory store counts as local: Auto does not admit.
            _ => {
                assert_eq!(volume.status().read_cache_admitted_chunks, 0);
                assert!(after > gets, "without admission the reads GET");
            }
        }
        if admit != Admission::Always {
            volume.shutdown().await.expect("shutdown");
            continue;
        }
        // A crash (no shutdown, nothing saved), then a restart: still no GET.
        volume.crash();
        drop(volume);
        let (volume, _) = open_v(&store, dir.path(), cfg, "reopen").await;
        assert!(volume.status().read_cache_entries > 0);
        let gets = volume.stats().store_gets.load(Relaxed);
        verify_runs(&volume, &model, "the volume").await;
        assert_eq!(
            volume.stats().store_gets.load(Relaxed),
            gets,
            "the cache survived the crash"
        );
        volume.shutdown().await.expect("shutdown");
    }
}
