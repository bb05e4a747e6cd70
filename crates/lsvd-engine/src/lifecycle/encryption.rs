//! Encrypted volumes: the key record made at create, unlocking a volume's store with
//! the user's key, and rotating that key.
//!
//! Why here: what is sealed and how is the store's business (`lsvd_store::sealed`);
//! which volume is encrypted, where its key record lives and the order of the steps
//! that make one are the volume's. An encrypted volume's metadata says so (version 2,
//! written once), so a missing key record or a store that does not seal is an error,
//! never a reason to write plaintext.

use std::sync::Arc;

use bytes::Bytes;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::format::volume_keys::{VolumeKeys, decode_volume_keys, encode_volume_keys};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_store::sealed::{DataKey, SealedStore, UserKey};
use lsvd_store::xts::LocalKeys;
use lsvd_store::{DynStore, PutMode};

use crate::keys::keys_key;
use crate::store_meta::read_meta;

/// Where to give the key, for messages.
const GIVE_KEY: &str = "give its key file with --key-file PATH (or LSVD_KEY_FILE)";

/// Refuse to go on with encrypted volume `meta` over a store that does not seal its
/// objects (every path that reads or writes objects checks this).
pub fn require_unlocked(store: &DynStore, meta: &VolumeMeta) -> Result<()> {
    if opaque(store, meta) {
        return Err(locked(meta));
    }
    Ok(())
}

/// True if volume `meta`'s objects read through `store` are sealed bytes this process
/// cannot open (an encrypted volume, no key): what `lsvd replicate` copies as stored.
pub(crate) fn opaque(store: &DynStore, meta: &VolumeMeta) -> bool {
    meta.encrypted && !store.seals_objects()
}

fn locked(meta: &VolumeMeta) -> Error {
    Error::new(
        ErrorKind::Denied,
        format!("volume '{}' is encrypted: {GIVE_KEY}", meta.name),
    )
}

/// The store through which volume `meta`'s objects read and write in the clear: the
/// store itself for a plain volume (a key given anyway is not used), a sealing one
/// for an encrypted volume, unlocked with `user`. `Denied` without a key or with a
/// wrong one; nothing is written either way.
pub async fn unlock(
    store: &DynStore,
    meta: &VolumeMeta,
    user: Option<&UserKey>,
) -> Result<DynStore> {
    if !meta.encrypted || store.seals_objects() {
        return Ok(store.clone());
    }
    let Some(user) = user else {
        return Err(locked(meta));
    };
    let data_key = data_key(store, meta, user).await?;
    Ok(Arc::new(SealedStore::new(store.clone(), &data_key)))
}

/// [`unlock`] for `lsvd replicate`: with the user's key, the source store and the
/// replica's, both sealing with volume `meta`'s data key (the replica gets the same
/// key record, so the same user key unlocks it), and the pass checks everything it
/// copies; without it, both stores as they are: objects are copied sealed, as stored,
/// and checked by name, size and envelope only (`replicate`, "Without the key").
pub async fn unlock_pair(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
    user: Option<&UserKey>,
) -> Result<(DynStore, DynStore)> {
    let Some(user) = user.filter(|_| meta.encrypted) else {
        return Ok((source.clone(), target.clone()));
    };
    let data_key = data_key(source, meta, user).await?;
    let seal = |s: &DynStore| -> DynStore { Arc::new(SealedStore::new(s.clone(), &data_key)) };
    Ok((seal(source), seal(target)))
}

/// [`unlock`] for volume `name`, read from the store.
pub async fn unlock_volume(
    store: &DynStore,
    name: &str,
    user: Option<&UserKey>,
) -> Result<DynStore> {
    let meta = read_meta(store, name).await?;
    unlock(store, &meta, user).await
}

/// The keys of volume `name`'s local files for `--encrypt-local`, derived from its
/// data key (so a key rotation leaves them as they are); None for a plain volume or
/// without `user`.
pub async fn local_keys(
    store: &DynStore,
    name: &str,
    user: Option<&UserKey>,
) -> Result<Option<Arc<LocalKeys>>> {
    let meta = read_meta(store, name).await?;
    let Some(user) = user.filter(|_| meta.encrypted) else {
        return Ok(None);
    };
    Ok(Some(Arc::new(
        data_key(store, &meta, user)
            .await?
            .local_keys(&meta.volume.0)?,
    )))
}

/// Volume `meta`'s data key, unwrapped with `user` (`Denied` for another key).
async fn data_key(store: &DynStore, meta: &VolumeMeta, user: &UserKey) -> Result<DataKey> {
    DataKey::unwrap(&read_keys(store, &meta.name).await?, user, &meta.name)
}

async fn read_keys(store: &DynStore, name: &str) -> Result<VolumeKeys> {
    let key = keys_key(name);
    let bytes = store.get(&key).await.map_err(|e| match e.kind {
        ErrorKind::NotFound => Error::new(
            ErrorKind::Corrupt,
            format!("volume '{name}' is encrypted but its key record {key} is missing"),
        ),
        _ => e.context(format!("cannot read {key}")),
    })?;
    decode_volume_keys(&bytes)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{key} is corrupt ({e})")))
}

/// Make the key record of a new encrypted volume `name` (before its metadata, which
/// makes it exist): a random data key wrapped under `user`.
pub(crate) async fn write_new_keys(store: &DynStore, name: &str, user: &UserKey) -> Result<()> {
    let record = DataKey::random()?.wrap(user)?;
    put_keys(store, name, &record, PutMode::IfAbsent).await
}

/// Give clone `clone` its base's key record: the clone keeps the base's data key,
/// so it reads the base's objects, and the same user key unlocks both.
pub(crate) async fn copy_keys(store: &DynStore, base: &str, clone: &str) -> Result<()> {
    let record = read_keys(store, base).await?;
    put_keys(store, clone, &record, PutMode::IfAbsent).await
}

async fn put_keys(store: &DynStore, name: &str, record: &VolumeKeys, mode: PutMode) -> Result<()> {
    let key = keys_key(name);
    store
        .put(&key, Bytes::from(encode_volume_keys(record)), mode)
        .await
        .map_err(|e| e.context(format!("cannot write {key}")))
}

/// `lsvd key rotate`: wrap volume `name`'s data key under `new` instead of `old`.
/// Only the key record changes (one overwrite: either key works until it lands, then
/// only `new`); a server running keeps its unwrapped data key. Clones keep their own
/// copy of the record, unlocked by the key they had.
pub async fn rotate_key(store: &DynStore, name: &str, old: &UserKey, new: &UserKey) -> Result<()> {
    let meta = read_meta(store, name).await?;
    if !meta.encrypted {
        return Err(Error::bad_input(format!(
            "volume '{name}' is not encrypted"
        )));
    }
    let record = read_keys(store, name).await?;
    let data_key = DataKey::unwrap(&record, old, name)?;
    let rewrapped = data_key.wrap(new)?;
    put_keys(store, name, &rewrapped, PutMode::Overwrite).await?;
    // Read back: the new record must unlock with the new key before we say so.
    DataKey::unwrap(&read_keys(store, name).await?, new, name)?;
    Ok(())
}
