//! The log writer: the only thread that appends to the write log.
//!
//! It takes every queued operation at once (group commit), turns the writes and zeroed
//! ranges into one record, appends it with one write, and if any operation asked for
//! durability (FLUSH or FUA) issues one `fdatasync` for all of them. Only then are the
//! maps updated and the callers answered. Because it is the only appender and handles
//! operations in arrival order, a FLUSH covers every write acknowledged before it, on
//! every connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::record::{ExtentKind, RecordExtent, encode_record_parts, record_bytes_for};
use lsvd_core::pipeline::BatchItem;
use tokio::sync::oneshot;

use super::shared::{LogPos, Shared, State};
use crate::error::{Error, ErrorKind, Result};

pub(crate) enum LogOp {
    Write {
        lba: u64,
        data: Vec<u8>,
        fua: bool,
        done: oneshot::Sender<Result<()>>,
    },
    Zero {
        lba: u64,
        sectors: u64,
        fua: bool,
        done: oneshot::Sender<Result<()>>,
    },
    Flush {
        done: oneshot::Sender<Result<()>>,
    },
    Shutdown {
        done: oneshot::Sender<Result<()>>,
    },
}

/// Most operations taken into one group commit.
const MAX_OPS_PER_RECORD: usize = 1024;

/// The writer thread's body. `runtime` is entered so that the clock reads the same time
/// as the runtime's tasks (tokio's clock, paused in some tests).
pub(crate) fn run(
    shared: Arc<Shared>,
    mut rx: tokio::sync::mpsc::Receiver<LogOp>,
    runtime: tokio::runtime::Handle,
) {
    let _runtime = runtime.enter();
    let mut dirty = false;
    // A record carries at most a batch of data (unless one write is larger), so that
    // objects stay within the batch size (`Batcher::would_overflow`).
    let max_bytes = shared
        .config
        .group_commit_max_bytes
        .min(shared.config.batch_size_bytes)
        .max(1);
    // An op that did not fit the previous group starts the next one.
    let mut carried: Option<LogOp> = None;
    loop {
        let first = match carried.take() {
            Some(op) => op,
            None => match rx.blocking_recv() {
                Some(op) => op,
                None => break,
            },
        };
        let mut ops = vec![first];
        let mut bytes = op_bytes(&ops[0]);
        while ops.len() < MAX_OPS_PER_RECORD && bytes < max_bytes {
            match rx.try_recv() {
                Ok(op) => {
                    let more = op_bytes(&op);
                    if bytes + more > max_bytes {
                        carried = Some(op);
                        break;
                    }
                    bytes += more;
                    ops.push(op);
                }
                Err(_) => break,
            }
        }
        let shutdown = process(&shared, ops, &mut dirty);
        if shutdown {
            break;
        }
    }
    // Fail anything still queued.
    rx.close();
    let closing = || {
        Err(Error::new(
            ErrorKind::ShuttingDown,
            "volume is shutting down",
        ))
    };
    if let Some(op) = carried {
        reply(op, closing());
    }
    while let Ok(op) = rx.try_recv() {
        reply(op, closing());
    }
}

fn op_bytes(op: &LogOp) -> u64 {
    match op {
        LogOp::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

fn reply(op: LogOp, r: Result<()>) {
    match op {
        LogOp::Write { done, .. }
        | LogOp::Zero { done, .. }
        | LogOp::Flush { done }
        | LogOp::Shutdown { done } => {
            let _ = done.send(r);
        }
    }
}

/// Handle one group. Returns true when the writer should stop.
fn process(shared: &Shared, ops: Vec<LogOp>, dirty: &mut bool) -> bool {
    let mut extents = Vec::with_capacity(ops.len());
    // The writes' data, in extent order: copied once, into the record.
    let mut parts: Vec<&[u8]> = Vec::with_capacity(ops.len());
    let mut need_sync = false;
    let mut shutdown = false;
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
            LogOp::Flush { .. } => need_sync = true,
            LogOp::Shutdown { .. } => {
                need_sync = true;
                shutdown = true;
            }
        }
    }
    let result = append(shared, &extents, &parts, need_sync, dirty);
    if shutdown {
        // Everything written goes up now; nothing is held back any more.
        shared.lock().pipeline.stop_writes();
    }
    for op in ops {
        reply(op, result.clone());
    }
    shutdown
}

