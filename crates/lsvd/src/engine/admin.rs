//! Volume administration: create, list, describe; read a volume's metadata.
//!
//! None of it opens a volume: `info` rebuilds the store's view of it
//! ([`super::store_recovery`]) without changing anything.

use std::time::{SystemTime, UNIX_EPOCH};

use lsvd_core::format::checkpoint::CheckpointHeat;
use lsvd_core::format::volume_meta::VolumeMeta;

use super::keys::{meta_key, validate_volume_name};
use super::store_meta::{random_volume_id, read_meta, write_meta};
use super::store_recovery::recover_store;
use crate::error::{Error, ErrorKind, Result};
use crate::store::DynStore;

/// Create a new volume in the store. Fails with `AlreadyExists` if one of that name
/// exists, `BadInput` for a bad name or size.
pub async fn create_volume(store: &DynStore, name: &str, size_bytes: u64) -> Result<VolumeMeta> {
    validate_volume_name(name)?;
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) {
        return Err(Error::bad_input(format!(
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
    // A deleted volume of this name leaves its tombstone (removed here); any other
    // keys without metadata are not ours to start a volume among.
    let prefix = format!("{name}/");
    let leftovers = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    if !leftovers.is_empty() && !leftovers.iter().any(|e| e.key == meta_key(name)) {
        if !super::volume_super::is_tombstone(store, name, &leftovers).await? {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} keys under '{prefix}' in {} belong to no volume; remove them \
                     before creating '{name}'",
                    leftovers.len(),
                    store.describe()
                ),
            ));
        }
        for e in &leftovers {
            store
                .delete(&e.key)
                .await
                .map_err(|err| err.context(format!("cannot remove tombstone {}", e.key)))?;
        }
    }
    write_meta(store, &meta).await?;
    Ok(meta)
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
    /// Of `gc_moved_bytes`, what the hylog policy moved as hot and as cold.
    pub gc_hot_moved_bytes: u64,
    pub gc_cold_moved_bytes: u64,
    /// The hylog write-frequency tracker the checkpoint carries (none under other
    /// policies).
    pub heat: Option<HeatInfo>,
    /// The volume's snapshots, oldest first.
    pub snapshots: Vec<String>,
    /// For a clone: the snapshot it was made from, `parent@snapshot`.
    pub parent: Option<String>,
    /// The clones made from this volume's snapshots.
    pub clones: Vec<String>,
    /// What `lsvd replicate` last recorded for each replica, oldest update first.
    pub replicas: Vec<ReplicaInfo>,
    /// In a replica: the source it is copied from, as the last pass recorded it
    /// (`objects_behind_now` is 0: the source is not read).
    pub replica_of: Option<ReplicaInfo>,
}

/// One replica's state as its latest finished `lsvd replicate` pass recorded it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaInfo {
    /// The other store: the replica's (in the source's info), the source's (in the
    /// replica's).
    pub peer: String,
    /// When the latest pass finished (ms since the Unix epoch).
    pub updated_unix_ms: u64,
    /// The replica holds the volume as it was at this time (the pass's start).
    pub current_as_of_unix_ms: u64,
    /// Objects that pass found missing in the replica and copied.
    pub lag_objects: u64,
    /// The replica recovers every object below this sequence number.
    pub replica_next_seq: u64,
    /// Objects the volume has written since the pass (its next object now, less the
    /// replica's).
    pub objects_behind_now: u64,
}

impl ReplicaInfo {
    fn of(r: lsvd_core::format::replica_status::ReplicaStatus, objects_behind_now: u64) -> Self {
        ReplicaInfo {
            peer: r.peer,
            updated_unix_ms: r.updated_unix_ms,
            current_as_of_unix_ms: r.current_as_of_unix_ms,
            lag_objects: r.lag_objects,
            replica_next_seq: r.replica_next_seq,
            objects_behind_now,
        }
    }
}

/// What the checkpoint's write-frequency tracker says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeatInfo {
    pub region_bytes: u64,
    /// Regions written at least once.
    pub regions_written: u64,
    /// The hot fraction a GC pass would choose from these counters at the volume's
    /// utilization now (0: it would not separate).
    pub hot_fraction: f64,
    /// The hot regions' share of the (decayed) writes.
    pub hot_write_share: f64,
}

fn heat_info(saved: &CheckpointHeat, size_bytes: u64, utilization: f64) -> HeatInfo {
    // Counters kept under other limits than this version's are described as they
    // are (a tracker that grows takes any region size of at least 4 KiB).
    let tracker = [Some(size_bytes), None]
        .into_iter()
        .find_map(|size| {
            let mut t = lsvd_core::heat::HeatTracker::new(size);
            t.restore(saved).ok().map(|()| t)
        })
        .unwrap_or_default();
    let distribution = tracker.distribution();
    let choice = lsvd_core::hylog::choose(&distribution, utilization);
    HeatInfo {
        region_bytes: 1u64 << saved.region_shift,
        regions_written: distribution.iter().map(|&(_, n)| n).sum(),
        hot_fraction: choice.hot_fraction,
        hot_write_share: choice.hot_write_share,
    }
}

