//! The STARTTLS state machine (FORCEDTLS and SELECTIVETLS rules of the spec) over an
//! in-memory stream, with a stand-in for TLS: a 4-byte "handshake" and then every byte
//! XORed with a key. A client that did not switch its own stream after STARTTLS would
//! read garbage, so these tests prove haggling and transmission continue on the
//! upgraded stream. Real TLS with real clients is tested in `crates/lsvd/tests/tls.rs`.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use common::*;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::*;
use lsvd_nbd::proto::transmission::Command;
use lsvd_nbd::server::tls::{BoxFuture, BoxStream};
use lsvd_nbd::{Server, Tls, TlsAcceptor, TlsMode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::watch;

const KEY: u8 = 0x5a;
const HELLO: &[u8; 4] = b"HELO";
const HELLO_REPLY: &[u8; 4] = b"OLEH";

/// A stream that XORs every byte with `key` (0: plain text).
struct Xor<S> {
    inner: S,
    key: u8,
}

impl<S: AsyncRead + Unpin> AsyncRead for Xor<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let key = self.key;
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            for b in &mut buf.filled_mut()[before..] {
                *b ^= key;
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Xor<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let scrambled: Vec<u8> = buf.iter().map(|b| b ^ self.key).collect();
        Pin::new(&mut self.inner).poll_write(cx, &scrambled)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The server side of the stand-in TLS; `refuse` plays a client without a certificate.
struct FakeTls {
    refuse: bool,
}

impl TlsAcceptor for FakeTls {
    fn accept(&self, mut stream: BoxStream) -> BoxFuture<'_, io::Result<BoxStream>> {
        Box::pin(async move {
            let mut hello = [0u8; 4];
            stream.read_exact(&mut hello).await?;
            if &hello != HELLO {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "not a hello"));
            }
            if self.refuse {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "peer sent no certificates",
                ));
            }
            stream.write_all(HELLO_REPLY).await?;
            stream.flush().await?;
            Ok(Box::new(Xor {
                inner: stream,
                key: KEY,
            }) as BoxStream)
        })
    }
}

struct TlsConn {
    client: Client<Xor<DuplexStream>>,
    server: tokio::task::JoinHandle<io::Result<()>>,
    notices: Arc<Mutex<Vec<String>>>,
    _stop: watch::Sender<bool>,
}

impl TlsConn {
    /// Asserts that the server closes the connection; returns how its session ended.
    async fn closed(&mut self) -> io::Result<()> {
        assert!(
            self.client.is_closed().await,
            "the server closes the connection"
        );
        (&mut self.server).await.expect("join")
    }
}

fn connect_tls(mode: TlsMode, refuse: bool) -> TlsConn {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&notices);
    let server = Arc::new(
        Server::new(vec![export("disk", TestDevice::new(SIZE))]).with_notices(Arc::new(
            move |line: &str| sink.lock().expect("lock").push(line.to_string()),
        )),
    );
    let tls = Tls {
        mode,
        acceptor: Arc::new(FakeTls { refuse }),
    };
    let (stop, shutdown) = watch::channel(false);
    let (client, server_end) = tokio::io::duplex(4 << 20);
    let server = tokio::spawn(server.handle_connection_tls(
        Box::new(server_end),
        tls,
        "192.0.2.7:4000".to_string(),
        shutdown,
    ));
    TlsConn {
        client: Client::new(Xor {
            inner: client,
            key: 0,
        }),
        server,
        notices,
        _stop: stop,
    }
}

impl TlsConn {
    /// STARTTLS, expecting ACK, then the stand-in handshake; the client's stream is
    /// scrambled from then on.
    async fn start_tls(&mut self) {
        self.client.option_acked(OPT_STARTTLS, &[]).await;
        self.client.stream.write_all(HELLO).await.expect("hello");
        let reply: [u8; 4] = self.client.read_exactly("hello reply").await;
        assert_eq!(&reply, HELLO_REPLY);
        self.client.stream.key = KEY;
    }

    fn notices(&self) -> Vec<String> {
        notices_of(&self.notices)
    }
}

fn notices_of(notices: &Mutex<Vec<String>>) -> Vec<String> {
    notices.lock().expect("lock").clone()
}

fn info_request(name: &str) -> Vec<u8> {
    let mut data = Vec::new();
    InfoRequest {
        name: name.into(),
        requests: vec![],
    }
    .encode(&mut data);
    data
}

/// Writes a block and reads it back on a connection in transmission.
async fn write_read_back(client: &mut Client<Xor<DuplexStream>>) {
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let r = client.write_at(8192, &data).await;
    assert_eq!(r.error, 0);
    let r = client.call(Command::Read, 0, 8192, 4096, &[]).await;
    assert_eq!(r.error, 0);
    assert_eq!(r.data, data);
}

