//! The uploader task: starts the uploads the pipeline hands out.
//!
//! Each wake-up (a notification, or the tick that lets batches time out and
//! checkpoints fall due) takes every upload the pipeline allows now
//! (`Pipeline::next_upload`) and runs each in a task of its own: a client batch is
//! built from its records, kept in memory or read back from the write log, and
//! encoded ([`upload_data`]), a GC object is already
//! encoded, a checkpoint is taken ([`crate::maintenance::checkpoint`]). Uploads may finish in any
//! order; `put::upload_object` hands them back to the pipeline, which applies them in
//! sequence order. The task ends once writes have stopped and the pipeline is drained.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lsvd_core::batcher::Batch;
use lsvd_core::extent_map::Piece;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{ObjectKind, ObjectSpec, object_header_len};
use lsvd_core::format::record::RecordHeader;
use lsvd_core::pipeline::Upload;

use crate::cache_dev::CacheDevice;
use crate::maintenance::checkpoint;
use crate::recovery::log_scan::{CorruptRecord, VerifyError, read_verified};
use crate::shared::{LogPos, Shared};
use crate::write::by_record::group_by_record;
use crate::write::put::upload_object;
use crate::write::seal::seal_object;
use lsvd_store::clock::timeout;
use lsvd_store::direct_buf::{Assembly, DirectBuf};

/// The uploader wakes at least this often: batch timeouts and the checkpoint interval
/// are checked then.
pub(crate) const TICK: Duration = Duration::from_millis(200);

pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        shared.panic_point("uploader");
        // A cooperative yield point: even a loop woken over and over stays
        // preemptible (and a runtime shutting down can stop it).
        tokio::task::coop::consume_budget().await;
        shared
            .stats
            .uploader_wakeups
            .fetch_add(1, Ordering::Relaxed);
        let (starts, drained) = {
            let mut st = shared.lock();
            st.pipeline.tick(shared.now_ns());
            // Nothing new reaches the store before this process owns the volume.
            let claimed = shared.volume_claimed.load(Ordering::SeqCst);
            let mut starts = Vec::new();
            while let Some(u) = st.pipeline.next_upload(claimed) {
                // A checkpoint's head is copied now, under the lock, before anything
                // after it can be applied; its map and encoding follow without it.
                let snapshot = match &u {
                    Upload::Checkpoint { seq, clean, .. } => {
                        Some(checkpoint::snapshot(&shared, &st, *seq, *clean))
                    }
                    _ => None,
                };
                starts.push((u, snapshot));
            }
            (starts, st.pipeline.drained())
        };
        for (upload, snapshot) in starts {
            let task_shared = shared.clone();
            match upload {
                Upload::Data { seq, batch } => {
                    crate::supervise::spawn(&shared, "upload", async move {
                        upload_data(task_shared, seq, batch).await
                    });
                }
                Upload::Gc { seq, object } => {
                    crate::supervise::spawn(&shared, "GC upload", async move {
                        upload_object(&task_shared, seq, ObjectKind::Gc, object).await
                    });
                }
                Upload::Checkpoint { seq, dead, .. } => {
                    let snapshot = snapshot.expect("taken above for every checkpoint");
                    crate::supervise::spawn(&shared, "checkpoint", async move {
                        checkpoint::run(&task_shared, seq, snapshot, dead).await
                    });
                }
            }
        }
        // A failed volume uploads nothing more: what is left stays in the write log
        // for the next start (or for the process that took the volume over).
        if drained || shared.is_failed() {
            return;
        }
        let _ = timeout(shared.clock(), TICK, shared.upload_wake.notified()).await;
    }
}

/// A record a batch takes data from: its log offset, its header as written, and the
/// record itself if it is still in memory.
type Taken = (u64, RecordHeader, Option<bytes::Bytes>);

