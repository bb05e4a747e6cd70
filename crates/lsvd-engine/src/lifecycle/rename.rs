//! `lsvd rename OLD NEW`: moving a volume to another name in the same store.
//!
//! Why it is a copy: every key of a volume lives under its name (`<name>/...`), and
//! object stores have no rename. Nothing inside the keys names the volume but its
//! metadata (objects, superblocks and snapshot records carry its id), so the keys are
//! copied byte for byte and only the metadata is written anew. The order keeps one
//! whole volume at every point, under one name or the other:
//!
//! 1. Put a copy of `OLD`'s metadata record at `NEW/renaming-from` (the marker that
//!    says whose copy the keys under `NEW/` are), then copy every key but the metadata
//!    from `OLD/` to `NEW/`. `NEW` has no metadata yet, so it does not exist as a
//!    volume; `OLD` is untouched. Run again after an interruption, the marker lets the
//!    copy go on: keys `OLD` has dropped since (it was served in between, and collected)
//!    are deleted from `NEW/`, keys that changed are copied again.
//! 2. Check that `OLD`'s newest superblock generation is still the one copied (no
//!    process opened `OLD` meanwhile), then write `NEW/meta`: the same id, size and
//!    creation time under the new name. From here `NEW` is the volume; the marker goes.
//! 3. Claim `OLD` for removal: its next superblock generation, flagged deleting, with
//!    put-if-absent, as of the generation copied (`delete::claim_for_removal`). A
//!    server that opened `OLD` after step 2's check (from any host) has claimed a
//!    generation of its own: the rename stops with a `Conflict`, deleting nothing, and
//!    both names hold the volume (`OLD` with what was written since). Once the claim
//!    landed no server opens `OLD`.
//! 4. Delete the rest of `OLD`, then `OLD/meta`, then the claim.
//!
//! Stopped in step 1, `OLD` is whole and `rename` run again resumes (or
//! `lsvd delete NEW --yes` removes the partial copy). Stopped in step 3 or 4 before
//! `OLD/meta` went, both names hold the same volume (same id): run again, it checks
//! that and finishes. Stopped after, only the claim is left under `OLD`, and running
//! the rename again removes it.
//!
//! Refused: a volume being served or not stopped cleanly (the caller opens and stops
//! it first when its write log is local), a clone or a volume clones depend on (their
//! links name it), a volume being deleted, and a `NEW` that exists or holds keys that
//! are not `OLD`'s.

use std::collections::BTreeSet;
use std::sync::Arc;

use lsvd_core::format::volume_meta::{VolumeMeta, decode_volume_meta, encode_volume_meta};

use crate::fencing::volume_super::read_newest;
use crate::keys::{meta_key, validate_volume_name};
use crate::lifecycle::lineage::{parent_link, refuse_if_cloned};
use crate::store_meta::{is_being_deleted, read_meta, write_meta};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// Keys copied or deleted at once.
const KEYS_IN_FLIGHT: usize = 8;

/// Under the new name while the copy is in progress: the old name's metadata record
/// (docs/format/volume-meta.md), naming the volume the keys there are a copy of.
const MARKER: &str = "renaming-from";

fn marker_key(new: &str) -> String {
    format!("{new}/{MARKER}")
}

/// What a rename did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renamed {
    /// Keys copied to the new name (not counting those a resumed copy found there).
    pub keys_copied: u64,
    pub bytes_copied: u64,
    /// Keys the copy found in place already (an interrupted rename).
    pub keys_found: u64,
    /// Keys deleted under the old name.
    pub keys_deleted: u64,
}

