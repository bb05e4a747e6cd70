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
//! One cache ([`HostReadCache`]) can serve many volumes (`lsvd serve` shares one
//! between all it serves, as the LSVD paper shares one cache SSD per host); each volume
//! uses it through its own [`ReadCache`]. An object is named by its owner's volume id,
//! so a clone reading its base's objects, or a snapshot export, hits the base's chunks.
//! Each slot is charged to the volume whose read put it there; a volume holding no
//! more than its share is not evicted by the others ([`index`]).
//!
//! Every slot is described by an entry in a slot table beside the cache file
//! ([`slot_table`]; format: docs/format/read-cache.md): the chunk it holds and an
//! XXH3-64 hash of each of its 4 KiB blocks. An insert writes the slot, then its entry;
//! a hit reads only the 4 KiB blocks it needs and checks each against its hash. So the
//! index survives a crash as well as a clean stop without any ordering between the two
//! writes: after a crash, a slot whose data and entry do not match (one of the two
//! writes was lost) fails its hashes and is dropped on first use. Nothing needs the
//! object's header on a hit.

mod index;
pub(crate) mod inflight;
mod slot_table;
pub(crate) mod streams;
#[cfg(test)]
mod tests;
pub(crate) mod walk;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lsvd_core::VolumeId;

use crate::cache_dev::CacheDevice;
use index::{Index, Key, NOBODY, PutMode, ReaderIx, SlotState};
use slot_table::{BLOCK_BYTES, Entry, SlotTable};

pub const READ_CACHE_CHUNK_BYTES: u64 = 64 << 10;

/// Which object a cached chunk belongs to: the volume that wrote it, its sequence
/// number and the epoch it was written under (the last two in its name), so no two
/// objects ever share an entry, whatever a crash or a superseded writer left in the
/// store. The volume is the object's owner, not the reader: a clone reading its base's
/// object, or a snapshot export, finds the chunks the base cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CacheObject {
    pub volume: VolumeId,
    pub seq: u64,
    pub epoch: u64,
}

impl CacheObject {
    pub(crate) fn new(volume: VolumeId, seq: u64, epoch: u64) -> CacheObject {
        CacheObject { volume, seq, epoch }
    }
}

/// The cache's slots, their table and index, and the chunks being fetched: one per
/// host (`lsvd serve` shares it between every volume it serves), or one per volume
/// (a volume with local encryption, engine tests). Volumes use it through their own
/// [`ReadCache`].
pub struct HostReadCache {
    dev: Arc<dyn CacheDevice>,
    table: SlotTable,
    index: Mutex<Index>,
    /// Chunks being fetched now (concurrent misses share one GET, whichever volumes
    /// they come from).
    inflight: Arc<inflight::InFlight>,
}

impl std::fmt::Debug for HostReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostReadCache")
            .field("slots", &self.slot_count())
            .finish_non_exhaustive()
    }
}

impl HostReadCache {
    /// A cache of `dev`'s slots described by the slot table on `table_dev`: warm with
    /// whatever the table holds (a table of another size or version starts empty).
    pub(crate) fn open(
        dev: Arc<dyn CacheDevice>,
        table_dev: Arc<dyn CacheDevice>,
    ) -> io::Result<Self> {
        let slot_count = (dev.size_bytes() / READ_CACHE_CHUNK_BYTES) as usize;
        let (table, entries) = SlotTable::open(table_dev, slot_count)?;
        let mut index = Index::with_slots(slot_count);
        let mut placed = vec![false; slot_count];
        for (slot, entry) in entries {
            if !index.map.contains_key(&(entry.object, entry.chunk)) {
                index.place(slot, &entry, PutMode::Read, NOBODY);
                placed[slot] = true;
            }
        }
        index.free.retain(|&s| !placed[s as usize]);
        Ok(HostReadCache {
            dev,
            table,
            index: Mutex::new(index),
            inflight: Default::default(),
        })
    }

