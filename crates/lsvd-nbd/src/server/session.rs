//! The transmission phase of one connection.
//!
//! A reader loop parses requests and spawns one task per command, so many requests are
//! in flight and replies go out in completion order; requests the device takes without
//! a task (`BlockDevice::start` for writes, `BlockDevice::read_now` for reads it
//! answers at once) skip the task and its allocation. A single writer task owns the write
//! half and drains a bounded reply queue. Bounds: a semaphore caps requests in flight, a
//! second one caps READ/WRITE payload and BLOCK_STATUS reply bytes held (released only
//! once a read's data has been handed to the socket), a third, the server's, caps the
//! same bytes over every connection, and the reply queue is bounded. A refused WRITE's
//! payload is skipped through the read buffer, never held.
//!
//! The session ends on NBD_CMD_DISC, EOF or shutdown — then in-flight requests finish and
//! their replies are written before the stream is closed — or on a protocol violation
//! (bad magic, absurd WRITE length) or the idle timeout, which drop the connection at
//! once.

// The handshake, idle and drain deadlines guard real sockets against real clients, on
// tokio's clock (tests pause it); this crate imports nothing of lsvd's clock yet.
#![expect(
    clippy::disallowed_methods,
    reason = "deadlines of real sockets, on tokio's clock"
)]

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Sleep;

use super::deadline::within;
use super::reply::{
    Budget, Completion, Header, Reply, StartOp, Timing, error_reply, read_reply, result_reply,
};
use super::request::{ExportParams, MetaContexts, Op, Rejection, validate};
use super::{
    ConnectionStats, Limits, MAX_DISCARDED_PAYLOAD_BYTES, MAX_REPLY_EXTENTS, NoticeLimiter,
    Notices, shutdown_requested,
};
use crate::proto::consts::*;
use crate::proto::transmission::*;
use crate::{AllocationExtent, BlockDevice, STATE_HOLE, STATE_ZERO, ZeroRequest};

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

/// Read and drop `len` bytes of a refused WRITE's payload, through the read buffer.
async fn discard<R: AsyncBufRead + Unpin>(reader: &mut R, mut len: usize) -> io::Result<()> {
    while len > 0 {
        let available = reader.fill_buf().await?.len();
        if available == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = available.min(len);
        Pin::new(&mut *reader).consume(n);
        len -= n;
    }
    Ok(())
}

/// The name of `command` in log lines.
fn command_name(command: Command) -> String {
    match command {
        Command::Read => "READ".into(),
        Command::Write => "WRITE".into(),
        Command::Disc => "DISC".into(),
        Command::Flush => "FLUSH".into(),
        Command::Trim => "TRIM".into(),
        Command::Cache => "CACHE".into(),
        Command::WriteZeroes => "WRITE_ZEROES".into(),
        Command::BlockStatus => "BLOCK_STATUS".into(),
        Command::Unknown(n) => format!("command {n}"),
    }
}

fn errno_name(error: u32) -> &'static str {
    match error {
        EPERM => "EPERM",
        EIO => "EIO",
        ENOMEM => "ENOMEM",
        EINVAL => "EINVAL",
        ENOSPC => "ENOSPC",
        EOVERFLOW => "EOVERFLOW",
        ENOTSUP => "ENOTSUP",
        ESHUTDOWN => "ESHUTDOWN",
        _ => "an error",
    }
}

/// Bytes of a BLOCK_STATUS reply to `length` bytes of an export with blocks of
/// `minimum_bytes`, for `contexts` selected contexts: per context one 8-byte descriptor
/// per block at most, [`MAX_REPLY_EXTENTS`] at most, plus the chunk header and context
/// id. Reserved from the payload budget.
fn block_status_reply_bytes(
    length: u32,
    minimum_bytes: u32,
    req_one: bool,
    contexts: usize,
) -> u32 {
    let extents = if req_one {
        1
    } else {
        (length.div_ceil(minimum_bytes.max(1)) as usize).clamp(1, MAX_REPLY_EXTENTS)
    };
    // At most 1 + MAX_SELECTED_CONTEXTS contexts of 512 KiB each: far from overflowing.
    ((CHUNK_HEADER_LEN + 4 + 8 * extents) * contexts.max(1)) as u32
}

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

