//! Whether the replica's object is the source's: by identity, never by size.
//!
//! Why: an object of the same name and size in the replica need not be the source's
//! object. Before epochs a number stranded past a gap was used again by the next
//! writer (same name, other bytes), and anything else that wrote the replica's store
//! may have left a different object under a name. Skipping it by its size would make
//! the replica recover another volume's history, silently.
//!
//! The identity compared is an object's first [`IDENTITY_BYTES`]: the fixed part of
//! its header, through the header CRC at offset 72. That CRC covers the whole header,
//! which holds every chunk's CRC, so equal first bytes mean the same name, kind, epoch,
//! extents and data (up to a CRC32C collision). One ranged GET per store; identities
//! verified (or objects copied) are remembered for the run, so `--follow` reads each
//! replica object's header at most once.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Listing, PassError, Raced};
use lsvd_store::DynStore;

/// Bytes of an object compared: the header's fixed part through its CRC (the same
/// offsets in every object version).
pub(super) const IDENTITY_BYTES: u64 = 80;
const HEADER_CRC_AT: usize = 72;

/// What the run remembers of an object it verified or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub total_bytes: u64,
    pub header_crc: u32,
}

impl Identity {
    /// The identity of a whole object's bytes.
    pub(super) fn of(bytes: &[u8]) -> Identity {
        Identity {
            total_bytes: bytes.len() as u64,
            header_crc: header_crc(bytes),
        }
    }
}

fn header_crc(head: &[u8]) -> u32 {
    head.get(HEADER_CRC_AT..HEADER_CRC_AT + 4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// What one run of replication (one `lsvd replicate`, every pass of `--follow`)
/// remembers between passes: which of the replica's objects are known to be the
/// source's. Bounded by the source's listing (objects the source no longer lists are
/// forgotten at the next pass).
#[derive(Debug, Default)]
pub struct ReplicateRun {
    verified: Mutex<BTreeMap<(u64, u64), Identity>>,
}

impl ReplicateRun {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u64), Identity>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Is the replica's object (sequence number, epoch), of `size_bytes` in both
    /// listings, known to be the source's?
    pub(super) fn verified(&self, object: (u64, u64), size_bytes: u64) -> bool {
        self.map()
            .get(&object)
            .is_some_and(|i| i.total_bytes == size_bytes)
    }

    pub(super) fn remember(&self, object: (u64, u64), identity: Identity) {
        self.map().insert(object, identity);
    }

    /// Forget objects the source does not list.
    pub(super) fn forget_all_but(&self, src: &Listing) {
        self.map().retain(|o, _| src.contains_key(o));
    }
}

/// Read the first [`IDENTITY_BYTES`] of `key` (`size_bytes` long in both listings)
/// from both stores: the identity when they are equal, None when the replica's
/// differ (or it vanished). The source's vanishing is a race.
pub(super) async fn same_object(
    source: &DynStore,
    target: &DynStore,
    key: &str,
    size_bytes: u64,
) -> std::result::Result<Option<Identity>, PassError> {
    let range = 0..IDENTITY_BYTES.min(size_bytes);
    let theirs = match source.get_range(key, range.clone()).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            return Err(PassError::Raced(Raced(format!("object {key} vanished"))));
        }
        Err(e) => return Err(PassError::Failed(e.context(format!("reading {key}")))),
    };
    let ours = match target.get_range(key, range).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => {
            return Err(PassError::Failed(
                e.context(format!("reading {key} in {}", target.describe())),
            ));
        }
    };
    Ok(
        (ours == theirs && theirs.len() as u64 == IDENTITY_BYTES).then(|| Identity {
            total_bytes: size_bytes,
            header_crc: header_crc(&theirs),
        }),
    )
}
