//! In-process crash kinds: the engine runs in this process on a [`FaultyCache`] and a
//! [`FaultyStore`]; a crash fails both at once (and stops the volume), then a new
//! incarnation opens what the crash left behind.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::object::{ObjectKind, decode_object_header};
use lsvd_core::format::volume_super::decode_volume_super;
use lsvd_core::gc::{GcConfig, GcPolicy};
use lsvd_core::recovery::PartGroup;
use lsvd_engine::cache_dev::CacheDevice;
use lsvd_engine::cache_dev::faulty::FaultyCache;
use lsvd_engine::keys::{objects_prefix, parse_object_name, super_prefix};
use lsvd_engine::{EngineConfig, OpenReport, RecoveryMode, Volume};
use lsvd_store::faulty::{FaultPlan, FaultyStore};
use lsvd_store::fs::FsStore;
use lsvd_store::mem::MemStore;
use lsvd_store::{DynStore, ObjectStore, PutMode};

use super::checker::{self, Rule};
use super::history::{Content, History, Record};
use super::rng::Rng;
use super::stamp::{BLOCK, Seen};
use super::workload::{self, Control, Hooks, RunOutcome, Spec, Target};
use super::{Failure, Stats, TempDir};
use crate::common::{NO_LIMIT, Poller, let_ms_pass, let_time_pass_async, wait_every_async};

pub const NAME: &str = "v";
pub const LOG_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// (ii) power loss: unsynced cache writes dropped, some landed, the last torn.
    PowerLoss,
    /// (iii) store faults (failed PUTs, lost replies, reordering, outages, lost newest
    /// objects) with a crash; judged with the cache intact and with it lost.
    StoreFaults,
    /// (iv) the cache device is lost entirely.
    CacheLost,
    /// (v) a crash during recovery, then recovery again.
    RecoveryCrash,
}

#[derive(Debug, Clone, Copy)]
enum CrashMode {
    /// The process died: completed writes survive in the page cache.
    Process,
    /// The machine lost power (seed of the failure).
    Power(u64),
}

/// One process incarnation: a volume with its own store client and cache handle.
struct Inc {
    vol: Arc<Volume>,
    store: Arc<FaultyStore>,
    cache: Arc<FaultyCache>,
}

async fn open(
    base: &DynStore,
    plan: FaultPlan,
    seed: u64,
    cache: Arc<FaultyCache>,
    config: &EngineConfig,
) -> io::Result<(Inc, OpenReport)> {
    let store = Arc::new(FaultyStore::new(base.clone(), plan, seed));
    let (vol, report) = open_with(store.clone(), cache.clone(), config).await?;
    Ok((Inc { vol, store, cache }, report))
}

async fn open_with(
    store: Arc<FaultyStore>,
    cache: Arc<FaultyCache>,
    config: &EngineConfig,
) -> io::Result<(Arc<Volume>, OpenReport)> {
    cache.set_write_hook(super::forensics::record_checker());
    let s: DynStore = store;
    let c: Arc<dyn CacheDevice> = cache;
    Ok(lsvd_engine::open_volume_on(s, NAME, c, "faulty-cache", config.clone()).await?)
}

/// Crash an incarnation: the store client dies, the device fails (or already failed),
/// the volume stops. Returns what the device holds afterwards.
fn crash(inc: &Inc, mode: CrashMode) -> Vec<u8> {
    inc.store.kill();
    let (image, report) = match inc.cache.take_failure() {
        Some((img, rep)) => (img, Some(rep)),
        None => match mode {
            CrashMode::Process => (inc.cache.process_crash(), None),
            CrashMode::Power(seed) => {
                let (img, rep) = inc.cache.power_fail(seed);
                (img, Some(rep))
            }
        },
    };
    inc.vol.crash();
    // Self-check: a record with a valid CRC but wrong data cannot come from the engine
    // (every record write is checked as it is written); if one shows up here, say
    // which unsynced writes the failure applied over it.
    for (off, len, what) in super::forensics::image_anomalies(&image) {
        let pending = inc.cache.pending_writes();
        let originals: Vec<String> = pending
            .iter()
            .filter(|(o, d)| *o < off + len && off < o + d.len() as u64)
            .map(|(o, d)| {
                let from = off.max(*o);
                let to = (off + len).min(o + d.len() as u64);
                let differing: Vec<u64> = (from..to)
                    .step_by(512)
                    .filter(|&x| {
                        let a = &image[x as usize..(x + 512) as usize];
                        let b = &d[(x - o) as usize..(x - o + 512) as usize];
                        a != b
                    })
                    .map(|x| (x - off) / 512)
                    .collect();
                let hdr = lsvd_core::format::record::decode_record_header(d).ok();
                let v_written = hdr.as_ref().map(|h| lsvd_core::format::record::verify_record(h, d).is_ok());
                let v_image = hdr.as_ref().map(|h| {
                    lsvd_core::format::record::verify_record(h, &image[*o as usize..]).is_ok()
                });
                let last = |b: &[u8]| {
                    let n = b.len();
                    let mut blk = [0u8; 8];
                    let mut id = [0u8; 8];
                    blk.copy_from_slice(&b[n - 4096 + 8..n - 4096 + 16]);
                    id.copy_from_slice(&b[n - 4096 + 16..n - 4096 + 24]);
                    (u64::from_le_bytes(blk), u64::from_le_bytes(id), crc32c::crc32c(&b[n - 4096..]))
                };
                let img = &image[*o as usize..*o as usize + d.len()];
                format!(
                    "pending write at {o} ({} bytes): last block written {:?} / in image {:?}; whole crc written {:#x} image {:#x}; sectors of the record that differ in the image: {differing:?}; header {:?}; verifies as written {v_written:?}, in the image {v_image:?}",
                    d.len(),
                    last(d),
                    last(img),
                    crc32c::crc32c(d),
                    crc32c::crc32c(img),
                    hdr.as_ref().map(|h| (h.header_bytes, h.data_sectors, h.crc, h.extents.len()))
                )
            })
            .collect();
        let touching: Vec<String> = report
            .as_ref()
            .map(|r| {
                r.fates
                    .iter()
                    .filter(|(o, n, _)| *o < off + len && off < o + n)
                    .map(|(o, n, f)| format!("[{o}, {}) fate {f}", o + n))
                    .collect()
            })
            .unwrap_or_default();
        super::forensics::WRITE_ANOMALIES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!(
                "IMAGE at crash: {what}; unsynced writes over it: {touching:?}; {originals:?}; device history: {}",
                super::forensics::writes_touching(off, len)
            ));
    }
    image
}

