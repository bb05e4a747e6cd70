//! Checks the format tests share: every layout has a golden CRC, refuses each flipped
//! byte and each truncation, never panics on garbage, and some tests rebuild older
//! versions by hand and need their CRC refitted.

/// The CRC32C stored at `crc_at` (little-endian).
pub(crate) fn stored_crc(buf: &[u8], crc_at: usize) -> u32 {
    let slot: [u8; 4] = buf[crc_at..crc_at + 4].try_into().expect("4 bytes");
    u32::from_le_bytes(slot)
}

/// Recompute the CRC32C of `buf` (the slot at `crc_at` taken as zero) and store it.
pub(crate) fn refit_crc(buf: &mut [u8], crc_at: usize) {
    buf[crc_at..crc_at + 4].fill(0);
    let crc = crc32c::crc32c(buf);
    buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Assert that `decode` refuses `buf` with any one byte in `positions` XORed with
/// `mask`; a failure names the position.
pub(crate) fn assert_each_flip_refused<T: std::fmt::Debug, E>(
    buf: &[u8],
    positions: impl IntoIterator<Item = usize>,
    mask: u8,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) {
    for pos in positions {
        let mut bad = buf.to_vec();
        bad[pos] ^= mask;
        let got = decode(&bad);
        assert!(got.is_err(), "flip at {pos} decoded: {:?}", got.ok());
    }
}

/// [`assert_each_flip_refused`] over every byte, and `buf` one byte short refused too.
pub(crate) fn assert_corruption_refused<T: std::fmt::Debug, E>(
    buf: &[u8],
    mask: u8,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) {
    assert_each_flip_refused(buf, 0..buf.len(), mask, &decode);
    assert!(
        decode(&buf[..buf.len() - 1]).is_err(),
        "one byte short decoded"
    );
}

/// Call `decode` (which must not panic) on a buffer of pseudo-random bytes of each
/// length below `lengths`, the same bytes on every run (from `seed`).
pub(crate) fn feed_garbage(lengths: usize, seed: u64, mut decode: impl FnMut(&[u8])) {
    let mut state = seed;
    for len in 0..lengths {
        let buf: Vec<u8> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        decode(&buf);
    }
}

/// A 4 KiB block of `fill` bytes ending in its own CRC32C: every such block has the
/// same CRC32C (the residue), the case a CRC alone cannot tell apart.
pub(crate) fn self_checksummed_block(fill: u8) -> Vec<u8> {
    let mut b = vec![fill; 4096];
    let c = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&c.to_le_bytes());
    b
}
