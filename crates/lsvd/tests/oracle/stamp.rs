//! Self-identifying block contents.
//!
//! Every 4 KiB block the workload writes says which block it belongs to and which write
//! produced it, and carries a checksum, so a block read back after recovery is exactly
//! one of: zeros, the data of one identified write, or garbage (torn, misplaced or
//! corrupt), and the oracle knows which.
//!
//! ```text
//! offset size
//!      0    8 magic "LSVDORCL"
//!      8    8 block number (little endian)
//!     16    8 write id
//!     24    8 check: a non-linear 64-bit hash of every other byte of the block
//!     32 4060 pattern derived from (block, write id, word index): every 512-byte
//!             sector differs between writes, so a torn mix fails the check
//!   4092    4 CRC32C of bytes [0, 4092) (check field zero), like many filesystems'
//!             and databases' block trailers
//! ```
//!
//! The check is a non-linear hash, so it identifies garbage. The CRC32C trailer is
//! there to be hostile: every block ending in its own CRC32C has the same CRC32C (the
//! CRC residue), which made the engine's version-1 record checksum blind to one such
//! block replacing another in a torn record (see
//! `engine_bug_record_crc_blind_to_self_checksummed_blocks`). Every block the oracle
//! writes is such a block, so a regression there shows up as garbage or a non-prefix.

use super::rng::mix;

pub const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"LSVDORCL";
const CHECK_AT: usize = 24;

/// A non-linear hash of the block with the check field left out.
fn check(block: &[u8]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for (i, w) in block.chunks(8).enumerate() {
        if i * 8 == CHECK_AT {
            continue;
        }
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        h = mix(h ^ u64::from_le_bytes(b)).wrapping_add(i as u64);
    }
    h
}

/// Fill `out` (one block) with the stamp of write `id` to block `block`.
pub fn stamp(block: u64, id: u64, out: &mut [u8]) {
    debug_assert_eq!(out.len(), BLOCK);
    out[0..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&block.to_le_bytes());
    out[16..24].copy_from_slice(&id.to_le_bytes());
    let key = mix(block.wrapping_mul(0x1000_0000_01b3) ^ id.rotate_left(29));
    for (word, chunk) in out[CHECK_AT + 8..].chunks_mut(8).enumerate() {
        let v = mix(key ^ word as u64).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    out[CHECK_AT..CHECK_AT + 8].fill(0);
    let trailer = crc32c::crc32c(&out[..BLOCK - 4]);
    out[BLOCK - 4..].copy_from_slice(&trailer.to_le_bytes());
    let c = check(out);
    out[CHECK_AT..CHECK_AT + 8].copy_from_slice(&c.to_le_bytes());
}

/// The data of a write of `blocks` blocks starting at `first`.
pub fn write_data(first: u64, blocks: u64, id: u64) -> Vec<u8> {
    let mut data = vec![0u8; blocks as usize * BLOCK];
    for (i, chunk) in data.chunks_mut(BLOCK).enumerate() {
        stamp(first + i as u64, id, chunk);
    }
    data
}

/// What one block read back holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Zero,
    Write(u64),
    Garbage(String),
}

/// Identify the contents of block `block`.
pub fn decode(block: u64, data: &[u8]) -> Seen {
    if data.iter().all(|&b| b == 0) {
        return Seen::Zero;
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let crc_ok = data.len() == BLOCK && check(data) == u64_at(CHECK_AT);
    let magic_ok = &data[0..8] == MAGIC;
    let (b, id) = (u64_at(8), u64_at(16));
    if magic_ok && crc_ok && b == block {
        return Seen::Write(id);
    }
    // Describe the damage: which sectors are zero, which look like which write.
    let zero_sectors: Vec<usize> = data
        .chunks(512)
        .enumerate()
        .filter(|(_, s)| s.iter().all(|&x| x == 0))
        .map(|(i, _)| i)
        .collect();
    let mut expected = vec![0u8; BLOCK];
    let matching: Vec<usize> = if magic_ok {
        stamp(b, id, &mut expected);
        data.chunks(512)
            .zip(expected.chunks(512))
            .enumerate()
            .filter(|(_, (a, e))| a == e)
            .map(|(i, _)| i)
            .collect()
    } else {
        Vec::new()
    };
    Seen::Garbage(format!(
        "magic {}, checksum {}, header says block {b} write #{id}; sectors matching that write: {matching:?}; zero sectors: {zero_sectors:?}",
        if magic_ok { "ok" } else { "bad" },
        if crc_ok { "ok" } else { "bad" },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tear_detection() {
        let d = write_data(10, 2, 77);
        assert_eq!(decode(10, &d[..BLOCK]), Seen::Write(77));
        assert_eq!(decode(11, &d[BLOCK..]), Seen::Write(77));
        assert!(matches!(decode(12, &d[..BLOCK]), Seen::Garbage(_)));
        let mut torn = write_data(10, 1, 78);
        torn[512..1024].copy_from_slice(&d[512..1024]);
        assert!(matches!(decode(10, &torn), Seen::Garbage(_)));
        assert_eq!(decode(3, &[0u8; BLOCK]), Seen::Zero);
        // Stamped blocks must not all share one CRC32C (see the module docs).
        assert_ne!(
            crc32c::crc32c(&d[..BLOCK]),
            crc32c::crc32c(&write_data(5, 1, 9)),
            "stamps must not be CRC32C-equivalent"
        );
    }
}
