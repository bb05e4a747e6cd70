//! Meta contexts a device offers besides `base:allocation` (`qemu:dirty-bitmap:NAME`
//! here, from `MemDevice`'s dirty bitmaps): listing and selecting them, context ids,
//! and BLOCK_STATUS answering one chunk per selected context, each as a strict client
//! (libnbd, qemu) checks it.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::parse_meta_context;
use lsvd_nbd::proto::transmission::Command;
use lsvd_nbd::server::MAX_REPLY_EXTENTS;
use lsvd_nbd::{AllocationExtent, BlockDevice, STATE_DIRTY, STATE_HOLE, STATE_ZERO};

const SNAP: &str = "qemu:dirty-bitmap:snap";

/// The (id, name) pairs an option's replies name, and whether it ended in ACK.
fn named(replies: &[(u32, Vec<u8>)]) -> (Vec<(u32, String)>, bool) {
    let contexts = replies
        .iter()
        .filter(|(ty, _)| *ty == REP_META_CONTEXT)
        .map(|(_, data)| parse_meta_context(data).expect("valid meta context reply"))
        .collect();
    (contexts, replies.last().map(|r| r.0) == Some(REP_ACK))
}

/// A server whose default export "disk" has data at 0..8 KiB written before bitmap
/// `snap` started and, after, a write at 64 KiB and a trim of 4..8 KiB.
async fn server_with_snapshot() -> std::sync::Arc<lsvd_nbd::Server<TestDevice>> {
    let server = two_export_server();
    let dev = &server.exports()[0].device;
    dev.write(0, vec![1; 8192], false).await.expect("write");
    dev.inner.start_dirty_bitmap("snap");
    dev.inner.start_dirty_bitmap("other");
    dev.write(65536, vec![2; 4096], false).await.expect("write");
    dev.trim(4096, 4096, false).await.expect("trim");
    server
}

#[tokio::test]
async fn dirty_bitmaps_are_listed_by_namespace_and_selected_by_name() {
    let server = server_with_snapshot().await;
    let mut c = connect_handshaken(&server).await;
    c.client.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
    let list = |queries: &[&str]| meta_context_request("disk", queries);
    let both = vec![
        (0, "qemu:dirty-bitmap:snap".to_string()),
        (0, "qemu:dirty-bitmap:other".to_string()),
    ];
    for query in ["qemu:", "qemu:dirty-bitmap:"] {
        let replies = c
            .client
            .option(OPT_LIST_META_CONTEXT, &list(&[query]))
            .await;
        assert_eq!(named(&replies), (both.clone(), true), "{query}");
        // Wildcards list; they select nothing.
        let replies = c.client.option(OPT_SET_META_CONTEXT, &list(&[query])).await;
        assert_eq!(named(&replies), (vec![], true), "{query}");
    }
    let replies = c.client.option(OPT_LIST_META_CONTEXT, &list(&[])).await;
    let mut everything = vec![(0, META_CONTEXT_BASE_ALLOCATION.to_string())];
    everything.extend(both);
    assert_eq!(named(&replies), (everything, true));

    // An unknown snapshot selects nothing, without an error; BLOCK_STATUS then has no
    // context to answer for.
    let replies = c
        .client
        .option(OPT_SET_META_CONTEXT, &list(&["qemu:dirty-bitmap:nope"]))
        .await;
    assert_eq!(named(&replies), (vec![], true));

    // Both contexts, with ids of their own.
    let replies = c
        .client
        .option(OPT_SET_META_CONTEXT, &list(&["base:allocation", SNAP]))
        .await;
    assert_eq!(
        named(&replies),
        (
            vec![
                (1, META_CONTEXT_BASE_ALLOCATION.to_string()),
                (2, SNAP.to_string())
            ],
            true
        )
    );
    c.client.go("disk", &[]).await;
    let r = c.client.call(Command::BlockStatus, 0, 0, 131072, &[]).await;
    assert_eq!(r.error, 0);
    let ext = |length_bytes, flags| AllocationExtent {
        length_bytes,
        flags,
    };
    let hole = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        r.contexts,
        vec![
            (
                1,
                vec![
                    ext(4096, 0),
                    ext(61440, hole),
                    ext(4096, 0),
                    ext(61440, hole)
                ]
            ),
            (
                2,
                vec![
                    ext(4096, 0),
                    ext(4096, STATE_DIRTY),
                    ext(57344, 0),
                    ext(4096, STATE_DIRTY),
                    ext(61440, 0)
                ]
            ),
        ],
        "one chunk per context, base:allocation first, the done flag on the last"
    );
}

