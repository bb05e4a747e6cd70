//! Creating and opening volumes, including recovery.
//!
//! Opening always runs recovery; after a clean shutdown it simply finds nothing to
//! redo. Steps (see docs/ARCHITECTURE.md):
//! 1. read the volume metadata; list the volume's objects; plan (lsvd-core);
//! 2. load the newest checkpoint and apply object headers after it, up to the first
//!    gap; delete stranded objects past the gap before any new write;
//! 3. open the write log and follow its record chain from the superblock's tail:
//!    records the store already holds are skipped, newer ones are replayed into the
//!    overlay map and batched again, so the store catches up.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use lsvd_core::VolumeId;
use lsvd_core::batcher::Batcher;
use lsvd_core::format::cache_super::{
    CACHE_SUPER_BYTES, CacheSuper, encode_cache_super, newest_cache_super,
};
use lsvd_core::format::checkpoint::decode_checkpoint;
use lsvd_core::format::object::{ObjectKind, verify_chunks};
use lsvd_core::format::record::{
    LOG_ALIGN_BYTES, RecordHeader, decode_record_header, verify_record,
};
use lsvd_core::format::volume_meta::{VolumeMeta, decode_volume_meta, encode_volume_meta};
use lsvd_core::log_map::LogMap;
use lsvd_core::recovery::{ListedObject, plan_recovery};
use lsvd_core::store_state::StoreState;

use super::config::{EngineConfig, MIN_LOG_SIZE_BYTES, RecoveryMode};
use super::keys::{meta_key, object_key, objects_prefix, parse_object_name, validate_volume_name};
use super::log_index::{self, CacheLayout};
use super::log_space::LogSpace;
use super::read_cache::{READ_CACHE_CHUNK_BYTES, ReadCache};
use super::{Shared, State, Stats, Volume, uploader, writer};
use crate::cache_dev::{CacheDevice, FileCache};
use crate::store::{DynStore, PutMode, StoreErrorKind};
use lsvd_core::format::log_index::LogIndex;
use lsvd_core::format::volume_super::VolumeSuper;

/// What recovery found and did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpenReport {
    pub checkpoint_seq: Option<u64>,
    pub checkpoint_clean: bool,
    pub objects_replayed: u64,
    pub stranded_deleted: Vec<u64>,
    /// The volume superblock generation this open claimed.
    pub superblock_generation: u64,
    /// Write-log records taken from the write-log index instead of read from the log.
    pub log_records_from_index: u64,
    pub log_records_replayed: u64,
    pub log_bytes_replayed: u64,
    pub cache_created: bool,
}

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// Keep trying to write the open-time superblock generation; uploads start when it
/// lands. Fails the volume if another process claimed it meanwhile.
async fn claim_in_background(shared: Arc<Shared>, claimed: VolumeSuper) {
    use super::volume_super::{WriteError, write};
    loop {
        if shared.failed.load(Ordering::SeqCst) {
            return;
        }
        match write(&shared.store, &shared.meta.name, &claimed, 12).await {
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

fn random_session_id() -> u64 {
    let id = random_volume_id().0;
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_le_bytes(b)
}

fn random_volume_id() -> VolumeId {
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut id).is_ok() {
            return VolumeId(id);
        }
    }
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    id.copy_from_slice(&(t ^ (std::process::id() as u128) << 64).to_le_bytes());
    VolumeId(id)
}

/// Create a new volume in the store. Fails if one of that name exists.
pub async fn create_volume(
    store: &DynStore,
    name: &str,
    size_bytes: u64,
) -> io::Result<VolumeMeta> {
    validate_volume_name(name).map_err(err)?;
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) {
        return Err(err(format!(
            "volume size must be a positive multiple of 4096 bytes (got {size_bytes})"
        )));
    }
    let meta = VolumeMeta {
        volume: random_volume_id(),
        size_bytes,
        created_unix_secs: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        name: name.to_string(),
    };
    match store
        .put(
            &meta_key(name),
            encode_volume_meta(&meta).into(),
            PutMode::IfAbsent,
        )
        .await
    {
        Ok(()) => Ok(meta),
        Err(e) if e.kind == StoreErrorKind::AlreadyExists => Err(err(format!(
            "volume '{name}' already exists in {}",
            store.describe()
        ))),
        Err(e) => Err(err(format!(
            "cannot create volume '{name}' in {}: {e}",
            store.describe()
        ))),
    }
}

