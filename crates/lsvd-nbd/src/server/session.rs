//! The transmission phase of one connection.
//!
//! A reader loop parses requests and spawns one task per command, so many requests are
//! in flight and replies go out in completion order. A single writer task owns the write
//! half and drains a bounded reply queue. Bounds: a semaphore caps requests in flight, a
//! second one caps READ/WRITE payload bytes held (released only once a read's data has
//! been handed to the socket), and the reply queue is bounded.
//!
//! The session ends on NBD_CMD_DISC, EOF or shutdown — then in-flight requests finish and
//! their replies are written before the stream is closed — or on a protocol violation
//! (bad magic, absurd WRITE length), which drops the connection at once.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::negotiate::ALLOCATION_CONTEXT_ID;
use super::reply::{Completion, Reply, StartOp, error_reply, read_reply, result_reply};
use super::request::{ExportParams, Op, validate};
use super::{Limits, MAX_PAYLOAD_BYTES, shutdown_requested};
use crate::proto::consts::*;
use crate::proto::transmission::*;
use crate::{AllocationExtent, BlockDevice, STATE_HOLE, STATE_ZERO};

/// Why the reader stopped.
enum End {
    /// Graceful: finish in-flight requests, write their replies, close.
    Drain,
    /// EOF without NBD_CMD_DISC while this many requests were still unanswered: drain
    /// like [`End::Drain`] (the requests run to completion), then report the hang-up.
    HungUp(usize),
    /// The writer is gone (client stopped reading or hung up).
    WriterGone,
    /// Protocol violation or read error: drop the connection now.
    Abort(io::Error),
}

/// Bytes the reader takes from the socket per read syscall. Payloads larger than this
/// (and arriving with the buffer empty) are read straight into their own buffer.
const READ_BUFFER_BYTES: usize = 256 << 10;

/// Read a WRITE's payload of `len` bytes into a buffer that is not zeroed first (the
/// read fills it; zeroing 4 KiB per write was a measurable share of a write's cost).
async fn read_payload<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *reader).take(want).read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

/// Poll `reader` for input for up to `budget`, yielding to the connection's other
/// tasks (the reply writer, reads) between polls; returns once input (or EOF, or an
/// error, left for the caller's read to see) is there, or the budget is spent. Each
/// yield lets the runtime poll its reactor without sleeping, which is how new input
/// is noticed.
async fn poll_for_input<R: AsyncBufRead + Unpin>(reader: &mut R, budget: Duration) {
    let start = Instant::now();
    loop {
        let ready = std::future::poll_fn(|cx| match Pin::new(&mut *reader).poll_fill_buf(cx) {
            Poll::Ready(_) => Poll::Ready(true),
            Poll::Pending => Poll::Ready(false),
        })
        .await;
        if ready || start.elapsed() >= budget {
            return;
        }
        tokio::task::yield_now().await;
    }
}

pub(crate) async fn run<D, S>(
    device: Arc<D>,
    params: ExportParams,
    stream: S,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
    busy_poll: Duration,
) -> io::Result<()>
where
    D: BlockDevice,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (reader, writer) = tokio::io::split(stream);
    // Clients keep many requests in flight: one read syscall picks up every request
    // header (and small payload) that has arrived, instead of two syscalls per request.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let (tx, rx) = mpsc::channel(limits.reply_queue);
    let mut writer = tokio::spawn(write_replies(rx, writer));
    let conn = Conn {
        device,
        params,
        tx,
        ops: Arc::new(Semaphore::new(limits.max_in_flight)),
        budget: Arc::new(Semaphore::new(limits.max_in_flight_bytes)),
        max_in_flight: limits.max_in_flight,
        started: AtomicBool::new(false),
        busy_poll,
    };
    let end = conn.read_requests(&mut reader, &mut shutdown).await;
    // Whatever ended the reader, what it started must run.
    conn.unplug();
    // Tasks still running hold clones of the sender; the writer ends after the last one.
    drop(conn);
    match end {
        End::Abort(e) => {
            writer.abort();
            Err(e)
        }
        End::Drain | End::WriterGone | End::HungUp(_) => {
            let grace = limits.shutdown_grace;
            let drained = tokio::select! {
                joined = &mut writer => joined.unwrap_or_else(|e| Err(io::Error::other(e))),
                () = async {
                    shutdown_requested(&mut shutdown).await;
                    tokio::time::sleep(grace).await;
                } => {
                    writer.abort();
                    Err(io::Error::new(io::ErrorKind::TimedOut, "in-flight requests outlived the shutdown grace"))
                }
            };
            match end {
                End::HungUp(unanswered) => Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "client hung up without NBD_CMD_DISC with {unanswered} requests unanswered \
                         (they ran to completion)"
                    ),
                )),
                _ => drained,
            }
        }
    }
}