pub async fn wait_drained(vol: &Volume, limit: Duration) -> bool {
    let drained = || {
        let s = vol.status();
        s.log_used_bytes == 0 && s.uploads_pending == 0
    };
    wait_every_async(Duration::from_millis(20), limit, drained).await
}

/// A copy of every object, in memory.
async fn copy_store(src: &DynStore) -> io::Result<DynStore> {
    let dst = MemStore::new();
    for e in src.list("").await.map_err(io::Error::other)? {
        let data = src.get(&e.key).await.map_err(io::Error::other)?;
        dst.put(&e.key, data.into(), PutMode::Overwrite)
            .await
            .map_err(io::Error::other)?;
    }
    Ok(Arc::new(dst))
}

/// The volume's objects as (seq, key), ascending.
async fn objects(store: &DynStore) -> io::Result<Vec<(u64, String)>> {
    let mut out: Vec<(u64, String)> = store
        .list(&objects_prefix(NAME))
        .await
        .map_err(io::Error::other)?
        .into_iter()
        .filter_map(|e| parse_object_name(&e.key).map(|n| (n.seq, e.key)))
        .collect();
    out.sort();
    Ok(out)
}

fn random_config(rng: &mut Rng, kind: Kind) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: *rng.pick(&[64 << 10, 256 << 10, 1 << 20]),
        batch_timeout_ms: *rng.pick(&[20, 100, 300]),
        uploads_in_flight: *rng.pick(&[1, 2, 4, 8]),
        log_size_bytes: LOG_BYTES,
        group_commit_max_bytes: *rng.pick(&[64 << 10, 1 << 20, 4 << 20]),
        checkpoint_every_objects: 3,
        recovery_mode: RecoveryMode::Strict,
        gc: random_gc(rng, kind != Kind::StoreFaults),
        // Overlapped log writes: with more than one in flight a later record can be
        // on the device while an earlier one is torn.
        log_writes_in_flight: *rng.pick(&[1, 2, 4, 16]),
        // GC beside queued client objects (`--gc-headroom`) in a third of the episodes.
        gc_headroom_bytes: Some(*rng.pick(&[0, 0, 1 << 20])),
        // Uploads take records from memory, from the log, or both (a small bound
        // drops the oldest records first).
        upload_memory_bytes: *rng.pick(&[0, 256 << 10, 32 << 20]),
        // The log frees records once uploaded (the default in a 16 MiB log), or keeps
        // uploaded records for reads until it needs the space: a crash then finds
        // the tail well behind the store's end.
        log_free_target_bytes: *rng.pick(&[None, Some(2 << 20), Some(8 << 20)]),
        ..EngineConfig::default()
    }
}

/// Garbage collection: mostly on and eager (small volumes, many overwrites), so GC
/// relocation races client writes and crashes land mid-pass; defragmenting in half
/// the episodes. `eager`: start at 0.9
/// instead of 0.5 in a quarter of the episodes, where GC then runs almost all the time
/// (0.5 is seldom reached within an episode). `store_faults` keeps 0.5: its slow,
/// failing PUTs make constant GC cost too much time.
pub fn random_gc(rng: &mut Rng, eager: bool) -> GcConfig {
    let start = if eager {
        *rng.pick(&[0.0, 0.7, 0.85, 0.9])
    } else {
        *rng.pick(&[0.0, 0.5, 0.7, 0.85])
    };
    GcConfig {
        start_utilization: start,
        stop_utilization: if start == 0.0 { 0.75 } else { start + 0.08 },
        policy: *rng.pick(&[GcPolicy::Greedy, GcPolicy::CostBenefit, GcPolicy::HyLog]),
        pass_bytes: *rng.pick(&[256 << 10, 1 << 20, 4 << 20]),
        // Defragmenting GC in half the episodes: plugged gaps are other objects' data,
        // relocated with the victims' and subject to the same races.
        defrag_hole_bytes: *rng.pick(&[0, 0, 4 << 10, 8 << 10, 64 << 10, 0]),
    }
}

fn fault_plan(kind: Kind, rng: &mut Rng) -> FaultPlan {
    match kind {
        Kind::StoreFaults => FaultPlan {
            fail_put: *rng.pick(&[0.05, 0.1, 0.2]),
            land_then_fail: *rng.pick(&[0.0, 0.05, 0.1]),
            max_put_delay_ms: *rng.pick(&[5, 20, 50]),
        },
        // Out-of-order completion everywhere; a few failures.
        _ => FaultPlan {
            fail_put: *rng.pick(&[0.0, 0.05]),
            land_then_fail: *rng.pick(&[0.0, 0.05]),
            max_put_delay_ms: *rng.pick(&[0, 10, 40]),
        },
    }
}

