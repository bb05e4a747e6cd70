//! The key record of an encrypted volume (`<volume>/keys`): its data key, wrapped.
//!
//! Why a record of its own: the data key (random, 32 bytes, made at `lsvd create
//! --encrypt`) encrypts every object for the volume's whole life, so it can never
//! change; the key the user holds (the key-encryption key, a file of 32 random bytes)
//! should be changeable without rewriting data. The record holds the data key sealed
//! under the user's key, and `lsvd key rotate` rewrites only this record. The
//! cryptography is in `lsvd_store::sealed`; this is the byte layout.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDKEYS"
//!      8    2 version (1)
//!     10    2 flags (0)
//!     12    4 crc32c over the whole record (this field zero)
//!     16    2 cipher (1: AES-256-GCM, per-object keys by HKDF-SHA256, 4 KiB segments)
//!     18    6 reserved (0)
//!     24    8 key id: the first 8 bytes of HMAC-SHA256(user key, "lsvd key id v1")
//!     32   12 nonce of the wrap (random)
//!     44   48 the data key sealed under the user key (32 bytes + 16-byte tag)
//!     92      end
//! ```

use super::{FormatError, Writer, invalid, open_fixed_record};

pub const KEYS_MAGIC: &[u8; 8] = b"LSVDKEYS";
pub const KEYS_VERSION: u16 = 1;
pub const KEYS_RECORD_BYTES: usize = 92;
/// AES-256-GCM; per-object keys by HKDF-SHA256; 4 KiB segments (format/sealed.rs).
pub const CIPHER_AES256_GCM: u16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeKeys {
    pub cipher: u16,
    /// Names the user key without revealing it, for "wrong key" messages.
    pub key_id: [u8; 8],
    pub nonce: [u8; 12],
    pub wrapped_key: [u8; 48],
}

pub fn encode_volume_keys(k: &VolumeKeys) -> Vec<u8> {
    let mut w = Writer::with_capacity(KEYS_RECORD_BYTES);
    w.head(KEYS_MAGIC, KEYS_VERSION, 0);
    w.u16(k.cipher);
    w.zeros(6);
    w.bytes(&k.key_id);
    w.bytes(&k.nonce);
    w.bytes(&k.wrapped_key);
    w.seal(12)
}

pub fn decode_volume_keys(buf: &[u8]) -> Result<VolumeKeys, FormatError> {
    const WHAT: &str = "volume key record";
    let (mut r, _flags) =
        open_fixed_record(buf, WHAT, KEYS_RECORD_BYTES, KEYS_MAGIC, KEYS_VERSION, 0)?;
    let cipher = r.u16()?;
    if cipher != CIPHER_AES256_GCM {
        return Err(invalid(WHAT, format!("unknown cipher {cipher}")));
    }
    if r.take(6)?.iter().any(|&b| b != 0) {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    Ok(VolumeKeys {
        cipher,
        key_id: r.array()?,
        nonce: r.array()?,
        wrapped_key: r.array()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::assert_each_flip_refused;

    fn sample() -> VolumeKeys {
        VolumeKeys {
            cipher: CIPHER_AES256_GCM,
            key_id: [1; 8],
            nonce: [2; 12],
            wrapped_key: [3; 48],
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_volume_keys(&sample());
        assert_eq!(buf.len(), KEYS_RECORD_BYTES);
        assert_eq!(&buf[..8], KEYS_MAGIC);
        assert_eq!(crc32c::crc32c(&buf), GOLDEN_CRC, "the layout changed");
        assert_eq!(decode_volume_keys(&buf), Ok(sample()));
        assert_each_flip_refused(&buf, 0..buf.len(), 0x40, decode_volume_keys);
        assert!(decode_volume_keys(&buf[..91]).is_err());
    }

    const GOLDEN_CRC: u32 = 0x3a70_22c7;
}
