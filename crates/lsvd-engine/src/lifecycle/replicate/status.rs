//! The replica status records (`docs/format/replica-status.md`): one in the source
//! for `lsvd info` and for the serving engine, which keeps what a pass in progress
//! still needs (`engine::replica_hold`); one in the replica that tells the next pass
//! which superblock generation replication put there.

use bytes::Bytes;
use lsvd_core::format::replica_status::{
    PassInProgress, ReplicaStatus, cut_peer, decode_replica_status, encode_replica_status,
};
use lsvd_core::format::volume_meta::VolumeMeta;

use super::PassReport;
use crate::keys::{replica_of_key, replica_status_key, replicas_prefix};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// The record of volume `volume`'s replica in `peer` before any pass finished:
/// "updated at" 0 says so (`replica_statuses` skips it), no pass under way.
pub(crate) fn unfinished_status(
    volume: lsvd_core::format::VolumeId,
    peer: String,
) -> ReplicaStatus {
    ReplicaStatus {
        volume,
        updated_unix_ms: 0,
        current_as_of_unix_ms: 0,
        lag_objects: 0,
        replica_next_seq: 0,
        source_next_seq: 0,
        bytes_copied: 0,
        generation: None,
        peer,
        pass: None,
    }
}

/// Record the finished pass in the source store, with no pass in progress (for
/// `lsvd info`; a failure is a warning, not an error of the copy).
pub(super) async fn record_status(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
    report: &PassReport,
    started_unix_ms: u64,
) {
    let result = async {
        let bytes = status_bytes(meta, report, started_unix_ms, &target.describe())?;
        source
            .put(
                &replica_status_key(&meta.name, &target.describe()),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await
    }
    .await;
    if let Err(e) = result {
        lsvd_store::log::warn(&format!(
            "replicate {}: could not record the replica's status in the source store: {e}",
            meta.name
        ));
    }
}

/// Say in the source's record which pass is under way (`Some`: the engine keeps what
/// it needs) or that none is (`None`), keeping what the record says of the last
/// finished pass. Returns whether the record was written: a source store that refuses
/// (a replicator with read-only credentials) is a warning, and the pass runs without
/// the source keeping anything for it, as before the record had a pass.
pub(super) async fn record_pass(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
    pass: Option<PassInProgress>,
) -> bool {
    let key = replica_status_key(&meta.name, &target.describe());
    let result = async {
        let last = match source.get(&key).await {
            Ok(bytes) => decode_replica_status(&bytes)
                .ok()
                .filter(|s| s.volume == meta.volume),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.context(format!("reading {key}"))),
        };
        let status = ReplicaStatus {
            pass,
            ..last.unwrap_or_else(|| unfinished_status(meta.volume, cut_peer(&target.describe())))
        };
        let bytes = encode_replica_status(&status)
            .map_err(|e| Error::with_source(ErrorKind::BadInput, "replica status", e))?;
        source
            .put(&key, Bytes::from(bytes), PutMode::Overwrite)
            .await
            .map_err(|e| e.context(format!("writing {key}")))
    }
    .await;
    match result {
        Ok(()) => true,
        Err(e) => {
            lsvd_store::log::warn(&format!(
                "replicate {}: could not record the pass in the source store, so the source's GC does not keep what the pass needs: {e}",
                meta.name
            ));
            false
        }
    }
}

/// Say in the replica's record (`<volume>/replica-of`) that a pass is under way, before
/// it copies objects of a claim of the source newer than the replica's superblock
/// (generation `generation`): until the pass puts the superblock that claimed them,
/// recovery of the replica takes them for that superblock's objects on their way, not
/// for a lost superblock (`store_recovery`), so a pass stopped there leaves a replica
/// that opens as it was. The step that puts the superblock clears it.
pub(super) async fn mark_replica_pass(
    target: &DynStore,
    meta: &VolumeMeta,
    generation: u64,
    pass: PassInProgress,
    source: &str,
) -> Result<()> {
    let status = match replica_of(target, meta).await? {
        Some(s) => s,
        // A pass stopped between the superblock and its record (`check_not_served`
        // found the generation to be replication's).
        None => ReplicaStatus {
            generation: Some(generation),
            ..unfinished_status(meta.volume, cut_peer(source))
        },
    };
    let bytes = encode_replica_status(&ReplicaStatus {
        pass: Some(pass),
        ..status
    })
    .map_err(|e| Error::with_source(ErrorKind::BadInput, "replica status", e))?;
    target
        .put(
            &replica_of_key(&meta.name),
            Bytes::from(bytes),
            PutMode::Overwrite,
        )
        .await
        .map_err(|e| e.context("writing the replica's status record"))
}

/// A status record of `report` (see `docs/format/replica-status.md`), with no pass in
/// progress; `peer` is the other store's description.
pub(super) fn status_bytes(
    meta: &VolumeMeta,
    report: &PassReport,
    started_unix_ms: u64,
    peer: &str,
) -> Result<Vec<u8>> {
    let status = ReplicaStatus {
        volume: meta.volume,
        updated_unix_ms: lsvd_store::clock::unix_ms_now().max(started_unix_ms),
        current_as_of_unix_ms: started_unix_ms,
        lag_objects: report.objects_copied + report.checkpoints_copied,
        replica_next_seq: report.replica_next_seq,
        source_next_seq: report.source_next_seq,
        bytes_copied: report.bytes_copied,
        generation: report.generation,
        peer: cut_peer(peer),
        pass: None,
    };
    encode_replica_status(&status)
        .map_err(|e| Error::with_source(ErrorKind::BadInput, "replica status", e))
}

/// The status record the replica holds (`<volume>/replica-of`), if it holds a valid one.
pub async fn replica_of(store: &DynStore, meta: &VolumeMeta) -> Result<Option<ReplicaStatus>> {
    match store.get(&replica_of_key(&meta.name)).await {
        Ok(bytes) => Ok(decode_replica_status(&bytes)
            .ok()
            .filter(|s| s.volume == meta.volume)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.context("reading the replica's status record")),
    }
}

/// What `lsvd replicate` recorded about each replica of `meta`'s volume that finished
/// a pass, oldest update first; a record that does not decode is skipped with a
/// warning.
pub async fn replica_statuses(store: &DynStore, meta: &VolumeMeta) -> Result<Vec<ReplicaStatus>> {
    let mut out = Vec::new();
    for entry in store.list(&replicas_prefix(&meta.name)).await? {
        let bytes = match store.get(&entry.key).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.context(format!("reading {}", entry.key))),
        };
        match decode_replica_status(&bytes) {
            Ok(s) if s.volume != meta.volume => {
                lsvd_store::log::warn(&format!("{} names another volume", entry.key));
            }
            // Its first pass is still running: nothing to say yet.
            Ok(s) if s.updated_unix_ms == 0 => {}
            Ok(s) => out.push(s),
            Err(e) => lsvd_store::log::warn(&format!("{} is corrupt: {e}", entry.key)),
        }
    }
    out.sort_by_key(|s| s.updated_unix_ms);
    Ok(out)
}