/// The outage injector of [`Kind::StoreFaults`]: short outages at random, and
/// optionally one long one first that lasts until the write log is nearly full or
/// writes stall.
async fn outages(
    store: Arc<FaultyStore>,
    vol: Arc<Volume>,
    ctl: Arc<Control>,
    mut rng: Rng,
    long: bool,
    stats: Arc<Stats>,
) {
    let stopped = || {
        ctl.stop.load(Ordering::SeqCst) || ctl.crashed.load(Ordering::SeqCst) || store.is_killed()
    };
    if long {
        let_ms_pass(rng.below(100)).await;
        store.set_outage(true);
        stats.add("long_outages", 1);
        let mut poll = Poller::new(Duration::from_millis(20), Duration::from_secs(20));
        poll.tick().await; // the first look comes one interval in
        let mut last = ctl.acked.load(Ordering::SeqCst);
        let mut last_change = Instant::now();
        while !stopped() && poll.tick().await {
            let s = vol.status();
            if s.log_used_bytes * 10 >= s.log_capacity_bytes * 7 {
                stats.add("outage_log_70pct_full", 1);
                break;
            }
            let a = ctl.acked.load(Ordering::SeqCst);
            if a != last {
                last = a;
                last_change = Instant::now();
            } else if last_change.elapsed() > Duration::from_millis(800)
                && ctl.inflight.load(Ordering::SeqCst) > 0
            {
                stats.add("outage_writes_stalled", 1);
                break;
            }
        }
        if !stopped() {
            let_ms_pass(rng.range(100, 600)).await;
        }
        store.set_outage(false);
    }
    while !stopped() {
        let_ms_pass(rng.range(100, 1000)).await;
        if stopped() {
            break;
        }
        store.set_outage(true);
        stats.add("short_outages", 1);
        let_ms_pass(rng.range(20, 300)).await;
        store.set_outage(false);
    }
    store.set_outage(false);
}

/// Run a workload on `inc` and crash it. Returns the history, the device image and
/// what the run did.
struct Crashed {
    rec: Record,
    image: Vec<u8>,
    out: RunOutcome,
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    inc: &Inc,
    rng: &mut Rng,
    nblocks: u64,
    contents: &[Content],
    ids: &Arc<AtomicU64>,
    barriers: u32,
    mode: CrashMode,
    arm_after_ios: Option<u64>,
    outage: Option<bool>,
    stats: &Arc<Stats>,
    notes: &mut Vec<String>,
) -> Crashed {
    let hist = Arc::new(History::new(contents.to_vec()));
    let mut spec = Spec::random(rng, nblocks);
    spec.store_barriers = barriers;
    // Sometimes crash in the middle of a GC pass (relocation reads, GC objects
    // uploading, or its closing checkpoint not yet durable) instead of at an
    // acknowledgement: at the nth pass of the round, a moment after it starts (or after
    // the workload if no such pass comes).
    let gc_trigger = rng
        .chance(0.35)
        .then(|| (rng.range(1, 3), Duration::from_micros(rng.below(3000))));
    if let Some((nth, delay)) = gc_trigger {
        spec.crash_after_acks = None;
        notes.push(format!(
            "crash armed {delay:?} into GC pass #{nth} of the round"
        ));
    }
    notes.push(format!("workload {spec:?}"));
    if let Some(ahead) = arm_after_ios {
        let at = inc.cache.ios() + ahead;
        inc.cache.arm_power_fail(at, rng.next_u64());
        notes.push(format!("power fails at device I/O #{at}"));
    }
    let slot: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
    let crash_fn: Arc<dyn Fn() + Send + Sync> = {
        let (vol, store, cache, slot) = (
            inc.vol.clone(),
            inc.store.clone(),
            inc.cache.clone(),
            slot.clone(),
        );
        Arc::new(move || {
            let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                let inc = Inc {
                    vol: vol.clone(),
                    store: store.clone(),
                    cache: cache.clone(),
                };
                *g = Some(crash(&inc, mode));
            }
        })
    };
    let hooks = Hooks {
        crash: {
            let f = crash_fn.clone();
            Box::new(move || f())
        },
        env_crashed: {
            let (cache, store) = (inc.cache.clone(), inc.store.clone());
            Box::new(move || cache.is_failed() || store.is_killed())
        },
        diag: {
            let (vol, store) = (inc.vol.clone(), inc.store.clone());
            Box::new(move || {
                format!(
                    "{:?}; store {:?}; pipeline: {}",
                    vol.status(),
                    store.stats(),
                    vol.describe_pipeline()
                )
            })
        },
    };
    let ctl = Arc::new(Control::default());
    let chaos = outage.map(|long| {
        tokio::spawn(outages(
            inc.store.clone(),
            inc.vol.clone(),
            ctl.clone(),
            rng.fork(),
            long,
            stats.clone(),
        ))
    });
    let gc_watch = gc_trigger.map(|(nth, delay)| {
        tokio::spawn(crash_mid_gc_pass(
            inc.vol.clone(),
            ctl.clone(),
            crash_fn.clone(),
            nth,
            delay,
        ))
    });
    let out = workload::run(
        Target::Vol(inc.vol.clone()),
        spec,
        hist.clone(),
        ids.clone(),
        hooks,
        ctl.clone(),
    )
    .await;
    if let Some(w) = gc_watch {
        w.abort();
        if w.await.unwrap_or(false) {
            stats.add("crashes_triggered_mid_gc_pass", 1);
            notes.push("crashed by the GC-pass trigger".into());
        }
    }
    if !out.crashed {
        if !inc.cache.is_failed() {
            // Crash a little later, with uploads under way.
            let wait = rng.below(300);
            notes.push(format!("crash {wait} ms after the workload ended"));
            let_ms_pass(wait).await;
        }
        crash_fn();
    }
    inc.cache.disarm();
    note_gc(inc, stats, notes);
    ctl.stop.store(true, Ordering::SeqCst);
    if let Some(c) = chaos {
        let _ = c.await;
    }
    out.count(stats);
    let image = slot
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("crash hook ran");
    notes.push(format!(
        "run: {} issued, {} acked, crashed by {}",
        out.issued,
        out.acked,
        if out.crashed {
            "ack-count trigger"
        } else {
            "harness after the workload"
        }
    ));
    Crashed {
        rec: hist.snapshot(),
        image,
        out,
    }
}

