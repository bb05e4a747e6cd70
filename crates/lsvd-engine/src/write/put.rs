//! Putting one object into the store: put-if-absent under this claim's own name,
//! retried until it lands, then handed back to the pipeline and applied in sequence
//! order.
//!
//! A failed PUT is retried with capped exponential backoff (jittered from the volume's
//! seeded generator; at most 1 s for the object next to be applied,
//! [`HEAD_MAX_BACKOFF`]), or at once when another upload lands ([`wait_to_retry`]):
//! client writes keep landing in the write log meanwhile and wait only once it is full
//! (and then fail after the stall timeout). A store that is full or refuses the
//! credentials is said at once (a log line per episode, a gauge and a
//! counter) and tried again every few seconds, so the volume resumes by itself when
//! someone makes room. Before each attempt the next volume superblock generation is
//! looked for: a process another has taken the volume from (or `lsvd delete`
//! fenced) stops within one object. That check only saves work and litter: the
//! object's name carries this claim's epoch, so what a superseded process uploads in
//! the moment between the check and the PUT is a name recovery never takes
//! (`lsvd_core::history`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::object::{ObjectHeader, ObjectKind, decode_object_header};

use crate::keys::object_key;
use crate::locks::LockRank;
use crate::shared::Shared;
use crate::write::apply::apply_ready;
use lsvd_core::error::ErrorKind;
use lsvd_store::{Placement, PutMode};

