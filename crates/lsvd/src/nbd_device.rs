//! Serving a volume over NBD: the `BlockDevice` implementation.
//!
//! The NBD server speaks `io::Error`; every engine error goes through
//! `From<crate::error::Error> for io::Error`, whose kind mapping decides the errno the
//! client sees (EINVAL for bad requests, ESHUTDOWN while shutting down, EIO for the
//! rest).

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
}

impl NbdVolume {
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
        }
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
        let r = self.volume.read(offset, length as u64).await;
        if let Err(e) = &r {
            // The client only sees an errno: say why here.
            crate::log::warn(&format!(
                "{}: read of {length} bytes at {offset} failed: {e}",
                self.volume.meta().name
            ));
        }
        Ok(r?)
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        Ok(self.volume.write(offset, data, fua).await?)
    }

    async fn flush(&self) -> io::Result<()> {
        Ok(self.volume.flush().await?)
    }

    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        Ok(self.volume.write_zeroes(offset, length as u64, fua).await?)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
    ) -> io::Result<()> {
        if !no_hole {
            return Ok(self.volume.write_zeroes(offset, length as u64, fua).await?);
        }
        // The client wants the range allocated: write real zeros, in bounded pieces.
        let chunk = self.max_request_bytes as u64;
        let end = offset + length as u64;
        let mut at = offset;
        while at < end {
            let n = chunk.min(end - at);
            self.volume.write(at, vec![0u8; n as usize], false).await?;
            at += n;
        }
        if fua {
            self.volume.flush().await?;
        }
        Ok(())
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
        self.volume.read(offset, length as u64).await?;
        Ok(())
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

    fn unplug(&self) {
        self.volume.unplug();
    }
}
