//! Writable clones: a volume that starts as another volume's snapshot and shares its
//! objects (the LSVD paper's Fig. 5).
//!
//! Why this shape: objects are immutable and numbered in one sequence, so a clone made
//! from snapshot `P@S` can simply continue `P`'s numbering from the snapshot's
//! `through_seq` in its own namespace. Its first object is a checkpoint (written at
//! clone time, in the clone's name) that lists the snapshot's state, which names `P`'s
//! objects by sequence number; recovery and everything after it are a plain volume's.
//! What differs is only *where an object lives*: [`Lineage`] maps every sequence
//! number below the clone's start to the ancestor that owns it (for a clone of a
//! clone, the grandparent below the parent's own start), and the clone never deletes
//! an object it does not own, nor does its GC collect one: GC weighs and collects only
//! the clone's own objects (`StoreState::set_shared_below`), so the snapshot's data is
//! stored once however many clones share it, and a clone costs only what it writes.
//!
//! The link (`lsvd_core::format::clone_link`) is stored twice: `<clone>/parent`, read
//! at every open, and `<parent>/clones/<clone>`, which makes the parent refuse to
//! delete the snapshot or itself while the clone exists. The snapshot keeps the
//! shared objects alive in the parent ([`crate::lifecycle::snapshot`]).

use bytes::Bytes;
use lsvd_core::format::checkpoint::encode_checkpoint;
use lsvd_core::format::clone_link::{CloneLink, encode_clone_link};
use lsvd_core::format::object::{ObjectKind, ObjectSpec, encode_object};
use lsvd_core::format::volume_meta::VolumeMeta;

use crate::keys::{meta_key, object_key, validate_volume_name};
use crate::lifecycle::lineage::{child_key, parent_key};
use crate::store_meta::{is_being_deleted, random_volume_id, read_meta, write_meta};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// Remove `clone`'s link from its parent (after the clone is deleted). Best effort:
/// a leftover link only makes the parent refuse deletes, naming the clone.
pub(crate) async fn unlink_from_parent(store: &DynStore, link: &CloneLink) {
    let key = child_key(&link.parent, &link.clone);
    if let Err(e) = store.delete(&key).await {
        lsvd_store::log::warn(&format!("could not delete {key}: {e}"));
    }
}

/// Make volume `name`, a writable clone of snapshot `parent@snapshot`. In order: the
/// link in the clone, the link in the parent (from then on the parent refuses to
/// delete the snapshot), the clone's first checkpoint (the snapshot's state), and last
/// the metadata, which makes the volume exist. Stopped halfway, it leaves keys
/// without metadata (`lsvd list` names them, `lsvd delete NAME --yes` removes them and
/// the link in the parent). Not guarded: a `snapshot delete` of the same snapshot
/// running at the same moment may miss the new link (the store has no transactions).
pub async fn create_clone(
    store: &DynStore,
    parent: &str,
    snapshot: &str,
    name: &str,
) -> Result<VolumeMeta> {
    validate_volume_name(name)?;
    let parent_meta = read_meta(store, parent).await?;
    crate::lifecycle::encryption::require_unlocked(store, &parent_meta)?;
    if is_being_deleted(store, &parent_meta).await? {
        return Err(crate::fencing::volume_super::being_deleted(parent));
    }
    let record = crate::lifecycle::snapshot::read_snapshot(store, &parent_meta, snapshot).await?;
    let prefix = format!("{name}/");
    let existing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    if !existing.is_empty() {
        let what = if existing.iter().any(|e| e.key == meta_key(name)) {
            format!("volume '{name}' exists already")
        } else {
            format!(
                "{} keys under '{prefix}' belong to no volume; remove them first (lsvd delete {name} --yes)",
                existing.len()
            )
        };
        return Err(Error::new(ErrorKind::AlreadyExists, what));
    }
    let state = crate::lifecycle::snapshot::snapshot_state(store, &parent_meta, &record).await?;
    let meta = VolumeMeta {
        volume: random_volume_id(),
        // The snapshot's size: the parent may have been resized since it was created.
        size_bytes: state.volume_size_bytes,
        created_unix_secs: lsvd_store::clock::unix_ms_now() / 1000,
        name: name.to_string(),
        // A clone keeps its base's data key (it reads the base's objects).
        encrypted: parent_meta.encrypted,
    };
    let link = CloneLink {
        parent: parent.to_string(),
        parent_volume: parent_meta.volume,
        snapshot: snapshot.to_string(),
        clone: name.to_string(),
        clone_volume: meta.volume,
        through_seq: state.next_object_seq(),
        created_unix_ms: meta.created_unix_secs * 1000,
    };
    let link_bytes =
        Bytes::from(encode_clone_link(&link).map_err(|e| Error::bad_input(e.to_string()))?);
    // The clone's own link first: stopped after it, `lsvd delete NAME` finds the
    // keys and removes both links.
    for key in [parent_key(name), child_key(parent, name)] {
        store
            .put(&key, link_bytes.clone(), PutMode::IfAbsent)
            .await
            .map_err(|e| e.context(format!("cannot write {key}")))?;
    }
    if meta.encrypted {
        crate::lifecycle::encryption::copy_keys(store, parent, name).await?;
    }
    // The first checkpoint: the snapshot's state, numbered where the clone starts.
    let seq = state.next_object_seq();
    let mut checkpoint = state.to_checkpoint_head(true, Default::default());
    let mut from = Some(0);
    while let Some(lba) = from {
        from = state.checkpoint_extents(lba, usize::MAX, &mut checkpoint.extents);
    }
    let payload = encode_checkpoint(&checkpoint);
    // Written before the clone is ever claimed (epoch 0): the first claim's follows.
    let spec = ObjectSpec::checkpoint(meta.volume, seq, state.last_record_seq(), 0);
    let key = object_key(name, seq, 0, ObjectKind::Checkpoint);
    store
        .put(
            &key,
            Bytes::from(encode_object(&spec, &payload)),
            PutMode::IfAbsent,
        )
        .await
        .map_err(|e| e.context(format!("cannot write {key}")))?;
    write_meta(store, &meta).await?;
    Ok(meta)
}
