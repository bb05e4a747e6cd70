//! Snapshots: a named point in a volume's object sequence, kept readable while the
//! volume goes on being written and garbage-collected.
//!
//! Why this shape: objects are immutable and numbered, so the volume as of object
//! `S` is a checkpoint `C < S` plus the objects from `C` up to `S`, replayed as
//! recovery does. A snapshot is just a record naming `C` and `S`
//! (`lsvd_core::format::snapshot`, at `<volume>/snap/<name>`); what it costs is that
//! garbage collection must not delete those objects. GC still copies the live data out
//! of them for the volume (the live map moves on), it only leaves the objects
//! themselves in the store (the LSVD paper's rule, made exact: an object is kept while
//! some snapshot's checkpoint lists it or it lies in some snapshot's replay range).
//!
//! Every delete of a volume's data objects and checkpoints (deferred deletes after a
//! checkpoint, old checkpoints, garbage found at open) asks [`Pins`] first, and the
//! two that run while serving hold [`Shared::deletions`], the lock snapshot creation
//! also holds while it chooses its checkpoint and records its pin: a checkpoint being
//! named meanwhile cannot delete what the new snapshot is about to need. Deleting a
//! snapshot deletes the objects only it kept (not live, not waiting for a deferred
//! delete, not another snapshot's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use lsvd_core::format::object::ObjectKind;
use lsvd_core::format::snapshot::{SnapshotRecord, decode_snapshot, encode_snapshot};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::history::Owner;
use lsvd_core::store_state::StoreState;

use crate::keys::{object_key, objects_prefix, parse_object_name, snapshot_key, snapshots_prefix};
use crate::locks::LockRank;
use crate::maintenance::pins::{Pin, Pins};
use crate::recovery::store_recovery::{load_checkpoint, read_header};
use crate::volume::Volume;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// Snapshot names follow the volume-name rules (they appear in keys and export names).
pub fn validate_snapshot_name(name: &str) -> Result<()> {
    crate::keys::validate_volume_name(name)
        .map_err(|_| Error::bad_input(format!(
            "invalid snapshot name '{name}': use 1-64 characters from A-Z a-z 0-9 . _ - (not starting with '.')"
        )))
}

/// Split an export name `VOL@SNAP` into the volume and the snapshot.
pub fn split_export_name(export: &str) -> (&str, Option<&str>) {
    match export.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (export, None),
    }
}

/// Every snapshot of `meta`'s volume, oldest first. A record that fails its checks
/// or names another volume is `Corrupt` (ignoring it could let GC delete what it
/// keeps).
pub async fn list_snapshots(store: &DynStore, meta: &VolumeMeta) -> Result<Vec<SnapshotRecord>> {
    let prefix = snapshots_prefix(&meta.name);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list the snapshots of '{}'", meta.name)))?;
    let mut out = Vec::new();
    for entry in listing {
        let bytes = match store.get(&entry.key).await {
            Ok(b) => b,
            // Deleted between the listing and the read.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.context(format!("cannot read {}", entry.key))),
        };
        out.push(decode_record(meta, &entry.key, &bytes)?);
    }
    out.sort_by_key(|r| (r.through_seq, r.created_unix_ms));
    Ok(out)
}

fn decode_record(meta: &VolumeMeta, key: &str, bytes: &[u8]) -> Result<SnapshotRecord> {
    let record = decode_snapshot(bytes).map_err(|e| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("snapshot record {key} is corrupt"),
            e,
        )
    })?;
    if record.volume != meta.volume || snapshot_key(&meta.name, &record.name) != key {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("snapshot record {key} belongs to another volume or name"),
        ));
    }
    Ok(record)
}

