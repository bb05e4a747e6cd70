//! Group commit: a group of operations becomes one write-log record.
//!
//! Whoever holds the [`Appender`] (a thread that unplugged started operations, or the
//! log writer thread: `crate::write::started`) hands a group here: its writes and zeroed
//! ranges become one record, numbered, placed in the log and issued as one write; up
//! to `log_writes_in_flight` records are written at once (`log_order`). A group retires
//! in log order, once its record and every earlier one have landed: if any operation
//! asked for durability (FLUSH or FUA) one `fdatasync` covers all of them, and only
//! then are the maps updated and the callers answered. Because there is one appender
//! at a time and it takes operations in the order they came, a FLUSH covers every
//! write acknowledged before it, on every connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::record::{ExtentKind, RecordExtent, encode_record_parts, record_bytes_for};
use tokio::sync::oneshot;

use crate::shared::Shared;
use crate::write::log_order::{Done, Group, LogWrites, PlacedRecord};
use lsvd_core::error::{Error, ErrorKind, Result};

/// An operation for the write log, with whoever waits for its end.
pub(crate) enum LogOp {
    Write {
        lba: u64,
        data: Vec<u8>,
        fua: bool,
        done: Done,
    },
    Zero {
        lba: u64,
        sectors: u64,
        fua: bool,
        done: Done,
    },
    Flush {
        done: Done,
    },
    Shutdown {
        done: oneshot::Sender<Result<()>>,
    },
    /// Resize the volume ([`crate::lifecycle::resize`]): a group of its own, handled once every
    /// earlier record is in the pipeline, so that the resize object follows exactly
    /// the writes queued before it; writes queued after it are held to the new size
    /// when it is smaller.
    Resize {
        new_size_bytes: u64,
        done: oneshot::Sender<Result<()>>,
    },
    /// Append what the NBD server started (`crate::write::started`): a runtime thread left
    /// something only this thread may do.
    Kick,
}

/// Most operations taken into one group commit.
pub(crate) const MAX_OPS_PER_RECORD: usize = 1024;

/// What the appender owns: the log writes in flight and the CRC the next record chains
/// to.
pub(crate) struct Appender {
    pub(crate) writes: LogWrites,
    pub(crate) chain_crc: u32,
}

/// The appender for a volume whose log is as `shared` says (at open).
pub(crate) fn new_appender(shared: &Arc<Shared>) -> Appender {
    let (chain_crc, landed_through) = {
        let st = shared.lock();
        (st.last_record_crc, st.next_record_seq - 1)
    };
    let in_flight = shared.config.log_writes_in_flight;
    Appender {
        writes: LogWrites::start(shared.clone(), in_flight, landed_through),
        chain_crc,
    }
}

/// May an operation of `more` data bytes join a group of `ops` operations holding
/// `bytes`, for a record of at most `max_bytes` of data? The first always may (a write
/// larger than the cap gets a record of its own). The one rule for groups taken from
/// the started queue and from the writer's channel (`crate::write::started`).
pub(crate) fn group_has_room(ops: usize, bytes: u64, more: u64, max_bytes: u64) -> bool {
    ops == 0 || (ops < MAX_OPS_PER_RECORD && bytes + more <= max_bytes)
}

/// Does `op` ask for an `fdatasync` before it is answered?
pub(crate) fn needs_sync(op: &LogOp) -> bool {
    match op {
        LogOp::Write { fua, .. } | LogOp::Zero { fua, .. } => *fua,
        _ => true,
    }
}

