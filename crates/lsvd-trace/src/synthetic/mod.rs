//! Synthetic workloads: reproducible request streams with a chosen access
//! pattern, for what the real traces don't cover (a given volume size,
//! skew or read/write mix, or long steady-state runs).
//!
//! Every request is one `io_size_bytes` block at an offset aligned to
//! `io_size_bytes`, inside the volume's `volume_size_bytes / io_size_bytes`
//! whole blocks (a partial block at the end is never touched). All requests
//! go to volume 0. Synthetic workloads are closed-loop, so `time_ns` is a
//! logical clock: request `i` (counting preconditioning writes) has
//! `time_ns = i`.
//!
//! With `precondition`, the stream starts with one sequential write of every
//! block (so reads hit written data and garbage collection starts from a
//! full volume), followed by the `requests` requests of the pattern.
//!
//! For `HotCold` and `Zipf`, the popular blocks are spread over the volume
//! by a seeded permutation (an affine map `rank → (a·rank + b) mod blocks`
//! with `a` coprime to the block count) rather than packed at its start,
//! so that hot data does not line up with the preconditioning order.

mod pattern;
pub mod prng;
pub mod zipf;

pub use pattern::Pattern;

use crate::{Error, Op, Request, Result};
use prng::Rng;
use zipf::Zipf;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticSpec {
    /// Which blocks are accessed.
    pub pattern: Pattern,
    /// Volume size in bytes; at least `io_size_bytes`.
    pub volume_size_bytes: u64,
    /// Size of every request in bytes; > 0.
    pub io_size_bytes: u64,
    /// Number of pattern requests (not counting preconditioning).
    pub requests: u64,
    /// Probability that a pattern request is a write, in `[0, 1]`.
    pub write_fraction: f64,
    /// Seed; the same spec gives the same stream.
    pub seed: u64,
    /// First write the whole volume sequentially.
    pub precondition: bool,
}

impl Default for SyntheticSpec {
    /// 1M uniform 4 KiB requests, 50 % writes, over 1 GiB, no
    /// preconditioning, seed 1.
    fn default() -> Self {
        SyntheticSpec {
            pattern: Pattern::Uniform,
            volume_size_bytes: 1 << 30,
            io_size_bytes: 4096,
            requests: 1_000_000,
            write_fraction: 0.5,
            seed: 1,
            precondition: false,
        }
    }
}

impl SyntheticSpec {
    /// Number of `io_size_bytes` blocks in the volume.
    pub fn blocks(&self) -> u64 {
        self.volume_size_bytes
            .checked_div(self.io_size_bytes)
            .unwrap_or(0)
    }

    /// Total requests the stream yields, preconditioning included.
    pub fn total_requests(&self) -> u64 {
        let pre = if self.precondition { self.blocks() } else { 0 };
        pre.saturating_add(self.requests)
    }

    /// Checks sizes, fractions and pattern parameters.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument(msg));
        if self.io_size_bytes == 0 {
            return bad("io size must be > 0".into());
        }
        if self.blocks() == 0 {
            return bad(format!(
                "volume size {} is smaller than the io size {}",
                self.volume_size_bytes, self.io_size_bytes
            ));
        }
        if !(0.0..=1.0).contains(&self.write_fraction) {
            return bad(format!(
                "write fraction {} is not in [0, 1]",
                self.write_fraction
            ));
        }
        self.pattern.validate()
    }
}

/// How the next block is chosen.
#[derive(Debug, Clone)]
enum Picker {
    Uniform,
    HotCold {
        hot_blocks: u64,
        hot_share: f64,
        perm: Affine,
    },
    Zipf {
        zipf: Zipf,
        perm: Affine,
    },
    Sequential {
        next: u64,
    },
}

/// A bijection of `0..n`: `x → (a·x + b) mod n` with `gcd(a, n) = 1`.
#[derive(Debug, Clone, Copy)]
struct Affine {
    a: u64,
    b: u64,
    n: u64,
}

impl Affine {
    fn new(n: u64, rng: &mut Rng) -> Self {
        let mut a = rng.below(n).max(1);
        while gcd(a, n) != 1 {
            a = a % n + 1;
        }
        Affine {
            a,
            b: rng.below(n),
            n,
        }
    }

