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
//!
//! A read-only command (`lsvd info`, `check`, `list`) may run beside a live server,
//! whose GC and checkpoints delete objects and checkpoints the listing named a moment
//! before. For those, [`recover_store_view`] does not pass a vanished key over (a
//! recovery from an older checkpoint would only run into more of them): it stops
//! with an error [`is_vanished`] says is one, and the command looks again from a fresh
//! listing (`admin::look_again`). A key that is not there when read was listed, so the
//! store changed under the read; it says nothing about the volume.

use std::collections::BTreeMap;

use lsvd_core::format::checkpoint::{CheckpointHeat, decode_checkpoint};
use lsvd_core::format::object::ObjectKind;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::history::History;
use lsvd_core::recovery::{BaseChooser, ListedObject, PartGroup, RecordContinuity, Step};
use lsvd_core::store_state::StoreState;

use crate::keys::{ObjectName, object_key, objects_prefix, parse_object_name};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// The store's view of a volume, rebuilt without changing anything.
pub struct StoreRecovery {
    pub state: StoreState,
    pub counters: lsvd_core::format::checkpoint::Counters,
    /// The hylog write-frequency tracker the base checkpoint carried, if any.
    pub heat: Option<CheckpointHeat>,
    /// Objects below the base checkpoint that are not the history's: garbage whose
    /// deletion was interrupted, or a superseded writer's.
    pub orphans: Vec<ObjectName>,
    /// Objects after the base checkpoint that are not the history's: past a gap, in
    /// a hole the history jumps over, or of another epoch than the owner of their
    /// number (a superseded writer's, an upload that landed after its writer died).
    pub stranded: Vec<ObjectName>,
    /// The highest sequence number and epoch any object in the store has: a claim
    /// numbers its objects past the one and takes an epoch past the other.
    pub listed_max_seq: u64,
    pub listed_max_epoch: u64,
    /// Which epoch wrote which part of the history (the superblock's).
    pub history: History,
    /// The last sequence number of the recovered history: the last object (or
    /// checkpoint passed over) the run took, not the numbers a trailing jump skipped
    /// (a claim that wrote nothing after it leaves nothing there to vouch for).
    pub history_end: u64,
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
    pub fn of_snapshot(
        state: StoreState,
        record: &lsvd_core::format::snapshot::SnapshotRecord,
    ) -> StoreRecovery {
        StoreRecovery {
            state,
            counters: Default::default(),
            heat: None,
            orphans: Vec::new(),
            stranded: Vec::new(),
            listed_max_seq: 0,
            listed_max_epoch: 0,
            history: record.history.clone(),
            history_end: record.through_seq.saturating_sub(1),
            checkpoint_seq: record.base_checkpoint,
            checkpoint_clean: true,
            objects_replayed: 0,
            skipped_checkpoints: Vec::new(),
            superblock: None,
            superblock_violation: None,
        }
    }
}

/// Why a key a listing named was not there when read: the store changed between the
/// listing and the read (GC deleted the object, a newer checkpoint or superblock
/// generation replaced it). The source of the `NotFound` [`vanished`] makes.
#[derive(Debug)]
pub struct Vanished;

impl std::fmt::Display for Vanished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("it was listed a moment before: the store changed under this read")
    }
}

impl std::error::Error for Vanished {}

/// `e` (a `NotFound` reading a key a listing named) marked as a key that vanished
/// under the read: still `NotFound`, now with [`Vanished`] as its source.
pub fn vanished(e: Error) -> Error {
    Error::with_source(ErrorKind::NotFound, e.to_string(), Vanished)
}

/// True if `e` is [`vanished`]'s: a read-only command looks again rather than report
/// it.
pub fn is_vanished(e: &Error) -> bool {
    use std::error::Error as _;
    e.is_not_found() && e.source().is_some_and(|s| s.is::<Vanished>())
}

/// Rebuild the store's view of volume `meta`. Store errors keep their kind (with
/// context); objects that fail their checks or do not match their names are `Corrupt`.
pub async fn recover_store(store: &DynStore, meta: &VolumeMeta) -> Result<StoreRecovery> {
    let superblock = crate::fencing::volume_super::read_newest(store, meta).await?;
    recover(store, meta, superblock, Vanishing::PassOver).await
}

