//! XTS-AES-256 (IEEE 1619) for the local files of a volume served with
//! `--encrypt-local`: the write log and the read cache.
//!
//! Why XTS and not the AEAD the objects use: these files are read and written in
//! place, at any 512-byte-aligned offset (a read of the write log fetches only the
//! blocks it needs), and the same offset is written again and again (the log wraps,
//! cache slots are reused), with no room beside the data for a nonce or a tag. XTS
//! is what disk encryption uses for exactly this (dm-crypt, LUKS): a tweakable cipher
//! per 16-byte block whose tweak is the block's position, so ciphertext is as long as
//! the plaintext and any block can be read alone. What it does not hide: whether a
//! 16-byte block at one position holds the same bytes as before. What it does not
//! do: authenticate. The formats' own CRC32C catch accidents, not an attacker who can
//! write the local disk (docs/format/local-encryption.md).
//!
//! Data units of 512 bytes, unit number = byte offset / 512, tweak
//! `T = AES(k2, unit as u128 little-endian)`, block `j` of the unit:
//! `C = AES(k1, P xor T·αʲ) xor T·αʲ` in GF(2¹²⁸). Whole units go through aws-lc's own
//! XTS (its AES-NI code, through aws-lc-sys: aws-lc-rs does not wrap XTS); the part
//! of a unit at either edge of a request (a read of part of a record, a slot-table
//! entry) through the same construction built here from AES-256 block encryption,
//! which can start at any block of a unit. The unit tests check IEEE 1619's vector 10
//! and that both paths agree.

use aws_lc_rs::cipher::{
    AES_256, DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
};
use lsvd_core::error::{Error, ErrorKind, Result};

/// Bytes of an XTS data unit (a sector): the tweak is derived once per unit.
pub const XTS_UNIT_BYTES: u64 = 512;
/// Reads and writes through [`XtsKey`] start and end on multiples of this.
pub const XTS_BLOCK_BYTES: u64 = 16;

/// A pair of AES-256 keys (data key, tweak key) for one local file.
pub struct XtsKey {
    encrypt: EncryptingKey,
    decrypt: DecryptingKey,
    tweak: EncryptingKey,
    /// Both keys, for aws-lc's XTS (zeroed on drop).
    raw: [u8; 64],
}

impl Drop for XtsKey {
    fn drop(&mut self) {
        self.raw.fill(0);
    }
}

impl std::fmt::Debug for XtsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XtsKey(..)")
    }
}

/// The keys of one volume's local files under `--encrypt-local`, one per file so
/// that equal bytes at equal offsets of two files differ, and an id the write log's
/// superblock records (format/cache_super.rs).
#[derive(Debug)]
pub struct LocalKeys {
    pub id: [u8; 8],
    pub write_log: std::sync::Arc<XtsKey>,
    pub read_cache: std::sync::Arc<XtsKey>,
    pub slot_table: std::sync::Arc<XtsKey>,
}

fn cipher_error() -> Error {
    Error::new(ErrorKind::LocalIo, "AES failed (local encryption)")
}

impl XtsKey {
    /// From 64 bytes: the data key, then the tweak key. They must differ (IEEE 1619).
    pub fn new(key: &[u8; 64]) -> Result<XtsKey> {
        let (k1, k2) = key.split_at(32);
        if k1 == k2 {
            return Err(Error::bad_input("XTS: the two halves of the key are equal"));
        }
        let unbound = |k: &[u8]| UnboundCipherKey::new(&AES_256, k).map_err(|_| cipher_error());
        Ok(XtsKey {
            encrypt: EncryptingKey::ecb(unbound(k1)?).map_err(|_| cipher_error())?,
            decrypt: DecryptingKey::ecb(unbound(k1)?).map_err(|_| cipher_error())?,
            tweak: EncryptingKey::ecb(unbound(k2)?).map_err(|_| cipher_error())?,
            raw: *key,
        })
    }

    /// Encrypt `buf`, which lives at byte `offset` of the file, in place.
    pub fn encrypt(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.apply(buf, offset, true)
    }

    /// Decrypt `buf`, read from byte `offset` of the file, in place.
    pub fn decrypt(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.apply(buf, offset, false)
    }