/// Snapshot `snap` of `meta`'s volume; `NotFound` names the snapshots there are.
pub async fn read_snapshot(
    store: &DynStore,
    meta: &VolumeMeta,
    snap: &str,
) -> Result<SnapshotRecord> {
    validate_snapshot_name(snap)?;
    let key = snapshot_key(&meta.name, snap);
    match store.get(&key).await {
        Ok(bytes) => decode_record(meta, &key, &bytes),
        Err(e) if e.is_not_found() => {
            let names: Vec<String> = list_snapshots(store, meta)
                .await
                .map(|l| l.into_iter().map(|r| r.name).collect())
                .unwrap_or_default();
            Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "volume '{}' has no snapshot '{snap}' (it has {})",
                    meta.name,
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            ))
        }
        Err(e) => Err(e.context(format!("cannot read {key}"))),
    }
}

/// What `record` keeps: its base checkpoint's list is read from the store. A base
/// checkpoint that is gone or corrupt makes the snapshot unreadable, not the volume:
/// a warning, and the snapshot keeps its replay range only.
async fn pin_for(store: &DynStore, meta: &VolumeMeta, record: SnapshotRecord) -> Result<Pin> {
    let listed = match record.base_checkpoint {
        None => BTreeSet::new(),
        Some(c) => match load_checkpoint(store, meta, c, base_epoch(&record)).await {
            Ok(loaded) => loaded.state.objects().keys().copied().collect(),
            Err(e) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::Corrupt) => {
                lsvd_store::log::warn(&format!(
                    "snapshot {}@{} cannot be read ({e}); `lsvd snapshot delete {} {}` removes it",
                    meta.name, record.name, meta.name, record.name
                ));
                BTreeSet::new()
            }
            Err(e) => return Err(e.context(format!("snapshot '{}'", record.name))),
        },
    };
    Ok(Pin::new(record, listed))
}

/// The epoch of `record`'s base checkpoint (0 for records written before epochs).
fn base_epoch(record: &SnapshotRecord) -> u64 {
    record
        .base_checkpoint
        .and_then(|c| record.history.epoch_of(c))
        .unwrap_or(0)
}

/// What every snapshot of `meta`'s volume keeps.
pub(crate) async fn load_pins(store: &DynStore, meta: &VolumeMeta) -> Result<Pins> {
    let mut pins = Vec::new();
    for record in list_snapshots(store, meta).await? {
        pins.push(pin_for(store, meta, record).await?);
    }
    Ok(Pins(pins))
}

/// The store's state as of `record`: its base checkpoint, then every object after it
/// below its end, in order. A missing object is `DataLoss` (the snapshot kept it, so
/// something else deleted it).
pub(crate) async fn snapshot_state(
    store: &DynStore,
    meta: &VolumeMeta,
    record: &SnapshotRecord,
) -> Result<StoreState> {
    let mut state = match record.base_checkpoint {
        Some(c) => {
            load_checkpoint(store, meta, c, base_epoch(record))
                .await?
                .state
        }
        None => StoreState::new(meta.size_bytes),
    };
    let listing = store
        .list(&objects_prefix(&meta.name))
        .await
        .map_err(|e| e.context(format!("cannot list objects of '{}'", meta.name)))?;
    let kinds: BTreeMap<(u64, u64), ObjectKind> = listing
        .iter()
        .filter_map(|e| parse_object_name(&e.key))
        .map(|n| ((n.seq, n.epoch), n.kind))
        .collect();
    let mut seq = state.next_object_seq();
    while seq < record.through_seq {
        let epoch = match record.history.owner(seq) {
            Owner::Epoch(e) => e,
            Owner::Hole { resumes_at } => {
                state.skip_to(resumes_at).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, format!("snapshot '{}'", record.name), e)
                })?;
                seq = resumes_at;
                continue;
            }
            Owner::Unknown => 0,
        };
        let Some(&kind) = kinds.get(&(seq, epoch)) else {
            return Err(Error::new(
                ErrorKind::DataLoss,
                format!(
                    "snapshot '{}' of '{}' needs object {}, which is missing from the store",
                    record.name,
                    meta.name,
                    object_key(&meta.name, seq, epoch, ObjectKind::Data)
                ),
            ));
        };
        let key = object_key(&meta.name, seq, epoch, kind);
        let header = read_header(store, &key).await?;
        if header.volume != meta.volume
            || header.seq != seq
            || header.kind != kind
            || header.epoch != epoch
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("object {key} does not match its name"),
            ));
        }
        state
            .apply(&header)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("object {key}"), e))?;
        seq += 1;
    }
    Ok(state)
}

