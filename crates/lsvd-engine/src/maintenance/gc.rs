//! The garbage collector of a live volume: the I/O of a GC pass.
//!
//! When a pass may run and over which victims is the pipeline's decision
//! (`Pipeline::gc_plan`: utilization below the start threshold, with hysteresis; one
//! pass at a time; with no GC headroom, none while more than `gc_max_backlog` objects
//! wait for upload). This task does the
//! pass's I/O: it plans the pass from the victims' own headers (`lsvd_core::gc_plan`),
//! reads their live extents (from the read cache where clients read them recently,
//! the rest with verified ranged GETs), lays them out in LBA order
//! into GC objects (apart from client data), and hands them to the pipeline, which
//! numbers them, queues them in sequence order with a checkpoint after them, and ends
//! the pass when that checkpoint is finished (the victims hold no live data once the GC
//! objects are applied; the checkpoint leaves them out and they are deleted).
//!
//! Pacing: at most `pass_bytes` moved per pass, and within a pass GC reads its victims
//! in ranged GETs of at most 1 MiB at a bounded rate ([`Pacer`]):
//! `EngineConfig::gc_min_rate_bytes` per second, or four times the rate clients are
//! writing if that is more, with each pass's checkpoint counted too (a GET also reads
//! the dead bytes between nearby live extents, so GC moves less than it reads). So GC
//! works steadily in the background instead of in bursts that hold up client I/O.
//! With a GC headroom (`EngineConfig::gc_headroom_bytes`, `--gc-headroom`: `lsvd serve`
//! defaults to a quarter of the write log's size, `EngineConfig::default()` to none) the client share is scaled by how much of the
//! headroom the store uses (`Pipeline::gc_headroom_used`): a burst of writes spends
//! the headroom while GC keeps to the minimum rate, and GC speeds up only as the
//! headroom runs out.
//! Measured on 4 KiB random writes after a 1 GiB fill: 81k IOPS without a headroom,
//! 91k with one (medians of 3, docs/ARCHITECTURE.md, "Why these choices"); and
//! victims left longer hold less live data, so GC moves fewer bytes.
//! Once clients have neither read nor written for [`IDLE_AFTER`], there is no client
//! I/O to protect and GC runs unpaced, until the next client request: after a burst
//! of overwrites, the client writes GC holds back (below) reach the store in seconds
//! rather than at the minimum rate (minutes for a few GiB).
//! Where cleaning needs more than that, the pipeline's back-pressure (closed client
//! batches held, unnumbered, while the store would grow past live/gc-start plus one
//! batch) slows clients to what GC cleans: the store holds at most live/gc-start + one
//! batch + one GC pass, however fast clients write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{ObjectKind, ObjectSpec, object_header_len};
use lsvd_core::gc::{HeatClass, Relocation, gc_object_extents, group_relocations_by_class};
use lsvd_core::gc_plan::{HolePlugger, in_lba_order, live_extents_of_object};
use lsvd_core::live_rates::LiveWriteRates;

use crate::read;
use crate::shared::{ObjectTag, Shared};
use crate::write::seal::seal_object;
use lsvd_store::clock::{SharedClock, timeout};
use lsvd_store::direct_buf::DirectBuf;

/// Live extents of one victim closer than this are fetched with one GET.
const RUN_GAP_BYTES: u64 = 256 << 10;

/// GC looks up this many of a victim's extents at a time under the state lock (a
/// fraction of a millisecond on a volume of random 4 KiB writes).
const PLAN_EXTENTS: usize = 2048;

/// Under hylog, the live data's write rates are measured over this many sectors (16
/// MiB of the volume) at a time: a few thousand map extents, a fraction of a
/// millisecond of holding the state lock.
const RATE_SLICE_SECTORS: u64 = (16 << 20) / SECTOR_BYTES;

/// Largest ranged GET of a victim (a run of live extents is split there; an extent
/// larger than this is read whole).
const MAX_GET_BYTES: u64 = 1 << 20;

