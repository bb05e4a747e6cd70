//! `lsvd delete`: removing a volume from the store, safe against a process that still
//! serves it and against being interrupted.
//!
//! Why an order matters: a store has no transactions, and a delete of thousands of
//! objects can stop anywhere. The steps:
//!
//! 1. Claim the next volume superblock generation with the `deleting` flag. A process
//!    serving the volume finds that generation before its next upload or checkpoint
//!    and stops (the fencing every upload does); no process opens the volume from then
//!    on (recovery refuses a volume whose newest generation is deleting).
//! 2. Delete the objects, then every other key but the metadata and the fence.
//! 3. Delete the metadata. The fence stays, as a 96-byte tombstone, so a server that
//!    still holds the volume stops at its next upload even after the delete is done;
//!    `lsvd create` of the same name removes it.
//!
//! A volume that clones depend on is refused (naming them); deleting a clone removes
//! its link in the parent right after step 1.
//!
//! Stopped anywhere after step 1, the volume refuses to open and `lsvd delete` run
//! again finishes the job.

use std::sync::Arc;

use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;

use crate::fencing::volume_super::{WriteError, is_tombstone, write};
use crate::keys::{meta_key, parse_super_name, super_key, validate_volume_name};
use crate::store_meta::{is_being_deleted, random_session_id, read_meta};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// Deletes in flight at once.
const DELETES_IN_FLIGHT: usize = 16;

/// What deleting a volume will remove (or removed).
#[derive(Debug, Clone)]
pub struct DeletePlan {
    pub name: String,
    /// None: the metadata is gone already (an interrupted delete).
    pub meta: Option<VolumeMeta>,
    /// Every key under `<name>/`.
    pub keys: Vec<String>,
    /// Their total size.
    pub bytes: u64,
    /// An earlier `lsvd delete` claimed the volume (and stopped before the end).
    pub resuming: bool,
}

/// List what deleting volume `name` would remove. `NotFound` if the store holds
/// nothing of that name.
pub async fn plan_delete(store: &DynStore, name: &str) -> Result<DeletePlan> {
    validate_volume_name(name)?;
    let prefix = format!("{name}/");
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    if listing.is_empty() || is_tombstone(store, name, &listing).await? {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no volume '{name}' in {}", store.describe()),
        ));
    }
    let meta = match read_meta(store, name).await {
        Ok(m) => Some(m),
        // Keys but no metadata and no tombstone: not a volume lsvd wrote.
        Err(e) if e.kind == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let resuming = match &meta {
        Some(m) => is_being_deleted(store, m).await?,
        None => true,
    };
    if !resuming {
        crate::lifecycle::lineage::refuse_if_cloned(store, name, None)
            .await
            .map_err(|e| e.context(format!("cannot delete volume '{name}'")))?;
    }
    Ok(DeletePlan {
        name: name.to_string(),
        meta,
        bytes: listing.iter().map(|e| e.size_bytes).sum(),
        keys: listing.into_iter().map(|e| e.key).collect(),
        resuming,
    })
}

