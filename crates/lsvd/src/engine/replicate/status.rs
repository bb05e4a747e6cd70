//! The replica status records (`docs/format/replica-status.md`): one in the source
//! for `lsvd info`, one in the replica that tells the next pass which superblock
//! generation replication put there.

use bytes::Bytes;
use lsvd_core::format::replica_status::{
    ReplicaStatus, cut_peer, decode_replica_status, encode_replica_status,
};
use lsvd_core::format::volume_meta::VolumeMeta;

use super::{PassReport, unix_ms};
use crate::engine::keys::{replica_of_key, replica_status_key, replicas_prefix};
use crate::engine::store_meta::read_meta;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{DynStore, PutMode};

/// Record the pass in the source store for `lsvd info` (informational: a failure is a
/// warning, not an error of the copy).
pub(super) async fn record_status(
    source: &DynStore,
    target: &DynStore,
    name: &str,
    report: &PassReport,
    started_unix_ms: u64,
) {
    let result = async {
        let meta = read_meta(source, name).await?;
        let bytes = status_bytes(&meta, report, started_unix_ms, &target.describe())?;
        source
            .put(
                &replica_status_key(name, &target.describe()),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await
    }
    .await;
    if let Err(e) = result {
        crate::log::warn(&format!(
            "replicate {name}: could not record the replica's status in the source store: {e}"
        ));
    }
}

/// A status record of `report` (see `docs/format/replica-status.md`); `peer` is the
/// other store's description.
pub(super) fn status_bytes(
    meta: &VolumeMeta,
    report: &PassReport,
    started_unix_ms: u64,
    peer: &str,
) -> Result<Vec<u8>> {
    let status = ReplicaStatus {
        volume: meta.volume,
        updated_unix_ms: unix_ms().max(started_unix_ms),
        current_as_of_unix_ms: started_unix_ms,
        lag_objects: report.objects_copied + report.checkpoints_copied,
        replica_next_seq: report.replica_next_seq,
        source_next_seq: report.source_next_seq,
        bytes_copied: report.bytes_copied,
        generation: report.generation,
        peer: cut_peer(peer),
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

/// What `lsvd replicate` recorded about each replica of `meta`'s volume, oldest
/// update first; a record that does not decode is skipped with a warning.
pub async fn replica_statuses(store: &DynStore, meta: &VolumeMeta) -> Result<Vec<ReplicaStatus>> {
    let mut out = Vec::new();
    for entry in store.list(&replicas_prefix(&meta.name)).await? {
        let bytes = match store.get(&entry.key).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.context(format!("reading {}", entry.key))),
        };
        match decode_replica_status(&bytes) {
            Ok(s) if s.volume == meta.volume => out.push(s),
            Ok(_) => crate::log::warn(&format!("{} names another volume", entry.key)),
            Err(e) => crate::log::warn(&format!("{} is corrupt: {e}", entry.key)),
        }
    }
    out.sort_by_key(|s| s.updated_unix_ms);
    Ok(out)
}
