//! Opening a volume: recovery, then the tasks that serve it.
//!
//! Opening always runs recovery; after a clean shutdown it simply finds nothing to
//! redo. Steps (see docs/ARCHITECTURE.md):
//! 1. the store side ([`super::store_recovery`]): the newest checkpoint and the objects
//!    after it up to the first gap; stranded objects past the gap are deleted before
//!    any new write;
//! 2. the log side ([`super::log_scan`]): follow the write log's record chain from the
//!    cache superblock's tail; `lsvd_core::recovery` decides what to replay, bridge or
//!    refuse given what the store holds;
//! 3. replay the records the store lacks into the overlay map and the pipeline, so
//!    the store catches up; write a cache superblock; claim the volume in the store;
//!    start the log writer, the uploader and the GC.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, CacheSuper, encode_cache_super};
use lsvd_core::format::record::LOG_ALIGN_BYTES;
use lsvd_core::format::volume_super::VolumeSuper;
use lsvd_core::log_map::LogMap;
use lsvd_core::pipeline::Pipeline;
use lsvd_core::recovery::{LogRecoveryInput, LogRecoveryRefusal, SeqRange, plan_log_recovery};

use super::cache_layout::CacheLayout;
use super::config::{EngineConfig, MIN_LOG_SIZE_BYTES, RecoveryMode};
use super::keys::validate_volume_name;
use super::log_index;
use super::log_order;
use super::log_scan::{FoundRecord, read_cache_super, scan_log_with_index};
use super::log_space::LogSpace;
use super::read_cache::{self, READ_CACHE_CHUNK_BYTES, ReadCache};
use super::recent_records::RecentRecords;
use super::shared::{Shared, State, Stats};
use super::started::{self, LogWriter};
use super::store_meta::{is_being_deleted, random_session_id, read_meta};
use super::store_recovery::{StoreRecovery, recover_store, settle_store};
use super::volume::Volume;
use super::{gc, uploader, writer};
use crate::cache_dev::{CacheDevice, FileCache};
use crate::error::{Error, ErrorKind, Result};
use crate::store::DynStore;

/// What recovery found and did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpenReport {
    pub checkpoint_seq: Option<u64>,
    pub checkpoint_clean: bool,
    pub objects_replayed: u64,
    /// Newer checkpoints recovery passed over (corrupt or missing), newest first.
    pub checkpoints_skipped: Vec<u64>,
    pub stranded_deleted: Vec<u64>,
    /// The volume superblock generation this open claimed.
    pub superblock_generation: u64,
    /// Write-log records taken from the write-log index instead of read from the log.
    pub log_records_from_index: u64,
    pub log_records_replayed: u64,
    pub log_bytes_replayed: u64,
    /// Write-log records the store already holds that the log keeps, and serves
    /// reads of, until it needs the space.
    pub log_records_kept: u64,
    pub cache_created: bool,
}

/// Open (and recover) volume `name`, keeping its write log under `data_dir`.
///
/// Errors: `NotFound` (no such volume), `BadInput` (a bad name), `Corrupt` (a
/// checkpoint, object or write log fails its checks), `Conflict` (another process
/// owns the volume, or the write log belongs to another volume), `DataLoss` (strict
/// recovery refuses), `LocalIo`, or a store error's kind.
pub async fn open_volume(
    store: DynStore,
    name: &str,
    data_dir: &Path,
    config: EngineConfig,
) -> Result<(Arc<Volume>, OpenReport)> {
    validate_volume_name(name)?;
    open_files_and_volume(store, name, None, data_dir, config).await
}

/// Open snapshot `snapshot` of volume `name` read-only (export `name@snapshot`): its
/// state is rebuilt from the store; writes, trims and zeroes fail with `ReadOnly`;
/// nothing is uploaded, collected or deleted, and the volume itself is not claimed
/// (it may be served at the same time, here or elsewhere). A small write log that
/// stays empty and a read cache live under `data_dir` as `name@snapshot.*`.
/// Errors: those of [`open_volume`], and `NotFound` naming the snapshots there are.
pub async fn open_snapshot(
    store: DynStore,
    name: &str,
    snapshot: &str,
    data_dir: &Path,
    config: EngineConfig,
) -> Result<(Arc<Volume>, OpenReport)> {
    validate_volume_name(name)?;
    let meta = read_meta(&store, name).await?;
    if is_being_deleted(&store, &meta).await? {
        return Err(super::volume_super::being_deleted(name));
    }
    let record = super::snapshot::read_snapshot(&store, &meta, snapshot).await?;
    let config = EngineConfig {
        log_size_bytes: MIN_LOG_SIZE_BYTES,
        ..config
    };
    open_files_and_volume(store, name, Some(record), data_dir, config).await
}