/// [`recover_store`] for a read-only command, which may be looking at a live volume:
/// a checkpoint or object the listing named that is gone when read is an error
/// [`is_vanished`] recognizes (look again), not a checkpoint passed over or an error
/// of the volume's.
pub async fn recover_store_view(store: &DynStore, meta: &VolumeMeta) -> Result<StoreRecovery> {
    let superblock = crate::fencing::volume_super::read_newest(store, meta).await?;
    recover(store, meta, superblock, Vanishing::Stop).await
}

/// What recovery does with a key the listing named that is gone when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vanishing {
    /// A checkpoint is passed over (with a warning) like a corrupt one; an object
    /// is a `NotFound` error. For a process that claimed the volume: nothing else
    /// changes it.
    PassOver,
    /// Either is a [`vanished`] error at once.
    Stop,
}

/// [`recover_store`] with `superblock` standing for the newest generation (a replica
/// is checked against the source's before that generation is copied to it).
pub async fn recover_store_as_of(
    store: &DynStore,
    meta: &VolumeMeta,
    superblock: Option<lsvd_core::format::volume_super::VolumeSuper>,
) -> Result<StoreRecovery> {
    recover(store, meta, superblock, Vanishing::PassOver).await
}

async fn recover(
    store: &DynStore,
    meta: &VolumeMeta,
    superblock: Option<lsvd_core::format::volume_super::VolumeSuper>,
    vanishing: Vanishing,
) -> Result<StoreRecovery> {
    crate::lifecycle::encryption::require_unlocked(store, meta)?;
    let name = &meta.name;
    let listing = store
        .list(&objects_prefix(name))
        .await
        .map_err(|e| e.context(format!("cannot list objects of '{name}'")))?;
    // (seq, epoch) -> kind of every object listed.
    let mut kinds: BTreeMap<(u64, u64), ObjectKind> = BTreeMap::new();
    for entry in &listing {
        match parse_object_name(&entry.key) {
            Some(n) => {
                kinds.insert((n.seq, n.epoch), n.kind);
            }
            None => lsvd_store::log::warn(&format!("ignoring unexpected object {}", entry.key)),
        }
    }
    let listed: Vec<ListedObject> = kinds
        .iter()
        .map(|(&(seq, epoch), &kind)| ListedObject {
            seq,
            epoch,
            is_checkpoint: kind == ObjectKind::Checkpoint,
        })
        .collect();
    let listed_max_seq = kinds.keys().map(|k| k.0).max().unwrap_or(0);
    let listed_max_epoch = kinds.keys().map(|k| k.1).max().unwrap_or(0);
    if superblock.as_ref().is_some_and(|sb| sb.deleting) {
        return Err(crate::fencing::volume_super::being_deleted(&meta.name));
    }
    let history = superblock
        .as_ref()
        .map_or_else(History::legacy, |sb| sb.history.clone());
    let named: Vec<u64> = superblock
        .iter()
        .flat_map(|sb| [sb.newest_checkpoint, sb.previous_checkpoint])
        .flatten()
        .collect();
    let chooser = BaseChooser::new(&listed, &named, &history);
    // The newest checkpoint that reads and verifies; corrupt or vanished ones are
    // passed over (with a warning), any other error stops recovery.
    let mut failed = Vec::new();
    let mut skipped_why = Vec::new();
    let loaded = loop {
        let Some((c, epoch)) = chooser.next_candidate(&failed) else {
            break None;
        };
        match load_checkpoint(store, meta, c, epoch).await {
            Ok(l) => break Some((c, epoch, l)),
            // Listed, then gone (candidates named but not listed are never loaded).
            Err(e) if e.is_not_found() && vanishing == Vanishing::Stop => {
                return Err(vanished(e));
            }
            Err(e) if matches!(e.kind, ErrorKind::Corrupt | ErrorKind::NotFound) => {
                skipped_why.push((c, e.to_string()));
                failed.push(c);
            }
            Err(e) => return Err(e),
        }
    };
    let base = chooser.base(loaded.as_ref().map(|(c, _, _)| *c));
    let key_of = |seq: u64, kind: ObjectKind| {
        let epoch = history.epoch_of(seq).unwrap_or(0);
        object_key(name, seq, epoch, kind)
    };
    for &c in &base.skipped {
        let key = key_of(c, ObjectKind::Checkpoint);
        let why = skipped_why.iter().find(|(s, _)| *s == c).map_or_else(
            || "named by the volume superblock but missing from the store".to_string(),
            |(_, why)| why.clone(),
        );
        let from = match base.checkpoint {
            Some((b, e)) => format!(
                "checkpoint {}",
                object_key(name, b, e, ObjectKind::Checkpoint)
            ),
            None => "the first object (no usable checkpoint)".to_string(),
        };
        lsvd_store::log::warn(&format!(
            "volume {name}: skipping checkpoint {key} ({why}); recovering from {from} and the objects after it"
        ));
    }
    let (mut state, checkpoint_seq, checkpoint_clean, counters, heat) = match loaded {
        Some((c, _, l)) => (l.state, Some(c), l.clean, l.counters, l.heat),
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
    for &(c, epoch) in chooser.candidates() {
        if checkpoint_seq.is_some_and(|b| c < b) && !chooser.is_missing(c) {
            state.note_checkpoint(c, epoch);
        }
    }
    let orphans: Vec<ObjectName> = match checkpoint_seq {
        Some(c) => kinds
            .iter()
            .filter(|&(&(seq, epoch), &kind)| {
                seq < c
                    && match kind {
                        ObjectKind::Checkpoint => state.checkpoints().get(&seq) != Some(&epoch),
                        _ => state.objects().get(&seq).map(|o| o.epoch) != Some(epoch),
                    }
            })
            .map(|(&(seq, epoch), &kind)| ObjectName { seq, epoch, kind })
            .collect(),
        None => Vec::new(),
    };
    let mut replayed = 0;
    let mut history_end = checkpoint_seq.unwrap_or(0);
    // Parts of a split batch apply together, once its last part is read.
    let mut parts = PartGroup::default();
    let mut records = RecordContinuity::new(state.last_record_seq());
    let mut broken: Option<(usize, String)> = None;
    for (i, step) in base.steps.iter().enumerate() {
        // Nothing but a batch's own parts may come between them.
        if parts.is_open() {
            let passing = match *step {
                Step::Skip(seq) => Some(format!("checkpoint {seq:016x} comes")),
                Step::Jump(to) => Some(format!("the history jumps to {to:016x}")),
                Step::Apply(..) => None,
            };
            if let Some(passing) = passing {
                return Err(corrupt(format!("{passing} between the parts of a batch")));
            }
        }
        let (seq, epoch) = match *step {
            Step::Skip(seq) => {
                state.skip_checkpoint(seq).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, format!("checkpoint {seq:016x}"), e)
                })?;
                history_end = seq;
                continue;
            }
            Step::Jump(to) => {
                state.skip_to(to).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, format!("jumping to {to:016x}"), e)
                })?;
                continue;
            }
            Step::Apply(seq, epoch) => (seq, epoch),
        };
        let kind = kinds[&(seq, epoch)];
        let key = object_key(name, seq, epoch, kind);
        let header = match read_header(store, &key).await {
            Err(e) if e.is_not_found() && vanishing == Vanishing::Stop => {
                return Err(vanished(e));
            }
            other => other?,
        };
        if header.volume != meta.volume
            || header.seq != seq
            || header.kind != kind
            || header.epoch != epoch
        {
            return Err(corrupt(format!(
                "object {key} does not match its name (another volume's data?)"
            )));
        }
        if let Err(why) = records.check(&header) {
            broken = Some((i, format!("object {key}: {why}")));
            break;
        }
        for header in parts.push(header).map_err(corrupt)? {
            let key = object_key(name, header.seq, header.epoch, header.kind);
            state
                .apply(&header)
                .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("object {key}"), e))?;
            replayed += 1;
            history_end = header.seq;
        }
    }
    let name_of = |seq: u64, epoch: u64| ObjectName {
        seq,
        epoch,
        kind: kinds[&(seq, epoch)],
    };
    // A run that ends inside a split batch ends before its first part: those parts
    // are stranded like objects past a gap. So is everything after a break in the
    // records.
    let unfinished = parts.into_unfinished();
    let mut stranded: Vec<ObjectName> = base.stranded.iter().map(|&(s, e)| name_of(s, e)).collect();
    for step in &base.steps {
        if let Step::Apply(s, e) = *step
            && unfinished.contains(&s)
        {
            stranded.push(name_of(s, e));
        }
    }
    if let Some((i, _)) = &broken {
        for step in &base.steps[*i..] {
            if let Step::Apply(s, e) = *step
                && !unfinished.contains(&s)
            {
                stranded.push(name_of(s, e));
            }
        }
    }
    stranded.sort_unstable_by_key(|n| (n.seq, n.epoch));
    stranded.dedup();
    let short = base.short_of.map(|missing| {
        format!(
            "checkpoint {} cannot be used and recovery from {} stops at object {missing:016x}, which is missing from the store (objects without live data are deleted once a newer checkpoint is named)",
            key_of(base.skipped[0], ObjectKind::Checkpoint),
            base.checkpoint.map_or_else(
                || "the first object".to_string(),
                |(b, e)| format!("checkpoint {}", object_key(name, b, e, ObjectKind::Checkpoint))
            )
        )
    });
    let vouched = base.vouched_missing.map(|missing| {
        format!(
            "object {missing:016x} is missing from the store, but a later claim of the volume recovered past it"
        )
    });
    // A replica holds a newer claim's objects before that claim's superblock while a
    // pass copies them: not a lost superblock, if its status record says a pass is
    // under way that copies them (below its end).
    let newer: Vec<u64> = kinds
        .keys()
        .filter(|&&(_, epoch)| epoch > history.newest_epoch())
        .map(|&(seq, _)| seq)
        .collect();
    let in_flight = match newer.iter().max() {
        Some(&max)
            if superblock
                .as_ref()
                .is_some_and(|sb| sb.epoch < listed_max_epoch) =>
        {
            replica_pass_through(store, meta)
                .await
                .is_some_and(|through| max < through)
        }
        _ => false,
    };
    let newer_epoch = (listed_max_epoch > history.newest_epoch()
        && superblock.as_ref().is_some_and(|sb| sb.epoch < listed_max_epoch)
        && !in_flight)
        .then(|| {
        format!(
            "the store holds objects of epoch {listed_max_epoch}, newer than the newest volume superblock's (epoch {}): the superblock that claimed that epoch is lost or corrupt",
            superblock.as_ref().map_or(0, |sb| sb.epoch)
        )
    });
    let superblock_violation = broken
        .map(|(_, why)| format!("the write-log records break at {why}"))
        .or(short)
        .or(vouched)
        .or(newer_epoch)
        .or_else(|| {
            superblock.as_ref().and_then(|sb| {
                let generation = sb.generation;
                let next = state.next_object_seq();
                (next < sb.durable_through).then(|| {
                    format!(
                        "volume superblock generation {generation} says every object below sequence {} was durable, but object {next:016x} is missing from the store",
                        sb.durable_through
                    )
                })
            })
        });
    Ok(StoreRecovery {
        superblock,
        superblock_violation,
        state,
        counters,
        heat,
        orphans,
        stranded,
        listed_max_seq,
        listed_max_epoch,
        history,
        history_end,
        checkpoint_seq,
        checkpoint_clean: checkpoint_clean && replayed == 0 && base.skipped.is_empty(),
        skipped_checkpoints: base.skipped.clone(),
        objects_replayed: replayed,
    })
}