pub async fn read_meta(store: &DynStore, name: &str) -> io::Result<VolumeMeta> {
    validate_volume_name(name).map_err(err)?;
    let bytes = match store.get(&meta_key(name)).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no volume '{name}' in {} (create it with: lsvd create {name} --size SIZE)",
                    store.describe()
                ),
            ));
        }
        Err(e) => {
            return Err(err(format!(
                "cannot read volume '{name}' from {}: {e}",
                store.describe()
            )));
        }
    };
    let meta = decode_volume_meta(&bytes).map_err(|e| err(format!("volume '{name}': {e}")))?;
    if meta.name != name {
        return Err(err(format!(
            "volume metadata under '{name}' names '{}'",
            meta.name
        )));
    }
    Ok(meta)
}

/// The store's view of a volume, rebuilt without changing anything.
pub(crate) struct StoreRecovery {
    pub state: StoreState,
    pub counters: lsvd_core::format::checkpoint::Counters,
    /// Data and GC objects below the base checkpoint that it does not list: garbage
    /// whose deletion was interrupted.
    pub orphans: Vec<(u64, ObjectKind)>,
    pub stranded: Vec<(u64, ObjectKind)>,
    pub checkpoint_seq: Option<u64>,
    pub checkpoint_clean: bool,
    pub objects_replayed: u64,
    /// The newest volume superblock generation, if any.
    pub superblock: Option<lsvd_core::format::volume_super::VolumeSuper>,
    /// What the superblock promises that the store no longer holds: a description
    /// naming the missing object (strict recovery refuses to start on it).
    pub superblock_violation: Option<String>,
}