/// The write log and read cache files of a volume (or of a snapshot export, named
/// `name@snapshot`), then the volume itself.
async fn open_files_and_volume(
    store: DynStore,
    name: &str,
    snapshot: Option<lsvd_core::format::snapshot::SnapshotRecord>,
    data_dir: &Path,
    config: EngineConfig,
) -> Result<(Arc<Volume>, OpenReport)> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| Error::local_io(format!("cannot create {}", data_dir.display()), e))?;
    let stem = match &snapshot {
        Some(r) => format!("{name}@{}", r.name),
        None => name.to_string(),
    };
    let log_path = data_dir.join(format!("{stem}.wlog"));
    let log_size =
        config.log_size_bytes.max(MIN_LOG_SIZE_BYTES) / LOG_ALIGN_BYTES * LOG_ALIGN_BYTES;
    // Check the volume exists before making a log file for it.
    let meta = read_meta(&store, name).await?;
    // Writing a large log takes a moment: say why the first start waits.
    if !log_path.exists() && log_size >= 256 << 20 {
        crate::log::info(&format!(
            "preparing the write log {} ({} MiB, once)",
            log_path.display(),
            log_size >> 20
        ));
    }
    let (file, created) = FileCache::open_or_create_written(&log_path, log_size)
        .map_err(|e| Error::local_io(format!("cannot open write log {}", log_path.display()), e))?;
    let cache_name = log_path.display().to_string();
    let read_cache = if config.read_cache_bytes >= READ_CACHE_CHUNK_BYTES {
        Some(read_cache::open_files(
            data_dir,
            &stem,
            config.read_cache_bytes,
            meta.volume,
        )?)
    } else {
        None
    };
    let (volume, mut report) = open_inner(
        store,
        name,
        Arc::new(file),
        &cache_name,
        read_cache,
        config,
        snapshot,
    )
    .await?;
    report.cache_created = created;
    Ok((volume, report))
}

/// Open volume `name` with its write log on `cache` (tests inject fault-injecting
/// devices here). `cache_name` is used in messages.
pub async fn open_volume_on(
    store: DynStore,
    name: &str,
    cache: Arc<dyn CacheDevice>,
    cache_name: &str,
    config: EngineConfig,
) -> Result<(Arc<Volume>, OpenReport)> {
    open_inner(store, name, cache, cache_name, None, config, None).await
}

/// What the log side of recovery decided.
struct LogPlan {
    /// Records the store lacks, in order.
    replay: Vec<FoundRecord>,
    /// Records the store holds, in order, before `replay`: the log keeps them.
    keep: Vec<FoundRecord>,
    /// Records dropped past a gap (accept-prefix): an empty object covers them.
    bridge_through: Option<u64>,
    next_record_seq: u64,
    /// CRC of the newest valid record (the next record chains to it).
    last_record_crc: u32,
    /// Where appends continue.
    head: u64,
}

