//! The diff stream: golden bytes built from the layout in the module docs, round
//! trips, and refusal of every damaged, reordered, cut or extended stream.

use super::*;

fn header(from: Option<&str>) -> DiffHeader {
    DiffHeader {
        volume: VolumeId([7; 16]),
        size_bytes: 1 << 20,
        created_unix_ms: 1_700_000_000_000,
        from_snapshot: from.map(str::to_string),
        from_through_seq: if from.is_some() { 5 } else { 0 },
        to_snapshot: "s2".to_string(),
        to_through_seq: 9,
    }
}

fn records() -> Vec<DiffRecord> {
    vec![
        DiffRecord::Data {
            offset: 4096,
            data: vec![0xab; 1024],
        },
        DiffRecord::Zeros {
            offset: 8192,
            length: 65536,
        },
        DiffRecord::Data {
            offset: 8192 + 65536,
            data: (0..512).map(|i| i as u8).collect(),
        },
    ]
}

/// The header, field by field at the offsets the module docs give.
#[test]
fn golden_header_and_records() {
    let bytes = encode_diff(&header(Some("s1")), &records()).expect("encode");
    let mut want = vec![0u8; DIFF_HEADER_BYTES];
    want[0..8].copy_from_slice(b"LSVDDIF\0");
    want[8..10].copy_from_slice(&1u16.to_le_bytes());
    want[16..32].copy_from_slice(&[7; 16]);
    want[32..40].copy_from_slice(&(1u64 << 20).to_le_bytes());
    want[40..48].copy_from_slice(&1_700_000_000_000u64.to_le_bytes());
    want[48..56].copy_from_slice(&5u64.to_le_bytes());
    want[56..64].copy_from_slice(&9u64.to_le_bytes());
    want[64..66].copy_from_slice(&2u16.to_le_bytes());
    want[66..68].copy_from_slice(&2u16.to_le_bytes());
    want[72..74].copy_from_slice(b"s1");
    want[136..138].copy_from_slice(b"s2");
    let crc = crc32c::crc32c(&want);
    want[12..16].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(&bytes[..DIFF_HEADER_BYTES], &want[..]);
    // Pinned: a change to the layout or the CRC rule changes this.
    assert_eq!(crc, 0xd6bb_01b4, "header crc {crc:#010x}");

    // The first record: kind 1, CRC over head (CRC zero) + payload, offset, length.
    let rec = &bytes[DIFF_HEADER_BYTES..DIFF_HEADER_BYTES + 24];
    let mut head = [0u8; 24];
    head[0] = 1;
    head[8..16].copy_from_slice(&4096u64.to_le_bytes());
    head[16..24].copy_from_slice(&1024u64.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), &[0xab; 1024]);
    head[4..8].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(rec, &head);
    // The end record counts 3 records and 1536 data bytes.
    let end = &bytes[bytes.len() - 24..];
    assert_eq!(end[0], 3);
    assert_eq!(&end[8..16], &3u64.to_le_bytes());
    assert_eq!(&end[16..24], &1536u64.to_le_bytes());
    assert_eq!(
        bytes.len(),
        DIFF_HEADER_BYTES + 4 * 24 + 1024 + 512,
        "header, 4 record heads, 2 payloads"
    );
}

#[test]
fn round_trips_with_and_without_a_base() {
    for from in [Some("s1"), None] {
        let h = header(from);
        let bytes = encode_diff(&h, &records()).expect("encode");
        assert_eq!(decode_diff(&bytes).expect("decode"), (h, records()));
    }
    let empty = encode_diff(&header(None), &[]).expect("encode");
    assert_eq!(decode_diff(&empty).expect("decode").1, vec![]);
}

#[test]
fn every_flipped_bit_is_refused() {
    let bytes = encode_diff(&header(Some("s1")), &records()).expect("encode");
    for i in 0..bytes.len() {
        // Every bit of the heads, a few of the payloads.
        let bits: &[u8] = if i < DIFF_HEADER_BYTES + 24 || i % 97 == 0 || i >= bytes.len() - 24 {
            &[0, 1, 2, 3, 4, 5, 6, 7]
        } else {
            &[]
        };
        for &bit in bits {
            let mut bad = bytes.clone();
            bad[i] ^= 1 << bit;
            assert!(decode_diff(&bad).is_err(), "byte {i} bit {bit} accepted");
        }
    }
}

#[test]
fn cut_or_extended_streams_are_refused() {
    let bytes = encode_diff(&header(None), &records()).expect("encode");
    for len in 0..bytes.len() {
        assert!(decode_diff(&bytes[..len]).is_err(), "cut at {len} accepted");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(decode_diff(&longer).is_err());
    // A whole record left out (its neighbours intact) is caught by the end's counts.
    let h = header(None);
    let mut enc = DiffEncoder::new(h.size_bytes);
    let mut out = encode_diff_header(&h).expect("header");
    let first = enc.data(0, &[1; 512]).expect("data");
    let _dropped = enc.zeros(512, 512).expect("zeros");
    out.extend_from_slice(&first);
    out.extend_from_slice(&[1; 512]);
    out.extend_from_slice(&enc.end());
    assert!(
        decode_diff(&out).is_err(),
        "a missing record was not noticed"
    );
}

#[test]
fn records_out_of_order_overlapping_or_outside_are_refused() {
    let h = header(None);
    let mut enc = DiffEncoder::new(h.size_bytes);
    enc.data(4096, &[1; 512]).expect("first");
    assert!(enc.data(4096, &[1; 512]).is_err(), "overlap");
    assert!(enc.zeros(0, 512).is_err(), "backwards");
    assert!(enc.zeros(8192, 100).is_err(), "not whole units");
    assert!(enc.zeros(8192, 0).is_err(), "empty");
    assert!(enc.zeros(h.size_bytes, 512).is_err(), "past the end");
    assert!(enc.zeros(u64::MAX - 511, 512).is_err(), "overflow");
    let big = vec![0u8; (MAX_DATA_RECORD_BYTES + 512) as usize];
    assert!(DiffEncoder::new(1 << 30).data(0, &big).is_err(), "too long");
    // The encoder refuses bad headers too.
    let mut bad = header(None);
    bad.to_snapshot = String::new();
    assert!(encode_diff_header(&bad).is_err());
    bad.to_snapshot = "x".repeat(65);
    assert!(encode_diff_header(&bad).is_err());
    let mut bad = header(None);
    bad.size_bytes = 1000;
    assert!(encode_diff_header(&bad).is_err());
}
