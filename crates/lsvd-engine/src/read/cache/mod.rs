//! The read cache: object data on the local SSD, apart from the write log.
//!
//! Fixed-size chunks (64 KiB of an object's data section) in a preallocated file of
//! slots, found through an in-memory index. Two ways in:
//!
//! - a read miss fetches whole chunks (more than the request: cheap prefetch) and
//!   caches them ([`ReadCache::insert`] for the chunks the client asked for,
//!   [`ReadCache::prefetch`] for the rest of the fetch and for read-ahead);
//! - an uploaded object's data, which was local anyway, is *admitted* when the store is
//!   remote ([`ReadCache::admit`]), so reads of recently written data after it left the
//!   write log need no GET. Admission takes free slots first (free space displaces
//!   nothing); in a full cache, admitted chunks nobody has read yet may displace read
//!   data only while they hold less than half of it, and past that admission replaces
//!   the oldest of them. Admission never evicts a chunk clients read recently (one
//!   whose CLOCK reference bit is set).
//!   Prefetched chunks (fetched before any client asked for them) follow the same
//!   rules: speculation never evicts data clients read.
//!
//! Concurrent misses on one chunk share one GET through the table of chunks in flight
//! ([`inflight`]).
//!
//! Chunks clients read are evicted by CLOCK (a read sets the reference bit; the hand
//! clears it once before evicting).
//!
//! Entries are keyed by object and chunk, never by LBA. Objects are immutable, so a
//! cached chunk can never hold a stale version of a block: a newer write points the
//! map at a different object and the old chunk is simply not consulted again.
//!
//! Every slot is described by an entry in a slot table beside the cache file
//! ([`slot_table`]; format: docs/format/read-cache.md): the chunk it holds and an
//! XXH3-64 hash of each of its 4 KiB blocks. An insert writes the slot, then its entry;
//! a hit reads only the 4 KiB blocks it needs and checks each against its hash. So the
//! index survives a crash as well as a clean stop without any ordering between the two
//! writes: after a crash, a slot whose data and entry do not match (one of the two
//! writes was lost) fails its hashes and is dropped on first use. Nothing needs the
//! object's header on a hit.

pub(crate) mod inflight;
mod slot_table;
pub(crate) mod streams;
#[cfg(test)]
mod tests;
pub(crate) mod walk;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lsvd_core::VolumeId;

use crate::cache_dev::CacheDevice;
use slot_table::{BLOCK_BYTES, BLOCKS_PER_SLOT, Entry, SlotTable};

pub const READ_CACHE_CHUNK_BYTES: u64 = 64 << 10;

/// Which object a cached chunk belongs to: its sequence number and the epoch it was
/// written under (both in its name), so no two objects ever share an entry, whatever
/// a crash or a superseded writer left in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CacheObject {
    pub seq: u64,
    pub epoch: u64,
}

impl CacheObject {
    pub(crate) fn new(seq: u64, epoch: u64) -> CacheObject {
        CacheObject { seq, epoch }
    }
}

type Key = (CacheObject, u64); // (object, chunk index)

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Key,
    len: u32,
    hashes: [u64; BLOCKS_PER_SLOT],
    referenced: bool,
    /// Written by upload admission or prefetch and not read since.
    admitted: bool,
    /// Prefetched and not read since (counted as a prefetch hit when first read).
    prefetched: bool,
}

#[derive(Debug, Clone, Copy)]
enum SlotState {
    Free,
    /// Being written by one insert: nobody else may pick it.
    Writing,
    Used(Slot),
}

#[derive(Debug, Default)]
struct Index {
    map: HashMap<Key, u32>,
    slots: Vec<SlotState>,
    /// Every `Free` slot, once each: a slot leaves `Free` only by being taken from here.
    free: Vec<u32>,
    hand: usize,
    /// Admitted slots, oldest first: (slot, key), pruned lazily (a slot that was read,
    /// evicted or reused since no longer matches) and compacted when stale entries
    /// outnumber the slots, so it stays bounded.
    admitted: VecDeque<(u32, Key)>,
    admitted_count: usize,
}

