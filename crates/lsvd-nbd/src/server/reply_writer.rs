//! The writer task of a connection: replies go to the socket in queue order, batched
//! into as few writes as the queue allows, and only while the device may answer.
//!
//! The device's right to answer (lsvd's lease on a volume another host can take over)
//! is checked twice. Before a batch is written, to decide what it says: successes, or
//! each reply turned into the device's error. And right before every write and flush
//! syscall, through [`AnswerGuard`]: a reply larger than the socket's buffer goes out
//! in several writes with waits for the client in between, and a process paused
//! during such a wait (SIGSTOP, a VM freeze) must not finish sending a success once it
//! runs again after another host took the volume over. A reply cannot be turned into
//! an error half way through, so a guard that finds the right gone ends the
//! connection: the client sees it closed, never a complete success. What is left is
//! the few instructions between the last check and the syscall.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::{self, error::TryRecvError};

use super::ConnectionStats;
use super::deadline::within;
use super::reply::{Reply, refused};
use crate::BlockDevice;

/// A batch is sent once it holds this much; a reply with more data than this goes out
/// on its own, without being copied into the batch.
const BATCH_BYTES: usize = 64 << 10;

/// The writer task: writes replies in queue order into a buffer and hands the buffer to
/// the socket only when no more replies are ready, so that bursts of small replies share
/// one syscall. When the queue looks empty it first yields once: the tasks whose
/// completions arrived together (one group commit answers many writes) then queue their
/// replies before the flush, instead of each reply costing its own `send`. A client
/// that takes no reply for `stall_limit` (the idle timeout) ends the connection: its
/// replies hold payload budget the server's other clients share.
///
/// Right before a batch goes to the socket the device is asked whether it may answer
/// at all ([`BlockDevice::answerable`]); if not, every reply of the batch goes out as
/// that error instead. Asked then, not when each request finished: a process paused
/// in between (lsvd's lease lapsed and another host took the volume over) must not
/// send answers decided before the pause once it runs again.
pub(super) async fn write_replies<W: AsyncWrite + Unpin, D: BlockDevice>(
    mut rx: mpsc::Receiver<Reply>,
    writer: W,
    stall_limit: Option<Duration>,
    stats: Arc<ConnectionStats>,
    (device, structured): (Arc<D>, bool),
) -> io::Result<()> {
    let stalled = || {
        stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
        format!(
            "the client took no reply for {} ms (the idle timeout): closed",
            stall_limit.unwrap_or_default().as_millis()
        )
    };
    let mut out = ReplyBatch {
        writer: AnswerGuard::new(writer, &*device),
        batch: Vec::with_capacity(BATCH_BYTES),
        held: Vec::new(),
        structured,
        stall_limit,
        stalled,
    };
    let mut next = rx.recv().await;
    while let Some(reply) = next {
        if reply.data.len() > BATCH_BYTES {
            // Large data: what is batched first, then this reply on its own.
            out.send().await?;
            out.send_alone(reply).await?;
        } else {
            reply.header.encode(reply.data.len(), &mut out.batch);
            out.batch.extend_from_slice(&reply.data);
            out.held.push(reply);
            if out.batch.len() >= BATCH_BYTES {
                out.send().await?;
            }
        }
        next = match rx.try_recv() {
            Ok(reply) => Some(reply),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => {
                tokio::task::yield_now().await;
                match rx.try_recv() {
                    Ok(reply) => Some(reply),
                    Err(TryRecvError::Disconnected) => None,
                    Err(TryRecvError::Empty) => {
                        out.send_and_flush().await?;
                        rx.recv().await
                    }
                }
            }
        };
    }
    out.send_and_flush().await?;
    out.writer.inner.shutdown().await
}

/// The writer task's socket with the replies batched for it: `batch` holds the encoded
/// `held` replies (their budgets are released once it is sent).
struct ReplyBatch<'a, W, D, S> {
    writer: AnswerGuard<'a, W, D>,
    batch: Vec<u8>,
    held: Vec<Reply>,
    structured: bool,
    stall_limit: Option<Duration>,
    /// Counts an idle timeout and says what happened.
    stalled: S,
}

