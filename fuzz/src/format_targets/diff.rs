//! The `format_diff` target: the diff stream decoder (`lsvd_core::format::diff`), as
//! `lsvd import-diff` runs it on a file or a pipe it did not write.

use lsvd_core::format::VolumeId;
use lsvd_core::format::diff::{DiffHeader, DiffRecord, decode_diff, encode_diff};

use super::fix;
use crate::bytes::Bytes;

const HEADER: usize = 200;
const HEAD: usize = 24;

/// Recompute the header's CRC and every record's, walking the records as the reader
/// does, so mutated bytes get past the checksums.
fn fix_diff(buf: &mut [u8]) {
    fix::crc_at(buf, 12, HEADER);
    let mut at = HEADER;
    while at + HEAD <= buf.len() {
        let payload = if buf[at] == 1 {
            fix::le_u64(buf, at + 16)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= buf.len() - at - HEAD)
                .unwrap_or(0)
        } else {
            0
        };
        let end = at + HEAD + payload;
        let mut hole = buf[at..end].to_vec();
        hole[4..8].fill(0);
        let crc = crc32c::crc32c(&hole);
        buf[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

fn build(b: &mut Bytes<'_>) -> (DiffHeader, Vec<DiffRecord>) {
    let size_bytes = u64::from(b.below(1 << 16)) * 512;
    let from = b.bool();
    let header = DiffHeader {
        volume: VolumeId(b.array()),
        size_bytes,
        created_unix_ms: b.u64(),
        from_snapshot: from.then(|| "base".to_string()),
        from_through_seq: if from { u64::from(b.u8()) } else { 0 },
        to_snapshot: "snap".to_string(),
        to_through_seq: 300 + u64::from(b.u8()),
    };
    let mut records = Vec::new();
    let mut at = 0u64;
    for _ in 0..b.below(6) {
        let gap = u64::from(b.below(8)) * 512;
        let len = (1 + u64::from(b.below(8))) * 512;
        let offset = at + gap;
        if offset + len > size_bytes {
            break;
        }
        records.push(if b.bool() {
            DiffRecord::Data {
                offset,
                data: b.exact(len as usize),
            }
        } else {
            DiffRecord::Zeros {
                offset,
                length: len,
            }
        });
        at = offset + len;
    }
    (header, records)
}

pub fn diff(data: &[u8]) {
    let (generate, rest) = super::split_mode(data);
    if !generate {
        for bytes in [rest.to_vec(), {
            let mut fixed = rest.to_vec();
            fix_diff(&mut fixed);
            fixed
        }] {
            if let Ok((h, records)) = decode_diff(&bytes) {
                let again = encode_diff(&h, &records).expect("a decoded diff encodes");
                assert_eq!(again, bytes, "the layout is canonical");
            }
        }
        return;
    }
    let mut b = Bytes::new(rest);
    let (h, records) = build(&mut b);
    let Ok(bytes) = encode_diff(&h, &records) else {
        return;
    };
    let back = decode_diff(&bytes).expect("what was encoded decodes");
    assert_eq!(back, (h, records));
    let i = usize::from(b.u16()) % bytes.len();
    let mut bad = bytes.clone();
    bad[i] ^= 1 << (b.u8() % 8);
    assert!(decode_diff(&bad).is_err(), "byte {i} changed and accepted");
    let cut = usize::from(b.u16()) % bytes.len();
    assert!(decode_diff(&bytes[..cut]).is_err(), "cut at {cut} accepted");
}
