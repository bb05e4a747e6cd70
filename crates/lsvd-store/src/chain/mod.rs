//! Several local drives as one object store: a chained log (Gecko) or a stripe.
//!
//! Gecko's observation: a log spread over all drives of an array (RAID-0) makes every
//! drive serve client writes, GC reads and GC writes at once, and the contention costs
//! more than the parallelism gains; a log *chained* over the drives keeps client
//! writes on one drive (the tail) and GC in the body, so cleaning never disturbs them.
//!
//! * `chain:DIR0,DIR1[,...][?drive_size=SIZE&gc=compact-in-body|move-to-tail]`:
//!   [`chain_store::ChainStore`]. `drive_size` caps what each drive holds (default: the
//!   free space of its filesystem); `gc` says where GC output goes (default
//!   `compact-in-body`: not the tail).
//! * `stripe:DIR0,DIR1[,...]`: [`stripe::StripeStore`], objects spread by a hash of
//!   their key: the baseline.
//!
//! Each directory is meant to be its own drive and is written through the local store
//! ([`super::fs::FsStore`]: fsync, atomic put-if-absent). A position may be two
//! directories kept as mirrors (`chain:A+A2,B+B2`, [`position`]). Each directory holds
//! a drive record ([`meta`], docs/format/chain.md) tying it to its set and position,
//! checked at open ([`open`]). Directory names cannot hold `,`, `+` or `?`.

pub mod add_drive;
pub mod chain_store;
pub mod copy_check;
pub mod drives;
pub mod meta;
pub mod open;
pub mod position;
pub mod rebuild;
pub mod stripe;

#[cfg(test)]
mod mirror_tests;
#[cfg(test)]
mod rebuild_tests;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::{DynStore, ListEntry, OpenMode};
use drives::parse_spec;
use lsvd_core::error::{Error, ErrorKind, Result};
use position::Drive;

/// Open `chain:SPEC` (`spec` is what follows the scheme).
pub fn open_chain(spec: &str) -> Result<DynStore> {
    open_chain_mode(spec, OpenMode::ReadWrite)
}

/// Open `chain:SPEC` in `mode` (read-only: nothing on the drives changes, [`open`]).
pub fn open_chain_mode(spec: &str, mode: OpenMode) -> Result<DynStore> {
    let spec = parse_spec("chain", spec)?;
    Ok(Arc::new(chain_store::ChainStore::open_mode(&spec, mode)?))
}

/// Open `stripe:SPEC`.
pub fn open_stripe(spec: &str) -> Result<DynStore> {
    open_stripe_mode(spec, OpenMode::ReadWrite)
}

/// Open `stripe:SPEC` in `mode`.
pub fn open_stripe_mode(spec: &str, mode: OpenMode) -> Result<DynStore> {
    let spec = parse_spec("stripe", spec)?;
    Ok(Arc::new(stripe::StripeStore::open_mode(&spec, mode)?))
}

/// The drive a key lives on when its place is fixed by its name (every key of a
/// stripe; keys of a chain that are not log objects): CRC32C of the key, modulo the
/// drive count.
pub fn home_drive(key: &str, drive_count: usize) -> usize {
    crc32c::crc32c(key.as_bytes()) as usize % drive_count.max(1)
}

/// True for a log object's key, `.../obj/<16 hex digits>[.<16 hex digits>].<kind>`
/// (sequence number, epoch, kind): the keys a chain places on its tail (or, for GC
/// output, in its body). The one thing these stores know about the engine's names
/// (docs/format/README.md, "Store layout").
pub fn is_log_object(key: &str) -> bool {
    let mut parts = key.rsplit('/');
    let (Some(name), Some(dir)) = (parts.next(), parts.next()) else {
        return false;
    };
    let b = name.as_bytes();
    let hex = |s: &[u8]| s.iter().all(u8::is_ascii_hexdigit);
    dir == "obj"
        && match b.len() {
            18 => b[16] == b'.' && hex(&b[..16]),
            35 => b[16] == b'.' && b[33] == b'.' && hex(&b[..16]) && hex(&b[17..33]),
            _ => false,
        }
}

/// The three reads of [`ObjectStore`](crate::ObjectStore) (`get`, `get_range`,
/// `get_range_background`) for a store of drives that answers each with its own
/// `read(key: String, read: Read)`: the chained and the striped store, which must map
/// each read to the same [`Read`](position::Read).
macro_rules! reads_through_read {
    () => {
        fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            Box::pin(self.read(key.to_string(), Read::Whole))
        }
        fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            Box::pin(self.read(key.to_string(), Read::Range(range)))
        }
        fn get_range_background(
            &self,
            key: &str,
            range: Range<u64>,
        ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            Box::pin(self.read(key.to_string(), Read::Background(range)))
        }
    };
}
pub(crate) use reads_through_read;

/// The drive record's name is not a key.
fn reserved_key_error(key: &str) -> Error {
    Error::new(
        ErrorKind::Permanent,
        format!("invalid object key '{key}': the name of a drive record"),
    )
}

/// Every key under `prefix` on any drive, in lexicographic order (a key found on two
/// drives, which only a put racing another process can leave, is listed once).
fn merge_listings(drives: &[Drive], prefix: &str) -> Result<Vec<ListEntry>> {
    let mut all = Vec::new();
    for d in drives {
        all.extend(d.list_sync(prefix)?);
    }
    all.sort_by(|a, b| a.key.cmp(&b.key));
    all.dedup_by(|a, b| a.key == b.key);
    Ok(all)
}