pub(crate) async fn recover_store(
    store: &DynStore,
    meta: &VolumeMeta,
) -> io::Result<StoreRecovery> {
    let name = &meta.name;
    let listing = store
        .list(&objects_prefix(name))
        .await
        .map_err(|e| err(format!("cannot list objects of '{name}': {e}")))?;
    let mut kinds = std::collections::BTreeMap::new();
    for entry in &listing {
        match parse_object_name(&entry.key) {
            Some((seq, kind)) => {
                kinds.insert(seq, kind);
            }
            None => crate::log::warn(&format!("ignoring unexpected object {}", entry.key)),
        }
    }
    let listed: Vec<ListedObject> = kinds
        .iter()
        .map(|(&seq, &kind)| ListedObject {
            seq,
            is_checkpoint: kind == ObjectKind::Checkpoint,
        })
        .collect();
    let superblock = super::volume_super::read_newest(store, meta).await?;
    let plan = plan_recovery(&listed);
    let (mut state, replay, checkpoint_seq, checkpoint_clean, counters) =
        match plan.checkpoint_candidates.first() {
            Some(&c) => {
                let key = object_key(name, c, ObjectKind::Checkpoint);
                let bytes = store
                    .get(&key)
                    .await
                    .map_err(|e| err(format!("reading checkpoint {key}: {e}")))?;
                let header = lsvd_core::format::object::decode_object_header(&bytes)
                    .map_err(|e| err(format!("checkpoint {key} is corrupt: {e}")))?;
                if header.volume != meta.volume || header.seq != c {
                    return Err(err(format!(
                        "checkpoint {key} belongs to another volume or sequence"
                    )));
                }
                let payload = &bytes[header.header_bytes as usize..];
                verify_chunks(0, header.data_bytes, &header.chunk_crcs, 0, payload)
                    .map_err(|e| err(format!("checkpoint {key} is corrupt: {e}")))?;
                let ck = decode_checkpoint(payload)
                    .map_err(|e| err(format!("checkpoint {key} is corrupt: {e}")))?;
                let state = StoreState::from_checkpoint(c, &ck)
                    .map_err(|e| err(format!("checkpoint {key}: {e}")))?;
                (
                    state,
                    plan.replay_after[0].clone(),
                    Some(c),
                    ck.clean,
                    ck.counters,
                )
            }
            None => (
                StoreState::new(meta.size_bytes),
                plan.replay_after.last().cloned().unwrap_or_default(),
                None,
                false,
                Default::default(),
            ),
        };
    if state.volume_size_bytes != meta.size_bytes {
        return Err(err(format!(
            "checkpoint size {} differs from volume size {}",
            state.volume_size_bytes, meta.size_bytes
        )));
    }
    for &c in plan.checkpoint_candidates.iter().skip(1) {
        state.note_checkpoint(c);
    }
    let orphans: Vec<(u64, ObjectKind)> = match checkpoint_seq {
        Some(c) => kinds
            .iter()
            .filter(|&(&seq, &kind)| {
                seq < c && kind != ObjectKind::Checkpoint && !state.objects().contains_key(&seq)
            })
            .map(|(&seq, &kind)| (seq, kind))
            .collect(),
        None => Vec::new(),
    };
    let mut replayed = 0;
    for seq in replay {
        let kind = kinds[&seq];
        let key = object_key(name, seq, kind);
        let header = read_header(store, &key).await?;
        if header.volume != meta.volume || header.seq != seq || header.kind != kind {
            return Err(err(format!(
                "object {key} does not match its name (another volume's data?)"
            )));
        }
        state
            .apply(&header)
            .map_err(|e| err(format!("object {key}: {e}")))?;
        replayed += 1;
    }
    let stranded = plan.stranded.iter().map(|s| (*s, kinds[s])).collect();
    let superblock_violation = superblock.and_then(|sb| {
        let generation = sb.generation;
        if let Some(c) = sb.newest_checkpoint
            && kinds.get(&c) != Some(&ObjectKind::Checkpoint)
        {
            return Some(format!(
                "checkpoint {} named by volume superblock generation {generation} is missing from the store",
                object_key(name, c, ObjectKind::Checkpoint)
            ));
        }
        let next = state.next_object_seq();
        (next < sb.durable_through).then(|| {
            format!(
                "volume superblock generation {generation} says every object below sequence {} was durable, but object {next:016x} is missing from the store",
                sb.durable_through
            )
        })
    });
    Ok(StoreRecovery {
        superblock,
        superblock_violation,
        state,
        counters,
        orphans,
        stranded,
        checkpoint_seq,
        checkpoint_clean: checkpoint_clean && replayed == 0,
        objects_replayed: replayed,
    })
}

pub(crate) async fn read_header(
    store: &DynStore,
    key: &str,
) -> io::Result<lsvd_core::format::object::ObjectHeader> {
    use lsvd_core::format::object::{HEADER_PROBE_BYTES, decode_object_header, peek_header_bytes};
    let mut buf = store
        .get_range(key, 0..HEADER_PROBE_BYTES)
        .await
        .map_err(|e| err(format!("reading {key}: {e}")))?;
    let need = peek_header_bytes(&buf).map_err(|e| err(format!("object {key} is corrupt: {e}")))?;
    if need > buf.len() as u64 {
        let rest = store
            .get_range(key, buf.len() as u64..need)
            .await
            .map_err(|e| err(format!("reading {key}: {e}")))?;
        buf.extend_from_slice(&rest);
    }
    decode_object_header(&buf).map_err(|e| err(format!("object {key} is corrupt: {e}")))
}

/// A record found in the write log, verified.
pub(crate) struct FoundRecord {
    pub offset: u64,
    pub header: RecordHeader,
}

