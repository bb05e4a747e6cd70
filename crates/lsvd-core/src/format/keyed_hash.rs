//! The data hash of version-2 write-log records: a keyed, non-linear 64-bit hash for
//! torn-write detection, written in this project.
//!
//! Kept only to read version-2 records, which a log left by an older build may still
//! hold. Records are written as version 3 now, whose data hash is XXH3-64 (see
//! [`super::record`]); nothing new should use this hash.
//!
//! Why not CRC32C alone: every CRC is affine over GF(2). A block that ends in its own
//! CRC32C (many applications and filesystems stamp blocks that way) contributes a
//! constant to any CRC computed over it, whatever its other bytes. So a record whose
//! data sectors were torn, and still hold an *older* self-checksummed block, can pass a
//! CRC over the record: the old and new blocks contribute the same constant. A hash
//! built on 64x64→128-bit multiplication is not linear in the data, and keying it with
//! the record's identity makes the constant-collision trick impossible.
//!
//! This is not a cryptographic MAC; it guards against accidents (stale sectors after
//! power loss), not adversaries. Its definition is part of the version-2 on-disk format
//! (`docs/format/record.md`, "Version 2") and must never change.
//!
//! ```text
//! fold(a, b)  = lo64(a * b) XOR hi64(a * b)            (a * b as a 128-bit product)
//! h           = key XOR K0
//! per 16 bytes (a, b: little-endian u64):
//!     h = fold(a XOR h XOR K1, b XOR rotl(h, 32) XOR K2) XOR rotl(h, 23)
//! tail (len % 16 bytes) zero-padded to 16 and folded the same way
//! result      = fold(h XOR K3, len XOR K4)
//! ```

const K0: u64 = 0x243f_6a88_85a3_08d3; // digits of pi
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;
const K4: u64 = 0x4528_21e6_38d0_1377;

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

fn step(h: u64, a: u64, b: u64) -> u64 {
    fold(a ^ h ^ K1, b ^ h.rotate_left(32) ^ K2) ^ h.rotate_left(23)
}

fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// The keyed hash of `data` (see the module docs for the exact definition).
pub fn keyed_hash64(key: u64, data: &[u8]) -> u64 {
    let mut h = key ^ K0;
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        h = step(h, le64(&c[..8]), le64(&c[8..]));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut pad = [0u8; 16];
        pad[..rest.len()].copy_from_slice(rest);
        h = step(h, le64(&pad[..8]), le64(&pad[8..]));
    }
    fold(h ^ K3, data.len() as u64 ^ K4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_values() {
        // Pinned: these values are part of the record format.
        assert_eq!(keyed_hash64(0, b""), GOLDEN_EMPTY);
        assert_eq!(keyed_hash64(42, &[0xAB; 512]), GOLDEN_512);
        assert_eq!(keyed_hash64(7, b"lsvd"), GOLDEN_TAIL);
    }
    const GOLDEN_EMPTY: u64 = 0x2843_5547_c0d2_ed7b;
    const GOLDEN_512: u64 = 0x4204_b8cc_0988_354d;
    const GOLDEN_TAIL: u64 = 0x9674_8038_0635_7d3d;

    #[test]
    fn key_and_every_byte_matter() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        let base = keyed_hash64(1, &data);
        assert_ne!(base, keyed_hash64(2, &data));
        for pos in (0..data.len()).step_by(61) {
            let mut d = data.clone();
            d[pos] ^= 1;
            assert_ne!(keyed_hash64(1, &d), base, "flip at {pos}");
        }
        assert_ne!(keyed_hash64(1, &data[..4095]), base);
    }

    #[test]
    fn self_checksummed_blocks_do_not_collide() {
        // The case that defeats CRC32C: blocks ending in their own CRC32C.
        let block = crate::format::test_support::self_checksummed_block;
        let (x, y) = (block(0xAA), block(0x55));
        assert_eq!(
            crc32c::crc32c_append(9, &x),
            crc32c::crc32c_append(9, &y),
            "premise: CRC32C cannot tell these apart"
        );
        assert_ne!(keyed_hash64(9, &x), keyed_hash64(9, &y));
    }
}