/// GC may move this many bytes per byte clients write (over [`RATE_WINDOW`]), if that
/// is more than the configured minimum rate.
const CLIENT_SHARE: f64 = 4.0;

/// The client write rate is measured over this window.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Clients that have neither read nor written for this long are idle, and GC is not
/// paced while they stay so.
const IDLE_AFTER: Duration = Duration::from_secs(2);

/// What clients have read and written so far (the volume's counters): the pacer
/// follows the write rate, and sees from both whether clients are idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientIo {
    pub(crate) written_bytes: u64,
    pub(crate) read_bytes: u64,
}

impl ClientIo {
    fn of(shared: &Shared) -> ClientIo {
        ClientIo {
            written_bytes: shared.stats.client_write_bytes.load(Ordering::Relaxed),
            read_bytes: shared.stats.client_read_bytes.load(Ordering::Relaxed),
        }
    }
}

/// The rate limiter of GC I/O: a token bucket refilled at
/// `max(min_rate, CLIENT_SHARE x client write rate x headroom used)` bytes per second
/// (the headroom used is 1 without a headroom), holding at most
/// a quarter second of that (and at least one GET); no limit while clients are idle.
pub(crate) struct Pacer {
    min_rate: f64,
    tokens: f64,
    clock: SharedClock,
    last: Duration,
    /// (time, client bytes written so far), over the last [`RATE_WINDOW`].
    samples: std::collections::VecDeque<(Duration, u64)>,
    /// The client I/O last seen, and when it was first seen at that value.
    seen: Option<(ClientIo, Duration)>,
}

impl Pacer {
    /// `min_rate` bytes per second; 0 disables pacing.
    pub(crate) fn new(min_rate: u64, clock: SharedClock) -> Pacer {
        Pacer {
            min_rate: min_rate as f64,
            tokens: 0.0,
            last: clock.now(),
            clock,
            samples: Default::default(),
            seen: None,
        }
    }

    /// Whether clients have done no I/O for [`IDLE_AFTER`], given their counters now.
    fn clients_idle(&mut self, client: ClientIo, now: Duration) -> bool {
        match self.seen {
            Some((seen, since)) if seen == client => now.saturating_sub(since) >= IDLE_AFTER,
            _ => {
                self.seen = Some((client, now));
                false
            }
        }
    }

    /// Bytes per second GC may use now, given the client bytes written so far and how
    /// much of its headroom the store has used (`Pipeline::gc_headroom_used`; 1 when
    /// there is none).
    pub(crate) fn rate(&mut self, client_bytes: u64, headroom_used: f64) -> f64 {
        let now = self.clock.now();
        self.samples.push_back((now, client_bytes));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
        let client = match self.samples.front() {
            Some(&(t, b)) if now.saturating_sub(t) >= Duration::from_millis(100) => {
                client_bytes.saturating_sub(b) as f64 / now.saturating_sub(t).as_secs_f64()
            }
            _ => 0.0,
        };
        self.min_rate.max(CLIENT_SHARE * client * headroom_used)
    }

    /// Account for `bytes` of GC I/O, sleeping as long as the rate requires (in steps,
    /// returning false at once if `stop` says so). While clients are idle nothing is
    /// counted and nothing waits; the bucket starts empty when they come back.
    pub(crate) async fn take(
        &mut self,
        bytes: u64,
        client: ClientIo,
        headroom_used: f64,
        stop: impl Fn() -> bool,
    ) -> bool {
        if self.min_rate <= 0.0 {
            return true;
        }
        let rate = self.rate(client.written_bytes, headroom_used);
        let now = self.clock.now();
        if self.clients_idle(client, now) {
            self.tokens = 0.0;
            self.last = now;
            return true;
        }
        let cap = (rate / 4.0).max(MAX_GET_BYTES as f64);
        self.tokens = (self.tokens + now.saturating_sub(self.last).as_secs_f64() * rate).min(cap)
            - bytes as f64;
        self.last = now;
        if self.tokens >= 0.0 {
            return true;
        }
        let mut wait = Duration::from_secs_f64(-self.tokens / rate);
        while !wait.is_zero() {
            if stop() {
                return false;
            }
            let step = wait.min(Duration::from_millis(100));
            self.clock.sleep(step).await;
            wait -= step;
        }
        true
    }
}

