//! The drive record of a chained or striped store (`<DIR>/.lsvd-chain`): which set of
//! drives a directory belongs to, at which position, and (for a chain) which drive
//! holds the log's tail. Only the byte layout lives here, with the other persisted
//! records, so the fuzz targets reach it; reading and atomically replacing the file is
//! the store's (`lsvd_store::chain::meta`). Rules: docs/format/chain.md.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDCHN\0"
//!      8    2 version (1)
//!     10    2 flags: bit 0 mirror_stale (others refused)
//!     12    4 crc32c over bytes 0..64 (this field zero)
//!     16   16 set id (chain_id)
//!     32    8 generation
//!     40    1 layout: 1 chain, 2 stripe
//!     41    1 copies per position (1..=2)
//!     42    2 drive count (1..=64)
//!     44    2 this drive's position (below the count)
//!     46    2 tail drive (below the count)
//!     48   16 reserved (0)
//! ```

use super::{FormatError, Writer, invalid, open_fixed_record};

pub const DRIVE_RECORD_MAGIC: &[u8; 8] = b"LSVDCHN\0";
pub const DRIVE_RECORD_VERSION: u16 = 1;
pub const DRIVE_RECORD_BYTES: usize = 64;
const CRC_AT: usize = 12;

/// Most drives in one chain or stripe.
pub const MAX_DRIVES: usize = 64;

/// Flag bit 0: see [`DriveRecord::mirror_stale`].
const FLAG_MIRROR_STALE: u16 = 1;

/// How the drives are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One log over the drives in turn: new objects on the tail drive.
    Chain,
    /// Objects spread over every drive by a hash of their key (RAID-0 under the log).
    Stripe,
}

impl Layout {
    fn code(self) -> u8 {
        match self {
            Layout::Chain => 1,
            Layout::Stripe => 2,
        }
    }
    fn from_code(c: u8) -> Option<Layout> {
        match c {
            1 => Some(Layout::Chain),
            2 => Some(Layout::Stripe),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Layout::Chain => "chain",
            Layout::Stripe => "stripe",
        }
    }
}

/// The record of one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveRecord {
    /// Random at creation, the same on every drive of the set.
    pub chain_id: [u8; 16],
    /// Raised by one at every tail move; the highest on any drive is current.
    pub generation: u64,
    pub layout: Layout,
    pub drive_count: u16,
    /// This drive's position (0-based) in the set.
    pub drive_index: u16,
    /// The drive new client objects go to (chain; 0 for a stripe).
    pub tail_index: u16,
    /// Directories per position: 1, or 2 for mirrored drives.
    pub copies: u8,
    /// Set on the copy that kept serving while its mirror was away (flag bit 0): the
    /// mirror missed writes and deletes, and is made an exact copy of this one at the
    /// next open that finds it.
    pub mirror_stale: bool,
}

/// Encode a record (64 bytes, little-endian, CRC32C over all of it with the CRC field
/// zero). Fields out of range are encoded as they are, and refused by the decoder.
pub fn encode_drive_record(r: &DriveRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(DRIVE_RECORD_BYTES);
    w.head(
        DRIVE_RECORD_MAGIC,
        DRIVE_RECORD_VERSION,
        if r.mirror_stale { FLAG_MIRROR_STALE } else { 0 },
    );
    w.bytes(&r.chain_id);
    w.u64(r.generation);
    w.bytes(&[r.layout.code(), r.copies]);
    w.u16(r.drive_count);
    w.u16(r.drive_index);
    w.u16(r.tail_index);
    w.zeros(DRIVE_RECORD_BYTES - w.buf.len());
    w.seal(CRC_AT)
}