/// How far admission looks past the CLOCK hand for a chunk nobody read recently.
const ADMIT_SCAN_SLOTS: usize = 64;

impl Index {
    /// An index of `slot_count` free slots.
    fn with_slots(slot_count: usize) -> Index {
        Index {
            slots: vec![SlotState::Free; slot_count],
            free: (0..slot_count as u32).rev().collect(),
            ..Index::default()
        }
    }

    /// Drop slot `s`'s chunk from the index; the slot is the caller's to fill (it is
    /// neither free nor used until the caller says).
    fn take(&mut self, s: usize) {
        if let SlotState::Used(old) = self.slots[s] {
            self.map.remove(&old.key);
            if old.admitted {
                self.admitted_count -= 1;
            }
        }
        self.slots[s] = SlotState::Writing;
    }

    /// Drop slot `s`'s chunk from the index and free the slot.
    fn evict(&mut self, s: usize) {
        if let SlotState::Used(_) = self.slots[s] {
            self.take(s);
            self.release(s);
        }
    }

    /// Slot `s`, taken and not filled, is free again.
    fn release(&mut self, s: usize) {
        self.slots[s] = SlotState::Free;
        self.free.push(s as u32);
    }

    /// A free slot, if any.
    fn pop_free(&mut self) -> Option<usize> {
        let s = self.free.pop()? as usize;
        debug_assert!(matches!(self.slots[s], SlotState::Free));
        self.slots[s] = SlotState::Writing;
        Some(s)
    }

    /// A slot for a chunk a client read: a free one, or CLOCK's victim.
    fn victim_for_read(&mut self) -> Option<usize> {
        if let Some(s) = self.pop_free() {
            return Some(s);
        }
        let n = self.slots.len();
        for _ in 0..2 * n {
            let h = self.hand;
            self.hand = (h + 1) % n;
            match &mut self.slots[h] {
                SlotState::Used(s) if s.referenced => s.referenced = false,
                SlotState::Used(_) => {
                    self.take(h);
                    return Some(h);
                }
                SlotState::Free | SlotState::Writing => {}
            }
        }
        None
    }

    /// A slot for an uploaded or prefetched chunk: a free slot; else, past the
    /// admission cap, the oldest admitted chunk; else one holding nothing read
    /// recently, found without clearing anyone's reference bit (admission must not age
    /// read data).
    fn victim_for_admission(&mut self) -> Option<usize> {
        if let Some(s) = self.pop_free() {
            return Some(s);
        }
        let n = self.slots.len();
        if self.admitted_count >= n / 2 {
            return self.oldest_admitted();
        }
        for i in 0..ADMIT_SCAN_SLOTS.min(n) {
            let h = (self.hand + i) % n;
            // Read data nobody touched since the hand last passed; admitted chunks go
            // oldest first (below), not by position.
            if matches!(self.slots[h], SlotState::Used(s) if !s.referenced && !s.admitted) {
                self.take(h);
                self.hand = (h + 1) % n;
                return Some(h);
            }
        }
        self.oldest_admitted()
    }

    fn oldest_admitted(&mut self) -> Option<usize> {
        while let Some((slot, key)) = self.admitted.pop_front() {
            if let SlotState::Used(s) = self.slots[slot as usize]
                && s.admitted
                && s.key == key
            {
                self.take(slot as usize);
                return Some(slot as usize);
            }
        }
        None
    }

    /// Drop the stale entries of the admitted queue once they outnumber the slots.
    fn compact_admitted(&mut self) {
        if self.admitted.len() <= self.slots.len() + self.admitted_count {
            return;
        }
        let slots = &self.slots;
        self.admitted.retain(|&(slot, key)| {
            matches!(slots[slot as usize], SlotState::Used(s) if s.admitted && s.key == key)
        });
    }

