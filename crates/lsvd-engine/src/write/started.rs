//! Writes appended by the thread that reads them from the client (flat combining).
//!
//! Why: at 4 KiB and a deep queue, handing each group of writes from the NBD
//! connection's thread to the log writer thread and the answers back cost as much as
//! the log write itself: two wake-ups of an idle thread per group commit (tens of µs
//! each on a VM), and the threads waiting on each other. The NBD server instead *starts*
//! requests ([`crate::Volume::start_write`] and kin) as it reads them, then
//! *unplugs* once it has read every request that arrived ([`LogWriter::unplug`]).
//! Unplugging appends the started operations on the calling thread, as the log writer
//! thread would (same groups, same records, same order), and their answers go straight
//! to the connection's reply queue.
//!
//! One appender at a time: the [`Appender`] (the log writes in flight and the CRC chain)
//! is behind a mutex. Whoever holds it appends the queue from its head; whoever finds it
//! taken leaves its operations queued, and the holder looks at the queue again after it
//! lets go, so nothing is stranded. Operations are appended in the order they were
//! started, by whichever thread: a FLUSH covers every write answered before it.
//!
//! What blocks (an `fdatasync` for a FLUSH or FUA at the head of the queue, waiting for
//! log space or freeing it) a worker of a multi-thread runtime does itself, inside
//! `tokio::task::block_in_place`, which hands the worker's other tasks to another
//! thread meanwhile: at QD1, write + FLUSH pairs went from 4.38k to 4.68k a second
//! (medians of 12 runs of 8 s, same build with and without), the wake-up of the writer
//! thread being off the FLUSH's path. A thread that serves one NBD connection alone
//! (`lsvd_nbd::on_connection_thread`, see [`Blocking::Here`]) blocks without
//! `block_in_place`, whose hand-off of the worker's core to another thread was itself
//! a large part of a QD1 write + FLUSH. Any other thread (outside a runtime, or on a
//! current-thread runtime, where `block_in_place` would panic) leaves it to the log
//! writer thread, which is woken for it ([`LogOp::Kick`]), as is everything when more
//! than one log write may be in flight (`--log-writes-in-flight`, whose bound is a
//! blocking wait). The thread appends the queue before every operation of its own, so
//! a shutdown finds it empty. Its body is [`run`]; the group commit itself is
//! `crate::write::writer`'s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::shared::Shared;
use crate::write::writer::{self, Appender, LogOp};
use lsvd_core::error::{Error, ErrorKind};

struct Queue {
    /// Bounded by what the NBD server lets its connections have in flight (requests
    /// and payload bytes per connection, `lsvd_nbd::Limits`): each started operation
    /// holds one of those until it is answered.
    ops: VecDeque<LogOp>,
    /// The writer is stopping: operations started now are refused.
    closed: bool,
}

/// The started operations and the appender, shared by the NBD server's threads and the
/// log writer thread.
pub(crate) struct LogWriter {
    queue: Mutex<Queue>,
    appender: Mutex<Appender>,
    /// Wakes the log writer thread (a [`LogOp::Kick`]). Weak: the thread ends when the
    /// volume's own sender is dropped, as it always did.
    kick: tokio::sync::mpsc::WeakSender<LogOp>,
    /// Runtime threads may append (one log write in flight: the write is done inline).
    inline: bool,
    /// Most data bytes in one record.
    pub(crate) max_record_data_bytes: u64,
}

/// May the thread that unplugs block (an `fdatasync`, a wait for log space)?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    /// Inside `tokio::task::block_in_place` on a worker of a multi-thread runtime;
    /// never on any other thread, which leaves the wait to the log writer thread.
    InPlace,
    /// Right here: the thread has nothing else to run meanwhile (it serves one NBD
    /// connection, whose requests wait for this anyway).
    Here,
}

