//! The envelope of an encrypted volume's objects: where each authenticated segment
//! sits, so that a ranged read fetches and opens only the segments it needs.
//!
//! Why a layout of its own: encryption wraps an object *after* it is encoded (the
//! object, checkpoint and GC formats are unchanged inside), and reads take byte ranges
//! of objects. Cutting the plaintext into fixed 4 KiB segments, each sealed on its own
//! with its nonce and tag beside it, keeps a ranged read a ranged read: plaintext
//! bytes `a..b` live in segments `a/4096 ..= (b-1)/4096`, at offsets computed from the
//! numbers alone, without reading the envelope's header first.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDSEAL"
//!      8    2 version (1)
//!     10    2 flags (0)
//!     12    4 crc32c over these 16 bytes (this field zero)
//!     16      segments, each: random nonce part (8) | ciphertext (4096, the last
//!             1..=4096) | tag (16)
//! ```
//! The cryptography (the per-object key, the nonce, AES-256-GCM) is in
//! `lsvd_store::sealed`; docs/format/sealed.md has both and the argument that nonces
//! never repeat. This module is the arithmetic, shared by the store and the fuzzers.

use std::ops::Range;

use super::{FormatError, Writer, open_fixed_record};

pub const SEALED_MAGIC: &[u8; 8] = b"LSVDSEAL";
pub const SEALED_VERSION: u16 = 1;
pub const SEALED_HEADER_BYTES: u64 = 16;
/// Plaintext bytes per segment (all but the last are full).
pub const SEGMENT_PLAIN_BYTES: u64 = 4096;
/// The random part of each segment's nonce, stored before its ciphertext.
pub const NONCE_RANDOM_BYTES: u64 = 8;
pub const TAG_BYTES: u64 = 16;
/// What each segment adds to its plaintext.
pub const SEGMENT_OVERHEAD_BYTES: u64 = NONCE_RANDOM_BYTES + TAG_BYTES;
/// A full segment as stored.
pub const SEGMENT_STORED_BYTES: u64 = SEGMENT_PLAIN_BYTES + SEGMENT_OVERHEAD_BYTES;

/// The envelope's header.
pub fn encode_sealed_header() -> Vec<u8> {
    let mut w = Writer::with_capacity(SEALED_HEADER_BYTES as usize);
    w.head(SEALED_MAGIC, SEALED_VERSION, 0);
    w.seal(12)
}

/// Check the first [`SEALED_HEADER_BYTES`] of a sealed object.
pub fn decode_sealed_header(buf: &[u8]) -> Result<(), FormatError> {
    let head = buf.get(..SEALED_HEADER_BYTES as usize).unwrap_or(buf);
    open_fixed_record(
        head,
        "sealed object header",
        SEALED_HEADER_BYTES as usize,
        SEALED_MAGIC,
        SEALED_VERSION,
        0,
    )
    .map(|_| ())
}

/// Stored size of an object of `plain_bytes`.
pub fn sealed_len(plain_bytes: u64) -> u64 {
    SEALED_HEADER_BYTES
        + plain_bytes
        + plain_bytes.div_ceil(SEGMENT_PLAIN_BYTES) * SEGMENT_OVERHEAD_BYTES
}

/// Plaintext size of a sealed object stored in `sealed_bytes`; None if no plaintext
/// has that stored size (a segment of no more than its overhead).
pub fn plain_len(sealed_bytes: u64) -> Option<u64> {
    let body = sealed_bytes.checked_sub(SEALED_HEADER_BYTES)?;
    let (full, rest) = (body / SEGMENT_STORED_BYTES, body % SEGMENT_STORED_BYTES);
    let last = match rest {
        0 => 0,
        r if r > SEGMENT_OVERHEAD_BYTES => r - SEGMENT_OVERHEAD_BYTES,
        _ => return None,
    };
    Some(full * SEGMENT_PLAIN_BYTES + last)
}

/// The segments holding plaintext `range` (not empty): the first one's index, and the
/// stored bytes to fetch (running past the object's end when the range does: stores
/// return what exists).
pub fn segments_for(range: &Range<u64>) -> (u64, Range<u64>) {
    let first = range.start / SEGMENT_PLAIN_BYTES;
    let last = range.end.saturating_sub(1).max(range.start) / SEGMENT_PLAIN_BYTES;
    let at = |seg: u64| SEALED_HEADER_BYTES + seg * SEGMENT_STORED_BYTES;
    (first, at(first)..at(last + 1))
}

/// Split stored segment bytes (whole segments from a segment boundary) into segments;
/// an error if the last is no longer than its overhead.
pub fn split_segments(stored: &[u8]) -> Result<Vec<&[u8]>, FormatError> {
    let segments: Vec<&[u8]> = stored.chunks(SEGMENT_STORED_BYTES as usize).collect();
    if segments
        .last()
        .is_some_and(|s| s.len() as u64 <= SEGMENT_OVERHEAD_BYTES)
    {
        return Err(super::invalid(
            "sealed object",
            format!(
                "a last segment of {} bytes",
                stored.len() as u64 % SEGMENT_STORED_BYTES
            ),
        ));
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::assert_each_flip_refused;

    const GOLDEN_HEADER: &str = "4c5356445345414c010000008ffba0b7";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn header_round_trips_and_refuses_every_flip() {
        let h = encode_sealed_header();
        assert_eq!(h.len(), 16);
        assert_eq!(&h[..8], SEALED_MAGIC);
        decode_sealed_header(&h).expect("decodes");
        // Golden: the header never changes within version 1.
        assert_eq!(hex(&h), GOLDEN_HEADER);
        assert_each_flip_refused(&h, 0..h.len(), 0x80, decode_sealed_header);
        assert!(decode_sealed_header(&h[..10]).is_err());
    }

    #[test]
    fn lengths_invert() {
        for plain in [0, 1, 4095, 4096, 4097, 8192, 65536, 1 << 22, (1 << 22) + 17] {
            let sealed = sealed_len(plain);
            assert_eq!(plain_len(sealed), Some(plain), "plain {plain}");
        }
        assert_eq!(sealed_len(4096), 16 + 4120);
        // A stored size no plaintext has: a last segment of only its overhead.
        assert_eq!(plain_len(16 + 4120 + 24), None);
        assert_eq!(plain_len(15), None);
    }

    #[test]
    fn ranges_map_to_whole_segments() {
        assert_eq!(segments_for(&(0..1)), (0, 16..16 + 4120));
        assert_eq!(segments_for(&(4095..4097)), (0, 16..16 + 2 * 4120));
        assert_eq!(segments_for(&(4096..8192)), (1, 16 + 4120..16 + 2 * 4120));
        assert_eq!(segments_for(&(5..5)), (0, 16..16 + 4120));
    }

    #[test]
    fn splitting_refuses_a_last_segment_of_only_overhead() {
        let ok = vec![0u8; 4120 + 25];
        assert_eq!(split_segments(&ok).expect("splits").len(), 2);
        assert!(split_segments(&vec![0u8; 4120 + 24]).is_err());
        assert!(split_segments(&[]).expect("empty").is_empty());
    }
}