/// What a session needs from its server besides the device and the stream.
pub(crate) struct Context {
    pub limits: Limits,
    /// How long the reader polls for the next request before it sleeps (zero: never;
    /// `Server::with_busy_poll`, connection threads only).
    pub busy_poll: Duration,
    pub stats: Arc<ConnectionStats>,
    /// The export's request counts and latencies.
    pub requests: Arc<super::request_stats::RequestStats>,
    /// `Limits::max_server_in_flight_bytes`, shared by the server's connections.
    pub server_budget: Arc<Semaphore>,
    pub notices: Option<Notices>,
    /// Who the client is, for log lines.
    pub peer: String,
}

pub(crate) async fn run<D, S>(
    device: Arc<D>,
    params: ExportParams,
    stream: S,
    mut shutdown: watch::Receiver<bool>,
    context: Context,
) -> io::Result<()>
where
    D: BlockDevice,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = context.limits;
    let (reader, writer) = tokio::io::split(stream);
    // Clients keep many requests in flight: one read syscall picks up every request
    // header (and small payload) that has arrived, instead of two syscalls per request.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let (tx, rx) = mpsc::channel(limits.reply_queue);
    let mut writer = tokio::spawn(super::reply_writer::write_replies(
        rx,
        writer,
        limits.idle_timeout,
        Arc::clone(&context.stats),
        (Arc::clone(&device), params.structured),
    ));
    let conn = Conn {
        device,
        params,
        tx,
        ops: Arc::new(Semaphore::new(limits.max_in_flight)),
        budget: Arc::new(Semaphore::new(limits.max_in_flight_bytes)),
        max_in_flight: limits.max_in_flight,
        started: AtomicBool::new(false),
        idle_timeout: limits.idle_timeout,
        refusals: Mutex::default(),
        context,
    };
    let end = conn.read_requests(&mut reader, &mut shutdown).await;
    // Whatever ended the reader, what it started must run.
    conn.unplug();
    conn.say_held_back_refusals();
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
    idle_timeout: Option<Duration>,
    /// Lines about refused requests: at most one a second for this connection.
    refusals: Mutex<NoticeLimiter>,
    context: Context,
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
        // When the last read from the client ended: every byte in the read buffer
        // arrived by then, so taking requests from the buffer needs no clock. The idle
        // timer counts from here; it is one timer for the session, moved only when it
        // fires (never per request).
        let mut last_input = Instant::now();
        let mut idle = self.idle_timeout.map(|t| Box::pin(tokio::time::sleep(t)));
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
                let busy_poll = self.context.busy_poll;
                if !busy_poll.is_zero() && last_wait <= 2 * busy_poll {
                    poll_for_input(reader, busy_poll).await;
                }
                let read = reader.read_exact(&mut buf);
                tokio::pin!(read);
                loop {
                    tokio::select! {
                    biased;
                    () = shutdown_requested(shutdown) => return End::Drain,
                    () = self.tx.closed() => return End::WriterGone,
                    read = &mut read => match read {
                        Ok(_) => break,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                            let unanswered = self.in_flight();
                            return if unanswered == 0 { End::Drain } else { End::HungUp(unanswered) };
                        }
                        Err(e) => return End::Abort(e),
                    },
                    () = idle_fired(&mut idle) => {
                        if let Some(end) = self.idle_check(&mut idle, last_input) {
                            return end;
                        }
                    }
                    }
                }
                let now = Instant::now();
                last_wait = now.duration_since(waiting_since);
                last_input = now;
            }
            let hdr = match parse_request_header(&buf) {
                Ok(hdr) => hdr,
                Err(e) => return End::Abort(e.into()),
            };
            let received = Instant::now();
            if hdr.command == Command::Disc {
                return End::Drain;
            }

            let op = match validate(&hdr, &self.params) {
                Ok(op) => op,
                Err(rejection) => {
                    self.note_refusal(&hdr, &rejection);
                    // A WRITE's payload must be consumed even though it is refused.
                    if hdr.command == Command::Write && hdr.length > 0 {
                        let len = hdr.length as usize;
                        if len > MAX_DISCARDED_PAYLOAD_BYTES {
                            return End::Abort(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "WRITE of {len} bytes at {} from {}: longer than the \
                                     {MAX_DISCARDED_PAYLOAD_BYTES} bytes the server skips to \
                                     refuse a write, so the connection is closed",
                                    hdr.offset, self.context.peer
                                ),
                            ));
                        }
                        self.unplug();
                        let skipped = tokio::select! {
                            biased;
                            () = shutdown_requested(shutdown) => return End::Drain,
                            skipped = within(self.idle_timeout, discard(reader, len), || {
                                self.context.stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                                format!("{} stalled in the payload of a refused WRITE", self.context.peer)
                            }) => skipped,
                        };
                        if let Err(e) = skipped {
                            return End::Abort(io::Error::new(
                                e.kind(),
                                format!(
                                    "refused WRITE of {len} bytes at {} cut short: {e}",
                                    hdr.offset
                                ),
                            ));
                        }
                        last_input = Instant::now();
                    }
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

            let mut payload = Vec::new();
            let mut budget = None;
            if let Op::Write { offset, .. } = op {
                let len = hdr.length as usize;
                let Some(permit) = self.take_budget(hdr.length, shutdown).await else {
                    return End::Drain;
                };
                budget = Some(permit);
                if let Some(data) = reader.buffer().get(..len) {
                    payload = data.to_vec();
                    Pin::new(&mut *reader).consume(len);
                } else {
                    self.unplug();
                    let stalled = || {
                        self.context
                            .stats
                            .idle_timeouts
                            .fetch_add(1, Ordering::Relaxed);
                        format!("{} stalled in a WRITE payload", self.context.peer)
                    };
                    tokio::select! {
                        biased;
                        // Stuck mid-payload at shutdown: the request is lost, the stream unusable.
                        () = shutdown_requested(shutdown) => return End::Drain,
                        read = within(self.idle_timeout, read_payload(reader, len), stalled) => match read {
                            Ok(p) => payload = p,
                            Err(e) => return End::Abort(io::Error::new(
                                e.kind(),
                                format!(
                                    "WRITE of {len} bytes at {offset} cut short, not executed: {e}"
                                ),
                            )),
                        },
                    }
                    last_input = Instant::now();
                }
            }
            match op {
                Op::Read { length, .. } => {
                    let Some(permit) = self.take_budget(length, shutdown).await else {
                        return End::Drain;
                    };
                    budget = Some(permit);
                }
                Op::BlockStatus {
                    length, req_one, ..
                } => {
                    let reply_bytes = block_status_reply_bytes(
                        length,
                        self.params.sizes.minimum_bytes,
                        req_one,
                        self.params.contexts.count(),
                    );
                    let Some(permit) = self.take_budget(reply_bytes, shutdown).await else {
                        return End::Drain;
                    };
                    budget = Some(permit);
                }
                _ => {}
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
            let timing = Timing {
                stats: Arc::clone(&self.context.requests),
                kind: super::request_stats::kind_of(&op),
                received,
            };
            // A READ the device answers now needs no task. Writes started before it
            // are run first: as on a task (which runs once the reader waits, after its
            // `unplug`), a read sees every write received before it.
            if let Op::Read { offset, length } = op {
                self.unplug();
                if let Some(result) = self.device.read_now(offset, length) {
                    let mut reply = match result {
                        Ok(data) if data.len() == length as usize => {
                            read_reply(hdr.cookie, structured, offset, data)
                        }
                        Ok(_) => {
                            error_reply(hdr.cookie, structured, EIO, "device returned a short read")
                        }
                        Err(e) => {
                            error_reply(hdr.cookie, structured, error_code(&e), &e.to_string())
                        }
                    };
                    timing.done();
                    reply.budget = budget;
                    match self.tx.try_send(reply) {
                        Ok(()) => {}
                        Err(TrySendError::Closed(_)) => return End::WriterGone,
                        // More replies queued than requests may be in flight: error
                        // replies to refused requests crowd the queue. Wait, as for those.
                        Err(TrySendError::Full(reply)) => {
                            if self.tx.send(reply).await.is_err() {
                                return End::WriterGone;
                            }
                        }
                    }
                    drop(in_flight);
                    continue;
                }
            }
            // Writes, flushes and trims the device takes with a completion need no task.
            let (op, payload, budget, in_flight, timing) = match startable(op, payload) {
                Ok(start) => {
                    let done = Completion::new(
                        hdr.cookie,
                        structured,
                        self.tx.clone(),
                        (budget, in_flight),
                        Some(timing),
                    );
                    match self.device.start(start, done) {
                        Ok(()) => {
                            self.started.store(true, Ordering::Relaxed);
                            continue;
                        }
                        Err((start, done)) => {
                            let (op, payload) = unstart(start);
                            let (budget, in_flight, timing) = done.into_permits();
                            (op, payload, budget, in_flight, timing)
                        }
                    }
                }
                Err((op, payload)) => (op, payload, budget, in_flight, Some(timing)),
            };
            let device = Arc::clone(&self.device);
            let tx = self.tx.clone();
            let size = self.params.size;
            let contexts = Arc::clone(&self.params.contexts);
            tokio::spawn(async move {
                let request = Request {
                    op,
                    cookie: hdr.cookie,
                    structured,
                    size,
                    contexts: &contexts,
                };
                let mut reply = execute(&*device, request, payload).await;
                if let Some(t) = timing {
                    t.done();
                }
                reply.budget = budget;
                // If the writer is gone the client is too; nothing to do with the reply.
                let _ = tx.send(reply).await;
                drop(in_flight);
            });
        }
    }

    /// Reserves `length` bytes of payload budget, the connection's then the
    /// server's; `None` if shutdown came first.
    async fn take_budget(
        &self,
        length: u32,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<Budget> {
        if *shutdown.borrow() {
            return None;
        }
        let connection = self.take_permits(&self.budget, length, shutdown).await?;
        let server = self
            .take_permits(&self.context.server_budget, length, shutdown)
            .await?;
        Some(Budget {
            _connection: connection,
            _server: server,
        })
    }

    async fn take_permits(
        &self,
        semaphore: &Arc<Semaphore>,
        n: u32,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(semaphore).try_acquire_many_owned(n) {
            return Some(permit);
        }
        self.unplug();
        tokio::select! {
            biased;
            () = shutdown_requested(shutdown) => None,
            permit = Arc::clone(semaphore).acquire_many_owned(n) => permit.ok(),
        }
    }

    /// Requests taken and not yet answered.
    fn in_flight(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.ops.available_permits())
    }

    /// The idle timer fired: the end of the session if the client sent nothing since
    /// `last_input` for the whole idle timeout and has nothing in flight; otherwise the
    /// timer is moved to when that could next be true.
    fn idle_check(&self, idle: &mut Option<Pin<Box<Sleep>>>, last_input: Instant) -> Option<End> {
        let (Some(timeout), Some(timer)) = (self.idle_timeout, idle.as_mut()) else {
            return None;
        };
        let now = Instant::now();
        let due = last_input + timeout;
        if due > now {
            timer.as_mut().reset(due.into());
            return None;
        }
        if self.in_flight() > 0 {
            // A request may take long (writes wait while the log is full): that is
            // not idleness. Look again a timeout from now.
            timer.as_mut().reset((now + timeout).into());
            return None;
        }
        self.context
            .stats
            .idle_timeouts
            .fetch_add(1, Ordering::Relaxed);
        Some(End::Abort(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{} sent no request for {} ms (the idle timeout): closed",
                self.context.peer,
                timeout.as_millis()
            ),
        )))
    }

    /// Count a request the server refuses itself, and log it (at most a line a
    /// second for this connection).
    fn note_refusal(&self, hdr: &RequestHeader, rejection: &Rejection) {
        self.context.stats.count_refusal(rejection.reason);
        let Some(notices) = &self.context.notices else {
            return;
        };
        let line = match self.refusals.lock() {
            Ok(mut limiter) => limiter.admit(|| {
                format!(
                    "nbd: refused {} of {} bytes at {} from {}: {} ({})",
                    command_name(hdr.command),
                    hdr.length,
                    hdr.offset,
                    self.context.peer,
                    rejection.message,
                    errno_name(rejection.error)
                )
            }),
            Err(_) => None,
        };
        if let Some(line) = line {
            notices(&line);
        }
    }

    /// At the end of the session: how many refusals went unlogged since the last line.
    fn say_held_back_refusals(&self) {
        let held_back = match self.refusals.lock() {
            Ok(mut limiter) => limiter.take_held_back(),
            Err(_) => 0,
        };
        if held_back > 0
            && let Some(notices) = &self.context.notices
        {
            notices(&format!(
                "nbd: {held_back} more requests from {} were refused (not logged one by one)",
                self.context.peer
            ));
        }
    }
}

