//! The `qemu:dirty-bitmap:SNAP` meta contexts of a served volume: the blocks written
//! (data, trims, zeroing) since its snapshot SNAP, as qemu-nbd reports with `-B`, so a
//! backup tool that speaks NBD reads only what changed.
//!
//! lsvd keeps no bitmap: where each block's data lives says when it was written, and
//! the engine compares the live maps with the snapshot's ([`Volume::changes`]). What
//! that needs of the snapshot (its end and the blocks it had data in: a
//! [`ChangeBase`]) is read from the store once, when a connection selects the
//! context, and kept here per snapshot, shared by the export's connections (a few
//! at most: [`MAX_BASES`]). Dirty is `Data` or `Zero`: written since, or reading as
//! zeros now where the snapshot had data. Exact for writes and discards; for data the
//! garbage collector moved twice since the snapshot it may over-report (never under).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lsvd_core::error::{ErrorKind, Result};
use lsvd_engine::{Change, ChangeBase, Volume};
use lsvd_nbd::server::{MAX_LISTED_CONTEXTS, MAX_REPLY_EXTENTS};
use lsvd_nbd::{AllocationExtent, DIRTY_BITMAP_PREFIX, STATE_DIRTY};

/// Snapshots whose [`ChangeBase`] an export keeps (each holds the snapshot's map of
/// written blocks): more are loaded again when asked for.
pub const MAX_BASES: usize = 16;

/// How much of the volume one comparison covers: at most this many bytes / 512 runs
/// come back from one (64 Ki runs), as for `base:allocation`.
const WINDOW_BYTES: u64 = 32 << 20;

/// The export's loaded comparisons, by snapshot name.
#[derive(Default)]
pub(super) struct DirtyBitmaps {
    bases: Mutex<HashMap<String, Arc<ChangeBase>>>,
}

impl DirtyBitmaps {
    /// The snapshot a context name names, if it is a dirty bitmap's.
    pub(super) fn snapshot(context: &str) -> Option<&str> {
        context
            .strip_prefix(DIRTY_BITMAP_PREFIX)
            .filter(|s| !s.is_empty())
    }

    fn cached(&self, snapshot: &str) -> Option<Arc<ChangeBase>> {
        let bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        bases.get(snapshot).cloned()
    }

    fn keep(&self, snapshot: &str, base: Arc<ChangeBase>) {
        let mut bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        if bases.len() >= MAX_BASES && !bases.contains_key(snapshot) {
            // Rarely more than a few snapshots are backed up from at once: start over.
            bases.clear();
        }
        bases.insert(snapshot.to_string(), base);
    }

    /// The dirty-bitmap contexts of `volume` whose names start with `prefix`: every
    /// snapshot's for a prefix of `qemu:dirty-bitmap:` (listed from the store); for a
    /// prefix naming one snapshot, that snapshot's alone, its comparison loaded
    /// afresh (a connection selecting it gets the snapshot of that name now, even
    /// one deleted and taken again). None for other namespaces, without a look at the
    /// store; none for a snapshot that does not exist or that this volume cannot be
    /// compared with (a snapshot export and a newer snapshot).
    pub(super) async fn contexts(&self, volume: &Volume, prefix: &str) -> Result<Vec<String>> {
        if let Some(snapshot) = Self::snapshot(prefix) {
            return match volume.change_base(Some(snapshot)).await {
                Ok(base) => {
                    self.keep(snapshot, Arc::new(base));
                    Ok(vec![prefix.to_string()])
                }
                Err(e) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::BadInput) => {
                    Ok(Vec::new())
                }
                Err(e) => Err(e),
            };
        }
        if !DIRTY_BITMAP_PREFIX.starts_with(prefix) {
            return Ok(Vec::new());
        }
        let mut names = volume.snapshot_names().await?;
        names.truncate(MAX_LISTED_CONTEXTS);
        Ok(names
            .into_iter()
            .map(|s| format!("{DIRTY_BITMAP_PREFIX}{s}"))
            .collect())
    }

    /// The comparison with `snapshot`: kept, or loaded now (and kept).
    pub(super) async fn base(&self, volume: &Volume, snapshot: &str) -> Result<Arc<ChangeBase>> {
        if let Some(base) = self.cached(snapshot) {
            return Ok(base);
        }
        let base = Arc::new(volume.change_base(Some(snapshot)).await?);
        self.keep(snapshot, Arc::clone(&base));
        Ok(base)
    }
}

/// `[offset, offset + length)` against `base`, as dirty-bitmap extents ([`STATE_DIRTY`]
/// where written since), merged; compared a window at a time, stopping at a reply's
/// worth of extents ([`MAX_REPLY_EXTENTS`]; the client asks again for the rest).
pub(super) async fn status(
    volume: &Volume,
    base: &ChangeBase,
    offset: u64,
    length: u32,
) -> Result<Vec<AllocationExtent>> {
    let end = offset + u64::from(length);
    let mut extents: Vec<AllocationExtent> = Vec::new();
    let mut at = offset;
    while at < end && extents.len() < MAX_REPLY_EXTENTS {
        let n = WINDOW_BYTES.min(end - at);
        for (bytes, change) in volume.changes(base, at, n).await? {
            let flags = match change {
                Change::Same => 0,
                Change::Data | Change::Zero => STATE_DIRTY,
            };
            // Runs add up to `n`, and the extents to at most `length`, a u32 (the
            // server cuts anything longer).
            let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
            lsvd_nbd::push_extent(&mut extents, bytes, flags);
        }
        at += n;
    }
    Ok(extents)
}
