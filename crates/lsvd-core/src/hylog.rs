//! HyLog's page-separating algorithm, for lsvd's GC: from the measured write-frequency
//! distribution ([`crate::heat`]) and the store's utilization, choose the proportion
//! of data to treat as hot so that the modelled write cost is smallest.
//!
//! Why: logging pays off for hot data and costs for cold data at high utilization
//! (HyLog, Wang and Hu). lsvd is a log throughout, so "separating" here means GC writes
//! relocated hot and cold data into separate GC objects: cold objects stay dense and
//! are rarely cleaned, hot ones empty quickly and are cleaned cheaply.
//!
//! The model (written out in `docs/sim/hylog.md`):
//! - A log partition at disk utilization `U` (live over stored bytes), cleaned oldest
//!   first under uniform writes, cleans segments at utilization `u` with
//!   `U = (u - 1) / ln u` (this relation reproduces HyLog's crossover table: u = 0.52,
//!   0.88, 0.94 give U = 0.73, 0.94, 0.97).
//! - Writing one segment of new data costs `2 / (1 - u)` segment I/Os (read `1/(1-u)`
//!   segments, write back their `u/(1-u)` live, write 1 new).
//! - Separated: hot data is a fraction `h` of the live bytes and takes a share `w(h)`
//!   of the writes (the hottest regions first); the free space is split, a share `f`
//!   to the hot partition. The cost is `w c(U_hot) + (1 - w) c(U_cold)` with
//!   `U_hot = h / (h + f F)`, `U_cold = (1 - h) / (1 - h + (1 - f) F)`, `F = 1/U - 1`.
//!   For each candidate `h` the best `f` is found (golden-section search); the best
//!   `h` wins if it beats not separating by [`MIN_MODEL_GAIN`], otherwise the hot
//!   fraction is 0 (no separation).

/// Separation must cut the modelled cost by at least this fraction to be used: the
/// model is coarse (uniform writes inside each class, oldest-first cleaning), and a
/// measured distribution of a uniform workload shows some sampling skew.
pub const MIN_MODEL_GAIN: f64 = 0.02;
/// At most this many hot fractions are evaluated (evenly spaced over the regions).
pub const MAX_CANDIDATES: usize = 100;
/// Utilizations are clamped below this (the cost is infinite at 1).
const MAX_UTILIZATION: f64 = 0.999;

/// Disk utilization of a log cleaned at segment utilization `u`: `(u - 1) / ln u`.
pub fn disk_utilization(cleaning_u: f64) -> f64 {
    if cleaning_u <= 0.0 {
        0.0
    } else if cleaning_u >= 1.0 {
        1.0
    } else {
        (cleaning_u - 1.0) / cleaning_u.ln()
    }
}

