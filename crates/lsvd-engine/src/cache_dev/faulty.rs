//! An in-memory cache device that can lose power, for crash tests.
//!
//! It keeps two images: what the running process sees (every completed write, as in
//! the page cache) and what is durable (the state as of the last `sync`), plus the
//! writes issued since that sync, in order. A simulated failure stops all I/O at once
//! and says what the device holds afterwards:
//!
//! - [`FaultyCache::process_crash`]: the process died, the machine did not. Every
//!   completed write survives (it was in the page cache).
//! - [`FaultyCache::power_fail`]: the machine lost power. Writes since the last sync
//!   are lost, except that a random subset of them may have reached the medium (in any
//!   order), and the last one may be torn: only some of its 512-byte sectors landed.
//!   With probability 1/4 every unsynced write may be torn, not just the last.
//!
//! The device is shared through an `Arc`: the engine holds it as an
//! `Arc<dyn CacheDevice>`, the test keeps its own handle to trigger the failure. After
//! a failure every read, write and sync returns an error, so the crashed engine's
//! leftover threads cannot touch the image the next incarnation opens
//! ([`FaultyCache::from_image`]).

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::CacheDevice;
use lsvd_trace::synthetic::prng::SplitMix64;

/// Sector size: the unit a torn write is applied in.
const SECTOR: usize = 512;

/// What a simulated power failure did to the unsynced writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerFailReport {
    /// Writes issued since the last sync.
    pub unsynced: usize,
    /// Of those, writes that landed whole.
    pub applied: usize,
    /// Of those, writes that landed in part (some sectors only).
    pub torn: usize,
    /// Each unsynced write as (offset, bytes, fate): 0 lost, 1 landed, 2 torn.
    pub fates: Vec<(u64, u64, u8)>,
}

struct Inner {
    /// What reads see: every completed write.
    current: Vec<u8>,
    /// What survives a power failure for certain: the state at the last sync.
    durable: Vec<u8>,
    /// Writes since the last sync, in issue order.
    unsynced: Vec<(u64, Vec<u8>)>,
    failed: bool,
    writes: u64,
    syncs: u64,
    /// Power fails when the write-or-sync counter reaches this (an armed failure).
    fail_at_io: Option<(u64, u64)>,
    /// The image left by an armed failure that has happened.
    failure: Option<(Vec<u8>, PowerFailReport)>,
}

/// What the device was asked to do, for an observer.
#[derive(Debug, Clone, Copy)]
pub enum DevEvent<'a> {
    Write {
        offset: u64,
        data: &'a [u8],
    },
    Sync,
    /// A write made durable on its own (`write_durable_at`); other writes are not.
    DurableWrite {
        offset: u64,
        data: &'a [u8],
    },
}

/// Called for every write and sync that reaches the device (not for failed ones).
pub type WriteHook = Box<dyn Fn(DevEvent<'_>) + Send + Sync>;

pub struct FaultyCache {
    inner: Mutex<Inner>,
    size_bytes: u64,
    hook: Mutex<Option<WriteHook>>,
}

/// A small deterministic generator (splitmix64), so a failure replays from its seed.
struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
}

fn failed_err() -> io::Error {
    io::Error::other("cache device has failed (simulated crash)")
}

impl FaultyCache {
    /// A zero-filled device of `size_bytes`.
    pub fn new(size_bytes: u64) -> Arc<Self> {
        Self::from_image(vec![0u8; size_bytes as usize])
    }

    /// A device holding `image`, all of it durable (a reopened device after a crash).
    pub fn from_image(image: Vec<u8>) -> Arc<Self> {
        let size_bytes = image.len() as u64;
        Arc::new(FaultyCache {
            inner: Mutex::new(Inner {
                durable: image.clone(),
                current: image,
                unsynced: Vec::new(),
                failed: false,
                writes: 0,
                syncs: 0,
                fail_at_io: None,
                failure: None,
            }),
            size_bytes,
            hook: Mutex::new(None),
        })
    }

