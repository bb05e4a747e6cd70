//! Connection threads: each client served on an OS thread of its own.
//!
//! Why: on a multi-thread runtime a connection's reader and reply writer hop between
//! worker threads. Every request wakes a parked worker (a futex wake and a context
//! switch), and whichever worker is waiting in `epoll` picks up the next request. A
//! device that must block for a FLUSH (`fdatasync`) can only do so inside
//! `block_in_place`, which hands the worker's core to yet another thread. At queue
//! depth 1 those hand-offs cost as much as the `fdatasync` itself. On a thread of its
//! own, with a current-thread runtime, the connection's tasks never leave the thread,
//! and the device may block there ([`on_connection_thread`]), as in a
//! thread-per-connection server such as nbdkit's.
//!
//! The stream is taken off the accepting runtime's reactor ([`Detached`]) and registered
//! with the new runtime's, so its readiness wakes this thread and no other. Work the
//! device does on tasks of its own belongs on its own runtime (the thread's runtime ends
//! with the connection); see [`crate::BlockDevice::unplug`].

use std::cell::Cell;
use std::io;
use std::sync::Arc;

use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, oneshot, watch};

use super::Server;
use super::tls::Tls;
use crate::BlockDevice;

/// A client's stream, off any runtime, on its way to a connection thread.
#[derive(Debug)]
pub enum Detached {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// What [`super::Listener::detach`] made of a stream.
#[derive(Debug)]
pub enum Detach<S> {
    /// Ready for a connection thread.
    Moved(Detached),
    /// This kind of stream stays on the runtime that accepted it.
    Kept(S),
    /// Taking it off the reactor failed; the connection is lost.
    Failed(io::Error),
}

thread_local! {
    static CONNECTION_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Is this thread a connection thread ([`Server::with_connection_threads`])? There the
/// device may block (an `fdatasync`, a wait for room) while its connection waits: no
/// other connection's requests run on it.
pub fn on_connection_thread() -> bool {
    CONNECTION_THREAD.with(Cell::get)
}

impl<D: BlockDevice> Server<D> {
    /// Serve `stream` on a new thread with a runtime of its own; resolves with the
    /// connection's result once the thread's runtime has shut down, so nothing of the
    /// connection (its tasks, their hold on the device) outlives it.
    pub(super) async fn connection_on_thread(
        self: Arc<Self>,
        stream: Detached,
        tls: Option<Tls>,
        peer: String,
        handshake: OwnedSemaphorePermit,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let (answer, answered) = oneshot::channel();
        std::thread::Builder::new()
            .name("nbd-connection".to_string())
            .spawn(move || {
                let _ = answer.send(serve_here(self, stream, tls, &peer, handshake, shutdown));
            })?;
        answered.await.unwrap_or_else(|_| {
            Err(io::Error::other(
                "the connection's thread ended without an answer (it panicked)",
            ))
        })
    }
}

fn serve_here<D: BlockDevice>(
    server: Arc<Server<D>>,
    stream: Detached,
    tls: Option<Tls>,
    peer: &str,
    handshake: OwnedSemaphorePermit,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    CONNECTION_THREAD.with(|c| c.set(true));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        match stream {
            // Registered with this thread's reactor.
            Detached::Tcp(s) => {
                let s = TcpStream::from_std(s)?;
                server
                    .connection_with(s, tls, peer, handshake, shutdown)
                    .await
            }
            Detached::Unix(s) => {
                let s = UnixStream::from_std(s)?;
                server
                    .connection_with(s, tls, peer, handshake, shutdown)
                    .await
            }
        }
    });
    // Tasks the connection left behind end here, before the answer goes out.
    drop(runtime);
    result
}
