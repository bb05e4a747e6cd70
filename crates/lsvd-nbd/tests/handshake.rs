//! Handshake-phase behaviour of the server over an in-memory duplex stream.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use lsvd_nbd::BlockSizes;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::*;
use lsvd_nbd::proto::transmission::Command;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALL_FLAGS: u16 = FLAG_HAS_FLAGS
    | FLAG_SEND_FLUSH
    | FLAG_SEND_FUA
    | FLAG_SEND_TRIM
    | FLAG_SEND_WRITE_ZEROES
    | FLAG_SEND_CACHE
    | FLAG_CAN_MULTI_CONN;

#[tokio::test]
async fn go_reports_requested_infos_then_serves() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    let infos = c
        .client
        .go("second", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE])
        .await;
    assert_eq!(
        infos,
        vec![
            Info::Export {
                size: SIZE as u64,
                transmission_flags: ALL_FLAGS
            },
            Info::Name("second".into()),
            Info::Description("second disk".into()),
            Info::BlockSize(BlockSizes {
                minimum_bytes: 512,
                preferred_bytes: 4096,
                maximum_bytes: 32 << 20
            }),
        ]
    );
    let r = c.client.write_at(0, &[9; 512]).await;
    assert_eq!(r.error, 0);
    assert_eq!(server.exports()[1].device.inner.contents()[..512], [9; 512]);
    assert_eq!(server.exports()[0].device.inner.contents()[..512], [0; 512]);
}

#[tokio::test]
async fn multi_conn_only_with_global_flush() {
    let mut dev = TestDevice::new(4096);
    dev.global_flush = false;
    let server = std::sync::Arc::new(lsvd_nbd::Server::new(vec![export("d", dev)]));
    let mut c = connect_handshaken(&server).await;
    let infos = c.client.info_or_go(OPT_INFO, "d", &[]).await.expect("info");
    assert_eq!(
        infos[0],
        Info::Export {
            size: 4096,
            transmission_flags: ALL_FLAGS & !FLAG_CAN_MULTI_CONN
        }
    );
}

#[tokio::test]
async fn empty_name_is_the_first_export_and_unknown_is_refused() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    assert_eq!(
        c.client.info_or_go(OPT_GO, "nope", &[]).await,
        Err(REP_ERR_UNKNOWN)
    );
    assert_eq!(
        c.client.info_or_go(OPT_INFO, "nope", &[]).await,
        Err(REP_ERR_UNKNOWN)
    );
    let infos = c
        .client
        .info_or_go(OPT_INFO, "", &[INFO_NAME])
        .await
        .expect("info");
    assert_eq!(infos[1], Info::Name("disk".into()));
    c.client.go("", &[]).await;
    c.client.write_at(512, &[1; 512]).await;
    assert_eq!(server.exports()[0].device.inner.contents()[512], 1);
}

#[tokio::test]
async fn export_name_with_and_without_zero_padding() {
    let server = two_export_server();
    for no_zeroes in [true, false] {
        let mut c = connect(&server);
        c.client
            .handshake_with(ClientFlags {
                fixed_newstyle: true,
                no_zeroes,
            })
            .await;
        c.client.send_option(OPT_EXPORT_NAME, b"second").await;
        let mut reply = vec![0u8; if no_zeroes { 10 } else { 134 }];
        c.client
            .stream
            .read_exact(&mut reply)
            .await
            .expect("export reply");
        assert_eq!(reply[..8], (SIZE as u64).to_be_bytes());
        assert_eq!(reply[8..10], ALL_FLAGS.to_be_bytes());
        assert!(reply[10..].iter().all(|&b| b == 0));
        let r = c.client.call(Command::Read, 0, 0, 512, &[]).await;
        assert_eq!((r.error, r.data.len()), (0, 512));
    }
}

#[tokio::test]
async fn export_name_unknown_hangs_up() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    c.client.send_option(OPT_EXPORT_NAME, b"nope").await;
    assert!(c.closed().await.is_err());
}

#[tokio::test]
async fn list_exports() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    let replies = c.client.option(OPT_LIST, &[]).await;
    let mut expect = Vec::new();
    for (name, desc) in [("disk", "disk disk"), ("second", "second disk")] {
        let mut out = Vec::new();
        encode_rep_server(&mut out, OPT_LIST, name, desc);
        expect.push((REP_SERVER, out[20..].to_vec()));
    }
    expect.push((REP_ACK, vec![]));
    assert_eq!(replies, expect);
    assert_eq!(c.client.option(OPT_LIST, &[1]).await[0].0, REP_ERR_INVALID);
}