/// The segment utilization at cleaning for a log at disk utilization `disk_u` (the
/// inverse of [`disk_utilization`], by bisection).
pub fn cleaning_utilization(disk_u: f64) -> f64 {
    if disk_u.is_nan() || disk_u <= 0.0 {
        return 0.0;
    }
    if disk_u >= 1.0 {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if disk_utilization(mid) < disk_u {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Segment I/Os per segment of new data written to a log at disk utilization
/// `disk_u`: `2 / (1 - u)` with `u` its cleaning utilization.
pub fn write_cost(disk_u: f64) -> f64 {
    let u = cleaning_utilization(disk_u.clamp(0.0, MAX_UTILIZATION));
    2.0 / (1.0 - u).max(1e-9)
}

/// The modelled cost with hot data `hot_live` of the live bytes taking `hot_writes` of
/// the writes, at overall utilization `disk_u`, with the free space split at its best.
/// Returns (cost, the hot partition's share of the free space).
pub fn separated_cost(hot_live: f64, hot_writes: f64, disk_u: f64) -> (f64, f64) {
    let u = disk_u.clamp(1e-3, MAX_UTILIZATION);
    let h = hot_live.clamp(0.0, 1.0);
    let w = hot_writes.clamp(0.0, 1.0);
    if h <= 0.0 || h >= 1.0 {
        return (write_cost(u), h);
    }
    let free = 1.0 / u - 1.0;
    let cost = |f: f64| {
        let u_hot = h / (h + f * free);
        let u_cold = (1.0 - h) / (1.0 - h + (1.0 - f) * free);
        w * write_cost(u_hot) + (1.0 - w) * write_cost(u_cold)
    };
    // Golden-section search on f in (0, 1).
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (1e-6, 1.0 - 1e-6);
    let mut c = b - phi * (b - a);
    let mut d = a + phi * (b - a);
    let (mut fc, mut fd) = (cost(c), cost(d));
    for _ in 0..50 {
        if fc < fd {
            b = d;
            d = c;
            fd = fc;
            c = b - phi * (b - a);
            fc = cost(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + phi * (b - a);
            fd = cost(d);
        }
    }
    let f = 0.5 * (a + b);
    (cost(f), f)
}

/// What [`choose`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotChoice {
    /// Fraction of the written regions treated as hot (0: no separation).
    pub hot_fraction: f64,
    /// Their share of the (decayed) writes.
    pub hot_write_share: f64,
    /// The hot partition's share of the free space in the model.
    pub hot_space_share: f64,
    /// Modelled cost with this choice, and without separation.
    pub cost: f64,
    pub unseparated_cost: f64,
    /// A region is hot when its heat is at least this (`u32::MAX` when nothing is).
    pub hot_threshold: u32,
}

impl HotChoice {
    /// No separation: everything is cold.
    pub fn none(disk_u: f64) -> Self {
        let c = write_cost(disk_u);
        HotChoice {
            hot_fraction: 0.0,
            hot_write_share: 0.0,
            hot_space_share: 0.0,
            cost: c,
            unseparated_cost: c,
            hot_threshold: u32::MAX,
        }
    }

    pub fn separates(&self) -> bool {
        self.hot_fraction > 0.0
    }

    /// Is data in a region of this heat hot?
    pub fn is_hot(&self, heat: u32) -> bool {
        heat >= self.hot_threshold
    }
}

/// Choose the hot fraction for the heat distribution `histogram` ((heat, regions),
/// hottest first, as [`crate::heat::HeatTracker::distribution`] gives it; every
/// region is taken to hold the same live data) at store utilization `disk_u`. The
/// hot set is always a whole number of heat values (regions of equal heat are on the
/// same side), at most [`MAX_CANDIDATES`] of the boundaries are tried, evenly spread
/// over the regions.
pub fn choose(histogram: &[(u32, u64)], disk_u: f64) -> HotChoice {
    let mut best = HotChoice::none(disk_u);
    let n: u64 = histogram.iter().map(|&(_, c)| c).sum();
    let total: f64 = histogram.iter().map(|&(h, c)| h as f64 * c as f64).sum();
    if histogram.len() < 2 || n < 2 || total <= 0.0 {
        return best;
    }
    let step = (n / MAX_CANDIDATES as u64).max(1);
    let mut next_rank = 0u64;
    let (mut k, mut writes) = (0u64, 0.0f64);
    let mut found: Option<(f64, f64, f64, f64, u32)> = None; // (cost, h, w, f, threshold)
    for &(heat, count) in &histogram[..histogram.len() - 1] {
        k += count;
        writes += heat as f64 * count as f64;
        if k < next_rank {
            continue;
        }
        next_rank = k + step;
        let h = k as f64 / n as f64;
        let w = writes / total;
        let (cost, f) = separated_cost(h, w, disk_u);
        if found.is_none_or(|(c, ..)| cost < c) {
            found = Some((cost, h, w, f, heat));
        }
    }
    if let Some((cost, h, w, f, threshold)) = found
        && cost < best.unseparated_cost * (1.0 - MIN_MODEL_GAIN)
    {
        best.hot_fraction = h;
        best.hot_write_share = w;
        best.hot_space_share = f;
        best.cost = cost;
        best.hot_threshold = threshold.max(1);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_reproduces_hylogs_crossover_pairs() {
        // HyLog's table: cleaning utilization -> disk utilization at the crossover.
        for (u, disk) in [(0.52, 0.74), (0.88, 0.94), (0.94, 0.97)] {
            assert!((disk_utilization(u) - disk).abs() < 0.01, "u {u}");
            assert!((cleaning_utilization(disk) - u).abs() < 0.02, "U {disk}");
        }
        // The simple scenario: segments cleaned at 80% cost 10 segment I/Os.
        let disk = disk_utilization(0.8);
        assert!((write_cost(disk) - 10.0).abs() < 1e-6);
        assert_eq!(cleaning_utilization(0.0), 0.0);
        assert_eq!(cleaning_utilization(1.5), 1.0);
        assert_eq!(cleaning_utilization(f64::NAN), 0.0);
    }

    fn step(hot_regions: u64, cold_regions: u64, hot_heat: u32, cold_heat: u32) -> Vec<(u32, u64)> {
        vec![(hot_heat, hot_regions), (cold_heat, cold_regions)]
    }

    #[test]
    fn uniform_gains_nothing() {
        for u in [0.5, 0.7, 0.8, 0.9, 0.95] {
            let c = choose(&[(1000, 1024)], u);
            assert!(!c.separates(), "u {u}: {c:?}");
            assert!(!c.is_hot(1000) && !c.is_hot(u32::MAX - 1));
            // Any split of a uniform workload costs the same as none, at best.
            for h in [0.1, 0.3, 0.5] {
                let (cost, f) = separated_cost(h, h, u);
                assert!(
                    (cost / c.unseparated_cost - 1.0).abs() < 1e-6,
                    "u {u} h {h}"
                );
                assert!(
                    (f - h).abs() < 1e-3,
                    "space follows data: u {u} h {h} f {f}"
                );
            }
        }
    }

    #[test]
    fn ninety_ten_chooses_the_hot_tenth() {
        // 10% of the regions take 90% of the writes: heat 81 vs 1 per region.
        let heats = step(100, 900, 81, 1);
        for u in [0.7, 0.8, 0.85, 0.9] {
            let c = choose(&heats, u);
            assert!(c.separates(), "u {u}");
            assert!((c.hot_fraction - 0.10).abs() < 0.011, "u {u}: {c:?}");
            assert!((c.hot_write_share - 0.90).abs() < 0.01, "u {u}: {c:?}");
            assert!(c.cost < 0.8 * c.unseparated_cost, "u {u}: {c:?}");
            assert!(c.is_hot(81) && !c.is_hot(1));
        }
    }

    #[test]
    fn eighty_twenty_chooses_the_hot_fifth() {
        // 20% take 80%: heat 16 vs 1.
        let heats = step(200, 800, 16, 1);
        let c = choose(&heats, 0.8);
        assert!((c.hot_fraction - 0.20).abs() < 0.011, "{c:?}");
        assert!(c.is_hot(16) && !c.is_hot(1));
    }

    #[test]
    fn sampling_noise_of_a_uniform_workload_is_not_skew() {
        // Poisson-distributed counts with mean 11 (what the tracker's half-life gives
        // a uniform workload): no separation at the bands the experiments use.
        let mut hist = Vec::new();
        let mean = 11.0f64;
        let mut p = (-mean).exp();
        let mut pmf = vec![p];
        for x in 1..40 {
            p *= mean / x as f64;
            pmf.push(p);
        }
        for (x, p) in pmf.iter().enumerate().rev() {
            let regions = (p * 262_144.0).round() as u64;
            if regions > 0 && x > 0 {
                hist.push((x as u32, regions));
            }
        }
        for u in [0.7, 0.75, 0.8, 0.85, 0.9, 0.93] {
            let c = choose(&hist, u);
            assert!(!c.separates(), "u {u}: {c:?}");
        }
    }

    #[test]
    fn many_heat_values_are_sampled_not_all_tried() {
        // 10,000 distinct heats, a zipf-like 1/rank: a hot head is found.
        let hist: Vec<(u32, u64)> = (1..=10_000u32).map(|r| (1_000_000 / r, 1)).collect();
        let c = choose(&hist, 0.8);
        assert!(c.separates() && c.hot_fraction < 0.5, "{c:?}");
        assert!(c.hot_write_share > c.hot_fraction, "{c:?}");
    }

    #[test]
    fn degenerate_inputs_do_not_separate() {
        assert!(!choose(&[], 0.8).separates());
        assert!(!choose(&[(5, 1)], 0.8).separates());
        assert!(!choose(&[(5, 1000)], 0.8).separates());
        assert!(!choose(&[(0, 3), (0, 4)], 0.8).separates());
        // Utilization out of range is clamped, never a panic or NaN.
        for u in [-1.0, 0.0, 1.0, 2.0, f64::NAN] {
            let c = choose(&step(10, 90, 81, 1), u);
            assert!(!c.cost.is_nan(), "u {u}");
        }
    }
}
