//! Write-log records: what one group commit appends to the cache device.
//!
//! A record is a header (padded to [`LOG_ALIGN_BYTES`]) followed by the data of its
//! extents, also padded. One CRC32C covers the header and the data; a keyed,
//! non-linear 64-bit hash of the data (version 2, see [`super::keyed_hash`]) catches the
//! torn records CRC32C cannot: data sectors that kept an older block which ends in its
//! own CRC32C. A record torn anywhere fails validation and ends the log at recovery.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDREC\0"
//!      8    2 version (2; version 1 is still read)
//!     10    2 flags (0)
//!     12    4 header_bytes (multiple of 4096)
//!     16   16 volume id
//!     32    8 sequence number
//!     40    4 extent count
//!     44    4 data sectors (sum of data extents)
//!     48    4 crc32c over header (this field zero) then data
//!     52    4 crc32c of the previous record in the log (0 for the first)
//!     56    8 keyed hash of the data (version 2; reserved 0 in version 1)
//!     64 16*n extents: lba u64, sectors u32, kind u32 (0 data, 1 zero)
//! ```

use super::{FormatError, Reader, SECTOR_BYTES, VolumeId, Writer, align_up, invalid};

pub const RECORD_MAGIC: &[u8; 8] = b"LSVDREC\0";
/// Version written. Version 1 (no data hash) is still accepted on read, so a log left
/// by an older build recovers.
pub const RECORD_VERSION: u16 = 2;
const RECORD_VERSION_V1: u16 = 1;
/// Records start and end on this boundary in the log.
pub const LOG_ALIGN_BYTES: u64 = 4096;
const FIXED_BYTES: usize = 64;
const EXTENT_BYTES: usize = 16;
const CRC_AT: usize = 48;
/// Upper bound on extents in one record, so a corrupt count cannot ask for gigabytes.
pub const MAX_RECORD_EXTENTS: u32 = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// The extent's data follows in the record.
    Data,
    /// The range reads as zeros from now on (TRIM or WRITE_ZEROES); no data.
    Zero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordExtent {
    pub lba: u64,
    pub sectors: u32,
    pub kind: ExtentKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// Format version the record was written with (1 or 2).
    pub version: u16,
    pub volume: VolumeId,
    pub seq: u64,
    pub extents: Vec<RecordExtent>,
    /// Bytes of header on disk, including padding; data starts here.
    pub header_bytes: u32,
    pub data_sectors: u32,
    pub crc: u32,
    pub prev_crc: u32,
    /// [`record_data_hash`] of the data (version 2; 0 and unchecked in version 1).
    pub data_hash: u64,
}

impl RecordHeader {
    pub fn data_bytes(&self) -> u64 {
        self.data_sectors as u64 * SECTOR_BYTES
    }
    /// Bytes the record occupies in the log.
    pub fn total_bytes(&self) -> u64 {
        self.header_bytes as u64 + align_up(self.data_bytes(), LOG_ALIGN_BYTES)
    }
}

/// The keyed hash a version-2 record stores over its data: keyed by the record's
/// identity (volume, sequence number, predecessor), so no stale block can match by
/// construction. `key = seq ^ (prev_crc << 32) ^ le64(volume[0..8]) ^ le64(volume[8..16])`.
pub fn record_data_hash(volume: VolumeId, seq: u64, prev_crc: u32, data: &[u8]) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&volume.0[..8]);
    hi.copy_from_slice(&volume.0[8..]);
    let key = seq ^ (u64::from(prev_crc) << 32) ^ u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi);
    super::keyed_hash::keyed_hash64(key, data)
}

/// Header size for `extent_count` extents.
pub fn header_bytes_for(extent_count: usize) -> u64 {
    align_up(
        (FIXED_BYTES + EXTENT_BYTES * extent_count) as u64,
        LOG_ALIGN_BYTES,
    )
}

/// Bytes a record with these extents occupies in the log.
pub fn record_bytes_for(extent_count: usize, data_bytes: u64) -> u64 {
    header_bytes_for(extent_count) + align_up(data_bytes, LOG_ALIGN_BYTES)
}