#[tokio::test]
async fn required_refuses_every_plain_option_but_starttls_and_abort() {
    let mut c = connect_tls(TlsMode::Required, false);
    c.client.handshake().await;
    for (option, data) in [
        (OPT_LIST, vec![]),
        (OPT_INFO, info_request("disk")),
        (OPT_GO, info_request("disk")),
        (OPT_STRUCTURED_REPLY, vec![]),
        (OPT_GO, vec![1, 2, 3]),
        (0xdead, vec![]),
    ] {
        let replies = c.client.option(option, &data).await;
        assert_eq!(replies.len(), 1, "option {option}: {replies:?}");
        assert_eq!(replies[0].0, REP_ERR_TLS_REQD, "option {option}");
    }
    c.client.option_acked(OPT_ABORT, &[]).await;
    c.closed().await.expect("abort is a clean end");
    let notices = notices_of(&c.notices);
    assert_eq!(
        notices.len(),
        1,
        "one line per refused connection: {notices:?}"
    );
    assert!(
        notices[0].contains("192.0.2.7:4000") && notices[0].contains("TLS is required"),
        "{notices:?}"
    );
}

#[tokio::test]
async fn required_hangs_up_on_plain_export_name() {
    let mut c = connect_tls(TlsMode::Required, false);
    c.client.handshake().await;
    c.client.send_option(OPT_EXPORT_NAME, b"disk").await;
    let err = c
        .closed()
        .await
        .expect_err("EXPORT_NAME without TLS must end the session");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
    assert_eq!(notices_of(&c.notices).len(), 1);
}

#[tokio::test]
async fn required_serves_after_starttls() {
    let mut c = connect_tls(TlsMode::Required, false);
    c.client.handshake().await;
    c.start_tls().await;
    // Never TLS_REQD once TLS is up; a second STARTTLS is invalid.
    assert_eq!(
        c.client.option(OPT_STARTTLS, &[]).await[0].0,
        REP_ERR_INVALID
    );
    let replies = c.client.option(OPT_LIST, &[]).await;
    assert_eq!(replies.last().map(|r| r.0), Some(REP_ACK));
    c.client.structured_and_meta("disk").await;
    c.client.go("disk", &[]).await;
    write_read_back(&mut c.client).await;
    assert!(c.notices().is_empty(), "{:?}", c.notices());
}

#[tokio::test]
async fn required_serves_export_name_after_starttls() {
    let mut c = connect_tls(TlsMode::Required, false);
    c.client.handshake().await;
    c.start_tls().await;
    c.client.send_option(OPT_EXPORT_NAME, b"disk").await;
    let reply: [u8; 10] = c.client.read_exactly("export reply").await;
    assert_eq!(
        u64::from_be_bytes(reply[..8].try_into().expect("8")),
        SIZE as u64
    );
    write_read_back(&mut c.client).await;
}

#[tokio::test]
async fn features_negotiated_before_tls_are_forgotten() {
    let mut c = connect_tls(TlsMode::Optional, false);
    c.client.handshake().await;
    c.client.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
    c.start_tls().await;
    let data = meta_context_request("disk", &["base:allocation"]);
    assert_eq!(
        c.client.option(OPT_SET_META_CONTEXT, &data).await[0].0,
        REP_ERR_INVALID,
        "structured replies negotiated in plain text must not survive STARTTLS"
    );
    c.client.structured_and_meta("disk").await;
    c.client.go("disk", &[]).await;
    write_read_back(&mut c.client).await;
}

#[tokio::test]
async fn optional_serves_plain_clients_too() {
    let mut c = connect_tls(TlsMode::Optional, false);
    c.client.handshake().await;
    c.client.go("disk", &[]).await;
    write_read_back(&mut c.client).await;
    assert!(c.notices().is_empty());
}

#[tokio::test]
async fn failed_handshake_ends_the_session_with_a_notice() {
    let mut c = connect_tls(TlsMode::Required, true);
    c.client.handshake().await;
    c.client.option_acked(OPT_STARTTLS, &[]).await;
    c.client.stream.write_all(HELLO).await.expect("hello");
    let err = c
        .closed()
        .await
        .expect_err("a refused handshake ends the session");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
    let notices = notices_of(&c.notices);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].contains("TLS handshake with 192.0.2.7:4000 failed")
            && notices[0].contains("no certificates"),
        "{notices:?}"
    );
}

#[tokio::test]
async fn plain_listener_refuses_starttls_by_policy() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    assert_eq!(
        c.client.option(OPT_STARTTLS, &[]).await[0].0,
        REP_ERR_POLICY
    );
    // And never asks for TLS.
    c.client.go("disk", &[]).await;
}