impl Volume {
    /// Take snapshot `name` of this volume: every write acknowledged before the call
    /// is in it. Makes those writes durable in the store first ([`Volume::sync_to_store`]),
    /// then records the point reached. `AlreadyExists` if the name is taken,
    /// `ReadOnly` on a snapshot export, `Transient` while the volume is not yet
    /// claimed in the store.
    pub async fn create_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        validate_snapshot_name(name)?;
        self.refuse_on_snapshot("take snapshots of the volume")?;
        let shared = &self.shared;
        let key = snapshot_key(&shared.meta.name, name);
        match shared.store.get(&key).await {
            Ok(_) => return Err(taken(&shared.meta.name, name)),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.context(format!("cannot read {key}"))),
        }
        self.sync_to_store().await?;
        let _deletions = shared.deletions.lock().await;
        if !shared.volume_claimed.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Transient,
                "the volume is not claimed in the store yet (is the store reachable?); try again",
            ));
        }
        let (through_seq, last_record_seq) = {
            let st = shared.lock();
            let store = st.pipeline.store();
            // Not into a split batch whose last part is not applied yet (a batch
            // written after the call): the snapshot holds whole batches only.
            (store.whole_next_object_seq(), store.last_record_seq())
        };
        let (base_checkpoint, history) = {
            let sb = shared.lock_ranked(&shared.volume_super, LockRank::VolumeSuper);
            let base = sb.newest_checkpoint.filter(|&c| c < through_seq);
            (base, sb.history.pruned(base.unwrap_or(0)))
        };
        let record = SnapshotRecord {
            volume: shared.meta.volume,
            name: name.to_string(),
            base_checkpoint,
            through_seq,
            last_record_seq,
            created_unix_ms: shared.clock().unix_ms(),
            history,
        };
        let pin = pin_for(&shared.store, &shared.meta, record.clone()).await?;
        let bytes = encode_snapshot(&record).map_err(|e| Error::bad_input(e.to_string()))?;
        // Pinned before the put: a put that fails may still have landed, and then the
        // snapshot exists and needs its objects. A pin left by a put that did not land
        // only keeps objects until the next open rebuilds the pins from the records.
        shared.lock_ranked(&shared.pins, LockRank::Pins).0.push(pin);
        put_record(shared, &key, bytes, name).await?;
        lsvd_store::log::debug(&format!(
            "snapshot {}@{name}: objects below {through_seq:016x} (write-log records through {last_record_seq})",
            shared.meta.name
        ));
        Ok(record)
    }

    /// Delete snapshot `name` and the objects only it kept. Returns how many objects
    /// were deleted. `NotFound` if there is no such snapshot.
    pub async fn delete_snapshot(&self, name: &str) -> Result<u64> {
        validate_snapshot_name(name)?;
        let shared = &self.shared;
        if shared.snapshot.is_some() {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                "this export is a snapshot: delete snapshots through the volume",
            ));
        }
        let record = read_snapshot(&shared.store, &shared.meta, name).await?;
        crate::lifecycle::lineage::refuse_if_cloned(&shared.store, &shared.meta.name, Some(name))
            .await
            .map_err(|e| {
                e.context(format!(
                    "cannot delete snapshot {}@{name}",
                    shared.meta.name
                ))
            })?;
        let _deletions = shared.deletions.lock().await;
        let key = snapshot_key(&shared.meta.name, name);
        shared
            .store
            .delete(&key)
            .await
            .map_err(|e| e.context(format!("cannot delete {key}")))?;
        let released = {
            let mut pins = shared.lock_ranked(&shared.pins, LockRank::Pins);
            let at = pins.0.iter().position(|p| p.record.name == name);
            at.map(|i| pins.0.remove(i))
        };
        let Some(released) = released else {
            // Taken by a process that did not know of it: the next open settles it.
            return Ok(0);
        };
        debug_assert_eq!(released.record, record);
        let listing = shared
            .store
            .list(&objects_prefix(&shared.meta.name))
            .await
            .map_err(|e| e.context("cannot list objects"))?;
        let named = shared
            .lock_ranked(&shared.volume_super, LockRank::VolumeSuper)
            .clone();
        let deferred: BTreeSet<u64> = shared
            .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
            .iter()
            .map(|d| d.seq)
            .collect();
        let doomed: Vec<(crate::keys::ObjectName, u64)> = {
            let st = shared.lock();
            let store = st.pipeline.store();
            let pins = shared.lock_ranked(&shared.pins, LockRank::Pins);
            listing
                .iter()
                .filter_map(|e| parse_object_name(&e.key).map(|n| (n, e.size_bytes)))
                .filter(|(n, _)| {
                    let seq = n.seq;
                    released.holds(seq)
                        && !pins.holds(seq)
                        && seq < store.next_object_seq()
                        && !store.objects().contains_key(&seq)
                        && !store.checkpoints().contains_key(&seq)
                        && !deferred.contains(&seq)
                        && named.newest_checkpoint != Some(seq)
                        && named.previous_checkpoint != Some(seq)
                })
                .collect()
        };
        // Every doomed object was left out by the newest named checkpoint or an earlier
        // one: a replication pass from a checkpoint before the newest may need it
        // (`replica_hold`, with the passes read at the latest checkpoint). Such objects
        // wait in the deferred list as if that checkpoint had left them out.
        let newest = named.newest_checkpoint.unwrap_or(0);
        let holds = shared
            .lock_ranked(&shared.replica_holds, LockRank::ReplicaHolds)
            .current
            .clone();
        let mut deleted = 0;
        for (n, total_bytes) in doomed {
            if holds.keeps_object(n.seq, newest) {
                shared
                    .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
                    .push(crate::shared::DeferredDelete {
                        seq: n.seq,
                        epoch: n.epoch,
                        kind: n.kind,
                        total_bytes,
                        left_out_by: newest,
                    });
                continue;
            }
            let key = object_key(&shared.meta.name, n.seq, n.epoch, n.kind);
            match shared.store.delete(&key).await {
                Ok(()) => {
                    deleted += 1;
                    shared.stats.objects_deleted.fetch_add(1, Ordering::Relaxed);
                }
                // Found again as garbage at the next open.
                Err(e) => lsvd_store::log::warn(&format!("could not delete {key}: {e}")),
            }
        }
        Ok(deleted)
    }
}