struct Conn<D> {
    device: Arc<D>,
    params: ExportParams,
    tx: mpsc::Sender<Reply>,
    ops: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    max_in_flight: usize,
    /// Requests were handed to the device with `start` since its last `unplug`.
    started: AtomicBool,
    /// How long the reader polls for the next request before it sleeps (zero: never;
    /// `Server::with_busy_poll`, connection threads only).
    busy_poll: Duration,
}

impl<D: BlockDevice> Conn<D> {
    /// Before the reader may wait (for the socket, a permit, room for a reply): tell
    /// the device to run what it was handed, since a device that queues started
    /// requests may wait for this, and the requests may be what the reader waits for.
    fn unplug(&self) {
        if self.started.swap(false, Ordering::Relaxed) {
            self.device.unplug();
        }
    }

    /// Why the reader must stop before taking another request, if it must: the same
    /// checks, in the same order, as the `select!`s below, without registering wakers.
    fn stopping(&self, shutdown: &watch::Receiver<bool>) -> Option<End> {
        if *shutdown.borrow() {
            Some(End::Drain)
        } else if self.tx.is_closed() {
            Some(End::WriterGone)
        } else {
            None
        }
    }

    /// The fast paths (a header or payload already in the read buffer, a permit free)
    /// skip the `select!`s: building and dropping their futures registers and removes
    /// wakers on the shutdown and reply channels, a measurable share of a small request.
    async fn read_requests<R: AsyncRead + Unpin>(
        &self,
        reader: &mut BufReader<R>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> End {
        // How long the last wait for a request took: polling pays only while the
        // client sends quickly. A wait that slept includes the wake-up itself, so a
        // wait of up to twice the polling time still counts as quick.
        let mut last_wait = Duration::ZERO;
        loop {
            let mut buf = [0u8; REQUEST_HEADER_LEN];
            if let Some(end) = self.stopping(shutdown) {
                return end;
            }
            if let Some(header) = reader.buffer().get(..REQUEST_HEADER_LEN) {
                buf.copy_from_slice(header);
                Pin::new(&mut *reader).consume(REQUEST_HEADER_LEN);
            } else {
                self.unplug();
                let waiting_since = Instant::now();
                if !self.busy_poll.is_zero() && last_wait <= 2 * self.busy_poll {
                    poll_for_input(reader, self.busy_poll).await;
                }
                tokio::select! {
                biased;
                () = shutdown_requested(shutdown) => return End::Drain,
                () = self.tx.closed() => return End::WriterGone,
                read = reader.read_exact(&mut buf) => match read {
                    Ok(_) => last_wait = waiting_since.elapsed(),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        let unanswered =
                            self.max_in_flight.saturating_sub(self.ops.available_permits());
                        return if unanswered == 0 { End::Drain } else { End::HungUp(unanswered) };
                    }
                    Err(e) => return End::Abort(e),
                },
                }
            }
            let hdr = match parse_request_header(&buf) {
                Ok(hdr) => hdr,
                Err(e) => return End::Abort(e.into()),
            };
            if hdr.command == Command::Disc {
                return End::Drain;
            }

            // A WRITE's payload must be consumed even if the request is then refused.
            let mut payload = Vec::new();
            let mut budget = None;
            if hdr.command == Command::Write {
                if hdr.length as usize > MAX_PAYLOAD_BYTES {
                    return End::Abort(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "NBD write payload too large",
                    ));
                }
                let Some(permit) = self.take_budget(hdr.length, shutdown).await else {
                    return End::Drain;
                };
                budget = Some(permit);
                let len = hdr.length as usize;
                if let Some(data) = reader.buffer().get(..len) {
                    payload = data.to_vec();
                    Pin::new(&mut *reader).consume(len);
                } else {
                    self.unplug();
                    tokio::select! {
                        biased;
                        // Stuck mid-payload at shutdown: the request is lost, the stream unusable.
                        () = shutdown_requested(shutdown) => return End::Drain,
                        read = read_payload(reader, hdr.length as usize) => match read {
                            Ok(p) => payload = p,
                            Err(e) => return End::Abort(io::Error::new(
                                e.kind(),
                                format!(
                                    "WRITE of {} bytes at {} cut short, not executed: {e}",
                                    hdr.length, hdr.offset
                                ),
                            )),
                        },
                    }
                }
            }

            let op = match validate(&hdr, &self.params) {
                Ok(op) => op,
                Err(rejection) => {
                    let reply = error_reply(
                        hdr.cookie,
                        self.params.structured,
                        rejection.error,
                        rejection.message,
                    );
                    self.unplug();
                    if self.tx.send(reply).await.is_err() {
                        return End::WriterGone;
                    }
                    continue;
                }
            };
            if let Op::Read { length, .. } = op {
                let Some(permit) = self.take_budget(length, shutdown).await else {
                    return End::Drain;
                };
                budget = Some(permit);
            }
            if *shutdown.borrow() {
                return End::Drain;
            }
            let in_flight = match Arc::clone(&self.ops).try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    self.unplug();
                    tokio::select! {
                    biased;
                    () = shutdown_requested(shutdown) => return End::Drain,
                    permit = Arc::clone(&self.ops).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return End::WriterGone,
                    },
                    }
                }
            };
            let structured = self.params.structured;
            // Writes, flushes and trims the device takes with a completion need no task.
            let (op, payload, budget, in_flight) = match startable(op, payload) {
                Ok(start) => {
                    let done =
                        Completion::new(hdr.cookie, structured, self.tx.clone(), budget, in_flight);
                    match self.device.start(start, done) {
                        Ok(()) => {
                            self.started.store(true, Ordering::Relaxed);
                            continue;
                        }
                        Err((start, done)) => {
                            let (op, payload) = unstart(start);
                            let (budget, in_flight) = done.into_permits();
                            (op, payload, budget, in_flight)
                        }
                    }
                }
                Err((op, payload)) => (op, payload, budget, in_flight),
            };
            let device = Arc::clone(&self.device);
            let tx = self.tx.clone();
            let size = self.params.size;
            tokio::spawn(async move {
                let mut reply = execute(&*device, op, hdr.cookie, structured, size, payload).await;
                reply.budget = budget;
                // If the writer is gone the client is too; nothing to do with the reply.
                let _ = tx.send(reply).await;
                drop(in_flight);
            });
        }
    }

    /// Reserves `length` bytes of payload budget; `None` if shutdown came first.
    async fn take_budget(
        &self,
        length: u32,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<OwnedSemaphorePermit> {
        if *shutdown.borrow() {
            return None;
        }
        if let Ok(permit) = Arc::clone(&self.budget).try_acquire_many_owned(length) {
            return Some(permit);
        }
        self.unplug();
        tokio::select! {
            biased;
            () = shutdown_requested(shutdown) => None,
            permit = Arc::clone(&self.budget).acquire_many_owned(length) => permit.ok(),
        }
    }
}

