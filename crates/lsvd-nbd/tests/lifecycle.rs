//! Connection lifecycle: disconnect, protocol violations, shutdown, real listeners.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use lsvd_nbd::proto::transmission::{Command, RequestHeader};
use lsvd_nbd::{Limits, Server};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// A server whose reads at offset 0 take `delay_ms`, and the device's "a read
/// started" signal.
fn slow_server(delay_ms: u64) -> (Arc<Server<TestDevice>>, Arc<tokio::sync::Notify>) {
    let mut dev = TestDevice::new(SIZE);
    dev.slow_read = Some((0, Duration::from_millis(delay_ms)));
    let started = dev.read_started.clone();
    (Arc::new(Server::new(vec![export("d", dev)])), started)
}

#[tokio::test]
async fn disc_finishes_in_flight_requests_then_closes() {
    let (server, _) = slow_server(200);
    let mut c = connect_go(&server, true).await;
    let read = c.client.send(Command::Read, 0, 0, 4096, &[]).await;
    let r = c.client.disc_behind_one_in_flight().await;
    assert_eq!((r.cookie, r.error, r.data.len()), (read, 0, 4096));
    assert!(c.closed().await.is_ok());
}

#[tokio::test]
async fn bad_magic_closes_only_that_connection() {
    let server = two_export_server();
    let mut good = connect_go(&server, false).await;
    let mut bad = connect_go(&server, false).await;
    let mut header = RequestHeader {
        flags: 0,
        command: Command::Read,
        cookie: 1,
        offset: 0,
        length: 512,
    }
    .encode();
    header[0] ^= 0xff;
    bad.client.stream.write_all(&header).await.expect("send");
    assert!(bad.closed().await.is_err());
    let r = good.client.call(Command::Read, 0, 0, 512, &[]).await;
    assert_eq!((r.error, r.data.len()), (0, 512));
}

#[tokio::test]
async fn shutdown_answers_in_flight_requests_then_closes() {
    let (server, read_started) = slow_server(300);
    let mut c = connect_go(&server, false).await;
    let read = c.client.send(Command::Read, 0, 0, 4096, &[]).await;
    // The read is at the device (and stays there 300 ms) when the stop comes.
    read_started.notified().await;
    c.stop.send(true).expect("server listening");
    let r = c.client.reply().await.expect("reply written before close");
    assert_eq!((r.cookie, r.error), (read, 0));
    assert!(c.closed().await.is_ok());
}

#[tokio::test]
async fn shutdown_during_handshake_closes() {
    let server = two_export_server();
    let c = connect_handshaken(&server).await;
    c.stop.send(true).expect("server listening");
    assert!(c.closed().await.is_ok());
}

#[tokio::test]
async fn shutdown_grace_bounds_a_client_that_stops_reading() {
    let dev = TestDevice::new(SIZE);
    let read_started = dev.read_started.clone();
    let limits = Limits {
        shutdown_grace: Duration::from_millis(200),
        ..Limits::default()
    };
    let server = Arc::new(Server::with_limits(vec![export("d", dev)], limits));
    let (stop, shutdown) = watch::channel(false);
    // A tiny pipe the client never reads: the writer blocks on the 1 MiB reply.
    let (mut client_end, server_end) = tokio::io::duplex(1024);
    let task = tokio::spawn(Arc::clone(&server).handle_connection(server_end, shutdown));
    let mut client = client_on_default_export(&mut client_end).await;
    client.send(Command::Read, 0, 0, 1 << 20, &[]).await;
    // In flight: its 1 MiB reply cannot fit the pipe, however the stop and the reply
    // interleave.
    read_started.notified().await;
    stop.send(true).expect("server listening");
    let joined = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("gave up after the grace period");
    assert!(joined.expect("no panic").is_err());
}

#[tokio::test]
async fn serve_tcp_and_unix_together_then_shut_down() {
    serve_tcp_and_unix_then_shut_down(false).await;
}

/// The same on connection threads: each client is served on a thread of its own
/// (the device sees it), both listeners' streams move there, and the shutdown still
/// waits for every connection.
#[tokio::test]
async fn connection_threads_serve_tcp_and_unix_then_shut_down() {
    serve_tcp_and_unix_then_shut_down(true).await;
}