    fn apply(&self, buf: &mut [u8], offset: u64, encrypt: bool) -> Result<()> {
        if !offset.is_multiple_of(XTS_BLOCK_BYTES)
            || !(buf.len() as u64).is_multiple_of(XTS_BLOCK_BYTES)
        {
            return Err(Error::bad_input(format!(
                "local encryption: {} bytes at {offset} are not whole 16-byte blocks",
                buf.len()
            )));
        }
        if buf.is_empty() {
            return Ok(());
        }
        // Whole units in the middle through aws-lc's XTS; the edges block by block.
        let end = offset + buf.len() as u64;
        let first_whole = offset.div_ceil(XTS_UNIT_BYTES) * XTS_UNIT_BYTES;
        let last_whole = end / XTS_UNIT_BYTES * XTS_UNIT_BYTES;
        if first_whole < last_whole {
            let (head, rest) = buf.split_at_mut((first_whole - offset) as usize);
            let (middle, tail) = rest.split_at_mut((last_whole - first_whole) as usize);
            self.blocks(head, offset, encrypt)?;
            units::apply(&self.raw, middle, first_whole / XTS_UNIT_BYTES, encrypt)?;
            return self.blocks(tail, last_whole, encrypt);
        }
        self.blocks(buf, offset, encrypt)
    }

    /// The block-by-block path: any whole 16-byte blocks.
    fn blocks(&self, buf: &mut [u8], offset: u64, encrypt: bool) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let tweaks = self.tweaks(offset, buf.len())?;
        xor_in_place(buf, &tweaks);
        if encrypt {
            self.encrypt
                .less_safe_encrypt(buf, EncryptionContext::None)
                .map_err(|_| cipher_error())?;
        } else {
            self.decrypt
                .decrypt(buf, DecryptionContext::None)
                .map_err(|_| cipher_error())?;
        }
        xor_in_place(buf, &tweaks);
        Ok(())
    }

    /// The tweak of every 16-byte block of `len` bytes at `offset`.
    fn tweaks(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let first_unit = offset / XTS_UNIT_BYTES;
        let last_unit = (offset + len as u64 - 1) / XTS_UNIT_BYTES;
        // Every unit's initial tweak in one pass of the tweak key.
        let mut units = Vec::with_capacity(((last_unit - first_unit + 1) * 16) as usize);
        for unit in first_unit..=last_unit {
            units.extend_from_slice(&u128::from(unit).to_le_bytes());
        }
        self.tweak
            .less_safe_encrypt(&mut units, EncryptionContext::None)
            .map_err(|_| cipher_error())?;
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        let end = offset + len as u64;
        for (i, initial) in units.chunks_exact(16).enumerate() {
            let unit_start = (first_unit + i as u64) * XTS_UNIT_BYTES;
            let mut t = u128::from_le_bytes(initial.try_into().expect("16-byte chunks"));
            // Blocks of the unit before `at` (only in the first unit).
            for _ in 0..(at - unit_start) / XTS_BLOCK_BYTES {
                t = times_alpha(t);
            }
            let stop = end.min(unit_start + XTS_UNIT_BYTES);
            while at < stop {
                out.extend_from_slice(&t.to_le_bytes());
                t = times_alpha(t);
                at += XTS_BLOCK_BYTES;
            }
        }
        Ok(out)
    }
}

/// Whole data units through aws-lc's `EVP_aes_256_xts` (FFI: aws-lc-rs does not wrap
/// it).
mod units {
    use std::os::raw::c_int;

    use aws_lc_sys::{
        EVP_CIPHER_CTX, EVP_CIPHER_CTX_free, EVP_CIPHER_CTX_new, EVP_DecryptInit_ex,
        EVP_DecryptUpdate, EVP_EncryptInit_ex, EVP_EncryptUpdate, EVP_aes_256_xts,
    };

    use super::{XTS_UNIT_BYTES, cipher_error};
    use lsvd_core::error::Result;

    /// An owned cipher context, freed on drop.
    struct Ctx(*mut EVP_CIPHER_CTX);

    impl Drop for Ctx {
        fn drop(&mut self) {
            // SAFETY: made by EVP_CIPHER_CTX_new, freed once (also frees its key
            // schedule, which aws-lc clears).
            unsafe { EVP_CIPHER_CTX_free(self.0) }
        }
    }