/// Decide what to do with the record chain found, given what the store holds
/// (`lsvd_core::recovery::plan_log_recovery`), and where appends continue.
fn plan_log(
    chain: Vec<FoundRecord>,
    existing: Option<&CacheSuper>,
    layout: &CacheLayout,
    last_in_store: u64,
    store_last_written_by_this_log: bool,
    mode: RecoveryMode,
) -> Result<LogPlan> {
    let input = LogRecoveryInput {
        cache_tail_seq: existing.map(|sb| sb.tail_seq),
        chain: match (chain.first(), chain.last()) {
            (Some(first), Some(last)) => SeqRange::new(first.header.seq, last.header.seq),
            _ => None,
        },
        store_last_record_seq: last_in_store,
        store_last_written_by_this_log,
        mode,
    };
    let plan = plan_log_recovery(&input).map_err(|refusal| match refusal {
        // 2^64 records cannot have been written: the numbers come from damaged bytes.
        LogRecoveryRefusal::SequenceNumbersExhausted { .. } => {
            Error::new(ErrorKind::Corrupt, refusal.to_string())
        }
        _ => Error::new(
            ErrorKind::DataLoss,
            format!(
                "{refusal}. Start with --recovery-mode accept-prefix to continue from what the store has"
            ),
        ),
    })?;
    for w in &plan.warnings {
        crate::log::warn(&format!("{w} (--recovery-mode accept-prefix)"));
    }
    // The newest valid record: appends continue after it, chained to its CRC.
    let (last_record_crc, head) = match (chain.last(), existing) {
        (Some(r), _) => {
            let end = r.offset + r.header.total_bytes();
            let head = if end >= layout.log_end {
                layout.log_start
            } else {
                end
            };
            (r.header.crc, head)
        }
        (None, Some(sb)) => (0, sb.tail_offset),
        (None, None) => (0, layout.log_start),
    };
    let in_range = |range: Option<SeqRange>, r: &FoundRecord| {
        range.is_some_and(|range| range.contains(r.header.seq))
    };
    let (keep, rest): (Vec<_>, Vec<_>) = chain.into_iter().partition(|r| in_range(plan.keep, r));
    let replay = rest
        .into_iter()
        .filter(|r| in_range(plan.replay, r))
        .collect();
    Ok(LogPlan {
        replay,
        keep,
        bridge_through: plan.bridge_through,
        next_record_seq: plan.next_record_seq,
        last_record_crc,
        head,
    })
}