#[tokio::test]
async fn a_dirty_bitmap_alone_answers_with_its_own_id() {
    let server = server_with_snapshot().await;
    let mut c = connect_handshaken(&server).await;
    c.client.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
    let replies = c
        .client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_context_request("", &["qemu:dirty-bitmap:other"]),
        )
        .await;
    assert_eq!(
        named(&replies),
        (vec![(2, "qemu:dirty-bitmap:other".to_string())], true)
    );
    c.client.go("", &[]).await;
    let r = c
        .client
        .call(Command::BlockStatus, CMD_FLAG_REQ_ONE, 65536, 65536, &[])
        .await;
    assert_eq!(
        r.contexts,
        vec![(
            2,
            vec![AllocationExtent {
                length_bytes: 4096,
                flags: STATE_DIRTY
            }]
        )]
    );
    assert!(r.extents.is_empty(), "no base:allocation chunk");
}

#[tokio::test]
async fn a_selection_for_another_export_or_an_unknown_name_allows_no_block_status() {
    let server = server_with_snapshot().await;
    for (export, query) in [("second", SNAP), ("disk", "qemu:dirty-bitmap:nope")] {
        let mut c = connect_handshaken(&server).await;
        c.client.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
        let data = meta_context_request(export, &[query]);
        c.client.option(OPT_SET_META_CONTEXT, &data).await;
        c.client.go("disk", &[]).await;
        let r = c.client.call(Command::BlockStatus, 0, 0, 4096, &[]).await;
        assert_eq!(r.error, EINVAL, "{export} {query}");
    }
}

/// What libnbd and qemu check of each context's chunk: it is there, its extents are
/// non-empty, they start at the request's offset (implicitly) and add up to no more
/// than the request (nor past the export's end), one alone for REQ_ONE, and no more
/// than the server's maximum. Random writes, trims and requests.
#[tokio::test]
async fn every_chunk_is_what_a_strict_client_expects() {
    let server = server_with_snapshot().await;
    let mut c = connect_handshaken(&server).await;
    c.client.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
    let data = meta_context_request("", &[SNAP, "base:allocation", "qemu:dirty-bitmap:other"]);
    let replies = c.client.option(OPT_SET_META_CONTEXT, &data).await;
    assert_eq!(named(&replies).0.len(), 3);
    c.client.go("", &[]).await;
    let mut rng = xorshift(7);
    let size = SIZE as u64;
    for round in 0..300 {
        let offset = rng() % (size / 512) * 512;
        let length = ((rng() % ((size - offset) / 512)) + 1) * 512;
        let length = length as u32;
        match round % 3 {
            0 => {
                let n = length.min(65536);
                c.client.write_at(offset, &vec![3; n as usize]).await;
            }
            1 => {
                let r = c.client.call(Command::Trim, 0, offset, length, &[]).await;
                assert_eq!(r.error, 0);
            }
            _ => {}
        }
        let req_one = rng().is_multiple_of(4);
        let flags = if req_one { CMD_FLAG_REQ_ONE } else { 0 };
        let r = c
            .client
            .call(Command::BlockStatus, flags, offset, length, &[])
            .await;
        assert_eq!(r.error, 0);
        let ids: Vec<u32> = r.contexts.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![1, 2, 3], "a chunk per context, in order");
        for (id, extents) in &r.contexts {
            assert!(!extents.is_empty(), "context {id}: no extents");
            assert!(extents.len() <= MAX_REPLY_EXTENTS);
            if req_one {
                assert_eq!(extents.len(), 1, "context {id}: REQ_ONE");
            }
            assert!(extents.iter().all(|e| e.length_bytes > 0));
            let sum: u64 = extents.iter().map(|e| u64::from(e.length_bytes)).sum();
            assert!(sum <= u64::from(length), "context {id}: {sum} > {length}");
            let known = if *id == 1 {
                STATE_HOLE | STATE_ZERO
            } else {
                STATE_DIRTY
            };
            assert!(extents.iter().all(|e| e.flags & !known == 0));
        }
    }
}
