//! Reading and writing the volume superblock generations in the store.
//!
//! Why: recovery must know which checkpoint is current and how far the store was
//! known to be durable, and two processes must never write one volume. The store has
//! put-if-absent only, so each generation is a new key; writing generation `g + 1`
//! is how a process claims (at open) or keeps (after each checkpoint) the volume.
//! Format: `docs/format/volume-superblock.md`.

use lsvd_store::retry::{Backoff, PutIfAbsent, put_if_absent_retried};

use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::{VolumeSuper, decode_volume_super, encode_volume_super};

use crate::keys::{parse_super_name, super_key, super_prefix};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// Generations kept in the store; older ones are deleted after a new one lands.
pub const GENERATIONS_KEPT: u64 = 4;

/// The newest superblock generation of the volume that reads and verifies, if any
/// exists. A newest generation that is unreadable or corrupt is passed over with a
/// warning naming it, and the one before it is read (the store keeps
/// [`GENERATIONS_KEPT`]; they differ only in what the newest had changed since). If
/// none verifies: `Corrupt`, naming the newest. Store errors keep their kind.
pub async fn read_newest(store: &DynStore, meta: &VolumeMeta) -> Result<Option<VolumeSuper>> {
    let prefix = super_prefix(&meta.name);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    let mut generations: Vec<u64> = listing
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .collect();
    generations.sort_unstable_by(|a, b| b.cmp(a));
    let mut first_error: Option<Error> = None;
    for &generation in &generations {
        let key = super_key(&meta.name, generation);
        match read_generation(store, meta, generation).await {
            Ok(sb) => {
                if let Some(e) = &first_error {
                    lsvd_store::log::warn(&format!(
                        "volume {}: {e}; using the older generation {generation}",
                        meta.name
                    ));
                }
                return Ok(Some(sb));
            }
            // Deleted between the listing and the read: a newer one landed (the
            // holder renews its lease by writing generations).
            Err(e) if e.is_not_found() => continue,
            Err(e) if e.kind == ErrorKind::Corrupt => {
                first_error.get_or_insert(e.context(format!("volume superblock {key}")));
            }
            Err(e) => return Err(e),
        }
    }
    match first_error {
        Some(e) => Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "{e}, and no older generation verifies; if the store is otherwise sound, delete the superblocks under {prefix} to recover from the object listing"
            ),
        )),
        None => Ok(None),
    }
}

/// Generation `generation` of `meta`'s superblock, read and verified (`Corrupt` if
/// it fails its checks or names another volume or generation, `NotFound` if absent).
pub async fn read_generation(
    store: &DynStore,
    meta: &VolumeMeta,
    generation: u64,
) -> Result<VolumeSuper> {
    let key = super_key(&meta.name, generation);
    let bytes = store
        .get(&key)
        .await
        .map_err(|e| e.context(format!("reading volume superblock {key}")))?;
    let sb = decode_volume_super(&bytes)
        .map_err(|e| Error::with_source(ErrorKind::Corrupt, "corrupt", e))?;
    if sb.volume != meta.volume || sb.generation != generation {
        return Err(Error::new(
            ErrorKind::Corrupt,
            "belongs to another volume or generation",
        ));
    }
    Ok(sb)
}

/// Why a superblock generation could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// Another process wrote this generation: it owns the volume now (`holder` says
    /// who).
    Superseded { generation: u64, holder: String },
    /// The store kept failing (the error keeps the store's kind).
    Store(Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Superseded {
                generation, holder, ..
            } => {
                let who = if holder.is_empty() {
                    "another lsvd process"
                } else {
                    holder.as_str()
                };
                write!(
                    f,
                    "{who} has taken over the volume (superblock generation {generation} was written by another session)"
                )
            }
            WriteError::Store(e) => write!(f, "{e}"),
        }
    }
}

