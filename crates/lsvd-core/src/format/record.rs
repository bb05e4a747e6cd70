//! Write-log records: what one group commit appends to the cache device.
//!
//! A record is a header (padded to 512 bytes, [`RECORD_ALIGN_BYTES`]; 4096 in versions
//! 1-3) followed by the data of its extents (a whole number of 512-byte sectors). One CRC32C covers the header and the data; a seeded,
//! non-linear 64-bit hash of the data catches the torn records CRC32C cannot: data
//! sectors that kept an older block which ends in its own CRC32C. A record torn
//! anywhere fails validation and ends the log at recovery.
//!
//! Version 4 packs records to 512 bytes: a 4 KiB write costs 4.5 KiB of log, not 8 KiB
//! (versions 1-3 padded header and data to 4096 bytes each). The data hash is XXH3-64
//! (versions 3 to 5), seeded from the record's identity (see [`record_hash_seed`]).
//! Version 2 used a hash written in this project ([`super::keyed_hash`]) and version 1
//! had none. Version 5, written now, has version 4's layout, but its CRC32C covers the
//! header only (the data hash, which it includes, covers the data): the data is hashed
//! once, not twice, on the write path. Versions 1-4 are still read and verified as
//! they were, so a log left by an older build recovers.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDREC\0"
//!      8    2 version (5; versions 1-4 are still read)
//!     10    2 flags (0)
//!     12    4 header_bytes (multiple of 512; of 4096 in versions 1-3)
//!     16   16 volume id
//!     32    8 sequence number
//!     40    4 extent count
//!     44    4 data sectors (sum of data extents)
//!     48    4 crc32c over the header (this field zero); in versions 1-4 continued
//!             over the data
//!     52    4 crc32c of the previous record in the log (0 for the first)
//!     56    8 data hash: XXH3-64 seeded by the record's key (versions 3-5),
//!             keyed_hash64 (version 2), reserved 0 (version 1)
//!     64 16*n extents: lba u64, sectors u32, kind u32 (0 data, 1 zero)
//! ```

use super::{FormatError, Reader, SECTOR_BYTES, VolumeId, Writer, align_up, invalid};

pub const RECORD_MAGIC: &[u8; 8] = b"LSVDREC\0";
/// Version written: records packed to 512 bytes, the CRC32C over the header only, the
/// data covered by the XXH3-64 data hash (which the header, and so the CRC, holds).
/// Versions 1 (no data hash), 2 ([`super::keyed_hash`]), 3 (XXH3, 4096-byte padding)
/// and 4 (as 5, the CRC continued over the data) are still accepted on read, so a log
/// left by an older build recovers.
pub const RECORD_VERSION: u16 = 5;
/// Version 4: as version 5, but the CRC32C continues over the data.
const RECORD_VERSION_V4: u16 = 4;
/// Version 3: as version 4, but header and data padded to 4096 bytes.
const RECORD_VERSION_V3: u16 = 3;
/// Version 2: the data hash is [`super::keyed_hash::keyed_hash64`].
const RECORD_VERSION_V2: u16 = 2;
/// Version 1: no data hash (offset 56 reserved, 0).
const RECORD_VERSION_V1: u16 = 1;
/// The log region starts and ends on this boundary; records of versions 1-3 start and
/// end on it too.
pub const LOG_ALIGN_BYTES: u64 = 4096;
/// Records of version 4 start and end on this boundary (one sector).
pub const RECORD_ALIGN_BYTES: u64 = 512;

/// The boundary records of `version` are padded to.
fn align_of(version: u16) -> u64 {
    if version >= RECORD_VERSION_V4 {
        RECORD_ALIGN_BYTES
    } else {
        LOG_ALIGN_BYTES
    }
}

/// Is `version` one this build reads?
fn known_version(version: u16) -> bool {
    (RECORD_VERSION_V1..=RECORD_VERSION).contains(&version)
}

/// The bytes of a record of `version` its CRC32C covers, of the `header_bytes + data`
/// a record holds: the header alone from version 5 on (the data hash covers the data).
fn crc_covered_bytes(version: u16, header_bytes: usize, data_bytes: usize) -> usize {
    if version >= RECORD_VERSION {
        header_bytes
    } else {
        header_bytes + data_bytes
    }
}
const FIXED_BYTES: usize = 64;
const EXTENT_BYTES: usize = 16;
const CRC_AT: usize = 48;
/// Where the data hash sits in the fixed header.
const DATA_HASH_AT: usize = 56;
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
    /// Format version the record was written with (1, 2 or 3); it says which data hash
    /// [`verify_record`] checks.
    pub version: u16,
    pub volume: VolumeId,
    pub seq: u64,
    pub extents: Vec<RecordExtent>,
    /// Bytes of header on disk, including padding; data starts here.
    pub header_bytes: u32,
    pub data_sectors: u32,
    pub crc: u32,
    pub prev_crc: u32,
    /// Hash of the data: [`record_data_hash`] in version 3, [`record_data_hash_v2`] in
    /// version 2, 0 and unchecked in version 1.
    pub data_hash: u64,
}