/// Rename volume `old` to `new` in `store` (see the module doc for the order). The
/// volume must have been stopped cleanly.
pub async fn rename_volume(store: &DynStore, old: &str, new: &str) -> Result<Renamed> {
    validate_volume_name(old)?;
    validate_volume_name(new)?;
    if old == new {
        return Err(Error::bad_input(format!(
            "'{old}' is already the volume's name"
        )));
    }
    let meta = match read_meta(store, old).await {
        Ok(m) => m,
        Err(e) if e.kind == ErrorKind::NotFound => {
            return match finish_after_old_meta(store, old, new).await? {
                Some(renamed) => Ok(renamed),
                None => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let new_meta = match read_meta(store, new).await {
        Ok(there) => Some(there),
        Err(e) if e.kind == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    // An earlier run claimed the old name for removal after the new one held the
    // whole volume: only the old keys' deletes are left.
    if is_being_deleted(store, &meta).await? {
        if new_meta.as_ref().is_some_and(|m| m.volume == meta.volume) {
            let mut renamed = Renamed::default();
            remove_old(store, old, new, &mut renamed).await?;
            return Ok(renamed);
        }
        return Err(Error::new(
            ErrorKind::Conflict,
            format!("volume '{old}' is being deleted (finish with: lsvd delete {old} --yes)"),
        ));
    }
    refuse_if_cloned(store, old, None)
        .await
        .map_err(|e| e.context(format!("cannot rename '{old}'")))?;
    if let Some(link) = parent_link(store, old).await? {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "'{old}' is a clone of {}@{}, whose link names it: renaming clones is not \
                 supported",
                link.parent, link.snapshot
            ),
        ));
    }
    let newest = read_newest(store, &meta).await?;
    if newest.as_ref().is_some_and(|sb| !sb.clean) {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "volume '{old}' is being served, or was not stopped cleanly: stop its server \
                 (or serve it once and stop it) before renaming it"
            ),
        ));
    }
    let mut renamed = Renamed::default();
    match new_meta {
        Some(there) if there.volume == meta.volume => {
            // An earlier rename wrote the new metadata and stopped before deleting the
            // old name: the copy was whole then. Unless either name was opened since
            // (a new superblock generation in one of them), the two are the same.
            if read_newest(store, &there).await? != newest {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "'{old}' and '{new}' both hold volume {} and were opened since an \
                         interrupted rename: keep the one you want and delete the other \
                         (lsvd delete NAME --yes)",
                        meta.volume
                    ),
                ));
            }
        }
        Some(_) => {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("volume '{new}' already exists in {}", store.describe()),
            ));
        }
        None => {
            copy_keys(store, &meta, new, &mut renamed).await?;
            // A process that opened the old name meanwhile wrote a new generation: its
            // writes may be missing from the copy.
            if read_newest(store, &meta).await? != newest {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "volume '{old}' was opened while it was being copied to '{new}'; \
                         stop it and run the rename again"
                    ),
                ));
            }
            let moved = VolumeMeta {
                name: new.to_string(),
                ..meta.clone()
            };
            write_meta(store, &moved).await?;
        }
    }
    // The new name holds the whole volume. Before anything under the old name goes,
    // claim it for removal (a generation with the deleting flag, put-if-absent), as of
    // the generation copied: a server that opened the old name since the check above
    // (another host's too) has claimed a generation of its own, and then nothing is
    // deleted; no server opens it once the claim landed.
    crate::lifecycle::delete::claim_for_removal(store, &meta, "lsvd rename", Some(&newest))
        .await
        .map_err(|e| {
            if e.kind == ErrorKind::Conflict {
                Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{e}: '{old}' and '{new}' both hold volume {} now, '{old}' with what \
                         was written since; nothing was deleted. Keep the one you want and \
                         delete the other (lsvd delete NAME --yes)",
                        meta.volume
                    ),
                )
            } else {
                e
            }
        })?;
    remove_old(store, old, new, &mut renamed).await?;
    Ok(renamed)
}

/// Step 3, once the old name is claimed for removal: the marker, every key under the
/// old name but its metadata and newest superblock generation (the claim), then the
/// metadata, then the claim. Stopped before the metadata went, running the rename
/// again comes back here (the old name is being deleted, the new one holds the
/// volume); after, [`finish_after_old_meta`] removes the claim.
async fn remove_old(store: &DynStore, old: &str, new: &str, renamed: &mut Renamed) -> Result<()> {
    store
        .delete(&marker_key(new))
        .await
        .map_err(|e| e.context(format!("cannot delete {}", marker_key(new))))?;
    let keys = keys_under(store, old).await?;
    let claim = keys
        .iter()
        .filter_map(|k| crate::keys::parse_super_name(k).map(|g| (g, k.clone())))
        .max()
        .map(|(_, k)| k);
    let meta = meta_key(old);
    let rest: Vec<String> = keys
        .iter()
        .filter(|k| **k != meta && Some(*k) != claim.as_ref())
        .cloned()
        .collect();
    renamed.keys_deleted = keys.len() as u64;
    delete_all(store, rest).await?;
    delete_all(store, vec![meta]).await?;
    delete_all(store, claim.into_iter().collect()).await
}

/// A rename run again after it deleted the old name's metadata: only its claim (the
/// newest superblock generation, flagged deleting, of the volume the new name holds)
/// can be left under the old name. Removes it; None if the old name holds anything
/// else (not this rename's leftovers: the caller reports the missing volume).
async fn finish_after_old_meta(store: &DynStore, old: &str, new: &str) -> Result<Option<Renamed>> {
    let Ok(there) = read_meta(store, new).await else {
        return Ok(None);
    };
    let keys = keys_under(store, old).await?;
    let supers: Vec<u64> = keys
        .iter()
        .filter_map(|k| crate::keys::parse_super_name(k))
        .collect();
    let (Some(&newest), true) = (supers.iter().max(), supers.len() == keys.len()) else {
        return Ok(None);
    };
    let as_old = VolumeMeta {
        name: old.to_string(),
        ..there
    };
    match crate::fencing::volume_super::read_generation(store, &as_old, newest).await {
        Ok(sb) if sb.deleting => {}
        _ => return Ok(None),
    }
    let renamed = Renamed {
        keys_deleted: keys.len() as u64,
        ..Renamed::default()
    };
    delete_all(store, keys).await?;
    Ok(Some(renamed))
}

/// Every key under `name/`.
async fn keys_under(store: &DynStore, name: &str) -> Result<Vec<String>> {
    let listed = store
        .list(&format!("{name}/"))
        .await
        .map_err(|e| e.context(format!("cannot list {name}/")))?;
    Ok(listed.into_iter().map(|e| e.key).collect())
}