/// Crash (as the workload's ack trigger would) `delay` after the `nth` GC pass of the
/// round is seen starting (polling every millisecond), unless the workload stops or
/// crashes first. Returns whether it crashed.
async fn crash_mid_gc_pass(
    vol: Arc<Volume>,
    ctl: Arc<Control>,
    crash: Arc<dyn Fn() + Send + Sync>,
    nth: u64,
    delay: Duration,
) -> bool {
    let (mut seen, mut was) = (0u64, false);
    let mut poll = Poller::new(Duration::from_millis(1), NO_LIMIT);
    while !ctl.stop.load(Ordering::SeqCst) && !ctl.crashed.load(Ordering::SeqCst) {
        let now = vol.status().gc_pass_in_flight;
        if now && !was {
            seen += 1;
            if seen >= nth {
                let_time_pass_async(delay).await;
                if ctl.stop.load(Ordering::SeqCst) || ctl.crashed.swap(true, Ordering::SeqCst) {
                    return false;
                }
                crash();
                ctl.stop.store(true, Ordering::SeqCst);
                return true;
            }
        }
        was = now;
        poll.tick().await;
    }
    false
}

/// What GC did in this incarnation (one round: it was opened by the previous round's
/// recovery), and whether the crash caught a pass in flight.
fn note_gc(inc: &Inc, stats: &Stats, notes: &mut Vec<String>) {
    let s = inc.vol.status();
    let passes = inc.vol.stats().gc_passes.load(Ordering::Relaxed);
    let moved = inc.vol.stats().gc_moved_bytes.load(Ordering::Relaxed);
    stats.add("gc_passes", passes);
    stats.add("batches_split_by_heat", s.batches_split);
    stats.add("gc_moved_kib", moved >> 10);
    stats.add("gc_superseded_kib", s.gc_superseded_bytes >> 10);
    stats.add("rounds_with_gc_pass", u64::from(passes > 0));
    stats.add("crashes_mid_gc_pass", u64::from(s.gc_pass_in_flight));
    notes.push(format!(
        "GC in this incarnation: {passes} passes, {moved} bytes moved, {} superseded by client writes; a pass in flight at the crash: {}; utilization {:.3}",
        s.gc_superseded_bytes, s.gc_pass_in_flight, s.utilization
    ));
}

async fn read_state(vol: &Arc<Volume>, nblocks: u64) -> io::Result<Vec<Seen>> {
    Target::Vol(vol.clone()).read_all(nblocks).await
}

/// Judge `seen` and turn violations into an error.
fn judge(
    rec: &Record,
    seen: &[Seen],
    rule: Rule,
    out: &RunOutcome,
    stats: &Stats,
    label: &str,
) -> Result<(), String> {
    let what = format!("{label}: rule {rule:?} violated in the round");
    checker::judge(rec, seen, rule, Vec::new(), &out.hangs, stats, &what)
}

/// The newest record the remaining objects hold, as recovery will compute it: the
/// maximum `last_record_seq` of the newest checkpoint and the objects after it. Not
/// just the newest object's: a GC object carries the store's last applied record when
/// its pass was planned, which can be older than that of client objects numbered
/// before it but still uploading then (a false "strict mode must refuse" otherwise,
/// seen in a store_faults episode once GC ran more often). And a batch split into
/// parts counts only when its last part remains: deleting that part strands the
/// earlier ones (a CI run once expected records through 428 where recovery, rightly,
/// found the store ending at 421 because object 437 closed the batch 436 opened).
async fn store_last_record(store: &DynStore) -> io::Result<u64> {
    let objs = objects(store).await?;
    let mut headers = Vec::new();
    for (_, key) in objs.iter().rev() {
        let bytes = store.get(key).await.map_err(io::Error::other)?;
        let h = decode_object_header(&bytes).map_err(|e| io::Error::other(e.to_string()))?;
        let is_checkpoint = h.kind == ObjectKind::Checkpoint;
        headers.push(h);
        if is_checkpoint {
            break;
        }
    }
    let mut last = 0;
    let mut parts = PartGroup::default();
    for h in headers.into_iter().rev() {
        match parts.push(h) {
            Ok(applied) => {
                for a in applied {
                    last = last.max(a.last_record_seq);
                }
            }
            Err(_) => break,
        }
    }
    Ok(last)
}

