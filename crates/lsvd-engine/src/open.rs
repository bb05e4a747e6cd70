//! Opening a volume: recovery, then the tasks that serve it.
//!
//! Opening always runs recovery; after a clean shutdown it simply finds nothing to
//! redo. Steps (see docs/ARCHITECTURE.md):
//! 1. the store side ([`crate::recovery::store_recovery`]): the newest checkpoint and the objects
//!    after it up to the first gap; stranded objects past the gap are deleted before
//!    any new write;
//! 2. the log side ([`crate::recovery::log_scan`]): follow the write log's record chain from the
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

use crate::cache_dev::{CacheDevice, FileCache};
use crate::cache_layout::CacheLayout;
use crate::config::{EngineConfig, MIN_LOG_SIZE_BYTES};
use crate::fencing::claim::{
    Claim, ClaimPlan, claim, claim_in_background, finish_claim, spawn_lease_task, superseded_after,
};
use crate::fencing::lease::{Acquired, Lease, acquire};
use crate::keys::validate_volume_name;
use crate::maintenance::gc;
use crate::read::cache::{self as read_cache, READ_CACHE_CHUNK_BYTES, ReadCache};
use crate::recovery::log_plan::{log_session_of, plan_log};
use crate::recovery::log_scan::{read_cache_super, scan_log_with_index};
use crate::recovery::store_recovery::{StoreRecovery, check_recovered, recover_store};
use crate::shared::{Shared, State, Stats};
use crate::store_meta::{is_being_deleted, random_session_id, read_meta};
use crate::volume::Volume;
use crate::write::log_index;
use crate::write::log_order;
use crate::write::log_space::LogSpace;
use crate::write::recent_records::RecentRecords;
use crate::write::started::{self, LogWriter};
use crate::write::{uploader, writer};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

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
    /// The epoch of this open's claim (its objects carry it).
    pub epoch: u64,
    /// The holder whose lease lapsed, when this open took the volume over.
    pub took_over_from: Option<String>,
    /// Write-log records a superseded session acknowledged, discarded
    /// (`EngineConfig::discard_superseded_log`).
    pub log_records_discarded: u64,
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
        return Err(crate::fencing::volume_super::being_deleted(name));
    }
    let record = crate::lifecycle::snapshot::read_snapshot(&store, &meta, snapshot).await?;
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
    // Check the volume exists, that its objects can be read (an encrypted volume's
    // store is unlocked), and that this process may claim it, before making a log
    // file for it.
    let meta = read_meta(&store, name).await?;
    crate::lifecycle::encryption::require_unlocked(&store, &meta)?;
    let existing_log = log_session_of(&log_path, &meta);
    let local = crate::local_encryption::plan(&log_path, &meta, existing_log.as_ref(), &config)?;
    let acquired = match &snapshot {
        Some(_) => None,
        None => Some(acquire(&store, &meta, existing_log, &config.lease, &*config.clock).await?),
    };
    if local.remake {
        // Closed cleanly: nothing in these files is needed (`local_encryption`).
        for file in [
            log_path.clone(),
            data_dir.join(format!("{stem}.rcache")),
            data_dir.join(format!("{stem}.rcache.slots")),
        ] {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::local_io(
                        format!("cannot remove {} to make it anew", file.display()),
                        e,
                    ));
                }
            }
        }
    }
    // Writing a large log takes a moment: say why the first start waits.
    if !log_path.exists() && log_size >= 256 << 20 {
        lsvd_store::log::info(&format!(
            "preparing the write log {} ({} MiB, once)",
            log_path.display(),
            log_size >> 20
        ));
    }
    let (file, created) = FileCache::open_or_create_written(&log_path, log_size)
        .map_err(|e| Error::local_io(format!("cannot open write log {}", log_path.display()), e))?;
    let cache_name = log_path.display().to_string();
    let read_cache = if let (Some(host), None) = (&config.host_read_cache, &local.keys) {
        // The process's shared cache: a cache file of this volume's own, left by an
        // older build or another setting, is only space now.
        for file in [
            data_dir.join(format!("{stem}.rcache")),
            data_dir.join(format!("{stem}.rcache.slots")),
        ] {
            let _ = std::fs::remove_file(file);
        }
        Some(ReadCache::for_volume(host.clone(), meta.volume))
    } else if config.read_cache_bytes >= READ_CACHE_CHUNK_BYTES {
        Some(read_cache::open_files(
            data_dir,
            &stem,
            config.read_cache_bytes,
            meta.volume,
            local.keys.as_deref(),
        )?)
    } else {
        None
    };
    let (volume, mut report) = open_inner(
        store,
        name,
        local.write_log(Arc::new(file)),
        &cache_name,
        read_cache,
        local.key_id(),
        config,
        snapshot,
        acquired,
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
    open_inner(
        store, name, cache, cache_name, None, None, config, None, None,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn open_inner(
    store: DynStore,
    name: &str,
    cache: Arc<dyn CacheDevice>,
    cache_name: &str,
    read_cache: Option<ReadCache>,
    local_key_id: Option<[u8; 8]>,
    config: EngineConfig,
    snapshot: Option<lsvd_core::format::snapshot::SnapshotRecord>,
    acquired: Option<Acquired>,
) -> Result<(Arc<Volume>, OpenReport)> {
    // 0. May this process claim the volume? (Reading only.)
    let meta = read_meta(&store, name).await?;
    crate::lifecycle::encryption::require_unlocked(&store, &meta)?;
    let mut config = config;
    if config.compression.is_none() {
        let settings = crate::lifecycle::settings::read_settings(&store, &meta).await?;
        config.compression = Some(settings.map_or_else(Default::default, |s| s.compression));
    }
    let existing = read_cache_super(cache.as_ref(), &meta, cache_name)?;
    let acquired = match (acquired, &snapshot) {
        (Some(a), _) => Some(a),
        (None, Some(_)) => None,
        (None, None) => {
            Some(acquire(&store, &meta, existing, &config.lease, &*config.clock).await?)
        }
    };
    // 1. The store side (what the snapshots keep is not garbage).
    let pins = crate::lifecycle::snapshot::load_pins(&store, &meta).await?;
    let lineage = crate::lifecycle::lineage::load_lineage(&store, &meta).await?;
    let mut rec = match &snapshot {
        None => recover_store(&store, &meta).await?,
        Some(record) => StoreRecovery::of_snapshot(
            crate::lifecycle::snapshot::snapshot_state(&store, &meta, record).await?,
            record,
        ),
    };
    rec.orphans.retain(|n| !pins.holds(n.seq));
    let mut report = OpenReport {
        checkpoint_seq: rec.checkpoint_seq,
        checkpoint_clean: rec.checkpoint_clean,
        objects_replayed: rec.objects_replayed,
        checkpoints_skipped: rec.skipped_checkpoints.clone(),
        took_over_from: acquired.as_ref().and_then(|a| a.took_over_from.clone()),
        ..Default::default()
    };
    // The holder renewed (or another process claimed) after this one decided it may
    // claim: it is alive, and this open changes nothing.
    if let (Some(a), Some(sb)) = (&acquired, &rec.superblock)
        && sb.generation >= a.claim_generation
    {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "volume '{name}' was claimed by {} (superblock generation {}) while this process recovered it; refusing to open it",
                if sb.holder.is_empty() {
                    "another lsvd process"
                } else {
                    &sb.holder
                },
                sb.generation
            ),
        ));
    }
    check_recovered(&rec, config.recovery_mode)?;
    // The claim's epoch and where it numbers its objects: past every epoch and
    // number any object in the store has, so no name and no number is used twice.
    let claim_plan = acquired.as_ref().map(|a| ClaimPlan {
        generation: a.claim_generation,
        epoch: a
            .newest
            .as_ref()
            .map_or(0, |sb| sb.epoch)
            .max(rec.listed_max_epoch)
            .max(rec.history.newest_epoch())
            + 1,
        after_seq: rec.history_end,
        first_seq: rec
            .state
            .next_object_seq()
            .max(rec.listed_max_seq.saturating_add(1)),
    });
    if let Some(p) = &claim_plan {
        rec.state.skip_to(p.first_seq).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, "numbering the claim's objects", e)
        })?;
    }
    let base_counters = rec.counters;
    let heat = (config.gc.policy.tracks_heat() && snapshot.is_none())
        .then(|| restored_heat(&meta, rec.state.volume_size_bytes, rec.heat.as_ref()));
    let newest_super = rec.superblock.clone();
    let history = rec.history.clone();
    let mut store_state = rec.state.clone();
    let last_in_store = store_state.last_record_seq();

    // 2. The log side.
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
        if let Some(b) = crate::recovery::log_scan::chain_break(cache.as_ref(), &sb, &chain)
            && b.followed
            && b.record.seq > last_in_store
        {
            lsvd_store::log::warn(&format!(
                "volume {name}: {}, yet a valid record chained to it follows: power failed before it was synced, or the cache device changed it; the write log ends before it (records from {} on are not replayed; `lsvd check` lists them)",
                b.record, b.record.seq
            ));
        }
    }
    // The session that claimed the volume last used its log epoch as its session id
    // (`claim`): if that is this log's, nobody has written the volume since.
    let store_last_written_by_this_log = existing.is_some_and(|sb| {
        newest_super
            .as_ref()
            .is_some_and(|v| sb.is_own_session(v.session))
    });
    // Records past the store's end that a session acknowledged after which another
    // process claimed the volume: that process's history does not hold them, and
    // replaying them would mix two histories. Refused, or discarded when asked.
    let superseded_after = match existing {
        Some(sb) if snapshot.is_none() && !store_last_written_by_this_log => {
            superseded_after(&store, &meta, &sb, &history, last_in_store).await?
        }
        _ => u64::MAX,
    };
    let superseded = chain
        .iter()
        .filter(|r| r.header.seq > superseded_after)
        .count() as u64;
    if superseded > 0 {
        let first = chain
            .iter()
            .find(|r| r.header.seq > superseded_after)
            .map_or(0, |r| r.header.seq);
        let last = chain.last().map_or(0, |r| r.header.seq);
        let by = newest_super.as_ref().map_or_else(
            || "another process".to_string(),
            |sb| {
                if sb.holder.is_empty() {
                    format!("session {:016x}", sb.session)
                } else {
                    sb.holder.clone()
                }
            },
        );
        if !config.discard_superseded_log {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "write log {cache_name} holds {superseded} records (sequence {first}..={last}) that a superseded session of volume '{name}' acknowledged but never uploaded; {by} has claimed the volume since, so they are not in it. Discard them with `lsvd serve {name} --discard-superseded-log` (or move the file away)"
                ),
            ));
        }
        lsvd_store::log::warn(&format!(
            "volume {name}: discarding {superseded} records (sequence {first}..={last}) of write log {cache_name}: a superseded session acknowledged them, and {by} has claimed the volume since"
        ));
        report.log_records_discarded = superseded;
        let keep_through = superseded_after.min(last_in_store);
        // The first record dropped still chains to the last one kept: appends start
        // at its place, and until they overwrite it the next open would follow the
        // chain into what was discarded. Its header block is zeroed (and synced) first.
        if let Some(first) = chain.iter().find(|r| r.header.seq > keep_through) {
            let zeros = vec![0u8; lsvd_core::format::SECTOR_BYTES as usize];
            cache
                .write_at(&zeros, first.offset)
                .and_then(|()| cache.sync())
                .map_err(|e| {
                    Error::local_io(
                        format!("cannot discard the superseded records of write log {cache_name}"),
                        e,
                    )
                })?;
        }
        chain.retain(|r| r.header.seq <= keep_through);
    }
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
    let now_ns = lsvd_store::clock::now_ns(&*config.clock);
    let size_bytes = store_state.volume_size_bytes;
    // A clone's GC collects only its own objects: its ancestors' stay shared.
    store_state.set_shared_below(lineage.owned_from_seq());
    let pipeline = Pipeline::new(config.pipeline_config(), store_state, now_ns);
    let jitter_seed = config.jitter_seed.unwrap_or_else(random_session_id);
    let shared = Arc::new(Shared {
        runtime: tokio::runtime::Handle::current(),
        meta: meta.clone(),
        size_bytes: AtomicU64::new(size_bytes),
        resizing: tokio::sync::Mutex::new(()),
        store: store.clone(),
        cache: cache.clone(),
        local_key_id,
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
        #[cfg(test)]
        injected_panic: Mutex::new(None),
        upload_wake: tokio::sync::Notify::new(),
        gc_wake: tokio::sync::Notify::new(),
        put_landed: tokio::sync::Notify::new(),
        super_lock: Mutex::new(()),
        volume_super: Mutex::new(VolumeSuper {
            volume: meta.volume,
            ..Default::default()
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
        epoch: AtomicU64::new(0),
        lease: Lease::new(if snapshot.is_some() {
            0
        } else {
            config.lease.timeout_ms
        }),
        volume_super_writes: tokio::sync::Mutex::new(()),
        deferred_deletes: Mutex::new(Vec::new()),
        pins: Mutex::new(pins),
        replica_holds: Default::default(),
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
            // One object with no data stands for the records dropped past the gap,
            // so the records the history holds still continue without a break.
            st.pipeline.record(now_ns, last_in_store + 1, &[]);
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
        // This open has not claimed the volume yet: the last claim that landed is
        // still the one the log had (written again once the claim lands, below).
        claimed_epoch: existing.map_or(0, |sb| sb.claimed_epoch),
        claimed_session: existing.map_or(0, |sb| sb.claimed_session),
        local_key_id,
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

    let mut lease_task = None;
    if let Some(p) = claim_plan {
        report.superblock_generation = p.generation;
        report.epoch = p.epoch;
        shared
            .lease
            .took_over
            .store(report.took_over_from.is_some(), Ordering::SeqCst);
        match claim(&shared, &p, history).await? {
            // Only now, holding the volume: remove what is not the history's.
            Claim::Landed(generation) => {
                // Renewed from the claim on: what is left of the open (deletes, the
                // tasks) may take longer than a lease on a slow store or a busy host,
                // and a standby would take the volume over before it served.
                lease_task = spawn_lease_task(&shared);
                match finish_claim(&shared, &rec, generation).await {
                    Ok(deleted) => report.stranded_deleted = deleted,
                    Err(e) => {
                        if let Some(t) = lease_task {
                            t.abort();
                        }
                        return Err(e);
                    }
                }
            }
            Claim::InBackground(claimed) => {
                crate::supervise::spawn(
                    &shared,
                    "claim",
                    claim_in_background(shared.clone(), claimed, rec),
                );
            }
        }
    }
    let lease_task = lease_task.or_else(|| spawn_lease_task(&shared));
    Ok((Arc::new(start_tasks(shared, lease_task)?), report))
}

/// Start the log writer thread, the uploader and the GC of a recovered volume, which
/// keeps `lease_task` (aborted if they cannot start).
fn start_tasks(
    shared: Arc<Shared>,
    lease_task: Option<tokio::task::JoinHandle<()>>,
) -> Result<Volume> {
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
        .spawn(move || {
            let s = writer_shared.clone();
            crate::supervise::run_thread(&s, "log writer", move || {
                started::run(writer_shared, thread_writer, log_rx, runtime)
            })
        })
        .map_err(|e| {
            if let Some(t) = &lease_task {
                t.abort();
            }
            Error::local_io("cannot start log writer", e)
        })?;
    // A snapshot export writes nothing: no uploads, no GC.
    let (uploader_task, gc_task) = match shared.snapshot {
        Some(_) => (None, None),
        None => (
            Some(crate::supervise::spawn(
                &shared,
                "uploader",
                uploader::run(shared.clone()),
            )),
            Some(crate::supervise::spawn(
                &shared,
                "GC",
                gc::run(shared.clone()),
            )),
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
        lease_task: Mutex::new(lease_task),
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
        lsvd_store::log::warn(&format!(
            "volume {}: the checkpoint's write frequencies do not fit ({why}); hylog starts from zero counts",
            meta.name
        ));
    }
    tracker
}
