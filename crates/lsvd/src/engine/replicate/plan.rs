//! What the replica needs for the source's state as of one listing: the newest
//! checkpoint, what it lists, the objects after it, and what each snapshot keeps.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use lsvd_core::format::checkpoint::decode_checkpoint;
use lsvd_core::format::object::{ObjectKind, decode_object_header};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;
use lsvd_core::store_state::StoreState;

use super::copy::get_verified;
use super::{Listing, PassError, Raced};
use crate::engine::keys::{object_key, snapshot_key};
use crate::engine::lineage::Lineage;
use crate::engine::snapshot::list_snapshots;
use crate::error::{Error, ErrorKind, Result};
use crate::store::DynStore;

/// What the replica must hold for the source's state as of one listing.
#[derive(Default)]
pub(super) struct Plan {
    /// Data and GC objects (copied first).
    pub(super) objects: BTreeSet<u64>,
    /// Checkpoints (copied after every object, oldest first).
    pub(super) checkpoints: BTreeSet<u64>,
    /// Snapshot records whose objects the source still holds, with their bytes.
    pub(super) snapshots: Vec<(String, Vec<u8>)>,
    /// Checkpoints already read (verified) while planning.
    pub(super) fetched: BTreeMap<u64, Bytes>,
}

impl Plan {
    pub(super) fn holds(&self, seq: u64) -> bool {
        self.objects.contains(&seq) || self.checkpoints.contains(&seq)
    }
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
    let base = sb.and_then(|s| s.newest_checkpoint);
    let add = |plan: &mut Plan, seq: u64| -> std::result::Result<(), PassError> {
        match src.get(&seq) {
            Some((ObjectKind::Checkpoint, _)) => plan.checkpoints.insert(seq),
            Some(_) => plan.objects.insert(seq),
            None => {
                return Err(PassError::Raced(Raced(format!(
                    "object {seq:016x} of '{name}' vanished from the source"
                ))));
            }
        };
        Ok(())
    };
    let listed_by = async |plan: &mut Plan, c: u64| -> std::result::Result<Vec<u64>, PassError> {
        let bytes = get_verified(source, meta, c, ObjectKind::Checkpoint).await?;
        let listed = listed_objects(meta, lineage, c, &bytes)?;
        plan.fetched.insert(c, bytes);
        Ok(listed)
    };
    if let Some(c) = base {
        add(&mut plan, c)?;
        for s in listed_by(&mut plan, c).await? {
            add(&mut plan, s)?;
        }
    }
    // The run after the checkpoint. Whether it reaches what the superblock promises
    // is checked on the replica, before the superblock is copied (step 4).
    let from = base.map_or(0, |c| c + 1);
    for (&seq, _) in src.range(from..) {
        add(&mut plan, seq)?;
    }
    for record in list_snapshots(source, meta).await? {
        let key = snapshot_key(name, &record.name);
        let mut keeps = Vec::new();
        if let Some(c) = record.base_checkpoint {
            keeps.push(c);
            keeps.extend(listed_by(&mut plan, c).await?);
        }
        keeps.extend(record.base_checkpoint.map_or(0, |c| c + 1)..record.through_seq);
        if let Some(missing) = keeps.iter().find(|s| !src.contains_key(s)) {
            crate::log::warn(&format!(
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
/// is the whole checkpoint object, already verified by [`get_verified`].
pub(super) fn listed_objects(
    meta: &VolumeMeta,
    lineage: &Lineage,
    c: u64,
    bytes: &[u8],
) -> Result<Vec<u64>> {
    let key = object_key(&meta.name, c, ObjectKind::Checkpoint);
    let corrupt = |why: String| Error::new(ErrorKind::Corrupt, format!("checkpoint {key} {why}"));
    let header = decode_object_header(bytes).map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    let payload = bytes
        .get(header.header_bytes as usize..)
        .ok_or_else(|| corrupt("is shorter than its header".to_string()))?;
    let ck = decode_checkpoint(payload).map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    let state = StoreState::from_checkpoint(c, &ck).map_err(|e| corrupt(format!("({e})")))?;
    Ok(state
        .objects()
        .keys()
        .copied()
        .filter(|&s| lineage.owner(s).is_none())
        .collect())
}