    /// The cache every volume of this process shares: `@host.rcache` and
    /// `@host.rcache.slots` under `data_dir`, `size_bytes` rounded down to whole chunks
    /// (None below one chunk: no cache). The data directory's lock (`lsvd serve`)
    /// keeps other processes out.
    pub fn open_files(
        data_dir: &Path,
        size_bytes: u64,
    ) -> lsvd_core::error::Result<Option<Arc<Self>>> {
        if size_bytes < READ_CACHE_CHUNK_BYTES {
            return Ok(None);
        }
        std::fs::create_dir_all(data_dir).map_err(|e| {
            lsvd_core::error::Error::local_io(format!("cannot create {}", data_dir.display()), e)
        })?;
        let (slots, table) = open_cache_files(data_dir, HOST_CACHE_STEM, size_bytes)?;
        let table_path = data_dir.join(format!("{HOST_CACHE_STEM}.rcache.slots"));
        HostReadCache::open(Arc::new(slots), Arc::new(table))
            .map(|c| Some(Arc::new(c)))
            .map_err(|e| {
                lsvd_core::error::Error::local_io(
                    format!("cannot read {}", table_path.display()),
                    e,
                )
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn slot_count(&self) -> usize {
        self.lock().slots.len()
    }

    /// Chunks cached, for all volumes.
    pub fn entries(&self) -> usize {
        self.lock().map.len()
    }

    /// Make the cached data and its table durable (clean shutdown: not needed for
    /// correctness, only so a warm restart finds as much as possible).
    pub fn sync(&self) -> io::Result<()> {
        self.dev.sync()?;
        self.table.sync()
    }
}

/// The file stem of the cache `lsvd serve` shares between its volumes: no volume
/// (names are not empty) or snapshot export (`name@snapshot`) has it.
pub const HOST_CACHE_STEM: &str = "@host";

/// One volume's use of a [`HostReadCache`]: its key space is the whole cache (chunks
/// are keyed by the object's owner, so a clone hits its base's chunks), its counters,
/// read-ahead state and fairness share are its own.
pub(crate) struct ReadCache {
    host: Arc<HostReadCache>,
    /// The volume reading through this handle.
    volume: VolumeId,
    reader: ReaderIx,
    /// Chunks being fetched now (the host's table).
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

impl Drop for ReadCache {
    fn drop(&mut self) {
        self.host.lock().unregister(self.reader);
    }
}

impl ReadCache {
    /// `volume`'s use of `host`.
    pub(crate) fn for_volume(host: Arc<HostReadCache>, volume: VolumeId) -> ReadCache {
        let reader = host.lock().register(volume);
        ReadCache {
            inflight: host.inflight.clone(),
            host,
            volume,
            reader,
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
        }
    }

    /// A cache of `volume`'s own on `dev`, described by the slot table on `table_dev`.
    pub fn open(
        dev: Arc<dyn CacheDevice>,
        table_dev: Arc<dyn CacheDevice>,
        volume: VolumeId,
    ) -> io::Result<Self> {
        let host = HostReadCache::open(dev, table_dev)?;
        Ok(ReadCache::for_volume(Arc::new(host), volume))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.host.lock()
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

    /// Chunks charged to this volume (what its reads, uploads and prefetches put in the
    /// cache, and what a warm restart found of its own objects).
    pub fn entries(&self) -> usize {
        let idx = self.lock();
        idx.readers
            .get(usize::from(self.reader))
            .map_or(0, |r| r.held as usize)
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
        let intact = self.host.dev.read_at(&mut buf, at).is_ok()
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
                idx.victim_for_read(self.reader)
            } else {
                idx.victim_for_admission(self.reader)
            };
            let Some(v) = victim else { return false };
            v
        };
        let entry = Entry::describe(obj, chunk, data);
        // The slot, then its entry: a crash between the two leaves a slot whose
        // hashes do not match, which the next read of it drops.
        let written = self
            .host
            .dev
            .write_at(data, slot as u64 * READ_CACHE_CHUNK_BYTES)
            .and_then(|()| self.host.table.write(slot, &entry));
        let mut idx = self.lock();
        match written {
            Ok(()) if !idx.map.contains_key(&(obj, chunk)) => {
                idx.place(slot, &entry, mode, self.reader);
                true
            }
            _ => {
                idx.release(slot);
                false
            }
        }
    }

    /// Drop every chunk of this volume's objects `seqs` (of any epoch: they were
    /// deleted), in one pass over the index: the index is shared by every volume of the
    /// server, so a checkpoint's dead objects must not hold it once per object. With
    /// `durably`, their table entries are cleared and synced too.
    pub fn forget_objects(&self, seqs: &[u64], durably: bool) -> io::Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        let seqs: std::collections::HashSet<u64> = seqs.iter().copied().collect();
        let slots: Vec<u32> = {
            let mut idx = self.lock();
            let slots: Vec<u32> = idx
                .map
                .iter()
                .filter(|(k, _)| k.0.volume == self.volume && seqs.contains(&k.0.seq))
                .map(|(_, &s)| s)
                .collect();
            for &s in &slots {
                idx.evict(s as usize);
            }
            slots
        };
        if durably && !slots.is_empty() {
            for s in slots {
                self.host.table.clear(s as usize)?;
            }
            self.host.table.sync()?;
        }
        Ok(())
    }

    /// Make the cached data and its table durable (clean shutdown: not needed for
    /// correctness, only so a warm restart finds as much as possible).
    pub fn sync(&self) -> io::Result<()> {
        self.host.sync()
    }
}

/// The slot file `<stem>.rcache` (`size_bytes` rounded down to whole chunks) and its
/// table `<stem>.rcache.slots` under `data_dir`, made if missing. The index file of
/// older builds, `<stem>.rcache.map`, is removed.
fn open_cache_files(
    data_dir: &Path,
    stem: &str,
    size_bytes: u64,
) -> lsvd_core::error::Result<(crate::cache_dev::FileCache, crate::cache_dev::FileCache)> {
    use crate::cache_dev::FileCache;
    use lsvd_core::error::Error;
    let path = data_dir.join(format!("{stem}.rcache"));
    let size = size_bytes / READ_CACHE_CHUNK_BYTES * READ_CACHE_CHUNK_BYTES;
    let (slots, _) = FileCache::open_or_create(&path, size)
        .map_err(|e| Error::local_io(format!("cannot open read cache {}", path.display()), e))?;
    let slot_count = size / READ_CACHE_CHUNK_BYTES;
    let table_path = data_dir.join(format!("{stem}.rcache.slots"));
    let (table, _) = FileCache::open_or_create(&table_path, slot_table::file_bytes(slot_count))
        .map_err(|e| {
            Error::local_io(
                format!("cannot open read cache {}", table_path.display()),
                e,
            )
        })?;
    let _ = std::fs::remove_file(data_dir.join(format!("{stem}.rcache.map")));
    Ok((slots, table))
}

/// Open volume `name`'s cache of its own under `data_dir`: `<name>.rcache` and
/// `<name>.rcache.slots` ([`open_cache_files`]). With `keys`, both files are encrypted
/// (`--encrypt-local`).
pub(crate) fn open_files(
    data_dir: &Path,
    name: &str,
    size_bytes: u64,
    volume: VolumeId,
    keys: Option<&lsvd_store::xts::LocalKeys>,
) -> lsvd_core::error::Result<ReadCache> {
    use crate::cache_dev::encrypted::EncryptedDevice;
    let (slots, table) = open_cache_files(data_dir, name, size_bytes)?;
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
    ReadCache::open(slots, table, volume).map_err(|e| {
        lsvd_core::error::Error::local_io(
            format!(
                "cannot read {}",
                data_dir.join(format!("{name}.rcache.slots")).display()
            ),
            e,
        )
    })
}
