//! HyLog's page-separating algorithm, for lsvd's GC, generalized to up to
//! [`MAX_CLASSES`] heat classes: from the measured write-frequency distribution
//! ([`crate::heat`]) and the store's utilization, choose how to cut the data into
//! classes (hottest to coldest) so that the modelled write cost is smallest.
//!
//! Why: logging pays off for hot data and costs for cold data at high utilization
//! (HyLog, Wang and Hu). lsvd is a log throughout, so "separating" here means GC writes
//! relocated data of each class into GC objects of its own: cold objects stay dense and
//! are rarely cleaned, hot ones empty quickly and are cleaned cheaply. A skewed
//! workload with a smooth fall-off (zipf) has no single step between hot and cold;
//! more than two classes follow it more closely.
//!
//! The model (written out in `docs/sim/hylog.md`):
//! - A log partition at disk utilization `U` (live over stored bytes), cleaned oldest
//!   first under uniform writes, cleans segments at utilization `u` with
//!   `U = (u - 1) / ln u` (this relation reproduces HyLog's crossover table: u = 0.52,
//!   0.88, 0.94 give U = 0.73, 0.94, 0.97). Its free space per live byte is
//!   `s(u) = 1/U - 1 = ln u / (u - 1) - 1`.
//! - Writing one segment of new data costs `c = 2 / (1 - u)` segment I/Os (read
//!   `1/(1-u)` segments, write back their `u/(1-u)` live, write 1 new).
//! - Classes: class `i` holds a share `h_i` of the live bytes and takes a share `w_i`
//!   of the writes. The free space `F = 1/U - 1` (per live byte) is split between
//!   them: `sum h_i s(u_i) = F`. The cost is `sum w_i c(u_i)`. Its minimum over the
//!   split (Lagrange) has `q(u_i) = 1/u_i + ln u_i - 1` proportional to the class's
//!   write density `w_i / h_i`; one scalar (the proportionality factor) is found by
//!   bisection so that the free space adds up ([`classes_cost`]).
//! - The boundaries are chosen greedily ([`choose`]): starting from one class, each
//!   step adds the boundary (of at most [`MAX_CANDIDATES`]) that lowers the cost most,
//!   the free space re-split over all classes, and is kept only if it cuts the cost
//!   by [`MIN_MODEL_GAIN`]; at most [`MAX_CLASSES`] classes.

/// Each class added must cut the modelled cost by at least this fraction to be used:
/// the model is coarse (uniform writes inside each class, oldest-first cleaning), and a
/// measured distribution of a uniform workload shows some sampling skew.
pub const MIN_MODEL_GAIN: f64 = 0.02;
/// At most this many class boundaries are evaluated (evenly spaced over the regions).
pub const MAX_CANDIDATES: usize = 100;
/// At most this many heat classes (so at most this many partly filled GC objects per
/// pass).
pub const MAX_CLASSES: usize = 4;
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
    bisect(0.0, 1.0, 50, |u| disk_utilization(u) < disk_u)
}