async fn open_inner(
    store: DynStore,
    name: &str,
    cache: Arc<dyn CacheDevice>,
    cache_name: &str,
    read_cache: Option<ReadCache>,
    config: EngineConfig,
    snapshot: Option<lsvd_core::format::snapshot::SnapshotRecord>,
) -> Result<(Arc<Volume>, OpenReport)> {
    // 1. The store side (what the snapshots keep is not garbage).
    let meta = read_meta(&store, name).await?;
    let pins = super::snapshot::load_pins(&store, &meta).await?;
    let lineage = super::lineage::load_lineage(&store, &meta).await?;
    let mut rec = match &snapshot {
        None => recover_store(&store, &meta).await?,
        Some(record) => StoreRecovery::of_snapshot(
            super::snapshot::snapshot_state(&store, &meta, record).await?,
            record,
        ),
    };
    rec.orphans.retain(|&(seq, _)| !pins.holds(seq));
    let mut report = OpenReport {
        checkpoint_seq: rec.checkpoint_seq,
        checkpoint_clean: rec.checkpoint_clean,
        objects_replayed: rec.objects_replayed,
        checkpoints_skipped: rec.skipped_checkpoints.clone(),
        ..Default::default()
    };
    report.stranded_deleted = settle_store(&store, name, &rec, config.recovery_mode).await?;
    let base_counters = rec.counters;
    let heat = (config.gc.policy.tracks_heat() && snapshot.is_none())
        .then(|| restored_heat(&meta, rec.state.volume_size_bytes, rec.heat.as_ref()));
    let newest_super = rec.superblock;
    let store_state = rec.state;
    let last_in_store = store_state.last_record_seq();

    // 2. The log side.
    let existing = read_cache_super(cache.as_ref(), &meta, cache_name)?;
    let layout = match existing {
        Some(sb) => CacheLayout::from_super(cache.size_bytes(), sb.log_start, sb.log_end)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "write log {cache_name} has an impossible layout (log {}..{} in {} bytes); move it away to start from the store",
                        sb.log_start,
                        sb.log_end,
                        cache.size_bytes()
                    ),
                )
            })?,
        None => CacheLayout::for_new_file(cache.size_bytes()),
    };
    let (log_start, log_end) = (layout.log_start, layout.log_end);
    if log_end < log_start + MIN_LOG_SIZE_BYTES / 2 {
        return Err(Error::bad_input(format!(
            "write log {} is too small ({} bytes)",
            cache_name,
            cache.size_bytes()
        )));
    }
    let log_index = existing.and_then(|sb| {
        log_index::read_newest(cache.as_ref(), &layout, meta.volume, sb.index_epoch)
    });
    let index_epoch = random_session_id().max(1);
    let mut chain = Vec::new();
    if let Some(sb) = existing {
        chain = scan_log_with_index(cache.as_ref(), &sb, log_index.as_ref());
        report.log_records_from_index = log_index.as_ref().map_or(0, |i| {
            chain
                .iter()
                .take_while(|r| i.records.iter().any(|x| x.header.seq == r.header.seq))
                .count()
        }) as u64;
        // A record that fails verification with a valid successor chained to it is
        // not simply the torn end of the log: say so (the log still ends there).
        if let Some(b) = super::log_scan::chain_break(cache.as_ref(), &sb, &chain)
            && b.followed
            && b.record.seq > last_in_store
        {
            crate::log::warn(&format!(
                "volume {name}: {}, yet a valid record chained to it follows: power failed before it was synced, or the cache device changed it; the write log ends before it (records from {} on are not replayed; `lsvd check` lists them)",
                b.record, b.record.seq
            ));
        }
    }
    // The session that claimed the volume last used its log epoch as its session id
    // (`claim`): if that is this log's, nobody has written the volume since.
    let store_last_written_by_this_log = existing.is_some_and(|sb| {
        sb.index_epoch != 0 && newest_super.is_some_and(|v| v.session == sb.index_epoch)
    });
    let plan = plan_log(
        chain,
        existing.as_ref(),
        &layout,
        last_in_store,
        store_last_written_by_this_log,
        config.recovery_mode,
    )?;

    // 3. Replay, then serve.
    let log_first = plan
        .keep
        .first()
        .or(plan.replay.first())
        .map_or(plan.head, |r| r.offset);
    let mut log = LogSpace::new(log_start, log_end, log_first);
    let now_ns = super::clock::now_ns(&*config.clock);
    let size_bytes = store_state.volume_size_bytes;
    let pipeline = Pipeline::new(config.pipeline_config(), store_state, now_ns);
    let jitter_seed = config.jitter_seed.unwrap_or_else(random_session_id);
    let shared = Arc::new(Shared {
        runtime: tokio::runtime::Handle::current(),
        meta: meta.clone(),
        size_bytes: AtomicU64::new(size_bytes),
        resizing: tokio::sync::Mutex::new(()),
        store: store.clone(),
        cache: cache.clone(),
        stats: Stats::default(),
        state: Mutex::new(State {
            log_map: LogMap::new(),
            pipeline,
            log: LogSpace::new(log_start, log_end, log_start),
            next_record_seq: plan.next_record_seq,
            last_record_crc: plan.last_record_crc,
            log_headers: Default::default(),
            recent_records: RecentRecords::new(config.upload_memory_bytes),
            // Everything on the device now is synced below, before serving.
            log_synced_through: plan.next_record_seq - 1,
            log_classified_through: 0,
            log_freeing_through: 0,
            log_bytes_since_index: 0,
            log_index_generation: log_index.as_ref().map_or(0, |i| i.generation),
            cache_super_generation: existing.map_or(0, |sb| sb.generation),
            base_counters,
            heat,
        }),
        space_freed: Condvar::new(),
        upload_wake: tokio::sync::Notify::new(),
        gc_wake: tokio::sync::Notify::new(),
        super_lock: Mutex::new(()),
        volume_super: Mutex::new(VolumeSuper {
            volume: meta.volume,
            generation: 0,
            session: 0,
            clean: false,
            deleting: false,
            newest_checkpoint: None,
            previous_checkpoint: None,
            durable_through: 0,
            last_record_seq: 0,
            written_unix_ms: 0,
        }),
        headers: Mutex::new(Default::default()),
        admit_uploads: read_cache.is_some()
            && config
                .read_cache_admit
                .admits(store.admit_uploads_to_cache()),
        admissions_pending: Default::default(),
        read_cache,
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        volume_claimed: AtomicBool::new(false),
        volume_super_writes: tokio::sync::Mutex::new(()),
        deferred_deletes: Mutex::new(Vec::new()),
        pins: Mutex::new(pins),
        deletions: tokio::sync::Mutex::new(()),
        snapshot: snapshot.as_ref().map(|r| r.name.clone()),
        lineage,
        log_start,
        log_end,
        layout,
        index_epoch,
        jitter: Mutex::new(lsvd_trace::synthetic::prng::Rng::new(jitter_seed)),
        config: config.clone(),
    });
    // Sequence numbers of stranded objects are used again: nothing cached from them
    // may be taken for the new objects, even after another crash.
    if let Some(rc) = &shared.read_cache {
        for &seq in &report.stranded_deleted {
            rc.forget_object(seq, true).map_err(|e| {
                Error::local_io(
                    format!("cannot drop stranded object {seq:016x} from the read cache"),
                    e,
                )
            })?;
        }
    }
    let generation = {
        let mut guard = shared.lock();
        let st = &mut *guard;
        // Records the store has: back into the overlay (where the store still maps
        // their data), so reads of what the log kept stay local after a restart. The
        // log frees them as it needs the space, as it would have.
        for r in &plan.keep {
            log.push(r.header.seq, r.offset, r.header.total_bytes());
            st.log_headers.push_back((r.offset, r.header.clone()));
            st.log_map.keep_applied(
                st.pipeline.store().map(),
                r.header.seq,
                r.offset + u64::from(r.header.header_bytes),
                &r.header.extents,
            );
            report.log_records_kept += 1;
        }
        st.log_classified_through = plan.keep.last().map_or(0, |r| r.header.seq);
        for r in &plan.replay {
            let bytes = r.header.total_bytes();
            log.push(r.header.seq, r.offset, bytes);
            st.log_headers.push_back((r.offset, r.header.clone()));
            log_order::apply_record(
                st,
                now_ns,
                r.header.seq,
                r.offset,
                r.header.header_bytes,
                &r.header.extents,
            );
            report.log_records_replayed += 1;
            report.log_bytes_replayed += r.header.data_bytes();
        }
        if let Some(through) = plan.bridge_through {
            st.pipeline.record(now_ns, through, &[]);
        }
        st.pipeline.close_batch();
        st.log = log;
        st.cache_super_generation += 1;
        st.cache_super_generation
    };
    // Point the superblock at the first record still needed, marking the cache open.
    let (tail_offset, tail_seq) = {
        let st = shared.lock();
        match st.log.tail() {
            Some(t) => (t.offset, t.seq),
            None => (st.log.head(), plan.next_record_seq),
        }
    };
    let sb = CacheSuper {
        clean: false,
        volume: meta.volume,
        generation,
        file_bytes: cache.size_bytes(),
        log_start,
        log_end,
        tail_offset,
        tail_seq,
        index_epoch,
    };
    let slot = (generation % 2) * CACHE_SUPER_BYTES as u64;
    let write_failed = |e| {
        Error::local_io(
            format!("cannot write the superblock of write log {cache_name}"),
            e,
        )
    };
    cache
        .write_at(&encode_cache_super(&sb), slot)
        .map_err(write_failed)?;
    cache.sync().map_err(write_failed)?;

    if shared.snapshot.is_none() {
        report.superblock_generation = claim(&shared, newest_super).await?;
    }
    Ok((Arc::new(start_tasks(shared)?), report))
}