/// One episode: a volume lives through `rounds` crashes of `kind`.
pub async fn episode(kind: Kind, seed: u64, rounds: u32, stats: Arc<Stats>) -> Result<(), Failure> {
    let mut rng = Rng::new(seed);
    let mut tmp = TempDir::new("inproc");
    let nblocks: u64 = *rng.pick(&[2048, 4096, 8192]);
    let use_fs = kind == Kind::StoreFaults && rng.chance(0.3);
    let base: DynStore = if *crate::common::test_store() == crate::common::TestStore::Chain {
        // LSVD_TEST_STORE=chain: a mirrored chain of small drives.
        lsvd_store::open_store(&crate::common::store_url_for(&tmp.path().join("store")))
            .map_err(|e| Failure::new(0, format!("setup: {e}")))?
    } else if use_fs {
        Arc::new(
            FsStore::open(&tmp.path().join("store")).map_err(|e| Failure::new(0, e.to_string()))?,
        )
    } else {
        Arc::new(MemStore::new())
    };
    let fail0 = |e: io::Error| Failure::new(0, format!("setup: {e}"));
    lsvd_engine::create_volume(&base, NAME, nblocks * BLOCK as u64)
        .await
        .map_err(|e| fail0(e.into()))?;
    let config = random_config(&mut rng, kind);
    let plan = fault_plan(kind, &mut rng);
    let ctx = format!(
        "volume {} MiB on {} store, {config:?}, store faults {plan:?}",
        (nblocks * BLOCK as u64) >> 20,
        if use_fs { "fs" } else { "mem" }
    );
    let (mut inc, _) = open(
        &base,
        plan,
        rng.next_u64(),
        FaultyCache::new(LOG_BYTES),
        &config,
    )
    .await
    .map_err(fail0)?;
    let ids = Arc::new(AtomicU64::new(1));
    let mut contents = vec![Content::Zero; nblocks as usize];
    // Snapshots taken at round starts, with what each must read back at the end.
    let mut snapshots: Vec<(String, Vec<Content>)> = Vec::new();
    for round in 0..rounds {
        let mut notes = Vec::new();
        // A third of the rounds start with a snapshot of the idle volume (its contents
        // are the round's base); it must live through every later crash, recovery and
        // GC pass unchanged. Not under store faults, which delete objects on purpose.
        if kind != Kind::StoreFaults && rng.chance(0.35) {
            let name = format!("r{round}");
            match inc.vol.create_snapshot(&name).await {
                Ok(_) => {
                    stats.add("snapshots_taken", 1);
                    snapshots.push((name, contents.clone()));
                }
                Err(e) => {
                    return Err(Failure::new(
                        round,
                        format!("{ctx}\ntaking snapshot {name} of the idle volume failed: {e}"),
                    ));
                }
            }
        }
        let mut state = Round {
            base: &base,
            plan,
            config: &config,
            rng: &mut rng,
            nblocks,
            inc: &mut inc,
            contents: &mut contents,
            ids: &ids,
            stats: &stats,
            notes: &mut notes,
        };
        let r = match kind {
            Kind::PowerLoss => power_loss_round(&mut state).await,
            Kind::CacheLost => cache_lost_round(&mut state).await,
            Kind::StoreFaults => store_faults_round(&mut state).await,
            Kind::RecoveryCrash => recovery_crash_round(&mut state).await,
        };
        stats.add("crash_points", 1);
        if let Err(what) = r {
            tmp.keep = use_fs;
            return Err(Failure::new(
                round,
                format!("{ctx}\nround notes:\n  {}\n{what}", notes.join("\n  ")),
            ));
        }
    }
    // The end: a clean shutdown, and a reopen that finds exactly the same disk.
    let fail_end = |what: String| {
        Failure::new(
            rounds.saturating_sub(1),
            format!("{ctx}\nafter the last round: {what}"),
        )
    };
    inc.vol
        .shutdown()
        .await
        .map_err(|e| fail_end(format!("clean shutdown failed: {e}")))?;
    let image = inc.cache.process_crash();
    inc.store.kill();
    drop(inc);
    let (inc, rep) = open(
        &base,
        FaultPlan::default(),
        1,
        FaultyCache::from_image(image),
        &config,
    )
    .await
    .map_err(|e| fail_end(format!("reopen after a clean shutdown failed: {e}")))?;
    if rep.log_records_replayed > 0 || !rep.checkpoint_clean {
        stats.add("clean_shutdown_not_marked_clean", 1);
    }
    let seen = read_state(&inc.vol, nblocks)
        .await
        .map_err(|e| fail_end(format!("read after clean reopen: {e}")))?;
    let now = checker::contents(&seen);
    if now.as_deref() != Some(&contents[..]) {
        return Err(fail_end(format!(
            "a clean shutdown and reopen changed the disk:\n  {}",
            content_diff(&seen, &contents).join("\n  ")
        )));
    }
    check_snapshots(
        &base, &inc.vol, &snapshots, &contents, nblocks, &config, &tmp, &stats,
    )
    .await
    .map_err(fail_end)?;
    inc.vol
        .shutdown()
        .await
        .map_err(|e| fail_end(format!("second clean shutdown failed: {e}")))?;
    Ok(())
}

/// The first ten blocks where `seen` differs from `expected`, one line each.
fn content_diff(seen: &[Seen], expected: &[Content]) -> Vec<String> {
    seen.iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (s, c))| match (s, c) {
            (Seen::Zero, Content::Zero) => false,
            (Seen::Write(a), Content::Write(b)) => a != b,
            _ => true,
        })
        .take(10)
        .map(|(b, (s, c))| format!("block {b}: {s:?}, expected {c:?}"))
        .collect()
}

/// Every snapshot reads back exactly the contents it was taken with; then each is
/// deleted, and the volume still reads `contents`.
#[allow(clippy::too_many_arguments)]
async fn check_snapshots(
    base: &DynStore,
    vol: &Arc<Volume>,
    snapshots: &[(String, Vec<Content>)],
    contents: &[Content],
    nblocks: u64,
    config: &EngineConfig,
    tmp: &TempDir,
    stats: &Stats,
) -> Result<(), String> {
    for (name, expected) in snapshots {
        let (snap, _) =
            lsvd_engine::open_snapshot(base.clone(), NAME, name, tmp.path(), config.clone())
                .await
                .map_err(|e| format!("opening snapshot {name} failed: {e}"))?;
        let seen = read_state(&snap, nblocks)
            .await
            .map_err(|e| format!("reading snapshot {name} failed: {e}"))?;
        let _ = snap.shutdown().await;
        if checker::contents(&seen).as_deref() != Some(&expected[..]) {
            return Err(format!(
                "snapshot {name} changed after the crashes that followed it:\n  {}",
                content_diff(&seen, expected).join("\n  ")
            ));
        }
        stats.add("snapshots_verified", 1);
    }
    for (name, _) in snapshots {
        vol.delete_snapshot(name)
            .await
            .map_err(|e| format!("deleting snapshot {name} failed: {e}"))?;
    }
    if !snapshots.is_empty() {
        let seen = read_state(vol, nblocks)
            .await
            .map_err(|e| format!("read after deleting the snapshots: {e}"))?;
        if checker::contents(&seen).as_deref() != Some(contents) {
            return Err("deleting the snapshots changed the volume".to_string());
        }
    }
    Ok(())
}