fn append(
    shared: &Shared,
    extents: &[RecordExtent],
    parts: &[&[u8]],
    need_sync: bool,
    dirty: &mut bool,
) -> Result<()> {
    let failed = || shared.failed_error();
    if shared.failed.load(Ordering::SeqCst) {
        return Err(failed());
    }
    if !extents.is_empty() {
        let data_bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let total = record_bytes_for(extents.len(), data_bytes);
        // Reserve space and a sequence number.
        let (seq, offset, prev_crc) = {
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
                // A failed volume uploads nothing more, so no space will be freed.
                if shared.is_failed() {
                    return Err(failed());
                }
                let now = shared.clock().now();
                let since = match waited_since {
                    Some(since) => since,
                    None => {
                        // The start of a full-log episode: one line and one count.
                        shared.stats.log_full_waits.fetch_add(1, Ordering::Relaxed);
                        shared.stats.log_full.store(true, Ordering::Relaxed);
                        crate::log::warn(&format!(
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
                    crate::log::warn("write log full: writes are waiting for object uploads");
                    waited_since = Some(now);
                }
                // Make sure a partial batch does not hold the log hostage.
                st.pipeline.close_batch();
                st = st.wait_for_space(Duration::from_millis(200));
            };
            if let Some(start) = started_waiting {
                shared.stats.log_full.store(false, Ordering::Relaxed);
                crate::log::info(&format!(
                    "write log has room again after {} ms; writes resume",
                    shared.clock().now().saturating_sub(start).as_millis()
                ));
            }
            let seq = st.next_record_seq;
            st.next_record_seq += 1;
            st.log.push(seq, offset, total);
            (seq, offset, st.last_record_crc)
        };
        let (record, header) =
            encode_record_parts(shared.meta.volume, seq, prev_crc, extents, parts);
        if let Err(e) = shared.cache.write_at(&record, offset) {
            let e = Error::local_io("write-log write failed", e);
            shared.fail(&e.to_string());
            return Err(e);
        }
        *dirty = true;
        shared.stats.log_records.fetch_add(1, Ordering::Relaxed);
        shared
            .stats
            .log_write_bytes
            .fetch_add(record.len() as u64, Ordering::Relaxed);
        shared
            .stats
            .client_write_bytes
            .fetch_add(data_bytes, Ordering::Relaxed);
        let now_ns = shared.now_ns();
        {
            // The record is in the log: chain the next one to it, list it for the
            // write-log index (written in `sync`), and make its data readable.
            let mut st = shared.lock();
            st.last_record_crc = header.crc;
            st.log_bytes_since_index += total;
            let header_bytes = header.header_bytes;
            st.log_headers.push_back((offset, header));
            apply_record(&mut st, now_ns, seq, offset, header_bytes, extents);
        }
        if need_sync {
            sync(shared, dirty)?;
        }
        return Ok(());
    }
    if need_sync && *dirty {
        sync(shared, dirty)?;
    }
    Ok(())
}

fn sync(shared: &Shared, dirty: &mut bool) -> Result<()> {
    if let Err(e) = shared.cache.sync() {
        // After a failed fdatasync the page cache state is unknown: stop.
        let e = Error::local_io("write-log fdatasync failed", e);
        shared.fail(&e.to_string());
        return Err(e);
    }
    *dirty = false;
    {
        // Only this thread appends, so every record reserved so far is written.
        let mut st = shared.lock();
        st.log_synced_through = st.next_record_seq - 1;
    }
    shared.stats.log_syncs.fetch_add(1, Ordering::Relaxed);
    super::log_index::maybe_write(shared);
    Ok(())
}

/// Put a record's extents into the overlay map and hand them to the pipeline's open
/// batch. Also used by recovery to replay records.
pub(crate) fn apply_record(
    st: &mut State,
    now_ns: u64,
    seq: u64,
    offset: u64,
    header_bytes: u32,
    extents: &[RecordExtent],
) {
    let mut data_at = offset + u64::from(header_bytes);
    let mut items = Vec::with_capacity(extents.len());
    for e in extents {
        let sectors = e.sectors as u64;
        match e.kind {
            ExtentKind::Data => {
                st.log_map.write(e.lba, sectors, seq, data_at);
                items.push(BatchItem::Data {
                    lba: e.lba,
                    sectors,
                    at: LogPos {
                        record_seq: seq,
                        offset: data_at,
                    },
                });
                data_at += sectors * SECTOR_BYTES;
            }
            ExtentKind::Zero => {
                st.log_map.zero(e.lba, sectors, seq);
                items.push(BatchItem::Zero {
                    lba: e.lba,
                    sectors,
                });
            }
        }
    }
    st.pipeline.record(now_ns, seq, &items);
}