    fn place(&mut self, slot: usize, entry: &Entry, mode: PutMode) {
        let key = (entry.object, entry.chunk);
        let admitted = mode != PutMode::Read;
        self.slots[slot] = SlotState::Used(Slot {
            key,
            len: entry.len,
            hashes: entry.hashes,
            referenced: false,
            admitted,
            prefetched: mode == PutMode::Prefetch,
        });
        self.map.insert(key, slot as u32);
        if admitted {
            self.admitted.push_back((slot as u32, key));
            self.admitted_count += 1;
            self.compact_admitted();
        }
    }
}

/// Why a chunk is put in the cache, which decides what it may evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PutMode {
    /// A client asked for it: CLOCK.
    Read,
    /// Uploaded data: admission rules.
    Admit,
    /// Fetched ahead of any client: admission rules, and counted when first read.
    Prefetch,
}

pub(crate) struct ReadCache {
    dev: Arc<dyn CacheDevice>,
    table: SlotTable,
    index: Mutex<Index>,
    /// Chunks being fetched now (concurrent misses share one GET).
    pub(crate) inflight: Arc<inflight::InFlight>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Chunks of uploaded objects admitted.
    pub admitted_chunks: AtomicU64,
    /// Bytes of prefetched chunks cached (fetched before a client asked for them).
    pub prefetched_bytes: AtomicU64,
    /// Bytes of prefetched chunks a client then read (each chunk counted once).
    pub prefetch_hit_bytes: AtomicU64,
    /// Sequential readers seen lately (read-ahead).
    streams: Mutex<streams::Streams>,
    /// The object the latest reads landed in (temporal read-ahead).
    object_walk: Mutex<walk::ObjectWalk>,
    /// Bytes of read-ahead windows being fetched (bounded by the read-ahead size).
    pub(crate) ahead_in_flight_bytes: AtomicU64,
    /// Bytes read-ahead fetched.
    pub read_ahead_bytes: AtomicU64,
    /// Of those, bytes temporal read-ahead fetched (the next data of an object).
    pub temporal_ahead_bytes: AtomicU64,
}