/// Runs one validated request against the device and builds its reply.
async fn execute<D: BlockDevice>(
    device: &D,
    op: Op,
    cookie: u64,
    structured: bool,
    size: u64,
    payload: Vec<u8>,
) -> Reply {
    let result = match op {
        Op::Read { offset, length } => {
            return match device.read(offset, length).await {
                Ok(data) if data.len() == length as usize => {
                    read_reply(cookie, structured, offset, data)
                }
                Ok(_) => error_reply(cookie, structured, EIO, "device returned a short read"),
                Err(e) => error_reply(cookie, structured, error_code(&e), &e.to_string()),
            };
        }
        Op::BlockStatus {
            offset,
            length,
            req_one,
        } => {
            return match device.block_status(offset, length).await {
                Ok(extents) => {
                    match clamp_extents(extents, length, req_one, size.saturating_sub(offset)) {
                        Some(extents) => {
                            let mut header = Vec::with_capacity(24 + 8 * extents.len());
                            encode_block_status_chunk(
                                &mut header,
                                cookie,
                                ALLOCATION_CONTEXT_ID,
                                &extents,
                                true,
                            );
                            Reply {
                                header,
                                data: Vec::new(),
                                budget: None,
                            }
                        }
                        None => error_reply(cookie, structured, EIO, "device returned no extents"),
                    }
                }
                Err(e) => error_reply(cookie, structured, error_code(&e), &e.to_string()),
            };
        }
        Op::Write { offset, fua } => {
            if payload.is_empty() {
                Ok(())
            } else {
                device.write(offset, payload, fua).await
            }
        }
        Op::Flush => device.flush().await,
        Op::Trim { length: 0, .. }
        | Op::Cache { length: 0, .. }
        | Op::WriteZeroes { length: 0, .. } => Ok(()),
        Op::Trim {
            offset,
            length,
            fua,
        } => device.trim(offset, length, fua).await,
        Op::Cache { offset, length } => device.cache(offset, length).await,
        Op::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
        } => device.write_zeroes(offset, length, fua, no_hole).await,
    };
    result_reply(cookie, structured, &result)
}