/// What every round of an episode works on: the episode's store, fault plan and
/// engine configuration, its random source, and the incarnation and contents that a
/// round replaces with the ones it recovers (one struct, so the round functions and
/// their helpers do not each take ten arguments).
struct Round<'a> {
    base: &'a DynStore,
    plan: FaultPlan,
    config: &'a EngineConfig,
    rng: &'a mut Rng,
    nblocks: u64,
    inc: &'a mut Inc,
    contents: &'a mut Vec<Content>,
    ids: &'a Arc<AtomicU64>,
    stats: &'a Arc<Stats>,
    notes: &'a mut Vec<String>,
}

impl Round<'_> {
    /// Fails the round unless the store catches up with the write log within 60 s: a
    /// round that may lose the cache needs the base contents in the store.
    async fn wait_store_caught_up(&self) -> Result<(), String> {
        if wait_drained(&self.inc.vol, Duration::from_secs(60)).await {
            return Ok(());
        }
        Err(format!(
            "the store did not catch up with the write log within 60 s before the round: {:?}",
            self.inc.vol.status()
        ))
    }

    /// [`drive`] on this round's incarnation: run a workload, then crash.
    async fn drive(
        &mut self,
        barriers: u32,
        mode: CrashMode,
        arm_after_ios: Option<u64>,
        outage: Option<bool>,
    ) -> Crashed {
        drive(
            self.inc,
            self.rng,
            self.nblocks,
            self.contents,
            self.ids,
            barriers,
            mode,
            arm_after_ios,
            outage,
            self.stats,
            self.notes,
        )
        .await
    }

    /// Note what an open recovered and count it.
    fn count_recovery(&mut self, label: &str, rep: &OpenReport) {
        self.notes.push(format!("{label}: {rep:?}"));
        self.stats
            .add("log_records_replayed", rep.log_records_replayed);
        self.stats
            .add("log_records_from_index", rep.log_records_from_index);
        self.stats.add("objects_replayed", rep.objects_replayed);
        self.stats
            .add("stranded_deleted", rep.stranded_deleted.len() as u64);
    }

    /// Open `store` (the round's, or a copy of it) on `cache`, read everything, judge
    /// by `rule`: the new incarnation and what it read.
    async fn recover(
        &mut self,
        store: &DynStore,
        cache: Arc<FaultyCache>,
        crashed: &Crashed,
        rule: Rule,
        label: &str,
    ) -> Result<(Inc, Vec<Seen>), String> {
        let (inc, rep) = open(store, self.plan, self.rng.next_u64(), cache, self.config)
            .await
            .map_err(|e| format!("{label}: recovery failed: {e}"))?;
        self.count_recovery(label, &rep);
        let seen = read_state(&inc.vol, self.nblocks)
            .await
            .map_err(|e| format!("{label}: reading the recovered disk failed: {e}"))?;
        if let Err(what) = judge(&crashed.rec, &seen, rule, &crashed.out, self.stats, label) {
            return Err(with_forensics(what, &crashed.image, store).await);
        }
        Ok((inc, seen))
    }

    /// The recovered incarnation and what it read become the next round's base.
    fn advance(&mut self, new: Inc, seen: &[Seen]) -> Result<(), String> {
        *self.inc = new;
        *self.contents = next_base(seen)?;
        Ok(())
    }
}

/// Add what the crash image and the store hold for the first blocks named.
async fn with_forensics(what: String, image: &[u8], store: &DynStore) -> String {
    let blocks = super::forensics::blocks_in(&what, 3);
    if blocks.is_empty() {
        return what;
    }
    let f = super::forensics::explain(image, store, NAME, &blocks).await;
    let anomalies = super::forensics::take_write_anomalies();
    format!(
        "{what}\n  forensics (crash image and store now; stale log records included):\n    {f}\n  records written with wrong data (this process): {}",
        if anomalies.is_empty() {
            "none".to_string()
        } else {
            anomalies.join("\n")
        }
    )
}

fn next_base(seen: &[Seen]) -> Result<Vec<Content>, String> {
    checker::contents(seen).ok_or_else(|| "garbage in a checked state".to_string())
}

fn crash_mode(rng: &mut Rng, p_power: f64) -> CrashMode {
    if rng.chance(p_power) {
        CrashMode::Power(rng.next_u64())
    } else {
        CrashMode::Process
    }
}

async fn power_loss_round(r: &mut Round<'_>) -> Result<(), String> {
    let mode = crash_mode(r.rng, 0.9);
    let arm = r.rng.chance(0.3).then(|| r.rng.range(1, 3000));
    r.notes.push(format!("crash mode {mode:?}"));
    let crashed = r.drive(0, mode, arm, None).await;
    let cache = FaultyCache::from_image(crashed.image.clone());
    let (new, seen) = r
        .recover(r.base, cache, &crashed, Rule::CacheIntact, "cache intact")
        .await?;
    r.advance(new, &seen)
}

async fn cache_lost_round(r: &mut Round<'_>) -> Result<(), String> {
    r.wait_store_caught_up().await?;
    let mode = crash_mode(r.rng, 0.5);
    r.notes.push(format!(
        "crash mode {mode:?}, then the cache device is lost"
    ));
    let barriers = r.rng.range(1, 3) as u32;
    let crashed = r.drive(barriers, mode, None, None).await;
    let cache = FaultyCache::new(LOG_BYTES);
    let (new, seen) = r
        .recover(r.base, cache, &crashed, Rule::CacheLost, "cache lost")
        .await?;
    r.advance(new, &seen)
}

