//! The read cache's slot table (`@host.rcache.slots`, or `<volume>.rcache.slots` for a
//! volume with a cache of its own): for every slot of the cache file, which chunk of
//! which volume's object it holds and a hash of each of its 4 KiB blocks.
//! Written entry by entry as chunks are cached, read whole at open. Format:
//! docs/format/read-cache.md.

use std::io;
use std::sync::Arc;

use lsvd_core::VolumeId;

use crate::cache_dev::CacheDevice;

use super::{CacheObject, READ_CACHE_CHUNK_BYTES};

/// Blocks of a slot are hashed and read separately.
pub(super) const BLOCK_BYTES: u64 = 4096;
pub(super) const BLOCKS_PER_SLOT: usize = (READ_CACHE_CHUNK_BYTES / BLOCK_BYTES) as usize;

const MAGIC: &[u8; 8] = b"LSVDRCS\0";
/// Version 3 names each chunk's object by its volume, sequence number and epoch (so
/// volumes can share a cache, and a clone finds its base's chunks); tables of versions
/// 1 and 2 (one volume's, without the volume in each entry) are started afresh.
const VERSION: u16 = 3;
const HEADER_BYTES: u64 = 4096;
/// Bytes of the header the checksum covers (the rest of its block is zero).
const HEADER_USED_BYTES: usize = 48;
const ENTRY_BYTES: u64 = 192;
const ENTRY_CRC_AT: usize = 168;
/// Where the entry's fields after the volume id start.
const AFTER_VOLUME: usize = 16;

/// Bytes of the table file for `slots` slots.
pub(super) fn file_bytes(slots: u64) -> u64 {
    HEADER_BYTES + slots * ENTRY_BYTES
}

/// The hash of one block of cached data: XXH3-64 (seed 0 is the unseeded hash), on
/// 32-byte lanes where the CPU has AVX2.
pub(super) fn block_hash(block: &[u8]) -> u64 {
    lsvd_core::format::xxh3_avx2::xxh3_64_with_seed(block, 0)
}

/// What one slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub object: CacheObject,
    pub chunk: u64,
    /// Bytes of the chunk (a chunk at the end of an object may be short).
    pub len: u32,
    /// Of each 4 KiB block (the last one as long as it is); 0 past the end.
    pub hashes: [u64; BLOCKS_PER_SLOT],
}

impl Entry {
    pub(super) fn describe(object: CacheObject, chunk: u64, data: &[u8]) -> Entry {
        let mut hashes = [0u64; BLOCKS_PER_SLOT];
        for (h, block) in hashes.iter_mut().zip(data.chunks(BLOCK_BYTES as usize)) {
            *h = block_hash(block);
        }
        Entry {
            object,
            chunk,
            len: data.len() as u32,
            hashes,
        }
    }