/// Follow the record chain from `(offset, seq)`: each record must have the next
/// sequence number, this volume's id and a valid checksum. The first failure ends it.
pub(crate) fn scan_log(cache: &dyn CacheDevice, sb: &CacheSuper) -> Vec<FoundRecord> {
    scan_log_with_index(cache, sb, None)
}

/// [`scan_log`], taking the records from `index` (durable when it was written, so
/// their data need not be read) as far as it goes from the superblock's tail, then
/// following the chain on disk from there.
pub(crate) fn scan_log_with_index(
    cache: &dyn CacheDevice,
    sb: &CacheSuper,
    index: Option<&LogIndex>,
) -> Vec<FoundRecord> {
    let mut out = Vec::new();
    let mut offset = sb.tail_offset;
    let mut expect = sb.tail_seq;
    let mut prev_crc: Option<u32> = None;
    let indexed = index.map_or(&[][..], |i| &i.records[..]);
    if let Some(start) = indexed
        .iter()
        .position(|r| r.header.seq == sb.tail_seq && r.offset == sb.tail_offset)
    {
        for r in &indexed[start..] {
            if r.header.volume != sb.volume
                || r.offset < sb.log_start
                || r.offset + r.header.total_bytes() > sb.log_end
            {
                break;
            }
            prev_crc = Some(r.header.crc);
            offset = r.offset + r.header.total_bytes();
            if offset >= sb.log_end {
                offset = sb.log_start;
            }
            expect = r.header.seq + 1;
            out.push(FoundRecord {
                offset: r.offset,
                header: r.header.clone(),
            });
        }
    }
    let try_at = |offset: u64, expect: u64, prev_crc: Option<u32>| -> Option<FoundRecord> {
        if offset + LOG_ALIGN_BYTES > sb.log_end {
            return None;
        }
        let mut first = vec![0u8; LOG_ALIGN_BYTES as usize];
        cache.read_at(&mut first, offset).ok()?;
        let header = decode_record_header(&first).ok();
        let header = match header {
            Some(h) => h,
            None => {
                // Headers with many extents span several blocks.
                let need = lsvd_core::format::record::header_bytes_for(
                    lsvd_core::format::record::MAX_RECORD_EXTENTS as usize,
                );
                let n = u32::from_le_bytes([first[12], first[13], first[14], first[15]]) as u64;
                if &first[..8] != lsvd_core::format::record::RECORD_MAGIC
                    || n > need
                    || offset + n > sb.log_end
                {
                    return None;
                }
                let mut more = vec![0u8; n as usize];
                cache.read_at(&mut more, offset).ok()?;
                decode_record_header(&more).ok()?
            }
        };
        if header.seq != expect
            || header.volume != sb.volume
            || offset + header.total_bytes() > sb.log_end
            || prev_crc.is_some_and(|c| c != header.prev_crc)
        {
            return None;
        }
        let mut whole = vec![0u8; (header.header_bytes as u64 + header.data_bytes()) as usize];
        cache.read_at(&mut whole, offset).ok()?;
        verify_record(&header, &whole).ok()?;
        Some(FoundRecord { offset, header })
    };
    loop {
        let found = try_at(offset, expect, prev_crc).or_else(|| {
            if offset != sb.log_start {
                try_at(sb.log_start, expect, prev_crc)
            } else {
                None
            }
        });
        let Some(r) = found else { break };
        prev_crc = Some(r.header.crc);
        offset = r.offset + r.header.total_bytes();
        if offset >= sb.log_end {
            offset = sb.log_start;
        }
        expect += 1;
        out.push(r);
        if out.len() as u64 > sb.log_end / LOG_ALIGN_BYTES {
            break; // cannot hold more records than blocks; defensive bound
        }
    }
    out
}

