//! The tokio NBD server: accepts connections, runs the handshake, then serves requests
//! against a [`BlockDevice`].
//!
//! Split into the handshake driver (`negotiate`), pure request validation (`request`),
//! the transmission-phase loop (`session`), the TLS policy (`tls`) and connection
//! threads (`threads`: a client served on a thread of its own). This file holds
//! the public surface: [`Server`], [`Export`], [`Limits`] and the [`Listener`]
//! abstraction that lets the same server accept on TCP and Unix sockets at once, each
//! with or without TLS.
//!
//! Nothing is logged here: a connection that fails is closed and its error is returned
//! from [`Server::handle_connection`]; [`Server::serve`] counts it in
//! [`ConnectionStats`] and hands it to the hook set with [`Server::on_connection_error`]
//! (lsvd logs it), so a client that vanishes mid-request is visible. Refusals an
//! operator should see (a plain client where TLS is required, a failed TLS handshake,
//! a client turned away because every slot is taken, a refused request) also go to the
//! [`Notices`] hook, if one is set, at most one line a second per connection (per
//! server for refused connections), with a count of the lines held back.
//!
//! What one client can make the server hold is bounded ([`Limits`]): a deadline for
//! its handshake, a cap on handshakes under way (clients past it are turned away at
//! once, not queued), an idle timeout, requests and payload bytes in flight per
//! connection and per server.

// The accept backoff and the handshake limiter run on tokio's clock (tests pause it);
// this crate imports nothing of lsvd's clock yet.
#![expect(
    clippy::disallowed_methods,
    reason = "accept backoff and handshake limiter, on tokio's clock"
)]

mod deadline;
mod negotiate;
pub(crate) mod reply;
mod reply_writer;
mod request;
pub mod request_stats;
mod session;
mod threads;
pub mod tls;

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use self::negotiate::Peer;
use self::tls::{BoxStream, Tls, Upgrade};
use crate::BlockDevice;

pub use self::threads::{Detach, Detached, on_connection_thread};

/// Receives one line for each event worth a server log entry: a client refused because
/// TLS is required, a failed TLS handshake (e.g. no or a wrong client certificate).
pub type Notices = Arc<dyn Fn(&str) + Send + Sync>;

/// One named disk offered to clients.
pub struct Export<D> {
    pub name: String,
    /// Shown to humans by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`; may be empty.
    pub description: String,
    pub device: Arc<D>,
}

