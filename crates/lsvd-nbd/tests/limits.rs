//! Bounds on what one client can make the server hold or wait for: handshake slots
//! and deadlines, the idle timeout, oversized and refused requests, the payload budget
//! shared by every connection.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::transmission::Command;
use lsvd_nbd::server::MAX_DISCARDED_PAYLOAD_BYTES;
use lsvd_nbd::{Limits, RefusalReason, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

/// A server with export "d" and `limits`, its notice lines collected.
fn server_with(limits: Limits) -> (Arc<Server<TestDevice>>, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&lines);
    let server = Server::with_limits(vec![export("d", TestDevice::new(SIZE))], limits)
        .with_notices(Arc::new(move |line: &str| {
            seen.lock().expect("lines").push(line.to_string())
        }));
    (Arc::new(server), lines)
}

/// A listening server on a Unix socket; stop it with the sender.
struct Listening {
    dir: std::path::PathBuf,
    sock: std::path::PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Listening {
    fn start(server: &Arc<Server<TestDevice>>, tag: &str) -> Listening {
        let (dir, sock) = temp_socket(tag);
        let (stop, shutdown) = watch::channel(false);
        let unix = tokio::net::UnixListener::bind(&sock).expect("bind unix");
        let task = tokio::spawn(Arc::clone(server).serve(unix, shutdown));
        Listening {
            dir,
            sock,
            stop,
            task,
        }
    }

    /// Connected, greeting read: a peer in the middle of its handshake.
    async fn half_open(&self) -> UnixStream {
        let mut s = UnixStream::connect(&self.sock).await.expect("connect");
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).await.expect("greeting");
        s
    }

    /// A client in transmission on export "d".
    async fn client(&self) -> Client<UnixStream> {
        let mut c = Client::new(UnixStream::connect(&self.sock).await.expect("connect"));
        c.handshake().await;
        c.structured_and_meta("").await;
        c.go("", &[]).await;
        c
    }

    async fn stop(self) {
        self.stop.send(true).expect("server listening");
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve returned")
            .expect("no panic")
            .expect("ok");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads until EOF or an error; how long that took, `None` if not within `limit`.
async fn closed_within<S: AsyncReadExt + Unpin>(s: &mut S, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut byte = [0u8; 1];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

/// Peers that take every handshake slot and say nothing do not make the next client
/// wait for their deadline (30 s here): it is turned away at once, counted and logged,
/// and a client already in transmission is not affected.
#[tokio::test]
async fn idle_handshakes_do_not_queue_new_clients_behind_their_deadline() {
    let (server, lines) = server_with(Limits {
        max_connections: 8,
        max_handshakes: 2,
        handshake_timeout: Duration::from_secs(30),
        ..Limits::default()
    });
    let stats = server.connection_stats();
    let l = Listening::start(&server, "lockout");
    let mut working = l.client().await;
    let idle = [l.half_open().await, l.half_open().await];
    let mut third = UnixStream::connect(&l.sock).await.expect("connect");
    let took = closed_within(&mut third, Duration::from_secs(2)).await;
    assert!(
        took.is_some(),
        "a client past the handshake slots must be turned away at once"
    );
    assert_eq!(stats.turned_away.load(Ordering::SeqCst), 1);
    let r = working.call(Command::Read, 0, 0, 4096, &[]).await;
    assert_eq!(r.error, 0, "the client in transmission goes on");
    // Once a handshake slot is free, a new client gets in.
    drop(idle);
    wait_until(
        Duration::from_secs(5),
        "a free handshake slot",
        async || {
            let mut s = UnixStream::connect(&l.sock).await.expect("connect");
            let mut greeting = [0u8; 18];
            s.read_exact(&mut greeting).await.is_ok()
        },
    )
    .await;
    let lines = lines.lock().expect("lines").clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("turned away a client") && l.contains("all 2 handshake slots")),
        "{lines:?}"
    );
    l.stop().await;
}

/// Each connection has its own handshake deadline: an idle peer is closed when its
/// own deadline passes, while another client connects and works meanwhile.
#[tokio::test]
async fn an_idle_handshake_is_closed_at_its_deadline_while_others_work() {
    let (server, _) = server_with(Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let stats = server.connection_stats();
    let l = Listening::start(&server, "hs-deadline");
    let mut idle = l.half_open().await;
    let opened = Instant::now();
    let mut other = l.client().await;
    let data = vec![7u8; 4096];
    assert_eq!(other.write_at(8192, &data).await.error, 0);
    let took = closed_within(&mut idle, Duration::from_secs(5))
        .await
        .expect("the idle handshake is closed");
    let took = took + opened.elapsed().saturating_sub(took);
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}, deadline 300 ms"
    );
    eprintln!("idle handshake closed after {took:?} (deadline 300 ms)");
    assert_eq!(stats.handshake_timeouts.load(Ordering::SeqCst), 1);
    // The other client was never disturbed.
    assert_eq!(
        other.call(Command::Read, 0, 8192, 4096, &[]).await.data,
        data
    );
    l.stop().await;
}

