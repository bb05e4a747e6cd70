//! Transmission-phase behaviour: commands, validation errors, replies, concurrency.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::transmission::{Command, RequestHeader};
use lsvd_nbd::{AllocationExtent, STATE_HOLE, STATE_ZERO, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn write_read_with_simple_and_structured_replies() {
    for structured in [false, true] {
        let server = two_export_server();
        let mut c = connect_go(&server, structured).await;
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            c.client
                .call(Command::Write, CMD_FLAG_FUA, 4096, 8192, &data)
                .await
                .error,
            0
        );
        let r = c.client.call(Command::Read, 0, 4096, 8192, &[]).await;
        assert_eq!((r.error, r.structured), (0, structured));
        assert_eq!(r.data, data);
        assert_eq!(server.exports()[0].device.inner.flush_count(), 1);
        // Zero-length requests succeed without touching the device.
        assert_eq!(c.client.call(Command::Read, 0, 0, 0, &[]).await.error, 0);
        assert_eq!(c.client.call(Command::Write, 0, 0, 0, &[]).await.error, 0);
    }
}

#[tokio::test]
async fn flush_trim_zeroes_cache() {
    let server = two_export_server();
    let mut c = connect_go(&server, true).await;
    let dev = &server.exports()[0].device.inner;
    c.client.write_at(0, &[7; 8192]).await;
    assert_eq!(c.client.call(Command::Flush, 0, 0, 0, &[]).await.error, 0);
    assert_eq!(dev.flush_count(), 1);
    assert_eq!(
        c.client
            .call(Command::Trim, CMD_FLAG_FUA, 0, 4096, &[])
            .await
            .error,
        0
    );
    assert_eq!(
        c.client
            .call(Command::WriteZeroes, CMD_FLAG_NO_HOLE, 4096, 512, &[])
            .await
            .error,
        0
    );
    assert_eq!(
        c.client.call(Command::Cache, 0, 0, 8192, &[]).await.error,
        0
    );
    let contents = dev.contents();
    assert!(contents[..4608].iter().all(|&b| b == 0));
    assert!(contents[4608..8192].iter().all(|&b| b == 7));
}

#[tokio::test]
async fn block_status_base_allocation() {
    let server = two_export_server();
    let mut c = connect_go(&server, true).await;
    c.client.write_at(8192, &[1; 4096]).await;
    let r = c.client.call(Command::BlockStatus, 0, 0, 65536, &[]).await;
    assert_eq!(r.error, 0);
    let hole = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        r.extents,
        vec![
            AllocationExtent {
                length_bytes: 8192,
                flags: hole
            },
            AllocationExtent {
                length_bytes: 4096,
                flags: 0
            },
            AllocationExtent {
                length_bytes: 65536 - 12288,
                flags: hole
            },
        ]
    );
    let r = c
        .client
        .call(Command::BlockStatus, CMD_FLAG_REQ_ONE, 4096, 65536, &[])
        .await;
    assert_eq!(
        r.extents,
        vec![AllocationExtent {
            length_bytes: 4096,
            flags: hole
        }]
    );
    assert_eq!(
        c.client
            .call(Command::BlockStatus, 0, SIZE as u64, 512, &[])
            .await
            .error,
        EINVAL
    );
}

#[tokio::test]
async fn validation_errors_keep_the_connection_usable() {
    for structured in [false, true] {
        let server = two_export_server();
        let mut c = connect_go(&server, structured).await;
        let end = SIZE as u64;
        let cases: Vec<(Command, u16, u64, u32, u32)> = vec![
            (Command::Read, 0, end, 512, EINVAL),
            (Command::Read, 0, u64::MAX - 100, 512, EINVAL),
            (Command::Read, 0, 100, 512, EINVAL),
            (Command::Read, 0, 0, 100, EINVAL),
            (Command::Read, 0, 0, (32 << 20) + 512, EINVAL),
            (Command::Read, CMD_FLAG_DF, 0, 512, EINVAL),
            (Command::Trim, 0, end - 512, 1024, EINVAL),
            (Command::WriteZeroes, 0, end, 512, ENOSPC),
            (Command::WriteZeroes, CMD_FLAG_FAST_ZERO, 0, 512, EINVAL),
            (Command::Cache, CMD_FLAG_REQ_ONE, 0, 512, EINVAL),
            (Command::Unknown(99), 0, 0, 0, EINVAL),
        ];
        for (cmd, flags, offset, length, error) in cases {
            let r = c.client.call(cmd, flags, offset, length, &[]).await;
            assert_eq!(r.error, error, "{cmd:?} flags {flags} at {offset}+{length}");
            assert_eq!(r.structured, structured);
            assert!(r.data.is_empty());
            if structured {
                assert!(!r.message.is_empty());
            }
        }
        // Refused writes still have their payload consumed.
        for (flags, offset, error) in [
            (0, end, ENOSPC),
            (0, 1, EINVAL),
            (CMD_FLAG_NO_HOLE, 0, EINVAL),
        ] {
            let r = c
                .client
                .call(Command::Write, flags, offset, 512, &[1; 512])
                .await;
            assert_eq!(r.error, error, "WRITE flags {flags} at {offset}");
        }
        // Without a negotiated context (simple mode) BLOCK_STATUS is refused.
        if !structured {
            assert_eq!(
                c.client
                    .call(Command::BlockStatus, 0, 0, 512, &[])
                    .await
                    .error,
                EINVAL
            );
        }
        let r = c.client.call(Command::Read, 0, 0, 512, &[]).await;
        assert_eq!((r.error, r.data.len()), (0, 512));
        assert!(
            server.exports()[0]
                .device
                .inner
                .contents()
                .iter()
                .all(|&b| b == 0)
        );
    }
}

