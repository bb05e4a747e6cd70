//! Objects of versions 1 to 4: round trips, golden bytes, older versions, resizes,
//! batch parts, corruption and garbage.

use super::*;

/// A spec of epoch 7 with no trims, no resize and no parts after it, record
/// sequence numbers 0: the tests override what they are about.
fn base_spec(kind: ObjectKind, volume: u8, seq: u64, extents: &[ObjectExtent]) -> ObjectSpec<'_> {
    ObjectSpec {
        kind,
        volume: VolumeId([volume; 16]),
        seq,
        last_record_seq: 0,
        extents,
        trims: &[],
        volume_size_bytes: None,
        parts_after: 0,
        epoch: 7,
        first_record_seq: 0,
    }
}

fn data_object() -> Vec<u8> {
    let extents = crate::format::examples::OBJECT_EXTENTS;
    let data: Vec<u8> = (0..17 * 512).map(|i| (i % 251) as u8).collect();
    let spec = ObjectSpec {
        last_record_seq: 77,
        trims: &[(1000, 8)],
        first_record_seq: 70,
        ..base_spec(ObjectKind::Data, 1, 5, &extents)
    };
    encode_object(&spec, &data)
}

#[test]
fn round_trip() {
    let obj = data_object();
    let h = decode_object_header(&obj).expect("decodes");
    assert_eq!(h.kind, ObjectKind::Data);
    assert_eq!(h.seq, 5);
    assert_eq!(h.last_record_seq, 77);
    assert_eq!(h.trims, vec![(1000, 8)]);
    assert_eq!(h.header_bytes as usize, 112 + 32 + 16 + 4 * 3);
    assert_eq!((h.epoch, h.first_record_seq), (7, Some(70)));
    assert_eq!(obj.len() as u64, h.total_bytes());
    let offsets: Vec<u64> = h.extent_offsets().map(|(_, o)| o).collect();
    assert_eq!(
        offsets,
        vec![h.header_bytes as u64, h.header_bytes as u64 + 4096]
    );
    let (s, e) = h.verifiable_range(h.header_bytes as u64 + 5000, 100);
    assert_eq!(
        (s, e),
        (h.header_bytes as u64 + 4096, h.header_bytes as u64 + 8192)
    );
    h.verify_data(s, &obj[s as usize..e as usize])
        .expect("chunk ok");
    let (s, e) = h.verifiable_range(h.header_bytes as u64 + 8192, 512);
    assert_eq!(e - s, 17 * 512 - 8192);
    h.verify_data(s, &obj[s as usize..e as usize])
        .expect("short last chunk ok");
}

/// Regression: offsets before the data section, past its end or near u64::MAX
/// (a corrupt map) panicked with an arithmetic overflow.
#[test]
fn verifiable_range_never_overflows() {
    let obj = data_object();
    let h = decode_object_header(&obj).expect("decodes");
    let data_start = h.header_bytes as u64;
    let data_end = data_start + h.data_bytes;
    for (offset, len) in [
        (0, 0),
        (0, 1),
        (data_start, 0),
        (data_end, 4096),
        (data_end + (1 << 20), 512),
        (u64::MAX - 1, 4096),
        (u64::MAX, u64::MAX),
    ] {
        let (s, e) = h.verifiable_range(offset, len);
        assert!(
            data_start <= s && s <= e && e <= data_end,
            "({offset}, {len}) gave {s}..{e}"
        );
    }
}

