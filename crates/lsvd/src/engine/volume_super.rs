//! Reading and writing the volume superblock generations in the store.
//!
//! Why: recovery must know which checkpoint is current and how far the store was
//! known to be durable, and two processes must never write one volume. The store has
//! put-if-absent only, so each generation is a new key; writing generation `g + 1`
//! is how a process claims (at open) or keeps (after each checkpoint) the volume.
//! Format: `docs/format/volume-superblock.md`.

use std::time::Duration;

use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::{VolumeSuper, decode_volume_super, encode_volume_super};

use super::keys::{parse_super_name, super_key, super_prefix};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{DynStore, PutMode};

/// Generations kept in the store; older ones are deleted after a new one lands.
pub const GENERATIONS_KEPT: u64 = 4;

/// The newest superblock generation of the volume, if any exists. A newest
/// generation that is unreadable or corrupt is an error that names it (`Corrupt`, or
/// the store's kind).
pub async fn read_newest(store: &DynStore, meta: &VolumeMeta) -> Result<Option<VolumeSuper>> {
    let prefix = super_prefix(&meta.name);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    let Some(generation) = listing
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .max()
    else {
        return Ok(None);
    };
    let key = super_key(&meta.name, generation);
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading volume superblock {key}")))?;
    let sb = decode_volume_super(&bytes).map_err(|e| {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "volume superblock {key} is corrupt ({e}); if the store is otherwise sound, delete it to recover from the object listing"
            ),
        )
    })?;
    if sb.volume != meta.volume || sb.generation != generation {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("volume superblock {key} belongs to another volume or generation"),
        ));
    }
    Ok(Some(sb))
}

/// Why a superblock generation could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// Another process wrote this generation: it owns the volume now.
    Superseded { generation: u64 },
    /// The store kept failing (the error keeps the store's kind).
    Store(Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Superseded { generation } => write!(
                f,
                "another lsvd process has taken over the volume (superblock generation {generation} was written by a different session)"
            ),
            WriteError::Store(e) => write!(f, "{e}"),
        }
    }
}

/// Write `sb` (its generation must be one past the newest) with put-if-absent,
/// retrying transient failures. A reply lost after the PUT landed is recognized by
/// reading the generation back and comparing the session id. Then delete generations
/// older than [`GENERATIONS_KEPT`] (best effort).
/// `attempts` bounds the tries on transient errors (12 take about 30 s).
pub async fn write(
    store: &DynStore,
    name: &str,
    sb: &VolumeSuper,
    attempts: u32,
    clock: &dyn super::clock::Clock,
) -> Result<(), WriteError> {
    let key = super_key(name, sb.generation);
    let bytes = bytes::Bytes::from(encode_volume_super(sb));
    let mut backoff = Duration::from_millis(50);
    let mut last_error: Option<Error> = None;
    for attempt in 1..=attempts.max(1) {
        match store.put(&key, bytes.clone(), PutMode::IfAbsent).await {
            Ok(()) => {
                delete_old(store, name, sb.generation).await;
                return Ok(());
            }
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                return match store.get(&key).await {
                    Ok(found) => match decode_volume_super(&found) {
                        Ok(other) if other.session == sb.session => {
                            delete_old(store, name, sb.generation).await;
                            Ok(())
                        }
                        _ => Err(WriteError::Superseded {
                            generation: sb.generation,
                        }),
                    },
                    Err(e) => Err(WriteError::Store(
                        e.context(format!("superblock {key} exists but cannot be read back")),
                    )),
                };
            }
            Err(e) if e.kind == ErrorKind::Permanent => {
                return Err(WriteError::Store(e.context(format!("writing {key}"))));
            }
            Err(e) => {
                if attempt == 1 {
                    crate::log::warn(&format!("writing {key} failed, retrying: {e}"));
                }
                last_error = Some(e);
                clock.sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    let context = format!("writing {key} failed {attempts} times");
    Err(WriteError::Store(match last_error {
        Some(e) => e.context(context),
        None => Error::new(ErrorKind::Transient, context),
    }))
}

/// Has another process claimed the volume since `current` (the generation this
/// process wrote last)? One small GET of the next generation's key; checked before
/// every upload, so a superseded process stops within one object.
pub async fn superseded(store: &DynStore, name: &str, current: &VolumeSuper) -> Result<bool> {
    match store.get(&super_key(name, current.generation + 1)).await {
        Ok(bytes) => Ok(decode_volume_super(&bytes).map_or(true, |s| s.session != current.session)),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn delete_old(store: &DynStore, name: &str, newest: u64) {
    let Some(oldest_kept) = newest.checked_sub(GENERATIONS_KEPT - 1) else {
        return;
    };
    let Ok(listing) = store.list(&super_prefix(name)).await else {
        return;
    };
    for g in listing.iter().filter_map(|e| parse_super_name(&e.key)) {
        if g < oldest_kept
            && let Err(e) = store.delete(&super_key(name, g)).await
        {
            crate::log::warn(&format!(
                "could not delete old superblock generation {g}: {e}"
            ));
        }
    }
}

/// The error recovery gives for a volume whose newest superblock generation was
/// written by `lsvd delete`.
pub(crate) fn being_deleted(name: &str) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "volume '{name}' is being deleted (an `lsvd delete` claimed it and has not \
             finished); finish with: lsvd delete {name} --yes"
        ),
    )
}

/// Are `listing`'s keys (everything under `<name>/`) only superblock generations, the
/// newest written by `lsvd delete`: what a finished delete leaves?
pub(crate) async fn is_tombstone(
    store: &DynStore,
    name: &str,
    listing: &[crate::store::ListEntry],
) -> Result<bool> {
    let mut newest = None;
    for e in listing {
        match parse_super_name(&e.key) {
            Some(g) => newest = newest.max(Some(g)),
            None => return Ok(false),
        }
    }
    let Some(g) = newest else { return Ok(false) };
    let key = super_key(name, g);
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading {key}")))?;
    Ok(decode_volume_super(&bytes).is_ok_and(|sb| sb.deleting))
}
