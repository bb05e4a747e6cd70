//! What a pass checks before it copies anything: the target is not the source, holds
//! no other volume of that name, was not served since the last pass, and (for a clone)
//! already holds the parent.

use bytes::Bytes;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::decode_volume_super;

use super::list_objects;
use super::status::replica_of;
use crate::keys::{object_key, parse_super_name, snapshot_key, super_key, super_prefix};
use crate::lifecycle::lineage::Lineage;
use crate::store_meta::read_meta;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// Refuse a target that is the source under another name (same directory, same bucket
/// and prefix): a key written through one is read through the other.
pub(super) async fn ensure_distinct(source: &DynStore, target: &DynStore) -> Result<()> {
    let probe = format!(
        ".lsvd-replicate-probe-{:016x}",
        crate::store_meta::random_session_id()
    );
    target
        .put(&probe, Bytes::from_static(b"probe"), PutMode::IfAbsent)
        .await
        .map_err(|e| e.context(format!("cannot write to {}", target.describe())))?;
    let seen = source.get(&probe).await;
    target
        .delete(&probe)
        .await
        .map_err(|e| e.context(format!("cannot delete {probe} in {}", target.describe())))?;
    match seen {
        Ok(_) => Err(Error::new(
            ErrorKind::BadInput,
            format!(
                "the replica's store {} is the source store: replicate to another store or prefix",
                target.describe()
            ),
        )),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.context(format!("reading {}", source.describe()))),
    }
}

/// The target must not hold another volume of this name (or anything of one).
pub(super) async fn check_target_identity(target: &DynStore, meta: &VolumeMeta) -> Result<()> {
    let foreign = || {
        Error::new(
            ErrorKind::Conflict,
            format!(
                "{} already holds another volume named '{}' (delete it there, or replicate to another prefix)",
                target.describe(),
                meta.name
            ),
        )
    };
    match read_meta(target, &meta.name).await {
        Ok(m) if m.volume == meta.volume => return Ok(()),
        Ok(_) => return Err(foreign()),
        Err(e) if e.kind == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // No metadata yet: an earlier pass that did not finish, or someone else's keys.
    let dst = list_objects(target, &meta.name).await?;
    // (A sealed object's header cannot be read without the key: not checked then.)
    if let Some((&(seq, epoch), &(kind, _))) = dst.iter().next()
        && !crate::lifecycle::encryption::opaque(target, meta)
    {
        let key = object_key(&meta.name, seq, epoch, kind);
        let header = crate::recovery::store_recovery::read_header(target, &key).await?;
        if header.volume != meta.volume {
            return Err(foreign());
        }
    }
    Ok(())
}

/// The replica's newest superblock generation must be one replication put there: the
/// source still holds it with the same bytes, the replica's status record (written by
/// the pass that put it there) names it, or it carries the session id of a generation
/// the source holds. Anything else means the replica was served (a volume of its own now).
pub(super) async fn check_not_served(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
) -> Result<()> {
    let name = &meta.name;
    let Some(newest) = target
        .list(&super_prefix(name))
        .await?
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .max()
    else {
        return Ok(());
    };
    let key = super_key(name, newest);
    let theirs = target
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading {key} in the replica")))?;
    match source.get(&key).await {
        Ok(ours) if ours == theirs => return Ok(()),
        Ok(_) => return Err(written_elsewhere(name, target)),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.context(format!("reading {key}"))),
    }
    let recorded = replica_of(target, meta).await?.and_then(|s| s.generation);
    if recorded == Some(newest) {
        return Ok(());
    }
    // A pass stopped between the superblock and the record, and the source has
    // since dropped that generation: the generation still carries the session of the
    // source process that wrote it (a server of the replica picks a random one).
    let session = decode_volume_super(&theirs)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{key} in the replica: {e}")))?
        .session;
    for entry in source.list(&super_prefix(name)).await? {
        match source.get(&entry.key).await {
            Ok(bytes) => {
                if decode_volume_super(&bytes).is_ok_and(|sb| sb.session == session) {
                    return Ok(());
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.context(format!("reading {}", entry.key))),
        }
    }
    Err(written_elsewhere(name, target))
}

pub(super) fn written_elsewhere(name: &str, target: &DynStore) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "the replica of '{name}' in {} has been written by something other than replication (was it served?); replicate into another prefix, or delete it there first",
            target.describe()
        ),
    )
}

/// A clone's replica reads its ancestors' objects under their names: the parent (with
/// the snapshot the clone starts from) must be in the target already.
pub(super) async fn check_parent_replicated(
    target: &DynStore,
    meta: &VolumeMeta,
    lineage: &Lineage,
) -> Result<()> {
    let Some(parent) = lineage.0.last() else {
        return Ok(());
    };
    let need = || {
        Error::new(
            ErrorKind::BadInput,
            format!(
                "'{}' is a clone of {}@{}: replicate '{}' to {} first (its replica shares that snapshot's data)",
                meta.name,
                parent.name,
                parent.snapshot,
                parent.name,
                target.describe()
            ),
        )
    };
    match read_meta(target, &parent.name).await {
        Ok(m) if m.volume == parent.volume => {}
        Ok(_) => return Err(need()),
        Err(e) if e.kind == ErrorKind::NotFound => return Err(need()),
        Err(e) => return Err(e),
    }
    match target
        .get(&snapshot_key(&parent.name, &parent.snapshot))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Err(need()),
        Err(e) => Err(e.context("checking the parent's snapshot in the replica")),
    }
}