/// Open (and recover) volume `name`, keeping its write log under `data_dir`.
pub async fn open_volume(
    store: DynStore,
    name: &str,
    data_dir: &Path,
    config: EngineConfig,
) -> io::Result<(Arc<Volume>, OpenReport)> {
    validate_volume_name(name).map_err(err)?;
    std::fs::create_dir_all(data_dir)
        .map_err(|e| err(format!("cannot create {}: {e}", data_dir.display())))?;
    let log_path = data_dir.join(format!("{name}.wlog"));
    let log_size =
        config.log_size_bytes.max(MIN_LOG_SIZE_BYTES) / LOG_ALIGN_BYTES * LOG_ALIGN_BYTES;
    // Check the volume exists before making a log file for it.
    read_meta(&store, name).await?;
    let (file, created) = FileCache::open_or_create(&log_path, log_size)
        .map_err(|e| err(format!("cannot open write log {}: {e}", log_path.display())))?;
    let cache_name = log_path.display().to_string();
    let read_cache = if config.read_cache_bytes >= READ_CACHE_CHUNK_BYTES {
        let path = data_dir.join(format!("{name}.rcache"));
        let size = config.read_cache_bytes / READ_CACHE_CHUNK_BYTES * READ_CACHE_CHUNK_BYTES;
        let (file, _) = FileCache::open_or_create(&path, size)
            .map_err(|e| err(format!("cannot open read cache {}: {e}", path.display())))?;
        Some((
            Arc::new(file) as Arc<dyn CacheDevice>,
            data_dir.join(format!("{name}.rcache.map")),
        ))
    } else {
        None
    };
    let (volume, mut report) =
        open_inner(store, name, Arc::new(file), &cache_name, read_cache, config).await?;
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
) -> io::Result<(Arc<Volume>, OpenReport)> {
    open_inner(store, name, cache, cache_name, None, config).await
}

