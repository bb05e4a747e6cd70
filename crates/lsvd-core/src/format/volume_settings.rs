//! Volume settings: the choices about a volume that its owner may change after
//! creating it, kept in the store beside it so that every server of the volume makes
//! the same ones (today: how new objects are compressed).
//!
//! Written at `<volume>/settings` by `lsvd create` and `lsvd config`, overwritten
//! whole (last writer wins); read by `lsvd serve` when it opens the volume. A volume
//! without one has the defaults. A change applies to objects written from the next
//! open on; objects already written keep what they were written with (each object
//! says how its chunks are stored), until GC rewrites them.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDSET\0"
//!      8    2 version (1)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over bytes 0..48 (this field zero)
//!     16   16 volume id (the settings of another volume of the same name are refused)
//!     32    1 compression codec: 0 none, 1 lz4, 2 zstd
//!     33    1 compression level: 1..=19 for zstd, 0 otherwise
//!     34    6 reserved (0)
//!     40    8 changed at, milliseconds since the Unix epoch
//! ```

use super::{FormatError, VolumeId, Writer, invalid, open_fixed_record};
use crate::compression::{Codec, Compression};

pub const VOLUME_SETTINGS_MAGIC: &[u8; 8] = b"LSVDSET\0";
pub const VOLUME_SETTINGS_VERSION: u16 = 1;
pub const VOLUME_SETTINGS_BYTES: usize = 48;
const CRC_AT: usize = 12;
const WHAT: &str = "volume settings";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSettings {
    pub volume: VolumeId,
    /// How objects written from now on store their chunks.
    pub compression: Compression,
    pub changed_unix_ms: u64,
}

pub fn encode_volume_settings(s: &VolumeSettings) -> Vec<u8> {
    let level = match s.compression {
        Compression::Zstd(level) => level as u8,
        Compression::None | Compression::Lz4 => 0,
    };
    let mut w = Writer::with_capacity(VOLUME_SETTINGS_BYTES);
    w.head(VOLUME_SETTINGS_MAGIC, VOLUME_SETTINGS_VERSION, 0);
    w.bytes(&s.volume.0);
    w.bytes(&[s.compression.codec().code(), level]);
    w.zeros(6);
    w.u64(s.changed_unix_ms);
    w.seal(CRC_AT)
}

pub fn decode_volume_settings(buf: &[u8]) -> Result<VolumeSettings, FormatError> {
    let (mut r, _flags) = open_fixed_record(
        buf,
        WHAT,
        VOLUME_SETTINGS_BYTES,
        VOLUME_SETTINGS_MAGIC,
        VOLUME_SETTINGS_VERSION,
        0,
    )?;
    let volume = VolumeId(r.array()?);
    let [codec, level]: [u8; 2] = r.array()?;
    if r.array::<6>()? != [0; 6] {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let compression = match (Codec::from_code(codec), level) {
        (Some(Codec::None), 0) => Compression::None,
        (Some(Codec::Lz4), 0) => Compression::Lz4,
        (Some(Codec::Zstd), 1..=19) => Compression::Zstd(level as i32),
        _ => {
            return Err(invalid(
                WHAT,
                format!("compression codec {codec} at level {level}"),
            ));
        }
    };
    Ok(VolumeSettings {
        volume,
        compression,
        changed_unix_ms: r.u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_each_flip_refused, refit_crc, stored_crc};

    fn sample(compression: Compression) -> VolumeSettings {
        VolumeSettings {
            volume: VolumeId([0x5e; 16]),
            compression,
            changed_unix_ms: 1_764_000_000_000,
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_volume_settings(&sample(Compression::Zstd(7)));
        assert_eq!(buf.len(), VOLUME_SETTINGS_BYTES);
        assert_eq!(&buf[..12], b"LSVDSET\0\x01\x00\x00\x00");
        assert_eq!(&buf[16..32], &[0x5e; 16]);
        assert_eq!(&buf[32..40], &[2, 7, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&buf[40..48], &1_764_000_000_000u64.to_le_bytes());
        assert_eq!(stored_crc(&buf, CRC_AT), GOLDEN_CRC);
        assert_each_flip_refused(&buf, 0..buf.len(), 0x20, decode_volume_settings);
        assert!(decode_volume_settings(&buf[..47]).is_err());
        for c in [
            Compression::None,
            Compression::Lz4,
            Compression::Zstd(1),
            Compression::Zstd(19),
        ] {
            let s = sample(c);
            assert_eq!(decode_volume_settings(&encode_volume_settings(&s)), Ok(s));
        }
    }
    const GOLDEN_CRC: u32 = 0xcf84_0651;

    #[test]
    fn impossible_compression_is_refused() {
        for (codec, level) in [(0, 1), (1, 3), (2, 0), (2, 20), (3, 0)] {
            let mut buf = encode_volume_settings(&sample(Compression::None));
            buf[32..34].copy_from_slice(&[codec, level]);
            refit_crc(&mut buf, CRC_AT);
            assert!(
                decode_volume_settings(&buf).is_err(),
                "codec {codec} level {level}"
            );
        }
    }
}