/// A connection in transmission that sends nothing for the idle timeout is closed;
/// one whose request is still running is not.
#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let mut dev = TestDevice::new(SIZE);
    dev.slow_read = Some((0, Duration::from_millis(700)));
    let limits = Limits {
        idle_timeout: Some(Duration::from_millis(300)),
        ..Limits::default()
    };
    let server = Arc::new(Server::with_limits(vec![export("d", dev)], limits));
    let stats = server.connection_stats();

    // A request running longer than the idle timeout keeps the connection.
    let mut busy = connect_go(&server, true).await;
    let r = busy.client.call(Command::Read, 0, 0, 4096, &[]).await;
    assert_eq!(r.error, 0, "a slow request is not idleness");

    let mut quiet = connect_go(&server, true).await;
    let started = Instant::now();
    assert!(quiet.client.is_closed().await, "idle connection closed");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}, idle timeout 300 ms"
    );
    let err = quiet
        .server
        .await
        .expect("no panic")
        .expect_err("an idle close is an error");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("idle timeout"), "{err}");
    assert!(stats.idle_timeouts.load(Ordering::SeqCst) >= 1);
    // Off: no timer at all.
    let server = Arc::new(Server::with_limits(
        vec![export("d", TestDevice::new(SIZE))],
        Limits {
            idle_timeout: None,
            ..Limits::default()
        },
    ));
    let mut c = connect_go(&server, true).await;
    let stats = server.connection_stats();
    holds_for(Duration::from_millis(400), "no connection closed", || {
        stats.ended_with_error.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(c.client.call(Command::Read, 0, 0, 512, &[]).await.error, 0);
}

/// A client that stops taking replies is closed after the idle timeout too: its
/// replies hold payload budget every connection shares.
#[tokio::test]
async fn a_client_that_takes_no_replies_is_closed() {
    let limits = Limits {
        idle_timeout: Some(Duration::from_millis(300)),
        ..Limits::default()
    };
    let server = Arc::new(Server::with_limits(
        vec![export("d", TestDevice::new(SIZE))],
        limits,
    ));
    let (stop_tx, shutdown) = watch::channel(false);
    // A small pipe: the replies fill it and the server's writer waits.
    let (client, server_end) = tokio::io::duplex(64 << 10);
    let task = tokio::spawn(Arc::clone(&server).handle_connection(server_end, shutdown));
    let mut c = client_on_default_export(client).await;
    for _ in 0..8 {
        c.send(Command::Read, 0, 0, 1 << 20, &[]).await;
    }
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the server gave up on the client")
        .expect("no panic");
    let err = result.expect_err("a stalled client is an error");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(stop_tx);
}

/// A WRITE longer than the advertised maximum (and up to what the server skips) is
/// refused with EINVAL, its payload read and dropped: the connection goes on, nothing
/// was written, and the refusal is counted and logged.
#[tokio::test]
async fn a_write_over_the_maximum_is_refused_and_the_connection_survives() {
    let (server, lines) = server_with(Limits::default());
    let stats = server.connection_stats();
    let mut c = connect_go(&server, true).await;
    let len = (32 << 20) + 512;
    let payload = vec![0xabu8; len];
    let cookie = c
        .client
        .send(Command::Write, 0, 0, len as u32, &payload)
        .await;
    let r = c.client.reply().await.expect("an answer, not a hang-up");
    assert_eq!((r.cookie, r.error), (cookie, EINVAL));
    let r = c.client.call(Command::Read, 0, 0, 4096, &[]).await;
    assert_eq!((r.error, r.data), (0, vec![0u8; 4096]));
    assert_eq!(stats.requests_refused(RefusalReason::TooLarge), 1);
    // Out of range and to be refused: the payload is skipped as well.
    let r = c.client.write_at(SIZE as u64, &[1u8; 8192]).await;
    assert_eq!(r.error, ENOSPC);
    assert_eq!(c.client.call(Command::Read, 0, 0, 512, &[]).await.error, 0);
    assert_eq!(stats.requests_refused(RefusalReason::OutOfRange), 1);
    let lines = lines.lock().expect("lines").clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("refused WRITE of 33554944 bytes at 0")
                && l.contains("maximum block size")
                && l.contains("EINVAL")),
        "{lines:?}"
    );
    // Past what the server skips: the connection is closed, and that is counted too.
    let mut c = connect_go(&server, true).await;
    let len = MAX_DISCARDED_PAYLOAD_BYTES as u32 + 512;
    c.client.send(Command::Write, 0, 0, len, &[]).await;
    assert!(c.client.is_closed().await);
    assert_eq!(stats.requests_refused(RefusalReason::TooLarge), 2);
}

