//! A volume's settings in the store (`<volume>/settings`): read when a server opens
//! the volume, written by `lsvd create` and `lsvd config`.
//!
//! Overwritten whole, last writer wins: settings are choices about objects not yet
//! written, so two racing changes leave one of them, never a mix, and no data depends
//! on which. A server already running keeps what it opened with until it opens the
//! volume again.

use lsvd_core::compression::Compression;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_settings::{
    VolumeSettings, decode_volume_settings, encode_volume_settings,
};

use crate::keys::settings_key;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// The settings of the volume `meta` describes; None if it has none (the defaults).
/// `Corrupt` if they fail their checks or belong to another volume of the same name.
pub async fn read_settings(store: &DynStore, meta: &VolumeMeta) -> Result<Option<VolumeSettings>> {
    let key = settings_key(&meta.name);
    let bytes = match store.get(&key).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.context(format!("cannot read {key}"))),
    };
    let settings = decode_volume_settings(&bytes)
        .map_err(|e| Error::with_source(ErrorKind::Corrupt, key.clone(), e))?;
    if settings.volume != meta.volume {
        let (theirs, name, ours) = (settings.volume, &meta.name, meta.volume);
        let why = format!("{key} belongs to volume id {theirs}, not to {name} (id {ours})");
        return Err(Error::new(ErrorKind::Corrupt, why));
    }
    Ok(Some(settings))
}

/// Set the compression of the volume `meta` describes; returns the settings written.
pub async fn set_compression(
    store: &DynStore,
    meta: &VolumeMeta,
    compression: Compression,
) -> Result<VolumeSettings> {
    let settings = VolumeSettings {
        volume: meta.volume,
        compression,
        changed_unix_ms: lsvd_store::clock::unix_ms_now(),
    };
    let key = settings_key(&meta.name);
    store
        .put(
            &key,
            encode_volume_settings(&settings).into(),
            PutMode::Overwrite,
        )
        .await
        .map_err(|e| e.context(format!("cannot write {key}")))?;
    Ok(settings)
}
