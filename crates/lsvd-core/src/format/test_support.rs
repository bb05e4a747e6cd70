//! Checks the format tests share: every layout has a golden CRC, refuses each flipped
//! byte and each truncation, and some tests rebuild older versions by hand and need
//! their CRC refitted.

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