#[tokio::test]
async fn unsupported_invalid_and_policy_replies() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    assert_eq!(c.client.option(4, &[]).await[0].0, REP_ERR_UNSUP);
    assert_eq!(
        c.client.option(0xdead, &[1, 2, 3]).await[0].0,
        REP_ERR_UNSUP
    );
    assert_eq!(
        c.client.option(OPT_STARTTLS, &[]).await[0].0,
        REP_ERR_POLICY
    );
    assert_eq!(
        c.client.option(OPT_STARTTLS, &[0]).await[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(
        c.client.option(OPT_STRUCTURED_REPLY, &[0]).await[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(
        c.client.option(OPT_GO, &[0, 0, 0, 9, 0, 0]).await[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(
        c.client.option(OPT_INFO, &[0, 0]).await[0].0,
        REP_ERR_INVALID
    );
    // Still usable afterwards.
    c.client.go("", &[]).await;
}

#[tokio::test]
async fn meta_context_listing_and_selection() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    let data = meta_context_request("", &["base:allocation"]);
    // Not allowed before structured replies.
    assert_eq!(
        c.client.option(OPT_SET_META_CONTEXT, &data).await[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(
        c.client.option(OPT_STRUCTURED_REPLY, &[]).await[0].0,
        REP_ACK
    );

    let cases: [(&[&str], bool); 4] = [
        (&[], true),
        (&["base:"], true),
        (&["base:allocation"], true),
        (&["x-other:thing", "base:nope"], false),
    ];
    for (queries, listed) in cases {
        let data = meta_context_request("disk", queries);
        let replies = c.client.option(OPT_LIST_META_CONTEXT, &data).await;
        if listed {
            assert_eq!(replies.len(), 2);
            assert_eq!(replies[0].0, REP_META_CONTEXT);
            assert_eq!(
                parse_meta_context(&replies[0].1),
                Ok((0, "base:allocation".to_string()))
            );
        }
        assert_eq!(replies.last().map(|r| r.0), Some(REP_ACK));
    }

    let unknown = meta_context_request("nope", &[]);
    assert_eq!(
        c.client.option(OPT_LIST_META_CONTEXT, &unknown).await[0].0,
        REP_ERR_UNKNOWN
    );
    assert_eq!(
        c.client.option(OPT_SET_META_CONTEXT, &[0, 0, 0, 5]).await[0].0,
        REP_ERR_INVALID
    );

    // "base:" selects nothing on SET.
    let wildcard = meta_context_request("disk", &["base:"]);
    c.client.option_acked(OPT_SET_META_CONTEXT, &wildcard).await;
}

#[tokio::test]
async fn meta_context_for_another_export_does_not_enable_block_status() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    c.client.structured_and_meta("second").await;
    c.client.go("disk", &[]).await;
    let r = c.client.call(Command::BlockStatus, 0, 0, 4096, &[]).await;
    assert_eq!(r.error, EINVAL);
}

#[tokio::test]
async fn oversized_options() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    let big = vec![0u8; 100 << 10];
    assert_eq!(
        c.client.option(OPT_LIST, &big).await,
        vec![(REP_ERR_TOO_BIG, b"option data too long".to_vec())]
    );
    c.client.go("", &[]).await;

    let mut c = connect_handshaken(&server).await;
    // Announce 2 MiB but send only the header: the server must hang up, not wait.
    let mut hdr = Vec::new();
    encode_option(&mut hdr, OPT_LIST, &[]);
    hdr[12..16].copy_from_slice(&(2u32 << 20).to_be_bytes());
    c.client.stream.write_all(&hdr).await.expect("send");
    assert!(c.client.is_closed().await);
}

#[tokio::test]
async fn abort_acks_and_closes() {
    let server = two_export_server();
    let mut c = connect_handshaken(&server).await;
    c.client.option_acked(OPT_ABORT, &[]).await;
    assert!(c.closed().await.is_ok());
}

#[tokio::test]
async fn bad_client_flags_or_option_magic_close() {
    let server = two_export_server();
    let mut c = connect(&server);
    let _greeting: [u8; GREETING_LEN] = c.client.read_exactly("greeting").await;
    c.client
        .stream
        .write_all(&[0, 0, 0, 4])
        .await
        .expect("flags");
    assert!(c.client.is_closed().await);

    let mut c = connect_handshaken(&server).await;
    c.client
        .stream
        .write_all(b"IHAVEOPX\0\0\0\x03\0\0\0\0")
        .await
        .expect("send");
    assert!(c.closed().await.is_err());
}

#[tokio::test]
async fn random_handshake_bytes_never_panic() {
    let server = two_export_server();
    let mut next = xorshift(0x1234_5678_9abc_def0u64);
    for i in 0..300 {
        let c = connect(&server);
        let mut bytes = Vec::new();
        // Half the runs start with a valid prefix so option parsing gets exercised.
        if i % 2 == 0 {
            bytes.extend_from_slice(&[0, 0, 0, 3]);
            bytes.extend_from_slice(b"IHAVEOPT");
            bytes.extend_from_slice(&((next() % 12) as u32).to_be_bytes());
            bytes.extend_from_slice(&((next() % 40) as u32).to_be_bytes());
        }
        for _ in 0..(next() % 80) {
            bytes.push(next() as u8);
        }
        send_and_hang_up(c, &bytes).await;
    }
}