    /// Observe every write that reaches the device (for test diagnostics).
    pub fn set_write_hook(&self, hook: WriteHook) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; a poisoned lock still has valid data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The image range of `len` bytes at `offset`; `kind` and `what` if it does not fit.
    fn span(
        &self,
        offset: u64,
        len: usize,
        kind: io::ErrorKind,
        what: &'static str,
    ) -> io::Result<Range<usize>> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.size_bytes)
            .map(|end| offset as usize..end as usize)
            .ok_or_else(|| io::Error::new(kind, what))
    }

    /// The image range a write of `len` bytes at `offset` covers; `InvalidInput` if it
    /// does not fit.
    fn write_span(&self, offset: u64, len: usize) -> io::Result<Range<usize>> {
        self.span(offset, len, io::ErrorKind::InvalidInput, "write past end")
    }

    /// The device state, for an operation that counts toward an armed failure
    /// ([`Self::tick`]): the failure's error once it has come.
    fn lock_counted(&self) -> io::Result<MutexGuard<'_, Inner>> {
        let mut g = self.lock();
        if Self::tick(&mut g) {
            return Err(failed_err());
        }
        Ok(g)
    }

    /// Tell the observer, if any. Called under the device lock, so the observer sees
    /// the device's order.
    fn observe(&self, event: DevEvent<'_>) {
        if let Some(h) = self.hook.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            h(event);
        }
    }

    /// Fail all further I/O without capturing an image.
    pub fn fail(&self) {
        self.lock().failed = true;
    }

    pub fn is_failed(&self) -> bool {
        self.lock().failed
    }

    /// Writes and syncs so far.
    pub fn counters(&self) -> (u64, u64) {
        let g = self.lock();
        (g.writes, g.syncs)
    }

    /// Writes plus syncs so far: the clock an armed failure counts on.
    pub fn ios(&self) -> u64 {
        let g = self.lock();
        g.writes + g.syncs
    }

    /// Lose power when the write-or-sync counter reaches `at_io`: that I/O and all later
    /// ones fail, and the image is kept for [`take_failure`](Self::take_failure).
    pub fn arm_power_fail(&self, at_io: u64, seed: u64) {
        self.lock().fail_at_io = Some((at_io, seed));
    }

    pub fn disarm(&self) {
        self.lock().fail_at_io = None;
    }

    /// The image left by an armed failure, if it happened.
    pub fn take_failure(&self) -> Option<(Vec<u8>, PowerFailReport)> {
        self.lock().failure.take()
    }

    /// Copies of the writes issued since the last sync (for post-mortems).
    pub fn pending_writes(&self) -> Vec<(u64, Vec<u8>)> {
        self.lock().unsynced.clone()
    }

    /// Writes issued since the last sync.
    pub fn unsynced_writes(&self) -> usize {
        self.lock().unsynced.len()
    }

    /// The process died: stop all I/O; every completed write survives. Returns the
    /// image the next incarnation sees.
    pub fn process_crash(&self) -> Vec<u8> {
        let mut g = self.lock();
        g.failed = true;
        g.current.clone()
    }

    /// The machine lost power: stop all I/O and return the image after the failure,
    /// chosen by `seed` (see the module docs).
    pub fn power_fail(&self, seed: u64) -> (Vec<u8>, PowerFailReport) {
        let mut g = self.lock();
        Self::power_fail_locked(&mut g, seed)
    }

    fn power_fail_locked(g: &mut Inner, seed: u64) -> (Vec<u8>, PowerFailReport) {
        g.failed = true;
        let mut rng = Rng(SplitMix64::new(seed ^ 0x5eed_cafe_f00d_d00d));
        let tear_any = rng.below(4) == 0;
        let mut image = g.durable.clone();
        let n = g.unsynced.len();
        let mut report = PowerFailReport {
            unsynced: n,
            ..Default::default()
        };
        for (i, (offset, data)) in g.unsynced.iter().enumerate() {
            let last = i + 1 == n;
            // 0: lost, 1: landed whole, 2: torn.
            let fate = if last || tear_any {
                rng.below(3)
            } else {
                rng.below(2)
            };
            let at = *offset as usize;
            report.fates.push((*offset, data.len() as u64, fate as u8));
            match fate {
                0 => {}
                1 => {
                    image[at..at + data.len()].copy_from_slice(data);
                    report.applied += 1;
                }
                _ => {
                    let sectors = data.len().div_ceil(SECTOR);
                    // Either a prefix of the sectors (a write cut short) or any subset
                    // (sectors reordered by the device).
                    let prefix = rng.below(2) == 0;
                    let cut = rng.below(sectors as u64 + 1) as usize;
                    for s in 0..sectors {
                        let lands = if prefix { s < cut } else { rng.below(2) == 0 };
                        if lands {
                            let from = s * SECTOR;
                            let to = (from + SECTOR).min(data.len());
                            image[at + from..at + to].copy_from_slice(&data[from..to]);
                        }
                    }
                    report.torn += 1;
                }
            }
        }
        (image, report)
    }

    /// Count one write or sync; true if it must fail (the device is dead).
    fn tick(g: &mut Inner) -> bool {
        if g.failed {
            return true;
        }
        if let Some((at, seed)) = g.fail_at_io
            && g.writes + g.syncs + 1 >= at
        {
            g.fail_at_io = None;
            let f = Self::power_fail_locked(g, seed);
            g.failure = Some(f);
            return true;
        }
        false
    }
}

impl CacheDevice for FaultyCache {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let g = self.lock();
        if g.failed {
            return Err(failed_err());
        }
        let range = self.span(
            offset,
            buf.len(),
            io::ErrorKind::UnexpectedEof,
            "read past end",
        )?;
        buf.copy_from_slice(&g.current[range]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut g = self.lock_counted()?;
        let range = self.write_span(offset, buf.len())?;
        g.current[range].copy_from_slice(buf);
        g.unsynced.push((offset, buf.to_vec()));
        g.writes += 1;
        self.observe(DevEvent::Write { offset, data: buf });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut g = self.lock_counted()?;
        let pending = std::mem::take(&mut g.unsynced);
        for (offset, data) in pending {
            let at = offset as usize;
            g.durable[at..at + data.len()].copy_from_slice(&data);
        }
        g.syncs += 1;
        self.observe(DevEvent::Sync);
        Ok(())
    }