    fn encode(&self, table: TableId, slot: usize) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[0..16].copy_from_slice(&self.object.volume.0);
        let f = &mut b[AFTER_VOLUME..];
        f[0..8].copy_from_slice(&self.object.seq.to_le_bytes());
        f[8..16].copy_from_slice(&self.object.epoch.to_le_bytes());
        f[16..20].copy_from_slice(&self.len.to_le_bytes());
        f[20..24].copy_from_slice(&(self.chunk as u32).to_le_bytes());
        for (i, h) in self.hashes.iter().enumerate() {
            f[24 + 8 * i..32 + 8 * i].copy_from_slice(&h.to_le_bytes());
        }
        let crc = entry_crc(table, slot, &b);
        b[ENTRY_CRC_AT..ENTRY_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The entry of `slot` in `b`, if it describes a chunk and its checksum holds.
    fn decode(table: TableId, slot: usize, b: &[u8]) -> Option<Entry> {
        if u32_at(b, ENTRY_CRC_AT) != entry_crc(table, slot, b) {
            return None;
        }
        let mut volume = VolumeId::default();
        volume.0.copy_from_slice(&b[0..16]);
        let b = &b[AFTER_VOLUME..];
        let u64_at = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        let len = u32_at(b, 16);
        if len == 0 || u64::from(len) > READ_CACHE_CHUNK_BYTES {
            return None;
        }
        let mut hashes = [0u64; BLOCKS_PER_SLOT];
        for (i, h) in hashes.iter_mut().enumerate() {
            *h = u64_at(24 + 8 * i);
        }
        Some(Entry {
            object: CacheObject::new(volume, u64_at(0), u64_at(8)),
            chunk: u64::from(u32_at(b, 20)),
            len,
            hashes,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// A random identity given to a table when it is made: entries carry it in their
/// checksum, so an entry of an earlier table in the same file is never taken as one of
/// this table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TableId(pub [u8; 16]);

/// CRC32C of the table id, the slot number, then the entry's first 168 bytes: an entry
/// copied to another slot's place, or left from an earlier table, fails.
fn entry_crc(table: TableId, slot: usize, b: &[u8]) -> u32 {
    let seed = crc32c::crc32c_append(crc32c::crc32c(&table.0), &(slot as u32).to_le_bytes());
    crc32c::crc32c_append(seed, &b[..ENTRY_CRC_AT])
}

fn encode_header(table: TableId, slots: u64) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_BYTES as usize];
    b[0..8].copy_from_slice(MAGIC);
    b[8..10].copy_from_slice(&VERSION.to_le_bytes());
    b[16..32].copy_from_slice(&table.0);
    b[32..40].copy_from_slice(&READ_CACHE_CHUNK_BYTES.to_le_bytes());
    b[40..48].copy_from_slice(&slots.to_le_bytes());
    let crc = crc32c::crc32c(&b[..HEADER_USED_BYTES]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The table's id, if `b` (the header block) describes a table of this version with
/// `slots` slots.
fn header_matches(b: &[u8], slots: u64) -> Option<TableId> {
    if b.len() < HEADER_USED_BYTES {
        return None;
    }
    let mut zeroed = b[..HEADER_USED_BYTES].to_vec();
    zeroed[12..16].copy_from_slice(&[0; 4]);
    (b[0..8] == MAGIC[..]
        && b[8..10] == VERSION.to_le_bytes()
        && b[12..16] == crc32c::crc32c(&zeroed).to_le_bytes()
        && b[32..40] == READ_CACHE_CHUNK_BYTES.to_le_bytes()
        && b[40..48] == slots.to_le_bytes())
    .then(|| {
        let mut id = TableId([0; 16]);
        id.0.copy_from_slice(&b[16..32]);
        id
    })
}

pub(super) struct SlotTable {
    dev: Arc<dyn CacheDevice>,
    id: TableId,
}

impl SlotTable {
    /// The table on `dev` for `slots` slots, with the entries it holds. A table of
    /// another size or version is started afresh (empty, under a new id).
    pub(super) fn open(
        dev: Arc<dyn CacheDevice>,
        slots: usize,
    ) -> io::Result<(SlotTable, Vec<(usize, Entry)>)> {
        let mut header = vec![0u8; HEADER_BYTES as usize];
        let readable =
            dev.size_bytes() >= file_bytes(slots as u64) && dev.read_at(&mut header, 0).is_ok();
        let Some(id) = header_matches(&header, slots as u64).filter(|_| readable) else {
            let table = SlotTable {
                dev,
                id: TableId(lsvd_store::clock::random_id_bytes()),
            };
            table.reset(slots)?;
            return Ok((table, Vec::new()));
        };
        let table = SlotTable { dev, id };
        let mut all = vec![0u8; slots * ENTRY_BYTES as usize];
        table.dev.read_at(&mut all, HEADER_BYTES)?;
        let entries = all
            .chunks(ENTRY_BYTES as usize)
            .enumerate()
            .filter_map(|(slot, b)| Entry::decode(id, slot, b).map(|e| (slot, e)))
            .collect();
        Ok((table, entries))
    }

    /// An empty table: every entry zero, then the header.
    fn reset(&self, slots: usize) -> io::Result<()> {
        let zeros = vec![0u8; 1 << 20];
        let end = file_bytes(slots as u64);
        let mut at = HEADER_BYTES;
        while at < end {
            let n = (end - at).min(zeros.len() as u64) as usize;
            self.dev.write_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.dev.sync()?;
        self.dev
            .write_at(&encode_header(self.id, slots as u64), 0)?;
        self.dev.sync()
    }

    pub(super) fn write(&self, slot: usize, entry: &Entry) -> io::Result<()> {
        self.dev.write_at(
            &entry.encode(self.id, slot),
            HEADER_BYTES + slot as u64 * ENTRY_BYTES,
        )
    }

    pub(super) fn clear(&self, slot: usize) -> io::Result<()> {
        self.dev.write_at(
            &[0u8; ENTRY_BYTES as usize],
            HEADER_BYTES + slot as u64 * ENTRY_BYTES,
        )
    }

    pub(super) fn sync(&self) -> io::Result<()> {
        self.dev.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_any_damage_or_move_is_refused() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let e = Entry::describe(CacheObject::new(VolumeId([9; 16]), 7, 0), 3, &data);
        assert_eq!(e.len, 10_000);
        assert_eq!(e.hashes[2], block_hash(&data[8192..]));
        assert_eq!(e.hashes[3], 0);
        let table = TableId([4; 16]);
        let b = e.encode(table, 5);
        assert_eq!(Entry::decode(table, 5, &b), Some(e));
        assert_eq!(Entry::decode(table, 6, &b), None, "moved to another slot");
        assert_eq!(
            Entry::decode(TableId([5; 16]), 5, &b),
            None,
            "an earlier table's"
        );
        for i in 0..ENTRY_CRC_AT + 4 {
            let mut bad = b;
            bad[i] ^= 1;
            assert_eq!(Entry::decode(table, 5, &bad), None, "flipped byte {i}");
        }
        assert_eq!(Entry::decode(table, 0, &[0u8; ENTRY_BYTES as usize]), None);
    }

    #[test]
    fn golden_header_and_entry_bytes() {
        let h = encode_header(TableId([1; 16]), 2);
        assert_eq!(&h[..8], b"LSVDRCS\0");
        assert_eq!(h[8..10], [3, 0], "version 3");
        assert_eq!(
            h[12..16],
            crc32c::crc32c(&{
                let mut z = h[..48].to_vec();
                z[12..16].copy_from_slice(&[0; 4]);
                z
            })
            .to_le_bytes()
        );
        assert_eq!(header_matches(&h, 2), Some(TableId([1; 16])));
        assert_eq!(header_matches(&h, 3), None, "another slot count");
        let mut v2 = h.clone();
        v2[8] = 2;
        assert_eq!(header_matches(&v2, 2), None, "version 2 is started afresh");
        let e = Entry::describe(CacheObject::new(VolumeId([7; 16]), 1, 2), 0, &[0xab; 4096]);
        let b = e.encode(TableId([1; 16]), 0);
        // The owner's volume id, seq 1, epoch 2, length 4096, chunk 0, then the hash
        // of the one block.
        assert_eq!(b[0..16], [7; 16]);
        assert_eq!(
            b[16..40],
            [
                1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(b[40..48], block_hash(&[0xab; 4096]).to_le_bytes());
        assert!(b[48..ENTRY_CRC_AT].iter().all(|&x| x == 0));
        assert_eq!(
            b[ENTRY_CRC_AT..ENTRY_CRC_AT + 4],
            entry_crc(TableId([1; 16]), 0, &b).to_le_bytes()
        );
        assert!(b[ENTRY_CRC_AT + 4..].iter().all(|&x| x == 0), "reserved");
    }
}
