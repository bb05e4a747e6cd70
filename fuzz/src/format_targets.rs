//! Fuzz checks for every decoder in `lsvd_core::format`.
//!
//! Every target takes a mode from its first byte:
//! - even: the rest is handed to the decoder twice, as it is and with its checksums
//!   recomputed ([`fix`]), so the fuzzer also reaches the code behind the CRC check. An
//!   accepted value must re-encode to bytes that decode to the same value (and, where
//!   the layout is canonical, to the same bytes).
//! - odd: the rest builds a value, which is encoded and must decode to itself; then
//!   one byte of the encoding, chosen by the input, is changed and the decoder (or the
//!   data verification) must refuse it.

use lsvd_core::compression::{Codec, Compression};
use lsvd_core::format::object::{
    ExtentSource, ObjectExtent, ObjectHeader, ObjectKind, ObjectSpec, decode_object_header,
    encode_compressed_object, encode_object, peek_header_bytes,
};
use lsvd_core::format::record::{
    ExtentKind, RECORD_VERSION, RecordExtent, RecordHeader, decode_record_header,
    encode_header_prefix, encode_record, encode_record_parts, record_bytes_for, record_data_hash,
    record_data_hash_v2, verify_record,
};
use lsvd_core::format::{FormatError, VolumeId};

use crate::bytes::Bytes;

/// Recomputing checksums so mutated bytes get past the CRC check.
pub mod fix {
    /// CRC32C of `buf` with the 4 bytes at `at` taken as zero (the layouts' rule).
    pub fn crc_with_hole(buf: &[u8], at: usize) -> u32 {
        let c = crc32c::crc32c(&buf[..at]);
        let c = crc32c::crc32c_append(c, &[0u8; 4]);
        crc32c::crc32c_append(c, &buf[at + 4..])
    }

    /// Store the CRC of `buf[..end]` at `at`, if both fit.
    pub fn crc_at(buf: &mut [u8], at: usize, end: usize) {
        if at + 4 <= end && end <= buf.len() {
            let crc = crc_with_hole(&buf[..end], at);
            buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        }
    }