impl RecordHeader {
    pub fn data_bytes(&self) -> u64 {
        self.data_sectors as u64 * SECTOR_BYTES
    }
    /// Bytes the record occupies in the log.
    pub fn total_bytes(&self) -> u64 {
        self.header_bytes as u64 + align_up(self.data_bytes(), align_of(self.version))
    }
}

/// The 28 bytes that identify a record: `volume id (16) || le64(seq) || le32(prev_crc)`.
fn record_key_bytes(volume: VolumeId, seq: u64, prev_crc: u32) -> [u8; 28] {
    let mut key = [0u8; 28];
    key[..16].copy_from_slice(&volume.0);
    key[16..24].copy_from_slice(&seq.to_le_bytes());
    key[24..].copy_from_slice(&prev_crc.to_le_bytes());
    key
}

/// The XXH3 seed of a version-3 record: `xxh3_64(volume id || le64(seq) ||
/// le32(prev_crc))`, unseeded. Hashing all 28 key bytes, rather than XOR-folding them
/// into 64 bits as version 2 did, leaves no structured seed collisions (in version 2,
/// `seq`'s high half and `prev_crc` cancel, and so do the two volume halves): records
/// that differ in volume, sequence number or predecessor get unrelated seeds, so data
/// left by another record matches only by a chance 64-bit collision.
pub fn record_hash_seed(volume: VolumeId, seq: u64, prev_crc: u32) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&record_key_bytes(volume, seq, prev_crc))
}

/// The data hash a version-3 record stores: XXH3-64 of the data bytes (padding
/// excluded), seeded with [`record_hash_seed`].
pub fn record_data_hash(volume: VolumeId, seq: u64, prev_crc: u32, data: &[u8]) -> u64 {
    super::xxh3_avx2::xxh3_64_with_seed(data, record_hash_seed(volume, seq, prev_crc))
}

/// The keyed hash a version-2 record stores over its data: keyed by the record's
/// identity (volume, sequence number, predecessor).
/// `key = seq ^ (prev_crc << 32) ^ le64(volume[0..8]) ^ le64(volume[8..16])`.
/// Only read now: records are written as version 3.
pub fn record_data_hash_v2(volume: VolumeId, seq: u64, prev_crc: u32, data: &[u8]) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&volume.0[..8]);
    hi.copy_from_slice(&volume.0[8..]);
    let key = seq ^ (u64::from(prev_crc) << 32) ^ u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi);
    super::keyed_hash::keyed_hash64(key, data)
}

/// The data hash field a record of `version` carries (0 for version 1, which has none).
/// `version` must be one [`decode_record_header`] accepts.
fn data_hash_for(version: u16, volume: VolumeId, seq: u64, prev_crc: u32, data: &[u8]) -> u64 {
    match version {
        RECORD_VERSION_V1 => 0,
        RECORD_VERSION_V2 => record_data_hash_v2(volume, seq, prev_crc, data),
        _ => record_data_hash(volume, seq, prev_crc, data),
    }
}

/// Header size for `extent_count` extents, as written now.
pub fn header_bytes_for(extent_count: usize) -> u64 {
    header_bytes_of_version(RECORD_VERSION, extent_count)
}

/// Header size for `extent_count` extents in records of `version`.
pub fn header_bytes_of_version(version: u16, extent_count: usize) -> u64 {
    align_up(
        (FIXED_BYTES + EXTENT_BYTES * extent_count) as u64,
        align_of(version),
    )
}

/// Bytes a record with these extents occupies in the log, as written now.
pub fn record_bytes_for(extent_count: usize, data_bytes: u64) -> u64 {
    record_bytes_of_version(RECORD_VERSION, extent_count, data_bytes)
}

fn record_bytes_of_version(version: u16, extent_count: usize, data_bytes: u64) -> u64 {
    header_bytes_of_version(version, extent_count) + align_up(data_bytes, align_of(version))
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
    encode_record_as(RECORD_VERSION, volume, seq, prev_crc, extents, data)
}

/// [`encode_record`] with the data given in parts (one per client write, in extent
/// order), copied once, straight into the record; also returns the record's header, so
/// the caller need not decode what it just encoded. The group commit's path: a record
/// of 32 4 KiB writes used to be built by copying every write into one data buffer (grown
/// as it went) and then again into the record.
pub fn encode_record_parts(
    volume: VolumeId,
    seq: u64,
    prev_crc: u32,
    extents: &[RecordExtent],
    parts: &[&[u8]],
) -> (Vec<u8>, RecordHeader) {
    encode_parts_as(RECORD_VERSION, volume, seq, prev_crc, extents, parts)
}

