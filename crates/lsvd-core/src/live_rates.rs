//! How fast each object's live data is being overwritten: the hylog policy's victim
//! order.
//!
//! LFS's cost-benefit order ranks an object by `(1 - u) * age / (1 + u)`: the age of
//! its data stands for how long the space freed by copying that data out stays free.
//! Under hylog the write-frequency tracker ([`crate::heat`]) measures that directly:
//! the mean heat of the regions an object's live data is in is the rate at which that
//! data is being overwritten, and `1 / rate` its expected remaining life. hylog ranks
//! victims by `(1 - u) / (1 + u) * rate^-`[`RATE_EXPONENT`] while it separates
//! (`docs/sim/hylog.md`, "Victims").
//!
//! Why not the age: on looped real traces (MSR hm_0, rw_20_80, rw_40_60) data is
//! overwritten in the order it was written, so the oldest objects are the ones about
//! to empty by themselves and cost-benefit copies data that dies next; there greedy
//! wins by 4-19%. The rate does not prefer old objects: data written once per loop
//! has the same rate in every object, and the order among them is greedy's. On the
//! synthetic hot/cold workloads cold data has a low rate wherever it is, and is
//! cleaned denser than hot data, as with cost-benefit.
//!
//! Why an exponent below 1: with the rate itself (exponent 1) a cold object at 90%
//! live ranks above a hot one at 50% on 80/20 (rates 1:16), far too eager to copy
//! cold data; the measured WAF was 7-10% worse than cost-benefit by age. Measured
//! exponents 0.2-0.8 (hylog.md): 0.3 keeps the synthetic gains and meets the trace
//! goal.

use std::collections::BTreeMap;

use crate::format::SECTOR_BYTES;
use crate::heat::HeatTracker;
use crate::store_state::StoreState;

/// The power of the write rate in hylog's victim score (see the module docs).
pub const RATE_EXPONENT: f64 = 0.3;

/// The write rate of each object's live data, accumulated over ranges of the volume
/// ([`add_range`](Self::add_range), so the engine can let go of its state lock
/// between slices) or over the whole map at once ([`add_all`](Self::add_all)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveWriteRates {
    /// Object sequence -> (sum over live sectors of their region's heat, live sectors).
    sums: BTreeMap<u64, (f64, u64)>,
}

impl LiveWriteRates {
    /// Add the live extents within `[lba, lba + sectors)`. An extent crossing an edge
    /// is counted for the part inside.
    pub fn add_range(&mut self, state: &StoreState, tracker: &HeatTracker, lba: u64, sectors: u64) {
        state.map().for_each_in(lba, sectors, |p| {
            if let Some(loc) = p.location {
                self.add(tracker, loc.object_seq, p.lba, p.sectors);
            }
        });
    }

    /// Add every live extent.
    pub fn add_all(&mut self, state: &StoreState, tracker: &HeatTracker) {
        for p in state.map().iter() {
            self.add(tracker, p.location.object_seq, p.lba, p.sectors);
        }
    }

    fn add(&mut self, tracker: &HeatTracker, seq: u64, lba: u64, sectors: u64) {
        let region_sectors = (tracker.region_bytes() / SECTOR_BYTES).max(1);
        let e = self.sums.entry(seq).or_insert((0.0, 0));
        let end = lba.saturating_add(sectors);
        let mut lba = lba;
        while lba < end {
            let run = (region_sectors - lba % region_sectors).min(end - lba);
            // A live region was written at least once: never a rate of 0.
            e.0 += f64::from(tracker.heat_at(lba).max(1)) * run as f64;
            e.1 += run;
            lba += run;
        }
    }

    /// The mean heat of `seq`'s live sectors (None: no live data seen).
    pub fn rate(&self, seq: u64) -> Option<f64> {
        self.sums
            .get(&seq)
            .filter(|(_, n)| *n > 0)
            .map(|(sum, n)| sum / *n as f64)
    }