/// Write the record with put-if-absent, retrying a store that fails for now a few
/// times. A retry that finds its own bytes (the earlier put landed) succeeded.
async fn put_record(
    shared: &crate::shared::Shared,
    key: &str,
    bytes: Vec<u8>,
    name: &str,
) -> Result<()> {
    const ATTEMPTS: u32 = 6;
    let bytes = Bytes::from(bytes);
    let mut backoff = lsvd_store::retry::Backoff::new(shared.jitter_fraction().to_bits());
    let put = lsvd_store::retry::put_if_absent_retried(
        shared.store.as_ref(),
        key,
        bytes.clone(),
        ATTEMPTS,
        shared.clock(),
        &mut backoff,
        &format!("writing snapshot record {key}"),
    )
    .await
    .map_err(|e| {
        e.context(format!(
            "cannot write {key} (it may have landed all the same: `lsvd snapshot list` tells)"
        ))
    })?;
    match put {
        lsvd_store::retry::PutIfAbsent::Landed => Ok(()),
        // Ours if it holds these very bytes (an earlier attempt's answer was lost).
        lsvd_store::retry::PutIfAbsent::Exists(found) if found == bytes => Ok(()),
        lsvd_store::retry::PutIfAbsent::Exists(_) => Err(taken(&shared.meta.name, name)),
    }
}

fn taken(volume: &str, name: &str) -> Error {
    Error::new(
        ErrorKind::AlreadyExists,
        format!("volume '{volume}' already has a snapshot '{name}'"),
    )
}