/// [`encode_record`] in the layout of `version` (1 to 5). Only [`RECORD_VERSION`]
/// is written in production; tests build the older layouts with it, to check they
/// are still read.
pub(super) fn encode_record_as(
    version: u16,
    volume: VolumeId,
    seq: u64,
    prev_crc: u32,
    extents: &[RecordExtent],
    data: &[u8],
) -> Vec<u8> {
    encode_parts_as(version, volume, seq, prev_crc, extents, &[data]).0
}

/// The one encoder: header (CRC and data hash zero at first), padding, the parts,
/// then the data hash and the CRC over header and data filled in, then the padding
/// that ends the record.
fn encode_parts_as(
    version: u16,
    volume: VolumeId,
    seq: u64,
    prev_crc: u32,
    extents: &[RecordExtent],
    parts: &[&[u8]],
) -> (Vec<u8>, RecordHeader) {
    assert!(known_version(version), "unknown record version {version}");
    let data_len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let data_sectors: u64 = extents
        .iter()
        .filter(|e| e.kind == ExtentKind::Data)
        .map(|e| e.sectors as u64)
        .sum();
    assert_eq!(
        data_sectors * SECTOR_BYTES,
        data_len,
        "record data length must match its extents"
    );
    let header_bytes = header_bytes_of_version(version, extents.len()) as usize;
    let total = record_bytes_of_version(version, extents.len(), data_len) as usize;
    let mut header = RecordHeader {
        version,
        volume,
        seq,
        extents: extents.to_vec(),
        header_bytes: header_bytes as u32,
        data_sectors: data_sectors as u32,
        crc: 0,
        prev_crc,
        data_hash: 0,
    };
    let mut w = Writer::with_capacity(total);
    write_header_prefix(&mut w, &header);
    w.zeros(header_bytes - w.buf.len());
    for p in parts {
        w.bytes(p);
    }
    header.data_hash = data_hash_for(version, volume, seq, prev_crc, &w.buf[header_bytes..]);
    w.buf[DATA_HASH_AT..DATA_HASH_AT + 8].copy_from_slice(&header.data_hash.to_le_bytes());
    let covered = crc_covered_bytes(version, header_bytes, data_len as usize);
    header.crc = crc32c::crc32c(&w.buf[..covered]);
    w.put_u32_at(CRC_AT, header.crc);
    w.zeros(total - w.buf.len());
    (w.buf, header)
}

/// The header bytes of a decoded record without padding (`64 + 16 * extents`),
/// exactly as they are on disk: what the write-log index stores per record. Writes the
/// version the header carries, so a version-1 or -2 header stays what it was.
pub fn encode_header_prefix(h: &RecordHeader) -> Vec<u8> {
    let mut w = Writer::with_capacity(FIXED_BYTES + EXTENT_BYTES * h.extents.len());
    write_header_prefix(&mut w, h);
    w.buf
}

/// The fixed header and the extent list of `h`, as laid out on disk.
fn write_header_prefix(w: &mut Writer, h: &RecordHeader) {
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
}

