//! Requests a device takes with `BlockDevice::start` and answers through a
//! `Completion`: from another thread, only at `unplug`, or never (the completion is
//! dropped: the client gets EIO, not silence). A device that declines a request gets
//! it again through its async method.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io;
use std::sync::{Arc, Mutex};

use common::*;
use lsvd_nbd::mem_device::MemDevice;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::transmission::Command;
use lsvd_nbd::{BlockDevice, BlockSizes, Completion, Server, StartOp, ZeroRequest};

/// A device that queues what it is started and runs it at `unplug`, on a thread of
/// its own; it drops writes to `lost_at` unanswered and declines trims.
struct QueueingDevice {
    inner: Arc<MemDevice>,
    queued: Mutex<Vec<(StartOp, Completion)>>,
    lost_at: u64,
    unplugs: std::sync::atomic::AtomicU64,
}

impl QueueingDevice {
    fn new() -> Self {
        QueueingDevice {
            inner: Arc::new(MemDevice::new(SIZE)),
            queued: Mutex::new(Vec::new()),
            lost_at: 8192,
            unplugs: Default::default(),
        }
    }
}

impl BlockDevice for QueueingDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }
    fn flush_is_global(&self) -> bool {
        true
    }
    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.inner.read(offset, length).await
    }
    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.inner.write(offset, data, fua).await
    }
    async fn flush(&self) -> io::Result<()> {
        self.inner.flush().await
    }
    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.inner.trim(offset, length, fua).await
    }
    async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
        self.inner.write_zeroes(request).await
    }
    async fn block_status(
        &self,
        offset: u64,
        length: u32,
    ) -> io::Result<Vec<lsvd_nbd::AllocationExtent>> {
        self.inner.block_status(offset, length).await
    }
    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        self.inner.cache(offset, length).await
    }
    fn start(&self, op: StartOp, done: Completion) -> Result<(), (StartOp, Completion)> {
        if let StartOp::Trim { .. } = op {
            return Err((op, done));
        }
        self.queued.lock().expect("lock").push((op, done));
        Ok(())
    }
    fn unplug(&self) {
        self.unplugs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let queued = std::mem::take(&mut *self.queued.lock().expect("lock"));
        let (inner, lost_at) = (self.inner.clone(), self.lost_at);
        std::thread::spawn(move || {
            for (op, done) in queued {
                match op {
                    StartOp::Write { offset, .. } if offset == lost_at => drop(done),
                    op => {
                        let r = match op {
                            StartOp::Write { offset, data, fua } => {
                                futures_block_on(inner.write(offset, data, fua))
                            }
                            StartOp::Flush => futures_block_on(inner.flush()),
                            StartOp::WriteZeroes(request) => {
                                futures_block_on(inner.write_zeroes(request))
                            }
                            StartOp::Trim { .. } => unreachable!("declined"),
                        };
                        done.complete(r);
                    }
                }
            }
        });
    }
}

/// MemDevice's futures never wait: poll once.
fn futures_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("MemDevice never waits"),
    }
}

fn server() -> Arc<Server<QueueingDevice>> {
    Arc::new(Server::new(vec![lsvd_nbd::Export {
        name: "disk".to_string(),
        description: String::new(),
        device: Arc::new(QueueingDevice::new()),
    }]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_started_in_a_burst_are_answered_after_one_unplug() {
    let server = server();
    let mut c = connect_go(&server, true).await;
    // A burst the server reads at once: all started, then one unplug runs them.
    let mut cookies = Vec::new();
    for i in 0..16u64 {
        let data = vec![i as u8 + 1; 4096];
        cookies.push(
            c.client
                .send(Command::Write, 0, i * 4096 + 65536, 4096, &data)
                .await,
        );
    }
    cookies.push(c.client.send(Command::Flush, 0, 0, 0, &[]).await);
    let mut answered = Vec::new();
    for _ in 0..cookies.len() {
        let r = c.client.reply().await.expect("reply");
        assert_eq!(r.error, 0, "{r:?}");
        answered.push(r.cookie);
    }
    answered.sort_unstable();
    assert_eq!(answered, cookies);
    let dev = &server.exports()[0].device;
    let unplugs = dev.unplugs.load(std::sync::atomic::Ordering::Relaxed);
    assert!((1..=17).contains(&unplugs), "{unplugs} unplugs");
    let r = c
        .client
        .call(Command::Read, 0, 65536 + 5 * 4096, 4096, &[])
        .await;
    assert_eq!(r.data, vec![6; 4096]);
    assert_eq!(dev.inner.flush_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_completion_answers_eio_and_a_declined_request_runs_anyway() {
    let server = server();
    let mut c = connect_go(&server, true).await;
    let r = c.client.write_at(8192, &[9; 4096]).await;
    assert_eq!(r.error, EIO, "the device dropped it: {r:?}");
    assert!(r.message.contains("without answering"), "{r:?}");
    // The connection goes on.
    assert_eq!(c.client.write_at(0, &[5; 4096]).await.error, 0);
    assert_eq!(
        c.client.call(Command::Trim, 0, 0, 4096, &[]).await.error,
        0,
        "a declined TRIM runs through the async method"
    );
    let r = c.client.call(Command::Read, 0, 0, 4096, &[]).await;
    assert_eq!(r.data, vec![0; 4096]);
}

/// The client hangs up with requests started and not yet unplugged: they still run
/// (the session unplugs whatever ended it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_started_before_a_disconnect_still_run() {
    let server = server();
    let mut c = connect_go(&server, false).await;
    c.client
        .send(Command::Write, 0, 12288, 4096, &[3; 4096])
        .await;
    let reply = c.client.disc_behind_one_in_flight().await;
    assert_eq!(reply.error, 0);
    c.server.await.expect("join").expect("clean end");
    let dev = &server.exports()[0].device;
    assert_eq!(&dev.inner.contents()[12288..16384], &[3; 4096][..]);
}