/// The end of the pass under way, if `store` holds a replica of `meta`'s volume whose
/// status record (`<volume>/replica-of`) says a pass is copying into it (unreadable
/// or absent: None).
async fn replica_pass_through(store: &DynStore, meta: &VolumeMeta) -> Option<u64> {
    let bytes = store
        .get(&crate::keys::replica_of_key(&meta.name))
        .await
        .ok()?;
    let status = lsvd_core::format::replica_status::decode_replica_status(&bytes).ok()?;
    (status.volume == meta.volume).then_some(status.pass?.through_seq)
}

pub async fn read_header(
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
                    lsvd_store::log::warn(&format!(
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
            lsvd_store::log::warn(&format!("reading the copies of {key}: {e}"));
            Vec::new()
        }
    }
}

/// Refuse (strict mode, `DataLoss`) or warn when the store lost what the volume
/// superblock or the history says it held. Before the claim: a refusal changes
/// nothing in the store.
pub fn check_recovered(rec: &StoreRecovery, mode: crate::config::RecoveryMode) -> Result<()> {
    if let Some(why) = &rec.superblock_violation {
        if mode == crate::config::RecoveryMode::Strict {
            return Err(Error::new(
                ErrorKind::DataLoss,
                format!(
                    "{why}: the store lost data it had acknowledged. Start with --recovery-mode accept-prefix to continue from what the store has"
                ),
            ));
        }
        lsvd_store::log::warn(&format!(
            "{why}; continuing (--recovery-mode accept-prefix)"
        ));
    }
    Ok(())
}

