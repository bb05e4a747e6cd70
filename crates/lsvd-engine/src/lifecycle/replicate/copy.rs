//! Moving bytes: objects (verified on the way, several at a time), snapshot records,
//! the superblock generation and small keys.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use lsvd_core::format::object::{ObjectKind, decode_object_header};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;

use super::guard::written_elsewhere;
use super::identity::{Identity, same_object};
use super::{PassError, Raced, ReplicateProgress};
use crate::fencing::volume_super::GENERATIONS_KEPT;
use crate::keys::{object_key, parse_super_name, snapshot_key, super_key, super_prefix};
use crate::lifecycle::snapshot::list_snapshots;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// Object `seq` of the source, checked whole: header names it, every chunk verifies
/// (an encrypted volume's without its key: a sealed envelope of a possible length).
pub(super) async fn get_verified(
    source: &DynStore,
    meta: &VolumeMeta,
    seq: u64,
    epoch: u64,
    kind: ObjectKind,
) -> std::result::Result<Bytes, PassError> {
    let key = object_key(&meta.name, seq, epoch, kind);
    let bytes = match source.get(&key).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(PassError::Raced(Raced(format!("object {key} vanished"))));
        }
        Err(e) => return Err(PassError::Failed(e.context(format!("reading {key}")))),
    };
    let corrupt = |why: String| {
        PassError::Failed(Error::new(
            ErrorKind::Corrupt,
            format!("source object {key} {why}; not copying it"),
        ))
    };
    if crate::lifecycle::encryption::opaque(source, meta) {
        // Sealed, and no key: the envelope and its length are all there is to check.
        let sealed_len_ok =
            lsvd_core::format::sealed::plain_len(bytes.len() as u64).is_some_and(|n| n > 0);
        lsvd_core::format::sealed::decode_sealed_header(&bytes)
            .map_err(|e| corrupt(format!("is not a sealed object ({e})")))?;
        if !sealed_len_ok {
            return Err(corrupt(format!(
                "has a sealed length of {} bytes",
                bytes.len()
            )));
        }
        return Ok(Bytes::from(bytes));
    }
    let header = decode_object_header(&bytes).map_err(|e| corrupt(format!("is corrupt ({e})")))?;
    if header.volume != meta.volume
        || header.seq != seq
        || header.kind != kind
        || header.epoch != epoch
    {
        return Err(corrupt("does not match its name".to_string()));
    }
    let payload = bytes
        .get(header.header_bytes as usize..)
        .ok_or_else(|| corrupt("is shorter than its header".to_string()))?;
    header
        .verify_stored_data(payload)
        .map_err(|e| corrupt(format!("fails its checksums ({e})")))?;
    Ok(Bytes::from(bytes))
}

/// Put an object: one already there under the key is replaced (the caller found it
/// is not the source's, by its size or its identity).
pub(super) async fn put_object(target: &DynStore, key: &str, bytes: Bytes) -> Result<()> {
    target
        .put(key, bytes, PutMode::Overwrite)
        .await
        .map_err(|e| e.context(format!("writing {key} to {}", target.describe())))
}

/// An object a pass needs in the replica.
pub(super) struct Item {
    pub seq: u64,
    pub epoch: u64,
    pub kind: ObjectKind,
    pub size_bytes: u64,
    /// The replica holds an object of that name and size: compare identities first,
    /// copy only if they differ.
    pub check_first: bool,
}

/// What became of an [`Item`].
pub(super) struct Done {
    pub seq: u64,
    pub epoch: u64,
    pub identity: Identity,
    /// Its identity was read from both stores.
    pub checked: bool,
    /// Copied (after a check: the replica's object was another, now replaced).
    pub copied: bool,
}