/// Take a closed batch's records, and copy the live pieces straight into the object's
/// data section; checksum it and write the header in front, off the runtime threads
/// (8 MiB of copying and checksumming is milliseconds a client request would wait
/// behind); then upload it. A record still in memory (`crate::write::recent_records`) is
/// used as written; any other is read back from the write log (its records stay
/// allocated until this object is applied) and verified against the CRC32C and data
/// hash it was written with.
///
/// A record read back that fails verification (the cache device changed its bytes
/// after the write was acknowledged) fails the volume: nothing of this batch, or of
/// any later one, reaches the store, and writes and flushes fail from then on. The log
/// line names the record and its LBAs; `log_records_corrupt` counts it.
async fn upload_data(shared: Arc<Shared>, seq: u64, batch: Batch<LogPos>) {
    let volume = shared.meta.volume;
    // The headers of the records the batch takes data from, as they were written, and
    // the records themselves where they are still in memory.
    let piece_records: Vec<u64> = batch
        .extents
        .iter()
        .map(|p| p.location.record_seq)
        .collect();
    let by_record = group_by_record(&piece_records);
    let records: Result<Vec<Taken>, u64> = {
        let st = shared.lock();
        // (Under the state lock: a panic here poisons it.)
        shared.panic_point("upload");
        by_record
            .seqs
            .iter()
            .map(|&s| {
                st.log_headers
                    .binary_search_by_key(&s, |(_, h)| h.seq)
                    .map(|i| {
                        let (offset, header) = st.log_headers[i].clone();
                        (offset, header, st.recent_records.get(s))
                    })
                    .map_err(|_| s)
            })
            .collect()
    };
    let records = match records {
        Ok(r) => r,
        Err(s) => {
            shared.fail(&format!(
                "batch {seq:016x} takes data from write-log record {s}, which the log no longer holds"
            ));
            return;
        }
    };
    let task = shared.clone();
    let epoch = shared.epoch();
    let compression = shared.config.compression();
    let bytes = tokio::task::spawn_blocking(move || -> Result<DirectBuf, VerifyError> {
        let extents = batch.object_extents();
        // A batch of records holds them from its first; a resize holds none.
        let first_record_seq = if batch.volume_size_bytes.is_some() {
            batch.last_record_seq + 1
        } else {
            batch.first_record_seq
        };
        let spec = ObjectSpec {
            kind: ObjectKind::Data,
            volume,
            seq,
            last_record_seq: batch.last_record_seq,
            extents: &extents,
            trims: &batch.trims,
            volume_size_bytes: batch.volume_size_bytes,
            parts_after: batch.parts_after,
            epoch,
            first_record_seq,
        };
        let data_bytes: u64 = batch.extents.iter().map(|p| p.sectors * SECTOR_BYTES).sum();
        let header_len = object_header_len(&spec, data_bytes);
        let total = header_len + data_bytes as usize;
        let (cache, count) = (task.cache.as_ref(), &task.stats.log_records_read_back);
        let pieces = &by_record.order;
        let buf = assemble(&batch, pieces, &records, header_len, total, cache, count)?;
        Ok(seal_object(&spec, buf, header_len, compression))
    })
    .await;
    let bytes = match bytes {
        Ok(Ok(b)) => b,
        Ok(Err(VerifyError::Io(e))) => {
            shared.fail(&format!(
                "reading batch {seq:016x} back from the write log failed: {e}"
            ));
            return;
        }
        Ok(Err(VerifyError::Corrupt(c))) => {
            shared
                .stats
                .log_records_corrupt
                .fetch_add(1, Ordering::Relaxed);
            shared.fail(&format!(
                "{c}; not uploading batch {seq:016x} or anything after it"
            ));
            return;
        }
        Err(e) => {
            shared.fail(&format!("batch encoder task failed: {e}"));
            return;
        }
    };
    upload_object(&shared, seq, ObjectKind::Data, bytes.into_bytes()).await;
}

/// Where piece `p` of a batch lies in `record` (which starts at log offset `offset`);
/// an error if it is not inside the record's data.
fn piece_at(
    p: &Piece<LogPos>,
    offset: u64,
    header: &RecordHeader,
) -> Result<std::ops::Range<usize>, VerifyError> {
    let n = (p.sectors * SECTOR_BYTES) as usize;
    let from = p.location.offset;
    let data_start = offset + header.header_bytes as u64;
    let data_end = data_start + header.data_bytes();
    if from < data_start || from + n as u64 > data_end {
        return Err(VerifyError::Corrupt(CorruptRecord::outside(
            header, offset, from, n,
        )));
    }
    let i = (from - offset) as usize;
    Ok(i..i + n)
}

/// The object (header left zero), assembled record by record: a record still in
/// memory as written (its bytes are the ones clients sent, so they need no check),
/// otherwise read back from the log into one reused buffer and verified first. Each
/// piece is copied to its place in an [`Assembly`], so the buffer is not zeroed first.
/// `pieces` are the batch's piece indexes grouped by record, in the order of `records`
/// ([`group_by_record`]).
fn assemble(
    batch: &Batch<LogPos>,
    pieces: &[usize],
    records: &[Taken],
    header_len: usize,
    total: usize,
    cache: &dyn CacheDevice,
    read_back_count: &AtomicU64,
) -> Result<DirectBuf, VerifyError> {
    let piece_bytes = |p: &Piece<LogPos>| (p.sectors * SECTOR_BYTES) as usize;
    let mut object = Assembly::new(total, header_len, batch.extents.iter().map(piece_bytes))
        .ok_or_else(|| assembly_error("its pieces do not add up to the object's size"))?;
    let mut read_back = Vec::new();
    let mut next = 0;
    for (offset, header, kept) in records {
        let record: &[u8] = match kept {
            Some(r) => r,
            None => {
                read_back_count.fetch_add(1, Ordering::Relaxed);
                read_verified(cache, *offset, header, &mut read_back)?;
                &read_back
            }
        };
        while let Some(&i) = pieces.get(next)
            && batch.extents[i].location.record_seq == header.seq
        {
            let p = &batch.extents[i];
            let range = piece_at(p, *offset, header)?;
            // A record in memory is the buffer the log writer wrote, whole; check
            // anyway rather than panic on a slice past its end.
            let piece = record.get(range).ok_or_else(|| {
                let n = piece_bytes(p);
                VerifyError::Corrupt(CorruptRecord::outside(
                    header,
                    *offset,
                    p.location.offset,
                    n,
                ))
            })?;
            if !object.put(i, piece) {
                return Err(assembly_error("a piece does not fit its place"));
            }
            next += 1;
        }
    }
    object
        .finish()
        .ok_or_else(|| assembly_error("the batch names a record the upload did not take"))
}

/// The uploader's own inconsistency (not the log's): reported, not a panic.
fn assembly_error(why: &str) -> VerifyError {
    VerifyError::Io(std::io::Error::other(format!(
        "building an object from the write log: {why}"
    )))
}