    /// En- or decrypt `buf` (whole units) in place; its first unit is number
    /// `first_unit`.
    pub(super) fn apply(
        key: &[u8; 64],
        buf: &mut [u8],
        first_unit: u64,
        encrypt: bool,
    ) -> Result<()> {
        debug_assert!((buf.len() as u64).is_multiple_of(XTS_UNIT_BYTES));
        // SAFETY: plain constructor; null is checked.
        let ctx = Ctx(unsafe { EVP_CIPHER_CTX_new() });
        if ctx.0.is_null() {
            return Err(cipher_error());
        }
        let init = |key: *const u8, iv: *const u8| -> c_int {
            // SAFETY: `ctx` is live; the cipher is given with the key (first call) and
            // left null after (only the IV changes); `key` is 64 bytes and `iv` 16, or
            // null.
            unsafe {
                let cipher = if key.is_null() {
                    std::ptr::null()
                } else {
                    EVP_aes_256_xts()
                };
                if encrypt {
                    EVP_EncryptInit_ex(ctx.0, cipher, std::ptr::null_mut(), key, iv)
                } else {
                    EVP_DecryptInit_ex(ctx.0, cipher, std::ptr::null_mut(), key, iv)
                }
            }
        };
        if init(key.as_ptr(), std::ptr::null()) != 1 {
            return Err(cipher_error());
        }
        for (i, unit) in buf.chunks_exact_mut(XTS_UNIT_BYTES as usize).enumerate() {
            let iv = u128::from(first_unit + i as u64).to_le_bytes();
            if init(std::ptr::null(), iv.as_ptr()) != 1 {
                return Err(cipher_error());
            }
            let mut out_len: c_int = 0;
            let ptr = unit.as_mut_ptr();
            // SAFETY: in place (input and output the same 512 bytes, which EVP
            // allows); `out_len` is a valid int.
            let ok = unsafe {
                if encrypt {
                    EVP_EncryptUpdate(ctx.0, ptr, &mut out_len, ptr, XTS_UNIT_BYTES as c_int)
                } else {
                    EVP_DecryptUpdate(ctx.0, ptr, &mut out_len, ptr, XTS_UNIT_BYTES as c_int)
                }
            };
            if ok != 1 || out_len != XTS_UNIT_BYTES as c_int {
                return Err(cipher_error());
            }
        }
        Ok(())
    }
}

/// Multiply by α (x) in GF(2¹²⁸) modulo x¹²⁸ + x⁷ + x² + x + 1, with the bytes of the
/// tweak read as a little-endian number (IEEE 1619's convention).
fn times_alpha(t: u128) -> u128 {
    let carry = t >> 127;
    (t << 1) ^ (carry * 0x87)
}

fn xor_in_place(buf: &mut [u8], with: &[u8]) {
    for (b, w) in buf.iter_mut().zip(with) {
        *b ^= w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// IEEE 1619-2007, XTS-AES-256 vector 10: data unit 0xff, 512 bytes 00..ff twice.
    #[test]
    fn ieee_1619_vector_10() {
        let key: [u8; 64] = hex(
            "2718281828459045235360287471352662497757247093699959574966967627
             3141592653589793238462643383279502884197169399375105820974944592",
        )
        .try_into()
        .expect("64 bytes");
        let key = XtsKey::new(&key).expect("key");
        let plain: Vec<u8> = (0..512).map(|i| i as u8).collect();
        let mut buf = plain.clone();
        key.encrypt(&mut buf, 0xff * XTS_UNIT_BYTES)
            .expect("encrypt");
        let want_start = hex(
            "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b
             5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd",
        );
        let want_end = hex("773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151");
        assert_eq!(&buf[..64], &want_start[..]);
        assert_eq!(&buf[512 - 32..], &want_end[..]);
        key.decrypt(&mut buf, 0xff * XTS_UNIT_BYTES)
            .expect("decrypt");
        assert_eq!(buf, plain);
    }

    /// A block read alone, anywhere in a unit, matches what a whole write produced:
    /// what reading part of a log record needs.
    #[test]
    fn any_aligned_part_decrypts_alone() {
        let mut key = [7u8; 64];
        key[40] = 1;
        let key = XtsKey::new(&key).expect("key");
        let plain: Vec<u8> = (0..8192u32).map(|i| (i * 31 % 251) as u8).collect();
        let base = 3 * 4096;
        let mut sealed = plain.clone();
        key.encrypt(&mut sealed, base).expect("encrypt");
        assert_ne!(sealed, plain);
        for (start, len) in [
            (0, 16),
            (496, 48),
            (512, 4096),
            (1008, 7184 - 1008),
            (8176, 16),
        ] {
            let mut part = sealed[start..start + len].to_vec();
            key.decrypt(&mut part, base + start as u64)
                .expect("decrypt");
            assert_eq!(part, plain[start..start + len], "{start}+{len}");
        }
        // The block path alone gives the same bytes as the whole-unit path.
        let mut by_blocks = plain.clone();
        key.blocks(&mut by_blocks, base, true).expect("encrypt");
        assert_eq!(by_blocks, sealed);
        // The same bytes elsewhere encrypt differently.
        let mut moved = plain.clone();
        key.encrypt(&mut moved, base + 512).expect("encrypt");
        assert_ne!(moved[512..], sealed[512..]);
        assert!(key.encrypt(&mut [0u8; 15], 0).is_err());
        assert!(key.encrypt(&mut [0u8; 16], 8).is_err());
        assert!(XtsKey::new(&[1u8; 64]).is_err());
    }
}
