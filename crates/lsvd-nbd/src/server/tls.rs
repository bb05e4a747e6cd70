//! NBD over TLS (`NBD_OPT_STARTTLS`): the server's TLS policy for one listener and the
//! seam through which the handshake itself is run.
//!
//! The crate stays free of any TLS library: the handshake is behind [`TlsAcceptor`],
//! which lsvd implements with rustls (`lsvd::tls`). That keeps the protocol crate small
//! and lets the negotiation state machine be tested with a stand-in "TLS" that only
//! scrambles bytes, which proves haggling continues on the upgraded stream.
//!
//! Spec terms (`doc/proto.md`, "TLS support"): [`TlsMode::Required`] is FORCEDTLS (every
//! option but STARTTLS and ABORT gets `NBD_REP_ERR_TLS_REQD` until TLS is up, and
//! `NBD_OPT_EXPORT_NAME` without TLS ends the session); [`TlsMode::Optional`] is the
//! SELECTIVETLS mode with no TLS-only exports (a client may upgrade or not).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream a connection runs on, plain or encrypted.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A connection's stream once it may be upgraded: the type changes at STARTTLS.
pub type BoxStream = Box<dyn Stream>;

/// A boxed, sendable future, as returned by [`TlsAcceptor::accept`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs the server side of a TLS handshake.
pub trait TlsAcceptor: Send + Sync + 'static {
    /// Performs the handshake on `stream` (the client starts it right after our
    /// `NBD_REP_ACK` to STARTTLS) and returns the encrypted stream. An error (bad or
    /// missing client certificate, protocol failure) ends the session: by then it is too
    /// late to go on in plain text.
    fn accept(&self, stream: BoxStream) -> BoxFuture<'_, io::Result<BoxStream>>;
}

/// Whether a listener insists on TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Every client must upgrade with STARTTLS before anything but ABORT (FORCEDTLS).
    Required,
    /// Clients may upgrade; plain clients are served too (SELECTIVETLS, no TLS-only
    /// exports).
    Optional,
}

/// TLS settings of one listener (see [`crate::Server::serve_tls`]).
#[derive(Clone)]
pub struct Tls {
    pub mode: TlsMode,
    pub acceptor: Arc<dyn TlsAcceptor>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish()
    }
}

/// What negotiation needs to upgrade a connection of stream type `S` in place.
pub(crate) trait Upgrade<S>: Sync {
    fn mode(&self) -> TlsMode;
    /// Replaces `stream` with its encrypted form.
    fn upgrade<'a>(&'a self, stream: &'a mut S) -> BoxFuture<'a, io::Result<()>>;
}

impl Upgrade<BoxStream> for Tls {
    fn mode(&self) -> TlsMode {
        self.mode
    }

    fn upgrade<'a>(&'a self, stream: &'a mut BoxStream) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            // The plain stream moves into the handshake; if that fails the connection
            // is over and the placeholder is never used for NBD traffic.
            let plain = std::mem::replace(stream, Box::new(Detached));
            *stream = self.acceptor.accept(plain).await?;
            Ok(())
        })
    }
}

/// Stands in for a stream that was handed to the TLS handshake: reads see EOF, writes
/// fail.
struct Detached;

impl AsyncRead for Detached {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Detached {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