/// Act on what the store side of recovery found, once the volume is claimed (never
/// before: a process that has not claimed the volume may be looking at a live
/// holder's objects): delete the objects that are not the history's (stranded past
/// a gap, a superseded writer's), and garbage a crash left below the checkpoint
/// (best effort). Their names are never used again. Returns the sequence numbers
/// of the stranded objects deleted.
pub async fn settle_store(store: &DynStore, name: &str, rec: &StoreRecovery) -> Result<Vec<u64>> {
    let mut deleted = Vec::new();
    for n in &rec.stranded {
        let key = object_key(name, n.seq, n.epoch, n.kind);
        store
            .delete(&key)
            .await
            .map_err(|e| e.context(format!("cannot delete stranded object {key}")))?;
        lsvd_store::log::warn(&format!(
            "deleted stranded object {key} (past a gap in the sequence, of a superseded writer, or part of a batch whose other parts are missing)"
        ));
        deleted.push(n.seq);
    }
    for n in &rec.orphans {
        let key = object_key(name, n.seq, n.epoch, n.kind);
        match store.delete(&key).await {
            Ok(()) => lsvd_store::log::info(&format!(
                "deleted garbage object {key} (not in the checkpoint)"
            )),
            Err(e) => lsvd_store::log::warn(&format!("could not delete garbage object {key}: {e}")),
        }
    }
    Ok(deleted)
}