/// Resolves when the idle timer fires; never without one.
async fn idle_fired(idle: &mut Option<Pin<Box<Sleep>>>) {
    match idle {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}

/// One validated request, with what its reply depends on.
struct Request<'a> {
    op: Op,
    cookie: u64,
    structured: bool,
    /// The export's size.
    size: u64,
    /// The meta contexts a BLOCK_STATUS answers for.
    contexts: &'a MetaContexts,
}

/// Runs one validated request against the device and builds its reply.
async fn execute<D: BlockDevice>(device: &D, request: Request<'_>, payload: Vec<u8>) -> Reply {
    let Request {
        op,
        cookie,
        structured,
        size,
        contexts,
    } = request;
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
            let to_end = size.saturating_sub(offset);
            let mut header = Vec::new();
            let count = contexts.count();
            // One chunk per selected context, in order; the last one ends the reply.
            // A context that fails fails the whole request (nothing was sent yet).
            for (i, (id, name)) in contexts.ids().enumerate() {
                let (answer, known_flags) = match name {
                    None => (
                        device.block_status(offset, length).await,
                        STATE_HOLE | STATE_ZERO,
                    ),
                    // The device defines its contexts' flags.
                    Some(name) => (
                        device.meta_context_status(name, offset, length).await,
                        u32::MAX,
                    ),
                };
                let extents = match answer {
                    Ok(extents) => extents,
                    Err(e) => {
                        return error_reply(cookie, structured, error_code(&e), &e.to_string());
                    }
                };
                let Some(extents) = clamp_extents(extents, length, req_one, to_end, known_flags)
                else {
                    return error_reply(cookie, structured, EIO, "device returned no extents");
                };
                header.reserve(CHUNK_HEADER_LEN + 4 + 8 * extents.len());
                encode_block_status_chunk(&mut header, cookie, id, &extents, i + 1 == count);
            }
            return Reply {
                header: Header::Encoded(header),
                data: Vec::new(),
                budget: None,
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
        | Op::WriteZeroes(ZeroRequest { length: 0, .. }) => Ok(()),
        Op::Trim {
            offset,
            length,
            fua,
        } => device.trim(offset, length, fua).await,
        Op::Cache { offset, length } => device.cache(offset, length).await,
        Op::WriteZeroes(request) => device.write_zeroes(request).await,
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
        Op::WriteZeroes(request) if request.length > 0 => Ok(StartOp::WriteZeroes(request)),
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
        StartOp::WriteZeroes(request) => (Op::WriteZeroes(request), Vec::new()),
    }
}

