//! An in-memory [`BlockDevice`]: the reference implementation of the trait.
//!
//! It exists so the server can be tested (unit tests, the `memserve` example, real NBD
//! clients) without a real disk, and so implementers of the trait have a small, complete
//! example of its contract: bounds checks, FUA/flush, trim, write-zeroes and
//! `base:allocation` block status. It tracks allocation per 4 KiB granule.
//!
//! It also keeps dirty bitmaps, the simplest form of a device's own meta contexts:
//! [`MemDevice::start_dirty_bitmap`] starts one, every write, trim or zeroing marks the
//! granules it touches in each, and the device offers each as the meta context
//! `qemu:dirty-bitmap:NAME` (as qemu-nbd does with `-B NAME`), so the server's side of
//! meta contexts is tested without lsvd's snapshots.

use std::io;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use crate::{
    AllocationExtent, BlockDevice, BlockSizes, Completion, DIRTY_BITMAP_PREFIX, STATE_DIRTY,
    STATE_HOLE, STATE_ZERO, StartOp, ZeroRequest,
};

/// Allocation is tracked in units of this many bytes.
pub const GRANULE: usize = 4096;

/// A RAM disk. All data is lost when it is dropped; `flush` only counts calls.
pub struct MemDevice {
    size: usize,
    sizes: BlockSizes,
    state: Mutex<State>,
}

struct State {
    data: Vec<u8>,
    /// One entry per granule; false means a hole that reads as zeroes.
    allocated: Vec<bool>,
    flushes: u64,
    /// Dirty bitmaps by name: one entry per granule, true once something changed it.
    bitmaps: Vec<(String, Vec<bool>)>,
}

impl State {
    /// Marks the granules `r` touches in every dirty bitmap.
    fn dirty(&mut self, r: &Range<usize>) {
        if r.is_empty() {
            return;
        }
        for (_, bits) in &mut self.bitmaps {
            bits[r.start / GRANULE..=(r.end - 1) / GRANULE].fill(true);
        }
    }
}

impl MemDevice {
    /// A zero-filled, fully unallocated device of `size` bytes with 512-byte minimum,
    /// 4 KiB preferred and 32 MiB maximum block sizes.
    pub fn new(size: usize) -> Self {
        Self::with_block_sizes(
            size,
            BlockSizes {
                minimum_bytes: 512,
                preferred_bytes: 4096,
                maximum_bytes: 32 << 20,
            },
        )
    }

    pub fn with_block_sizes(size: usize, sizes: BlockSizes) -> Self {
        MemDevice {
            size,
            sizes,
            state: Mutex::new(State {
                data: vec![0; size],
                allocated: vec![false; size.div_ceil(GRANULE)],
                flushes: 0,
                bitmaps: Vec::new(),
            }),
        }
    }