    /// The stand-in for the age in cost-benefit's score: `rate^-RATE_EXPONENT`, 1 for
    /// an object with no live data seen.
    pub fn expected_life(&self, seq: u64) -> f64 {
        self.rate(seq)
            .map_or(1.0, |r| r.max(1.0).powf(-RATE_EXPONENT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::object::{ObjectExtent, ObjectHeader, ObjectKind, header_without_data};
    use crate::gc::{GcConfig, GcPolicy, select_victims, select_victims_by_rate};
    use crate::pipeline::{Pipeline, PipelineConfig};

    fn data(seq: u64, lba: u64, sectors: u32) -> ObjectHeader {
        let e = vec![ObjectExtent {
            lba,
            sectors,
            source: None,
        }];
        header_without_data(ObjectKind::Data, seq, seq, e, Vec::new())
    }

    /// Objects 1 (older) and 2 (newer), each half live (400 of 800 sectors): object
    /// 1's live half in regions written 16 times, object 2's in regions written once.
    fn hot_old_cold_new() -> (StoreState, HeatTracker) {
        let mut s = StoreState::new(1 << 30);
        s.apply(&data(1, 0, 800)).expect("apply");
        s.apply(&data(2, 1000, 800)).expect("apply");
        s.apply(&data(3, 0, 400)).expect("apply");
        s.apply(&data(4, 1000, 400)).expect("apply");
        let mut t = HeatTracker::new(Some(1 << 30));
        for _ in 0..16 {
            t.record_write(400, 400);
        }
        t.record_write(1400, 400);
        (s, t)
    }

    #[test]
    fn a_rate_is_the_mean_heat_of_the_live_sectors_however_it_is_summed() {
        let (s, t) = hot_old_cold_new();
        let mut all = LiveWriteRates::default();
        all.add_all(&s, &t);
        // 4 KiB regions, each sector counted once per write: a region written 16
        // times holds 128, once 8.
        assert_eq!(all.rate(1), Some(128.0));
        assert_eq!(all.rate(2), Some(8.0));
        assert_eq!(all.rate(4), Some(1.0), "heat 0 (not recorded) counts as 1");
        assert_eq!(all.rate(9), None);
        // In slices that cut extents (and regions), the same.
        let mut sliced = LiveWriteRates::default();
        let mut lba = 0;
        while lba < 4000 {
            sliced.add_range(&s, &t, lba, 300);
            lba += 300;
        }
        assert_eq!(sliced, all);
        assert!(all.expected_life(1) < all.expected_life(2));
        assert_eq!(all.expected_life(9), 1.0);
    }

    #[test]
    fn rates_put_cold_live_data_first_where_age_puts_the_older_object_first() {
        let (s, t) = hot_old_cold_new();
        let mut rates = LiveWriteRates::default();
        rates.add_all(&s, &t);
        let cfg = GcConfig {
            policy: GcPolicy::CostBenefit,
            pass_bytes: 400 * 512,
            ..GcConfig::default()
        };
        // The same utilization: by age the older object goes first, by rate the one
        // whose live data is cold (the hot one is emptying by itself).
        assert_eq!(select_victims(&s, &cfg, 5, |_| false), vec![1]);
        assert_eq!(
            select_victims_by_rate(&s, &cfg, 5, |_| false, Some(&rates)),
            vec![2]
        );
        // Greedy ignores the rates (equal utilization: the lower sequence).
        let greedy = GcConfig {
            policy: GcPolicy::Greedy,
            ..cfg
        };
        assert_eq!(
            select_victims_by_rate(&s, &greedy, 5, |_| false, Some(&rates)),
            vec![1]
        );
    }

    fn pipeline(policy: GcPolicy) -> Pipeline<(), ObjectHeader> {
        let (s, _) = hot_old_cold_new();
        let cfg = PipelineConfig {
            batch_size_bytes: 64 << 10,
            batch_timeout_ns: None,
            checkpoint_every_objects: 4,
            checkpoint_interval_ns: None,
            uploads_in_flight: 3,
            gc: GcConfig {
                start_utilization: 0.9,
                stop_utilization: 0.95,
                policy,
                pass_bytes: 400 * 512,
                defrag_hole_bytes: 0,
            },
            gc_max_backlog: 2,
            gc_headroom_bytes: 0,
        };
        Pipeline::new(cfg, s, 0)
    }

    #[test]
    fn the_pipeline_ranks_hylog_victims_by_rate_only_while_it_separates() {
        let (s, t) = hot_old_cold_new();
        let mut rates = LiveWriteRates::default();
        rates.add_all(&s, &t);
        let victims = |p: &mut Pipeline<(), ObjectHeader>| {
            p.gc_plan_with_rates(Some(&rates))
                .expect("utilization 0.33 is below 0.9")
                .victims
                .into_iter()
                .collect::<Vec<_>>()
        };
        let mut p = pipeline(GcPolicy::HyLog);
        p.set_gc_separating(true);
        assert!(p.gc_wants_write_rates());
        assert_eq!(victims(&mut p), vec![2], "separating: by rate");
        assert!(!p.gc_wants_write_rates(), "a pass is in progress");
        let mut p = pipeline(GcPolicy::HyLog);
        assert!(!p.gc_wants_write_rates());
        assert_eq!(victims(&mut p), vec![1], "not separating: greedy");
        let mut p = pipeline(GcPolicy::CostBenefit);
        p.set_gc_separating(true);
        assert!(!p.gc_wants_write_rates());
        assert_eq!(victims(&mut p), vec![1], "cost-benefit keeps the age");
    }
}