/// Claim the volume before anything new reaches the store: a second process opening
/// it at the same time finds this generation taken and refuses. Returns the claimed
/// generation. With the store down, serve from the write log now and claim the volume
/// once the store answers; uploads (and so GC and deletions) wait for the claim.
/// Another process's claim is a `Conflict`.
async fn claim(shared: &Arc<Shared>, newest_super: Option<VolumeSuper>) -> Result<u64> {
    let name = &shared.meta.name;
    let claimed = {
        let st = shared.lock();
        let store = st.pipeline.store();
        let checkpoints: Vec<u64> = store.checkpoints().iter().copied().collect();
        VolumeSuper {
            volume: shared.meta.volume,
            generation: newest_super.map_or(0, |sb| sb.generation) + 1,
            // Random, and the write log's epoch too: the next open tells from it
            // whether this log's session was the volume's last writer.
            session: shared.index_epoch,
            clean: false,
            deleting: false,
            newest_checkpoint: checkpoints.last().copied(),
            previous_checkpoint: checkpoints.iter().rev().nth(1).copied(),
            durable_through: store.whole_next_object_seq(),
            last_record_seq: store.last_record_seq(),
            written_unix_ms: shared.clock().unix_ms(),
        }
    };
    *shared
        .volume_super
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = claimed;
    match super::volume_super::write(&shared.store, name, &claimed, 3, shared.clock()).await {
        Ok(()) => shared.volume_claimed.store(true, Ordering::SeqCst),
        Err(super::volume_super::WriteError::Superseded { generation }) => {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "volume '{name}' is being opened by another lsvd process (superblock generation {generation} appeared while this one recovered); refusing to start"
                ),
            ));
        }
        Err(super::volume_super::WriteError::Store(e)) => {
            crate::log::warn(&format!(
                "cannot write the volume superblock yet ({e}); serving from the write log, uploads wait"
            ));
            tokio::spawn(claim_in_background(shared.clone(), claimed));
        }
    }
    Ok(claimed.generation)
}