    /// A copy of the whole contents.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().data.clone()
    }

    /// How many flushes (explicit or via FUA) have happened.
    pub fn flush_count(&self) -> u64 {
        self.lock().flushes
    }

    /// Starts the dirty bitmap `name` (offered as `qemu:dirty-bitmap:NAME`), all
    /// clean: from now on it marks every granule a write, trim or zeroing touches. An
    /// existing bitmap of that name starts over.
    pub fn start_dirty_bitmap(&self, name: &str) {
        let mut st = self.lock();
        let clean = vec![false; self.size.div_ceil(GRANULE)];
        match st.bitmaps.iter_mut().find(|(n, _)| n == name) {
            Some((_, bits)) => *bits = clean,
            None => st.bitmaps.push((name.to_string(), clean)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the byte vector invalid.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn range(&self, offset: u64, length: u32) -> io::Result<Range<usize>> {
        let start = usize::try_from(offset).map_err(|_| invalid("offset too large"))?;
        let end = start
            .checked_add(length as usize)
            .ok_or_else(|| invalid("range overflows"))?;
        if end > self.size {
            return Err(invalid("range past the end of the device"));
        }
        Ok(start..end)
    }

    fn write_now(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        let length = u32::try_from(data.len()).map_err(|_| invalid("write too large"))?;
        let r = self.range(offset, length)?;
        let mut st = self.lock();
        st.data[r.clone()].copy_from_slice(&data);
        st.dirty(&r);
        if !r.is_empty() {
            for g in r.start / GRANULE..=(r.end - 1) / GRANULE {
                st.allocated[g] = true;
            }
        }
        if fua {
            st.flushes += 1;
        }
        Ok(())
    }

    fn flush_now(&self) -> io::Result<()> {
        self.lock().flushes += 1;
        Ok(())
    }

    fn trim_now(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        let r = self.range(offset, length)?;
        self.zero(r, false);
        if fua {
            self.lock().flushes += 1;
        }
        Ok(())
    }

    fn write_zeroes_now(&self, request: ZeroRequest) -> io::Result<()> {
        let r = self.range(request.offset, request.length)?;
        self.zero(r.clone(), request.no_hole);
        let mut st = self.lock();
        if request.no_hole && !r.is_empty() {
            for g in r.start / GRANULE..=(r.end - 1) / GRANULE {
                st.allocated[g] = true;
            }
        }
        if request.fua {
            st.flushes += 1;
        }
        Ok(())
    }

    /// Zeroes `r`; granules wholly inside it become holes unless `keep_allocated`.
    fn zero(&self, r: Range<usize>, keep_allocated: bool) {
        let mut st = self.lock();
        st.data[r.clone()].fill(0);
        st.dirty(&r);
        if !keep_allocated {
            let first_full = r.start.div_ceil(GRANULE);
            let end_full = if r.end == self.size {
                r.end.div_ceil(GRANULE)
            } else {
                r.end / GRANULE
            };
            for g in first_full..end_full {
                st.allocated[g] = false;
            }
        }
    }
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size as u64
    }

    fn block_sizes(&self) -> BlockSizes {
        self.sizes
    }

    fn flush_is_global(&self) -> bool {
        true
    }

    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        let r = self.range(offset, length)?;
        Ok(self.lock().data[r].to_vec())
    }

    /// Memory answers at once: reads need no task.
    fn read_now(&self, offset: u64, length: u32) -> Option<io::Result<Vec<u8>>> {
        Some(
            self.range(offset, length)
                .map(|r| self.lock().data[r].to_vec()),
        )
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.write_now(offset, data, fua)
    }

    async fn flush(&self) -> io::Result<()> {
        self.flush_now()
    }

    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.trim_now(offset, length, fua)
    }

    async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
        self.write_zeroes_now(request)
    }

    /// Everything here is done at once, so every request is answered before `start`
    /// returns (the server's completion path, exercised by every client of a
    /// `MemDevice`; the tests' wrapping device takes the task path).
    fn start(&self, op: StartOp, done: Completion) -> Result<(), (StartOp, Completion)> {
        done.complete(match op {
            StartOp::Write { offset, data, fua } => self.write_now(offset, data, fua),
            StartOp::Flush => self.flush_now(),
            StartOp::Trim {
                offset,
                length,
                fua,
            } => self.trim_now(offset, length, fua),
            StartOp::WriteZeroes(request) => self.write_zeroes_now(request),
        });
        Ok(())
    }

    async fn block_status(&self, offset: u64, length: u32) -> io::Result<Vec<AllocationExtent>> {
        let r = self.range(offset, length)?;
        let st = self.lock();
        let mut extents: Vec<AllocationExtent> = Vec::new();
        let mut pos = r.start;
        while pos < r.end {
            let g = pos / GRANULE;
            let end = ((g + 1) * GRANULE).min(r.end);
            let flags = if !st.allocated[g] {
                STATE_HOLE | STATE_ZERO
            } else if st.data[pos..end].iter().all(|&b| b == 0) {
                STATE_ZERO
            } else {
                0
            };
            let len = (end - pos) as u32; // at most GRANULE
            crate::push_extent(&mut extents, len, flags);
            pos = end;
        }
        Ok(extents)
    }

    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        self.range(offset, length).map(|_| ())
    }

    async fn meta_contexts(&self, prefix: &str) -> io::Result<Vec<String>> {
        Ok(self
            .lock()
            .bitmaps
            .iter()
            .map(|(name, _)| format!("{DIRTY_BITMAP_PREFIX}{name}"))
            .filter(|context| context.starts_with(prefix))
            .collect())
    }

    /// Granule by granule, merged: [`STATE_DIRTY`] where the bitmap is set.
    async fn meta_context_status(
        &self,
        name: &str,
        offset: u64,
        length: u32,
    ) -> io::Result<Vec<AllocationExtent>> {
        let r = self.range(offset, length)?;
        let st = self.lock();
        let bits = name
            .strip_prefix(DIRTY_BITMAP_PREFIX)
            .and_then(|bitmap| st.bitmaps.iter().find(|(n, _)| n == bitmap))
            .map(|(_, bits)| bits)
            .ok_or_else(|| invalid("no such meta context"))?;
        let mut extents: Vec<AllocationExtent> = Vec::new();
        let mut pos = r.start;
        while pos < r.end {
            let g = pos / GRANULE;
            let end = ((g + 1) * GRANULE).min(r.end);
            let flags = if bits[g] { STATE_DIRTY } else { 0 };
            let len = (end - pos) as u32; // at most GRANULE
            crate::push_extent(&mut extents, len, flags);
            pos = end;
        }
        Ok(extents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn write_read_trim_zero_status() {
        block_on(async {
            let d = MemDevice::new(4 * GRANULE);
            assert_eq!(
                d.block_status(0, 4 * GRANULE as u32).await.expect("status"),
                vec![AllocationExtent {
                    length_bytes: 16384,
                    flags: STATE_HOLE | STATE_ZERO
                }]
            );
            d.write(GRANULE as u64, vec![7; 512], false)
                .await
                .expect("write");
            assert_eq!(
                d.read(GRANULE as u64, 512).await.expect("read"),
                vec![7; 512]
            );
            assert_eq!(
                d.block_status(0, 16384).await.expect("status"),
                vec![
                    AllocationExtent {
                        length_bytes: 4096,
                        flags: 3
                    },
                    AllocationExtent {
                        length_bytes: 4096,
                        flags: 0
                    },
                    AllocationExtent {
                        length_bytes: 8192,
                        flags: 3
                    },
                ]
            );
            d.write_zeroes(ZeroRequest {
                offset: GRANULE as u64,
                length: 4096,
                fua: true,
                no_hole: true,
            })
            .await
            .expect("zero");
            assert_eq!(
                d.block_status(4096, 4096).await.expect("status")[0].flags,
                STATE_ZERO
            );
            d.trim(0, 16384, false).await.expect("trim");
            assert_eq!(d.block_status(0, 16384).await.expect("status").len(), 1);
            assert_eq!(d.flush_count(), 1);
            assert!(d.read(16384, 1).await.is_err());
            assert!(d.read(u64::MAX, 1).await.is_err());
        });
    }

    /// A bitmap marks what changed after it started, by granule: writes, trims and
    /// zeroing alike; starting it again cleans it; other bitmaps go on.
    #[test]
    fn dirty_bitmaps_mark_what_changed_since_they_started() {
        block_on(async {
            let d = MemDevice::new(8 * GRANULE);
            let g = GRANULE as u64;
            d.write(0, vec![1; 2 * GRANULE], false)
                .await
                .expect("write");
            assert!(d.meta_contexts("").await.expect("list").is_empty());
            d.start_dirty_bitmap("a");
            d.write(g + 512, vec![2; 512], false).await.expect("write");
            d.trim(3 * g, GRANULE as u32, false).await.expect("trim");
            d.start_dirty_bitmap("b");
            d.write_zeroes(ZeroRequest {
                offset: 6 * g,
                length: GRANULE as u32,
                fua: false,
                no_hole: true,
            })
            .await
            .expect("zero");
            let ext = |granules: u32, flags| AllocationExtent {
                length_bytes: granules * GRANULE as u32,
                flags,
            };
            let all = 8 * GRANULE as u32;
            assert_eq!(
                d.meta_context_status("qemu:dirty-bitmap:a", 0, all)
                    .await
                    .expect("status"),
                vec![
                    ext(1, 0),
                    ext(1, STATE_DIRTY),
                    ext(1, 0),
                    ext(1, STATE_DIRTY),
                    ext(2, 0),
                    ext(1, STATE_DIRTY),
                    ext(1, 0),
                ]
            );
            assert_eq!(
                d.meta_context_status("qemu:dirty-bitmap:b", 0, all)
                    .await
                    .expect("status"),
                vec![ext(6, 0), ext(1, STATE_DIRTY), ext(1, 0)]
            );
            assert_eq!(
                d.meta_contexts("qemu:dirty-bitmap:").await.expect("list"),
                vec!["qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b"]
            );
            assert!(d.meta_contexts("qemu:x").await.expect("list").is_empty());
            d.start_dirty_bitmap("a");
            assert_eq!(
                d.meta_context_status("qemu:dirty-bitmap:a", 0, all)
                    .await
                    .expect("status"),
                vec![ext(8, 0)]
            );
            assert!(
                d.meta_context_status("qemu:dirty-bitmap:c", 0, all)
                    .await
                    .is_err()
            );
            assert!(
                d.meta_context_status("qemu:dirty-bitmap:a", 0, all + 1)
                    .await
                    .is_err()
            );
        });
    }
}
