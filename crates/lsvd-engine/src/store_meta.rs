//! A volume's identity in the store: its metadata object (read, written once) and
//! the random ids volumes and sessions get, and whether a delete has begun.
//!
//! Why a module of its own: creating, cloning, deleting, opening and replicating a
//! volume all need these, and none of them should depend on another for it.

use lsvd_core::VolumeId;
use lsvd_core::format::volume_meta::{VolumeMeta, decode_volume_meta, encode_volume_meta};

use crate::fencing::volume_super::read_newest;
use crate::keys::{meta_key, validate_volume_name};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

pub fn random_session_id() -> u64 {
    let id = random_volume_id().0;
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_le_bytes(b)
}

pub fn random_volume_id() -> VolumeId {
    VolumeId(lsvd_store::clock::random_id_bytes())
}

/// Write `meta` with put-if-absent: the moment the volume exists.
pub async fn write_meta(store: &DynStore, meta: &VolumeMeta) -> Result<()> {
    let name = &meta.name;
    match store
        .put(
            &meta_key(name),
            encode_volume_meta(meta).into(),
            PutMode::IfAbsent,
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind == ErrorKind::AlreadyExists => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("volume '{name}' already exists in {}", store.describe()),
        )),
        Err(e) => Err(e.context(format!(
            "cannot create volume '{name}' in {}",
            store.describe()
        ))),
    }
}

/// The metadata of volume `name`: `NotFound` if there is no such volume, `Corrupt` if
/// its metadata does not decode or names another volume.
pub async fn read_meta(store: &DynStore, name: &str) -> Result<VolumeMeta> {
    validate_volume_name(name)?;
    let bytes = match store.get(&meta_key(name)).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no volume '{name}' in {} (create it with: lsvd create {name} --size SIZE)",
                    store.describe()
                ),
            ));
        }
        Err(e) => {
            return Err(e.context(format!(
                "cannot read volume '{name}' from {}",
                store.describe()
            )));
        }
    };
    let meta = decode_volume_meta(&bytes)
        .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("volume '{name}'"), e))?;
    if meta.name != name {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("volume metadata under '{name}' names '{}'", meta.name),
        ));
    }
    Ok(meta)
}

/// Is volume `name` claimed by an `lsvd delete` that has not finished?
pub async fn is_being_deleted(store: &DynStore, meta: &VolumeMeta) -> Result<bool> {
    Ok(read_newest(store, meta)
        .await?
        .is_some_and(|sb| sb.deleting))
}