async fn serve_tcp_and_unix_then_shut_down(threads: bool) {
    let (dir, sock) = temp_socket("test");

    let server = Arc::new(
        Server::new(vec![
            export("disk", TestDevice::new(SIZE)),
            export("second", TestDevice::new(SIZE)),
        ])
        .with_connection_threads(threads)
        .with_busy_poll(Duration::from_micros(if threads { 50 } else { 0 })),
    );
    let (stop, shutdown) = watch::channel(false);
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind tcp");
    let addr = tcp.local_addr().expect("addr");
    let unix = tokio::net::UnixListener::bind(&sock).expect("bind unix");
    let tcp_task = tokio::spawn(Arc::clone(&server).serve(tcp, shutdown.clone()));
    let unix_task = tokio::spawn(Arc::clone(&server).serve(unix, shutdown));

    let tcp_stream = tokio::net::TcpStream::connect(addr).await;
    let mut a = client_on_default_export(tcp_stream.expect("connect tcp")).await;
    let unix_stream = tokio::net::UnixStream::connect(&sock).await;
    let mut b = client_on_default_export(unix_stream.expect("connect unix")).await;
    assert_eq!(a.write_at(0, &[5; 512]).await.error, 0);
    let r = b.call(Command::Read, 0, 0, 512, &[]).await;
    assert_eq!(r.data, vec![5; 512]);
    let r = a.call(Command::Read, 0, 0, 512, &[]).await;
    assert_eq!(r.data, vec![5; 512]);
    let on_threads = server.exports()[0]
        .device
        .reads_on_connection_threads
        .load(Ordering::Relaxed);
    assert_eq!(on_threads, if threads { 2 } else { 0 });

    stop.send(true).expect("servers listening");
    let wait = Duration::from_secs(5);
    tokio::time::timeout(wait, tcp_task)
        .await
        .expect("tcp serve returned")
        .expect("no panic")
        .expect("ok");
    tokio::time::timeout(wait, unix_task)
        .await
        .expect("unix serve returned")
        .expect("no panic")
        .expect("ok");
    assert!(a.is_closed().await);
    assert!(b.is_closed().await);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn idle_handshake_times_out() {
    let limits = Limits {
        handshake_timeout: Duration::from_millis(100),
        ..Limits::default()
    };
    let server = Arc::new(Server::with_limits(
        vec![export("d", TestDevice::new(SIZE))],
        limits,
    ));
    let mut c = connect_handshaken(&server).await;
    assert!(c.client.is_closed().await);
    let err = c.server.await.expect("no panic").expect_err("timed out");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
}

#[tokio::test]
async fn absurd_limits_are_clamped() {
    let limits = Limits {
        max_connections: 0,
        max_in_flight: usize::MAX,
        max_in_flight_bytes: 0,
        reply_queue: 0,
        ..Limits::default()
    };
    let server = Arc::new(Server::with_limits(
        vec![export("d", TestDevice::new(SIZE))],
        limits,
    ));
    let mut c = connect_go(&server, true).await;
    assert_eq!(
        c.client
            .call(Command::Read, 0, 0, 1 << 20, &[])
            .await
            .data
            .len(),
        1 << 20
    );
}

/// A client that hangs up halfway through a WRITE payload, or with a request still
/// running, ends its connection with an error: counted, and handed to the hook with a
/// message that says what happened. A port probe and a clean NBD_CMD_DISC are not.
#[tokio::test]
async fn hang_ups_mid_request_are_counted_and_reported_probes_are_not() {
    let (dir, sock) = temp_socket("hangup");
    let mut dev = TestDevice::new(SIZE);
    dev.slow_read = Some((0, Duration::from_millis(300)));
    let messages = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&messages);
    let server = Arc::new(
        Server::new(vec![export("d", dev)]).on_connection_error(Box::new(move |e| {
            seen.lock().expect("messages").push(e.to_string())
        })),
    );
    let stats = server.connection_stats();
    let (stop, shutdown) = watch::channel(false);
    let unix = tokio::net::UnixListener::bind(&sock).expect("bind unix");
    let task = tokio::spawn(Arc::clone(&server).serve(unix, shutdown));
    let connect = || async {
        client_on_default_export(
            tokio::net::UnixStream::connect(&sock)
                .await
                .expect("connect"),
        )
        .await
    };

    // A probe: connect, close.
    drop(tokio::net::UnixStream::connect(&sock).await.expect("probe"));
    // Half a WRITE payload, then close.
    let mut half = connect().await;
    let hdr = RequestHeader {
        flags: 0,
        command: Command::Write,
        cookie: 1,
        offset: 4096,
        length: 4096,
    };
    half.send_raw(hdr, &[7u8; 2048]).await;
    drop(half);
    // A slow READ, then close without reading its reply.
    let mut gone = connect().await;
    gone.send(Command::Read, 0, 0, 4096, &[]).await;
    drop(gone);
    // A polite client.
    let mut polite = connect().await;
    assert_eq!(
        polite.call(Command::Read, 0, 4096, 512, &[]).await.data,
        vec![0; 512]
    );
    polite.send_disc().await;
    assert!(polite.is_closed().await);

    let errors = || stats.ended_with_error.load(Ordering::SeqCst);
    wait_until(
        Duration::from_secs(10),
        "two connections ending in error",
        async || errors() >= 2,
    )
    .await;
    // Nothing more is coming: the polite one closed before we looked.
    holds_for(Duration::from_millis(100), "two errors", || errors() == 2).await;
    assert_eq!(stats.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(stats.ended_with_error.load(Ordering::SeqCst), 2);
    let messages = messages.lock().expect("messages").clone();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("WRITE of 4096 bytes at 4096 cut short")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("hung up without NBD_CMD_DISC with 1 requests")),
        "{messages:?}"
    );
    stop.send(true).expect("server listening");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("serve returned")
        .expect("no panic")
        .expect("ok");
    let _ = std::fs::remove_dir_all(&dir);
}