/// Whether the queue was appended up to its end, or the rest was left to the thread.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ran {
    Emptied,
    HandedOff,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LogWriter {
    pub(crate) fn new(
        shared: &Shared,
        appender: Appender,
        kick: tokio::sync::mpsc::WeakSender<LogOp>,
    ) -> Self {
        LogWriter {
            queue: Mutex::new(Queue {
                ops: VecDeque::new(),
                closed: false,
            }),
            appender: Mutex::new(appender),
            kick,
            inline: shared.config.log_writes_in_flight <= 1,
            max_record_data_bytes: shared
                .config
                .group_commit_max_bytes
                .min(shared.config.batch_size_bytes)
                .max(1),
        }
    }

    /// Queue `op` (a write, zero or flush) until the next [`LogWriter::unplug`].
    pub(crate) fn start(&self, op: LogOp) {
        let mut q = lock(&self.queue);
        if q.closed {
            drop(q);
            writer::reply(op, Err(closing()));
            return;
        }
        q.ops.push_back(op);
    }

    /// Append what was started, on this thread where it may (`blocking`), or see that
    /// it will be.
    pub(crate) fn unplug(&self, shared: &Shared, blocking: Blocking) {
        loop {
            let mut appender = match self.appender.try_lock() {
                Ok(a) => a,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                // The holder looks at the queue again once it lets go.
                Err(TryLockError::WouldBlock) => return,
            };
            let mut ran = if self.inline {
                self.append_started(shared, &mut appender, true)
            } else {
                Ran::HandedOff
            };
            if ran == Ran::HandedOff && self.inline {
                // A sync or a full log at the head: blocking here, the FLUSH is
                // answered without waking the writer thread first.
                if blocking == Blocking::Here {
                    ran = self.append_started(shared, &mut appender, false);
                } else if may_block_in_place() {
                    ran = tokio::task::block_in_place(|| {
                        self.append_started(shared, &mut appender, false)
                    });
                }
            }
            drop(appender);
            if ran == Ran::HandedOff {
                shared.stats.log_handoffs.fetch_add(1, Ordering::Relaxed);
                self.wake_thread();
                return;
            }
            if lock(&self.queue).ops.is_empty() {
                return;
            }
        }
    }

    /// The log writer thread's turn: append everything started, syncs included.
    pub(crate) fn lock_appender(&self) -> MutexGuard<'_, Appender> {
        lock(&self.appender)
    }

    /// Is anything started and not appended yet?
    pub(crate) fn has_started(&self) -> bool {
        !lock(&self.queue).ops.is_empty()
    }

    /// Refuse operations started from now on; those queued are still appended.
    pub(crate) fn close(&self) {
        lock(&self.queue).closed = true;
    }

    /// Answer whatever is still queued with `closing` (the writer has stopped).
    pub(crate) fn refuse_started(&self) {
        let ops: Vec<LogOp> = {
            let mut q = lock(&self.queue);
            q.closed = true;
            q.ops.drain(..).collect()
        };
        for op in ops {
            writer::reply(op, Err(closing()));
        }
    }

    fn wake_thread(&self) {
        use tokio::sync::mpsc::error::TrySendError;
        let Some(kick) = self.kick.upgrade() else {
            // The volume is gone, and its writer with it.
            self.refuse_started();
            return;
        };
        match kick.try_send(LogOp::Kick) {
            // A full channel: the thread has messages to take, and appends the queue
            // before each of them.
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Closed(_)) => self.refuse_started(),
        }
    }

    /// Append started operations from the head of the queue, a group commit at a time,
    /// with `appender` held. `inline` (a runtime thread): stop at an operation that
    /// needs an `fdatasync`, or at a group that finds no log space without waiting,
    /// and leave the rest to the log writer thread.
    pub(crate) fn append_started(
        &self,
        shared: &Shared,
        appender: &mut Appender,
        inline: bool,
    ) -> Ran {
        loop {
            let ops = {
                let mut q = lock(&self.queue);
                if q.ops.is_empty() {
                    return Ran::Emptied;
                }
                let mut ops = Vec::new();
                let mut bytes = 0u64;
                while let Some(op) = q.ops.front() {
                    if inline && writer::needs_sync(op) {
                        break;
                    }
                    let more = writer::op_bytes(op);
                    if !writer::group_has_room(ops.len(), bytes, more, self.max_record_data_bytes) {
                        break;
                    }
                    bytes += more;
                    ops.extend(q.ops.pop_front());
                }
                if ops.is_empty() {
                    // A sync at the head, on a runtime thread.
                    return Ran::HandedOff;
                }
                ops
            };
            if let Err(ops) = writer::process_group(shared, appender, ops, !inline) {
                // No log space without waiting: back to the head, for the thread.
                let mut q = lock(&self.queue);
                for op in ops.into_iter().rev() {
                    q.ops.push_front(op);
                }
                return Ran::HandedOff;
            }
        }
    }
}