/// The volume's size now: the creation size in its metadata, changed by any
/// `lsvd resize` in its object stream (so this recovers the store's state).
pub async fn current_size_bytes(store: &DynStore, meta: &VolumeMeta) -> Result<u64> {
    Ok(recover_store(store, meta).await?.state.volume_size_bytes)
}

pub async fn inspect_volume(store: &DynStore, name: &str) -> Result<VolumeInfo> {
    let meta = read_meta(store, name).await?;
    let rec = recover_store(store, &meta).await?;
    let s = &rec.state;
    let store_bytes = s.stored_bytes();
    let utilization = if store_bytes == 0 {
        1.0
    } else {
        s.live_bytes() as f64 / store_bytes as f64
    };
    Ok(VolumeInfo {
        name: meta.name.clone(),
        volume_id: meta.volume.to_string(),
        // The size the store's objects give it (`lsvd resize`), not the creation size.
        size_bytes: s.volume_size_bytes,
        created_unix_secs: meta.created_unix_secs,
        live_bytes: s.live_bytes(),
        store_bytes,
        utilization,
        objects: s.objects().len() as u64,
        checkpoint_seq: rec.checkpoint_seq,
        closed_cleanly: rec.checkpoint_clean && rec.stranded.is_empty(),
        next_object_seq: s.next_object_seq(),
        last_record_seq: s.last_record_seq(),
        map_extents: s.map().extent_count() as u64,
        stranded_objects: rec.stranded.iter().map(|n| n.seq).collect(),
        client_write_bytes: rec.counters.client_write_bytes,
        store_write_bytes: rec.counters.store_write_bytes,
        write_amplification: if rec.counters.client_write_bytes == 0 {
            0.0
        } else {
            rec.counters.store_write_bytes as f64 / rec.counters.client_write_bytes as f64
        },
        gc_passes: rec.counters.gc_passes,
        gc_moved_bytes: rec.counters.gc_moved_bytes,
        gc_hot_moved_bytes: rec.counters.gc_hot_moved_bytes,
        gc_cold_moved_bytes: rec.counters.gc_cold_moved_bytes,
        heat: rec
            .heat
            .as_ref()
            .map(|h| heat_info(h, s.volume_size_bytes, utilization)),
        snapshots: super::snapshot::list_snapshots(store, &meta)
            .await?
            .into_iter()
            .map(|r| r.name)
            .collect(),
        parent: super::lineage::load_lineage(store, &meta).await?.parent(),
        clones: super::lineage::list_clones(store, &meta.name)
            .await?
            .into_iter()
            .map(|l| format!("{} (from @{})", l.clone, l.snapshot))
            .collect(),
        replicas: super::replicate::replica_statuses(store, &meta)
            .await?
            .into_iter()
            .map(|r| {
                let behind = s.next_object_seq().saturating_sub(r.replica_next_seq);
                ReplicaInfo::of(r, behind)
            })
            .collect(),
        replica_of: super::replicate::replica_of(store, &meta)
            .await?
            .map(|r| ReplicaInfo::of(r, 0)),
    })
}

/// Names of the volumes in a store.
pub async fn list_volumes(store: &DynStore) -> Result<Vec<String>> {
    Ok(list_volumes_and_leftovers(store).await?.0)
}

/// Names of the volumes in a store, and names with keys (other than a deleted
/// volume's tombstone) but no metadata.
pub async fn list_volumes_and_leftovers(store: &DynStore) -> Result<(Vec<String>, Vec<String>)> {
    let entries = store
        .list("")
        .await
        .map_err(|e| e.context(format!("cannot list {}", store.describe())))?;
    let mut volumes = std::collections::BTreeSet::new();
    let mut prefixes = std::collections::BTreeSet::new();
    for e in &entries {
        if let Some(n) = e.key.strip_suffix("/meta").filter(|n| !n.contains('/')) {
            volumes.insert(n.to_string());
        }
        // Superblock generations alone are what a finished delete leaves.
        if let Some((n, _)) = e.key.split_once('/')
            && validate_volume_name(n).is_ok()
            && super::keys::parse_super_name(&e.key).is_none()
        {
            prefixes.insert(n.to_string());
        }
    }
    let leftovers = prefixes.difference(&volumes).cloned().collect();
    Ok((volumes.into_iter().collect(), leftovers))
}