/// Decode the header from the first bytes of a record (at least the whole header).
/// Does not check the CRC: that needs the data, see [`verify_record`].
pub fn decode_record_header(buf: &[u8]) -> Result<RecordHeader, FormatError> {
    const WHAT: &str = "write-log record";
    let mut r = Reader::new(buf, WHAT);
    let version = r.magic(RECORD_MAGIC)?;
    if !known_version(version) {
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
    // The next record's sequence number must exist: readers compute `seq + 1`.
    if seq == u64::MAX {
        return Err(invalid(WHAT, "sequence number u64::MAX has no successor"));
    }
    if extent_count > MAX_RECORD_EXTENTS {
        return Err(invalid(
            WHAT,
            format!("extent count {extent_count} exceeds {MAX_RECORD_EXTENTS}"),
        ));
    }
    if header_bytes as u64 != header_bytes_of_version(version, extent_count as usize) {
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

/// Verify the CRC and the data hash of a whole record (`buf` holds at least header +
/// data). The header's version says what the CRC covers (the header alone from
/// version 5 on) and which hash: XXH3 (versions 3-5), keyed_hash64 (version 2) or none
/// (version 1).
pub fn verify_record(header: &RecordHeader, buf: &[u8]) -> Result<(), FormatError> {
    if !known_version(header.version) {
        return Err(FormatError::UnsupportedVersion {
            what: "write-log record",
            version: header.version,
        });
    }
    let end = header.header_bytes as usize + header.data_bytes() as usize;
    if buf.len() < end {
        return Err(FormatError::Truncated {
            what: "write-log record",
            need: end,
            have: buf.len(),
        });
    }
    let header_bytes = header.header_bytes as usize;
    let covered = crc_covered_bytes(header.version, header_bytes, end - header_bytes);
    let computed = crc32c::crc32c_append(
        super::crc_with_hole(&buf[..header_bytes], CRC_AT),
        &buf[header_bytes..covered],
    );
    if computed != header.crc {
        return Err(FormatError::BadChecksum {
            what: "write-log record",
            stored: header.crc,
            computed,
        });
    }
    let data = &buf[header.header_bytes as usize..end];
    let computed = match header.version {
        RECORD_VERSION_V1 => return Ok(()),
        RECORD_VERSION_V2 => record_data_hash_v2(header.volume, header.seq, header.prev_crc, data),
        RECORD_VERSION_V3 | RECORD_VERSION_V4 | RECORD_VERSION => {
            record_data_hash(header.volume, header.seq, header.prev_crc, data)
        }
        version => {
            return Err(FormatError::UnsupportedVersion {
                what: "write-log record",
                version,
            });
        }
    };
    if computed != header.data_hash {
        return Err(invalid(
            "write-log record",
            format!(
                "data hash mismatch (stored {:#018x}, computed {computed:#018x}): torn record",
                header.data_hash
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{feed_garbage, self_checksummed_block};

    #[test]
    fn encoding_from_parts_is_the_same_record() {
        let vol = VolumeId([9; 16]);
        let [data, zero] = crate::format::examples::RECORD_EXTENTS;
        let one_sector = RecordExtent {
            lba: 40,
            sectors: 1,
            kind: ExtentKind::Data,
        };
        let extents = [data, zero, one_sector];
        let a: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let b = vec![0x5au8; 512];
        let whole = [a.clone(), b.clone()].concat();
        let (rec, header) = encode_record_parts(vol, 11, 0xdead_beef, &extents, &[&a, &b]);
        assert_eq!(rec, encode_record(vol, 11, 0xdead_beef, &extents, &whole));
        assert_eq!(header, decode_record_header(&rec).expect("decodes"));
        verify_record(&header, &rec).expect("verifies");
    }

    /// Regression: a valid-CRC record with sequence number u64::MAX decoded, and the
    /// log scan and `lsvd check` overflowed computing its successor.
    #[test]
    fn the_last_sequence_number_is_refused() {
        let vol = VolumeId([3; 16]);
        let data = vec![0x11u8; 512];
        let ext = [RecordExtent {
            lba: 0,
            sectors: 1,
            kind: ExtentKind::Data,
        }];
        let ok = encode_record(vol, u64::MAX - 1, 0, &ext, &data);
        assert_eq!(
            decode_record_header(&ok).expect("u64::MAX - 1 decodes").seq,
            u64::MAX - 1
        );
        let rec = encode_record(vol, u64::MAX, 0, &ext, &data);
        let e = decode_record_header(&rec).expect_err("u64::MAX is refused");
        assert!(e.to_string().contains("no successor"), "{e}");
    }

    const SAMPLE_EXTENTS: [RecordExtent; 2] = [
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

    /// A small fixed record in the layout of `version`.
    fn sample_as(version: u16) -> Vec<u8> {
        encode_record_as(
            version,
            VolumeId([7; 16]),
            42,
            0x0102_0304,
            &SAMPLE_EXTENTS,
            &[0xAB; 512],
        )
    }

    /// The sample in version 3's layout (4096-byte padding), which most format tests
    /// below pin; version 4 has tests of its own.
    fn sample() -> Vec<u8> {
        sample_as(RECORD_VERSION_V3)
    }

    /// `buf` (one record with a 4096-byte header) with its version and data hash fields
    /// rewritten and its CRC recomputed to match, as a writer of `version` that put
    /// `data_hash` there would have left it.
    fn relabel(buf: &[u8], version: u16, data_hash: u64) -> Vec<u8> {
        let mut buf = buf.to_vec();
        let h = decode_record_header(&buf).expect("decodes");
        buf[8..10].copy_from_slice(&version.to_le_bytes());
        buf[56..64].copy_from_slice(&data_hash.to_le_bytes());
        fix_crc(&mut buf, &h);
        buf
    }

    /// Recompute the CRC of a record whose bytes were edited.
    fn fix_crc(buf: &mut [u8], h: &RecordHeader) {
        let end = h.header_bytes as usize + h.data_bytes() as usize;
        buf[CRC_AT..CRC_AT + 4].fill(0);
        let crc = crc32c::crc32c(&buf[..end]);
        buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// With its CRC refitted, `bad` (a record with a flipped data byte) must still
    /// fail to verify, on the data hash; `case` names it in the failure.
    fn assert_hash_catches_flip(bad: &mut [u8], h: &RecordHeader, case: &str) {
        fix_crc(bad, h);
        let h_bad = decode_record_header(bad).expect("decodes");
        let err = verify_record(&h_bad, bad).expect_err(case);
        assert!(is_data_hash_mismatch(&err), "{case}: {err}");
    }

    fn is_data_hash_mismatch(e: &FormatError) -> bool {
        matches!(e, FormatError::Invalid { why, .. } if why.starts_with("data hash mismatch"))
    }

    #[test]
    fn version_4_packs_records_to_512_bytes() {
        let vol = VolumeId([7; 16]);
        let one_block = [RecordExtent {
            lba: 8,
            sectors: 8,
            kind: ExtentKind::Data,
        }];
        let data = [0xCD; 4096];
        let buf = encode_record(vol, 42, 0x0102_0304, &one_block, &data);
        // A 4 KiB write: a 512-byte header and the data, 1.125 bytes per byte.
        assert_eq!(buf.len(), 512 + 4096);
        let h = decode_record_header(&buf).expect("decodes");
        assert_eq!((h.version, h.header_bytes), (RECORD_VERSION, 512));
        assert_eq!(h.total_bytes(), 4608);
        verify_record(&h, &buf).expect("verifies");
        assert_eq!(&buf[512..], &data[..]);
        assert_eq!(record_bytes_for(1, 4096), 4608);
        // 28 extents still fit one sector; 29 need two.
        assert_eq!(header_bytes_for(28), 512);
        assert_eq!(header_bytes_for(29), 1024);
        // The version 3 layout of the same record is 8 KiB.
        assert_eq!(
            encode_record_as(RECORD_VERSION_V3, vol, 42, 0x0102_0304, &one_block, &data).len(),
            8192
        );
        // A v4 record relabelled v3 (or back) does not even decode: its header size is
        // wrong for the version.
        let mut relabelled = buf.clone();
        relabelled[8..10].copy_from_slice(&RECORD_VERSION_V3.to_le_bytes());
        assert!(decode_record_header(&relabelled).is_err());
        // Trims only: a header and nothing else.
        let trim = [RecordExtent {
            lba: 0,
            sectors: 64,
            kind: ExtentKind::Zero,
        }];
        assert_eq!(encode_record(vol, 43, 1, &trim, &[]).len(), 512);
    }

    // Pinned: the version-4 sample's CRC and data hash (the data hash is version 3's).
    const GOLDEN_V4_CRC: u32 = 0xb578_df84;
    const GOLDEN_V4_LEN: usize = 1024;
    // Pinned: the version-5 sample's CRC (over its 512-byte header only).
    const GOLDEN_V5_CRC: u32 = 0x25cc_f599;

    #[test]
    fn golden_v5_sample() {
        let buf = sample_as(RECORD_VERSION);
        assert_eq!(RECORD_VERSION, 5);
        assert_eq!(buf.len(), GOLDEN_V4_LEN, "version 4's layout");
        let (crc, hash) = crc_and_hash(&buf);
        assert_eq!(
            hash, GOLDEN_V3_DATA_HASH,
            "the same data hash as versions 3 and 4"
        );
        // The CRC is over the header alone, with the CRC field zero.
        let mut header = buf[..512].to_vec();
        header[CRC_AT..CRC_AT + 4].fill(0);
        assert_eq!(crc, crc32c::crc32c(&header));
        assert_eq!(crc, GOLDEN_V5_CRC, "crc {crc:#010x}");
        // The bytes differ from version 4's only in the version and the CRC.
        let v4 = sample_as(RECORD_VERSION_V4);
        assert_eq!(&buf[10..CRC_AT], &v4[10..CRC_AT]);
        assert_eq!(&buf[CRC_AT + 4..], &v4[CRC_AT + 4..]);
    }

    /// Version 5's CRC does not reach the data: a changed data byte is caught by the
    /// data hash alone, and a changed header byte (the hash field included) by the CRC.
    #[test]
    fn version_5_checks_the_header_by_crc_and_the_data_by_hash() {
        let buf = sample_as(RECORD_VERSION);
        let h = decode_record_header(&buf).expect("decodes");
        verify_record(&h, &buf).expect("verifies");
        for pos in [512, 512 + 255, 1023] {
            let mut bad = buf.clone();
            bad[pos] ^= 0x01;
            let err = verify_record(&h, &bad).expect_err("the hash catches the flip");
            assert!(is_data_hash_mismatch(&err), "at {pos}: {err}");
        }
        for pos in [8, 40, DATA_HASH_AT, DATA_HASH_AT + 7, 64, 100, 511] {
            let mut bad = buf.clone();
            bad[pos] ^= 0x01;
            let err = decode_record_header(&bad).and_then(|h| verify_record(&h, &bad));
            assert!(err.is_err(), "a flip at {pos} passed");
        }
    }

    #[test]
    fn golden_v4_sample() {
        let buf = sample_as(RECORD_VERSION_V4);
        assert_eq!(buf.len(), GOLDEN_V4_LEN);
        let (crc, hash) = crc_and_hash(&buf);
        assert_eq!(hash, GOLDEN_V3_DATA_HASH, "the same data hash as version 3");
        assert_eq!(crc, GOLDEN_V4_CRC, "crc {crc:#010x}");
        assert_eq!(&buf[512..], &[0xAB; 512][..]);
        assert!(buf[96..512].iter().all(|&b| b == 0), "header padding");
    }

    #[test]
    fn round_trip_and_layout() {
        let buf = sample();
        assert_eq!(buf.len(), 8192);
        let h = decode_record_header(&buf).expect("decodes");
        assert_eq!(h.version, RECORD_VERSION_V3);
        assert_eq!(h.seq, 42);
        assert_eq!(h.header_bytes, 4096);
        assert_eq!(h.data_sectors, 1);
        assert_eq!(h.extents.len(), 2);
        assert_eq!(h.prev_crc, 0x0102_0304);
        verify_record(&h, &buf).expect("crc ok");
        assert_eq!(&buf[4096..4096 + 512], &[0xAB; 512][..]);
        assert_eq!(sample_as(RECORD_VERSION_V3), buf);
    }

    // Pinned: the version-3 sample's CRC and data hash, and the hash's seed. These are
    // part of the record format. The seed and hash agree with the reference C
    // implementation (libxxhash 0.8.1: XXH3_64bits, XXH3_64bits_withSeed).
    const GOLDEN_V3_SEED: u64 = 0x8a6a_1266_9945_1e2c;
    const GOLDEN_V3_CRC: u32 = 0xd827_b257;
    const GOLDEN_V3_DATA_HASH: u64 = 0x3779_f357_db39_73ad;
    // Pinned when version 2 was the version written; version-2 records must still
    // encode (in tests) and verify exactly so.
    const GOLDEN_V2_CRC: u32 = 0x9d4a_21b4;
    const GOLDEN_V2_DATA_HASH: u64 = 0x412d_18a3_ae04_9b24;

    fn crc_and_hash(buf: &[u8]) -> (u32, u64) {
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&buf[48..52]);
        let mut hash = [0u8; 8];
        hash.copy_from_slice(&buf[56..64]);
        (u32::from_le_bytes(crc), u64::from_le_bytes(hash))
    }

    #[test]
    fn golden_v3_seed_and_hash() {
        let seed = record_hash_seed(VolumeId([7; 16]), 42, 0x0102_0304);
        assert_eq!(seed, GOLDEN_V3_SEED);
        // The seed is XXH3-64 of the 28 key bytes.
        let mut key = vec![7u8; 16];
        key.extend_from_slice(&42u64.to_le_bytes());
        key.extend_from_slice(&0x0102_0304u32.to_le_bytes());
        assert_eq!(seed, xxhash_rust::xxh3::xxh3_64(&key));
        assert_eq!(
            record_data_hash(VolumeId([7; 16]), 42, 0x0102_0304, &[0xAB; 512]),
            GOLDEN_V3_DATA_HASH
        );
        // Every part of the key changes the seed.
        assert_ne!(record_hash_seed(VolumeId([7; 16]), 43, 0x0102_0304), seed);
        assert_ne!(record_hash_seed(VolumeId([7; 16]), 42, 0x0102_0305), seed);
        let mut other = [7u8; 16];
        other[15] = 8;
        assert_ne!(record_hash_seed(VolumeId(other), 42, 0x0102_0304), seed);
    }

    #[test]
    fn golden_header_bytes() {
        let buf = sample();
        let expected_prefix: [u8; 64] = [
            b'L', b'S', b'V', b'D', b'R', b'E', b'C', 0, // magic
            3, 0, 0, 0, // version, flags
            0, 0x10, 0, 0, // header bytes 4096
            7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // volume id
            42, 0, 0, 0, 0, 0, 0, 0, // seq
            2, 0, 0, 0, // extents
            1, 0, 0, 0, // data sectors
            0x57, 0xb2, 0x27, 0xd8, // crc 0xd827b257
            4, 3, 2, 1, // previous record's crc
            0xad, 0x73, 0x39, 0xdb, 0x57, 0xf3, 0x79, 0x37, // data hash 0x3779f357db3973ad
        ];
        assert_eq!(&buf[..64], &expected_prefix[..]);
        assert_eq!(crc_and_hash(&buf), (GOLDEN_V3_CRC, GOLDEN_V3_DATA_HASH));
        assert_eq!(
            &buf[64..80],
            &[8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            &buf[80..96],
            &[100, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0]
        );
        assert!(buf[96..4096].iter().all(|&b| b == 0), "header padding");
        assert!(buf[4096 + 512..].iter().all(|&b| b == 0), "data padding");
    }

    #[test]
    fn version_2_records_still_verify() {
        let buf = sample_as(2);
        let h = decode_record_header(&buf).expect("v2 decodes");
        assert_eq!(h.version, 2);
        assert_eq!(crc_and_hash(&buf), (GOLDEN_V2_CRC, GOLDEN_V2_DATA_HASH));
        assert_eq!(
            h.data_hash,
            record_data_hash_v2(VolumeId([7; 16]), 42, 0x0102_0304, &[0xAB; 512])
        );
        verify_record(&h, &buf).expect("v2 verifies");
        // Its bytes differ from the version-3 sample only in version, crc and hash.
        let v3 = sample();
        assert_eq!(&buf[10..48], &v3[10..48]);
        assert_eq!(&buf[52..56], &v3[52..56]);
        assert_eq!(&buf[64..], &v3[64..]);
        let mut bad = buf.clone();
        bad[4096] ^= 1;
        assert!(verify_record(&h, &bad).is_err());
        assert_hash_catches_flip(&mut bad, &h, "v2 hash catches the flip");
    }

    #[test]
    fn version_1_records_still_verify() {
        let buf = sample_as(1);
        // The version-1 writer: version 1, offset 56 zero, CRC over the rest.
        assert_eq!(buf, relabel(&sample(), 1, 0));
        let h = decode_record_header(&buf).expect("v1 decodes");
        assert_eq!((h.version, h.data_hash), (1, 0));
        verify_record(&h, &buf).expect("v1 crc ok");
        let mut bad = buf.clone();
        bad[4096] ^= 1;
        assert!(verify_record(&h, &bad).is_err());
    }

    #[test]
    fn a_flipped_data_bit_fails_the_v3_hash_even_with_a_matching_crc() {
        let buf = sample();
        let h = decode_record_header(&buf).expect("decodes");
        for pos in [4096, 4096 + 255, 4096 + 511] {
            let mut bad = buf.clone();
            bad[pos] ^= 0x01;
            let err = verify_record(&h, &bad).expect_err("crc catches the flip");
            assert!(matches!(err, FormatError::BadChecksum { .. }), "{err}");
            // With the CRC recomputed, only the data hash is left to catch it.
            assert_hash_catches_flip(&mut bad, &h, &format!("hash catches the flip at {pos}"));
        }
    }

    #[test]
    fn a_record_relabelled_to_the_other_hash_version_fails() {
        // A version-2 record claiming version 3 (CRC made to match): its keyed_hash64
        // is checked as XXH3 and fails.
        let v2 = sample_as(2);
        let h2 = decode_record_header(&v2).expect("decodes");
        let as_v3 = relabel(&v2, 3, h2.data_hash);
        let h = decode_record_header(&as_v3).expect("decodes");
        assert_eq!(h.version, 3);
        let err = verify_record(&h, &as_v3).expect_err("v2 hash is not an XXH3 hash");
        assert!(is_data_hash_mismatch(&err), "{err}");
        // And the other way round.
        let v3 = sample();
        let h3 = decode_record_header(&v3).expect("decodes");
        let as_v2 = relabel(&v3, 2, h3.data_hash);
        let h = decode_record_header(&as_v2).expect("decodes");
        assert_eq!(h.version, 2);
        let err = verify_record(&h, &as_v2).expect_err("XXH3 hash is not a v2 hash");
        assert!(is_data_hash_mismatch(&err), "{err}");
        // Without the CRC fixed, the version change alone is caught by the CRC.
        let mut raw = v3.clone();
        raw[8] = 2;
        let h = decode_record_header(&raw).expect("decodes");
        assert!(matches!(
            verify_record(&h, &raw),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn unknown_versions_are_refused() {
        for version in [0u16, RECORD_VERSION + 1, 0xFFFF] {
            let mut buf = sample();
            buf[8..10].copy_from_slice(&version.to_le_bytes());
            assert_eq!(
                decode_record_header(&buf),
                Err(FormatError::UnsupportedVersion {
                    what: "write-log record",
                    version
                })
            );
            // A header built by hand is refused by verify_record too.
            let buf = relabel(&sample(), RECORD_VERSION_V3, 0);
            let mut h = decode_record_header(&buf).expect("decodes");
            h.version = version;
            assert!(matches!(
                verify_record(&h, &buf),
                Err(FormatError::UnsupportedVersion { .. })
            ));
        }
    }

    /// Found by the crash oracle (power_loss, seed 0xd64e351085505cb5): a power loss
    /// tore the newest record so its last 4 KiB block kept an older block, and recovery
    /// replayed it. Both blocks ended in their own CRC32C (the oracle's stamps), and
    /// every such block has the same CRC32C (the residue), so the affine CRC over
    /// header and data could not tell them apart. The data hash (version 2's keyed
    /// hash, version 3's XXH3) can.
    #[test]
    fn torn_record_holding_an_older_self_checksummed_block_is_rejected() {
        let block = self_checksummed_block;
        let extents = [RecordExtent {
            lba: 0,
            sectors: 8,
            kind: ExtentKind::Data,
        }];
        for version in [
            RECORD_VERSION_V2,
            RECORD_VERSION_V3,
            RECORD_VERSION_V4,
            RECORD_VERSION,
        ] {
            let mut torn =
                encode_record_as(version, VolumeId([1; 16]), 7, 0, &extents, &block(0xAA));
            let n = torn.len();
            torn[n - 4096..].copy_from_slice(&block(0x55));
            let h = decode_record_header(&torn).expect("header landed");
            assert_eq!(h.version, version);
            // CRC32C alone is blind to this tear (from version 5 on it does not even
            // cover the data); the data hash is not.
            let header_bytes = h.header_bytes as usize;
            let covered = crc_covered_bytes(version, header_bytes, 4096);
            let crc = crc32c::crc32c_append(
                super::super::crc_with_hole(&torn[..header_bytes], CRC_AT),
                &torn[header_bytes..covered],
            );
            assert_eq!(crc, h.crc, "premise: the CRC still matches (v{version})");
            let err = verify_record(&h, &torn).expect_err("torn record rejected");
            assert!(is_data_hash_mismatch(&err), "v{version}: {err}");
        }
    }

    #[test]
    fn header_prefix_is_the_on_disk_header() {
        for version in [
            RECORD_VERSION_V1,
            RECORD_VERSION_V2,
            RECORD_VERSION_V3,
            RECORD_VERSION_V4,
            RECORD_VERSION,
        ] {
            let buf = sample_as(version);
            let h = decode_record_header(&buf).expect("decodes");
            let prefix = encode_header_prefix(&h);
            assert_eq!(prefix.len(), 64 + 16 * 2);
            assert_eq!(&prefix[..], &buf[..prefix.len()], "v{version}");
            assert_eq!(decode_record_header(&prefix).expect("prefix decodes"), h);
        }
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        for version in [RECORD_VERSION_V3, RECORD_VERSION_V4, RECORD_VERSION] {
            let buf = sample_as(version);
            let h = decode_record_header(&buf).expect("decodes");
            let end = h.header_bytes as usize + h.data_bytes() as usize;
            for pos in (0..end).step_by(37) {
                let mut bad = buf.clone();
                bad[pos] ^= 0x10;
                let ok =
                    decode_record_header(&bad).and_then(|h| verify_record(&h, &bad).map(|_| h));
                assert!(ok.is_err(), "v{version}: flip at {pos} not detected");
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        feed_garbage(300, 99, |buf| {
            let _ = decode_record_header(buf);
        });
        let mut truncated = sample();
        truncated.truncate(4096 + 100);
        let h = decode_record_header(&truncated).expect("header intact");
        assert!(verify_record(&h, &truncated).is_err());
    }

    /// Throughput of the two data hashes, for the record. Not a CI check; run with
    /// `cargo test -p lsvd-core --release --lib data_hash_throughput -- --ignored
    /// --nocapture`. Prints the median MiB/s of 7 runs per hash and buffer size.
    #[test]
    #[ignore = "a measurement, not a check; run in release"]
    fn data_hash_throughput() {
        use std::hint::black_box;
        use std::time::Instant;
        let volume = VolumeId([3; 16]);
        for size_bytes in [4096usize, 1 << 20] {
            let data: Vec<u8> = (0..size_bytes).map(|i| (i * 131 % 251) as u8).collect();
            let iterations = (256 << 20) / size_bytes;
            type DataHash = fn(VolumeId, u64, u32, &[u8]) -> u64;
            let hashes: [(&str, DataHash); 2] = [
                ("keyed_hash64 (v2)", record_data_hash_v2),
                ("xxh3 (v3)", record_data_hash),
            ];
            for (name, hash) in hashes {
                let mut mib_per_s: Vec<f64> = (0..7)
                    .map(|_| {
                        let start = Instant::now();
                        for seq in 0..iterations as u64 {
                            black_box(hash(volume, black_box(seq), 9, black_box(&data)));
                        }
                        let secs = start.elapsed().as_secs_f64();
                        (iterations * size_bytes) as f64 / (1 << 20) as f64 / secs
                    })
                    .collect();
                mib_per_s.sort_by(f64::total_cmp);
                println!(
                    "{name:>18} {size_bytes:>8} B buffers: median {:>8.0} MiB/s (min {:.0}, max {:.0})",
                    mib_per_s[3], mib_per_s[0], mib_per_s[6]
                );
            }
        }
    }
}