pub(crate) fn op_bytes(op: &LogOp) -> u64 {
    match op {
        LogOp::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

pub(crate) fn reply(op: LogOp, r: Result<()>) {
    match op {
        LogOp::Write { done, .. } | LogOp::Zero { done, .. } | LogOp::Flush { done } => {
            done.send(r)
        }
        LogOp::Shutdown { done } | LogOp::Resize { done, .. } => {
            let _ = done.send(r);
        }
        LogOp::Kick => {}
    }
}

/// Does `op` reach past the volume's end of `size_sectors` (it shrank after the op
/// was checked against the old size)?
fn beyond_end(op: &LogOp, size_sectors: u64) -> bool {
    let (lba, sectors) = match op {
        LogOp::Write { lba, data, .. } => (*lba, data.len() as u64 / SECTOR_BYTES),
        LogOp::Zero { lba, sectors, .. } => (*lba, *sectors),
        _ => return false,
    };
    lba.saturating_add(sectors) > size_sectors
}

/// Hand the pipeline a resize once every record placed so far has retired (and so is
/// in the pipeline, in order). A shrink takes effect for client I/O here; a grow only
/// once its object is applied ([`crate::lifecycle::resize`] waits for that).
pub(crate) fn resize_in_log_order(
    shared: &Shared,
    writes: &LogWrites,
    new_size_bytes: u64,
) -> Result<()> {
    writes.drain();
    if shared.is_failed() {
        return Err(shared.failed_error());
    }
    let mut st = shared.lock();
    let old_size_bytes = shared.size_bytes.load(Ordering::Acquire);
    if new_size_bytes < old_size_bytes {
        shared.size_bytes.store(new_size_bytes, Ordering::Release);
        // The write log may still hold data past the new end (it keeps uploaded
        // records): a later grow must read zeros there, not that data.
        let (new_end, old_end) = (new_size_bytes / SECTOR_BYTES, old_size_bytes / SECTOR_BYTES);
        st.log_map.release(new_end, old_end - new_end, u64::MAX);
    }
    st.pipeline.resize(new_size_bytes);
    Ok(())
}

/// Handle one group: number it, place and encode its record, and issue it. Returns
/// true when the writer should stop. Without `may_wait` (a runtime thread), a group
/// that finds no log space without waiting for it (or freeing it) is handed back
/// untouched.
pub(crate) fn process_group(
    shared: &Shared,
    appender: &mut Appender,
    ops: Vec<LogOp>,
    may_wait: bool,
) -> std::result::Result<bool, Vec<LogOp>> {
    shared.panic_point("log writer");
    let writes = &appender.writes;
    let chain_crc = &mut appender.chain_crc;
    let size_sectors = shared.size_bytes.load(Ordering::Acquire) / SECTOR_BYTES;
    let (ops, beyond): (Vec<LogOp>, Vec<LogOp>) = ops
        .into_iter()
        .partition(|op| !beyond_end(op, size_sectors));
    for op in beyond {
        reply(
            op,
            Err(Error::bad_input(
                "request beyond end of volume (the volume was made smaller)",
            )),
        );
    }
    let mut extents = Vec::with_capacity(ops.len());
    // The writes' data, in extent order: copied once, into the record.
    let mut parts: Vec<&[u8]> = Vec::with_capacity(ops.len());
    let mut need_sync = false;
    for op in &ops {
        match op {
            LogOp::Write {
                lba, data: d, fua, ..
            } => {
                extents.push(RecordExtent {
                    lba: *lba,
                    sectors: (d.len() as u64 / SECTOR_BYTES) as u32,
                    kind: ExtentKind::Data,
                });
                parts.push(d);
                need_sync |= *fua;
            }
            LogOp::Zero {
                lba, sectors, fua, ..
            } => {
                // Split so each extent's length fits its 32-bit field.
                let mut at = *lba;
                let mut left = *sectors;
                while left > 0 {
                    let n = left.min(u32::MAX as u64 & !7);
                    extents.push(RecordExtent {
                        lba: at,
                        sectors: n as u32,
                        kind: ExtentKind::Zero,
                    });
                    at += n;
                    left -= n;
                }
                need_sync |= *fua;
            }
            LogOp::Flush { .. } | LogOp::Shutdown { .. } => need_sync = true,
            // A group of its own (the loop in `run`), or nothing to write.
            LogOp::Resize { .. } | LogOp::Kick => {}
        }
    }
    let mut group = Group {
        record: None,
        error: None,
        need_sync,
        replies: Vec::with_capacity(ops.len()),
    };
    let mut bytes = Vec::new();
    match place(shared, &extents, &parts, *chain_crc, may_wait) {
        Ok(Placed::Record(record, placed)) => {
            *chain_crc = placed.header.crc;
            bytes = record;
            group.record = Some(placed);
        }
        Ok(Placed::Nothing) => {}
        Ok(Placed::NoRoom) => {
            drop(parts);
            return Err(ops);
        }
        Err(e) => group.error = Some(e),
    }
    drop(parts);
    // Writes refused while the volume is healthy (the log stalled, a record too large)
    // are answered now; the group's FLUSHes still answer for the records before it.
    let refused = match group.error.take() {
        Some(e) if !shared.is_failed() => Some(e),
        other => {
            group.error = other;
            None
        }
    };
    // The data is in the record now: keep only the callers to answer.
    let mut shutdown = None;
    for op in ops {
        match op {
            LogOp::Write { done, .. } | LogOp::Zero { done, .. } if refused.is_some() => {
                done.send(Err(refused.clone().expect("checked by the guard")));
            }
            LogOp::Write { done, .. } | LogOp::Zero { done, .. } | LogOp::Flush { done } => {
                group.replies.push(done);
            }
            LogOp::Resize { done, .. } => group.replies.push(Done::Wait(done)),
            LogOp::Shutdown { done } => shutdown = Some(done),
            LogOp::Kick => {}
        }
    }
    let Some(shutdown) = shutdown else {
        writes.issue(group, bytes);
        return Ok(false);
    };
    let (tx, rx) = oneshot::channel();
    group.replies.push(Done::Wait(tx));
    writes.issue(group, bytes);
    let result = rx
        .blocking_recv()
        .unwrap_or_else(|_| Err(shared.failed_error()));
    writes.drain();
    // Everything written goes up now; nothing is held back any more.
    shared.lock().pipeline.stop_writes();
    let _ = shutdown.send(result);
    Ok(true)
}

/// What [`place`] did.
enum Placed {
    /// Nothing to write (a group of flushes).
    Nothing,
    /// The record's bytes, and where it goes.
    Record(Vec<u8>, PlacedRecord),
    /// The log has no room now, and the caller may not wait for it.
    NoRoom,
}

/// Reserve log space and a sequence number for a record of `extents`, and encode it
/// chained to `prev_crc`. Without `may_wait`, a full log is [`Placed::NoRoom`]: freeing
/// kept records (a superblock write and `fdatasync`) and waiting for uploads are the
/// log writer thread's.
fn place(
    shared: &Shared,
    extents: &[RecordExtent],
    parts: &[&[u8]],
    prev_crc: u32,
    may_wait: bool,
) -> Result<Placed> {
    let failed = || shared.failed_error();
    if shared.failed.load(Ordering::SeqCst) {
        return Err(failed());
    }
    if extents.is_empty() {
        return Ok(Placed::Nothing);
    }
    let data_bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let total = record_bytes_for(extents.len(), data_bytes);
    // Reserve space and a sequence number.
    let (seq, offset) = {
        let mut st = shared.lock();
        if total > st.log.max_record_bytes() {
            return Err(Error::bad_input("write larger than half the write log"));
        }
        let mut waited_since: Option<Duration> = None;
        let mut started_waiting: Option<Duration> = None;
        let offset = loop {
            if let Some(off) = st.log.place(total) {
                break off;
            }
            if !may_wait {
                return Ok(Placed::NoRoom);
            }
            // A failed volume uploads nothing more, so no space will be freed.
            if shared.is_failed() {
                return Err(failed());
            }
            // Uploaded records kept for reads give way to new ones.
            let freeable = st.pipeline.freeable_through();
            if st.log.tail().is_some_and(|t| t.seq <= freeable) {
                drop(st);
                crate::write::log_tail::persist_tail(shared, freeable, false);
                st = shared.lock();
                continue;
            }
            // A write that already found the log full past the stall timeout, with no
            // room freed since: fail at once (the first one waited the whole timeout).
            if shared.stats.log_stalled.load(Ordering::SeqCst) {
                shared
                    .stats
                    .log_full_failures
                    .fetch_add(1, Ordering::Relaxed);
                return Err(log_stall_error(shared, None));
            }
            let now = shared.clock().now();
            if let Some(start) = started_waiting {
                let waited = now.saturating_sub(start);
                if waited >= Duration::from_millis(shared.config.stall_timeout_ms) {
                    shared.stats.log_stalled.store(true, Ordering::SeqCst);
                    shared
                        .stats
                        .log_full_failures
                        .fetch_add(1, Ordering::Relaxed);
                    let e = log_stall_error(shared, Some(waited));
                    // Said once per stall: what the log waits for (an object that
                    // keeps failing holds every landed one behind it).
                    lsvd_store::log::warn(&format!(
                        "{e}; further writes fail at once until the log has room; uploads: {}",
                        st.pipeline.describe()
                    ));
                    return Err(e);
                }
            }
            let since = match waited_since {
                Some(since) => since,
                None => {
                    // The start of a full-log episode: one line and one count.
                    shared.stats.log_full_waits.fetch_add(1, Ordering::Relaxed);
                    shared.stats.log_full.store(true, Ordering::Relaxed);
                    lsvd_store::log::warn(&format!(
                        "write log full: client writes wait until uploads free space \
                         ({} uploads pending)",
                        st.pipeline.uploads_pending()
                    ));
                    waited_since = Some(now);
                    started_waiting = Some(now);
                    now
                }
            };
            if now.saturating_sub(since) > Duration::from_secs(5) {
                lsvd_store::log::warn("write log full: writes are waiting for object uploads");
                waited_since = Some(now);
            }
            // Make sure a partial batch does not hold the log hostage.
            st.pipeline.close_batch();
            st = st.wait_for_space(Duration::from_millis(200));
        };
        if let Some(start) = started_waiting {
            shared.stats.log_full.store(false, Ordering::Relaxed);
            lsvd_store::log::info(&format!(
                "write log has room again after {} ms; writes resume",
                shared.clock().now().saturating_sub(start).as_millis()
            ));
        }
        let seq = st.next_record_seq;
        st.next_record_seq += 1;
        st.log.push(seq, offset, total);
        (seq, offset)
    };
    let (record, header) = encode_record_parts(shared.meta.volume, seq, prev_crc, extents, parts);
    Ok(Placed::Record(
        record,
        PlacedRecord {
            seq,
            offset,
            header,
            data_bytes,
            total_bytes: total,
        },
    ))
}

/// The answer to a write that cannot get log space within the stall timeout: ENOSPC
/// while the store refuses uploads as full, EIO otherwise (the store refuses the
/// credentials, is away, or is too slow). The write is not in the log; nothing
/// acknowledged is lost.
fn log_stall_error(shared: &Shared, waited: Option<Duration>) -> Error {
    let stats = &shared.stats;
    let (kind, why) = if stats.store_full.load(Ordering::SeqCst) {
        (ErrorKind::Full, "the store is full")
    } else if stats.store_denied.load(Ordering::SeqCst) {
        (ErrorKind::Denied, "the store refuses the credentials")
    } else {
        (ErrorKind::Transient, "uploads to the store do not complete")
    };
    let waited = waited.map_or_else(String::new, |w| format!(" after {} ms", w.as_millis()));
    Error::new(
        kind,
        format!(
            "volume {}: write not accepted{waited}: the write log is full and {why} \
             (stall timeout {} ms)",
            shared.meta.name, shared.config.stall_timeout_ms
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::{MAX_OPS_PER_RECORD, group_has_room};

    #[test]
    fn a_group_takes_ops_up_to_the_byte_cap_and_the_op_count() {
        let cap = 1 << 20;
        assert!(
            group_has_room(0, 0, 8 << 20, cap),
            "a first write larger than the cap"
        );
        assert!(
            group_has_room(1, 4096, cap - 4096, cap),
            "exactly at the cap"
        );
        assert!(
            !group_has_room(1, 4096, cap - 4095, cap),
            "one byte past it"
        );
        assert!(group_has_room(3, cap, 0, cap), "a FLUSH joins a full group");
        assert!(
            !group_has_room(MAX_OPS_PER_RECORD, 0, 0, cap),
            "at most this many ops"
        );
        assert!(group_has_room(MAX_OPS_PER_RECORD - 1, 0, 4096, cap));
    }
}
