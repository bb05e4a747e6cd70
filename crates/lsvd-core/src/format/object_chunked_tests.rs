//! Version 5 objects: chunks stored compressed where that saves space, read back by
//! ranges of the uncompressed data section.

use super::*;
use crate::format::test_support::{assert_each_flip_refused, refit_crc};

const EXTENTS: [ObjectExtent; 2] = [
    ObjectExtent {
        lba: 0,
        sectors: 256,
        source: None,
    },
    ObjectExtent {
        lba: 4096,
        sectors: 40,
        source: None,
    },
];

fn spec(extents: &[ObjectExtent]) -> ObjectSpec<'_> {
    ObjectSpec {
        kind: ObjectKind::Data,
        volume: VolumeId([3; 16]),
        seq: 9,
        last_record_seq: 12,
        extents,
        trims: &[(50_000, 8)],
        volume_size_bytes: None,
        parts_after: 0,
        epoch: 4,
        first_record_seq: 10,
    }
}

/// 148 KiB (three chunks: 64 KiB of text, 64 KiB of noise, 20 KiB of text).
fn mixed_data() -> Vec<u8> {
    let text = b"lsvd stores what it is given, smaller when it can. ";
    let mut data: Vec<u8> = text.iter().cycle().take(64 << 10).copied().collect();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    data.extend((0..64 << 10).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    }));
    data.extend(text.iter().cycle().take(20 << 10));
    assert_eq!(data.len() as u64, (256 + 40) * SECTOR_BYTES);
    data
}

fn object(compression: Compression) -> (Vec<u8>, Vec<u8>) {
    let data = mixed_data();
    (
        encode_compressed_object(&spec(&EXTENTS), &data, compression),
        data,
    )
}

/// Read data-section bytes `[rel, rel + len)` the way the engine does: the aligned
/// range, its stored bytes, opened.
fn read(h: &ObjectHeader, obj: &[u8], rel: u64, len: u64) -> Vec<u8> {
    let at = h.header_bytes as u64 + rel;
    let (s, e) = h.verifiable_range(at, len);
    let (ss, se) = h.stored_range(s, e);
    let plain = h
        .open_data(s, obj[ss as usize..se as usize].to_vec())
        .expect("opens");
    plain[(at - s) as usize..(at - s + len) as usize].to_vec()
}

#[test]
fn compressible_chunks_are_stored_compressed_and_read_back_by_range() {
    for compression in [Compression::Lz4, Compression::Zstd(3)] {
        let (obj, data) = object(compression);
        let h = decode_object_header(&obj).expect("decodes");
        assert_eq!(h.codec, compression.codec());
        assert_eq!((h.chunk_bytes, h.chunk_crcs.len()), (64 << 10, 3));
        assert_eq!(h.data_bytes, data.len() as u64);
        assert_eq!(h.total_bytes(), obj.len() as u64, "{compression}");
        let flags: Vec<bool> = h.stored_chunks.iter().map(|e| e >> 31 == 1).collect();
        assert_eq!(flags, [true, false, true], "{compression}: noise stays raw");
        assert!(
            h.stored_data_bytes() < (64 << 10) + (8 << 10),
            "{compression}: {} stored",
            h.stored_data_bytes()
        );
        h.verify_stored_data(&obj[h.header_bytes as usize..])
            .expect("every chunk verifies");
        for (rel, len) in [
            (0, 4096),
            (5000, 100),
            (60 << 10, 8 << 10),
            (64 << 10, 4096),
            (120 << 10, 28 << 10),
            (0, data.len() as u64),
        ] {
            assert_eq!(
                read(&h, &obj, rel, len),
                data[rel as usize..(rel + len) as usize],
                "{compression}: {rel}+{len}"
            );
        }
    }
}

#[test]
fn no_compression_writes_version_4() {
    let (obj, data) = object(Compression::None);
    assert_eq!(obj, encode_object(&spec(&EXTENTS), &data));
    let h = decode_object_header(&obj).expect("decodes");
    assert!(h.stored_chunks.is_empty());
    assert_eq!(read(&h, &obj, 70_000, 3000), data[70_000..73_000]);
}

