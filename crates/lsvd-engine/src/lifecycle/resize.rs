//! `lsvd resize`: changing a volume's size, as a step in its object stream.
//!
//! Why the object stream and not the metadata: the metadata is written once (its
//! put-if-absent is what creates the volume), and a size is part of the volume's
//! history like its data. A snapshot taken before a grow must keep the old size, a
//! replica must take the new size no earlier than the writes that need it, and
//! recovery must see the size change exactly where it happened among the writes. So
//! a resize is an object of its own (a version 2 object header carrying the new size,
//! docs/format/object.md), queued after every write acknowledged before the command:
//!
//! - **grow**: the object is queued, and only once it is applied (in the store, and
//!   every object before it) do reads and writes past the old end work. Until then
//!   the volume keeps its old size, and a crash leaves it there.
//! - **shrink** (only with `allow_shrink`): client I/O past the new end fails from the
//!   moment the log writer reaches the resize (writes queued before it still land);
//!   the object trims everything past the new end, so a later grow reads zeros there.
//!   A crash before the object is in the store leaves the old size and the old data.
//!
//! New NBD connections see the size the volume has when they connect; connections
//! open across a shrink get an error for I/O past the new end.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::volume::Volume;
use crate::write::writer::LogOp;
use lsvd_core::error::{Error, Result};
use lsvd_core::size::format_size;

/// What a resize did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    pub old_size_bytes: u64,
    pub new_size_bytes: u64,
}

impl Volume {
    /// Resize the volume to `new_size_bytes` (a positive multiple of 4096). Shrinking
    /// is refused (`BadInput`) unless `allow_shrink`; the data past the new end is
    /// then discarded. Returns once the new size is in the store.
    pub async fn resize(&self, new_size_bytes: u64, allow_shrink: bool) -> Result<Resized> {
        self.refuse_on_snapshot("resize the volume")?;
        let shared = &self.shared;
        if new_size_bytes == 0 || !new_size_bytes.is_multiple_of(4096) {
            return Err(Error::bad_input(format!(
                "volume size must be a positive multiple of 4096 bytes (got {new_size_bytes})"
            )));
        }
        let _one_at_a_time = shared.resizing.lock().await;
        let old_size_bytes = shared.lock().pipeline.store().volume_size_bytes;
        let resized = Resized {
            old_size_bytes,
            new_size_bytes,
        };
        if new_size_bytes == old_size_bytes {
            return Ok(resized);
        }
        if new_size_bytes < old_size_bytes && !allow_shrink {
            return Err(Error::bad_input(format!(
                "shrinking {} from {} to {} discards the last {} of its data; \
                 pass --allow-shrink to do that",
                shared.meta.name,
                format_size(old_size_bytes),
                format_size(new_size_bytes),
                format_size(old_size_bytes - new_size_bytes)
            )));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            LogOp::Resize {
                new_size_bytes,
                done: tx,
            },
            rx,
        )
        .await?;
        // The resize object is queued behind everything written before it: wait until
        // it is applied (so in the store, after all of those).
        loop {
            self.check_writable()?;
            if shared.lock().pipeline.store().volume_size_bytes == new_size_bytes {
                break;
            }
            shared.upload_wake.notify_one();
            shared.clock().sleep(Duration::from_millis(10)).await;
        }
        shared.size_bytes.store(new_size_bytes, Ordering::Release);
        lsvd_store::log::info(&format!(
            "volume {}: resized from {} to {}",
            shared.meta.name,
            format_size(old_size_bytes),
            format_size(new_size_bytes)
        ));
        Ok(resized)
    }
}