/// May this thread block (an `fdatasync`) through `tokio::task::block_in_place`? Yes
/// on a worker of a multi-thread runtime, which hands its other tasks to another
/// thread meanwhile; not on a current-thread runtime (where it would panic) or
/// outside any runtime.
fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

fn closing() -> Error {
    Error::new(ErrorKind::ShuttingDown, "volume is shutting down")
}

/// The writer thread's body. `runtime` is entered so that the clock reads the same time
/// as the runtime's tasks (tokio's clock, paused in some tests).
///
/// It takes the operations of the async API from `rx`, and appends what the NBD
/// server started whenever it is woken: before each of its own
/// operations, and again after, for what was started while it held the appender.
pub(crate) fn run(
    shared: Arc<Shared>,
    writer: Arc<LogWriter>,
    mut rx: tokio::sync::mpsc::Receiver<LogOp>,
    runtime: tokio::runtime::Handle,
) {
    let _runtime = runtime.enter();
    // A record carries at most a batch of data (unless one write is larger), so that
    // objects stay within the batch size (`Batcher::would_overflow`).
    let max_bytes = writer.max_record_data_bytes;
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
        let mut appender = writer.lock_appender();
        // What was started before this operation goes first.
        writer.append_started(&shared, &mut appender, false);
        let shutdown = match first {
            LogOp::Kick => false,
            LogOp::Resize {
                new_size_bytes,
                done,
            } => {
                let _ = done.send(writer::resize_in_log_order(
                    &shared,
                    &appender.writes,
                    new_size_bytes,
                ));
                false
            }
            first => {
                let mut ops = vec![first];
                let mut bytes = writer::op_bytes(&ops[0]);
                loop {
                    match rx.try_recv() {
                        Ok(LogOp::Kick) => {}
                        Ok(op @ LogOp::Resize { .. }) => {
                            carried = Some(op);
                            break;
                        }
                        Ok(op) => {
                            let more = writer::op_bytes(&op);
                            if !writer::group_has_room(ops.len(), bytes, more, max_bytes) {
                                carried = Some(op);
                                break;
                            }
                            bytes += more;
                            ops.push(op);
                        }
                        Err(_) => break,
                    }
                }
                if ops.iter().any(|op| matches!(op, LogOp::Shutdown { .. })) {
                    // Nothing may be started after the shutdown; what was, goes first.
                    writer.close();
                    writer.append_started(&shared, &mut appender, false);
                }
                match writer::process_group(&shared, &mut appender, ops, true) {
                    Ok(shutdown) => shutdown,
                    // Only a runtime thread's group is handed back.
                    Err(ops) => {
                        for op in ops {
                            writer::reply(op, Err(shared.failed_error()));
                        }
                        false
                    }
                }
            }
        };
        drop(appender);
        if shutdown {
            break;
        }
        // Started while this thread held the appender: whoever started it found the
        // appender taken and left it here.
        while writer.has_started() {
            let mut appender = writer.lock_appender();
            writer.append_started(&shared, &mut appender, false);
        }
    }
    // Fail anything still queued.
    writer.refuse_started();
    rx.close();
    let closing = || Err(closing());
    if let Some(op) = carried {
        writer::reply(op, closing());
    }
    while let Ok(op) = rx.try_recv() {
        writer::reply(op, closing());
    }
}
