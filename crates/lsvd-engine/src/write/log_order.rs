//! Overlapped log writes, completed in log order (the LSVD paper's overlapped writes).
//!
//! Why: a device with internal parallelism (a queue of 8-16 writes, `lsvd probe`)
//! finishes several writes in little more time than one. The log writer
//! (`crate::write::writer`) still takes groups one at a time, numbers them and places them
//! in the log in order, but hands each record's `pwrite` to one of
//! `EngineConfig::log_writes_in_flight` I/O threads and goes on to the next group.
//!
//! Writes may finish in any order; their groups are *retired* strictly in the order
//! the writer issued them: a record's extents reach the maps, and its callers are
//! answered, only once it and every earlier record have landed. A group that asked for
//! durability (FLUSH, FUA) issues its `fdatasync` when it retires, so it covers every
//! earlier record. A record that landed after a torn or missing earlier one is never
//! exposed by recovery either: each record carries its predecessor's CRC and the
//! log scan stops at the first record that fails (`crate::recovery::log_scan`).
//!
//! With one write in flight the writer writes inline and retires at once (no thread
//! handoff), which is exactly the unoverlapped log.
//!
//! Retiring is done by whichever thread completes the group the order is waiting for
//! (a worker or the writer); one at a time, so retirements never interleave.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bytes::Bytes;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::record::{ExtentKind, RecordExtent, RecordHeader};
use lsvd_core::pipeline::BatchItem;
use tokio::sync::oneshot;

use crate::shared::{LogPos, Shared, State};
use lsvd_core::error::{Error, Result};

/// A record placed in the log and encoded, on its way to the device.
pub(crate) struct PlacedRecord {
    pub seq: u64,
    pub offset: u64,
    /// Its header (extents included).
    pub header: RecordHeader,
    /// Client data bytes in it.
    pub data_bytes: u64,
    /// Log bytes it takes (header and data).
    pub total_bytes: u64,
}

/// Who hears how an operation ended: a task waiting on a channel, or a function called
/// on the thread that finishes it (the NBD server's completion, so that no task has to
/// be woken per request; it must not block).
pub(crate) enum Done {
    Wait(oneshot::Sender<Result<()>>),
    Call(Box<dyn FnOnce(Result<()>) + Send>),
}

impl Done {
    pub(crate) fn send(self, r: Result<()>) {
        match self {
            // The waiter may have gone (its client hung up): nothing to tell.
            Done::Wait(tx) => {
                let _ = tx.send(r);
            }
            Done::Call(f) => f(r),
        }
    }
}

/// One group of operations, in the order the writer took it.
pub(crate) struct Group {
    /// Its record, if it had writes or zeroes.
    pub record: Option<PlacedRecord>,
    /// Why the group failed before or while its record was written.
    pub error: Option<Error>,
    /// FLUSH, FUA or shutdown: `fdatasync` before answering.
    pub need_sync: bool,
    pub replies: Vec<Done>,
}

struct OrderState {
    /// Ticket of the next group issued.
    next_ticket: u64,
    /// Ticket of the next group to retire.
    next_retire: u64,
    /// Landed groups waiting for an earlier one, with their records' bytes.
    landed: BTreeMap<u64, (Group, Vec<u8>)>,
    /// Issued and not retired yet.
    in_flight: usize,
    /// A thread is retiring groups now.
    retiring: bool,
    /// Threads waiting on `retired` (with none, a retirement signals nothing: a
    /// notification is a system call, and with one write in flight nobody ever waits).
    waiting: usize,
}

/// What only the retiring thread touches.
struct RetireState {
    /// Records were retired since the last `fdatasync`.
    dirty: bool,
    /// Every record through this sequence number has landed (the newest retired).
    landed_through: u64,
}