/// Encode a record: header, data, padding. `data` is the concatenation of the data
/// extents' bytes in order. Returns the bytes to append to the log.
pub fn encode_record(
    volume: VolumeId,
    seq: u64,
    prev_crc: u32,
    extents: &[RecordExtent],
    data: &[u8],
) -> Vec<u8> {
    let data_sectors: u64 = extents
        .iter()
        .filter(|e| e.kind == ExtentKind::Data)
        .map(|e| e.sectors as u64)
        .sum();
    assert_eq!(
        data_sectors * SECTOR_BYTES,
        data.len() as u64,
        "record data length must match its extents"
    );
    let header_bytes = header_bytes_for(extents.len()) as usize;
    let total = record_bytes_for(extents.len(), data.len() as u64) as usize;
    let mut w = Writer::with_capacity(total);
    w.bytes(RECORD_MAGIC);
    w.u16(RECORD_VERSION);
    w.u16(0);
    w.u32(header_bytes as u32);
    w.bytes(&volume.0);
    w.u64(seq);
    w.u32(extents.len() as u32);
    w.u32(data_sectors as u32);
    w.u32(0); // crc, filled below
    w.u32(prev_crc);
    w.u64(record_data_hash(volume, seq, prev_crc, data));
    for e in extents {
        w.u64(e.lba);
        w.u32(e.sectors);
        w.u32(match e.kind {
            ExtentKind::Data => 0,
            ExtentKind::Zero => 1,
        });
    }
    w.zeros(header_bytes - w.buf.len());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&w.buf), data);
    w.put_u32_at(CRC_AT, crc);
    w.bytes(data);
    w.zeros(total - w.buf.len());
    w.buf
}

/// The header bytes of a decoded record without padding (`64 + 16 * extents`),
/// exactly as they are on disk: what the write-log index stores per record.
pub fn encode_header_prefix(h: &RecordHeader) -> Vec<u8> {
    let mut w = Writer::with_capacity(FIXED_BYTES + EXTENT_BYTES * h.extents.len());
    w.bytes(RECORD_MAGIC);
    w.u16(h.version);
    w.u16(0);
    w.u32(h.header_bytes);
    w.bytes(&h.volume.0);
    w.u64(h.seq);
    w.u32(h.extents.len() as u32);
    w.u32(h.data_sectors);
    w.u32(h.crc);
    w.u32(h.prev_crc);
    w.u64(h.data_hash);
    for e in &h.extents {
        w.u64(e.lba);
        w.u32(e.sectors);
        w.u32(match e.kind {
            ExtentKind::Data => 0,
            ExtentKind::Zero => 1,
        });
    }
    w.buf
}

/// Decode the header from the first bytes of a record (at least the whole header).
/// Does not check the CRC: that needs the data, see [`verify_record`].
pub fn decode_record_header(buf: &[u8]) -> Result<RecordHeader, FormatError> {
    const WHAT: &str = "write-log record";
    let mut r = Reader::new(buf, WHAT);
    if &r.array::<8>()? != RECORD_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    let version = r.u16()?;
    if version != RECORD_VERSION && version != RECORD_VERSION_V1 {
        return Err(FormatError::UnsupportedVersion {
            what: WHAT,
            version,
        });
    }
    let _flags = r.u16()?;
    let header_bytes = r.u32()?;
    let volume = VolumeId(r.array()?);
    let seq = r.u64()?;
    let extent_count = r.u32()?;
    let data_sectors = r.u32()?;
    let crc = r.u32()?;
    let prev_crc = r.u32()?;
    let data_hash = r.u64()?;
    if extent_count > MAX_RECORD_EXTENTS {
        return Err(invalid(
            WHAT,
            format!("extent count {extent_count} exceeds {MAX_RECORD_EXTENTS}"),
        ));
    }
    if header_bytes as u64 != header_bytes_for(extent_count as usize) {
        return Err(invalid(
            WHAT,
            format!("header size {header_bytes} does not fit {extent_count} extents"),
        ));
    }
    let mut extents = Vec::with_capacity(extent_count as usize);
    let mut sum: u64 = 0;
    for _ in 0..extent_count {
        let lba = r.u64()?;
        let sectors = r.u32()?;
        let kind = match r.u32()? {
            0 => ExtentKind::Data,
            1 => ExtentKind::Zero,
            k => return Err(invalid(WHAT, format!("unknown extent kind {k}"))),
        };
        if sectors == 0 {
            return Err(invalid(WHAT, "zero-length extent"));
        }
        if kind == ExtentKind::Data {
            sum += sectors as u64;
        }
        extents.push(RecordExtent { lba, sectors, kind });
    }
    if sum != data_sectors as u64 {
        return Err(invalid(WHAT, "data sectors do not match extents"));
    }
    Ok(RecordHeader {
        version,
        volume,
        seq,
        extents,
        header_bytes,
        data_sectors,
        crc,
        prev_crc,
        data_hash,
    })
}

