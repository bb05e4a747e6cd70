//! Zipf-distributed ranks in O(1) per sample, for volumes of any size.
//!
//! A CDF table over every block of a large volume would cost gigabytes, so
//! this uses rejection-inversion sampling (W. Hörmann and G. Derflinger,
//! "Rejection-inversion to generate variates from monotone discrete
//! distributions", ACM TOMACS 6(3), 1996): constant setup, and on average
//! barely more than one uniform variate per sample, for any exponent > 0.

use super::prng::Rng;

/// Samples `k` in `1..=n` with probability proportional to `k^-theta`.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipf {
    /// A sampler over `1..=n`; needs `n >= 1` and a finite `theta > 0`.
    pub fn new(n: u64, theta: f64) -> Option<Self> {
        if n == 0 || !theta.is_finite() || theta <= 0.0 {
            return None;
        }
        let mut z = Zipf {
            n: n as f64,
            theta,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Some(z)
    }

    /// One rank in `1..=n`; rank 1 is the most likely.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            // Uniform in (h_integral_x1, h_integral_n].
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// `h(x) = x^-theta`.
    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    /// An antiderivative of `h`: `(x^(1-theta) - 1) / (1 - theta)`, or
    /// `ln x` at `theta = 1`, computed stably near 1.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.theta) * log_x) * log_x
    }

    /// The inverse of [`Zipf::h_integral`].
    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.theta)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, stable near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, stable near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampled frequencies match the exact pmf within a few standard
    /// deviations, for exponents below, at and above 1.
    #[test]
    fn matches_exact_pmf() {
        for theta in [0.5, 0.99, 1.0, 1.5] {
            let n = 50u64;
            let z = Zipf::new(n, theta).expect("valid parameters");
            let mut rng = Rng::new(7);
            let draws = 200_000u32;
            let mut counts = vec![0u32; n as usize + 1];
            for _ in 0..draws {
                let k = z.sample(&mut rng);
                assert!((1..=n).contains(&k));
                counts[k as usize] += 1;
            }
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-theta)).sum();
            for k in 1..=n {
                let p = (k as f64).powf(-theta) / norm;
                let expect = p * f64::from(draws);
                let sd = (expect * (1.0 - p)).sqrt();
                let got = f64::from(counts[k as usize]);
                assert!(
                    (got - expect).abs() < 5.0 * sd + 1.0,
                    "theta {theta} k {k}: got {got}, expected {expect:.0}"
                );
            }
        }
    }

    #[test]
    fn huge_n_is_cheap_and_in_range() {
        let z = Zipf::new(1 << 40, 0.99).expect("valid parameters");
        let mut rng = Rng::new(1);
        let ones = (0..10_000)
            .map(|_| z.sample(&mut rng))
            .inspect(|&k| assert!((1..=1u64 << 40).contains(&k)))
            .filter(|&k| k == 1)
            .count();
        assert!(ones > 100, "rank 1 drawn {ones} times");
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Zipf::new(0, 1.0).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        let one = Zipf::new(1, 2.0).expect("valid parameters");
        let mut rng = Rng::new(5);
        assert!((0..100).all(|_| one.sample(&mut rng) == 1));
    }
}