#[tokio::test]
async fn device_errors_are_mapped() {
    let server = two_export_server();
    let dev = &server.exports()[0].device;
    for structured in [false, true] {
        let mut c = connect_go(&server, structured).await;
        for (kind, error) in [
            (io::ErrorKind::InvalidInput, EINVAL),
            (io::ErrorKind::StorageFull, ENOSPC),
            (io::ErrorKind::Unsupported, ENOTSUP),
            (io::ErrorKind::PermissionDenied, EPERM),
            (io::ErrorKind::BrokenPipe, ESHUTDOWN),
            (io::ErrorKind::Other, EIO),
        ] {
            *dev.fail_with.lock().expect("lock") = Some(kind);
            let write_payload = [1; 512];
            for (command, length, payload) in [
                (Command::Read, 512, &[][..]),
                (Command::Write, 512, &write_payload[..]),
                (Command::Flush, 0, &[][..]),
            ] {
                let r = c.client.call(command, 0, 0, length, payload).await;
                assert_eq!(r.error, error, "{command:?} failing with {kind:?}");
            }
            if structured {
                let r = c.client.call(Command::BlockStatus, 0, 0, 512, &[]).await;
                assert_eq!(r.error, error);
                assert!(r.message.contains("injected failure"));
            }
        }
        *dev.fail_with.lock().expect("lock") = None;
        assert_eq!(c.client.call(Command::Read, 0, 0, 512, &[]).await.error, 0);
    }
}

#[tokio::test]
async fn replies_come_back_out_of_order() {
    let mut dev = TestDevice::new(SIZE);
    dev.slow_read = Some((0, Duration::from_millis(300)));
    let server = Arc::new(Server::new(vec![export("d", dev)]));
    for structured in [false, true] {
        let mut c = connect_go(&server, structured).await;
        let slow = c.client.send(Command::Read, 0, 0, 4096, &[]).await;
        let fast = c.client.send(Command::Read, 0, 4096, 4096, &[]).await;
        let write = c.client.send(Command::Write, 0, 8192, 512, &[3; 512]).await;
        let first = c.client.reply().await.expect("reply");
        let second = c.client.reply().await.expect("reply");
        let third = c.client.reply().await.expect("reply");
        assert_ne!(first.cookie, slow);
        assert_ne!(second.cookie, slow);
        assert_eq!(third.cookie, slow);
        let mut early = [first.cookie, second.cookie];
        early.sort();
        assert_eq!(early, [fast, write]);
        assert_eq!(third.data.len(), 4096);
    }
}