/// Account for `bytes` of GC I/O with the pacer, given the volume's client I/O and how
/// much of the GC headroom the store uses now; false if GC must stop meanwhile.
async fn pace(shared: &Shared, pacer: &mut Pacer, bytes: u64) -> bool {
    let headroom_used = shared.lock().pipeline.gc_headroom_used();
    pacer
        .take(bytes, ClientIo::of(shared), headroom_used, || {
            stopping(shared)
        })
        .await
}

/// GC must stop: writes have stopped or the volume failed.
fn stopping(shared: &Shared) -> bool {
    shared.is_failed() || shared.lock().pipeline.writes_stopped()
}

pub(crate) async fn run(shared: Arc<Shared>) {
    let cfg = shared.config.gc;
    if !cfg.enabled() {
        return;
    }
    let mut pacer = Pacer::new(shared.config.gc_min_rate_bytes, shared.config.clock.clone());
    // Passes given up in a row (the store away, say): a line for the first and every
    // 20th, and a wait that doubles from 1 s up to 8 s between them.
    let mut failed_in_a_row = 0u32;
    loop {
        let _ = timeout(
            shared.clock(),
            Duration::from_secs(1),
            shared.gc_wake.notified(),
        )
        .await;
        shared.stats.gc_wakeups.fetch_add(1, Ordering::Relaxed);
        shared.panic_point("gc");
        tokio::task::coop::consume_budget().await;
        let rates = write_rates(&shared).await;
        let (victims, kinds) = {
            let mut st = shared.lock();
            if st.pipeline.writes_stopped() || shared.is_failed() {
                return;
            }
            let Some(pass) = st.pipeline.gc_plan_with_rates(rates.as_ref()) else {
                continue;
            };
            let store = st.pipeline.store();
            let kinds: BTreeMap<u64, (ObjectTag, u64)> = pass
                .victims
                .iter()
                .map(|v| {
                    let o = &store.objects()[v];
                    (*v, (ObjectTag::of(o), u64::from(o.header_bytes)))
                })
                .collect();
            (pass.victims, kinds)
        };
        match pass(&shared, &victims, kinds, &mut pacer).await {
            // Writes stopped (or the volume failed) during the pass: nothing queued.
            Ok(None) => shared.lock().pipeline.gc_abandon(),
            Ok(Some(moved)) => {
                if failed_in_a_row > 0 {
                    lsvd_store::log::info(&format!(
                        "gc: a pass completed after {failed_in_a_row} failed"
                    ));
                    failed_in_a_row = 0;
                }
                shared.stats.gc_passes.fetch_add(1, Ordering::Relaxed);
                shared
                    .stats
                    .gc_moved_bytes
                    .fetch_add(moved, Ordering::Relaxed);
                lsvd_store::log::debug(&format!(
                    "gc: pass over {} objects moved {moved} bytes",
                    victims.len()
                ));
                // The pass's checkpoint counts too: about 32 bytes per map extent and
                // object.
                let checkpoint = {
                    let st = shared.lock();
                    let store = st.pipeline.store();
                    32 * (store.map().extent_count() + store.objects().len()) as u64
                };
                pace(&shared, &mut pacer, checkpoint).await;
            }
            Err(e) => {
                failed_in_a_row = failed_in_a_row.saturating_add(1);
                if failed_in_a_row == 1 || failed_in_a_row.is_multiple_of(20) {
                    lsvd_store::log::warn(&format!(
                        "gc pass failed ({failed_in_a_row} in a row), will retry: {e}"
                    ));
                }
                shared
                    .stats
                    .gc_passes_failed
                    .fetch_add(1, Ordering::Relaxed);
                shared.lock().pipeline.gc_abandon();
                let wait = Duration::from_secs(1 << (failed_in_a_row - 1).min(3));
                shared.clock().sleep(wait).await;
            }
        }
    }
}