/// Decode and verify a record; any deviation from the layout is an error.
pub fn decode_drive_record(buf: &[u8]) -> Result<DriveRecord, FormatError> {
    const WHAT: &str = "chain drive record";
    let (mut r, flags) = open_fixed_record(
        buf,
        WHAT,
        DRIVE_RECORD_BYTES,
        DRIVE_RECORD_MAGIC,
        DRIVE_RECORD_VERSION,
        FLAG_MIRROR_STALE,
    )?;
    let chain_id: [u8; 16] = r.array()?;
    let generation = r.u64()?;
    let [layout_code, copies]: [u8; 2] = r.array()?;
    let drive_count = r.u16()?;
    let drive_index = r.u16()?;
    let tail_index = r.u16()?;
    let reserved: [u8; 16] = r.array()?;
    if reserved != [0; 16] {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let layout = Layout::from_code(layout_code)
        .ok_or_else(|| invalid(WHAT, format!("unknown layout {layout_code}")))?;
    if !(1..=2).contains(&copies) {
        return Err(invalid(
            WHAT,
            format!("{copies} copies per drive, expected 1 or 2"),
        ));
    }
    let count = usize::from(drive_count);
    if count == 0 || count > MAX_DRIVES {
        return Err(invalid(
            WHAT,
            format!("drive count {count} outside 1..={MAX_DRIVES}"),
        ));
    }
    if drive_index >= drive_count || tail_index >= drive_count {
        return Err(invalid(WHAT, "drive or tail index past the drive count"));
    }
    Ok(DriveRecord {
        chain_id,
        generation,
        layout,
        drive_count,
        drive_index,
        tail_index,
        copies,
        mirror_stale: flags & FLAG_MIRROR_STALE != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{refit_crc, stored_crc};

    use crate::format::examples::drive_record as sample;

    const GOLDEN: [u8; DRIVE_RECORD_BYTES] = {
        let mut b = [0u8; DRIVE_RECORD_BYTES];
        let head = *b"LSVDCHN\0\x01\x00\x00\x00";
        let mut i = 0;
        while i < 12 {
            b[i] = head[i];
            i += 1;
        }
        while i < 32 {
            b[i] = if i >= 16 { 0xc5 } else { 0 };
            i += 1;
        }
        let gen_le = [8u8, 7, 6, 5, 4, 3, 2, 1];
        while i < 40 {
            b[i] = gen_le[i - 32];
            i += 1;
        }
        b[40] = 1;
        b[41] = 2;
        b[42] = 3;
        b[44] = 1;
        b[46] = 2;
        b
    };
    const GOLDEN_CRC: u32 = 0x4d10_44c4;

    /// The bytes of a known record, field by field (CRC aside, checked against the
    /// constant), then every single-bit flip refused.
    #[test]
    fn golden_bytes_and_every_bit_flip() {
        let buf = encode_drive_record(&sample());
        assert_eq!(buf.len(), DRIVE_RECORD_BYTES);
        assert_eq!(&buf[..12], &GOLDEN[..12]);
        assert_eq!(&buf[16..], &GOLDEN[16..]);
        let crc = stored_crc(&buf, CRC_AT);
        assert_eq!(crc, GOLDEN_CRC, "CRC of the golden record: {crc:#010x}");
        assert_eq!(decode_drive_record(&buf).expect("decodes"), sample());
        for bit in 0..DRIVE_RECORD_BYTES * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_drive_record(&bad).is_err(), "flip of bit {bit}");
        }
        assert!(decode_drive_record(&buf[..DRIVE_RECORD_BYTES - 1]).is_err());
        let mut longer = buf.clone();
        longer.push(0);
        assert!(decode_drive_record(&longer).is_err());
        let flagged = DriveRecord {
            mirror_stale: true,
            ..sample()
        };
        let b = encode_drive_record(&flagged);
        assert_eq!(&b[10..12], &[1, 0], "flag bit 0");
        assert_eq!(decode_drive_record(&b).expect("decodes"), flagged);
        let stripe = DriveRecord {
            layout: Layout::Stripe,
            tail_index: 0,
            copies: 1,
            ..sample()
        };
        let b = encode_drive_record(&stripe);
        assert_eq!(&b[40..42], &[2, 1], "layout and copies");
        assert_eq!(decode_drive_record(&b).expect("decodes"), stripe);
        assert!(decode_drive_record(&[]).is_err());
    }

    /// Values the CRC cannot catch (written that way by a bug): refused too.
    #[test]
    fn out_of_range_fields_are_refused() {
        for r in [
            DriveRecord {
                drive_count: 0,
                drive_index: 0,
                tail_index: 0,
                ..sample()
            },
            DriveRecord {
                drive_index: 3,
                ..sample()
            },
            DriveRecord {
                tail_index: 3,
                ..sample()
            },
            DriveRecord {
                drive_count: MAX_DRIVES as u16 + 1,
                ..sample()
            },
            DriveRecord {
                copies: 0,
                ..sample()
            },
            DriveRecord {
                copies: 3,
                ..sample()
            },
        ] {
            let e = decode_drive_record(&encode_drive_record(&r)).expect_err("refused");
            assert!(
                matches!(e, FormatError::Invalid { .. }),
                "{r:?}: {e} is not a field check"
            );
        }
        // The largest valid set decodes.
        let widest = DriveRecord {
            drive_count: MAX_DRIVES as u16,
            drive_index: MAX_DRIVES as u16 - 1,
            tail_index: MAX_DRIVES as u16 - 1,
            ..sample()
        };
        assert_eq!(
            decode_drive_record(&encode_drive_record(&widest)),
            Ok(widest)
        );
        // An unknown layout code, with a valid CRC.
        let mut b = encode_drive_record(&sample());
        b[40] = 3;
        refit_crc(&mut b, 12);
        assert!(matches!(
            decode_drive_record(&b),
            Err(FormatError::Invalid { .. })
        ));
    }
}