/// The first retry waits this long; each later one twice as long, up to [`MAX_BACKOFF`]
/// (or [`HEAD_MAX_BACKOFF`]).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest wait between tries of the object next to be applied, after a transient
/// failure: everything landed behind it, and the write-log space that holds, waits for
/// it, and no landing of another upload may come to end its wait early (a checkpoint
/// uploads alone). At 5 s between tries, a store failing 40% of PUTs (the crash
/// oracle's `store_faults`: 20% of PUTs and short outages) kept such an object away
/// for the 30 s stall timeout about once in 60,000 objects, 12 failures in a row;
/// at 1 s that takes 34. One object tried once a second is no load on a store that
/// is down; a store that refuses (full, denied) still waits [`MAX_BACKOFF`].
const HEAD_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// PUT object `seq` with retries, then tell the pipeline and apply what is ready.
pub(crate) async fn upload_object(
    shared: &Arc<Shared>,
    seq: u64,
    kind: ObjectKind,
    bytes: bytes::Bytes,
) {
    let header = match decode_object_header(&bytes) {
        Ok(h) => h,
        Err(e) => {
            shared.fail(&format!("encoded object {seq:016x} does not decode: {e}"));
            return;
        }
    };
    let key = object_key(&shared.meta.name, seq, header.epoch, kind);
    let placement = placement_of(shared, &header);
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0u32;
    loop {
        // After a local failure, a fence (or a simulated crash) nothing more may
        // change state.
        if shared.is_failed() {
            return;
        }
        attempt += 1;
        // Listening from before this try: an upload that lands while it fails ends
        // the wait for the next one too.
        let landed = shared.put_landed.notified();
        tokio::pin!(landed);
        landed.as_mut().enable();
        let current = shared
            .lock_ranked(&shared.volume_super, LockRank::VolumeSuper)
            .clone();
        match crate::fencing::volume_super::superseded(&shared.store, &shared.meta.name, &current)
            .await
        {
            Ok(None) => {}
            Ok(Some(by)) => {
                shared.fence(&by);
                return;
            }
            Err(e) => {
                note_store_error(
                    shared,
                    attempt,
                    &format!("cannot check volume ownership before {key}"),
                    &e,
                );
                let wait = capped_backoff(shared, seq, backoff, is_refusal(&e));
                wait_to_retry(shared, wait, landed.as_mut()).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
        shared.stats.store_puts.fetch_add(1, Ordering::Relaxed);
        match shared
            .store
            .put_placed(&key, bytes.clone(), PutMode::IfAbsent, &placement)
            .await
        {
            Ok(()) => {
                note_landed(shared, &key, attempt);
                break;
            }
            // An earlier attempt landed but its answer was lost: the name is this
            // claim's alone, and the bytes must be ours.
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                let header_len = header.header_bytes as u64;
                match shared.store.get_range(&key, 0..header_len).await {
                    Ok(found) if found[..] == bytes[..header_len as usize] => {
                        note_landed(shared, &key, attempt);
                        break;
                    }
                    Ok(_) => {
                        shared.fail(&format!(
                            "{key} already exists with other contents (this process's epoch must be its alone: is another process using the same session?)"
                        ));
                        return;
                    }
                    Err(e) => {
                        lsvd_store::log::warn(&format!(
                            "{key} exists but cannot be read back, retrying: {e}"
                        ));
                        let wait = capped_backoff(shared, seq, backoff, is_refusal(&e));
                        wait_to_retry(shared, wait, landed.as_mut()).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
            Err(e) => {
                note_store_error(shared, attempt, &format!("upload of {key} failed"), &e);
                let jitter = FIRST_BACKOFF.mul_f64(shared.jitter_fraction());
                let wait = capped_backoff(shared, seq, backoff, is_refusal(&e)) + jitter;
                wait_to_retry(shared, wait, landed.as_mut()).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    // The store takes PUTs: uploads waiting out a backoff try again now.
    shared.put_landed.notify_waiters();
    shared
        .stats
        .store_put_bytes
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    match kind {
        ObjectKind::Checkpoint => shared
            .stats
            .checkpoints_written
            .fetch_add(1, Ordering::Relaxed),
        _ => shared.stats.objects_written.fetch_add(1, Ordering::Relaxed),
    };
    if shared.is_failed() {
        return;
    }
    let header = Arc::new(header);
    if kind != ObjectKind::Checkpoint {
        // Reads of this object need its header: it is here already.
        crate::read::remember_header(shared, header.clone());
    }
    // Client data, and what GC relocated (still live, and otherwise read back with a
    // GET once GC deleted the copy the cache held).
    if kind != ObjectKind::Checkpoint && shared.admit_uploads {
        admit(shared, header.clone(), bytes);
    }
    shared.lock().pipeline.upload_done(seq, (*header).clone());
    apply_ready(shared).await;
}

/// A full store or refused credentials: not a failure that a quick retry may get past.
fn is_refusal(e: &lsvd_core::error::Error) -> bool {
    matches!(e.kind, ErrorKind::Full | ErrorKind::Denied)
}

/// `backoff`, at most [`HEAD_MAX_BACKOFF`] for object `seq` if it is the next to be
/// applied and the store did not refuse it (`refused`).
fn capped_backoff(shared: &Shared, seq: u64, backoff: Duration, refused: bool) -> Duration {
    let head = !refused && shared.lock().pipeline.store().next_object_seq() == seq;
    if head {
        backoff.min(HEAD_MAX_BACKOFF)
    } else {
        backoff
    }
}

/// Wait `backoff` ([`capped_backoff`]) before the next try of a failed upload, or
/// less: until another upload lands (`landed`, listening since this try began).
/// Objects are applied in sequence order, so the one retrying may be what every landed
/// object behind it, and the write-log space they hold, waits for; and a landing shows
/// the store takes PUTs.
/// Without this, one object unlucky under intermittent failures (20% of PUTs and short
/// outages in the crash oracle's `store_faults`) slept up to 5 s per try while the
/// other upload slots kept landing objects that could not be applied, and writes
/// waited on a full log until the stall timeout failed them. Only landings end the
/// wait early, so a retry comes at most once per backoff plus once per object that
/// lands meanwhile (and at most `uploads_in_flight` uploads retry at once): no storm
/// against a store that is down.
async fn wait_to_retry(
    shared: &Shared,
    backoff: Duration,
    landed: Pin<&mut tokio::sync::futures::Notified<'_>>,
) {
    tokio::select! {
        () = shared.clock().sleep(backoff) => {}
        () = landed => {}
    }
}

/// Where an object belongs in a store of several drives: GC output names the objects
/// it relocates from (its extents' sources, still in the store state until the pass's
/// checkpoint); everything else is client data.
fn placement_of(shared: &Shared, header: &ObjectHeader) -> Placement {
    if header.kind != ObjectKind::Gc {
        return Placement::Client;
    }
    let mut sources: Vec<u64> = header
        .extents
        .iter()
        .filter_map(|e| e.source.map(|s| s.object_seq))
        .collect();
    sources.sort_unstable();
    sources.dedup();
    let victim_keys = {
        let st = shared.lock();
        let objects = st.pipeline.store().objects();
        sources
            .into_iter()
            .filter_map(|seq| {
                objects
                    .get(&seq)
                    .map(|o| shared.object_key(seq, o.epoch, o.kind))
            })
            .collect()
    };
    Placement::Gc { victim_keys }
}

/// Copy an uploaded object's data into the read cache, a chunk at a time, in the
/// background (decompressed when it is stored compressed); skipped (and counted) when
/// too many admissions are already pending.
fn admit(shared: &Arc<Shared>, header: Arc<ObjectHeader>, bytes: bytes::Bytes) {
    use crate::read::cache::READ_CACHE_CHUNK_BYTES;
    use crate::shared::MAX_PENDING_ADMISSIONS;
    let pending = shared.admissions_pending.fetch_add(1, Ordering::AcqRel);
    if pending >= MAX_PENDING_ADMISSIONS {
        shared.admissions_pending.fetch_sub(1, Ordering::AcqRel);
        shared
            .stats
            .admissions_skipped
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    let s = shared.clone();
    tokio::task::spawn_blocking(move || {
        if let Some(rc) = &s.read_cache {
            // The cache holds data as extents see it: compressed chunks are opened
            // first (the uploader checked this object decodes; a failure skips it).
            let opened;
            let data = if header.stored_chunks.is_empty() {
                &bytes[header.header_bytes as usize..]
            } else {
                match header.open_whole(&bytes) {
                    Ok(d) => {
                        opened = d;
                        &opened[..]
                    }
                    Err(_) => &[][..],
                }
            };
            for (chunk, piece) in data.chunks(READ_CACHE_CHUNK_BYTES as usize).enumerate() {
                let obj = s.cache_object(header.seq, header.epoch);
                rc.admit(obj, chunk as u64, piece);
            }
        }
        s.admissions_pending.fetch_sub(1, Ordering::AcqRel);
    });
}

/// The store has the object (this attempt's PUT, or an earlier one whose reply was
/// lost): an outage or refusal this upload saw is over, and is said to be.
fn note_landed(shared: &Shared, key: &str, attempt: u32) {
    if attempt > 1 {
        lsvd_store::log::info(&format!(
            "store reachable again: {key} uploaded after {attempt} attempts"
        ));
    }
    shared.stats.note_store_healthy();
}

/// Count a failed PUT of an upload in `store_put_retries_total` and say so on the
/// first attempt and every 20th after it: one line per outage and object, not one per
/// retry. A full store or refused credentials are said at once, once per episode
/// (`Stats::note_store_refusal`).
fn note_store_error(shared: &Shared, attempt: u32, what: &str, e: &lsvd_core::error::Error) {
    shared
        .stats
        .store_put_retries
        .fetch_add(1, Ordering::Relaxed);
    if matches!(e.kind, ErrorKind::Full | ErrorKind::Denied) {
        if shared.stats.note_store_refusal(e.kind) {
            lsvd_store::log::error(&format!(
                "volume {}: the store refuses uploads ({what}: {e}); writes go on into the write log, and fail with {} once it is full; uploads are tried again every few seconds",
                shared.meta.name,
                if e.kind == ErrorKind::Full {
                    "ENOSPC"
                } else {
                    "EIO"
                }
            ));
        }
        return;
    }
    if attempt == 1 || attempt.is_multiple_of(20) {
        lsvd_store::log::warn(&format!(
            "store unavailable: {what} (attempt {attempt}), retrying: {e}"
        ));
    }
}
