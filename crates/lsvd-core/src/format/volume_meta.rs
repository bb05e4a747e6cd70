//! Volume metadata: the first object of a volume, written once with put-if-absent.
//!
//! It fixes what never changes: the volume's id and size, its creation time, and
//! whether it is encrypted. Its existence in the store is what makes a volume exist.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDVOL\0"
//!      8    2 version (1, or 2 when a flag is set)
//!     10    2 version 1: reserved (ignored); version 2: flags (bit 0: encrypted,
//!             `<volume>/keys` holds its key; other bits refused)
//!     12    4 crc32c over the whole structure (this field zero)
//!     16   16 volume id
//!     32    8 size in bytes
//!     40    8 created, seconds since the Unix epoch
//!     48    2 name length n (at most 255)
//!     50    n name, UTF-8
//! ```

use super::{FormatError, Reader, VolumeId, Writer, check_crc, invalid};

pub const VOLUME_MAGIC: &[u8; 8] = b"LSVDVOL\0";
pub const VOLUME_VERSION: u16 = 1;
/// The version of metadata with flags (an encrypted volume's): binaries that predate
/// encryption refuse it instead of writing plaintext into an encrypted volume.
pub const VOLUME_VERSION_FLAGS: u16 = 2;
const FLAG_ENCRYPTED: u16 = 1;
const CRC_AT: usize = 12;
/// Longest name, in bytes (the length field could say more).
const MAX_NAME_BYTES: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMeta {
    pub volume: VolumeId,
    pub size_bytes: u64,
    pub created_unix_secs: u64,
    pub name: String,
    /// Objects are sealed with the data key in `<volume>/keys` (format/sealed.rs).
    pub encrypted: bool,
}

pub fn encode_volume_meta(m: &VolumeMeta) -> Vec<u8> {
    let name = m.name.as_bytes();
    assert!(
        name.len() <= MAX_NAME_BYTES,
        "volume names are validated to at most 255 bytes"
    );
    let mut w = Writer::with_capacity(50 + name.len());
    match m.encrypted {
        false => w.head(VOLUME_MAGIC, VOLUME_VERSION, 0),
        true => w.head(VOLUME_MAGIC, VOLUME_VERSION_FLAGS, FLAG_ENCRYPTED),
    }
    w.bytes(&m.volume.0);
    w.u64s(&[m.size_bytes, m.created_unix_secs]);
    w.u16(name.len() as u16);
    w.bytes(name);
    w.seal(CRC_AT)
}

pub fn decode_volume_meta(buf: &[u8]) -> Result<VolumeMeta, FormatError> {
    const WHAT: &str = "volume metadata";
    let mut r = Reader::new(buf, WHAT);
    let version = r.magic(VOLUME_MAGIC)?;
    let (flags, stored) = (r.u16()?, r.u32()?);
    let encrypted = match version {
        VOLUME_VERSION => false, // the field was reserved; never read
        VOLUME_VERSION_FLAGS if flags & !FLAG_ENCRYPTED == 0 => flags & FLAG_ENCRYPTED != 0,
        VOLUME_VERSION_FLAGS => return Err(invalid(WHAT, format!("unknown flags {flags:#06x}"))),
        version => {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version,
            });
        }
    };
    let volume = VolumeId(r.array()?);
    let [size_bytes, created_unix_secs] = r.u64s()?;
    let n = r.u16()? as usize;
    if n > MAX_NAME_BYTES {
        return Err(invalid(
            WHAT,
            format!("name of {n} bytes, at most {MAX_NAME_BYTES}"),
        ));
    }
    let name = r.take(n)?;
    if r.pos() != buf.len() {
        return Err(invalid(WHAT, "trailing bytes"));
    }
    check_crc(WHAT, buf, CRC_AT, stored)?;
    let name = String::from_utf8(name.to_vec()).map_err(|_| invalid(WHAT, "name is not UTF-8"))?;
    Ok(VolumeMeta {
        volume,
        size_bytes,
        created_unix_secs,
        name,
        encrypted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_each_flip_refused, refit_crc};

    /// Found with the format_supers fuzz target: the decoder took names of up to 65535
    /// bytes (the length field is 16 bits), though the layout allows 255 and
    /// `encode_volume_meta` panics on longer ones, so decoding then re-encoding such
    /// metadata panicked. Names longer than 255 bytes are now refused on read.
    #[test]
    fn fuzz_regression_name_longer_than_255_bytes_is_refused() {
        let name = "n".repeat(300);
        let mut buf = Vec::new();
        buf.extend_from_slice(VOLUME_MAGIC);
        buf.extend_from_slice(&VOLUME_VERSION.to_le_bytes());
        buf.extend_from_slice(&[0; 6]);
        buf.extend_from_slice(&[9; 16]);
        buf.extend_from_slice(&(1u64 << 30).to_le_bytes());
        buf.extend_from_slice(&1_800_000_000u64.to_le_bytes());
        buf.extend_from_slice(&300u16.to_le_bytes());
        buf.extend_from_slice(name.as_bytes());
        refit_crc(&mut buf, CRC_AT);
        let got = decode_volume_meta(&buf);
        assert!(matches!(got, Err(FormatError::Invalid { .. })), "{got:?}");
        // 255 bytes is the longest name, and it round-trips.
        let m = VolumeMeta {
            volume: VolumeId([9; 16]),
            size_bytes: 1 << 30,
            created_unix_secs: 1,
            name: "n".repeat(255),
            encrypted: false,
        };
        assert_eq!(decode_volume_meta(&encode_volume_meta(&m)), Ok(m));
    }

    #[test]
    fn round_trip_and_corruption() {
        let m = VolumeMeta {
            volume: VolumeId([9; 16]),
            size_bytes: 16 << 30,
            created_unix_secs: 1_800_000_000,
            name: "disk0".into(),
            encrypted: false,
        };
        let buf = encode_volume_meta(&m);
        assert_eq!(buf.len(), 55);
        assert_eq!(&buf[..8], VOLUME_MAGIC);
        assert_eq!(decode_volume_meta(&buf).expect("decodes"), m);
        assert_each_flip_refused(&buf, 0..buf.len(), 0x80, decode_volume_meta);
        // Encrypted: version 2 with the flag; a plain volume's bytes are unchanged.
        let enc = VolumeMeta {
            encrypted: true,
            ..m.clone()
        };
        let ebuf = encode_volume_meta(&enc);
        assert_eq!((ebuf[8], ebuf[10]), (2, 1));
        assert_eq!(decode_volume_meta(&ebuf).expect("decodes"), enc);
        assert_each_flip_refused(&ebuf, 0..ebuf.len(), 0x80, decode_volume_meta);
        // Version 1's reserved field is ignored, as it always was.
        let mut old = buf.clone();
        old[10] = 1;
        crate::format::test_support::refit_crc(&mut old, CRC_AT);
        assert_eq!(decode_volume_meta(&old).expect("decodes"), m);
    }
}