/// Write `sb` (its generation must be one past the newest) with put-if-absent,
/// retrying transient failures. A reply lost after the PUT landed is recognized by
/// reading the generation back and comparing the session id. Then delete the
/// generation [`GENERATIONS_KEPT`] below it (best effort; the claim at open deletes
/// every older one).
/// `attempts` bounds the tries on transient errors (12 take 13 to 26 s: the jittered
/// backoff of `lsvd_store::retry`).
pub async fn write(
    store: &DynStore,
    name: &str,
    sb: &VolumeSuper,
    attempts: u32,
    clock: &dyn lsvd_store::clock::Clock,
) -> Result<(), WriteError> {
    let key = super_key(name, sb.generation);
    let bytes = bytes::Bytes::from(encode_volume_super(sb));
    write_bytes(store, name, sb, &key, bytes, attempts, clock).await
}

async fn write_bytes(
    store: &DynStore,
    name: &str,
    sb: &VolumeSuper,
    key: &str,
    bytes: bytes::Bytes,
    attempts: u32,
    clock: &dyn lsvd_store::clock::Clock,
) -> Result<(), WriteError> {
    // Jitter seeded from the session: processes that fail together spread out.
    let mut backoff = Backoff::new(sb.session ^ sb.generation);
    let put = put_if_absent_retried(
        store.as_ref(),
        key,
        bytes,
        attempts,
        clock,
        &mut backoff,
        &format!("writing {key}"),
    )
    .await
    .map_err(|e| WriteError::Store(e.context(format!("writing {key}"))))?;
    match put {
        PutIfAbsent::Landed => {}
        // Ours: an earlier attempt landed and its answer was lost.
        PutIfAbsent::Exists(found) => match decode_volume_super(&found) {
            Ok(other) if other.session == sb.session => {}
            Ok(other) => {
                return Err(WriteError::Superseded {
                    generation: sb.generation,
                    holder: other.holder,
                });
            }
            Err(_) => {
                return Err(WriteError::Superseded {
                    generation: sb.generation,
                    holder: String::new(),
                });
            }
        },
    }
    delete_old(store, name, sb.generation).await;
    Ok(())
}

/// Has another process claimed the volume since `current` (the generation this
/// process wrote last)? One small GET of the next generation's key, checked before
/// every upload, so a superseded process stops within one object. `Some(who)` if so.
pub(crate) async fn superseded(
    store: &DynStore,
    name: &str,
    current: &VolumeSuper,
) -> Result<Option<String>> {
    match store.get(&super_key(name, current.generation + 1)).await {
        Ok(bytes) => Ok(match decode_volume_super(&bytes) {
            Ok(s) if s.session == current.session => None,
            Ok(s) if !s.holder.is_empty() => Some(s.holder),
            _ => Some("another lsvd process".to_string()),
        }),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Is there a generation newer than `generation` (one this process just wrote)? Then
/// another process holds the volume, and this one's write only filled a number whose
/// generation had been deleted (every write deletes the one [`GENERATIONS_KEPT`]
/// below it): a holder paused for several of the new holder's renewals would
/// otherwise go on renewing in the gaps. `Some(holder)` if so. One LIST per write.
pub(crate) async fn newer_than(
    store: &DynStore,
    meta: &VolumeMeta,
    generation: u64,
) -> Result<Option<String>> {
    let prefix = super_prefix(&meta.name);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    let Some(newest) = listing
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .filter(|&g| g > generation)
        .max()
    else {
        return Ok(None);
    };
    Ok(Some(match read_generation(store, meta, newest).await {
        Ok(sb) if !sb.holder.is_empty() => sb.holder,
        _ => "another lsvd process".to_string(),
    }))
}

/// Delete the generation [`GENERATIONS_KEPT`] below `newest` (one per write: a
/// holder renews its lease with a generation every few seconds, and a listing each
/// time would cost more than the write).
async fn delete_old(store: &DynStore, name: &str, newest: u64) {
    let Some(old) = newest.checked_sub(GENERATIONS_KEPT) else {
        return;
    };
    if let Err(e) = store.delete(&super_key(name, old)).await {
        lsvd_store::log::warn(&format!(
            "could not delete old superblock generation {old}: {e}"
        ));
    }
}

/// Delete every generation older than the newest [`GENERATIONS_KEPT`] below
/// `newest` (at a claim: what earlier holders left).
pub(crate) async fn delete_all_old(store: &DynStore, name: &str, newest: u64) {
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
            lsvd_store::log::warn(&format!(
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
    listing: &[lsvd_store::ListEntry],
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