async fn open_inner(
    store: DynStore,
    name: &str,
    cache: Arc<dyn CacheDevice>,
    cache_name: &str,
    read_cache: Option<(Arc<dyn CacheDevice>, std::path::PathBuf)>,
    config: EngineConfig,
) -> io::Result<(Arc<Volume>, OpenReport)> {
    let meta = read_meta(&store, name).await?;
    let rec = recover_store(&store, &meta).await?;
    let mut report = OpenReport {
        checkpoint_seq: rec.checkpoint_seq,
        checkpoint_clean: rec.checkpoint_clean,
        objects_replayed: rec.objects_replayed,
        ..Default::default()
    };
    if let Some(why) = &rec.superblock_violation {
        if config.recovery_mode == RecoveryMode::Strict {
            return Err(err(format!(
                "{why}: the store lost data it had acknowledged. Start with --recovery-mode accept-prefix to continue from what the store has"
            )));
        }
        crate::log::warn(&format!(
            "{why}; continuing (--recovery-mode accept-prefix)"
        ));
    }
    for &(seq, kind) in &rec.stranded {
        let key = object_key(name, seq, kind);
        store
            .delete(&key)
            .await
            .map_err(|e| err(format!("cannot delete stranded object {key}: {e}")))?;
        crate::log::warn(&format!(
            "deleted stranded object {key} (past a gap in the sequence)"
        ));
        report.stranded_deleted.push(seq);
    }
    for &(seq, kind) in &rec.orphans {
        let key = object_key(name, seq, kind);
        match store.delete(&key).await {
            Ok(()) => crate::log::info(&format!(
                "deleted garbage object {key} (not in the checkpoint)"
            )),
            Err(e) => crate::log::warn(&format!("could not delete garbage object {key}: {e}")),
        }
    }
    let base_counters = rec.counters;
    let newest_super = rec.superblock;
    let store_state = rec.state;
    let last_in_store = store_state.last_record_seq();

    let mut a = vec![0u8; CACHE_SUPER_BYTES];
    let mut b = vec![0u8; CACHE_SUPER_BYTES];
    cache.read_at(&mut a, 0)?;
    cache.read_at(&mut b, CACHE_SUPER_BYTES as u64)?;
    let existing = match newest_cache_super(&a, &b) {
        Ok(sb) => {
            if sb.volume != meta.volume {
                return Err(err(format!(
                    "write log {} belongs to another volume (id {}, expected {}); move it away to start from the store",
                    cache_name, sb.volume, meta.volume
                )));
            }
            Some(sb)
        }
        Err(_) if a.iter().chain(b.iter()).all(|&x| x == 0) => None,
        Err(e) => {
            return Err(err(format!(
                "write log {} is not readable ({e}); move it away to start from the store",
                cache_name
            )));
        }
    };

    let layout = match existing {
        Some(sb) => CacheLayout::from_super(cache.size_bytes(), sb.log_start, sb.log_end)
            .ok_or_else(|| {
                err(format!(
                    "write log {cache_name} has an impossible layout (log {}..{} in {} bytes); move it away to start from the store",
                    sb.log_start,
                    sb.log_end,
                    cache.size_bytes()
                ))
            })?,
        None => CacheLayout::for_new_file(cache.size_bytes()),
    };
    let (log_start, log_end) = (layout.log_start, layout.log_end);
    if log_end < log_start + MIN_LOG_SIZE_BYTES / 2 {
        return Err(err(format!(
            "write log {} is too small ({} bytes)",
            cache_name,
            cache.size_bytes()
        )));
    }
    let log_index = existing.and_then(|sb| {
        log_index::read_newest(cache.as_ref(), &layout, meta.volume, sb.index_epoch)
    });
    let index_epoch = random_session_id().max(1);
    let log_index_generation = log_index.as_ref().map_or(0, |i| i.generation);

    let mut generation = existing.map_or(0, |sb| sb.generation);
    let mut chain = Vec::new();
    if let Some(sb) = existing {
        if sb.tail_seq > last_in_store + 1 && config.recovery_mode == RecoveryMode::Strict {
            return Err(err(format!(
                "the store holds records only through {last_in_store}, but the write log had already released records up to {}: objects the store acknowledged are missing. Start with --recovery-mode accept-prefix to continue from what the store has",
                sb.tail_seq - 1
            )));
        }
        chain = scan_log_with_index(cache.as_ref(), &sb, log_index.as_ref());
        let from_index = log_index.as_ref().map_or(0, |i| {
            chain
                .iter()
                .take_while(|r| i.records.iter().any(|x| x.header.seq == r.header.seq))
                .count()
        });
        report.log_records_from_index = from_index as u64;
    }
    // The newest valid record: appends continue after it, chained to its CRC.
    let chain_end = chain.last().map(|r| {
        let end = r.offset + r.header.total_bytes();
        (
            r.header.seq,
            r.header.crc,
            if end >= log_end { log_start } else { end },
        )
    });
    let mut replay: Vec<FoundRecord> = chain
        .into_iter()
        .filter(|r| r.header.seq > last_in_store)
        .collect();
    // Records the store will never see again (accept-prefix): an empty object marks
    // them as covered so the store and the log line up again.
    let mut bridge_through = None;
    if let Some(first) = replay.first()
        && first.header.seq != last_in_store + 1
    {
        if config.recovery_mode == RecoveryMode::Strict {
            return Err(err(format!(
                "write log resumes at record {} but the store ends at record {last_in_store}: records are missing. Start with --recovery-mode accept-prefix to continue from what the store has",
                first.header.seq
            )));
        }
        crate::log::warn("dropping write-log records past a gap (--recovery-mode accept-prefix)");
        bridge_through = replay.last().map(|r| r.header.seq);
        replay.clear();
    }
    let head = match (chain_end, existing) {
        (Some((_, _, end)), _) => end,
        (None, Some(sb)) => sb.tail_offset,
        (None, None) => log_start,
    };
    let log_first = replay.first().map_or(head, |r| r.offset);
    let mut log = LogSpace::new(log_start, log_end, log_first);
    let next_record_seq = chain_end.map_or(0, |(seq, _, _)| seq).max(last_in_store) + 1;
    let last_record_crc = chain_end.map_or(0, |(_, crc, _)| crc);

    let shared = Arc::new(Shared {
        meta: meta.clone(),
        store: store.clone(),
        cache: cache.clone(),
        stats: Stats::default(),
        state: Mutex::new(State {
            log_map: LogMap::new(),
            next_object_seq: store_state.next_object_seq(),
            store: store_state,
            log: LogSpace::new(log_start, log_end, log_start),
            batcher: Batcher::new(config.batch_size_bytes),
            batch_opened_at: None,
            next_record_seq,
            last_record_crc,
            objects_since_checkpoint: 0,
            log_headers: Default::default(),
            // Everything on the device now is synced below, before serving.
            log_synced_through: next_record_seq - 1,
            log_bytes_since_index: 0,
            log_index_generation,
            last_checkpoint_queued_at: std::time::Instant::now(),
            upload_queue: Default::default(),
            uploads_in_flight: 0,
            checkpoint_in_progress: false,
            completed: Default::default(),
            writer_done: false,
            freeable_through: last_in_store,
            cache_super_generation: generation,
            base_counters,
            gc_busy: Default::default(),
            gc_pass_checkpoint: None,
            held: Default::default(),
            pending_bytes: Default::default(),
            gc_stalled: false,
            gc_encoding: false,
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
            newest_checkpoint: None,
            previous_checkpoint: None,
            durable_through: 0,
            last_record_seq: 0,
            written_unix_ms: 0,
        }),
        headers: Mutex::new(Default::default()),
        read_cache: read_cache.map(|(dev, map)| ReadCache::open(dev, &map, meta.volume)),
        failed: AtomicBool::new(false),
        volume_claimed: AtomicBool::new(false),
        volume_super_writes: tokio::sync::Mutex::new(()),
        log_start,
        log_end,
        layout,
        index_epoch,
        config: config.clone(),
    });
    {
        let mut st = shared.lock();
        for r in &replay {
            let bytes = r.header.total_bytes();
            log.push(r.header.seq, r.offset, bytes);
            st.log_headers.push_back((r.offset, r.header.clone()));
            writer::apply_record(&shared, &mut st, r.header.seq, r.offset, &r.header.extents);
            report.log_records_replayed += 1;
            report.log_bytes_replayed += r.header.data_bytes();
        }
        if let Some(through) = bridge_through {
            st.batcher.add_empty_record(through);
        }
        writer::close_batch(&shared, &mut st);
        st.log = log;
        generation += 1;
        st.cache_super_generation = generation;
    }
    // Point the superblock at the first record still needed, marking the cache open.
    let (tail_offset, tail_seq) = {
        let st = shared.lock();
        match st.log.tail() {
            Some(t) => (t.offset, t.seq),
            None => (st.log.head(), next_record_seq),
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
    cache.write_at(&encode_cache_super(&sb), slot)?;
    cache.sync()?;

    // Claim the volume before anything new reaches the store: a second process
    // opening it at the same time finds this generation taken and refuses.
    let claimed = {
        let st = shared.lock();
        let checkpoints: Vec<u64> = st.store.checkpoints().iter().copied().collect();
        VolumeSuper {
            volume: meta.volume,
            generation: newest_super.map_or(0, |sb| sb.generation) + 1,
            session: random_session_id(),
            clean: false,
            newest_checkpoint: checkpoints.last().copied(),
            previous_checkpoint: checkpoints.iter().rev().nth(1).copied(),
            durable_through: st.store.next_object_seq(),
            last_record_seq: st.store.last_record_seq(),
            written_unix_ms: super::volume_super::now_unix_ms(),
        }
    };
    *shared
        .volume_super
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = claimed;
    match super::volume_super::write(&store, name, &claimed, 3).await {
        Ok(()) => shared.volume_claimed.store(true, Ordering::SeqCst),
        Err(super::volume_super::WriteError::Superseded { generation }) => {
            return Err(err(format!(
                "volume '{name}' is being opened by another lsvd process (superblock generation {generation} appeared while this one recovered); refusing to start"
            )));
        }
        // The store is down: serve from the write log now and claim the volume once
        // the store answers. Uploads (and so GC and deletions) wait for the claim.
        Err(super::volume_super::WriteError::Store(e)) => {
            crate::log::warn(&format!(
                "cannot write the volume superblock yet ({e}); serving from the write log, uploads wait"
            ));
            tokio::spawn(claim_in_background(shared.clone(), claimed));
        }
    }
    report.superblock_generation = claimed.generation;

    let (log_tx, log_rx) = tokio::sync::mpsc::channel(4096);
    let writer_shared = shared.clone();
    let writer_thread = std::thread::Builder::new()
        .name(format!("lsvd-log-{name}"))
        .spawn(move || writer::run(writer_shared, log_rx))
        .map_err(|e| err(format!("cannot start log writer: {e}")))?;
    let uploader_task = tokio::spawn(uploader::run(shared.clone(), log_tx.clone()));
    let gc_task = tokio::spawn(super::gc::run(shared.clone()));
    shared.upload_wake.notify_one();
    let volume = Volume {
        shared,
        log_tx,
        writer_thread: Mutex::new(Some(writer_thread)),
        uploader: Mutex::new(Some(uploader_task)),
        gc: Mutex::new(Some(gc_task)),
    };
    Ok((Arc::new(volume), report))
}

/// What the store says about a volume, computed without changing anything.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeInfo {
    pub name: String,
    pub volume_id: String,
    pub size_bytes: u64,
    pub created_unix_secs: u64,
    pub live_bytes: u64,
    pub store_bytes: u64,
    pub utilization: f64,
    pub objects: u64,
    pub checkpoint_seq: Option<u64>,
    pub closed_cleanly: bool,
    pub next_object_seq: u64,
    pub last_record_seq: u64,
    pub map_extents: u64,
    pub stranded_objects: Vec<u64>,
    pub client_write_bytes: u64,
    pub store_write_bytes: u64,
    pub write_amplification: f64,
    pub gc_passes: u64,
    pub gc_moved_bytes: u64,
}

pub async fn inspect_volume(store: &DynStore, name: &str) -> io::Result<VolumeInfo> {
    let meta = read_meta(store, name).await?;
    let rec = recover_store(store, &meta).await?;
    let s = &rec.state;
    let store_bytes = s.stored_bytes();
    Ok(VolumeInfo {
        name: meta.name.clone(),
        volume_id: meta.volume.to_string(),
        size_bytes: meta.size_bytes,
        created_unix_secs: meta.created_unix_secs,
        live_bytes: s.live_bytes(),
        store_bytes,
        utilization: if store_bytes == 0 {
            1.0
        } else {
            s.live_bytes() as f64 / store_bytes as f64
        },
        objects: s.objects().len() as u64,
        checkpoint_seq: rec.checkpoint_seq,
        closed_cleanly: rec.checkpoint_clean && rec.stranded.is_empty(),
        next_object_seq: s.next_object_seq(),
        last_record_seq: s.last_record_seq(),
        map_extents: s.map().extent_count() as u64,
        stranded_objects: rec.stranded.iter().map(|(s, _)| *s).collect(),
        client_write_bytes: rec.counters.client_write_bytes,
        store_write_bytes: rec.counters.store_write_bytes,
        write_amplification: if rec.counters.client_write_bytes == 0 {
            0.0
        } else {
            rec.counters.store_write_bytes as f64 / rec.counters.client_write_bytes as f64
        },
        gc_passes: rec.counters.gc_passes,
        gc_moved_bytes: rec.counters.gc_moved_bytes,
    })
}

/// Names of the volumes in a store.
pub async fn list_volumes(store: &DynStore) -> io::Result<Vec<String>> {
    let entries = store
        .list("")
        .await
        .map_err(|e| err(format!("cannot list {}: {e}", store.describe())))?;
    Ok(entries
        .into_iter()
        .filter_map(|e| {
            e.key
                .strip_suffix("/meta")
                .filter(|n| !n.contains('/'))
                .map(str::to_string)
        })
        .collect())
}