/// One pass over `victims`: plan its live extents, group them into GC objects, copy
/// them. Returns the bytes moved, or None if GC must stop meanwhile (nothing queued).
async fn pass(
    shared: &Arc<Shared>,
    victims: &BTreeSet<u64>,
    mut kinds: BTreeMap<u64, (ObjectTag, u64)>,
    pacer: &mut Pacer,
) -> lsvd_core::error::Result<Option<u64>> {
    let Some(mut relocations) = plan(shared, victims, &kinds, pacer).await? else {
        return Ok(None);
    };
    plug_holes(shared, &mut relocations, &mut kinds).await;
    let Some(groups) = group_off_runtime(shared, relocations).await else {
        return Ok(None);
    };
    run_pass(shared, groups, &kinds, pacer).await
}

/// Defragmenting GC (`GcConfig::defrag_hole_bytes`, off by default): the gaps of at
/// most that size between the planned relocations, where the store maps them whole
/// and the pass's budget (`GcConfig::pass_bytes`, which bounds the store) has room,
/// are relocated too (`lsvd_core::gc_plan::HolePlugger`), [`PLAN_EXTENTS`] pairs
/// at a time under the state lock. Their objects join `kinds`, for the reads.
async fn plug_holes(
    shared: &Shared,
    relocations: &mut Vec<Relocation>,
    kinds: &mut BTreeMap<u64, (ObjectTag, u64)>,
) {
    let gc = shared.config.gc;
    let Some(mut plugger) = HolePlugger::new(relocations, gc.defrag_hole_bytes, gc.pass_bytes)
    else {
        return;
    };
    let mut holes = Vec::new();
    let mut next = 1;
    while next < relocations.len() {
        let end = (next + PLAN_EXTENTS).min(relocations.len());
        {
            let st = shared.lock();
            let store = st.pipeline.store();
            let from = holes.len();
            for i in next..end {
                plugger.plug(store, &relocations[i - 1], &relocations[i], &mut holes);
            }
            for h in &holes[from..] {
                let seq = h.source.object_seq;
                if let Some(o) = store.objects().get(&seq) {
                    kinds
                        .entry(seq)
                        .or_insert((ObjectTag::of(o), u64::from(o.header_bytes)));
                }
            }
        }
        next = end;
        tokio::task::yield_now().await;
    }
    if !holes.is_empty() {
        shared.stats.gc_defrag_bytes.fetch_add(
            holes.iter().map(|h| h.sectors * SECTOR_BYTES).sum(),
            Ordering::Relaxed,
        );
        relocations.extend(holes);
        in_lba_order(relocations);
    }
}