/// Halve `lo..hi` `steps` times, keeping the part where `below` turns false (it is
/// true at `lo`'s side, false at `hi`'s); the midpoint of what is left.
fn bisect(mut lo: f64, mut hi: f64, steps: u32, below: impl Fn(f64) -> bool) -> f64 {
    for _ in 0..steps {
        let mid = 0.5 * (lo + hi);
        if below(mid) {
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

/// The cleaning utilization `u = e^t` of a class at the cost minimum, as `t = ln u`:
/// the root of `q = 1/u + ln u - 1 = a` (`a` is the class's write density times the
/// Lagrange factor). `q` is convex and falls from infinity to 0 on `t < 0`, so
/// Newton's method converges without overshooting from any `t` with `q >= a`:
/// `t = -sqrt(2a)` (as `e^x - 1 - x >= x^2/2`), or for `a >= 2` the closer
/// `t = -ln(1 + 2a)` (where `q = 2a - ln(1 + 2a) >= a`).
fn log_cleaning_u_at(a: f64) -> f64 {
    if a.is_nan() || a <= 0.0 {
        return 0.0;
    }
    if a == f64::INFINITY {
        return f64::NEG_INFINITY;
    }
    let mut t = if a >= 2.0 {
        -(2.0 * a).ln_1p()
    } else {
        -(2.0 * a).sqrt()
    };
    for _ in 0..200 {
        let em1 = (-t).exp_m1(); // e^-t - 1, precise near t = 0
        let q = em1 + t - a;
        let dq = -em1;
        if q <= 0.0 || dq >= 0.0 {
            break;
        }
        let next = t - q / dq;
        // Not below 0 (or NaN): t is as close as floating point gets.
        if next.is_nan() || next >= 0.0 || (next - t).abs() <= 1e-14 * t.abs() {
            t = next.min(t);
            break;
        }
        t = next;
    }
    t
}

/// Free space per live byte of a class cleaned at `u = e^t`: `ln u / (u - 1) - 1`.
fn free_per_live(t: f64) -> f64 {
    if t >= 0.0 {
        0.0
    } else if t == f64::NEG_INFINITY {
        f64::INFINITY
    } else {
        t / t.exp_m1() - 1.0
    }
}

/// The modelled cost of data cut into `classes`, each (share of the live bytes, share
/// of the writes), at overall disk utilization `disk_u`, with the free space split
/// between them at its best. Returns the cost (segment I/Os per segment written) and
/// each class's share of the free space, in the order given. The shares of live
/// bytes and of writes should each add up to 1 (they are not rescaled).
pub fn classes_cost(classes: &[(f64, f64)], disk_u: f64) -> (f64, Vec<f64>) {
    let u = if disk_u.is_nan() {
        MAX_UTILIZATION
    } else {
        disk_u.clamp(1e-3, MAX_UTILIZATION)
    };
    let free = 1.0 / u - 1.0;
    // Classes that hold data and take writes; the others get no free space (data
    // never written never needs cleaning) and cost nothing.
    let density = |&(h, w): &(f64, f64)| {
        if h > 0.0 && w > 0.0 && h.is_finite() && w.is_finite() {
            Some(w / h)
        } else {
            None
        }
    };
    let free_at = |ln_mu: f64| -> f64 {
        let mu = ln_mu.exp();
        classes
            .iter()
            .filter_map(|c| density(c).map(|d| c.0 * free_per_live(log_cleaning_u_at(mu * d))))
            .sum()
    };
    if !classes.iter().any(|c| density(c).is_some()) {
        return (write_cost(u), vec![0.0; classes.len()]);
    }
    // The factor `mu` (q(u_i) = mu w_i / h_i): more of it, lower utilizations, more
    // free space used. One class at density 1 has q(u) = mu: start there, widen the
    // bracket until it holds the free space available, then bisect.
    let t0 = cleaning_utilization(u).ln();
    let q0 = (-t0).exp_m1() + t0;
    let start = q0.max(1e-300).ln();
    let (mut lo, mut hi) = (start - 1.0, start + 1.0);
    for _ in 0..64 {
        if free_at(lo) <= free {
            break;
        }
        lo -= 4.0;
    }
    for _ in 0..64 {
        if free_at(hi) >= free {
            break;
        }
        hi += 4.0;
    }
    let mu = bisect(lo, hi, 48, |ln_mu| free_at(ln_mu) < free).exp();
    let mut cost = 0.0;
    let mut space = Vec::with_capacity(classes.len());
    for c in classes {
        match density(c) {
            Some(d) => {
                let t = log_cleaning_u_at(mu * d);
                // 2 / (1 - u), with 1 - u = -(e^t - 1).
                cost += c.1 * 2.0 / (-t.exp_m1()).max(1e-9);
                space.push(c.0 * free_per_live(t) / free);
            }
            None => space.push(0.0),
        }
    }
    (cost, space)
}

/// One heat class of a [`HotChoice`], as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassModel {
    /// Share of the written regions (of the live data, in the model) in the class.
    pub live_share: f64,
    /// Their share of the (decayed) writes.
    pub write_share: f64,
    /// The class's share of the free space in the model.
    pub space_share: f64,
    /// A region is in this class (or a hotter one) when its heat is at least this
    /// (0 for the coldest class).
    pub min_heat: u32,
}

/// What [`choose`] decided: the data cut into 1 to [`MAX_CLASSES`] heat classes,
/// numbered from 0, the coldest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotChoice {
    /// Fraction of the written regions in a class hotter than the coldest (0: no
    /// separation). With two classes, the hot class.
    pub hot_fraction: f64,
    /// Their share of the (decayed) writes.
    pub hot_write_share: f64,
    /// Their share of the free space in the model.
    pub hot_space_share: f64,
    /// Modelled cost with this choice, and without separation.
    pub cost: f64,
    pub unseparated_cost: f64,
    /// Number of classes (1: no separation).
    pub classes: usize,
    /// The classes, coldest first; entries from `classes` on are unused.
    pub class_models: [ClassModel; MAX_CLASSES],
}

impl HotChoice {
    /// No separation: everything is in one class.
    pub fn none(disk_u: f64) -> Self {
        let c = write_cost(disk_u);
        let mut class_models = [ClassModel::default(); MAX_CLASSES];
        class_models[0] = ClassModel {
            live_share: 1.0,
            write_share: 1.0,
            space_share: 1.0,
            min_heat: 0,
        };
        HotChoice {
            hot_fraction: 0.0,
            hot_write_share: 0.0,
            hot_space_share: 0.0,
            cost: c,
            unseparated_cost: c,
            classes: 1,
            class_models,
        }
    }

    pub fn separates(&self) -> bool {
        self.classes > 1
    }

    /// The classes in use, coldest first.
    pub fn class_models(&self) -> &[ClassModel] {
        &self.class_models[..self.classes.clamp(1, MAX_CLASSES)]
    }

    /// The class of data in a region of this heat: 0 (the coldest) to `classes - 1`.
    pub fn class_of(&self, heat: u32) -> usize {
        self.class_models()
            .iter()
            .skip(1)
            .take_while(|c| heat >= c.min_heat)
            .count()
    }
}

/// The heat class of every tracked region as one GC pass chose them. The pipeline
/// splits each client batch by it ([`crate::batcher::Batch::split_by_class`]) until
/// the next pass chooses again, so fresh writes of different heat start out in
/// different data objects, as GC's relocations do. One byte per region: at most
/// 1 MiB, a quarter of the tracker's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionClasses {
    region_sectors: u64,
    classes: Vec<u8>,
}