/// Delete volume `plan.name`: fence it (unless resuming), list its keys again and
/// delete them in the order the module doc gives. `progress` is
/// called with (keys deleted, keys in all) now and then.
pub async fn delete_volume(
    store: &DynStore,
    plan: &DeletePlan,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<()> {
    let name = &plan.name;
    let mut fence = None;
    if let Some(meta) = &plan.meta
        && !plan.resuming
    {
        fence = Some(claim_for_removal(store, meta, "lsvd delete", None).await?);
    }
    // A clone: its parent no longer needs to keep the snapshot for it (fenced, the
    // clone never opens again).
    if let Some(link) = crate::lifecycle::lineage::parent_link(store, name).await? {
        crate::lifecycle::clone::unlink_from_parent(store, &link).await;
    }
    // Listed again now that the volume is fenced: an object a server uploaded after
    // the plan was made goes too.
    let prefix = format!("{name}/");
    let keys: Vec<String> = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?
        .into_iter()
        .map(|e| e.key)
        .collect();
    let meta = meta_key(name);
    let fence_key = fence.map(|g| super_key(name, g));
    let is_super = |k: &str| parse_super_name(k).is_some();
    // Objects and anything else first, then the older superblocks, then the metadata;
    // the fence (or, resuming, the newest superblock) stays as the tombstone.
    let newest_super = keys
        .iter()
        .filter_map(|k| parse_super_name(k).map(|g| (g, k)))
        .max()
        .map(|(_, k)| k.clone());
    // Keys without metadata are not a volume lsvd wrote: they all go.
    let last = if plan.meta.is_some() {
        fence_key.or(newest_super)
    } else {
        None
    };
    let mut first: Vec<String> = Vec::new();
    let mut supers: Vec<String> = Vec::new();
    for k in &keys {
        if *k == meta || Some(k) == last.as_ref() {
            continue;
        }
        if is_super(k) {
            supers.push(k.clone());
        } else {
            first.push(k.clone());
        }
    }
    let total = keys.len();
    let mut done = 0;
    for batch in [first, supers, vec![meta]] {
        done = delete_keys(store, batch, done, total, progress).await?;
    }
    progress(total, total);
    Ok(())
}

/// Write the next superblock generation with the deleting flag, as `what` (the
/// command); returns it. A server claiming the same generation at the same moment
/// makes this try the next one. With `expected`, the newest generation must still be
/// that one (`lsvd rename` copied the volume as of it): a volume opened since is a
/// `Conflict`, and nothing is claimed.
pub(crate) async fn claim_for_removal(
    store: &DynStore,
    meta: &VolumeMeta,
    what: &str,
    expected: Option<&Option<VolumeSuper>>,
) -> Result<u64> {
    let clock = lsvd_store::clock::SystemClock::new();
    for _ in 0..4 {
        // Not from under a live server (another host's): its lease must lapse first.
        let lease = crate::fencing::lease::LeaseConfig::for_command(what);
        let acquired = crate::fencing::lease::acquire(store, meta, None, &lease, &clock).await?;
        let newest = acquired.newest;
        if let Some(expected) = expected
            && newest.as_ref().map(|s| s.generation) != expected.as_ref().map(|s| s.generation)
        {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "volume '{}' was opened (superblock generation {}) since `{what}` read it (generation {})",
                    meta.name,
                    newest.as_ref().map_or(0, |s| s.generation),
                    expected.as_ref().map_or(0, |s| s.generation),
                ),
            ));
        }
        let sb = VolumeSuper {
            volume: meta.volume,
            generation: acquired.claim_generation,
            session: random_session_id(),
            clean: false,
            deleting: true,
            written_unix_ms: lsvd_store::clock::unix_ms_now(),
            epoch: newest.as_ref().map_or(0, |s| s.epoch) + 1,
            lease_timeout_ms: 0,
            holder: lease.holder.clone(),
            ..newest.unwrap_or_default()
        };
        match write(store, &meta.name, &sb, 12, &clock).await {
            Ok(()) => return Ok(sb.generation),
            Err(WriteError::Superseded { .. }) => continue,
            Err(WriteError::Store(e)) => return Err(e),
        }
    }
    Err(Error::new(
        ErrorKind::Conflict,
        format!(
            "volume '{}' kept changing hands while `{what}` tried to claim it: is it being \
             opened in a loop?",
            meta.name
        ),
    ))
}

/// Delete `keys`, [`DELETES_IN_FLIGHT`] at a time. Returns `done` plus their count.
async fn delete_keys(
    store: &DynStore,
    keys: Vec<String>,
    mut done: usize,
    total: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<usize> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut keys = keys.into_iter();
    loop {
        while tasks.len() < DELETES_IN_FLIGHT {
            let Some(key) = keys.next() else { break };
            let store = Arc::clone(store);
            tasks.spawn(async move {
                match store.delete(&key).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.context(format!("cannot delete {key}"))),
                }
            });
        }
        let Some(joined) = tasks.join_next().await else {
            return Ok(done);
        };
        joined.map_err(|e| {
            Error::with_source(ErrorKind::Transient, "a delete task did not finish", e)
        })??;
        done += 1;
        if done.is_multiple_of(1000) {
            progress(done, total);
        }
    }
}