/// The victims' live extents in LBA order, planned from their headers
/// (`lsvd_core::gc_plan`): each header comes from the header cache or a verified GET
/// (which the pass's reads of the same object then find cached), and its extents are
/// looked up in the map [`PLAN_EXTENTS`] at a time, letting go of the state lock in
/// between. That costs map lookups for the victims' extents only, where a scan of the
/// whole map costs ~260,000 steps for 1 GiB of random 4 KiB writes however little is
/// collected. A piece that is stale by the time it is applied is simply not applied
/// (GC objects apply only where the map still points at their source), and nothing
/// can start pointing into a victim. None if GC must stop meanwhile.
async fn plan(
    shared: &Shared,
    victims: &BTreeSet<u64>,
    kinds: &BTreeMap<u64, (ObjectTag, u64)>,
    pacer: &mut Pacer,
) -> lsvd_core::error::Result<Option<Vec<Relocation>>> {
    let mut relocations = Vec::new();
    for &victim in victims {
        let Some(&(tag, header_bytes)) = kinds.get(&victim) else {
            continue;
        };
        if stopping(shared) || !pace(shared, pacer, header_bytes).await {
            return Ok(None);
        }
        let header = read::header_background(shared, victim, tag).await?;
        let mut extents = header.extent_offsets().peekable();
        while extents.peek().is_some() {
            live_extents_of_object(
                shared.lock().pipeline.store(),
                victim,
                extents.by_ref().take(PLAN_EXTENTS),
                &mut relocations,
            );
            tokio::task::yield_now().await;
        }
    }
    in_lba_order(&mut relocations);
    Ok(Some(relocations))
}

/// Under hylog while it separates, when a pass is about to start: the write rate of
/// every object's live data (`lsvd_core::live_rates`, the simulator measures the
/// same), which orders the pass's victims. Measured a slice of the volume at a time,
/// letting go of the lock in between: the map may change meanwhile, which only makes
/// the ranking a little stale. None otherwise.
async fn write_rates(shared: &Shared) -> Option<LiveWriteRates> {
    if !shared.lock().pipeline.gc_wants_write_rates() {
        return None;
    }
    let volume_sectors = shared.size_bytes.load(Ordering::Acquire) / SECTOR_BYTES;
    let mut rates = LiveWriteRates::default();
    let mut lba = 0;
    while lba < volume_sectors {
        let n = RATE_SLICE_SECTORS.min(volume_sectors - lba);
        {
            let st = shared.lock();
            let heat = st.heat.as_ref()?;
            rates.add_range(st.pipeline.store(), heat, lba, n);
        }
        lba += n;
        tokio::task::yield_now().await;
    }
    Some(rates)
}

/// The pass's GC objects: its relocations grouped per heat class, coldest first
/// (`lsvd_core::gc::group_relocations_by_class`, as in the simulator). Under hylog the
/// classes are chosen from the write frequencies and the utilization, and the
/// pipeline is told (it orders the next pass's victims and splits client batches by
/// them); with any other policy there is one class.
fn group(shared: &Shared, relocations: Vec<Relocation>) -> Vec<(HeatClass, Vec<Relocation>)> {
    let object_bytes = shared.config.batch_size_bytes;
    // A copy of the counters (4 bytes per region, at most 4 MiB): the distribution is
    // sorted without the lock every client write takes.
    let (tracker, utilization) = {
        let st = shared.lock();
        let Some(tracker) = st.heat.clone() else {
            return group_relocations_by_class(&relocations, object_bytes, None);
        };
        (tracker, lsvd_core::gc::utilization(st.pipeline.store()))
    };
    let choice = lsvd_core::hylog::choose(&tracker.distribution(), utilization);
    // Built outside the lock (one byte per region); client batches are split by these
    // classes from now on (`Pipeline::set_batch_classes`).
    let classes = lsvd_core::hylog::RegionClasses::new(&choice, &tracker);
    {
        let mut st = shared.lock();
        st.pipeline.set_gc_separating(choice.separates());
        st.pipeline.set_batch_classes(classes);
    }
    shared.stats.gc_hot_fraction_ppm.store(
        (choice.hot_fraction * 1e6).round() as u64,
        Ordering::Relaxed,
    );
    group_relocations_by_class(&relocations, object_bytes, Some((&tracker, &choice)))
}