async fn store_faults_round(r: &mut Round<'_>) -> Result<(), String> {
    let Round {
        base,
        plan,
        config,
        nblocks,
        stats,
        ..
    } = *r;
    // The store must hold the base contents, so the cache-lost judgement can use it.
    r.wait_store_caught_up().await?;
    let n0 = objects(base)
        .await
        .map_err(|e| format!("listing: {e}"))?
        .last()
        .map_or(0, |o| o.0);
    let mode = crash_mode(r.rng, 0.3);
    let long = r.rng.chance(0.25);
    let barriers = r.rng.range(0, 2) as u32;
    r.notes.push(format!(
        "crash mode {mode:?}, long outage {long}, newest object before the round {n0}"
    ));
    let crashed = r.drive(barriers, mode, None, Some(long)).await;

    // A lost newest object: an upload that "never landed", chosen among this round's.
    let mut lost = false;
    let mut expect_refusal = false;
    if r.rng.chance(0.3) {
        let objs = objects(base).await.map_err(|e| format!("listing: {e}"))?;
        // Only objects after the newest checkpoint: those are uploads the engine may
        // not have seen land. (A lost checkpoint after GC deleted its victims is data
        // loss no design can undo.)
        let newest_ckpt = objs
            .iter()
            .filter(|o| parse_object_name(&o.1).is_some_and(|n| n.kind == ObjectKind::Checkpoint))
            .map(|o| o.0)
            .max()
            .unwrap_or(0);
        let newer: Vec<&(u64, String)> = objs
            .iter()
            .filter(|o| o.0 > n0 && o.0 > newest_ckpt)
            .collect();
        if !newer.is_empty() {
            let k = r.rng.range(1, newer.len().min(3) as u64) as usize;
            let gone: Vec<u64> = newer.iter().rev().take(k).map(|o| o.0).collect();
            for (_, key) in newer.iter().rev().take(k) {
                base.delete(key).await.map_err(|e| format!("delete: {e}"))?;
            }
            // In a world where those uploads never landed, no volume superblock
            // generation vouching for them was ever written either: remove those too,
            // or recovery rightly reports the store as having lost acknowledged data.
            let first_gone = gone.iter().copied().min().unwrap_or(u64::MAX);
            let supers = base
                .list(&super_prefix("v"))
                .await
                .map_err(|e| format!("listing superblocks: {e}"))?;
            for e in supers {
                let bytes = base.get(&e.key).await.map_err(|e| format!("get: {e}"))?;
                let vouches = decode_volume_super(&bytes).is_ok_and(|sb| {
                    sb.durable_through > first_gone
                        || sb.newest_checkpoint.is_some_and(|c| c >= first_gone)
                });
                if vouches {
                    base.delete(&e.key)
                        .await
                        .map_err(|e| format!("delete: {e}"))?;
                    stats.add("superblocks_removed_with_lost_objects", 1);
                }
            }
            lost = true;
            let last = store_last_record(base)
                .await
                .map_err(|e| format!("reading the newest object: {e}"))?;
            let sb = newest_cache_super(
                &crashed.image[..CACHE_SUPER_BYTES],
                &crashed.image[CACHE_SUPER_BYTES..2 * CACHE_SUPER_BYTES],
            )
            .ok();
            expect_refusal = sb.is_some_and(|sb| sb.tail_seq > last + 1);
            stats.add("lost_newest_objects", gone.len() as u64);
            r.notes.push(format!(
                "deleted newest objects {gone:?}; store now ends at record {last}; cache tail {:?}; strict mode must refuse: {expect_refusal}",
                sb.map(|s| s.tail_seq)
            ));
        }
    }

    // (b) cache lost too: a copy of the store, a fresh cache.
    let copy = copy_store(base)
        .await
        .map_err(|e| format!("copying the store: {e}"))?;
    let rule_b = if lost {
        Rule::PrefixOnly
    } else {
        Rule::CacheLost
    };
    let cache = FaultyCache::new(LOG_BYTES);
    let (b_inc, _) = r
        .recover(&copy, cache, &crashed, rule_b, "cache also lost")
        .await?;
    b_inc.store.kill();
    b_inc.vol.crash();
    drop(b_inc);

    // (a) cache intact.
    let cache = FaultyCache::from_image(crashed.image.clone());
    let strict = open(base, plan, r.rng.next_u64(), cache.clone(), config).await;
    let (new, rule) = match strict {
        Ok((new, rep)) => {
            r.count_recovery("cache intact", &rep);
            if expect_refusal {
                return Err(format!(
                    "strict mode opened although records the write log had released are missing from the store ({rep:?})"
                ));
            }
            (new, Rule::CacheIntact)
        }
        Err(e) if expect_refusal => {
            stats.add("strict_refusals_as_expected", 1);
            r.notes.push(format!("strict refused as it must: {e}"));
            let mut accept = config.clone();
            accept.recovery_mode = RecoveryMode::AcceptPrefix;
            let (new, rep) = open(
                base,
                plan,
                r.rng.next_u64(),
                FaultyCache::from_image(crashed.image.clone()),
                &accept,
            )
            .await
            .map_err(|e| format!("accept-prefix recovery failed: {e}"))?;
            r.notes.push(format!("accept-prefix: {rep:?}"));
            (new, Rule::PrefixOnly)
        }
        Err(e) => return Err(format!("cache intact: recovery failed: {e}")),
    };
    let seen = read_state(&new.vol, nblocks)
        .await
        .map_err(|e| format!("reading the recovered disk failed: {e}"))?;
    if let Err(what) = judge(
        &crashed.rec,
        &seen,
        rule,
        &crashed.out,
        stats,
        "cache intact",
    ) {
        return Err(with_forensics(what, &crashed.image, base).await);
    }
    r.advance(new, &seen)
}