#[test]
fn golden_version_5_header() {
    let (obj, _) = object(Compression::Lz4);
    assert_eq!(&obj[..12], b"LSVDOBJ\0\x05\x00\x01\x00");
    let u32_at = |at: usize| u32::from_le_bytes(obj[at..at + 4].try_into().expect("4 bytes"));
    assert_eq!(u32_at(12), 112 + 32 + 16 + 8 * 3, "header bytes");
    assert_eq!(
        (u32_at(64), u32_at(68)),
        (64 << 10, 3),
        "chunk bytes, count"
    );
    assert_eq!(&obj[104..112], &[1, 0, 0, 0, 0, 0, 0, 0], "codec lz4");
    let table = 112 + 32 + 16;
    assert_eq!(u32_at(table + 8), (64 << 10), "the noise chunk is raw");
    assert_eq!(u32_at(table) >> 31, 1, "the text chunk is compressed");
    assert_eq!(u32_at(72), GOLDEN_V5_CRC);
}
/// Covers the chunk table, so it also pins lz4_flex's output for the text chunk (the
/// version in Cargo.lock): a new compressor version may change it, never what decodes.
const GOLDEN_V5_CRC: u32 = 0xd026_6708;

#[test]
fn every_header_flip_and_every_bad_stored_byte_is_caught() {
    let (obj, _) = object(Compression::Zstd(3));
    let h = decode_object_header(&obj).expect("decodes");
    let header_bytes = h.header_bytes as usize;
    assert_each_flip_refused(
        &obj[..header_bytes],
        0..header_bytes,
        1,
        decode_object_header,
    );
    for at in [header_bytes, header_bytes + 100, obj.len() - 1] {
        let mut bad = obj.clone();
        bad[at] ^= 0x20;
        assert!(
            h.verify_stored_data(&bad[header_bytes..]).is_err(),
            "flip at {at}"
        );
        let (s, e) = (
            header_bytes as u64,
            (header_bytes + mixed_data().len()) as u64,
        );
        let (ss, se) = h.stored_range(s, e);
        assert!(
            h.open_data(s, bad[ss as usize..se as usize].to_vec())
                .is_err(),
            "open, flip at {at}"
        );
    }
    assert!(
        h.verify_stored_data(&obj[header_bytes..obj.len() - 1])
            .is_err(),
        "short"
    );
}

/// A header whose chunk table says what no writer writes, with a valid CRC: refused.
#[test]
fn impossible_chunk_tables_are_refused() {
    let (obj, _) = object(Compression::Lz4);
    let h = decode_object_header(&obj).expect("decodes");
    let header = &obj[..h.header_bytes as usize];
    let table = 112 + 32 + 16;
    let set = |at: usize, v: u32| {
        let mut bad = header.to_vec();
        bad[at..at + 4].copy_from_slice(&v.to_le_bytes());
        refit_crc(&mut bad, 72);
        bad
    };
    let cases = [
        (
            "compressed as long as the chunk",
            set(table, (64 << 10) | 1 << 31),
        ),
        ("compressed to nothing", set(table, 1 << 31)),
        ("raw but short", set(table + 8, 4096)),
        ("codec 0 with a compressed chunk", set(104, 0)),
        ("unknown codec", set(104, 7)),
        ("reserved byte after the codec", set(104, 0x101)),
        ("chunk size not a power of two", set(64, 96 << 10)),
        ("chunk size over 64 KiB", set(64, 128 << 10)),
    ];
    for (what, bad) in cases {
        assert!(decode_object_header(&bad).is_err(), "{what}");
    }
}

#[test]
fn ranges_outside_the_data_section_never_panic() {
    let (obj, _) = object(Compression::Lz4);
    let h = decode_object_header(&obj).expect("decodes");
    for (offset, len) in [(0, 0), (0, 1), (u64::MAX - 1, 4096), (u64::MAX, u64::MAX)] {
        let (s, e) = h.verifiable_range(offset, len);
        let (ss, se) = h.stored_range(s, e);
        assert!(
            ss <= se && se <= h.total_bytes(),
            "({offset}, {len}) gave {ss}..{se}"
        );
        let _ = h.open_data(s, obj.get(ss as usize..se as usize).unwrap_or(&[]).to_vec());
    }
    assert!(h.open_data(h.header_bytes as u64 + 1, vec![0; 10]).is_err());
}