/// [`group`] on the blocking pool: under hylog, sorting up to 2^20 counters and
/// choosing the classes take milliseconds, too long for a runtime worker that also
/// serves client requests. None if that task died (the pass is given up).
async fn group_off_runtime(
    shared: &Arc<Shared>,
    relocations: Vec<Relocation>,
) -> Option<Vec<(HeatClass, Vec<Relocation>)>> {
    if !shared.config.gc.policy.tracks_heat() {
        return Some(group(shared, relocations));
    }
    let s = shared.clone();
    match tokio::task::spawn_blocking(move || group(&s, relocations)).await {
        Ok(groups) => Some(groups),
        Err(e) => {
            lsvd_store::log::warn(&format!("gc: choosing heat classes failed: {e}"));
            None
        }
    }
}

/// Read the relocated data, encode the GC objects (`groups`: one object each, with
/// its heat class), queue them and the closing checkpoint. Returns the bytes moved,
/// or None if writes stopped meanwhile (nothing queued).
async fn run_pass(
    shared: &Arc<Shared>,
    groups: Vec<(HeatClass, Vec<Relocation>)>,
    kinds: &BTreeMap<u64, (ObjectTag, u64)>,
    pacer: &mut Pacer,
) -> lsvd_core::error::Result<Option<u64>> {
    // The relocations in the groups' order, which the layout below walks in step.
    let relocations: Vec<Relocation> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    let relocations = &relocations[..];
    // Fetch each victim's live data in runs (extents less than a gap apart share one
    // ranged GET), then lay it out in the relocations' LBA order.
    let mut data_of: Vec<Vec<u8>> = vec![Vec::new(); relocations.len()];
    let mut by_victim: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, r) in relocations.iter().enumerate() {
        by_victim.entry(r.source.object_seq).or_default().push(i);
    }
    for (victim, mut idxs) in by_victim {
        let (tag, header_bytes) = kinds.get(&victim).copied().unwrap_or((
            ObjectTag {
                kind: ObjectKind::Data,
                epoch: 0,
            },
            0,
        ));
        idxs.sort_by_key(|&i| relocations[i].source.offset);
        // Live data clients read recently is in the read cache: copy it from there
        // (paced like a GET: it is I/O on the local SSD) and GET only the rest.
        if shared.read_cache.is_some() {
            let mut uncached = Vec::with_capacity(idxs.len());
            let obj = shared.cache_object(victim, tag.epoch);
            let cached = read::CachedObjectReader::new(obj, header_bytes);
            for i in idxs {
                let r = &relocations[i];
                let len = r.sectors * SECTOR_BYTES;
                if let Some(buf) = cached.read(shared, r.source.offset, len) {
                    if stopping(shared) || !pace(shared, pacer, buf.len() as u64).await {
                        return Ok(None);
                    }
                    shared
                        .stats
                        .gc_cache_read_bytes
                        .fetch_add(buf.len() as u64, Ordering::Relaxed);
                    data_of[i] = buf;
                } else {
                    uncached.push(i);
                }
            }
            idxs = uncached;
        }
        let mut run_start = 0;
        while run_start < idxs.len() {
            let first = &relocations[idxs[run_start]];
            let from = first.source.offset;
            let mut to = from + first.sectors * SECTOR_BYTES;
            let mut run_end = run_start + 1;
            while run_end < idxs.len() {
                let r = &relocations[idxs[run_end]];
                let end = to.max(r.source.offset + r.sectors * SECTOR_BYTES);
                if r.source.offset > to + RUN_GAP_BYTES || end - from > MAX_GET_BYTES {
                    break;
                }
                to = end;
                run_end += 1;
            }
            if stopping(shared) || !pace(shared, pacer, to - from).await {
                return Ok(None);
            }
            let buf = read::read_object_background(shared, victim, tag, from, to).await?;
            for &i in &idxs[run_start..run_end] {
                let r = &relocations[i];
                let at = (r.source.offset - from) as usize;
                data_of[i] = buf[at..at + (r.sectors * SECTOR_BYTES) as usize].to_vec();
            }
            run_start = run_end;
        }
    }
    // Number the GC objects and the closing checkpoint, then lay out and encode them
    // (tens of megabytes copied and checksummed) without the state lock and off the
    // runtime's threads. Client batches closing meanwhile wait unnumbered, so the
    // upload queue stays in sequence order.
    let hot_groups: Vec<bool> = groups.iter().map(|(class, _)| class.is_hot()).collect();
    let (first_seq, last_record_seq) = {
        let mut st = shared.lock();
        // Once writes have stopped the uploader may finish at any moment: the pipeline
        // starts nothing it would have to wait for.
        let Some(first) = st.pipeline.gc_reserve(groups.len()) else {
            return Ok(None);
        };
        (first, st.pipeline.store().last_record_seq())
    };
    let volume = shared.meta.volume;
    let epoch = shared.epoch();
    let compression = shared.config.compression();
    let encoded = tokio::task::spawn_blocking(move || {
        let mut encoded = Vec::with_capacity(groups.len());
        let mut next = 0usize; // index into relocations (and data_of)
        let mut consumed = 0usize; // bytes of data_of[next] already placed
        for (i, (_, group)) in groups.iter().enumerate() {
            let seq = first_seq + i as u64;
            let extents = gc_object_extents(group);
            let spec = ObjectSpec {
                kind: ObjectKind::Gc,
                volume,
                seq,
                last_record_seq,
                extents: &extents,
                trims: &[],
                volume_size_bytes: None,
                parts_after: 0,
                epoch,
                first_record_seq: last_record_seq + 1,
            };
            // Lay the data out straight into the object's data section.
            let data_bytes: u64 = group.iter().map(|r| r.sectors * SECTOR_BYTES).sum();
            let header_len = object_header_len(&spec, data_bytes);
            // Appended in order, not zeroed first: zeroing the buffer was 2% of lsvd's
            // CPU time under 4 KiB random writes.
            let buf = DirectBuf::filled(header_len + data_bytes as usize, |object| {
                object.resize(object.len() + header_len, 0);
                for r in group {
                    let len = (r.sectors * SECTOR_BYTES) as usize;
                    while data_of[next].len() == consumed {
                        next += 1;
                        consumed = 0;
                    }
                    object.extend_from_slice(&data_of[next][consumed..consumed + len]);
                    consumed += len;
                }
            });
            let buf = seal_object(&spec, buf, header_len, compression);
            encoded.push((data_bytes, buf.into_bytes()));
        }
        encoded
    })
    .await;
    let encoded = match encoded {
        Ok(e) => e,
        Err(e) => {
            // The numbers are taken: nothing after them could ever be applied.
            shared.fail(&format!("encoding GC objects failed: {e}"));
            return Err(lsvd_core::error::Error::new(
                lsvd_core::error::ErrorKind::VolumeFailed,
                "encoding GC objects failed",
            ));
        }
    };
    // Queue them even if writes stopped meanwhile: their numbers are taken (and the
    // drain waits for them).
    let moved = encoded.iter().map(|(data, _)| data).sum();
    if shared.config.gc.policy.tracks_heat() {
        let hot_bytes: u64 = encoded
            .iter()
            .zip(&hot_groups)
            .filter(|(_, hot)| **hot)
            .map(|((data, _), _)| data)
            .sum();
        let s = &shared.stats;
        s.gc_hot_moved_bytes.fetch_add(hot_bytes, Ordering::Relaxed);
        s.gc_cold_moved_bytes
            .fetch_add(moved - hot_bytes, Ordering::Relaxed);
    }
    shared.lock().pipeline.gc_queue(
        encoded
            .into_iter()
            .map(|(_, object)| (object.len() as u64, object))
            .collect(),
    );
    Ok(Some(moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Paused (virtual) time: the test measures the pacer's arithmetic, not how
    // promptly a loaded machine wakes a sleeping task.
    #[tokio::test(start_paused = true)]
    async fn pacer_holds_gc_to_its_rate_and_follows_the_client_write_rate() {
        // Disabled: never waits.
        let t = tokio::time::Instant::now();
        let mut off = Pacer::new(0, SharedClock::default());
        assert!(off.take(1 << 30, ClientIo::default(), 1.0, || false).await);
        assert_eq!(t.elapsed(), Duration::ZERO);

        // 4 MiB/s, clients not idle yet (first seen now): the bucket starts empty, so
        // each MiB waits a quarter second.
        let mut p = Pacer::new(4 << 20, SharedClock::default());
        let t = tokio::time::Instant::now();
        for _ in 0..3 {
            assert!(p.take(1 << 20, ClientIo::default(), 1.0, || false).await);
        }
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(750) && took < Duration::from_millis(760),
            "3 MiB at 4 MiB/s took {took:?}"
        );

        // Clients writing 40 MiB/s: GC may use four times that.
        let mut p = Pacer::new(1 << 20, SharedClock::default());
        assert_eq!(p.rate(0, 1.0), (1 << 20) as f64);
        tokio::time::advance(Duration::from_millis(250)).await;
        let r = p.rate(10 << 20, 1.0);
        assert!(
            (r - (160 << 20) as f64).abs() < (1 << 20) as f64,
            "rate {r} for clients writing 40 MiB/s"
        );
        // With a GC headroom, the share follows how much of it is used: the minimum
        // rate while none is, half the share at half.
        assert_eq!(p.rate(10 << 20, 0.0), (1 << 20) as f64);
        let r = p.rate(10 << 20, 0.5);
        assert!(
            (r - (80 << 20) as f64).abs() < (1 << 20) as f64,
            "rate {r} with half the headroom used"
        );
        // Those client writes age out of the 2 s window: back to the minimum rate.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(p.rate(10 << 20, 1.0), (1 << 20) as f64);

        // A stop request ends a wait at once.
        let mut p = Pacer::new(1 << 20, SharedClock::default());
        let t = tokio::time::Instant::now();
        assert!(!p.take(64 << 20, ClientIo::default(), 1.0, || true).await);
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn pacer_lets_gc_run_unpaced_while_clients_are_idle() {
        let io = |written_bytes, read_bytes| ClientIo {
            written_bytes,
            read_bytes,
        };
        let mut p = Pacer::new(4 << 20, SharedClock::default());
        // Clients just seen (first sight counts as activity): paced, 1 MiB waits 250 ms.
        let t = tokio::time::Instant::now();
        assert!(p.take(1 << 20, io(8 << 20, 0), 1.0, || false).await);
        assert_eq!(t.elapsed(), Duration::from_millis(250));
        // Nothing read or written since, but not yet for IDLE_AFTER: still paced.
        let t = tokio::time::Instant::now();
        assert!(p.take(1 << 20, io(8 << 20, 0), 1.0, || false).await);
        assert_eq!(t.elapsed(), Duration::from_millis(250));
        // Idle long enough: a GiB goes through at once, and again.
        tokio::time::advance(IDLE_AFTER).await;
        let t = tokio::time::Instant::now();
        assert!(p.take(1 << 30, io(8 << 20, 0), 1.0, || false).await);
        assert!(p.take(1 << 30, io(8 << 20, 0), 1.0, || false).await);
        assert_eq!(t.elapsed(), Duration::ZERO);
        // A client read ends it: paced from an empty bucket, at the minimum rate (the
        // write rate is still zero).
        let t = tokio::time::Instant::now();
        assert!(p.take(1 << 20, io(8 << 20, 4096), 1.0, || false).await);
        assert_eq!(t.elapsed(), Duration::from_millis(250));
        // And a client write too, once idle again.
        tokio::time::advance(IDLE_AFTER).await;
        assert!(p.take(1 << 30, io(8 << 20, 4096), 1.0, || false).await);
        let t = tokio::time::Instant::now();
        assert!(
            p.take(1 << 20, io((8 << 20) + 4096, 4096), 1.0, || false)
                .await
        );
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    }
}