/// Keep trying to write the open-time superblock generation; uploads start when it
/// lands. Fails the volume if another process claimed it meanwhile.
async fn claim_in_background(shared: Arc<Shared>, claimed: VolumeSuper) {
    use super::volume_super::{WriteError, write};
    loop {
        if shared.is_failed() {
            return;
        }
        match write(
            &shared.store,
            &shared.meta.name,
            &claimed,
            12,
            shared.clock(),
        )
        .await
        {
            Ok(()) => {
                shared.volume_claimed.store(true, Ordering::SeqCst);
                crate::log::info("volume superblock written; uploads resume");
                shared.upload_wake.notify_one();
                return;
            }
            Err(e @ WriteError::Superseded { .. }) => {
                shared.fail(&e.to_string());
                return;
            }
            Err(WriteError::Store(_)) => {}
        }
    }
}

/// Start the log writer thread, the uploader and the GC of a recovered volume.
fn start_tasks(shared: Arc<Shared>) -> Result<Volume> {
    let (log_tx, log_rx) = tokio::sync::mpsc::channel(4096);
    let log_writer = Arc::new(LogWriter::new(
        &shared,
        writer::new_appender(&shared),
        log_tx.downgrade(),
    ));
    let (writer_shared, thread_writer) = (shared.clone(), log_writer.clone());
    let runtime = tokio::runtime::Handle::current();
    let writer_thread = std::thread::Builder::new()
        .name(format!("lsvd-log-{}", shared.meta.name))
        .spawn(move || started::run(writer_shared, thread_writer, log_rx, runtime))
        .map_err(|e| Error::local_io("cannot start log writer", e))?;
    // A snapshot export writes nothing: no uploads, no GC.
    let (uploader_task, gc_task) = match shared.snapshot {
        Some(_) => (None, None),
        None => (
            Some(tokio::spawn(uploader::run(shared.clone()))),
            Some(tokio::spawn(gc::run(shared.clone()))),
        ),
    };
    shared.upload_wake.notify_one();
    Ok(Volume {
        shared,
        log_tx,
        log_writer,
        writer_thread: Mutex::new(Some(writer_thread)),
        uploader: Mutex::new(uploader_task),
        gc: Mutex::new(gc_task),
    })
}

/// The hylog write-frequency tracker for `meta`'s volume of `size_bytes` (its size now:
/// `lsvd resize` may have changed it since creation), with the counters its checkpoint
/// carried when they fit (same region size, as long as the volume size and the
/// tracker's limits did not change); otherwise from zero, said once in the log. A
/// volume grown while served tracks its new range from the next open.
fn restored_heat(
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
    size_bytes: u64,
    saved: Option<&lsvd_core::format::checkpoint::CheckpointHeat>,
) -> lsvd_core::heat::HeatTracker {
    let mut tracker = lsvd_core::heat::HeatTracker::new(Some(size_bytes));
    if let Some(saved) = saved
        && let Err(why) = tracker.restore(saved)
    {
        crate::log::warn(&format!(
            "volume {}: the checkpoint's write frequencies do not fit ({why}); hylog starts from zero counts",
            meta.name
        ));
    }
    tracker
}
