//! The read cache: recently read object data on the local SSD, apart from the log.
//!
//! Fixed-size chunks (64 KiB of an object's data section) in a preallocated file,
//! found through an in-memory index and evicted by CLOCK. A miss fetches whole chunks
//! (more than the request: cheap prefetch) and caches them.
//!
//! Entries are keyed by object and chunk, never by LBA. Objects are immutable, so a
//! cached chunk can never hold a stale version of a block: a newer write points the
//! map at a different object and the old chunk is simply not consulted again (no
//! write-after-read hazard). Every hit is still verified against the object's chunk
//! checksums, which also catches a slot reused by a concurrent eviction.
//!
//! On clean shutdown the index is saved beside the cache file (format:
//! docs/format/read-cache.md) so a restart is warm; it is deleted when loaded, so a
//! crash leaves a cold cache rather than a possibly stale index.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use lsvd_core::VolumeId;

use crate::cache_dev::CacheDevice;

pub const READ_CACHE_CHUNK_BYTES: u64 = 64 << 10;
const MAP_MAGIC: &[u8; 8] = b"LSVDRCM\0";
const MAP_VERSION: u16 = 1;

type Key = (u64, u64); // (object seq, chunk index)

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Key,
    len: u32,
    referenced: bool,
}

#[derive(Debug, Default)]
struct Index {
    map: HashMap<Key, u32>,
    slots: Vec<Option<Slot>>,
    hand: usize,
}