/// Makes a device's extent list valid for the wire: no empty extents, flag bits of
/// `known_flags` only, no more extents than needed to cover `length`, nothing past
/// `length` (nor past `to_end`, the distance to the export end), exactly one extent for
/// REQ_ONE, at most [`MAX_REPLY_EXTENTS`].
fn clamp_extents(
    extents: Vec<AllocationExtent>,
    length: u32,
    req_one: bool,
    to_end: u64,
    known_flags: u32,
) -> Option<Vec<AllocationExtent>> {
    let limit = u64::from(length).min(to_end);
    let max_count = if req_one {
        1
    } else {
        MAX_REPLY_EXTENTS.min(MAX_BLOCK_STATUS_EXTENTS)
    };
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
            flags: e.flags & known_flags,
        });
    }
    if out.is_empty() { None } else { Some(out) }
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
        assert_eq!(clamp_extents(vec![], 10, false, 100, 3), None);
        assert_eq!(clamp_extents(vec![ext(0, 1)], 10, false, 100, 3), None);
        assert_eq!(
            clamp_extents(
                vec![ext(4, 1), ext(0, 0), ext(100, 0xff), ext(5, 2)],
                10,
                false,
                100,
                3
            ),
            Some(vec![ext(4, 1), ext(6, 3)])
        );
        assert_eq!(
            clamp_extents(vec![ext(4, 1), ext(4, 0)], 10, true, 100, 3),
            Some(vec![ext(4, 1)])
        );
        assert_eq!(
            clamp_extents(vec![ext(40, 1)], 10, true, 100, 3),
            Some(vec![ext(10, 1)])
        );
        assert_eq!(
            clamp_extents(vec![ext(40, 1)], 10, false, 3, 3),
            Some(vec![ext(3, 1)])
        );
        // No more than a reply's worth, however many the device returned.
        let many = vec![ext(1, 1); MAX_REPLY_EXTENTS + 5];
        let clamped = clamp_extents(many, u32::MAX, false, u64::MAX, 3).expect("extents");
        assert_eq!(clamped.len(), MAX_REPLY_EXTENTS);
        // A device context's flags are the device's.
        assert_eq!(
            clamp_extents(vec![ext(4, 0xff)], 10, false, 100, u32::MAX),
            Some(vec![ext(4, 0xff)])
        );
    }

    #[test]
    fn block_status_replies_reserve_their_size_at_most() {
        let header = (CHUNK_HEADER_LEN + 4) as u32;
        assert_eq!(
            block_status_reply_bytes(4096, 512, false, 1),
            header + 8 * 8
        );
        assert_eq!(block_status_reply_bytes(u32::MAX, 512, true, 1), header + 8);
        assert_eq!(
            block_status_reply_bytes(u32::MAX, 1, false, 1),
            header + 8 * MAX_REPLY_EXTENTS as u32
        );
        assert_eq!(block_status_reply_bytes(0, 0, false, 0), header + 8);
        // One chunk per selected context, the most a session may select included.
        assert_eq!(
            block_status_reply_bytes(4096, 512, false, 2),
            2 * (header + 8 * 8)
        );
        let most = 1 + super::super::MAX_SELECTED_CONTEXTS;
        let bytes = block_status_reply_bytes(u32::MAX, 1, false, most);
        assert_eq!(bytes, most as u32 * (header + 8 * MAX_REPLY_EXTENTS as u32));
        assert!(bytes as usize <= super::super::MAX_PAYLOAD_BYTES);
    }

    #[test]
    fn notices_are_limited_to_one_a_second_with_a_count_of_the_rest() {
        let mut limiter = NoticeLimiter::default();
        assert_eq!(limiter.admit(|| "a".into()), Some("a".to_string()));
        assert_eq!(limiter.admit(|| "b".into()), None);
        assert_eq!(limiter.admit(|| "c".into()), None);
        assert_eq!(limiter.take_held_back(), 2);
        assert_eq!(limiter.take_held_back(), 0);
        assert_eq!(limiter.admit(|| "d".into()), None);
        limiter.last = Instant::now().checked_sub(Duration::from_secs(2));
        assert_eq!(
            limiter.admit(|| "e".into()),
            Some("e (1 more like it since the last line, not logged)".to_string())
        );
    }
}