/// The in-order completion of log writes, shared by the writer and the I/O threads.
pub(crate) struct LogOrder {
    shared: Arc<Shared>,
    capacity: usize,
    state: Mutex<OrderState>,
    /// Signalled whenever a group retires.
    retired: Condvar,
    retire: Mutex<RetireState>,
}

type Job = (u64, Vec<u8>, Group);

/// The writer's handle: issue groups, wait for them.
pub(crate) struct LogWrites {
    order: Arc<LogOrder>,
    jobs: Option<SyncSender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LogWrites {
    /// Start `in_flight - 1` I/O threads if `in_flight` is more than one.
    /// `landed_through`: the newest record already in the log.
    pub(crate) fn start(shared: Arc<Shared>, in_flight: usize, landed_through: u64) -> Self {
        let capacity = in_flight.max(1);
        let order = Arc::new(LogOrder {
            shared,
            capacity,
            state: Mutex::new(OrderState {
                next_ticket: 0,
                next_retire: 0,
                landed: BTreeMap::new(),
                in_flight: 0,
                retiring: false,
                waiting: 0,
            }),
            retired: Condvar::new(),
            retire: Mutex::new(RetireState {
                dirty: false,
                landed_through,
            }),
        });
        let mut writes = LogWrites {
            order,
            jobs: None,
            workers: Vec::new(),
        };
        if capacity > 1 {
            let (tx, rx) = sync_channel::<Job>(capacity);
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..capacity {
                let order = writes.order.clone();
                let rx = rx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("lsvd-log-io-{i}"))
                    .spawn(move || {
                        let shared = order.shared.clone();
                        crate::supervise::run_thread(&shared, "log I/O thread", || {
                            io_thread(&order, &rx)
                        })
                    });
                match spawned {
                    Ok(h) => writes.workers.push(h),
                    // Fewer threads only means less overlap; with none, write inline.
                    Err(e) => lsvd_store::log::warn(&format!("cannot start a log I/O thread: {e}")),
                }
            }
            if !writes.workers.is_empty() {
                writes.jobs = Some(tx);
            }
        }
        writes
    }

    /// Issue `group`, whose record (if any) is `bytes` at `offset`. Waits while
    /// `log_writes_in_flight` groups are in flight. Returns once the write is issued
    /// (with one in flight: once the group has retired).
    pub(crate) fn issue(&self, group: Group, bytes: Vec<u8>) {
        let ticket = {
            let mut st = lock(&self.order.state);
            while st.in_flight >= self.order.capacity {
                st = self.order.wait_retired(st);
            }
            st.in_flight += 1;
            st.next_ticket += 1;
            st.next_ticket - 1
        };
        // With I/O threads every group goes to them, a FLUSH too: whoever retires a
        // group that asked for durability waits for its fdatasync, and the writer
        // goes on taking groups meanwhile.
        match &self.jobs {
            Some(jobs) => {
                if let Err(std::sync::mpsc::SendError((ticket, bytes, group))) =
                    jobs.send((ticket, bytes, group))
                {
                    // Every I/O thread is gone (none panics by design): write here.
                    self.order.land(ticket, bytes, group);
                }
            }
            None => self.order.land(ticket, bytes, group),
        }
    }

    /// Wait until every issued group has retired.
    pub(crate) fn drain(&self) {
        let mut st = lock(&self.order.state);
        while st.in_flight > 0 {
            st = self.order.wait_retired(st);
        }
    }
}

