//! CRC32C of every chunk of an object's data section, three chunks at a time.
//!
//! Why: every byte a client writes is checksummed once more when its object is built
//! (a CRC32C per 4 KiB chunk, so a ranged read can be verified alone). The `crc32c`
//! crate computes one buffer at a time: it splits a 4 KiB chunk into three streams to
//! hide the CRC instruction's latency, then joins them with table lookups, and its
//! loop spends about 3.8 instructions per 8 bytes (callgrind). Three *chunks* are
//! three independent streams already: nothing to join, and a loop of one CRC
//! instruction per 8 bytes and stream. Where the CPU lacks SSE 4.2, and for the last
//! one or two chunks, the crate computes them as before; the results are the same
//! CRC32C (tests compare the two on every shape of input).

/// The CRC32C of each `chunk_bytes` piece of `data` (the last one may be shorter).
pub fn chunk_crcs(data: &[u8], chunk_bytes: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(data.len().div_ceil(chunk_bytes));
    for_each_chunk_crc(data, chunk_bytes, |crc| out.push(crc));
    out
}

/// [`chunk_crcs`] handed to `each` in chunk order, without a vector: what a read's
/// verification uses, so that it allocates nothing.
pub fn for_each_chunk_crc(data: &[u8], chunk_bytes: usize, mut each: impl FnMut(u32)) {
    assert!(chunk_bytes > 0, "chunks of zero bytes");
    let mut rest = data;
    #[cfg(target_arch = "x86_64")]
    if chunk_bytes.is_multiple_of(8) && std::arch::is_x86_feature_detected!("sse4.2") {
        let triples = data.len() / (3 * chunk_bytes);
        let (whole, tail) = data.split_at(triples * 3 * chunk_bytes);
        for triple in whole.chunks_exact(3 * chunk_bytes) {
            let (a, bc) = triple.split_at(chunk_bytes);
            let (b, c) = bc.split_at(chunk_bytes);
            // SAFETY: the CPU has SSE 4.2 (detected just above), the only feature
            // `three_at_once` is compiled for.
            let crcs = unsafe { x86::three_at_once(a, b, c) };
            crcs.into_iter().for_each(&mut each);
        }
        rest = tail;
    }
    rest.chunks(chunk_bytes).map(crc32c::crc32c).for_each(each);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::_mm_crc32_u64;

    /// The CRC32C of `a`, `b` and `c` (equal lengths, a multiple of 8 bytes), each
    /// its own stream through the CRC instruction, interleaved.
    #[target_feature(enable = "sse4.2")]
    pub(super) fn three_at_once(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
        debug_assert!(a.len() == b.len() && b.len() == c.len() && a.len().is_multiple_of(8));
        let word = |w: &[u8]| u64::from_le_bytes(w.try_into().expect("8-byte chunks"));
        // CRC32C starts from all ones and ends inverted.
        let (mut x, mut y, mut z) = (
            u64::from(u32::MAX),
            u64::from(u32::MAX),
            u64::from(u32::MAX),
        );
        for ((wa, wb), wc) in a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .zip(c.chunks_exact(8))
        {
            x = _mm_crc32_u64(x, word(wa));
            y = _mm_crc32_u64(y, word(wb));
            z = _mm_crc32_u64(z, word(wc));
        }
        [!(x as u32), !(y as u32), !(z as u32)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crate's CRC32C of each chunk, one at a time: what `chunk_crcs` must give.
    fn reference(data: &[u8], chunk_bytes: usize) -> Vec<u32> {
        data.chunks(chunk_bytes).map(crc32c::crc32c).collect()
    }

    #[test]
    fn the_same_crcs_as_one_chunk_at_a_time() {
        let data: Vec<u8> = (0..(64 << 10) + 24u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for chunk_bytes in [8, 512, 4096, 4100, 65536] {
            // Every count of whole chunks mod 3, with and without a short last chunk,
            // from aligned and unaligned starts.
            for chunks in 0..8 {
                for extra in [0, 8, 100] {
                    for start in [0, 1, 3] {
                        let len = (chunks * chunk_bytes + extra).min(data.len() - start);
                        let d = &data[start..start + len];
                        assert_eq!(
                            chunk_crcs(d, chunk_bytes),
                            reference(d, chunk_bytes),
                            "chunk {chunk_bytes}, {chunks} chunks + {extra}, from {start}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn known_values() {
        // The standard CRC32C check value, and an empty input.
        assert_eq!(chunk_crcs(b"123456789", 9), [0xe306_9283]);
        assert_eq!(chunk_crcs(&[], 4096), Vec::<u32>::new());
        let zeros = vec![0u8; 3 * 4096];
        assert_eq!(
            chunk_crcs(&zeros, 4096),
            vec![crc32c::crc32c(&zeros[..4096]); 3]
        );
    }
}
