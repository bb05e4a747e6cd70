//! The store side of recovery: rebuild the volume's state from the object store
//! alone, without changing anything.
//!
//! `lsvd_core::recovery::BaseChooser` says which checkpoint to try, newest first, and
//! which objects follow the one that verifies without a gap; this module reads them
//! (the checkpoint whole and verified, the others' headers with one ranged GET each),
//! applies them (the parts of a batch split by heat all or none,
//! `lsvd_core::recovery::PartGroup`), and reports what the store no longer holds that
//! it acknowledged. A corrupt or missing newest checkpoint is passed over with a
//! warning naming it.

use lsvd_core::format::checkpoint::{CheckpointHeat, decode_checkpoint};
use lsvd_core::format::object::{ObjectKind, verify_chunks};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::recovery::{BaseChooser, ListedObject, PartGroup, Step};
use lsvd_core::store_state::StoreState;

use super::keys::{object_key, objects_prefix, parse_object_name};
use crate::error::{Error, ErrorKind, Result};
use crate::store::DynStore;

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// The store's view of a volume, rebuilt without changing anything.
pub(crate) struct StoreRecovery {
    pub state: StoreState,
    pub counters: lsvd_core::format::checkpoint::Counters,
    /// The hylog write-frequency tracker the base checkpoint carried, if any.
    pub heat: Option<CheckpointHeat>,
    /// Data and GC objects below the base checkpoint that it does not list: garbage
    /// whose deletion was interrupted.
    pub orphans: Vec<(u64, ObjectKind)>,
    pub stranded: Vec<(u64, ObjectKind)>,
    pub checkpoint_seq: Option<u64>,
    pub checkpoint_clean: bool,
    pub objects_replayed: u64,
    /// Newer checkpoints recovery passed over (corrupt or missing), newest first.
    pub skipped_checkpoints: Vec<u64>,
    /// The newest volume superblock generation, if any.
    pub superblock: Option<lsvd_core::format::volume_super::VolumeSuper>,
    /// What the store no longer holds that it acknowledged: objects a skipped
    /// checkpoint covered, or what the superblock promises. A description naming the
    /// missing object (strict recovery refuses to start on it).
    pub superblock_violation: Option<String>,
}

impl StoreRecovery {
    /// The view of a snapshot export: `state` as of `record`, nothing to settle.
    pub(crate) fn of_snapshot(
        state: StoreState,
        record: &lsvd_core::format::snapshot::SnapshotRecord,
    ) -> StoreRecovery {
        StoreRecovery {
            state,
            counters: Default::default(),
            heat: None,
            orphans: Vec::new(),
            stranded: Vec::new(),
            checkpoint_seq: record.base_checkpoint,
            checkpoint_clean: true,
            objects_replayed: 0,
            skipped_checkpoints: Vec::new(),
            superblock: None,
            superblock_violation: None,
        }
    }
}

