//! XXH3-64 with a seed, over inputs longer than 240 bytes, with AVX2 when the CPU has
//! it: the write-log record's data hash.
//!
//! Why: the data hash is the one pass over every byte a client writes on its way into
//! the log, and the `xxhash-rust` crate picks its vector width when it is compiled:
//! SSE2 (16 bytes per instruction) in a build for any x86-64, about 2,750
//! instructions per 4 KiB (callgrind), a fifth of a 4 KiB write. This is the same
//! algorithm (the "long" path of XXH3, as `doc/xxhash_spec.md` of
//! <https://github.com/Cyan4973/xxHash> describes it) on 32-byte lanes, chosen at run
//! time. Shorter inputs, CPUs without AVX2 and other architectures use the crate. The
//! value is the same either way: tests compare the two over every length class and
//! many seeds, and the record format's golden values pin it.

/// XXH3-64 of `data` with `seed`, as `xxhash_rust::xxh3::xxh3_64_with_seed` computes it.
pub fn xxh3_64_with_seed(data: &[u8], seed: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if data.len() > MID_SIZE_MAX && std::arch::is_x86_feature_detected!("avx2") {
        let secret = seeded_secret(seed);
        // SAFETY: the CPU has AVX2 (detected just above), the only feature
        // `long_hash` is compiled for.
        return unsafe { avx2::long_hash(data, &secret) };
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(data, seed)
}

/// Inputs up to this long take XXH3's short paths (left to the crate).
const MID_SIZE_MAX: usize = 240;
const SECRET_BYTES: usize = 192;
const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH3's default secret (`kSecret` in the specification).
const DEFAULT_SECRET: [u8; SECRET_BYTES] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// The secret a seeded long hash uses: each 16 bytes of the default secret, the first
/// 8 plus the seed and the last 8 minus it (little-endian); the default for seed 0.
fn seeded_secret(seed: u64) -> [u8; SECRET_BYTES] {
    let mut secret = DEFAULT_SECRET;
    for pair in secret.chunks_exact_mut(16) {
        let (lo, hi) = pair.split_at_mut(8);
        let l = read_u64(lo, 0).wrapping_add(seed);
        let h = read_u64(hi, 0).wrapping_sub(seed);
        lo.copy_from_slice(&l.to_le_bytes());
        hi.copy_from_slice(&h.to_le_bytes());
    }
    secret
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The accumulators' merge at the end of the long hash: four 128-bit products folded
/// into `len * PRIME64_1`, then XXH3's avalanche.
fn merge_accumulators(acc: &[u64; 8], secret: &[u8; SECRET_BYTES], len: usize) -> u64 {
    const MERGE_SECRET_AT: usize = 11;
    let mut result = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let lo = acc[2 * i] ^ read_u64(secret, MERGE_SECRET_AT + 16 * i);
        let hi = acc[2 * i + 1] ^ read_u64(secret, MERGE_SECRET_AT + 16 * i + 8);
        let product = u128::from(lo) * u128::from(hi);
        result = result.wrapping_add((product as u64) ^ ((product >> 64) as u64));
    }
    result ^= result >> 37;
    result = result.wrapping_mul(0x1656_6791_9E37_79F9);
    result ^ (result >> 32)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    const STRIPE_BYTES: usize = 64;
    /// Stripes per block: the secret advances 8 bytes a stripe, and a stripe uses 64.
    const STRIPES_PER_BLOCK: usize = (SECRET_BYTES - STRIPE_BYTES) / 8;
    const BLOCK_BYTES: usize = STRIPE_BYTES * STRIPES_PER_BLOCK;
    /// Where the secret of the last stripe starts, counted back from the end.
    const LAST_STRIPE_SECRET_BACK: usize = STRIPE_BYTES + 7;

    type Stripe = [u8; STRIPE_BYTES];

    /// Lane `lane` (0 or 1: 32 bytes each) of a stripe, unaligned.
    #[target_feature(enable = "avx2")]
    fn lane_of(stripe: &Stripe, lane: usize) -> __m256i {
        let half: &[u8; 32] = stripe[32 * lane..32 * lane + 32]
            .try_into()
            .expect("a stripe is two lanes");
        // SAFETY: `half` is 32 readable bytes; the load has no alignment requirement.
        unsafe { _mm256_loadu_si256(half.as_ptr().cast()) }
    }

    /// The 64 bytes of secret that stripe `stripe` of a block is keyed with.
    fn stripe_key(secret: &[u8; SECRET_BYTES], at: usize) -> &Stripe {
        secret[at..at + STRIPE_BYTES]
            .try_into()
            .expect("stripe keys lie inside the secret")
    }

    /// One 64-byte stripe into the accumulators.
    #[target_feature(enable = "avx2")]
    fn accumulate(acc: &mut [__m256i; 2], stripe: &Stripe, key: &Stripe) {
        for (i, lane) in acc.iter_mut().enumerate() {
            let data = lane_of(stripe, i);
            let data_key = _mm256_xor_si256(data, lane_of(key, i));
            // (data_key & 0xffffffff) * (data_key >> 32) in each 64-bit word ...
            let product = _mm256_mul_epu32(data_key, _mm256_srli_epi64::<32>(data_key));
            // ... plus the data with the two words of each 128-bit half swapped.
            let swapped = _mm256_shuffle_epi32::<0b01_00_11_10>(data);
            *lane = _mm256_add_epi64(*lane, _mm256_add_epi64(product, swapped));
        }
    }

    /// After each block: acc = (acc ^ (acc >> 47) ^ key) * PRIME32_1.
    #[target_feature(enable = "avx2")]
    fn scramble(acc: &mut [__m256i; 2], key: &Stripe) {
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, lane) in acc.iter_mut().enumerate() {
            let mixed = _mm256_xor_si256(*lane, _mm256_srli_epi64::<47>(*lane));
            let keyed = _mm256_xor_si256(mixed, lane_of(key, i));
            let low = _mm256_mul_epu32(keyed, prime);
            let high = _mm256_mul_epu32(_mm256_srli_epi64::<32>(keyed), prime);
            *lane = _mm256_add_epi64(low, _mm256_slli_epi64::<32>(high));
        }
    }

    /// The long hash of `input` (more than 240 bytes) with `secret`.
    #[target_feature(enable = "avx2")]
    pub(super) fn long_hash(input: &[u8], secret: &[u8; SECRET_BYTES]) -> u64 {
        debug_assert!(input.len() > MID_SIZE_MAX);
        let i = [
            PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
        ]
        .map(|w| w as i64);
        let mut acc = [
            _mm256_setr_epi64x(i[0], i[1], i[2], i[3]),
            _mm256_setr_epi64x(i[4], i[5], i[6], i[7]),
        ];
        let keys: [&Stripe; STRIPES_PER_BLOCK] = std::array::from_fn(|s| stripe_key(secret, 8 * s));
        let scramble_key = stripe_key(secret, SECRET_BYTES - STRIPE_BYTES);
        // Whole blocks, but never the input's last byte: that belongs to the last block.
        let blocks = (input.len() - 1) / BLOCK_BYTES;
        let (whole, last) = input.split_at(blocks * BLOCK_BYTES);
        for block in whole.chunks_exact(BLOCK_BYTES) {
            let (stripes, _) = block.as_chunks::<STRIPE_BYTES>();
            for (stripe, key) in stripes.iter().zip(keys) {
                accumulate(&mut acc, stripe, key);
            }
            scramble(&mut acc, scramble_key);
        }
        // The last, partial block (never a stripe that holds the last byte), then the
        // input's last 64 bytes as a stripe of their own.
        let (stripes, _) = last[..last.len() - 1].as_chunks::<STRIPE_BYTES>();
        for (stripe, key) in stripes.iter().zip(keys) {
            accumulate(&mut acc, stripe, key);
        }
        let tail: &Stripe = input[input.len() - STRIPE_BYTES..]
            .try_into()
            .expect("the input is longer than a stripe");
        let last_key = stripe_key(secret, SECRET_BYTES - LAST_STRIPE_SECRET_BACK);
        accumulate(&mut acc, tail, last_key);
        let mut words = [0u64; 8];
        for (out, lane) in words.chunks_exact_mut(4).zip(acc) {
            let out: &mut [u64; 4] = out.try_into().expect("4 words");
            // SAFETY: `out` is 32 writable bytes; the store has no alignment requirement.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), lane) };
        }
        merge_accumulators(&words, secret, input.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_hash_as_the_crate_for_every_length_class_and_seed() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let mut lengths: Vec<usize> = (0..=300).collect();
        // Around the stripe (64) and block (1024) boundaries, record sizes, and big.
        for base in [1024usize, 2048, 4096, 4608, 8192, 65536] {
            lengths.extend(base - 65..=base + 65);
        }
        lengths.extend([69_999, 70_000]);
        for seed in [0u64, 1, 0x8a6a_1266_9945_1e2c, u64::MAX, 1 << 63] {
            for &len in &lengths {
                for start in [0usize, 5] {
                    let d = &data[start..start + len.min(data.len() - start)];
                    assert_eq!(
                        xxh3_64_with_seed(d, seed),
                        xxhash_rust::xxh3::xxh3_64_with_seed(d, seed),
                        "len {} seed {seed:#x} from {start}",
                        d.len()
                    );
                }
            }
        }
    }

    /// Seed 0 is the unseeded XXH3-64 (the read cache's block hash relies on it).
    #[test]
    fn seed_zero_is_the_unseeded_hash() {
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 253) as u8).collect();
        for len in [0, 16, 240, 241, 4096] {
            assert_eq!(
                xxh3_64_with_seed(&block[..len], 0),
                xxhash_rust::xxh3::xxh3_64(&block[..len])
            );
        }
    }

    #[test]
    fn the_seeded_secret_is_the_specifications() {
        assert_eq!(seeded_secret(0), DEFAULT_SECRET);
        let s = seeded_secret(7);
        assert_eq!(
            read_u64(&s, 0),
            read_u64(&DEFAULT_SECRET, 0).wrapping_add(7)
        );
        assert_eq!(
            read_u64(&s, 8),
            read_u64(&DEFAULT_SECRET, 8).wrapping_sub(7)
        );
    }
}