/// Resource bounds. Every queue and buffer in the server is bounded by one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once by one [`Server::serve`] call; a client accepted
    /// beyond it is closed at once (counted in [`ConnectionStats::turned_away`]).
    pub max_connections: usize,
    /// Of those, connections still in the handshake (at most `max_connections`);
    /// beyond it a new client is closed at once too, so peers that connect and say
    /// nothing hold a slot for at most `handshake_timeout` and never make others wait.
    pub max_handshakes: usize,
    /// Requests executing at once on one connection.
    pub max_in_flight: usize,
    /// READ/WRITE payload bytes (and BLOCK_STATUS reply bytes) held at once on one
    /// connection (requests wait for room). Must be at least [`MAX_PAYLOAD_BYTES`], or
    /// the largest requests could never run.
    pub max_in_flight_bytes: usize,
    /// The same bytes summed over every connection of the server: what bounds the
    /// server's memory for payloads, whatever the number of clients. At least
    /// [`MAX_PAYLOAD_BYTES`].
    pub max_server_in_flight_bytes: usize,
    /// Replies queued for the writer of one connection.
    pub reply_queue: usize,
    /// Longest a client may take from connecting to entering transmission.
    pub handshake_timeout: Duration,
    /// A connection in transmission that sends no request for this long while none of
    /// its requests is running, or does not take a reply for this long, is closed
    /// (counted in [`ConnectionStats::idle_timeouts`]). `None`: never.
    pub idle_timeout: Option<Duration>,
    /// After shutdown is requested, how long a connection may take to finish in-flight
    /// requests and write their replies before it is dropped anyway.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_handshakes: 256,
            max_in_flight: 128,
            max_in_flight_bytes: 2 * MAX_PAYLOAD_BYTES,
            max_server_in_flight_bytes: 4 * MAX_PAYLOAD_BYTES,
            reply_queue: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(600)),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Largest READ/WRITE payload accepted (and advertised as the maximum block size, if the
/// device allows more).
pub const MAX_PAYLOAD_BYTES: usize = 32 << 20;

/// Longest WRITE payload the server reads and discards to refuse the request with
/// EINVAL (longer than the advertised maximum, or out of range, misaligned, to a
/// read-only export) and go on; it passes through the connection's read buffer, never
/// a buffer of its own. A WRITE announcing more closes the connection: the spec allows
/// a hard disconnect for a length that looks like an attack, and no real client sends
/// one (libnbd caps a write at 64 MiB).
pub const MAX_DISCARDED_PAYLOAD_BYTES: usize = 64 << 20;

/// Most extents one BLOCK_STATUS reply carries (the client asks again for the rest):
/// 512 KiB of reply at most, counted in the payload budget like a read.
pub const MAX_REPLY_EXTENTS: usize = 64 << 10;

/// Most meta contexts one `NBD_OPT_LIST_META_CONTEXT` answers with (a device may offer
/// many, e.g. one per snapshot): at most about 4 MiB of replies.
pub const MAX_LISTED_CONTEXTS: usize = 1024;

/// Most meta contexts of the device's one `NBD_OPT_SET_META_CONTEXT` selects (besides
/// `base:allocation`); further ones are not selected. A BLOCK_STATUS answers one chunk
/// per selected context, each up to [`MAX_REPLY_EXTENTS`] extents, all reserved from
/// the payload budget: 9 chunks stay far below the smallest budget allowed.
pub const MAX_SELECTED_CONTEXTS: usize = 8;

/// Most queries of one `NBD_OPT_{LIST,SET}_META_CONTEXT` the server looks up (each may
/// ask the device, which may ask its store); more are refused with
/// `NBD_REP_ERR_TOO_BIG`. Clients send one per context they want.
pub const MAX_META_QUERIES: usize = 32;

/// Longest option data read during the handshake. Longer options up to
/// [`MAX_OPTION_DISCARD_BYTES`] are skipped and answered with `NBD_REP_ERR_TOO_BIG`;
/// anything longer closes the connection.
pub const MAX_OPTION_BYTES: u32 = 64 << 10;
pub const MAX_OPTION_DISCARD_BYTES: u32 = 1 << 20;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A source of client connections, so one [`Server`] can serve TCP and Unix sockets.
pub trait Listener: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
    /// Who is on the other end of `stream`, for log lines.
    fn peer_name(stream: &Self::Stream) -> String {
        let _ = stream;
        "a local client".to_string()
    }
    /// Take `stream` off this runtime so a connection thread can serve it
    /// ([`Server::with_connection_threads`]). The default keeps every stream where it
    /// is.
    fn detach(stream: Self::Stream) -> Detach<Self::Stream> {
        Detach::Kept(stream)
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;

    async fn accept(&self) -> io::Result<TcpStream> {
        let (stream, _) = TcpListener::accept(self).await?;
        // The spec asks both ends to disable Nagle; replies are already batched.
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    fn peer_name(stream: &TcpStream) -> String {
        match stream.peer_addr() {
            Ok(addr) => addr.to_string(),
            Err(_) => "an unknown TCP client".to_string(),
        }
    }

    fn detach(stream: TcpStream) -> Detach<TcpStream> {
        match stream.into_std() {
            Ok(s) => Detach::Moved(Detached::Tcp(s)),
            Err(e) => Detach::Failed(e),
        }
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;

    async fn accept(&self) -> io::Result<UnixStream> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }

    fn detach(stream: UnixStream) -> Detach<UnixStream> {
        match stream.into_std() {
            Ok(s) => Detach::Moved(Detached::Unix(s)),
            Err(e) => Detach::Failed(e),
        }
    }
}

/// Why the server refused a request itself, before the device saw it (the label of
/// `lsvd_nbd_requests_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Longer than the advertised maximum block size (EINVAL).
    TooLarge,
    /// Past the end of the export (EINVAL, ENOSPC for writes).
    OutOfRange,
    /// Not aligned to the minimum block size (EINVAL).
    Misaligned,
    /// A write, trim or zeroing of a read-only export (EPERM).
    ReadOnly,
    /// An unknown command, a flag the command does not take, BLOCK_STATUS without a
    /// negotiated context or of an empty range (EINVAL).
    Invalid,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 5] = [
        RefusalReason::TooLarge,
        RefusalReason::OutOfRange,
        RefusalReason::Misaligned,
        RefusalReason::ReadOnly,
        RefusalReason::Invalid,
    ];

    /// The metric label: `too_large`, `out_of_range`, `misaligned`, `read_only`,
    /// `invalid`.
    pub fn label(self) -> &'static str {
        match self {
            RefusalReason::TooLarge => "too_large",
            RefusalReason::OutOfRange => "out_of_range",
            RefusalReason::Misaligned => "misaligned",
            RefusalReason::ReadOnly => "read_only",
            RefusalReason::Invalid => "invalid",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of the connections [`Server::serve`] handled (and of the requests of every
/// connection of the server).
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections that ended with an error: the client broke the protocol, hung up in
    /// the middle of a request's payload or with requests unanswered, stopped reading
    /// replies, or a timeout closed it (handshake, idle).
    pub ended_with_error: AtomicU64,
    /// Clients closed as soon as they were accepted: every connection slot, or every
    /// handshake slot, was taken ([`Limits::max_connections`], [`Limits::max_handshakes`]).
    /// Not in `accepted`.
    pub turned_away: AtomicU64,
    /// Connections closed because their handshake outlived [`Limits::handshake_timeout`].
    pub handshake_timeouts: AtomicU64,
    /// Connections closed by [`Limits::idle_timeout`].
    pub idle_timeouts: AtomicU64,
    /// Requests refused by the server itself, by [`RefusalReason`].
    refused: [AtomicU64; 5],
}

impl ConnectionStats {
    /// Requests refused for `reason` so far.
    pub fn requests_refused(&self, reason: RefusalReason) -> u64 {
        self.refused[reason.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_refusal(&self, reason: RefusalReason) {
        self.refused[reason.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// At most one log line a second (through [`Notices`] here; a device may use one for
/// its own lines): says how many were held back.
#[derive(Debug, Default)]
pub struct NoticeLimiter {
    pub(crate) last: Option<Instant>,
    held_back: u64,
}

/// Shortest gap between two lines of one [`NoticeLimiter`].
const NOTICE_INTERVAL: Duration = Duration::from_secs(1);

impl NoticeLimiter {
    /// `line` with what was held back since the last line said, or `None` if a line
    /// went out less than a second ago (then it is counted).
    pub fn admit(&mut self, line: impl FnOnce() -> String) -> Option<String> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < NOTICE_INTERVAL)
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        let mut line = line();
        if self.held_back > 0 {
            line.push_str(&format!(
                " ({} more like it since the last line, not logged)",
                self.held_back
            ));
            self.held_back = 0;
        }
        Some(line)
    }

    /// How many lines were held back since the last one, resetting the count.
    pub fn take_held_back(&mut self) -> u64 {
        std::mem::take(&mut self.held_back)
    }
}

/// Called with the error that ended a connection.
pub type ConnectionErrorHook = Box<dyn Fn(&io::Error) + Send + Sync>;

/// An NBD server for a fixed set of exports. The first export is also the default one,
/// served to clients that ask for the empty name.
pub struct Server<D: BlockDevice> {
    exports: Vec<Export<D>>,
    limits: Limits,
    notices: Option<Notices>,
    stats: Arc<ConnectionStats>,
    /// Each export's request counts and latencies, in `exports` order.
    requests: Vec<Arc<request_stats::RequestStats>>,
    /// [`Limits::max_server_in_flight_bytes`], shared by every connection.
    server_budget: Arc<Semaphore>,
    /// Lines about clients turned away, at most one a second.
    turned_away_notices: Mutex<NoticeLimiter>,
    on_error: Option<ConnectionErrorHook>,
    connection_threads: bool,
    busy_poll: Duration,
}

impl<D: BlockDevice> Server<D> {
    pub fn new(exports: Vec<Export<D>>) -> Self {
        Self::with_limits(exports, Limits::default())
    }

    pub fn with_limits(exports: Vec<Export<D>>, limits: Limits) -> Self {
        // Semaphores and channels panic on zero or absurd sizes; clamp instead.
        let permits = |n: usize, min: usize| n.clamp(min, Semaphore::MAX_PERMITS);
        let max_connections = permits(limits.max_connections, 1);
        let limits = Limits {
            max_connections,
            max_handshakes: limits.max_handshakes.clamp(1, max_connections),
            max_in_flight: permits(limits.max_in_flight, 1),
            max_in_flight_bytes: permits(limits.max_in_flight_bytes, MAX_PAYLOAD_BYTES),
            max_server_in_flight_bytes: permits(
                limits.max_server_in_flight_bytes,
                MAX_PAYLOAD_BYTES,
            ),
            reply_queue: permits(limits.reply_queue, 1),
            // A zero deadline would refuse every client; zero idle time, every request.
            handshake_timeout: limits.handshake_timeout.max(Duration::from_millis(1)),
            idle_timeout: limits.idle_timeout.map(|t| t.max(Duration::from_millis(1))),
            ..limits
        };
        Server {
            requests: exports.iter().map(|_| Arc::default()).collect(),
            exports,
            limits,
            notices: None,
            stats: Arc::default(),
            server_budget: Arc::new(Semaphore::new(limits.max_server_in_flight_bytes)),
            turned_away_notices: Mutex::default(),
            on_error: None,
            connection_threads: false,
            busy_poll: Duration::ZERO,
        }
    }

    /// On connection threads: how long a reader that has no request to take polls the
    /// socket before it sleeps until one arrives (zero, the default: it sleeps at once).
    /// Only while the client keeps it busy: after a wait longer than twice this, the
    /// next wait sleeps at once, and polling resumes after a shorter one. Why: a
    /// thread that sleeps is woken by the kernel when the request arrives, which on a
    /// virtual machine whose other CPU is idle costs tens of µs; a client at queue
    /// depth 1 sends its next request that soon after each reply.
    pub fn with_busy_poll(mut self, busy_poll: Duration) -> Self {
        self.busy_poll = busy_poll;
        self
    }

    /// Serve each client accepted by [`Server::serve`] from a TCP or Unix listener on a
    /// thread of its own, with a current-thread runtime, instead of on the runtime that
    /// accepted it (see `threads`: no hand-offs between worker threads per request, and
    /// the device may block there, [`on_connection_thread`]). Off by default. A device
    /// served this way should run the work it spawns on its own runtime, since a
    /// connection's runtime ends with the connection.
    pub fn with_connection_threads(mut self, on: bool) -> Self {
        self.connection_threads = on;
        self
    }

    /// Sends refusals and TLS failures to `notices` (see [`Notices`]).
    pub fn with_notices(mut self, notices: Notices) -> Self {
        self.notices = Some(notices);
        self
    }

    /// Call `hook` with the error of every connection [`Server::serve`] sees end badly.
    pub fn on_connection_error(mut self, hook: ConnectionErrorHook) -> Self {
        self.on_error = Some(hook);
        self
    }

    /// The connection counters of [`Server::serve`].
    pub fn connection_stats(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.stats)
    }

    /// Each export's request counts and latencies (name, numbers), in export order.
    pub fn request_stats(&self) -> Vec<(String, Arc<request_stats::RequestStats>)> {
        self.exports
            .iter()
            .zip(&self.requests)
            .map(|(e, r)| (e.name.clone(), Arc::clone(r)))
            .collect()
    }

    pub fn exports(&self) -> &[Export<D>] {
        &self.exports
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Accepts connections from `listener` until `shutdown` becomes true, then stops
    /// accepting, lets every connection finish its in-flight requests (see
    /// [`Limits::shutdown_grace`]) and returns once all have closed. May run several times
    /// at once on one server, e.g. for a TCP and a Unix listener.
    pub async fn serve<L: Listener>(
        self: Arc<Self>,
        listener: L,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve_with(listener, None, shutdown).await
    }

    /// [`Server::serve`] with `NBD_OPT_STARTTLS` offered on every connection, and
    /// required first if `tls.mode` is [`tls::TlsMode::Required`].
    pub async fn serve_tls<L: Listener>(
        self: Arc<Self>,
        listener: L,
        tls: Tls,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve_with(listener, Some(tls), shutdown).await
    }

    async fn serve_with<L: Listener>(
        self: Arc<Self>,
        listener: L,
        tls: Option<Tls>,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.limits.max_connections));
        let handshakes = Arc::new(Semaphore::new(self.limits.max_handshakes));
        let mut connections = JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                biased;
                () = shutdown_requested(&mut shutdown) => break,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok(stream) => stream,
                // Per-connection failures (aborted handshakes) and resource exhaustion
                // (EMFILE) are both transient for a listening socket.
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // Full: close at once (the client sees EOF), rather than leave it in the
            // listen backlog until someone else's deadline passes.
            let slot = Arc::clone(&slots).try_acquire_owned();
            let handshake = Arc::clone(&handshakes).try_acquire_owned();
            let (slot, handshake) = match (slot, handshake) {
                (Ok(slot), Ok(handshake)) => (slot, handshake),
                (slot, _) => {
                    let what = if slot.is_err() {
                        format!("all {} connection slots", self.limits.max_connections)
                    } else {
                        format!("all {} handshake slots", self.limits.max_handshakes)
                    };
                    self.turn_away(&L::peer_name(&stream), &what);
                    drop(stream);
                    continue;
                }
            };
            let server = Arc::clone(&self);
            let shutdown = shutdown.clone();
            let peer = L::peer_name(&stream);
            let tls = tls.clone();
            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
            let on_thread = self.connection_threads;
            connections.spawn(async move {
                // Connection errors only mean this client is gone: count and
                // report them, nothing more (refusals went to the notices too).
                let here = |stream, handshake| {
                    Arc::clone(&server).connection_with(
                        stream,
                        tls.clone(),
                        &peer,
                        handshake,
                        shutdown.clone(),
                    )
                };
                let result = if !on_thread {
                    here(stream, handshake).await
                } else {
                    match L::detach(stream) {
                        Detach::Moved(stream) => {
                            Arc::clone(&server)
                                .connection_on_thread(
                                    stream,
                                    tls.clone(),
                                    peer.clone(),
                                    handshake,
                                    shutdown.clone(),
                                )
                                .await
                        }
                        Detach::Kept(stream) => here(stream, handshake).await,
                        Detach::Failed(e) => Err(e),
                    }
                };
                if let Err(e) = result {
                    server
                        .stats
                        .ended_with_error
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(hook) = &server.on_error {
                        hook(&e);
                    }
                }
                drop(slot);
            });
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
        Ok(())
    }

    /// Count a client closed at accept because `what` were taken, and say so (at most
    /// once a second).
    fn turn_away(&self, peer: &str, what: &str) {
        self.stats.turned_away.fetch_add(1, Ordering::Relaxed);
        let Some(notices) = &self.notices else {
            return;
        };
        let line = match self.turned_away_notices.lock() {
            Ok(mut limiter) => {
                limiter.admit(|| format!("nbd: turned away a client ({peer}): {what} are taken"))
            }
            Err(_) => None,
        };
        if let Some(line) = line {
            notices(&line);
        }
    }

    /// Serves one client on `stream`: handshake, then transmission until the client
    /// disconnects, breaks the protocol, or `shutdown` becomes true (in-flight requests
    /// are finished and answered first). Returns the error that ended the connection, if
    /// any; a clean `NBD_CMD_DISC`, `NBD_OPT_ABORT`, EOF or shutdown is `Ok`.
    pub async fn handle_connection<S>(
        self: Arc<Self>,
        stream: S,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.connection(stream, None, "a client", None, shutdown)
            .await
    }

    /// [`Server::handle_connection`] with the TLS policy `tls`; `peer` names the client
    /// in notices.
    pub async fn handle_connection_tls(
        self: Arc<Self>,
        stream: BoxStream,
        tls: Tls,
        peer: String,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.connection(stream, Some(&tls), &peer, None, shutdown)
            .await
    }

    /// [`Server::connection`] under the TLS policy `tls`, if any.
    async fn connection_with<S>(
        self: Arc<Self>,
        stream: S,
        tls: Option<Tls>,
        peer: &str,
        handshake: OwnedSemaphorePermit,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match tls {
            None => {
                self.connection(stream, None, peer, Some(handshake), shutdown)
                    .await
            }
            Some(tls) => {
                let stream: BoxStream = Box::new(stream);
                self.connection(stream, Some(&tls), peer, Some(handshake), shutdown)
                    .await
            }
        }
    }

    async fn connection<S>(
        self: Arc<Self>,
        mut stream: S,
        tls: Option<&dyn Upgrade<S>>,
        peer: &str,
        handshake: Option<OwnedSemaphorePermit>,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let peer_name = peer;
        let peer = Peer {
            name: peer,
            notices: self.notices.as_ref(),
        };
        let timeout = self.limits.handshake_timeout;
        let negotiated = tokio::time::timeout(
            timeout,
            negotiate::negotiate(&self.exports, &mut stream, tls, &peer, &mut shutdown),
        )
        .await
        .map_err(|_| {
            self.stats
                .handshake_timeouts
                .fetch_add(1, Ordering::Relaxed);
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "NBD handshake with {peer_name} not done after {} ms: closed",
                    timeout.as_millis()
                ),
            )
        })??;
        // Out of the handshake: its slot is free for the next client.
        drop(handshake);
        let Some(negotiated) = negotiated else {
            return Ok(());
        };
        let device = match self.exports.get(negotiated.export) {
            Some(export) => Arc::clone(&export.device),
            None => return Err(io::Error::other("negotiated export vanished")),
        };
        let busy_poll = if threads::on_connection_thread() {
            self.busy_poll
        } else {
            Duration::ZERO
        };
        let context = session::Context {
            limits: self.limits,
            busy_poll,
            stats: Arc::clone(&self.stats),
            requests: self
                .requests
                .get(negotiated.export)
                .map(Arc::clone)
                .unwrap_or_default(),
            server_budget: Arc::clone(&self.server_budget),
            notices: self.notices.clone(),
            peer: peer_name.to_string(),
        };
        session::run(device, negotiated.params, stream, shutdown, context).await
    }
}

/// Resolves once `shutdown` is true. A dropped sender means shutdown can never be
/// requested, so this then never resolves.
pub(crate) async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}
