//! What the replica needs for the source's state as of one listing: the newest
//! checkpoint, what it lists, the objects after it, and what each snapshot keeps.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use lsvd_core::format::checkpoint::decode_checkpoint;
use lsvd_core::format::object::{ObjectKind, decode_object_header};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;
use lsvd_core::history::{History, Owner};
use lsvd_core::store_state::StoreState;

use super::copy::get_verified;
use super::{Listing, PassError, Raced};
use crate::keys::{object_key, snapshot_key};
use crate::lifecycle::lineage::Lineage;
use crate::lifecycle::snapshot::list_snapshots;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// What the replica must hold for the source's state as of one listing.
#[derive(Default)]
pub(super) struct Plan {
    /// Data and GC objects (copied first), as (sequence number, epoch).
    pub(super) objects: BTreeSet<(u64, u64)>,
    /// Checkpoints (copied after every object, oldest first).
    pub(super) checkpoints: BTreeSet<(u64, u64)>,
    /// Snapshot records whose objects the source still holds, with their bytes.
    pub(super) snapshots: Vec<(String, Vec<u8>)>,
    /// Checkpoints already read (verified) while planning.
    pub(super) fetched: BTreeMap<(u64, u64), Bytes>,
}

impl Plan {
    pub(super) fn holds(&self, object: (u64, u64)) -> bool {
        self.objects.contains(&object) || self.checkpoints.contains(&object)
    }
}

/// The history's objects from `from` up to (not including) `through` (None: as far
/// as the listing goes without a gap), by the epochs `history` gives: never past a
/// gap, never an object of another epoch than the owner of its number.
pub(super) fn history_run(
    history: &History,
    src: &Listing,
    from: u64,
    through: Option<u64>,
) -> std::result::Result<Vec<(u64, u64)>, u64> {
    let mut out = Vec::new();
    let mut seq = from;
    while through.is_none_or(|t| seq < t) {
        let epoch = match history.owner(seq) {
            Owner::Epoch(e) => e,
            Owner::Hole { resumes_at } => {
                seq = resumes_at;
                continue;
            }
            Owner::Unknown => {
                let mut at = src.range((seq, 0)..=(seq, u64::MAX));
                match (at.next(), at.next()) {
                    (Some((&(_, e), _)), None) => e,
                    _ => return if through.is_some() { Err(seq) } else { Ok(out) },
                }
            }
        };
        if !src.contains_key(&(seq, epoch)) {
            return if through.is_some() { Err(seq) } else { Ok(out) };
        }
        out.push((seq, epoch));
        seq += 1;
    }
    Ok(out)
}