impl<W: AsyncWrite + Unpin, D: BlockDevice, S: Fn() -> String> ReplyBatch<'_, W, D, S> {
    /// Send the batched replies, or, if the device may not answer now, each of them as
    /// that error.
    async fn send(&mut self) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let answerable = self.writer.device.answerable().await;
        if let Err(e) = &answerable {
            self.batch.clear();
            for reply in self.held.iter() {
                refused(reply, self.structured, e)
                    .header
                    .encode(0, &mut self.batch);
            }
        }
        // Refusals go out whatever the device says (and so does the flush after
        // them); successes only while it may answer.
        self.writer.armed = answerable.is_ok();
        within(
            self.stall_limit,
            self.writer.write_all(&self.batch),
            &self.stalled,
        )
        .await?;
        self.batch.clear();
        self.held.clear();
        Ok(())
    }

    /// Send `reply` on its own, without copying its data into the batch (which must be
    /// empty).
    async fn send_alone(&mut self, reply: Reply) -> io::Result<()> {
        let answerable = self.writer.device.answerable().await;
        let reply = match &answerable {
            Ok(()) => reply,
            Err(e) => refused(&reply, self.structured, e),
        };
        let (limit, stalled) = (self.stall_limit, &self.stalled);
        // The batch is empty: it holds the header.
        reply.header.encode(reply.data.len(), &mut self.batch);
        self.writer.armed = answerable.is_ok();
        let sent = within(limit, self.writer.write_all(&self.batch), stalled).await;
        self.batch.clear();
        sent?;
        within(limit, self.writer.write_all(&reply.data), stalled).await
    }

    /// Send the batch and flush the socket: nothing more is ready for now.
    async fn send_and_flush(&mut self) -> io::Result<()> {
        self.send().await?;
        within(self.stall_limit, self.writer.flush(), &self.stalled).await
    }
}

/// The socket as answers reach it: while `armed`, every write and flush (a TLS stream
/// sends what it buffered when flushed) first makes sure the device may answer. At
/// once while it may (`BlockDevice::may_answer_now`, no allocation); otherwise it waits
/// for [`BlockDevice::answerable`], and fails the write with its error, which ends
/// the connection.
struct AnswerGuard<'a, W, D> {
    inner: W,
    device: &'a D,
    /// Off while refusals are written, and for the flush after them: an error may
    /// always be sent. Set for each batch.
    armed: bool,
    /// The wait for the device, kept across polls.
    waiting: Option<Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>>,
}

impl<'a, W, D: BlockDevice> AnswerGuard<'a, W, D> {
    fn new(inner: W, device: &'a D) -> Self {
        AnswerGuard {
            inner,
            device,
            armed: true,
            waiting: None,
        }
    }

    /// Ready with Ok once the device may answer (at once when not armed); with an
    /// error when it may not.
    fn poll_answerable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.armed {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(wait) = self.waiting.as_mut() {
                let answer = ready!(wait.as_mut().poll(cx));
                self.waiting = None;
                return Poll::Ready(answer.map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "the device may no longer answer while a reply was being sent \
                             (it cannot be taken back): connection closed: {e}"
                        ),
                    )
                }));
            }
            if self.device.may_answer_now() {
                return Poll::Ready(Ok(()));
            }
            let device: &'a D = self.device;
            self.waiting = Some(Box::pin(device.answerable()));
        }
    }
}