#[test]
fn golden_fixed_header() {
    let obj = data_object();
    assert_eq!(&obj[..16], b"LSVDOBJ\0\x04\x00\x01\x00\xac\x00\x00\x00");
    assert_eq!(
        &obj[32..48],
        &[5, 0, 0, 0, 0, 0, 0, 0, 77, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &obj[48..72],
        &[
            2, 0, 0, 0, 1, 0, 0, 0, 0, 0x22, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 3, 0, 0, 0
        ]
    );
    assert_eq!(&obj[76..80], &[0; 4], "parts_after");
    assert_eq!(&obj[80..88], &[0; 8], "no resize");
    assert_eq!(&obj[88..96], &7u64.to_le_bytes(), "epoch");
    assert_eq!(&obj[96..104], &70u64.to_le_bytes(), "first record");
    assert_eq!(&obj[104..112], &[0; 8], "reserved");
    assert_eq!(&obj[112..120], &0u64.to_le_bytes(), "first extent's lba");
    assert_eq!(
        u32::from_le_bytes(obj[72..76].try_into().expect("4 bytes")),
        GOLDEN_CRC
    );
}
const GOLDEN_CRC: u32 = 0xca22_442d;

/// The same object as an older build wrote it: version 1 (or 2 with a size, 3
/// with `parts_after`), the 80-byte fixed part, no epoch, no first record.
fn legacy(v4: &[u8], version: u16) -> Vec<u8> {
    let h = decode_object_header(v4).expect("v4 decodes");
    let hb = h.header_bytes as usize;
    let mut head = v4[..80].to_vec();
    head[8..10].copy_from_slice(&version.to_le_bytes());
    if version != OBJECT_VERSION_PART {
        head[76..80].fill(0);
    }
    if version == OBJECT_VERSION_RESIZE {
        head.extend_from_slice(&h.volume_size_bytes.expect("a size").to_le_bytes());
    }
    head.extend_from_slice(&v4[112..hb]);
    let n = head.len() as u32;
    head[12..16].copy_from_slice(&n.to_le_bytes());
    head[72..76].fill(0);
    let crc = crc32c::crc32c(&head);
    head[72..76].copy_from_slice(&crc.to_le_bytes());
    head.extend_from_slice(&v4[hb..]);
    head
}

/// Objects written before version 4 still read: the same fields, epoch 0 and no
/// first record; the data section unchanged.
#[test]
fn versions_1_to_3_still_read() {
    let v4 = data_object();
    let v1 = legacy(&v4, OBJECT_VERSION);
    assert_eq!(&v1[..16], b"LSVDOBJ\0\x01\x00\x01\x00\x8c\x00\x00\x00");
    let h4 = decode_object_header(&v4).expect("v4");
    let h1 = decode_object_header(&v1).expect("v1");
    assert_eq!((h1.epoch, h1.first_record_seq), (0, None));
    assert_eq!(
        (&h1.extents, &h1.trims, &h1.chunk_crcs, h1.last_record_seq),
        (&h4.extents, &h4.trims, &h4.chunk_crcs, h4.last_record_seq)
    );
    assert_eq!(&v1[140..], &v4[172..], "the data section");
    let r4 = resize_object(ObjectKind::Data, 1 << 20);
    let r2 = legacy(&r4, OBJECT_VERSION_RESIZE);
    assert_eq!(&r2[..16], b"LSVDOBJ\0\x02\x00\x01\x00\x68\x00\x00\x00");
    let h2 = decode_object_header(&r2).expect("v2");
    assert_eq!((h2.volume_size_bytes, h2.epoch), (Some(1 << 20), 0));
    let p4 = part_object(ObjectKind::Data, 2);
    let p3 = legacy(&p4, OBJECT_VERSION_PART);
    assert_eq!(&p3[..16], b"LSVDOBJ\0\x03\x00\x01\x00\x64\x00\x00\x00");
    assert_eq!(decode_object_header(&p3).expect("v3").parts_after, 2);
    for old in [&v1, &r2, &p3] {
        let h = decode_object_header(old).expect("decodes");
        for pos in 0..h.header_bytes as usize {
            let mut bad = old.to_vec();
            bad[pos] ^= 1;
            assert!(decode_object_header(&bad).is_err(), "header flip at {pos}");
        }
    }
}

#[test]
fn corruption_detected() {
    let obj = data_object();
    let h = decode_object_header(&obj).expect("decodes");
    for pos in 0..h.header_bytes as usize {
        let mut bad = obj.clone();
        bad[pos] ^= 1;
        assert!(decode_object_header(&bad).is_err(), "header flip at {pos}");
    }
    let mut bad = obj.clone();
    let at = h.header_bytes as usize + 10;
    bad[at] ^= 1;
    let (s, e) = h.verifiable_range(at as u64, 1);
    assert!(h.verify_data(s, &bad[s as usize..e as usize]).is_err());
}

#[test]
fn gc_extents_carry_source() {
    let extents = [ObjectExtent {
        lba: 16,
        sectors: 8,
        source: Some(ExtentSource {
            object_seq: 3,
            object_offset: 4242,
        }),
    }];
    let spec = ObjectSpec {
        last_record_seq: 1,
        first_record_seq: 2,
        ..base_spec(ObjectKind::Gc, 2, 9, &extents)
    };
    let obj = encode_object(&spec, &[0u8; 4096]);
    let h = decode_object_header(&obj).expect("decodes");
    assert_eq!(h.extents, extents.to_vec());
}

fn resize_object(kind: ObjectKind, size: u64) -> Vec<u8> {
    let spec = ObjectSpec {
        last_record_seq: 40,
        trims: &[(2048, 2048)],
        volume_size_bytes: Some(size),
        first_record_seq: 41,
        ..base_spec(kind, 3, 12, &[])
    };
    encode_object(&spec, &[])
}

/// An object that resizes the volume carries the size at 80 (0 in every other
/// object).
#[test]
fn a_resize_object_carries_the_size_at_80() {
    let obj = resize_object(ObjectKind::Data, 1 << 20);
    assert_eq!(&obj[..16], b"LSVDOBJ\0\x04\x00\x01\x00\x80\x00\x00\x00");
    assert_eq!(&obj[80..88], &(1u64 << 20).to_le_bytes());
    assert_eq!(&obj[112..120], &2048u64.to_le_bytes());
    assert_eq!(obj.len(), 112 + 16);
    let h = decode_object_header(&obj).expect("decodes");
    assert_eq!(h.volume_size_bytes, Some(1 << 20));
    assert_eq!(h.trims, vec![(2048, 2048)]);
    assert_eq!(h.header_bytes, 128);
    assert_eq!(h.first_record_seq, Some(41));
    assert_eq!(
        decode_object_header(&data_object())
            .expect("v4")
            .volume_size_bytes,
        None
    );
    for pos in 0..obj.len() {
        let mut bad = obj.clone();
        bad[pos] ^= 1;
        assert!(decode_object_header(&bad).is_err(), "header flip at {pos}");
    }
}

#[test]
fn a_resize_must_be_a_data_object_of_whole_4k_blocks() {
    for (kind, size) in [
        (ObjectKind::Gc, 1 << 20),
        (ObjectKind::Checkpoint, 1 << 20),
        (ObjectKind::Data, (1 << 20) + 512),
    ] {
        let err = decode_object_header(&resize_object(kind, size)).expect_err("refused");
        assert!(
            err.to_string().contains("resizing"),
            "{kind:?} {size}: {err}"
        );
    }
    // An unknown version is refused as such.
    let mut v6 = resize_object(ObjectKind::Data, 1 << 20);
    v6[8] = 6;
    assert!(matches!(
        decode_object_header(&v6),
        Err(FormatError::UnsupportedVersion { version: 6, .. })
    ));
}

/// A data object with `parts_after` set, as hylog writes a split batch.
fn part_object(kind: ObjectKind, parts_after: u32) -> Vec<u8> {
    let extents = [ObjectExtent {
        lba: 64,
        sectors: 8,
        source: None,
    }];
    let spec = ObjectSpec {
        last_record_seq: 90,
        parts_after,
        first_record_seq: 90,
        ..base_spec(kind, 4, 20, &extents)
    };
    encode_object(&spec, &[7u8; 4096])
}

/// A part of a split batch carries `parts_after` at 76; the last part (and every
/// unsplit batch) 0.
#[test]
fn a_part_with_parts_after_it_carries_the_count_at_76() {
    let obj = part_object(ObjectKind::Data, 2);
    assert_eq!(&obj[..16], b"LSVDOBJ\0\x04\x00\x01\x00\x84\x00\x00\x00");
    assert_eq!(&obj[76..80], &2u32.to_le_bytes());
    assert_eq!(&obj[112..120], &64u64.to_le_bytes());
    let h = decode_object_header(&obj).expect("decodes");
    assert_eq!(
        (h.parts_after, h.header_bytes, h.volume_size_bytes),
        (2, 132, None)
    );
    let last = part_object(ObjectKind::Data, 0);
    assert_eq!(&last[76..80], &[0; 4]);
    assert_eq!(decode_object_header(&last).expect("v4").parts_after, 0);
    for pos in 0..132 {
        let mut bad = obj.clone();
        bad[pos] ^= 1;
        assert!(decode_object_header(&bad).is_err(), "header flip at {pos}");
    }
}

/// Only a data object can be a part, with at least one part after it; a version 1
/// header must keep 76 zero.
#[test]
fn a_part_must_be_a_data_object_with_parts_after_it() {
    let with_crc = |mut obj: Vec<u8>, version: u16, at_76: u32| {
        obj[8..10].copy_from_slice(&version.to_le_bytes());
        obj[76..80].copy_from_slice(&at_76.to_le_bytes());
        obj[72..76].fill(0);
        let n = u32::from_le_bytes(obj[12..16].try_into().expect("4 bytes")) as usize;
        let crc = crc32c::crc32c(&obj[..n]);
        obj[72..76].copy_from_slice(&crc.to_le_bytes());
        obj
    };
    let data = legacy(&part_object(ObjectKind::Data, 1), OBJECT_VERSION_PART);
    assert!(decode_object_header(&with_crc(data.clone(), 3, 1)).is_ok());
    let err = decode_object_header(&with_crc(data.clone(), 3, 0)).expect_err("no parts after");
    assert!(err.to_string().contains("part of a batch"), "{err}");
    let err = decode_object_header(&with_crc(data.clone(), 1, 1)).expect_err("v1 reserved");
    assert!(err.to_string().contains("reserved"), "{err}");
    let mut gc = data.clone();
    gc[10..12].copy_from_slice(&2u16.to_le_bytes());
    let err = decode_object_header(&with_crc(gc, 3, 1)).expect_err("gc part");
    assert!(err.to_string().contains("part of a batch"), "{err}");
    // Version 4: the same rule.
    let mut gc4 = part_object(ObjectKind::Data, 1);
    gc4[10..12].copy_from_slice(&2u16.to_le_bytes());
    let err = decode_object_header(&with_crc(gc4, 4, 1)).expect_err("gc part");
    assert!(err.to_string().contains("part of a batch"), "{err}");
}

#[test]
fn garbage_never_panics() {
    let mut state = 7u64;
    let good = data_object();
    for i in 0..2000 {
        let mut buf = good[..(i % good.len()).max(1)].to_vec();
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        let pos = (state >> 33) as usize % buf.len();
        buf[pos] = (state >> 20) as u8;
        let _ = decode_object_header(&buf);
    }
}

/// A ranged verification of a data section: aligned ranges pass (the object's short
/// last chunk included), a range that ends short of a chunk anywhere but at the
/// object's end is refused, and a damaged chunk fails with its stored and computed
/// CRCs, whichever of a triple (the CRCs are computed three chunks at a time) it is.
#[test]
fn ranged_verification_checks_every_chunk_and_the_range_edges() {
    let chunk = CHUNK_BYTES as usize;
    let data: Vec<u8> = (0..7 * chunk + 512).map(|i| (i * 7 % 251) as u8).collect();
    let crcs: Vec<u32> = data.chunks(chunk).map(crc32c::crc32c).collect();
    let len = data.len() as u64;
    let header_bytes = 200;
    let at = |c: usize| header_bytes + (c * chunk) as u64;
    verify_chunks(header_bytes, len, &crcs, at(0), &data).expect("the whole section");
    verify_chunks(header_bytes, len, &crcs, at(2), &data[2 * chunk..6 * chunk])
        .expect("a middle range");
    verify_chunks(header_bytes, len, &crcs, at(5), &data[5 * chunk..])
        .expect("the short last chunk");
    let short = verify_chunks(header_bytes, len, &crcs, at(1), &data[chunk..3 * chunk - 8]);
    assert!(
        short.is_err(),
        "a range ending mid-chunk inside the object passed"
    );
    let off_chunk = verify_chunks(
        header_bytes,
        len,
        &crcs,
        at(1) + 8,
        &data[chunk + 8..2 * chunk + 8],
    );
    assert!(off_chunk.is_err(), "an unaligned start passed");
    for bad_chunk in [0, 1, 2, 3, 7] {
        let mut bad = data.clone();
        bad[bad_chunk * chunk + 3] ^= 0x40;
        let e = verify_chunks(header_bytes, len, &crcs, at(0), &bad).expect_err("damage passed");
        let computed =
            crc32c::crc32c(&bad[bad_chunk * chunk..((bad_chunk + 1) * chunk).min(bad.len())]);
        assert_eq!(
            e,
            FormatError::BadChecksum {
                what: "object data",
                stored: crcs[bad_chunk],
                computed,
            },
            "chunk {bad_chunk}"
        );
    }
}