impl ReadCache {
    /// A cache of `dev`'s slots described by the slot table on `table_dev`: warm with
    /// whatever the table holds for `volume` (a table of another volume, or of another
    /// size, starts empty).
    pub fn open(
        dev: Arc<dyn CacheDevice>,
        table_dev: Arc<dyn CacheDevice>,
        volume: VolumeId,
    ) -> io::Result<Self> {
        let slot_count = (dev.size_bytes() / READ_CACHE_CHUNK_BYTES) as usize;
        let (table, entries) = SlotTable::open(table_dev, volume, slot_count)?;
        let mut index = Index::with_slots(slot_count);
        let mut placed = vec![false; slot_count];
        for (slot, entry) in entries {
            if !index.map.contains_key(&(entry.object, entry.chunk)) {
                index.place(slot, &entry, PutMode::Read);
                placed[slot] = true;
            }
        }
        index.free.retain(|&s| !placed[s as usize]);
        Ok(ReadCache {
            dev,
            table,
            index: Mutex::new(index),
            inflight: Default::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            admitted_chunks: AtomicU64::new(0),
            prefetched_bytes: AtomicU64::new(0),
            prefetch_hit_bytes: AtomicU64::new(0),
            streams: Default::default(),
            object_walk: Default::default(),
            ahead_in_flight_bytes: AtomicU64::new(0),
            read_ahead_bytes: AtomicU64::new(0),
            temporal_ahead_bytes: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sequential-stream table (read-ahead).
    pub(crate) fn streams(&self) -> std::sync::MutexGuard<'_, streams::Streams> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object the latest reads landed in (temporal read-ahead).
    pub(crate) fn object_walk(&self) -> std::sync::MutexGuard<'_, walk::ObjectWalk> {
        self.object_walk.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn contains(&self, obj: CacheObject, chunk: u64) -> bool {
        self.lock().map.contains_key(&(obj, chunk))
    }

    pub fn entries(&self) -> usize {
        self.lock().map.len()
    }

    /// Bytes `[from, to)` of chunk `chunk` of object `obj` (offsets within the chunk),
    /// if cached and intact: only the 4 KiB blocks covering the range are read, each
    /// checked against its hash. A chunk that fails is dropped.
    pub fn get(&self, obj: CacheObject, chunk: u64, from: u64, to: u64) -> Option<Vec<u8>> {
        if from >= to || to > READ_CACHE_CHUNK_BYTES {
            return None;
        }
        let (slot, hashes, len) = {
            let mut idx = self.lock();
            let slot = *idx.map.get(&(obj, chunk))?;
            let SlotState::Used(s) = &mut idx.slots[slot as usize] else {
                return None;
            };
            s.referenced = true;
            let (hashes, len) = (s.hashes, s.len as u64);
            if std::mem::take(&mut s.prefetched) {
                self.prefetch_hit_bytes
                    .fetch_add(u64::from(s.len), Ordering::Relaxed);
            }
            if std::mem::take(&mut s.admitted) {
                // Read by a client: from now on it is read data, under CLOCK.
                idx.admitted_count -= 1;
            }
            (slot, hashes, len)
        };
        if to > len {
            return None;
        }
        let first = (from / BLOCK_BYTES) as usize;
        let last = to.div_ceil(BLOCK_BYTES) as usize; // exclusive
        let start = first as u64 * BLOCK_BYTES;
        let end = (last as u64 * BLOCK_BYTES).min(len);
        let mut buf = vec![0u8; (end - start) as usize];
        let at = slot as u64 * READ_CACHE_CHUNK_BYTES + start;
        let intact = self.dev.read_at(&mut buf, at).is_ok()
            && buf
                .chunks(BLOCK_BYTES as usize)
                .zip(&hashes[first..last])
                .all(|(block, &h)| slot_table::block_hash(block) == h);
        if !intact {
            // Lost or torn by a crash, or the device returned bad data: drop it.
            let mut idx = self.lock();
            if idx.map.get(&(obj, chunk)) == Some(&slot) {
                idx.evict(slot as usize);
            }
            return None;
        }
        if (start, end) != (from, to) {
            buf.drain(..(from - start) as usize);
            buf.truncate((to - from) as usize);
        }
        Some(buf)
    }

    /// Cache `data` (at most one chunk), read from the store by a client, as chunk
    /// `chunk` of object `seq`.
    pub fn insert(&self, obj: CacheObject, chunk: u64, data: &[u8]) {
        self.put(obj, chunk, data, PutMode::Read);
    }

    /// Admit `data` (at most one chunk) of an object just uploaded.
    pub fn admit(&self, obj: CacheObject, chunk: u64, data: &[u8]) {
        if self.put(obj, chunk, data, PutMode::Admit) {
            self.admitted_chunks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Cache `data` (at most one chunk), fetched before any client asked for it
    /// (the rest of a miss's fetch, read-ahead): it evicts nothing clients read
    /// recently. True if it was cached.
    pub fn prefetch(&self, obj: CacheObject, chunk: u64, data: &[u8]) -> bool {
        let cached = self.put(obj, chunk, data, PutMode::Prefetch);
        if cached {
            self.prefetched_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        cached
    }

    fn put(&self, obj: CacheObject, chunk: u64, data: &[u8], mode: PutMode) -> bool {
        // The slot table keeps the chunk index in 32 bits (objects are at most a few
        // tens of MiB: hundreds of chunks).
        if data.is_empty()
            || data.len() as u64 > READ_CACHE_CHUNK_BYTES
            || chunk > u64::from(u32::MAX)
        {
            return false;
        }
        let slot = {
            let mut idx = self.lock();
            if idx.slots.is_empty() || idx.map.contains_key(&(obj, chunk)) {
                return false;
            }
            // The victim comes back `Writing`: nobody else may pick it.
            let victim = if mode == PutMode::Read {
                idx.victim_for_read()
            } else {
                idx.victim_for_admission()
            };
            let Some(v) = victim else { return false };
            v
        };
        let entry = Entry::describe(obj, chunk, data);
        // The slot, then its entry: a crash between the two leaves a slot whose
        // hashes do not match, which the next read of it drops.
        let written = self
            .dev
            .write_at(data, slot as u64 * READ_CACHE_CHUNK_BYTES)
            .and_then(|()| self.table.write(slot, &entry));
        let mut idx = self.lock();
        match written {
            Ok(()) if !idx.map.contains_key(&(obj, chunk)) => {
                idx.place(slot, &entry, mode);
                true
            }
            _ => {
                idx.release(slot);
                false
            }
        }
    }

    /// Drop every chunk of object `seq` (of any epoch: it was deleted). With `durably`,
    /// their table entries are cleared and synced too.
    pub fn forget_object(&self, seq: u64, durably: bool) -> io::Result<()> {
        let slots: Vec<u32> = {
            let mut idx = self.lock();
            let slots: Vec<u32> = idx
                .map
                .iter()
                .filter(|(k, _)| k.0.seq == seq)
                .map(|(_, &s)| s)
                .collect();
            for &s in &slots {
                idx.evict(s as usize);
            }
            slots
        };
        if durably && !slots.is_empty() {
            for s in slots {
                self.table.clear(s as usize)?;
            }
            self.table.sync()?;
        }
        Ok(())
    }

    /// Make the cached data and its table durable (clean shutdown: not needed for
    /// correctness, only so a warm restart finds as much as possible).
    pub fn sync(&self) -> io::Result<()> {
        self.dev.sync()?;
        self.table.sync()
    }
}

/// Open the read cache of volume `name` under `data_dir`: `<name>.rcache` (the slots,
/// `size_bytes` rounded down to whole chunks) and `<name>.rcache.slots` (their table).
/// The index file of older builds, `<name>.rcache.map`, is removed. With `keys`, both
/// files are encrypted (`--encrypt-local`).
pub(crate) fn open_files(
    data_dir: &Path,
    name: &str,
    size_bytes: u64,
    volume: VolumeId,
    keys: Option<&lsvd_store::xts::LocalKeys>,
) -> lsvd_core::error::Result<ReadCache> {
    use crate::cache_dev::encrypted::EncryptedDevice;
    use crate::cache_dev::{CacheDevice, FileCache};
    use lsvd_core::error::Error;
    let path = data_dir.join(format!("{name}.rcache"));
    let size = size_bytes / READ_CACHE_CHUNK_BYTES * READ_CACHE_CHUNK_BYTES;
    let (slots, _) = FileCache::open_or_create(&path, size)
        .map_err(|e| Error::local_io(format!("cannot open read cache {}", path.display()), e))?;
    let slot_count = size / READ_CACHE_CHUNK_BYTES;
    let table_path = data_dir.join(format!("{name}.rcache.slots"));
    let (table, _) = FileCache::open_or_create(&table_path, slot_table::file_bytes(slot_count))
        .map_err(|e| {
            Error::local_io(
                format!("cannot open read cache {}", table_path.display()),
                e,
            )
        })?;
    let _ = std::fs::remove_file(data_dir.join(format!("{name}.rcache.map")));
    // Encrypted whole (`--encrypt-local`): a table in the other mode reads as a
    // foreign header and is started afresh.
    let (slots, table): (Arc<dyn CacheDevice>, Arc<dyn CacheDevice>) = match keys {
        Some(k) => (
            Arc::new(EncryptedDevice::new(
                Arc::new(slots),
                k.read_cache.clone(),
                0,
            )),
            Arc::new(EncryptedDevice::new(
                Arc::new(table),
                k.slot_table.clone(),
                0,
            )),
        ),
        None => (Arc::new(slots), Arc::new(table)),
    };
    ReadCache::open(slots, table, volume)
        .map_err(|e| Error::local_io(format!("cannot read {}", table_path.display()), e))
}
