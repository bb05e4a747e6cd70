//! Reading past a bad copy: when bytes a store returned fail their checksums (an
//! object's header, or chunks of its data), ask the store for every copy it keeps of
//! the same range ([`ObjectStore::get_range_copies`](lsvd_store::ObjectStore)), and
//! answer from the first that passes the same checks.
//!
//! Only the engine can tell a good copy from a bad one: a mirrored chain returns
//! whatever its first copy holds, and a flipped bit reads back without an I/O error.
//! Each fallback is counted (`store_copy_fallbacks_total`) and logged naming the object
//! and the bad copies, and starts a repair in the background: the whole object is read
//! from each copy, verified in full, and the store rewrites the copies that differ
//! from a good one ([`ObjectStore::repair_copies`](lsvd_store::ObjectStore)). The
//! read never waits for the repair. Stores with one copy offer nothing: the read fails
//! `Corrupt` as before.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::object::{
    HEADER_PROBE_BYTES, MAX_HEADER_BYTES, ObjectHeader, decode_object_header, peek_header_bytes,
};

use crate::shared::{CopyRepairs, Shared};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// Repairs running at once, at most: a fallback that finds this many leaves its
/// repair to a later read of the object (which falls back again).
const MAX_REPAIRS_RUNNING: usize = 4;

/// A copy that passed the checks, and the copies that did not.
struct GoodCopy {
    bytes: Vec<u8>,
    copy: String,
    bad: Vec<String>,
}

/// The first copy of bytes `range` of `key` that `verify` accepts.
async fn first_good_copy(
    shared: &Shared,
    key: &str,
    range: Range<u64>,
    verify: impl Fn(&[u8]) -> Result<()>,
) -> Option<GoodCopy> {
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let copies = match shared.store.get_range_copies(key, range).await {
        Ok(c) => c,
        Err(e) => {
            lsvd_store::log::warn(&format!("reading the copies of {key}: {e}"));
            return None;
        }
    };
    let mut bad = Vec::new();
    for c in copies {
        match verify(&c.bytes) {
            Ok(()) => {
                return Some(GoodCopy {
                    bytes: c.bytes,
                    copy: c.copy,
                    bad,
                });
            }
            Err(_) => bad.push(c.copy),
        }
    }
    if !bad.is_empty() {
        lsvd_store::log::warn(&format!(
            "object {key}: no copy passes its checks (bad: {})",
            bad.join(", ")
        ));
    }
    None
}

/// Count and report a read answered by another copy.
fn fell_back(shared: &Shared, key: &str, what: &str, good: &GoodCopy) {
    shared.stats.copy_fallbacks.fetch_add(1, Ordering::Relaxed);
    let bad = if good.bad.is_empty() {
        "the copy first read".to_string()
    } else {
        good.bad.join(", ")
    };
    lsvd_store::log::warn(&format!(
        "object {key}: {what} failed the checksums on {bad}; read from the copy on {}, \
         repairing the bad copy",
        good.copy
    ));
}

/// Data bytes `[start, end)` of `key` from another copy, after the first read of them
/// failed with `err`; `err` itself unless it says the bytes were corrupt and a copy
/// that passes `header`'s chunk checksums is found.
pub(super) async fn data_from_copies(
    shared: &Shared,
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
    err: Error,
) -> Result<Vec<u8>> {
    if err.kind != ErrorKind::Corrupt {
        return Err(err);
    }
    let verify = |bytes: &[u8]| check_fetched(key, header, start, end, bytes);
    let (stored_start, stored_end) = header.stored_range(start, end);
    let Some(good) = first_good_copy(shared, key, stored_start..stored_end, verify).await else {
        return Err(err);
    };
    fell_back(shared, key, &format!("bytes {start}..{end}"), &good);
    start_repair(shared, key, header.clone());
    open_fetched(key, header, start, end, good.bytes)
}