#[tokio::test]
async fn many_requests_in_flight_beyond_the_limit() {
    let server = two_export_server();
    let c = connect_go(&server, true).await;
    let (mut rd, mut wr) = tokio::io::split(c.client.stream);
    // 1000 pipelined writes then reads: more than the 128 in-flight limit.
    let sender = tokio::spawn(async move {
        for i in 0..1000u64 {
            let hdr = RequestHeader {
                flags: 0,
                command: Command::Write,
                cookie: i,
                offset: (i % 256) * 4096,
                length: 4096,
            };
            wr.write_all(&hdr.encode()).await.expect("send");
            wr.write_all(&[i as u8; 4096]).await.expect("send");
        }
        wr
    });
    let mut seen = vec![false; 1000];
    for _ in 0..1000 {
        let mut h = [0u8; 16];
        rd.read_exact(&mut h).await.expect("reply");
        let (error, cookie) =
            lsvd_nbd::proto::transmission::parse_simple_reply(&h).expect("simple reply");
        assert_eq!(error, 0);
        assert!(!seen[cookie as usize]);
        seen[cookie as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
    drop(sender.await.expect("sender"));
}

/// The reader takes requests out of a read buffer: headers and payloads that arrive
/// split at any byte, several requests in one read, and payloads larger than the buffer
/// must all come out intact, each answered exactly once.
#[tokio::test]
async fn pipelined_requests_split_at_odd_boundaries() {
    const COUNT: u64 = 40;
    const STRIDE: u64 = 128 << 10;
    let server = Arc::new(Server::new(vec![export("d", TestDevice::new(8 << 20))]));
    let c = connect_go(&server, false).await;
    let sizes = [512usize, 4096, 100 << 10, 1536];
    let payload = |i: u64| -> Vec<u8> {
        let len = sizes[i as usize % sizes.len()];
        (0..len).map(|b| (b as u64 * 31 + i * 7) as u8).collect()
    };
    let mut stream = Vec::new();
    for i in 0..COUNT {
        let data = payload(i);
        let hdr = RequestHeader {
            flags: 0,
            command: Command::Write,
            cookie: 1000 + i,
            offset: i * STRIDE,
            length: data.len() as u32,
        };
        stream.extend_from_slice(&hdr.encode());
        stream.extend_from_slice(&data);
    }
    let (mut rd, mut wr) = tokio::io::split(c.client.stream);
    let sender = tokio::spawn(async move {
        // Chunk sizes that cut headers and payloads everywhere, and join requests.
        let chunks = [1usize, 5, 27, 28, 29, 4095, 70_000, 3, 200_000];
        let mut at = 0;
        let mut k = 0;
        while at < stream.len() {
            let n = chunks[k % chunks.len()].min(stream.len() - at);
            wr.write_all(&stream[at..at + n]).await.expect("send");
            wr.flush().await.expect("flush");
            tokio::task::yield_now().await;
            at += n;
            k += 1;
        }
        wr
    });
    let mut seen = vec![false; COUNT as usize];
    for _ in 0..COUNT {
        let mut h = [0u8; 16];
        rd.read_exact(&mut h).await.expect("reply");
        let (error, cookie) =
            lsvd_nbd::proto::transmission::parse_simple_reply(&h).expect("simple reply");
        assert_eq!(error, 0);
        let i = cookie.checked_sub(1000).expect("known cookie") as usize;
        assert!(!seen[i], "cookie {cookie} answered twice");
        seen[i] = true;
    }
    let wr = sender.await.expect("sender");
    let mut client = common::Client::new(rd.unsplit(wr));
    for i in 0..COUNT {
        let want = payload(i);
        let r = client
            .call(Command::Read, 0, i * STRIDE, want.len() as u32, &[])
            .await;
        assert_eq!(r.error, 0);
        assert!(r.data == want, "request {i} read back different data");
    }
}

/// Longer than the server skips to refuse a write (`MAX_DISCARDED_PAYLOAD_BYTES`):
/// the spec's hard disconnect. (Shorter ones are refused: tests/limits.rs.)
#[tokio::test]
async fn absurd_write_length_closes_the_connection() {
    let server = two_export_server();
    let mut c = connect_go(&server, false).await;
    let len = lsvd_nbd::server::MAX_DISCARDED_PAYLOAD_BYTES as u32 + 512;
    c.client.send(Command::Write, 0, 0, len, &[]).await;
    assert!(c.closed().await.is_err());
}

#[tokio::test]
async fn random_transmission_bytes_never_panic() {
    let server = two_export_server();
    let mut next = xorshift(0x0BAD_CAFE_F00D_u64);
    for _ in 0..200 {
        let c = connect_go(&server, next().is_multiple_of(2)).await;
        let mut bytes = Vec::new();
        for _ in 0..(next() % 4) {
            // Mostly well-framed headers with random fields, so validation is exercised.
            let hdr = RequestHeader {
                flags: (next() % 32) as u16,
                command: Command::from_u16((next() % 9) as u16),
                cookie: next(),
                offset: next() % (2 * SIZE as u64),
                length: (next() % 70000) as u32,
            };
            bytes.extend_from_slice(&hdr.encode());
            if hdr.command == Command::Write {
                bytes.extend(std::iter::repeat_n(
                    0u8,
                    (next() % (u64::from(hdr.length) + 1)) as usize,
                ));
            }
        }
        for _ in 0..(next() % 64) {
            bytes.push(next() as u8);
        }
        send_and_hang_up(c, &bytes).await;
    }
}