async fn recovery_crash_round(r: &mut Round<'_>) -> Result<(), String> {
    let cache_lost = r.rng.chance(0.3);
    if cache_lost {
        r.wait_store_caught_up().await?;
    }
    let mode = crash_mode(r.rng, 0.6);
    r.notes
        .push(format!("crash mode {mode:?}, cache lost {cache_lost}"));
    let barriers = if cache_lost {
        r.rng.range(1, 2) as u32
    } else {
        0
    };
    let crashed = r.drive(barriers, mode, None, None).await;
    let rule = if cache_lost {
        Rule::CacheLost
    } else {
        Rule::CacheIntact
    };

    // First recovery, crashed at a chosen device I/O, store mutation, or moment.
    let cache2 = if cache_lost {
        FaultyCache::new(LOG_BYTES)
    } else {
        FaultyCache::from_image(crashed.image.clone())
    };
    if r.rng.chance(0.5) {
        let at = cache2.ios() + r.rng.range(1, 8);
        cache2.arm_power_fail(at, r.rng.next_u64());
        r.notes
            .push(format!("recovery 1: power fails at device I/O #{at}"));
    }
    let store2 = Arc::new(FaultyStore::new(r.base.clone(), r.plan, r.rng.next_u64()));
    if r.rng.chance(0.4) {
        let n = r.rng.range(1, 5);
        store2.kill_after_mutations(n);
        r.notes
            .push(format!("recovery 1: store client dies at mutation {n}"));
    }
    let mode2 = crash_mode(r.rng, 0.5);
    let mut before: Option<Vec<Seen>> = None;
    match open_with(store2.clone(), cache2.clone(), r.config).await {
        Ok((vol2, rep)) => {
            r.notes.push(format!("recovery 1: {rep:?}"));
            let inc2 = Inc {
                vol: vol2,
                store: store2.clone(),
                cache: cache2.clone(),
            };
            if r.rng.chance(0.3) {
                // Read it all first: recovery 2 must then find exactly this.
                if let Ok(seen) = read_state(&inc2.vol, r.nblocks).await
                    && !cache2.is_failed()
                    && !store2.is_killed()
                {
                    judge(
                        &crashed.rec,
                        &seen,
                        rule,
                        &crashed.out,
                        r.stats,
                        "recovery 1",
                    )?;
                    before = Some(seen);
                }
            }
            let wait = *r.rng.pick(&[0, 0, 1, 5, 20, 100, 400]);
            r.notes
                .push(format!("recovery 1 crashed after {wait} ms ({mode2:?})"));
            if wait > 0 {
                let_ms_pass(wait).await;
            }
            let image2 = crash(&inc2, mode2);
            cache2.fail();
            drop(inc2);
            r.stats.add("recoveries_crashed_after_open", 1);
            finish_second(r, image2, cache_lost, &crashed, rule, before).await
        }
        Err(e) => {
            if !cache2.is_failed() && !store2.is_killed() {
                return Err(format!("recovery 1 failed without an injected fault: {e}"));
            }
            r.notes.push(format!("recovery 1 crashed inside open: {e}"));
            r.stats.add("recoveries_crashed_inside_open", 1);
            store2.kill();
            let image2 = match cache2.take_failure() {
                Some((img, _)) => img,
                None => match mode2 {
                    CrashMode::Process => cache2.process_crash(),
                    CrashMode::Power(s) => cache2.power_fail(s).0,
                },
            };
            finish_second(r, image2, cache_lost, &crashed, rule, before).await
        }
    }
}

async fn finish_second(
    r: &mut Round<'_>,
    image2: Vec<u8>,
    cache_lost: bool,
    crashed: &Crashed,
    rule: Rule,
    before: Option<Vec<Seen>>,
) -> Result<(), String> {
    // With the cache lost, recovery 1 ran on a new (empty) device; recovery 2 gets what
    // recovery 1 left on it, or yet another new device.
    let cache3 = if cache_lost && r.rng.chance(0.5) {
        r.notes
            .push("recovery 2 on another new cache device".into());
        FaultyCache::new(LOG_BYTES)
    } else {
        FaultyCache::from_image(image2)
    };
    let (new, seen) = r
        .recover(r.base, cache3, crashed, rule, "recovery 2")
        .await?;
    if let Some(b) = before {
        let diff: Vec<String> = b
            .iter()
            .zip(&seen)
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .take(10)
            .map(|(i, (x, y))| format!("block {i}: recovery 1 read {x:?}, recovery 2 read {y:?}"))
            .collect();
        if !diff.is_empty() {
            return Err(format!(
                "recovery is not repeatable: a crash during recovery changed the recovered disk:\n  {}",
                diff.join("\n  ")
            ));
        }
        r.stats.add("repeatable_recovery_compared", 1);
    }
    r.advance(new, &seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_core::format::VolumeId;
    use lsvd_core::format::object::{ObjectSpec, encode_object};
    use lsvd_engine::keys::object_key;

    async fn put(store: &DynStore, seq: u64, kind: ObjectKind, last: u64, parts_after: u32) {
        let spec = ObjectSpec {
            kind,
            volume: VolumeId([7; 16]),
            seq,
            last_record_seq: last,
            extents: &[],
            trims: &[],
            volume_size_bytes: None,
            parts_after,
            epoch: 1,
            first_record_seq: last + 1,
        };
        store
            .put(
                &object_key(NAME, seq, 1, kind),
                encode_object(&spec, &[]).into(),
                PutMode::Overwrite,
            )
            .await
            .expect("put into a memory store");
    }

    /// The oracle's prediction of where the store ends must follow recovery's
    /// all-or-none rule for split batches: a store_faults episode in CI deleted the
    /// last part of a batch and expected recovery to find the first part's records.
    #[tokio::test]
    async fn store_last_record_counts_a_split_batch_only_whole() {
        let store: DynStore = Arc::new(MemStore::new());
        put(&store, 10, ObjectKind::Checkpoint, 20, 0).await;
        put(&store, 11, ObjectKind::Data, 21, 0).await;
        put(&store, 12, ObjectKind::Data, 25, 1).await;
        assert_eq!(store_last_record(&store).await.expect("reads"), 21);
        put(&store, 13, ObjectKind::Data, 25, 0).await;
        assert_eq!(store_last_record(&store).await.expect("reads"), 25);
    }
}