    pub fn le_u32(buf: &[u8], at: usize) -> Option<u32> {
        let b = buf.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn le_u64(buf: &[u8], at: usize) -> Option<u64> {
        let b = buf.get(at..at + 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
}

fn split_mode(data: &[u8]) -> (bool, &[u8]) {
    match data.split_first() {
        Some((&m, rest)) => (m & 1 == 1, rest),
        None => (false, &[]),
    }
}

/// The body the format targets share: mode 1 builds a value from the bytes with
/// `generate`; mode 0 runs `check` on the bytes as given (`false`), then on a copy
/// whose checksums `refit` made right again (`true`), so that mutations get past the
/// CRC to the rest of the decoder.
fn format_target(
    data: &[u8],
    generate: impl FnOnce(&mut Bytes<'_>),
    check: impl Fn(&[u8], bool),
    refit: impl FnOnce(&mut Vec<u8>),
) {
    let (generating, rest) = split_mode(data);
    if generating {
        return generate(&mut Bytes::new(rest));
    }
    check(rest, false);
    let mut fixed = rest.to_vec();
    refit(&mut fixed);
    check(&fixed, true);
}

fn volume(b: &mut Bytes<'_>) -> VolumeId {
    VolumeId(b.array())
}

/// Change one byte of `buf` (chosen by `b`) to a different value; the position.
fn corrupt(b: &mut Bytes<'_>, buf: &mut [u8], within: usize) -> Option<usize> {
    let within = within.min(buf.len());
    if within == 0 {
        return None;
    }
    let at = b.below(u32::try_from(within).unwrap_or(u32::MAX)) as usize;
    buf[at] ^= b.u8().max(1);
    Some(at)
}

/// Assert that `decode` gives `value` back from its encoding `buf` (`what` names the
/// structure), then that it refuses `buf` with one byte (chosen by `b`) corrupted.
fn assert_round_trip_then_corruption_refused<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    b: &mut Bytes<'_>,
    buf: &mut [u8],
    value: &T,
    what: &str,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) {
    match decode(buf) {
        Ok(back) => assert_eq!(&back, value, "{what} round trip"),
        Err(e) => panic!("{what} round trip: {e:?}"),
    }
    if let Some(at) = corrupt(b, buf, usize::MAX) {
        assert!(
            decode(buf).is_err(),
            "corrupt byte {at} of a {what} unnoticed"
        );
    }
}

/// If `decode` takes `buf`, its value must encode (an encoder that refuses it fails
/// the check) to bytes that decode to the same value.
fn assert_reencodes<T: PartialEq + std::fmt::Debug>(
    buf: &[u8],
    what: &str,
    decode: impl Fn(&[u8]) -> Result<T, FormatError>,
    encode: impl Fn(&T) -> Result<Vec<u8>, FormatError>,
) {
    let Ok(value) = decode(buf) else {
        return;
    };
    let bytes = match encode(&value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a decoded {what} does not encode: {e}"),
    };
    assert_eq!(decode(&bytes), Ok(value), "{what} re-encodes differently");
}

/// Assert that a record numbered u64::MAX is refused at decode: the last sequence
/// number has no successor.
fn assert_last_seq_refused(record: &[u8]) {
    assert!(
        decode_record_header(record).is_err(),
        "a record numbered u64::MAX decodes"
    );
}

// ---------------------------------------------------------------------------------
// write-log records

/// Fix the data hash and CRC of a record in place, as its header describes it.
pub fn fix_record(buf: &mut [u8]) {
    let (Some(header_bytes), Some(data_sectors)) = (fix::le_u32(buf, 12), fix::le_u32(buf, 44))
    else {
        return;
    };
    let end = header_bytes as usize + data_sectors as usize * 512;
    if buf.len() < end || (header_bytes as usize) < 64 {
        return;
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    let mut vol = [0u8; 16];
    vol.copy_from_slice(&buf[16..32]);
    let vol = VolumeId(vol);
    let seq = fix::le_u64(buf, 32).unwrap_or(0);
    let prev_crc = fix::le_u32(buf, 52).unwrap_or(0);
    let data = &buf[header_bytes as usize..end];
    let hash = match version {
        1 => None,
        2 => Some(record_data_hash_v2(vol, seq, prev_crc, data)),
        _ => Some(record_data_hash(vol, seq, prev_crc, data)),
    };
    if let Some(hash) = hash {
        buf[56..64].copy_from_slice(&hash.to_le_bytes());
    }
    // From version 5 on the CRC covers the header only.
    let crc_end = if version >= 5 {
        header_bytes as usize
    } else {
        end
    };
    fix::crc_at(buf, 48, crc_end);
}

fn check_record_bytes(buf: &[u8], fixed: bool) {
    let Ok(h) = decode_record_header(buf) else {
        return;
    };
    let prefix_len = 64 + 16 * h.extents.len();
    let prefix = encode_header_prefix(&h);
    let mut on_disk = buf[..prefix_len].to_vec();
    on_disk[10..12].fill(0); // flags: ignored on read, written as 0
    assert_eq!(prefix, on_disk, "header prefix does not re-encode");
    assert_eq!(
        decode_record_header(&prefix).as_ref(),
        Ok(&h),
        "re-encoded prefix decodes differently"
    );
    let end = h.header_bytes as usize + h.data_bytes() as usize;
    if buf.len() < end {
        return;
    }
    let verified = verify_record(&h, buf);
    if fixed {
        assert_eq!(verified, Ok(()), "record with fixed checksums fails");
    }
    if verified.is_ok() && h.version == RECORD_VERSION {
        let data = &buf[h.header_bytes as usize..end];
        let encoded = encode_record(h.volume, h.seq, h.prev_crc, &h.extents, data);
        assert_eq!(encoded.len() as u64, h.total_bytes(), "record size");
        let mut canonical = buf[..end].to_vec();
        canonical[10..12].fill(0);
        if canonical[prefix_len..h.header_bytes as usize]
            .iter()
            .all(|&b| b == 0)
            && buf[..end] == canonical[..]
        {
            assert_eq!(&encoded[..end], &buf[..end], "record does not re-encode");
        }
        let again = decode_record_header(&encoded).expect("re-encoded record decodes");
        verify_record(&again, &encoded).expect("re-encoded record verifies");
        assert_eq!(
            RecordHeader {
                crc: h.crc,
                ..again
            },
            h,
            "re-encoded record decodes differently"
        );
    }
}

fn generate_record(b: &mut Bytes<'_>) {
    let vol = volume(b);
    let seq = b.u64();
    let prev_crc = b.u32();
    let n = b.below(6) as usize;
    let mut extents = Vec::new();
    let mut parts = Vec::new();
    for _ in 0..n {
        let lba = b.u64();
        let sectors = 1 + b.below(16);
        let kind = if b.bool() {
            ExtentKind::Zero
        } else {
            ExtentKind::Data
        };
        extents.push(RecordExtent { lba, sectors, kind });
        if kind == ExtentKind::Data {
            parts.push(b.exact(sectors as usize * 512));
        }
    }
    let data = parts.concat();
    let buf = encode_record(vol, seq, prev_crc, &extents, &data);
    let part_refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let (by_parts, header) = encode_record_parts(vol, seq, prev_crc, &extents, &part_refs);
    assert_eq!(
        buf, by_parts,
        "encode_record_parts differs from encode_record"
    );
    assert_eq!(buf.len() as u64, record_bytes_for(n, data.len() as u64));
    if seq == u64::MAX {
        assert_last_seq_refused(&buf);
        return;
    }
    let decoded = decode_record_header(&buf).expect("encoded record decodes");
    assert_eq!(decoded, header, "decoded header differs");
    verify_record(&decoded, &buf).expect("encoded record verifies");
    let end = header.header_bytes as usize + data.len();
    let mut bad = buf.clone();
    if let Some(at) = corrupt(b, &mut bad, end) {
        let ok = decode_record_header(&bad).and_then(|h| verify_record(&h, &bad));
        assert!(ok.is_err(), "corrupt byte {at} of a record went unnoticed");
    }
}

/// Target `format_record`: write-log record headers and their verification; and
/// lsvd's own hash kernels against their references on the same bytes.
pub fn record(data: &[u8]) {
    format_target(data, generate_record, check_record_bytes, |fixed| {
        fix_record(fixed)
    });
    check_hash_kernels(data);
}

/// The record's XXH3-64 (`format::xxh3_avx2`, AVX2 where the CPU has it) equals the
/// `xxhash-rust` crate's, and the object's chunk CRC32Cs (`format::chunk_crc`, three
/// chunks at a time) equal the `crc32c` crate's one chunk at a time, for any bytes,
/// seed and chunk size.
fn check_hash_kernels(data: &[u8]) {
    let (head, bytes) = data.split_at(data.len().min(9));
    let mut seed = [0u8; 8];
    seed[..head.len().min(8)].copy_from_slice(&head[..head.len().min(8)]);
    let seed = u64::from_le_bytes(seed);
    assert_eq!(
        lsvd_core::format::xxh3_avx2::xxh3_64_with_seed(bytes, seed),
        xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed),
        "XXH3 of {} bytes, seed {seed:#x}",
        bytes.len()
    );
    // Chunks of 8 to 2048 bytes (multiples of 8 take the three-at-once path).
    let chunk_bytes = 8 * (1 + usize::from(head.get(8).copied().unwrap_or(0)));
    let reference: Vec<u32> = bytes.chunks(chunk_bytes).map(crc32c::crc32c).collect();
    assert_eq!(
        lsvd_core::format::chunk_crc::chunk_crcs(bytes, chunk_bytes),
        reference,
        "chunk CRCs of {} bytes in chunks of {chunk_bytes}",
        bytes.len()
    );
}

// ---------------------------------------------------------------------------------
// objects

fn spec_of(h: &ObjectHeader) -> ObjectSpec<'_> {
    ObjectSpec {
        kind: h.kind,
        volume: h.volume,
        seq: h.seq,
        last_record_seq: h.last_record_seq,
        extents: &h.extents,
        trims: &h.trims,
        volume_size_bytes: h.volume_size_bytes,
        parts_after: h.parts_after,
        epoch: h.epoch,
        first_record_seq: h
            .first_record_seq
            .unwrap_or(h.last_record_seq.saturating_add(1)),
    }
}

fn check_object_bytes(buf: &[u8]) {
    let Ok(h) = decode_object_header(buf) else {
        return;
    };
    assert_eq!(peek_header_bytes(buf), Ok(u64::from(h.header_bytes)));
    assert_eq!(
        h.chunk_crcs.len() as u64,
        h.data_bytes.div_ceil(h.chunk_bytes)
    );
    // Opening any range must not panic, whatever the header says.
    let total = h.total_bytes();
    let data_start = u64::from(h.header_bytes);
    let have = (buf.len() as u64).min(total);
    let stored = buf[data_start as usize..have as usize].to_vec();
    let opened = h.open_data(data_start, stored);
    if have == total
        && h.data_bytes <= 1 << 20
        && let Ok(data) = opened
    {
        assert_eq!(
            data.len() as u64,
            h.data_bytes,
            "a whole object opens whole"
        );
        // Written again with the object's own codec (raw chunks stay raw; a chunk the
        // compressor shrinks may now be stored compressed): the same header but for
        // the chunk table, and the same data once opened.
        let compression = match h.codec {
            Codec::None => Compression::None,
            Codec::Lz4 => Compression::Lz4,
            Codec::Zstd => Compression::Zstd(1),
        };
        let encoded = if h.stored_chunks.is_empty() {
            encode_object(&spec_of(&h), &data)
        } else {
            encode_compressed_object(&spec_of(&h), &data, compression)
        };
        let again = decode_object_header(&encoded).expect("re-encoded object decodes");
        let reopened = again.open_whole(&encoded).expect("re-encoded object opens");
        assert!(reopened == data, "re-encoded object opens to other data");
        // A header of a version before 4 is written again as version 4: a longer
        // fixed part, and the first record it says nothing of filled in.
        let mut want = h.clone();
        if want.first_record_seq.is_none() {
            want.first_record_seq = again.first_record_seq;
            want.header_bytes = again.header_bytes;
        }
        if !h.stored_chunks.is_empty() {
            want.chunk_crcs.clone_from(&again.chunk_crcs);
            want.stored_chunks.clone_from(&again.stored_chunks);
            want.codec = again.codec;
            want.chunk_bytes = again.chunk_bytes;
            want.header_bytes = again.header_bytes;
        }
        assert_eq!(again, want, "re-encoded object decodes differently");
    }
}

fn generate_object(b: &mut Bytes<'_>) {
    let kind = match b.below(3) {
        0 => ObjectKind::Data,
        1 => ObjectKind::Gc,
        _ => ObjectKind::Checkpoint,
    };
    let vol = volume(b);
    let seq = b.u64();
    let last_record_seq = b.u64();
    let mut extents = Vec::new();
    let mut sectors_total = 0u64;
    for _ in 0..b.below(6) {
        let lba = b.u64();
        let sectors = 1 + b.below(24);
        sectors_total += u64::from(sectors);
        let source = (kind == ObjectKind::Gc).then(|| ExtentSource {
            object_seq: b.u64(),
            object_offset: b.u64(),
        });
        extents.push(ObjectExtent {
            lba,
            sectors,
            source,
        });
    }
    let trims: Vec<(u64, u64)> = (0..b.below(4)).map(|_| (b.u64(), b.u64())).collect();
    let data_len = if kind == ObjectKind::Checkpoint {
        b.below(20_000) as usize
    } else {
        sectors_total as usize * 512
    };
    let mut data = b.exact(data_len);
    // Half the time data that compresses: a short run repeated.
    if b.below(2) == 0 && !data.is_empty() {
        let run = 1 + b.below(64) as usize;
        for i in run..data.len() {
            data[i] = data[i % run];
        }
    }
    let compression = match b.below(3) {
        0 => Compression::None,
        1 => Compression::Lz4,
        _ => Compression::Zstd(1),
    };
    // Data objects sometimes resize the volume (a version 2 header).
    let volume_size_bytes =
        (kind == ObjectKind::Data && b.below(3) == 0).then(|| 4096 * (1 + b.u64() % (1 << 40)));
    // Other data objects are sometimes a part of a split batch (a version 3 header).
    let parts_after = if kind == ObjectKind::Data && volume_size_bytes.is_none() {
        b.below(4)
    } else {
        0
    };
    let spec = ObjectSpec {
        kind,
        volume: vol,
        seq,
        last_record_seq,
        extents: &extents,
        trims: &trims,
        volume_size_bytes,
        parts_after,
        epoch: b.u64(),
        first_record_seq: last_record_seq.saturating_sub(b.u64() % 64),
    };
    let buf = encode_compressed_object(&spec, &data, compression);
    let h = decode_object_header(&buf).expect("encoded object decodes");
    assert_eq!(h.volume_size_bytes, volume_size_bytes);
    assert_eq!(h.parts_after, parts_after);
    assert_eq!(
        (h.kind, h.volume, h.seq, h.last_record_seq),
        (kind, vol, seq, last_record_seq)
    );
    assert_eq!((&h.extents, &h.trims), (&extents, &trims));
    assert_eq!(h.data_bytes, data.len() as u64);
    assert_eq!(h.total_bytes(), buf.len() as u64);
    let start = u64::from(h.header_bytes);
    assert!(h.open_whole(&buf).expect("encoded data opens") == data);
    // A read of any range inside the data opens through verifiable_range and
    // stored_range to the bytes written.
    if !data.is_empty() {
        let off = u64::from(b.below(data_len as u32));
        let len = 1 + u64::from(b.below((data_len as u64 - off) as u32));
        let (s, e) = h.verifiable_range(start + off, len);
        assert!(s <= start + off && start + off + len <= e && e <= start + h.data_bytes);
        let (ss, se) = h.stored_range(s, e);
        assert!(start <= ss && ss <= se && se <= h.total_bytes());
        let opened = h
            .open_data(s, buf[ss as usize..se as usize].to_vec())
            .expect("verifiable range opens");
        assert!(opened == data[(s - start) as usize..(e - start) as usize]);
    }
    let mut bad = buf.clone();
    if let Some(at) = corrupt(b, &mut bad, buf.len()) {
        let ok = decode_object_header(&bad).and_then(|h| h.open_whole(&bad));
        assert!(ok.is_err(), "corrupt byte {at} of an object went unnoticed");
    }
}

/// Target `format_object`: object headers, chunk checksums, verifiable ranges.
pub fn object(data: &[u8]) {
    let refit = |fixed: &mut Vec<u8>| {
        if let Some(hb) = fix::le_u32(fixed, 12) {
            fix::crc_at(fixed, 72, hb as usize);
        }
    };
    format_target(
        data,
        generate_object,
        |buf, _| check_object_bytes(buf),
        refit,
    );
}

mod diff;
mod metadata;
pub use diff::diff;
pub use metadata::{checkpoint, log_index, supers};