/// Everything the replica needs for the source's state as of `src`: the newest
/// checkpoint `sb` names and what it lists, every object after it, and what each
/// snapshot keeps.
pub(super) async fn plan_pass(
    source: &DynStore,
    meta: &VolumeMeta,
    lineage: &Lineage,
    sb: Option<&VolumeSuper>,
    src: &Listing,
) -> std::result::Result<Plan, PassError> {
    let name = &meta.name;
    let mut plan = Plan::default();
    let history = sb.map_or_else(History::legacy, |s| s.history.clone());
    let base = sb
        .and_then(|s| s.newest_checkpoint)
        .map(|c| (c, history.epoch_of(c).unwrap_or(0)));
    let add = |plan: &mut Plan, object: (u64, u64)| -> std::result::Result<(), PassError> {
        match src.get(&object) {
            Some((ObjectKind::Checkpoint, _)) => plan.checkpoints.insert(object),
            Some(_) => plan.objects.insert(object),
            None => {
                return Err(PassError::Raced(Raced(format!(
                    "object {:016x} (epoch {}) of '{name}' vanished from the source",
                    object.0, object.1
                ))));
            }
        };
        Ok(())
    };
    let listed_by =
        async |plan: &mut Plan, c: (u64, u64)| -> std::result::Result<Vec<(u64, u64)>, PassError> {
            let bytes = get_verified(source, meta, c.0, c.1, ObjectKind::Checkpoint).await?;
            let opaque = crate::lifecycle::encryption::opaque(source, meta).then_some(src);
            let listed = listed_objects(meta, lineage, c, &bytes, opaque)?;
            plan.fetched.insert(c, bytes);
            Ok(listed)
        };
    if let Some(c) = base {
        add(&mut plan, c)?;
        for s in listed_by(&mut plan, c).await? {
            add(&mut plan, s)?;
        }
    }
    // The history's run after the checkpoint: up to its first gap, never past it,
    // and only objects of the epoch that owns their number. Whether it reaches what
    // the superblock promises is checked on the replica, before the superblock is
    // copied (step 4).
    let from = base.map_or(1, |c| c.0 + 1);
    let run = history_run(&history, src, from, None).unwrap_or_default();
    for object in run {
        add(&mut plan, object)?;
    }
    for record in list_snapshots(source, meta).await? {
        let key = snapshot_key(name, &record.name);
        let mut keeps = Vec::new();
        let base = record
            .base_checkpoint
            .map(|c| (c, record.history.epoch_of(c).unwrap_or(0)));
        if let Some(c) = base {
            if !src.contains_key(&c) {
                lsvd_store::log::warn(&format!(
                    "snapshot {name}@{} needs checkpoint {:016x}, which the source does not hold; not replicating it",
                    record.name, c.0
                ));
                continue;
            }
            keeps.push(c);
            keeps.extend(listed_by(&mut plan, c).await?);
        }
        let after = history_run(
            &record.history,
            src,
            base.map_or(1, |c| c.0 + 1),
            Some(record.through_seq),
        );
        let missing = match after {
            Ok(objects) => {
                keeps.extend(objects);
                keeps.iter().find(|s| !src.contains_key(s)).map(|s| s.0)
            }
            Err(seq) => Some(seq),
        };
        if let Some(missing) = missing {
            lsvd_store::log::warn(&format!(
                "snapshot {name}@{} needs object {missing:016x}, which the source does not hold; not replicating it",
                record.name
            ));
            continue;
        }
        for s in keeps {
            add(&mut plan, s)?;
        }
        let bytes = match source.get(&key).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(PassError::Failed(e.context(format!("reading {key}")))),
        };
        plan.snapshots.push((record.name.clone(), bytes));
    }
    Ok(plan)
}

/// The volume's own objects (not its ancestors') that checkpoint `c` lists; `bytes`
/// is the whole checkpoint object, already verified by [`get_verified`]. A sealed
/// checkpoint read without the key (`opaque`: the listing) cannot be decoded: then
/// every data and GC object of the listing below `c`, a superset of what it lists.
pub(super) fn listed_objects(
    meta: &VolumeMeta,
    lineage: &Lineage,
    (c, epoch): (u64, u64),
    bytes: &[u8],
    opaque: Option<&Listing>,
) -> Result<Vec<(u64, u64)>> {
    if let Some(src) = opaque {
        return Ok(src
            .range(..(c, 0))
            .filter(|(o, (kind, _))| {
                *kind != ObjectKind::Checkpoint && lineage.owner(o.0).is_none()
            })
            .map(|(&o, _)| o)
            .collect());
    }
    let key = object_key(&meta.name, c, epoch, ObjectKind::Checkpoint);
    let corrupt = |why: String| Error::new(ErrorKind::Corrupt, format!("checkpoint {key} {why}"));
    let header = decode_object_header(bytes).map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    let payload = header
        .open_whole(bytes)
        .map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    let ck = decode_checkpoint(&payload).map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    let state =
        StoreState::from_checkpoint(c, epoch, &ck).map_err(|e| corrupt(format!("({e})")))?;
    Ok(state
        .objects()
        .iter()
        .map(|(&s, o)| (s, o.epoch))
        .filter(|&(s, _)| lineage.owner(s).is_none())
        .collect())
}
