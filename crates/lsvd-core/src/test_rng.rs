//! A seeded pseudo-random source for the randomized unit tests: the same numbers on
//! every run, so a failure reproduces.

/// Xorshift64 from `seed` (non-zero): each call gives the next number.
pub(crate) fn xorshift64(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