/// The request as a [`StartOp`], if it is one a device may take with a completion
/// (no reply data, a non-empty range); otherwise it is handed back.
fn startable(op: Op, payload: Vec<u8>) -> Result<StartOp, (Op, Vec<u8>)> {
    match op {
        Op::Write { offset, fua } if !payload.is_empty() => Ok(StartOp::Write {
            offset,
            data: payload,
            fua,
        }),
        Op::Flush => Ok(StartOp::Flush),
        Op::Trim {
            offset,
            length,
            fua,
        } if length > 0 => Ok(StartOp::Trim {
            offset,
            length,
            fua,
        }),
        Op::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
        } if length > 0 => Ok(StartOp::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
        }),
        op => Err((op, payload)),
    }
}

/// A [`StartOp`] the device declined, back as the request it was.
fn unstart(start: StartOp) -> (Op, Vec<u8>) {
    match start {
        StartOp::Write { offset, data, fua } => (Op::Write { offset, fua }, data),
        StartOp::Flush => (Op::Flush, Vec::new()),
        StartOp::Trim {
            offset,
            length,
            fua,
        } => (
            Op::Trim {
                offset,
                length,
                fua,
            },
            Vec::new(),
        ),
        StartOp::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
        } => (
            Op::WriteZeroes {
                offset,
                length,
                fua,
                no_hole,
            },
            Vec::new(),
        ),
    }
}

/// Makes a device's extent list valid for the wire: no empty extents, known flag bits
/// only, no more extents than needed to cover `length`, nothing past `length` (nor past
/// `to_end`, the distance to the export end), exactly one extent for REQ_ONE.
fn clamp_extents(
    extents: Vec<AllocationExtent>,
    length: u32,
    req_one: bool,
    to_end: u64,
) -> Option<Vec<AllocationExtent>> {
    let limit = u64::from(length).min(to_end);
    let max_count = if req_one { 1 } else { MAX_BLOCK_STATUS_EXTENTS };
    let mut out = Vec::with_capacity(extents.len().min(max_count));
    let mut covered = 0u64;
    for e in extents {
        if covered >= limit || out.len() >= max_count {
            break;
        }
        if e.length_bytes == 0 {
            continue;
        }
        let len = u64::from(e.length_bytes).min(limit - covered);
        covered += len;
        out.push(AllocationExtent {
            length_bytes: len as u32,
            flags: e.flags & (STATE_HOLE | STATE_ZERO),
        });
    }
    if out.is_empty() { None } else { Some(out) }
}

/// The writer task: writes replies in queue order into a buffer and hands the buffer to
/// the socket only when no more replies are ready, so that bursts of small replies share
/// one syscall. When the queue looks empty it first yields once: the tasks whose
/// completions arrived together (one group commit answers many writes) then queue their
/// replies before the flush, instead of each reply costing its own `send`.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Reply>,
    writer: W,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(64 << 10, writer);
    let mut next = rx.recv().await;
    while let Some(reply) = next {
        w.write_all(&reply.header).await?;
        w.write_all(&reply.data).await?;
        drop(reply);
        next = match rx.try_recv() {
            Ok(reply) => Some(reply),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => {
                tokio::task::yield_now().await;
                match rx.try_recv() {
                    Ok(reply) => Some(reply),
                    Err(TryRecvError::Disconnected) => None,
                    Err(TryRecvError::Empty) => {
                        w.flush().await?;
                        rx.recv().await
                    }
                }
            }
        };
    }
    w.flush().await?;
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(length_bytes: u32, flags: u32) -> AllocationExtent {
        AllocationExtent {
            length_bytes,
            flags,
        }
    }

    #[test]
    fn extents_are_clamped() {
        assert_eq!(clamp_extents(vec![], 10, false, 100), None);
        assert_eq!(clamp_extents(vec![ext(0, 1)], 10, false, 100), None);
        assert_eq!(
            clamp_extents(
                vec![ext(4, 1), ext(0, 0), ext(100, 0xff), ext(5, 2)],
                10,
                false,
                100
            ),
            Some(vec![ext(4, 1), ext(6, 3)])
        );
        assert_eq!(
            clamp_extents(vec![ext(4, 1), ext(4, 0)], 10, true, 100),
            Some(vec![ext(4, 1)])
        );
        assert_eq!(
            clamp_extents(vec![ext(40, 1)], 10, true, 100),
            Some(vec![ext(10, 1)])
        );
        assert_eq!(
            clamp_extents(vec![ext(40, 1)], 10, false, 3),
            Some(vec![ext(3, 1)])
        );
    }
}