    #[inline]
    fn map(self, x: u64) -> u64 {
        ((u128::from(self.a) * u128::from(x) + u128::from(self.b)) % u128::from(self.n)) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The request stream of a [`SyntheticSpec`]; see [`synthetic`].
#[derive(Debug, Clone)]
pub struct Synthetic {
    rng: Rng,
    picker: Picker,
    blocks: u64,
    io_size: u64,
    write_fraction: f64,
    /// Preconditioning writes still to issue, and the next block for them.
    precondition_left: u64,
    precondition_next: u64,
    /// Pattern requests still to issue.
    left: u64,
    /// Logical clock: index of the next request.
    clock: u64,
}

/// The request stream of `spec` (validated first).
pub fn synthetic(spec: SyntheticSpec) -> Result<Synthetic> {
    spec.validate()?;
    let blocks = spec.blocks();
    let mut rng = Rng::new(spec.seed);
    let picker = match spec.pattern {
        Pattern::Uniform => Picker::Uniform,
        Pattern::HotCold {
            hot_fraction,
            hot_share,
        } => Picker::HotCold {
            hot_blocks: ((blocks as f64 * hot_fraction).round() as u64).clamp(1, blocks),
            hot_share,
            perm: Affine::new(blocks, &mut rng),
        },
        Pattern::Zipf { theta } => Picker::Zipf {
            zipf: Zipf::new(blocks, theta).ok_or_else(|| {
                Error::InvalidArgument(format!("zipf theta {theta} must be finite and > 0"))
            })?,
            perm: Affine::new(blocks, &mut rng),
        },
        Pattern::Sequential => Picker::Sequential { next: 0 },
    };
    Ok(Synthetic {
        rng,
        picker,
        blocks,
        io_size: spec.io_size_bytes,
        write_fraction: spec.write_fraction,
        precondition_left: if spec.precondition { blocks } else { 0 },
        precondition_next: 0,
        left: spec.requests,
        clock: 0,
    })
}

impl Synthetic {
    fn pick_block(&mut self) -> u64 {
        let rng = &mut self.rng;
        match &mut self.picker {
            Picker::Uniform => rng.below(self.blocks),
            Picker::HotCold {
                hot_blocks,
                hot_share,
                perm,
            } => {
                let cold_blocks = self.blocks - *hot_blocks;
                let rank = if cold_blocks == 0 || rng.chance(*hot_share) {
                    rng.below(*hot_blocks)
                } else {
                    *hot_blocks + rng.below(cold_blocks)
                };
                perm.map(rank)
            }
            Picker::Zipf { zipf, perm } => perm.map(zipf.sample(rng) - 1),
            Picker::Sequential { next } => {
                let block = *next;
                *next = if block + 1 == self.blocks {
                    0
                } else {
                    block + 1
                };
                block
            }
        }
    }
}

impl Iterator for Synthetic {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        let (block, op) = if self.precondition_left > 0 {
            self.precondition_left -= 1;
            let block = self.precondition_next;
            self.precondition_next += 1;
            (block, Op::Write)
        } else if self.left > 0 {
            self.left -= 1;
            let block = self.pick_block();
            let op = if self.rng.chance(self.write_fraction) {
                Op::Write
            } else {
                Op::Read
            };
            (block, op)
        } else {
            return None;
        };
        let time_ns = self.clock;
        self.clock += 1;
        Some(Request {
            time_ns,
            volume: 0,
            op,
            offset_bytes: block * self.io_size,
            length_bytes: self.io_size,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.precondition_left.saturating_add(self.left);
        match usize::try_from(left) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl std::iter::FusedIterator for Synthetic {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_is_a_permutation() {
        let mut rng = Rng::new(3);
        for n in [1u64, 2, 12, 97, 1000, 4096] {
            let p = Affine::new(n, &mut rng);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.map(x) as usize;
                assert!(!seen[y]);
                seen[y] = true;
            }
        }
    }

    #[test]
    fn rejects_bad_specs() {
        let ok = SyntheticSpec::default();
        assert!(synthetic(ok).is_ok());
        for bad in [
            SyntheticSpec {
                io_size_bytes: 0,
                ..ok
            },
            SyntheticSpec {
                volume_size_bytes: 100,
                ..ok
            },
            SyntheticSpec {
                write_fraction: 1.5,
                ..ok
            },
            SyntheticSpec {
                pattern: Pattern::Zipf { theta: -1.0 },
                ..ok
            },
            SyntheticSpec {
                pattern: Pattern::HotCold {
                    hot_fraction: 0.0,
                    hot_share: 0.5,
                },
                ..ok
            },
        ] {
            assert!(synthetic(bad).is_err(), "{bad:?}");
        }
    }
}