/// Object `key`'s header from another copy, after the first read of it failed with
/// `err`; `check` says whether a decoded header is the one the key names.
pub(super) async fn header_from_copies(
    shared: &Shared,
    key: &str,
    check: impl Fn(&ObjectHeader) -> Result<()>,
    err: Error,
) -> Result<ObjectHeader> {
    if err.kind != ErrorKind::Corrupt {
        return Err(err);
    }
    // How much to read: the largest header size a copy claims (each copy's own claim
    // is checked by decoding it).
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let probes = match shared
        .store
        .get_range_copies(key, 0..HEADER_PROBE_BYTES)
        .await
    {
        Ok(p) => p,
        Err(_) => return Err(err),
    };
    let Some(need) = probes
        .iter()
        .filter_map(|c| peek_header_bytes(&c.bytes).ok())
        .filter(|&n| n <= MAX_HEADER_BYTES)
        .max()
    else {
        return Err(err);
    };
    let decode = |bytes: &[u8]| -> Result<ObjectHeader> {
        let h = decode_object_header(bytes)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, key, e))?;
        check(&h)?;
        Ok(h)
    };
    let range = 0..need.max(HEADER_PROBE_BYTES);
    let Some(good) = first_good_copy(shared, key, range, |b| decode(b).map(|_| ())).await else {
        return Err(err);
    };
    let header = decode(&good.bytes)?;
    fell_back(shared, key, "its header", &good);
    start_repair(shared, key, header.clone());
    Ok(header)
}

/// Start rewriting the bad copies of `key` in the background, unless it is being
/// repaired already or too many repairs are running.
fn start_repair(shared: &Shared, key: &str, header: ObjectHeader) {
    let repairs = shared.stats.copy_repairs.clone();
    {
        let mut running = repairs.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.len() >= MAX_REPAIRS_RUNNING || !running.insert(key.to_string()) {
            return;
        }
    }
    let store = shared.store.clone();
    let key = key.to_string();
    shared.runtime.spawn(async move {
        let result = repair(&store, &key, &header, &repairs).await;
        if let Err(e) = result {
            lsvd_store::log::warn(&format!("repairing the copies of {key}: {e}"));
        }
        repairs
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    });
}

/// Read `key` whole from each copy, take the first that is exactly the object
/// `header` describes, and have the store rewrite the copies that differ from it.
async fn repair(
    store: &DynStore,
    key: &str,
    header: &ObjectHeader,
    repairs: &Arc<CopyRepairs>,
) -> Result<()> {
    let total = header.total_bytes();
    let copies = store.get_range_copies(key, 0..total).await?;
    let whole_and_good = |bytes: &[u8]| {
        bytes.len() as u64 == total
            && decode_object_header(bytes).is_ok_and(|h| h == *header)
            && header
                .verify_stored_data(&bytes[header.header_bytes as usize..])
                .is_ok()
    };
    let Some(good) = copies.into_iter().find(|c| whole_and_good(&c.bytes)) else {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{key}: no whole copy passes its checks"),
        ));
    };
    let rewritten = store
        .repair_copies(key, bytes::Bytes::from(good.bytes))
        .await?;
    repairs
        .copies_rewritten
        .fetch_add(rewritten.len() as u64, Ordering::Relaxed);
    if !rewritten.is_empty() {
        lsvd_store::log::warn(&format!(
            "object {key}: rewrote the copy on {} from the good copy on {}",
            rewritten.join(", "),
            good.copy
        ));
    }
    Ok(())
}

/// Data-section bytes `[start, end)` of object `key` (object offsets, aligned as
/// [`ObjectHeader::verifiable_range`] gives them) from `stored`, the bytes
/// [`ObjectHeader::stored_range`] says hold them, as fetched: all there, matching the
/// header's chunk checksums, decompressed where stored compressed. Every read of object
/// data is checked by this, the first copy's and the others' alike.
pub(super) fn open_fetched(
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
    stored: Vec<u8>,
) -> Result<Vec<u8>> {
    let (stored_start, stored_end) = header.stored_range(start, end);
    let corrupt = |why: &str| Error::new(ErrorKind::Corrupt, format!("{key}: {why}"));
    if stored.len() as u64 != stored_end - stored_start {
        return Err(corrupt("short read"));
    }
    let data = header
        .open_data(start, stored)
        .map_err(|e| Error::with_source(ErrorKind::Corrupt, key, e))?;
    if data.len() as u64 != end - start {
        return Err(corrupt("chunks open to a length the range does not have"));
    }
    Ok(data)
}

/// [`open_fetched`] without keeping the data: does this copy pass the checks?
pub(super) fn check_fetched(
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
    stored: &[u8],
) -> Result<()> {
    open_fetched(key, header, start, end, stored.to_vec()).map(drop)
}