/// Every refused request is counted; the log gets at most one line a second per
/// connection, and says how many it held back.
#[tokio::test]
async fn refused_requests_are_counted_and_logged_at_most_once_a_second() {
    let (server, lines) = server_with(Limits::default());
    let stats = server.connection_stats();
    let mut c = connect_go(&server, true).await;
    for i in 0..50u64 {
        let r = c.client.call(Command::Read, 0, 1 + i, 512, &[]).await;
        assert_eq!(r.error, EINVAL);
    }
    let r = c
        .client
        .call(Command::Trim, CMD_FLAG_NO_HOLE, 0, 512, &[])
        .await;
    assert_eq!(r.error, EINVAL);
    c.client.send_disc().await;
    assert!(c.client.is_closed().await);
    c.server.await.expect("no panic").expect("clean end");
    assert_eq!(stats.requests_refused(RefusalReason::Misaligned), 50);
    assert_eq!(stats.requests_refused(RefusalReason::Invalid), 1);
    let lines = lines.lock().expect("lines").clone();
    let refused: Vec<_> = lines.iter().filter(|l| l.contains("refused")).collect();
    assert!(refused.len() <= 3, "rate limit: {refused:?}");
    assert!(
        refused[0].contains("refused READ of 512 bytes at 1 from a client")
            && refused[0].contains("not aligned"),
        "{refused:?}"
    );
    // Every refusal is either a line of its own or counted in a later line.
    let mut accounted = 0;
    for line in &refused {
        if let Some(n) = line
            .strip_prefix("nbd: ")
            .and_then(|rest| rest.split_once(" more requests from "))
        {
            accounted += n.0.parse::<usize>().expect("count");
        } else {
            accounted += 1;
            if let Some((_, n)) = line.rsplit_once(" (") {
                accounted += n
                    .strip_suffix(" more like it since the last line, not logged)")
                    .map_or(0, |n| n.parse::<usize>().expect("count"));
            }
        }
    }
    assert_eq!(accounted, 51, "{refused:?}");
}

/// The server's payload budget is shared, not a deadlock: with room for one
/// maximum-size read at a time, two connections' large reads all complete.
#[tokio::test]
async fn the_server_wide_budget_is_shared_by_connections() {
    let server = Arc::new(Server::with_limits(
        vec![export("d", TestDevice::new(SIZE))],
        Limits {
            max_server_in_flight_bytes: 1,
            ..Limits::default()
        },
    ));
    assert_eq!(
        server.limits().max_server_in_flight_bytes,
        lsvd_nbd::server::MAX_PAYLOAD_BYTES
    );
    let mut a = connect_go(&server, true).await;
    let mut b = connect_go(&server, true).await;
    for _ in 0..4 {
        a.client.send(Command::Read, 0, 0, SIZE as u32, &[]).await;
        b.client.send(Command::Read, 0, 0, SIZE as u32, &[]).await;
    }
    for _ in 0..4 {
        assert_eq!(a.client.reply().await.expect("reply").error, 0);
        assert_eq!(b.client.reply().await.expect("reply").error, 0);
    }
    a.client.stream.shutdown().await.expect("shutdown");
}
