//! Heap allocations per request in steady state (issue 45): a counting global
//! allocator counts every allocation of the process while a client keeps 4 KiB WRITEs
//! and READs in flight against a `MemDevice`. The server may allocate only the data
//! buffers the `BlockDevice` API passes by value (a WRITE's payload, a READ's data):
//! no reply header, task, boxed future or completion per request.
//!
//! This binary has the counting allocator to itself (one test, so nothing else runs
//! meanwhile); the client reads and writes through buffers it allocated up front.

// Tests run real sockets in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use lsvd_nbd::mem_device::MemDevice;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::transmission::*;
use lsvd_nbd::{Export, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator, only counting. `GlobalAlloc`
// is an unsafe trait: a counting allocator cannot be written without it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const BLOCK_BYTES: usize = 4096;
/// Requests in flight at once.
const DEPTH: usize = 16;

/// `rounds` rounds of `DEPTH` WRITEs (all sent, then every reply read), then `DEPTH`
/// READs of the same blocks, each checked.
async fn run(conn: &mut Conn, rounds: u64, first_round: u64, out: &mut Vec<u8>, reply: &mut [u8]) {
    let blocks = (SIZE / BLOCK_BYTES) as u64;
    for round in first_round..first_round + rounds {
        for command in [CMD_WRITE, CMD_READ] {
            out.clear();
            for i in 0..DEPTH as u64 {
                let block = (round * DEPTH as u64 + i) % blocks;
                let hdr = RequestHeader {
                    flags: 0,
                    command: Command::from_u16(command),
                    cookie: i,
                    offset: block * BLOCK_BYTES as u64,
                    length: BLOCK_BYTES as u32,
                };
                out.extend_from_slice(&hdr.encode());
                if command == CMD_WRITE {
                    out.extend(std::iter::repeat_n((round as u8) ^ (i as u8), BLOCK_BYTES));
                }
            }
            conn.client.stream.write_all(out).await.expect("send");
            for _ in 0..DEPTH {
                let head = &mut reply[..SIMPLE_REPLY_HEADER_LEN];
                conn.client.stream.read_exact(head).await.expect("reply");
                assert_eq!(head[4..8], [0; 4], "no error");
                if command == CMD_READ {
                    let data = &mut reply[..BLOCK_BYTES];
                    conn.client.stream.read_exact(data).await.expect("data");
                    assert!(data.iter().all(|&b| b == data[0]), "one write's bytes");
                }
            }
        }
    }
}

#[tokio::test]
async fn steady_state_requests_allocate_only_their_data_buffers() {
    let server = Arc::new(Server::new(vec![Export {
        name: "disk".to_string(),
        description: "disk".to_string(),
        device: Arc::new(MemDevice::new(SIZE)),
    }]));
    let mut conn = connect_go(&server, false).await;
    let mut out = Vec::with_capacity(DEPTH * (REQUEST_HEADER_LEN + BLOCK_BYTES));
    let mut reply = vec![0u8; BLOCK_BYTES];
    // Warm up: buffers, queues and the duplex pipe grow to their working size.
    run(&mut conn, 100, 0, &mut out, &mut reply).await;
    let rounds = 1000;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    run(&mut conn, rounds, 100, &mut out, &mut reply).await;
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let requests = rounds * 2 * DEPTH as u64;
    let per_request = allocations as f64 / requests as f64;
    println!("{allocations} allocations for {requests} requests: {per_request:.3} per request");
    // One data buffer per request (a WRITE's payload, a READ's data), and a little
    // for the reply queue's blocks, which tokio allocates now and then.
    assert!(
        per_request <= 1.05,
        "{per_request:.3} allocations per request ({allocations} for {requests})"
    );
    drop(conn.stop);
}