impl RegionClasses {
    /// The classes `choice` gives the regions `heat` tracks; `None` when it does not
    /// separate (batches then stay whole).
    pub fn new(choice: &HotChoice, heat: &crate::heat::HeatTracker) -> Option<Self> {
        if !choice.separates() {
            return None;
        }
        let classes = (0..heat.regions())
            .map(|r| choice.class_of(heat.heat(r)) as u8)
            .collect();
        Some(RegionClasses {
            region_sectors: (heat.region_bytes() / crate::format::SECTOR_BYTES).max(1),
            classes,
        })
    }

    /// The class of the region holding sector `lba`: 0, the coldest, for a region
    /// the table does not reach (not written when the pass chose).
    pub fn class_of(&self, lba: u64) -> u8 {
        usize::try_from(lba / self.region_sectors)
            .ok()
            .and_then(|r| self.classes.get(r))
            .copied()
            .unwrap_or(0)
    }

    /// Number of regions in the table.
    pub fn regions(&self) -> usize {
        self.classes.len()
    }

    /// A table given region by region: `classes[r]` for the sectors
    /// `[r * region_sectors, (r + 1) * region_sectors)` (tests that need a split
    /// without a workload that makes one).
    pub fn from_table(region_sectors: u64, classes: Vec<u8>) -> Self {
        RegionClasses {
            region_sectors: region_sectors.max(1),
            classes,
        }
    }
}

/// A candidate class boundary: the regions hotter than it are this share of all and
/// take this share of the writes; the lowest heat among them.
#[derive(Debug, Clone, Copy)]
struct Boundary {
    live: f64,
    writes: f64,
    heat: u32,
}

/// The (live, writes) shares of the classes cut at `bounds` (hottest first, as the
/// candidates are), hottest class first.
fn shares(bounds: &[Boundary]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(bounds.len() + 1);
    let (mut live, mut writes) = (0.0, 0.0);
    for b in bounds {
        out.push((b.live - live, b.writes - writes));
        (live, writes) = (b.live, b.writes);
    }
    out.push((1.0 - live, 1.0 - writes));
    out
}

