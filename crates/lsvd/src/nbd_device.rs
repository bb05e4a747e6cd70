//! Serving a volume over NBD: the `BlockDevice` implementation.
//!
//! The NBD server speaks `io::Error`; every engine error goes through
//! `From<crate::error::Error> for io::Error`, whose kind mapping decides the errno the
//! client sees (EINVAL for bad requests, ESHUTDOWN while shutting down, EIO for the
//! rest).
//!
//! `lsvd serve` runs each connection on a thread of its own (`lsvd_nbd`'s connection
//! threads). The engine's async work (reads that go to the store, read-ahead, the
//! tasks they spawn, the store client's connections) stays on the runtime the volume
//! was opened on: a connection's runtime ends with the connection. So the async
//! methods below run there ([`NbdVolume::on_engine`]); writes, flushes and trims are
//! started and appended on the connection's thread (`start`, `unplug`).

use std::future::Future;
use std::io;
use std::sync::Arc;

use lsvd_nbd::{
    AllocationExtent, BlockDevice, BlockSizes, Completion, STATE_HOLE, STATE_ZERO, StartOp,
};

use crate::engine::Volume;

/// Largest request we accept; clients learn it from NBD_INFO_BLOCK_SIZE.
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

pub struct NbdVolume {
    pub volume: Arc<Volume>,
    max_request_bytes: u32,
    /// The runtime the volume was opened on, where its async work runs.
    engine: tokio::runtime::Handle,
}

impl NbdVolume {
    /// Must be called on the runtime that opened `volume` (its async work runs there).
    pub fn new(volume: Arc<Volume>, log_capacity_bytes: u64) -> Self {
        // A request must fit in one log record, which may use at most half the log
        // (a snapshot export writes nothing: only reads are bounded).
        let limit = if volume.snapshot_name().is_some() {
            MAX_REQUEST_BYTES
        } else {
            (log_capacity_bytes / 4).min(MAX_REQUEST_BYTES as u64) as u32
        };
        let max_request_bytes = if limit.is_power_of_two() {
            limit
        } else {
            limit.next_power_of_two() / 2
        };
        NbdVolume {
            volume,
            max_request_bytes: max_request_bytes.max(1 << 20),
            engine: tokio::runtime::Handle::current(),
        }
    }

    /// Run `work` on the engine's runtime: here if this is one of its threads,
    /// otherwise (a connection thread) as a task there, whose answer comes back.
    async fn on_engine<T, F>(&self, work: impl FnOnce(Arc<Volume>) -> F) -> io::Result<T>
    where
        F: Future<Output = io::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let work = work(Arc::clone(&self.volume));
        if !lsvd_nbd::server::on_connection_thread() {
            return work.await;
        }
        self.engine
            .spawn(work)
            .await
            .unwrap_or_else(|e| Err(io::Error::other(format!("engine task failed: {e}"))))
    }
}

impl BlockDevice for NbdVolume {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_bytes: self.max_request_bytes,
        }
    }

    fn read_only(&self) -> bool {
        self.volume.snapshot_name().is_some()
    }

    fn flush_is_global(&self) -> bool {
        // One log writer serves every connection, so a FLUSH covers all of them.
        true
    }

    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        let warn = move |volume: &Volume, e: &crate::error::Error| {
            // The client only sees an errno: say why here.
            crate::log::warn(&format!(
                "{}: read of {length} bytes at {offset} failed: {e}",
                volume.meta().name
            ));
        };
        // Local data (the log, the read cache) is read right here, on any thread.
        if let Some(r) = self.volume.read_local(offset, length as u64) {
            if let Err(e) = &r {
                warn(&self.volume, e);
            }
            return Ok(r?);
        }
        self.on_engine(move |volume| async move {
            let r = volume.read(offset, length as u64).await;
            if let Err(e) = &r {
                warn(&volume, e);
            }
            Ok(r?)
        })
        .await
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.on_engine(move |volume| async move { Ok(volume.write(offset, data, fua).await?) })
            .await
    }

    async fn flush(&self) -> io::Result<()> {
        self.on_engine(|volume| async move { Ok(volume.flush().await?) })
            .await
    }

    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.on_engine(move |volume| async move {
            Ok(volume.write_zeroes(offset, length as u64, fua).await?)
        })
        .await
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
    ) -> io::Result<()> {
        let chunk = self.max_request_bytes as u64;
        self.on_engine(move |volume| async move {
            if !no_hole {
                return Ok(volume.write_zeroes(offset, length as u64, fua).await?);
            }
            // The client wants the range allocated: write real zeros, in bounded pieces.
            let end = offset + length as u64;
            let mut at = offset;
            while at < end {
                let n = chunk.min(end - at);
                volume.write(at, vec![0u8; n as usize], false).await?;
                at += n;
            }
            if fua {
                volume.flush().await?;
            }
            Ok(())
        })
        .await
    }

    async fn block_status(&self, offset: u64, length: u32) -> io::Result<Vec<AllocationExtent>> {
        let runs = self.volume.allocation(offset, length as u64)?;
        Ok(runs
            .into_iter()
            .map(|(bytes, allocated)| AllocationExtent {
                length_bytes: bytes as u32,
                flags: if allocated {
                    0
                } else {
                    STATE_HOLE | STATE_ZERO
                },
            })
            .collect())
    }

    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        // Reading pulls the range's object chunks into the read cache.
        self.on_engine(move |volume| async move {
            volume.read(offset, length as u64).await?;
            Ok(())
        })
        .await
    }

    /// Writes, flushes and trims are queued for the next `unplug`, which appends them
    /// as one group commit (`engine::started`) and answers the client when it retires.
    /// A WRITE_ZEROES that must stay allocated writes real zeros in pieces: it takes
    /// the task path.
    fn start(&self, op: StartOp, done: Completion) -> Result<(), (StartOp, Completion)> {
        if let StartOp::WriteZeroes { no_hole: true, .. } = op {
            return Err((op, done));
        }
        let answer: crate::engine::Answer =
            Box::new(move |r: crate::error::Result<()>| done.complete(r.map_err(io::Error::from)));
        match op {
            StartOp::Write { offset, data, fua } => {
                self.volume.start_write(offset, data, fua, answer)
            }
            StartOp::Flush => self.volume.start_flush(answer),
            StartOp::Trim {
                offset,
                length,
                fua,
            }
            | StartOp::WriteZeroes {
                offset,
                length,
                fua,
                ..
            } => self
                .volume
                .start_write_zeroes(offset, u64::from(length), fua, answer),
        }
        Ok(())
    }

    /// On a connection thread the append (and a FLUSH's `fdatasync`) happens right
    /// here: the thread serves this connection alone.
    fn unplug(&self) {
        if lsvd_nbd::server::on_connection_thread() {
            self.volume.unplug_on_own_thread();
        } else {
            self.volume.unplug();
        }
    }
}