impl Drop for LogWrites {
    fn drop(&mut self) {
        self.drain();
        self.jobs = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn io_thread(order: &LogOrder, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = lock(jobs).recv();
        let Ok((ticket, bytes, group)) = job else {
            return;
        };
        order.land(ticket, bytes, group);
    }
}

impl LogOrder {
    /// Wait until a group retires.
    fn wait_retired<'a>(&self, mut st: MutexGuard<'a, OrderState>) -> MutexGuard<'a, OrderState> {
        st.waiting += 1;
        let mut st = self.retired.wait(st).unwrap_or_else(|p| p.into_inner());
        st.waiting -= 1;
        st
    }

    /// Write the group's record (if any), then retire every group that can retire.
    fn land(&self, ticket: u64, bytes: Vec<u8>, mut group: Group) {
        if let (None, Some(r)) = (&group.error, &group.record) {
            let shared = &self.shared;
            if let Err(e) = shared.cache.write_at(&bytes, r.offset) {
                let e = Error::local_io("write-log write failed", e);
                shared.fail(&e.to_string());
                group.error = Some(e);
            }
        }
        let mut st = lock(&self.state);
        st.landed.insert(ticket, (group, bytes));
        if st.retiring {
            // The thread retiring now will find it.
            return;
        }
        st.retiring = true;
        loop {
            let next = st.next_retire;
            let Some((group, bytes)) = st.landed.remove(&next) else {
                st.retiring = false;
                return;
            };
            st.next_retire += 1;
            drop(st);
            self.retire(group, bytes);
            st = lock(&self.state);
            st.in_flight -= 1;
            if st.waiting > 0 {
                self.retired.notify_all();
            }
        }
    }

    /// Every earlier group has retired: apply the record (and keep its `bytes` for
    /// the upload, `crate::write::recent_records`), sync if asked, answer.
    fn retire(&self, group: Group, bytes: Vec<u8>) {
        let shared = &*self.shared;
        let mut rs = lock(&self.retire);
        let mut result = match group.error {
            Some(e) => Err(e),
            // An earlier record failed: this one lies after a hole in the log.
            None if shared.is_failed() => Err(shared.failed_error()),
            None => Ok(()),
        };
        if result.is_ok() {
            if let Some(r) = group.record {
                shared.stats.log_records.fetch_add(1, Ordering::Relaxed);
                shared
                    .stats
                    .log_write_bytes
                    .fetch_add(r.total_bytes, Ordering::Relaxed);
                shared
                    .stats
                    .client_write_bytes
                    .fetch_add(r.data_bytes, Ordering::Relaxed);
                let now_ns = shared.now_ns();
                // The record and all before it are in the log: chain the next one to
                // it, list it for the write-log index (written after a sync), and
                // make its data readable.
                let mut st = shared.lock();
                st.last_record_crc = r.header.crc;
                st.log_bytes_since_index += r.total_bytes;
                let h = &r.header;
                apply_record(&mut st, now_ns, r.seq, r.offset, h.header_bytes, &h.extents);
                st.log_headers.push_back((r.offset, r.header));
                st.recent_records.push(r.seq, Bytes::from(bytes));
                drop(st);
                rs.dirty = true;
                rs.landed_through = r.seq;
            }
            if group.need_sync && rs.dirty {
                result = sync(shared, &mut rs);
            }
            // Answer only while the lease holds: another process may have claimed
            // the volume (`crate::fencing::lease`).
            if result.is_ok() {
                result = shared.lease_wait_blocking();
            }
        }
        drop(rs);
        for done in group.replies {
            done.send(result.clone());
        }
    }
}

/// `fdatasync` the log: every retired record (and so every earlier one) is durable.
fn sync(shared: &Shared, rs: &mut RetireState) -> Result<()> {
    if let Err(e) = shared.cache.sync() {
        // After a failed fdatasync the page cache state is unknown: stop.
        let e = Error::local_io("write-log fdatasync failed", e);
        shared.fail(&e.to_string());
        return Err(e);
    }
    rs.dirty = false;
    {
        // Records after `landed_through` may be in flight: they are not synced.
        let mut st = shared.lock();
        st.log_synced_through = st.log_synced_through.max(rs.landed_through);
    }
    shared.stats.log_syncs.fetch_add(1, Ordering::Relaxed);
    crate::write::log_index::maybe_write(shared);
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
                if let Some(heat) = &mut st.heat {
                    heat.record_write(e.lba, sectors);
                }
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