    /// As a kernel does it (`RWF_DSYNC`): the range is written back with its newest
    /// bytes and the device's cache flushed, so this write is durable and the other
    /// unsynced writes stay as they were, except that where one of them overlaps the
    /// range, what may still land of it is the newest bytes (the page cache holds one
    /// version of a page, not the history of its writes). It counts as one write (for
    /// failure arming too), not as a sync: it made nothing else durable.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut g = self.lock_counted()?;
        let range = self.write_span(offset, buf.len())?;
        let (from, to) = (range.start, range.end);
        g.current[from..to].copy_from_slice(buf);
        g.durable[from..to].copy_from_slice(buf);
        for (at, data) in g.unsynced.iter_mut() {
            let (at, len) = (*at as usize, data.len());
            let (lo, hi) = (at.max(from), (at + len).min(to));
            if lo < hi {
                data[lo - at..hi - at].copy_from_slice(&buf[lo - from..hi - from]);
            }
        }
        g.writes += 1;
        self.observe(DevEvent::DurableWrite { offset, data: buf });
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A durable write survives power loss on its own; the unsynced writes around it
    /// may still be lost; an older unsynced write to the same place cannot land over it.
    #[test]
    fn a_durable_write_survives_power_loss_and_nothing_else_does_by_it() {
        let mut other_lost = false;
        for seed in 0..64 {
            let c = FaultyCache::new(8192);
            c.write_at(&[1u8; 1024], 0).expect("write");
            c.write_at(&[2u8; 1024], 4096).expect("write");
            c.write_durable_at(&[3u8; 512], 512).expect("durable write");
            assert_eq!(c.counters(), (3, 0), "one write, and no sync");
            let mut buf = [0u8; 1024];
            c.read_at(&mut buf, 0).expect("read");
            assert_eq!((buf[0], buf[600]), (1, 3), "reads see both writes");
            let (img, rep) = c.power_fail(seed);
            assert_eq!(
                &img[512..1024],
                &[3u8; 512][..],
                "seed {seed}: durable write"
            );
            assert!(
                img[..512].iter().all(|&b| b == 0 || b == 1),
                "seed {seed}: the older write's other half lands or not"
            );
            assert_eq!(rep.unsynced, 2, "the durable write synced no other");
            other_lost |= img[4096..5120].iter().all(|&b| b == 0);
        }
        assert!(other_lost, "a write after no sync was lost in some seed");
    }

    #[test]
    fn power_fail_keeps_synced_and_may_drop_or_tear_unsynced() {
        let (mut lost, mut landed, mut torn) = (false, false, false);
        for seed in 0..64 {
            let c = FaultyCache::new(8192);
            c.write_at(&[1u8; 512], 0).expect("write");
            c.sync().expect("sync");
            c.write_at(&[2u8; 2048], 1024).expect("write");
            let mut buf = [0u8; 4];
            c.read_at(&mut buf, 1024).expect("read");
            assert_eq!(buf, [2; 4], "reads see unsynced data");
            let (img, rep) = c.power_fail(seed);
            assert_eq!(&img[..512], &[1u8; 512][..], "synced data survives");
            assert_eq!(rep.unsynced, 1);
            let new = &img[1024..3072];
            lost |= new.iter().all(|&b| b == 0);
            landed |= new.iter().all(|&b| b == 2);
            torn |= rep.torn == 1;
            for s in new.chunks(512) {
                assert!(s.iter().all(|&b| b == s[0]), "tears at sector granularity");
            }
            assert!(c.write_at(&[0], 0).is_err(), "I/O fails after the failure");
            assert!(c.sync().is_err());
        }
        assert!(lost && landed && torn);
        let c = FaultyCache::new(4096);
        c.write_at(&[3u8; 512], 512).expect("write");
        let img = c.process_crash();
        assert_eq!(
            &img[512..1024],
            &[3u8; 512][..],
            "a process crash keeps writes"
        );
        assert!(c.read_at(&mut [0u8; 1], 0).is_err());
    }

    #[test]
    fn armed_failure_hits_the_chosen_io() {
        let c = FaultyCache::new(4096);
        c.write_at(&[1u8; 512], 0).expect("write 1");
        c.arm_power_fail(c.ios() + 2, 9);
        c.sync().expect("io 2 is fine");
        assert!(c.write_at(&[2u8; 512], 512).is_err(), "io 3 fails");
        let (img, rep) = c.take_failure().expect("failure happened");
        assert_eq!(rep.unsynced, 0);
        assert_eq!(&img[..512], &[1u8; 512][..]);
        assert_eq!(&img[512..1024], &[0u8; 512][..]);
        assert!(c.is_failed());
    }
}
