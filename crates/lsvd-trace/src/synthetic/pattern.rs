//! The access patterns of synthetic workloads and their CLI spelling
//! (`uniform`, `hotcold:0.2:0.8`, `zipf:0.99`, `sequential`).

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// Which blocks a synthetic workload accesses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    /// Every block equally likely.
    Uniform,
    /// A `hot_fraction` of the blocks receives a `hot_share` of the
    /// accesses, uniformly within the hot and the cold set
    /// (`hotcold:0.2:0.8` is the 80/20 rule).
    HotCold {
        /// Fraction of the blocks that is hot, in `(0, 1)`.
        hot_fraction: f64,
        /// Fraction of the accesses that go to hot blocks, in `[0, 1]`.
        hot_share: f64,
    },
    /// The `k`-th most popular block has probability ∝ `k^-theta`.
    Zipf {
        /// Skew, finite and > 0 (0.99 is the YCSB default).
        theta: f64,
    },
    /// Blocks in order, wrapping to block 0 after the last one.
    Sequential,
}

impl Pattern {
    /// Checks the parameters' ranges.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Pattern::HotCold {
                hot_fraction,
                hot_share,
            } => {
                if !(hot_fraction > 0.0 && hot_fraction < 1.0) {
                    return Err(Error::InvalidArgument(format!(
                        "hot fraction {hot_fraction} is not in (0, 1)"
                    )));
                }
                if !(0.0..=1.0).contains(&hot_share) {
                    return Err(Error::InvalidArgument(format!(
                        "hot share {hot_share} is not in [0, 1]"
                    )));
                }
            }
            Pattern::Zipf { theta } => {
                if !(theta.is_finite() && theta > 0.0) {
                    return Err(Error::InvalidArgument(format!(
                        "zipf theta {theta} must be finite and > 0"
                    )));
                }
            }
            Pattern::Uniform | Pattern::Sequential => {}
        }
        Ok(())
    }
}

impl FromStr for Pattern {
    type Err = Error;

    /// `uniform`, `sequential` (or `seq`), `hotcold[:FRACTION:SHARE]`
    /// (default `0.2:0.8`), `zipf[:THETA]` (default `0.99`).
    fn from_str(s: &str) -> Result<Self> {
        let mut parts = s.split(':');
        let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: Vec<&str> = parts.collect();
        let num = |p: &str| {
            p.trim().parse::<f64>().map_err(|_| {
                Error::InvalidArgument(format!("pattern {s:?}: {p:?} is not a number"))
            })
        };
        let pattern = match (kind.as_str(), params.as_slice()) {
            ("uniform", []) => Pattern::Uniform,
            ("sequential" | "seq", []) => Pattern::Sequential,
            ("hotcold", []) => Pattern::HotCold {
                hot_fraction: 0.2,
                hot_share: 0.8,
            },
            ("hotcold", [fraction, share]) => Pattern::HotCold {
                hot_fraction: num(fraction)?,
                hot_share: num(share)?,
            },
            ("zipf", []) => Pattern::Zipf { theta: 0.99 },
            ("zipf", [theta]) => Pattern::Zipf { theta: num(theta)? },
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown pattern {s:?}; expected uniform, sequential, \
                     hotcold:FRACTION:SHARE or zipf:THETA"
                )));
            }
        };
        pattern.validate()?;
        Ok(pattern)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Uniform => f.write_str("uniform"),
            Pattern::HotCold {
                hot_fraction,
                hot_share,
            } => write!(f, "hotcold:{hot_fraction}:{hot_share}"),
            Pattern::Zipf { theta } => write!(f, "zipf:{theta}"),
            Pattern::Sequential => f.write_str("sequential"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        let cases = [
            ("uniform", Pattern::Uniform),
            ("sequential", Pattern::Sequential),
            (
                "hotcold:0.2:0.8",
                Pattern::HotCold {
                    hot_fraction: 0.2,
                    hot_share: 0.8,
                },
            ),
            ("zipf:0.99", Pattern::Zipf { theta: 0.99 }),
            ("zipf:1.2", Pattern::Zipf { theta: 1.2 }),
        ];
        for (text, want) in cases {
            let got: Pattern = text.parse().expect("valid pattern");
            assert_eq!(got, want);
            assert_eq!(got.to_string(), text);
        }
        assert_eq!("seq".parse::<Pattern>().ok(), Some(Pattern::Sequential));
        assert_eq!(
            "zipf".parse::<Pattern>().ok(),
            Some(Pattern::Zipf { theta: 0.99 })
        );
        for bad in [
            "",
            "nope",
            "zipf:x",
            "zipf:0",
            "hotcold:0.2",
            "hotcold:1.0:0.5",
            "hotcold:0.2:1.5",
            "uniform:1",
        ] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad}");
        }
    }
}