/// Bring `items` into the replica, `jobs` at a time.
pub(super) async fn copy_objects(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
    items: Vec<Item>,
    jobs: usize,
    progress: &ReplicateProgress,
) -> std::result::Result<Vec<Done>, PassError> {
    let meta = Arc::new(meta.clone());
    let mut pending = items.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut done = Vec::new();
    loop {
        while running.len() < jobs.max(1) {
            let Some(item) = pending.next() else {
                break;
            };
            let (source, target, meta) = (source.clone(), target.clone(), meta.clone());
            running.spawn(async move {
                let key = object_key(&meta.name, item.seq, item.epoch, item.kind);
                let finished = |identity, copied| Done {
                    seq: item.seq,
                    epoch: item.epoch,
                    identity,
                    checked: item.check_first,
                    copied,
                };
                if item.check_first {
                    if let Some(identity) =
                        same_object(&source, &target, &key, item.size_bytes).await?
                    {
                        return Ok::<Done, PassError>(finished(identity, false));
                    }
                    lsvd_store::log::warn(&format!(
                        "replicate {}: the replica's {key} is not the source's object (same name and size, other header): replacing it",
                        meta.name
                    ));
                }
                let data = get_verified(&source, &meta, item.seq, item.epoch, item.kind).await?;
                let identity = Identity::of(&data);
                put_object(&target, &key, data).await?;
                Ok(finished(identity, true))
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        let d = joined.map_err(|e| {
            PassError::Failed(Error::new(
                ErrorKind::Permanent,
                format!("a copy task failed: {e}"),
            ))
        })??;
        progress.objects_done.fetch_add(1, Ordering::Relaxed);
        if d.copied {
            progress
                .bytes_done
                .fetch_add(d.identity.total_bytes, Ordering::Relaxed);
        }
        done.push(d);
    }
    Ok(done)
}

pub(super) async fn copy_snapshot_records(
    target: &DynStore,
    meta: &VolumeMeta,
    snapshots: &[(String, Vec<u8>)],
) -> Result<u64> {
    let mut copied = 0;
    for (snapshot, bytes) in snapshots {
        let key = snapshot_key(&meta.name, snapshot);
        match target
            .put(&key, Bytes::from(bytes.clone()), PutMode::IfAbsent)
            .await
        {
            Ok(()) => copied += 1,
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                let have = target.get(&key).await?;
                if &have != bytes {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "the replica's snapshot {} differs from the source's: it was not written by replication",
                            key
                        ),
                    ));
                }
            }
            Err(e) => return Err(e.context(format!("writing {key}"))),
        }
    }
    Ok(copied)
}

pub(super) async fn delete_gone_snapshots(
    target: &DynStore,
    meta: &VolumeMeta,
    snapshots: &[(String, Vec<u8>)],
) -> Result<u64> {
    let mut deleted = 0;
    for record in list_snapshots(target, meta).await? {
        if snapshots.iter().any(|(n, _)| *n == record.name) {
            continue;
        }
        let key = snapshot_key(&meta.name, &record.name);
        target
            .delete(&key)
            .await
            .map_err(|e| e.context(format!("deleting {key}")))?;
        deleted += 1;
    }
    Ok(deleted)
}

/// Put the source's superblock generation `sb` into the replica, verbatim (`bytes`,
/// read from the source when the pass began), and drop the replica's generations older
/// than the ones kept. A generation the replica holds that the source did not write
/// is `Conflict`.
pub(super) async fn copy_superblock(
    target: &DynStore,
    meta: &VolumeMeta,
    sb: &VolumeSuper,
    bytes: Bytes,
) -> Result<()> {
    let name = &meta.name;
    let key = super_key(name, sb.generation);
    let generations: Vec<u64> = target
        .list(&super_prefix(name))
        .await?
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .collect();
    let written_elsewhere = || written_elsewhere(name, target);
    if generations.iter().any(|&g| g > sb.generation) {
        return Err(written_elsewhere());
    }
    match target.put(&key, bytes.clone(), PutMode::IfAbsent).await {
        Ok(()) => {}
        Err(e) if e.kind == ErrorKind::AlreadyExists => {
            if target.get(&key).await? != bytes {
                return Err(written_elsewhere());
            }
        }
        Err(e) => return Err(e.context(format!("writing {key}"))),
    }
    for g in generations {
        if g + GENERATIONS_KEPT <= sb.generation {
            target.delete(&super_key(name, g)).await?;
        }
    }
    Ok(())
}

/// Copy one small key (metadata, links) if the target lacks it.
pub(super) async fn copy_key(source: &DynStore, target: &DynStore, key: &str) -> Result<()> {
    let bytes = source
        .get(key)
        .await
        .map_err(|e| e.context(format!("reading {key}")))?;
    match target.put(key, Bytes::from(bytes), PutMode::IfAbsent).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.context(format!("writing {key}"))),
    }
}