/// What a checkpoint restores.
pub(crate) struct LoadedCheckpoint {
    pub(crate) state: StoreState,
    /// Written at a clean shutdown.
    clean: bool,
    counters: lsvd_core::format::checkpoint::Counters,
    heat: Option<CheckpointHeat>,
}

/// Read checkpoint `c` (written under `epoch`) whole and verify it: the state it
/// describes, whether the volume was closed cleanly, its counters and write
/// frequencies. A checkpoint that fails a check is `Corrupt`, a vanished one
/// `NotFound`.
pub(crate) async fn load_checkpoint(
    store: &DynStore,
    meta: &VolumeMeta,
    c: u64,
    epoch: u64,
) -> Result<LoadedCheckpoint> {
    let key = object_key(&meta.name, c, epoch, ObjectKind::Checkpoint);
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading checkpoint {key}")))?;
    match decode_loaded_checkpoint(meta, c, epoch, &key, &bytes) {
        Err(e) if e.kind == ErrorKind::Corrupt => {
            // A store that keeps copies (a mirrored chain) may hold a good one.
            for (i, copy) in other_copies(store, &key, 0..u64::MAX)
                .await
                .iter()
                .enumerate()
            {
                if let Ok(loaded) = decode_loaded_checkpoint(meta, c, epoch, &key, copy) {
                    lsvd_store::log::warn(&format!(
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
    epoch: u64,
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
    if header.volume != meta.volume
        || header.seq != c
        || header.kind != ObjectKind::Checkpoint
        || header.epoch != epoch
    {
        return Err(corrupt(format!(
            "checkpoint {key} belongs to another volume or sequence"
        )));
    }
    // Verified chunk by chunk, decompressed where stored compressed.
    let payload = header.open_whole(bytes).map_err(is_corrupt)?;
    let ck = decode_checkpoint(&payload).map_err(is_corrupt)?;
    let state = StoreState::from_checkpoint(c, epoch, &ck)
        .map_err(|e| corrupt(format!("checkpoint {key}: {e}")))?;
    Ok(LoadedCheckpoint {
        state,
        clean: ck.clean,
        counters: ck.counters,
        heat: ck.heat,
    })
}