/// Rebuild the store's view of volume `meta`. Store errors keep their kind (with
/// context); objects that fail their checks or do not match their names are `Corrupt`.
pub(crate) async fn recover_store(store: &DynStore, meta: &VolumeMeta) -> Result<StoreRecovery> {
    let name = &meta.name;
    let listing = store
        .list(&objects_prefix(name))
        .await
        .map_err(|e| e.context(format!("cannot list objects of '{name}'")))?;
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
    if superblock.is_some_and(|sb| sb.deleting) {
        return Err(super::volume_super::being_deleted(&meta.name));
    }
    let named: Vec<u64> = superblock
        .iter()
        .flat_map(|sb| [sb.newest_checkpoint, sb.previous_checkpoint])
        .flatten()
        .collect();
    let chooser = BaseChooser::new(&listed, &named);
    // The newest checkpoint that reads and verifies; corrupt or vanished ones are
    // passed over (with a warning), any other error stops recovery.
    let mut failed = Vec::new();
    let mut skipped_why = Vec::new();
    let loaded = loop {
        let Some(c) = chooser.next_candidate(&failed) else {
            break None;
        };
        match load_checkpoint(store, meta, c).await {
            Ok(l) => break Some((c, l)),
            Err(e) if matches!(e.kind, ErrorKind::Corrupt | ErrorKind::NotFound) => {
                skipped_why.push((c, e.to_string()));
                failed.push(c);
            }
            Err(e) => return Err(e),
        }
    };
    let base = chooser.base(loaded.as_ref().map(|(c, _)| *c));
    for &c in &base.skipped {
        let key = object_key(name, c, ObjectKind::Checkpoint);
        let why = skipped_why.iter().find(|(s, _)| *s == c).map_or_else(
            || "named by the volume superblock but missing from the store".to_string(),
            |(_, why)| why.clone(),
        );
        let from = match base.checkpoint {
            Some(b) => format!("checkpoint {}", object_key(name, b, ObjectKind::Checkpoint)),
            None => "the first object (no usable checkpoint)".to_string(),
        };
        crate::log::warn(&format!(
            "volume {name}: skipping checkpoint {key} ({why}); recovering from {from} and the objects after it"
        ));
    }
    let (mut state, checkpoint_seq, checkpoint_clean, counters, heat) = match loaded {
        Some((c, l)) => (l.state, Some(c), l.clean, l.counters, l.heat),
        None => (
            StoreState::new(meta.size_bytes),
            None,
            false,
            Default::default(),
            None,
        ),
    };
    // The metadata holds the size the volume was created with; `lsvd resize` objects
    // change it in the object stream, and checkpoints carry the size they saw.
    if state.volume_size_bytes == 0 || !state.volume_size_bytes.is_multiple_of(4096) {
        return Err(corrupt(format!(
            "checkpoint size {} is not a positive multiple of 4096",
            state.volume_size_bytes
        )));
    }
    // Older checkpoints that exist are known, so they are deleted in their turn.
    for &c in chooser.candidates() {
        if checkpoint_seq.is_some_and(|b| c < b) && !chooser.is_missing(c) {
            state.note_checkpoint(c);
        }
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
    // Parts of a split batch apply together, once its last part is read.
    let mut parts = PartGroup::default();
    for step in &base.steps {
        let seq = match *step {
            Step::Skip(seq) if parts.is_open() => {
                return Err(corrupt(format!(
                    "checkpoint {seq:016x} comes between the parts of a batch"
                )));
            }
            Step::Skip(seq) => {
                state.skip_checkpoint(seq).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, format!("checkpoint {seq:016x}"), e)
                })?;
                continue;
            }
            Step::Apply(seq) => seq,
        };
        let kind = kinds[&seq];
        let key = object_key(name, seq, kind);
        let header = read_header(store, &key).await?;
        if header.volume != meta.volume || header.seq != seq || header.kind != kind {
            return Err(corrupt(format!(
                "object {key} does not match its name (another volume's data?)"
            )));
        }
        for header in parts.push(header).map_err(corrupt)? {
            let key = object_key(name, header.seq, header.kind);
            state
                .apply(&header)
                .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("object {key}"), e))?;
            replayed += 1;
        }
    }
    // A run that ends inside a split batch ends before its first part: those parts
    // are stranded like objects past a gap.
    let stranded = parts
        .into_unfinished()
        .iter()
        .chain(&base.stranded)
        .map(|s| (*s, kinds[s]))
        .collect();
    let short = base.short_of.map(|missing| {
        format!(
            "checkpoint {} cannot be used and recovery from {} stops at object {missing:016x}, which is missing from the store (objects without live data are deleted once a newer checkpoint is named)",
            object_key(name, base.skipped[0], ObjectKind::Checkpoint),
            base.checkpoint.map_or_else(
                || "the first object".to_string(),
                |b| format!("checkpoint {}", object_key(name, b, ObjectKind::Checkpoint))
            )
        )
    });
    let superblock_violation = short.or_else(|| superblock.and_then(|sb| {
        let generation = sb.generation;
        let next = state.next_object_seq();
        (next < sb.durable_through).then(|| {
            format!(
                "volume superblock generation {generation} says every object below sequence {} was durable, but object {next:016x} is missing from the store",
                sb.durable_through
            )
        })
    }));
    Ok(StoreRecovery {
        superblock,
        superblock_violation,
        state,
        counters,
        heat,
        orphans,
        stranded,
        checkpoint_seq,
        checkpoint_clean: checkpoint_clean && replayed == 0 && base.skipped.is_empty(),
        skipped_checkpoints: base.skipped.clone(),
        objects_replayed: replayed,
    })
}

pub(crate) async fn read_header(
    store: &DynStore,
    key: &str,
) -> Result<lsvd_core::format::object::ObjectHeader> {
    use lsvd_core::format::object::HEADER_PROBE_BYTES;
    let first = store
        .get_range(key, 0..HEADER_PROBE_BYTES)
        .await
        .map_err(|e| e.context(format!("reading {key}")))?;
    match header_from(store, key, first, None).await {
        Err(e) if e.kind == ErrorKind::Corrupt => {
            // A store that keeps copies (a mirrored chain) may hold a good one.
            let copies = other_copies(store, key, 0..HEADER_PROBE_BYTES).await;
            for (i, copy) in copies.into_iter().enumerate() {
                if let Ok(h) = header_from(store, key, copy, Some(i)).await {
                    crate::log::warn(&format!(
                        "object {key}: the header failed its checks; read it from copy {i}"
                    ));
                    return Ok(h);
                }
            }
            Err(e)
        }
        other => other,
    }
}

/// Decode the object header at the start of `buf` (the first bytes of `key`, from copy
/// `copy` when given), reading the rest of a header longer than `buf` from the same
/// place.
async fn header_from(
    store: &DynStore,
    key: &str,
    mut buf: Vec<u8>,
    copy: Option<usize>,
) -> Result<lsvd_core::format::object::ObjectHeader> {
    use lsvd_core::format::object::{decode_object_header, peek_header_bytes};
    let is_corrupt =
        |e| Error::with_source(ErrorKind::Corrupt, format!("object {key} is corrupt"), e);
    let need = peek_header_bytes(&buf).map_err(is_corrupt)?;
    if need > buf.len() as u64 {
        let range = buf.len() as u64..need;
        let rest = match copy {
            None => store
                .get_range(key, range)
                .await
                .map_err(|e| e.context(format!("reading {key}")))?,
            Some(i) => other_copies(store, key, range)
                .await
                .into_iter()
                .nth(i)
                .ok_or_else(|| corrupt(format!("object {key}: copy {i} is gone")))?,
        };
        buf.extend_from_slice(&rest);
    }
    decode_object_header(&buf).map_err(is_corrupt)
}