impl<W: AsyncWrite + Unpin, D: BlockDevice> AsyncWrite for AnswerGuard<'_, W, D> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_answerable(cx))?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_answerable(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::mem_device::MemDevice;
    use crate::server::reply::read_reply;
    use crate::{BlockSizes, ZeroRequest};

    /// A device whose right to answer the test takes away.
    struct Gated {
        inner: MemDevice,
        may_answer: AtomicBool,
    }

    impl BlockDevice for Gated {
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
            Ok(())
        }
        async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
            self.inner.trim(offset, length, fua).await
        }
        async fn block_status(
            &self,
            offset: u64,
            length: u32,
        ) -> io::Result<Vec<crate::AllocationExtent>> {
            self.inner.block_status(offset, length).await
        }
        async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
            self.inner.write_zeroes(request).await
        }
        async fn cache(&self, _offset: u64, _length: u32) -> io::Result<()> {
            Ok(())
        }
        fn may_answer_now(&self) -> bool {
            self.may_answer.load(Ordering::SeqCst)
        }
        async fn answerable(&self) -> io::Result<()> {
            if self.may_answer_now() {
                Ok(())
            } else {
                Err(io::Error::other("fenced"))
            }
        }
    }

    /// A writer task replying through a socket of `buffer_bytes` to the returned client
    /// end, for a device that may answer or not.
    #[allow(clippy::type_complexity)]
    fn writer_to_client(
        may_answer: bool,
        buffer_bytes: usize,
    ) -> (
        Arc<Gated>,
        mpsc::Sender<Reply>,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let device = Arc::new(Gated {
            inner: MemDevice::new(1 << 20),
            may_answer: AtomicBool::new(may_answer),
        });
        let (client, server) = tokio::io::duplex(buffer_bytes);
        let (tx, rx) = mpsc::channel(4);
        let writer = tokio::spawn(write_replies(
            rx,
            server,
            None,
            Arc::new(ConnectionStats::default()),
            (device.clone(), false),
        ));
        (device, tx, client, writer)
    }

    /// Regression test for the window `takeover_sigstop` found (episode seed
    /// 0xf5e17413e8054a5c, crash point 1: "READ blocks 100..157 succeeded (answered
    /// t=1777, resumed t=1776)"): a 232 KiB READ reply, checked once before its first
    /// byte, waited for room in the socket; the holder was paused there, and once
    /// resumed after the takeover it sent the rest, so the client got a whole success
    /// from a fenced server. Now each write asks again, and the connection ends.
    #[tokio::test]
    async fn a_reply_cut_off_by_a_lost_lease_is_never_completed() {
        // A socket buffer far smaller than the reply.
        let (device, tx, mut client, writer) = writer_to_client(true, 16 << 10);
        let data = vec![7u8; 232 << 10];
        let reply_bytes = 16 + data.len();
        tx.send(read_reply(42, false, 0, data))
            .await
            .expect("queue");
        // Nothing else is queued: without the guard the writer would finish this
        // reply and end, so the test cannot hang waiting for more.
        drop(tx);
        // The client takes the header and some data; the writer waits for room.
        let mut got = vec![0u8; 32 << 10];
        client.read_exact(&mut got).await.expect("the reply starts");
        tokio::task::yield_now().await;
        // The lease is lost while the writer waits (a pause, then a takeover).
        device.may_answer.store(false, Ordering::SeqCst);
        let mut rest = Vec::new();
        client
            .read_to_end(&mut rest)
            .await
            .expect("read to the end");
        let sent = writer.await.expect("join");
        assert!(
            got.len() + rest.len() < reply_bytes,
            "the whole reply ({reply_bytes} bytes) went out after the device lost the right to answer"
        );
        let e = sent.expect_err("the connection ends");
        assert!(e.to_string().contains("fenced"), "{e}");
    }

    /// Refusals go out while the device may not answer, and successes that were
    /// queued become those refusals.
    #[tokio::test]
    async fn replies_queued_when_the_lease_is_gone_are_refused() {
        let (_device, tx, mut client, writer) = writer_to_client(false, 1 << 20);
        tx.send(read_reply(7, false, 0, vec![1u8; 4096]))
            .await
            .expect("queue");
        tx.send(read_reply(8, false, 0, vec![1u8; 128 << 10]))
            .await
            .expect("queue");
        drop(tx);
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.expect("read");
        writer
            .await
            .expect("join")
            .expect("the writer ends cleanly");
        // Two simple replies of 16 bytes, each with an error and no data.
        assert_eq!(all.len(), 32, "{all:?}");
        for (i, cookie) in [7u64, 8].into_iter().enumerate() {
            let r = &all[i * 16..(i + 1) * 16];
            assert_ne!(u32::from_be_bytes(r[4..8].try_into().expect("4")), 0);
            assert_eq!(u64::from_be_bytes(r[8..16].try_into().expect("8")), cookie);
        }
    }
}