pub(crate) struct ReadCache {
    dev: Arc<dyn CacheDevice>,
    index: Mutex<Index>,
    map_path: PathBuf,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl ReadCache {
    /// A cache on `dev`, warm if a saved index for `volume` is at `map_path`.
    pub fn open(dev: Arc<dyn CacheDevice>, map_path: &Path, volume: VolumeId) -> Self {
        let slot_count = (dev.size_bytes() / READ_CACHE_CHUNK_BYTES) as usize;
        let mut index = Index {
            map: HashMap::new(),
            slots: vec![None; slot_count],
            hand: 0,
        };
        if let Ok(bytes) = std::fs::read(map_path) {
            match decode_map(&bytes, volume, slot_count) {
                Ok(entries) => {
                    for (slot, key, len) in entries {
                        index.slots[slot as usize] = Some(Slot {
                            key,
                            len,
                            referenced: false,
                        });
                        index.map.insert(key, slot);
                    }
                }
                Err(e) => crate::log::warn(&format!(
                    "ignoring read-cache index {}: {e}",
                    map_path.display()
                )),
            }
            let _ = std::fs::remove_file(map_path);
        }
        ReadCache {
            dev,
            index: Mutex::new(index),
            map_path: map_path.to_path_buf(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn contains(&self, seq: u64, chunk: u64) -> bool {
        self.lock().map.contains_key(&(seq, chunk))
    }

    pub fn entries(&self) -> usize {
        self.lock().map.len()
    }

    /// The cached bytes of chunk `chunk` of object `seq`, if present and still valid
    /// according to `verify`.
    pub fn get(&self, seq: u64, chunk: u64, verify: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let (slot, len) = {
            let mut idx = self.lock();
            let slot = *idx.map.get(&(seq, chunk))?;
            let s = idx.slots[slot as usize].as_mut()?;
            s.referenced = true;
            (slot, s.len)
        };
        let mut buf = vec![0u8; len as usize];
        self.dev
            .read_at(&mut buf, slot as u64 * READ_CACHE_CHUNK_BYTES)
            .ok()?;
        if !verify(&buf) {
            // Reused under us, or the cache device returned bad data: drop the entry.
            let mut idx = self.lock();
            if idx.map.get(&(seq, chunk)) == Some(&slot) {
                idx.map.remove(&(seq, chunk));
                idx.slots[slot as usize] = None;
            }
            return None;
        }
        Some(buf)
    }

    /// Cache `data` (at most one chunk) as chunk `chunk` of object `seq`.
    pub fn insert(&self, seq: u64, chunk: u64, data: &[u8]) {
        if data.is_empty() || data.len() as u64 > READ_CACHE_CHUNK_BYTES {
            return;
        }
        let slot = {
            let mut idx = self.lock();
            if idx.slots.is_empty() || idx.map.contains_key(&(seq, chunk)) {
                return;
            }
            let n = idx.slots.len();
            // CLOCK: skip referenced slots once, clearing their bit.
            let mut victim = None;
            for _ in 0..2 * n {
                let h = idx.hand;
                idx.hand = (h + 1) % n;
                match &mut idx.slots[h] {
                    None => {
                        victim = Some(h);
                        break;
                    }
                    Some(s) if s.referenced => s.referenced = false,
                    Some(_) => {
                        victim = Some(h);
                        break;
                    }
                }
            }
            let Some(v) = victim else { return };
            if let Some(old) = idx.slots[v].take() {
                idx.map.remove(&old.key);
            }
            v
        };
        if self
            .dev
            .write_at(data, slot as u64 * READ_CACHE_CHUNK_BYTES)
            .is_err()
        {
            return;
        }
        let mut idx = self.lock();
        if idx.slots[slot].is_none() {
            idx.slots[slot] = Some(Slot {
                key: (seq, chunk),
                len: data.len() as u32,
                referenced: false,
            });
            idx.map.insert((seq, chunk), slot as u32);
        }
    }

    /// Drop every chunk of object `seq` (it was deleted).
    pub fn forget_object(&self, seq: u64) {
        let mut idx = self.lock();
        let keys: Vec<Key> = idx.map.keys().filter(|k| k.0 == seq).copied().collect();
        for k in keys {
            if let Some(slot) = idx.map.remove(&k) {
                idx.slots[slot as usize] = None;
            }
        }
    }

    /// Save the index (clean shutdown) so the next start is warm.
    pub fn save(&self, volume: VolumeId) -> io::Result<()> {
        self.dev.sync()?;
        let bytes = {
            let idx = self.lock();
            encode_map(&idx, volume)
        };
        let tmp = self.map_path.with_extension("tmp");
        std::fs::write(&tmp, &bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.map_path)
    }
}

/// ```text
/// offset size field
///      0    8 magic "LSVDRCM\0"
///      8    2 version (1)
///     10    2 reserved
///     12    4 crc32c over the whole file (this field zero)
///     16   16 volume id
///     32    8 chunk bytes
///     40    8 entry count
///     48 24*n entries: slot u32, length u32, object seq u64, chunk index u64
/// ```
fn encode_map(idx: &Index, volume: VolumeId) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + 24 * idx.map.len());
    out.extend_from_slice(MAP_MAGIC);
    out.extend_from_slice(&MAP_VERSION.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&volume.0);
    out.extend_from_slice(&READ_CACHE_CHUNK_BYTES.to_le_bytes());
    out.extend_from_slice(&(idx.map.len() as u64).to_le_bytes());
    for (slot, s) in idx.slots.iter().enumerate() {
        if let Some(s) = s {
            out.extend_from_slice(&(slot as u32).to_le_bytes());
            out.extend_from_slice(&s.len.to_le_bytes());
            out.extend_from_slice(&s.key.0.to_le_bytes());
            out.extend_from_slice(&s.key.1.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&out);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

fn decode_map(
    buf: &[u8],
    volume: VolumeId,
    slot_count: usize,
) -> Result<Vec<(u32, Key, u32)>, String> {
    let u64_at = |at: usize| -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let u32_at = |at: usize| -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&buf[at..at + 4]);
        u32::from_le_bytes(b)
    };
    if buf.len() < 48 || &buf[..8] != MAP_MAGIC {
        return Err("not a read-cache index".into());
    }
    if u16::from_le_bytes([buf[8], buf[9]]) != MAP_VERSION {
        return Err("unsupported version".into());
    }
    let mut copy = buf.to_vec();
    copy[12..16].copy_from_slice(&[0; 4]);
    if crc32c::crc32c(&copy) != u32_at(12) {
        return Err("checksum mismatch".into());
    }
    if buf[16..32] != volume.0 {
        return Err("belongs to another volume".into());
    }
    if u64_at(32) != READ_CACHE_CHUNK_BYTES {
        return Err("different chunk size".into());
    }
    let n = u64_at(40) as usize;
    if buf.len() != 48 + 24 * n {
        return Err("length does not match entry count".into());
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = 48 + 24 * i;
        let slot = u32_at(at);
        let len = u32_at(at + 4);
        if slot as usize >= slot_count || len as u64 > READ_CACHE_CHUNK_BYTES {
            return Err("entry out of range (cache resized?)".into());
        }
        out.push((slot, (u64_at(at + 8), u64_at(at + 16)), len));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_dev::FileCache;
    use crate::testutil::TempDir;

    #[test]
    fn hit_miss_eviction_and_warm_restart() {
        let dir = TempDir::new("rcache");
        let (file, _) =
            FileCache::open_or_create(&dir.path().join("c"), 4 * READ_CACHE_CHUNK_BYTES)
                .expect("file");
        let dev: Arc<dyn CacheDevice> = Arc::new(file);
        let vol = VolumeId([5; 16]);
        let map = dir.path().join("c.map");
        let rc = ReadCache::open(dev.clone(), &map, vol);
        let chunk = |n: u8| vec![n; READ_CACHE_CHUNK_BYTES as usize];
        assert!(rc.get(1, 0, |_| true).is_none());
        for i in 0..4u8 {
            rc.insert(1, i as u64, &chunk(i));
        }
        assert_eq!(rc.get(1, 2, |_| true), Some(chunk(2)));
        // A fifth chunk evicts an unreferenced one, not chunk 2.
        rc.insert(2, 0, &chunk(9));
        assert!(rc.get(1, 2, |_| true).is_some());
        assert_eq!(rc.get(2, 0, |_| true), Some(chunk(9)));
        assert_eq!(rc.entries(), 4);
        // Failed verification drops the entry.
        assert!(rc.get(2, 0, |_| false).is_none());
        assert!(!rc.contains(2, 0));
        rc.save(vol).expect("save");
        let warm = ReadCache::open(dev.clone(), &map, vol);
        assert_eq!(warm.get(1, 2, |_| true), Some(chunk(2)));
        assert!(!map.exists(), "index is consumed when loaded");
        // An index for another volume is ignored.
        warm.save(vol).expect("save");
        let other = ReadCache::open(dev, &map, VolumeId([6; 16]));
        assert_eq!(other.entries(), 0);
    }
}