/// Every copy of `key[range]` a store that keeps several holds (none for the others,
/// or when they cannot be read: the caller keeps the error it had).
async fn other_copies(store: &DynStore, key: &str, range: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    match store.get_range_copies(key, range).await {
        Ok(copies) => copies.into_iter().map(|c| c.bytes).collect(),
        Err(e) => {
            crate::log::warn(&format!("reading the copies of {key}: {e}"));
            Vec::new()
        }
    }
}

/// Act on what the store side of recovery found, before anything new is written:
/// refuse (strict mode) or warn when the store lost what the volume superblock says
/// it held; delete objects stranded past a gap (they must go before any new object
/// could take their numbers); delete garbage a crash left (best effort). Returns the
/// stranded objects deleted. The strict refusal is `DataLoss`.
pub(crate) async fn settle_store(
    store: &DynStore,
    name: &str,
    rec: &StoreRecovery,
    mode: super::config::RecoveryMode,
) -> Result<Vec<u64>> {
    if let Some(why) = &rec.superblock_violation {
        if mode == super::config::RecoveryMode::Strict {
            return Err(Error::new(
                ErrorKind::DataLoss,
                format!(
                    "{why}: the store lost data it had acknowledged. Start with --recovery-mode accept-prefix to continue from what the store has"
                ),
            ));
        }
        crate::log::warn(&format!(
            "{why}; continuing (--recovery-mode accept-prefix)"
        ));
    }
    let mut deleted = Vec::new();
    for &(seq, kind) in &rec.stranded {
        let key = object_key(name, seq, kind);
        store
            .delete(&key)
            .await
            .map_err(|e| e.context(format!("cannot delete stranded object {key}")))?;
        crate::log::warn(&format!(
            "deleted stranded object {key} (past a gap in the sequence, or part of a batch whose other parts are missing)"
        ));
        deleted.push(seq);
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
    Ok(deleted)
}

/// What a checkpoint restores.
pub(super) struct LoadedCheckpoint {
    pub(super) state: StoreState,
    /// Written at a clean shutdown.
    clean: bool,
    counters: lsvd_core::format::checkpoint::Counters,
    heat: Option<CheckpointHeat>,
}

/// Read checkpoint `c` whole and verify it: the state it describes, whether the
/// volume was closed cleanly, its counters and write frequencies. A checkpoint that
/// fails a check is `Corrupt`, a vanished one `NotFound`.
pub(super) async fn load_checkpoint(
    store: &DynStore,
    meta: &VolumeMeta,
    c: u64,
) -> Result<LoadedCheckpoint> {
    let key = object_key(&meta.name, c, ObjectKind::Checkpoint);
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading checkpoint {key}")))?;
    match decode_loaded_checkpoint(meta, c, &key, &bytes) {
        Err(e) if e.kind == ErrorKind::Corrupt => {
            // A store that keeps copies (a mirrored chain) may hold a good one.
            for (i, copy) in other_copies(store, &key, 0..u64::MAX)
                .await
                .iter()
                .enumerate()
            {
                if let Ok(loaded) = decode_loaded_checkpoint(meta, c, &key, copy) {
                    crate::log::warn(&format!(
                        "checkpoint {key} failed its checks; read it from copy {i}"
                    ));
                    return Ok(loaded);
                }
            }
            Err(e)
        }
        other => other,
    }
}

/// Checkpoint `c` of `meta`'s volume from the object's bytes, checked whole.
fn decode_loaded_checkpoint(
    meta: &VolumeMeta,
    c: u64,
    key: &str,
    bytes: &[u8],
) -> Result<LoadedCheckpoint> {
    let is_corrupt = |e| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("checkpoint {key} is corrupt"),
            e,
        )
    };
    let header = lsvd_core::format::object::decode_object_header(bytes).map_err(is_corrupt)?;
    if header.volume != meta.volume || header.seq != c || header.kind != ObjectKind::Checkpoint {
        return Err(corrupt(format!(
            "checkpoint {key} belongs to another volume or sequence"
        )));
    }
    let payload = bytes
        .get(header.header_bytes as usize..)
        .ok_or_else(|| corrupt(format!("checkpoint {key} is shorter than its header")))?;
    verify_chunks(0, header.data_bytes, &header.chunk_crcs, 0, payload).map_err(is_corrupt)?;
    let ck = decode_checkpoint(payload).map_err(is_corrupt)?;
    let state = StoreState::from_checkpoint(c, &ck)
        .map_err(|e| corrupt(format!("checkpoint {key}: {e}")))?;
    Ok(LoadedCheckpoint {
        state,
        clean: ck.clean,
        counters: ck.counters,
        heat: ck.heat,
    })
}