/// Choose the heat classes for the heat distribution `histogram` ((heat, regions),
/// hottest first, as [`crate::heat::HeatTracker::distribution`] gives it; every
/// region is taken to hold the same live data) at store utilization `disk_u`.
///
/// Boundaries lie between distinct heat values (regions of equal heat are in the same
/// class); at most [`MAX_CANDIDATES`] of them are tried, evenly spread over the
/// regions. Greedy: from one class, each step adds the boundary that gives the lowest
/// cost with the free space re-split over all classes ([`classes_cost`]), as long as
/// it cuts the cost by [`MIN_MODEL_GAIN`] and there are fewer than [`MAX_CLASSES`].
/// Greedy rather than an exact search over all boundary sets: it evaluates at most
/// `(MAX_CLASSES - 1) * MAX_CANDIDATES` splits per GC pass, and on a step
/// distribution it finds the steps one by one (unit tests); a boundary added later
/// only refines a class, it never has to move an earlier one by much on the smooth
/// distributions measured.
pub fn choose(histogram: &[(u32, u64)], disk_u: f64) -> HotChoice {
    let mut best = HotChoice::none(disk_u);
    let n: u64 = histogram.iter().map(|&(_, c)| c).sum();
    let total: f64 = histogram.iter().map(|&(h, c)| h as f64 * c as f64).sum();
    if histogram.len() < 2 || n < 2 || total <= 0.0 || !total.is_finite() {
        return best;
    }
    let step = (n / MAX_CANDIDATES as u64).max(1);
    let mut candidates = Vec::new();
    let mut next_rank = 0u64;
    let (mut k, mut writes) = (0u64, 0.0f64);
    for &(heat, count) in &histogram[..histogram.len() - 1] {
        k += count;
        writes += heat as f64 * count as f64;
        if k < next_rank {
            continue;
        }
        next_rank = k + step;
        candidates.push(Boundary {
            live: k as f64 / n as f64,
            writes: writes / total,
            heat: heat.max(1),
        });
    }
    // Chosen boundaries, hottest first (candidates are in that order).
    let mut chosen: Vec<usize> = Vec::new();
    let mut cost = best.unseparated_cost;
    let mut space = vec![1.0];
    while chosen.len() + 1 < MAX_CLASSES {
        let mut step_best: Option<(f64, usize, Vec<f64>)> = None;
        for i in 0..candidates.len() {
            if chosen.contains(&i) {
                continue;
            }
            let mut bounds: Vec<usize> = chosen.clone();
            bounds.push(i);
            bounds.sort_unstable();
            let cut: Vec<Boundary> = bounds.iter().map(|&b| candidates[b]).collect();
            let (c, s) = classes_cost(&shares(&cut), disk_u);
            if step_best.as_ref().is_none_or(|(bc, ..)| c < *bc) {
                step_best = Some((c, i, s));
            }
        }
        match step_best {
            Some((c, i, s)) if c < cost * (1.0 - MIN_MODEL_GAIN) => {
                chosen.push(i);
                chosen.sort_unstable();
                cost = c;
                space = s;
            }
            _ => break,
        }
    }
    if chosen.is_empty() {
        return best;
    }
    let cut: Vec<Boundary> = chosen.iter().map(|&b| candidates[b]).collect();
    let classes = shares(&cut);
    best.classes = classes.len();
    // Coldest first: reverse the hottest-first order.
    for (j, ((live, writes), s)) in classes.iter().zip(&space).rev().enumerate() {
        best.class_models[j] = ClassModel {
            live_share: *live,
            write_share: *writes,
            space_share: *s,
            // Class j > 0 starts at the boundary above the class below it.
            min_heat: if j == 0 { 0 } else { cut[cut.len() - j].heat },
        };
    }
    // The coldest class is everything below the last (lowest) boundary.
    let lowest = cut[cut.len() - 1];
    best.hot_fraction = lowest.live;
    best.hot_write_share = lowest.writes;
    best.hot_space_share = 1.0 - best.class_models[0].space_share;
    best.cost = cost;
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The modelled cost with hot data `hot_live` of the live bytes taking `hot_writes` of
    /// the writes, at overall utilization `disk_u`, with the free space split at its best
    /// (two classes of [`classes_cost`]). Returns (cost, the hot partition's share of the
    /// free space).
    fn separated_cost(hot_live: f64, hot_writes: f64, disk_u: f64) -> (f64, f64) {
        let h = hot_live.clamp(0.0, 1.0);
        let w = hot_writes.clamp(0.0, 1.0);
        if h <= 0.0 || h >= 1.0 {
            return (write_cost(disk_u.clamp(0.0, MAX_UTILIZATION)), h);
        }
        let (cost, space) = classes_cost(&[(h, w), (1.0 - h, 1.0 - w)], disk_u);
        (cost, space.first().copied().unwrap_or(0.0))
    }

    /// Is data in a region of this heat in any class but the coldest?
    fn is_hot(c: &HotChoice, heat: u32) -> bool {
        c.class_of(heat) > 0
    }

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
            assert!(!is_hot(&c, 1000) && !is_hot(&c, u32::MAX - 1));
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
            assert!(is_hot(&c, 81) && !is_hot(&c, 1));
        }
    }

    /// Steps of (regions, heat), hottest first, each step spread over three heats
    /// (-1%, 0, +1%) so that a boundary inside a step is possible but useless.
    fn noisy_steps(steps: &[(u64, u32)]) -> Vec<(u32, u64)> {
        let mut hist = Vec::new();
        for &(regions, heat) in steps {
            let d = (heat / 100).max(1);
            let third = regions / 3;
            hist.push((heat + d, third));
            hist.push((heat, regions - 2 * third));
            hist.push((heat - d, third));
        }
        hist
    }

    #[test]
    fn ninety_ten_with_noise_gets_two_classes() {
        // 10% of the regions take 90% of the writes (heat 810 vs 10, +-1% inside each
        // step): two classes, the hot tenth and the rest, at every band.
        let heats = noisy_steps(&[(300, 810), (2700, 10)]);
        for u in [0.7, 0.8, 0.85, 0.9] {
            let c = choose(&heats, u);
            assert_eq!(c.classes, 2, "u {u}: {c:?}");
            assert!((c.hot_fraction - 0.10).abs() < 1e-9, "u {u}: {c:?}");
            assert!((c.hot_write_share - 0.90).abs() < 0.001, "u {u}: {c:?}");
            for heat in [802, 810, 818] {
                assert_eq!(c.class_of(heat), 1, "u {u} heat {heat}");
            }
            for heat in [9, 10, 11] {
                assert_eq!(c.class_of(heat), 0, "u {u} heat {heat}");
            }
        }
    }

    #[test]
    fn three_steps_get_three_classes() {
        // 5% of the regions at heat 400, 20% at 40, 75% at 1 (70%, 28% and 2.6% of the
        // writes): each step its own class.
        let heats = noisy_steps(&[(150, 400), (600, 40), (2250, 3)]);
        for u in [0.7, 0.8, 0.85, 0.9] {
            let c = choose(&heats, u);
            assert_eq!(c.classes, 3, "u {u}: {c:?}");
            let live: Vec<f64> = c.class_models().iter().map(|m| m.live_share).collect();
            for (got, want) in live.iter().zip([0.75, 0.20, 0.05]) {
                assert!((got - want).abs() < 1e-9, "u {u}: {live:?}");
            }
            assert!((c.hot_fraction - 0.25).abs() < 1e-9, "u {u}: {c:?}");
            for (heat, class) in [
                (404, 2),
                (396, 2),
                (40, 1),
                (41, 1),
                (39, 1),
                (3, 0),
                (4, 0),
            ] {
                assert_eq!(c.class_of(heat), class, "u {u} heat {heat}");
            }
            // Hotter classes get more free space per live byte, and each class
            // beyond the first pays for itself.
            let m = c.class_models();
            let per_live = |i: usize| m[i].space_share / m[i].live_share;
            assert!(
                per_live(2) > per_live(1) && per_live(1) > per_live(0),
                "{m:?}"
            );
            let (two, _) = separated_cost(0.25, m[1].write_share + m[2].write_share, u);
            assert!(
                c.cost < two * (1.0 - MIN_MODEL_GAIN),
                "u {u}: {} vs {two}",
                c.cost
            );
        }
    }

    #[test]
    fn the_free_space_split_is_the_best_one() {
        // Three classes; compare with a brute-force search over the split of the free
        // space (the shares of the two hotter classes on a grid of 0.002).
        let classes = [(0.05, 0.7), (0.2, 0.28), (0.75, 0.02)];
        for disk_u in [0.7, 0.8, 0.9] {
            let (cost, space) = classes_cost(&classes, disk_u);
            assert!((space.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{space:?}");
            let free = 1.0 / disk_u - 1.0;
            let class_cost = |(h, w): (f64, f64), f: f64| w * write_cost(h / (h + f * free));
            let mut brute = f64::INFINITY;
            for i in 1..500 {
                for j in 1..(500 - i) {
                    let (a, b) = (i as f64 / 500.0, j as f64 / 500.0);
                    let c = class_cost(classes[0], a)
                        + class_cost(classes[1], b)
                        + class_cost(classes[2], 1.0 - a - b);
                    brute = brute.min(c);
                }
            }
            assert!(
                cost <= brute * (1.0 + 1e-6),
                "u {disk_u}: {cost} vs {brute}"
            );
            assert!(cost > brute * 0.99, "u {disk_u}: {cost} vs {brute}");
        }
    }

    #[test]
    fn no_more_than_max_classes() {
        // Six steps, each four times hotter than the next: the model would like six
        // classes, it gets MAX_CLASSES, and each class is a whole number of steps.
        let steps: Vec<(u64, u32)> = (0..6).map(|i| (300, 4u32.pow(6 - i))).collect();
        let c = choose(&noisy_steps(&steps), 0.85);
        assert_eq!(c.classes, MAX_CLASSES, "{c:?}");
        for m in c.class_models() {
            let steps = m.live_share * 6.0;
            assert!((steps - steps.round()).abs() < 1e-9, "{m:?}");
        }
        let mut last = 0;
        for m in &c.class_models()[1..] {
            assert!(m.min_heat > last, "{c:?}");
            last = m.min_heat;
        }
    }

    #[test]
    fn eighty_twenty_chooses_the_hot_fifth() {
        // 20% take 80%: heat 16 vs 1.
        let heats = step(200, 800, 16, 1);
        let c = choose(&heats, 0.8);
        assert!((c.hot_fraction - 0.20).abs() < 0.011, "{c:?}");
        assert!(is_hot(&c, 16) && !is_hot(&c, 1));
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
        // A smooth fall-off has no single step: more than two classes pay.
        assert!(c.classes >= 3, "{c:?}");
    }

    #[test]
    fn random_distributions_give_consistent_choices() {
        // Seeded pseudo-random histograms (sorted or not, heats up to u32::MAX):
        // never a panic, the cost never above not separating, classes ordered by heat.
        let mut next = crate::test_rng::xorshift64(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let len = (next() % 300) as usize;
            let mut hist: Vec<(u32, u64)> = (0..len)
                .map(|_| {
                    let heat = match next() % 3 {
                        0 => (next() % 16) as u32,
                        1 => (next() % 10_000) as u32,
                        _ => next() as u32,
                    };
                    (heat, next() % 5000 + 1)
                })
                .collect();
            if round % 2 == 0 {
                hist.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
            }
            let u = (next() % 1000) as f64 / 1000.0;
            let c = choose(&hist, u);
            assert!(c.cost.is_finite() && c.cost <= c.unseparated_cost, "{c:?}");
            assert!((1..=MAX_CLASSES).contains(&c.classes), "{c:?}");
            let live: f64 = c.class_models().iter().map(|m| m.live_share).sum();
            assert!((live - 1.0).abs() < 1e-9, "{c:?}");
            if round % 2 == 0 {
                let mut last = 0;
                for &(heat, _) in hist.iter().rev() {
                    let class = c.class_of(heat);
                    assert!(class >= last && class < c.classes, "{c:?}");
                    last = class;
                }
            }
        }
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