/// Verify the CRC (and, from version 2, the keyed data hash) of a whole record (`buf`
/// holds at least header + data).
pub fn verify_record(header: &RecordHeader, buf: &[u8]) -> Result<(), FormatError> {
    let end = header.header_bytes as usize + header.data_bytes() as usize;
    if buf.len() < end {
        return Err(FormatError::Truncated {
            what: "write-log record",
            need: end,
            have: buf.len(),
        });
    }
    let computed = crc32c::crc32c_append(
        super::crc_with_hole(&buf[..header.header_bytes as usize], CRC_AT),
        &buf[header.header_bytes as usize..end],
    );
    if computed != header.crc {
        return Err(FormatError::BadChecksum {
            what: "write-log record",
            stored: header.crc,
            computed,
        });
    }
    if header.version >= RECORD_VERSION {
        let data = &buf[header.header_bytes as usize..end];
        let computed = record_data_hash(header.volume, header.seq, header.prev_crc, data);
        if computed != header.data_hash {
            return Err(invalid(
                "write-log record",
                format!(
                    "data hash mismatch (stored {:#018x}, computed {computed:#018x}): torn record",
                    header.data_hash
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let extents = [
            RecordExtent {
                lba: 8,
                sectors: 1,
                kind: ExtentKind::Data,
            },
            RecordExtent {
                lba: 100,
                sectors: 16,
                kind: ExtentKind::Zero,
            },
        ];
        encode_record(VolumeId([7; 16]), 42, 0x0102_0304, &extents, &[0xAB; 512])
    }

    #[test]
    fn round_trip_and_layout() {
        let buf = sample();
        assert_eq!(buf.len(), 8192);
        let h = decode_record_header(&buf).expect("decodes");
        assert_eq!(h.seq, 42);
        assert_eq!(h.header_bytes, 4096);
        assert_eq!(h.data_sectors, 1);
        assert_eq!(h.extents.len(), 2);
        assert_eq!(h.prev_crc, 0x0102_0304);
        verify_record(&h, &buf).expect("crc ok");
        assert_eq!(&buf[4096..4096 + 512], &[0xAB; 512][..]);
    }

    const GOLDEN_CRC: u32 = 0x9d4a_21b4;
    const GOLDEN_DATA_HASH: u64 = 0x412d_18a3_ae04_9b24;

    /// `sample()` as the version-1 writer would have written it.
    fn sample_v1() -> Vec<u8> {
        let mut buf = sample();
        buf[8] = 1;
        buf[56..64].fill(0);
        buf[48..52].fill(0);
        let crc = crc32c::crc32c(&buf[..4096 + 512]);
        buf[48..52].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    #[test]
    fn version_1_records_still_verify() {
        let buf = sample_v1();
        let h = decode_record_header(&buf).expect("v1 decodes");
        assert_eq!((h.version, h.data_hash), (1, 0));
        verify_record(&h, &buf).expect("v1 crc ok");
        let mut bad = buf.clone();
        bad[4096] ^= 1;
        assert!(verify_record(&h, &bad).is_err());
    }

    /// Found by the crash oracle (power_loss, seed 0xd64e351085505cb5): a power loss
    /// tore the newest record so its last 4 KiB block kept an older block, and recovery
    /// replayed it. Both blocks ended in their own CRC32C (the oracle's stamps), and
    /// every such block has the same CRC32C (the residue), so the affine CRC over
    /// header and data could not tell them apart. Version 2's keyed data hash can.
    #[test]
    fn torn_record_holding_an_older_self_checksummed_block_is_rejected() {
        let block = |fill: u8| {
            let mut b = vec![fill; 4096];
            let c = crc32c::crc32c(&b[..4092]);
            b[4092..].copy_from_slice(&c.to_le_bytes());
            b
        };
        let extents = [RecordExtent {
            lba: 0,
            sectors: 8,
            kind: ExtentKind::Data,
        }];
        let mut torn = encode_record(VolumeId([1; 16]), 7, 0, &extents, &block(0xAA));
        let n = torn.len();
        torn[n - 4096..].copy_from_slice(&block(0x55));
        let h = decode_record_header(&torn).expect("header landed");
        // CRC32C alone is blind to this tear; the data hash is not.
        let crc = crc32c::crc32c_append(
            super::super::crc_with_hole(&torn[..4096], CRC_AT),
            &torn[4096..],
        );
        assert_eq!(crc, h.crc, "premise: the CRC still matches");
        assert!(verify_record(&h, &torn).is_err());
    }

    #[test]
    fn golden_header_bytes() {
        let buf = sample();
        let expected_prefix: [u8; 64] = [
            b'L', b'S', b'V', b'D', b'R', b'E', b'C', 0, // magic
            2, 0, 0, 0, // version, flags
            0, 0x10, 0, 0, // header bytes 4096
            7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // volume id
            42, 0, 0, 0, 0, 0, 0, 0, // seq
            2, 0, 0, 0, // extents
            1, 0, 0, 0, // data sectors
            buf[48], buf[49], buf[50], buf[51], // crc (checked below)
            4, 3, 2, 1, // previous record's crc
            buf[56], buf[57], buf[58], buf[59], buf[60], buf[61], buf[62],
            buf[63], // data hash
        ];
        assert_eq!(&buf[..64], &expected_prefix[..]);
        assert_eq!(
            u32::from_le_bytes([buf[48], buf[49], buf[50], buf[51]]),
            GOLDEN_CRC
        );
        let mut hash = [0u8; 8];
        hash.copy_from_slice(&buf[56..64]);
        assert_eq!(u64::from_le_bytes(hash), GOLDEN_DATA_HASH);
        assert_eq!(
            &buf[64..80],
            &[8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            &buf[80..96],
            &[100, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    #[test]
    fn header_prefix_is_the_on_disk_header() {
        let buf = sample();
        let h = decode_record_header(&buf).expect("decodes");
        let prefix = encode_header_prefix(&h);
        assert_eq!(prefix.len(), 64 + 16 * 2);
        assert_eq!(&prefix[..], &buf[..prefix.len()]);
        assert_eq!(decode_record_header(&prefix).expect("prefix decodes"), h);
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let buf = sample();
        for pos in (0..4096 + 512).step_by(37) {
            let mut bad = buf.clone();
            bad[pos] ^= 0x10;
            let ok = decode_record_header(&bad).and_then(|h| verify_record(&h, &bad).map(|_| h));
            assert!(ok.is_err(), "flip at {pos} not detected");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut state = 99u64;
        for len in 0..300 {
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) as u8
                })
                .collect();
            let _ = decode_record_header(&buf);
        }
        let mut truncated = sample();
        truncated.truncate(4096 + 100);
        let h = decode_record_header(&truncated).expect("header intact");
        assert!(verify_record(&h, &truncated).is_err());
    }
}