/// Delete `keys`, a few at a time.
async fn delete_all(store: &DynStore, keys: Vec<String>) -> Result<()> {
    for_each_key(
        keys,
        |key, store| async move {
            store
                .delete(&key)
                .await
                .map_err(|e| e.context(format!("cannot delete {key}")))
                .map(|()| (0, false))
        },
        store,
    )
    .await?;
    Ok(())
}

/// Copy every key under `old/` but the metadata to the same place under `new/`.
/// Keys already under `new/` must be an earlier copy of this volume (the marker says
/// so); anything else there is refused.
async fn copy_keys(
    store: &DynStore,
    meta: &VolumeMeta,
    new: &str,
    renamed: &mut Renamed,
) -> Result<()> {
    let old = meta.name.as_str();
    let relative = |prefix: &str, keys: Vec<String>| -> BTreeSet<String> {
        keys.iter()
            .filter_map(|k| k.strip_prefix(prefix).map(str::to_string))
            .collect()
    };
    let (old_prefix, new_prefix) = (format!("{old}/"), format!("{new}/"));
    let ours = relative(&old_prefix, keys_under(store, old).await?);
    let there = relative(&new_prefix, keys_under(store, new).await?);
    if there.is_empty() {
        store
            .put(
                &marker_key(new),
                encode_volume_meta(meta).into(),
                PutMode::IfAbsent,
            )
            .await
            .map_err(|e| e.context(format!("cannot write {}", marker_key(new))))?;
    } else {
        let marked = match store.get(&marker_key(new)).await {
            Ok(bytes) => decode_volume_meta(&bytes).is_ok_and(|m| m.volume == meta.volume),
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e.context(format!("cannot read {}", marker_key(new)))),
        };
        if !marked {
            let first = there.iter().next().map_or("", String::as_str);
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} key{} under '{new}/' (such as {new}/{first}) are not a copy of \
                     '{old}': remove them first (lsvd delete {new} --yes)",
                    there.len(),
                    if there.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        // Resuming: what the old name dropped since goes from the copy too.
        let dropped: Vec<String> = there
            .iter()
            .filter(|rel| *rel != MARKER && !ours.contains(*rel))
            .map(|rel| format!("{new_prefix}{rel}"))
            .collect();
        delete_all(store, dropped).await?;
    }
    let keys: Vec<String> = ours
        .into_iter()
        .filter(|rel| rel != "meta" && rel != MARKER)
        .collect();
    let (old, new) = (old.to_string(), new.to_string());
    let totals = for_each_key(
        keys,
        move |rel, store| {
            let (from, to) = (format!("{old}/{rel}"), format!("{new}/{rel}"));
            async move { copy_one(&store, &from, &to).await }
        },
        store,
    )
    .await?;
    renamed.keys_copied = totals.0;
    renamed.bytes_copied = totals.1;
    renamed.keys_found = totals.2;
    Ok(())
}

/// Copy `from` to `to`: `(bytes, true)` if `to` was there already with the same
/// bytes. `to` is under a name that is not a volume yet (no metadata), and the marker
/// says its keys are this copy's: one that differs (a replica status record, which
/// replication rewrites) is replaced.
async fn copy_one(store: &DynStore, from: &str, to: &str) -> Result<(u64, bool)> {
    let bytes = store
        .get(from)
        .await
        .map_err(|e| e.context(format!("cannot read {from}")))?;
    let len = bytes.len() as u64;
    match store.put(to, bytes.clone().into(), PutMode::IfAbsent).await {
        Ok(()) => Ok((len, false)),
        Err(e) if e.kind == ErrorKind::AlreadyExists => {
            let found = store
                .get(to)
                .await
                .map_err(|e| e.context(format!("cannot read {to}")))?;
            if found == bytes {
                return Ok((len, true));
            }
            store
                .put(to, bytes.into(), PutMode::Overwrite)
                .await
                .map_err(|e| e.context(format!("cannot write {to}")))?;
            Ok((len, false))
        }
        Err(e) => Err(e.context(format!("cannot write {to}"))),
    }
}

/// Run `f` on every key, [`KEYS_IN_FLIGHT`] at a time; the first error stops it.
/// Returns (keys done but not found, bytes, keys found).
async fn for_each_key<F, Fut>(keys: Vec<String>, f: F, store: &DynStore) -> Result<(u64, u64, u64)>
where
    F: Fn(String, DynStore) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, bool)>> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let mut keys = keys.into_iter();
    let mut totals = (0u64, 0u64, 0u64);
    loop {
        while tasks.len() < KEYS_IN_FLIGHT {
            let Some(key) = keys.next() else { break };
            tasks.spawn(f(key, Arc::clone(store)));
        }
        let Some(joined) = tasks.join_next().await else {
            return Ok(totals);
        };
        let (bytes, found) = joined.map_err(|e| {
            Error::with_source(ErrorKind::Transient, "a copy task did not finish", e)
        })??;
        if found {
            totals.2 += 1;
        } else {
            totals.0 += 1;
        }
        totals.1 += bytes;
    }
}
