//! Write-frequency tracking: how hot each region of the volume is.
//!
//! The `hylog` GC policy (see [`crate::hylog`] and `docs/sim/hylog.md`) separates the
//! data GC relocates by how often it is written, so it needs a measured write
//! frequency per region. This module keeps one decayed counter per region: every
//! client write adds the sectors it covers in each region it touches, and every
//! `half_life_bytes` of client writes all counters are halved. The decay is driven by
//! bytes written, not by a clock, so the simulator and the engine, fed the same
//! writes, hold the same counters.
//!
//! Granularity: regions are 4 KiB (a block) by default. Coarser regions average hot
//! and cold blocks together: with hot 4 KiB blocks scattered over the volume (the
//! synthetic workloads of `lsvd sim` do that, and so do many databases), 1 MiB
//! regions all look alike and nothing can be separated.
//!
//! Memory: one `u32` per region, so **1 MiB per GiB of volume** at 4 KiB regions, and
//! never more than `max_regions` counters (default 2^20 = **4 MiB**, reached at a 4 GiB
//! volume): a larger volume gets larger regions (the next power of two that fits, so
//! 256 KiB regions for 1 TiB, still 4 MiB of counters), and with no volume size known
//! the tracker grows as writes arrive and doubles its region size (merging
//! neighbours) whenever a write lands beyond the cap.
//!
//! Half-life: [`HALF_LIFE_SPANS`] times the tracked span (regions × region size, at
//! least [`MIN_HALF_LIFE_BYTES`]). A decayed count then holds about 11 writes' worth
//! of a block written at the average rate, so the sampling noise of a uniform workload
//! (relative spread about 1/sqrt(11) = 0.3) is not mistaken for skew.
//!
//! A counter is 0 for a region never written and at least 1 for one ever written (the
//! decay stops at 1), so cold data that was written once stays distinguishable from
//! space that holds nothing.

/// Default region size: 4 KiB.
pub const DEFAULT_REGION_BYTES: u64 = 4096;
/// Default cap on the number of regions (4 MiB of counters).
pub const DEFAULT_MAX_REGIONS: usize = 1 << 20;
/// The decay half-life is this many times the tracked span (regions × region size)...
pub const HALF_LIFE_SPANS: u64 = 8;
/// ...but at least this.
pub const MIN_HALF_LIFE_BYTES: u64 = 64 << 20;

use crate::format::checkpoint::CheckpointHeat;

const SECTOR_SHIFT: u32 = 9;
/// Region sizes stop doubling here (2^62 bytes); far beyond any LBA a u64 of sectors
/// can address in bytes.
const MAX_REGION_SHIFT: u32 = 62;

/// Decayed write counts per region (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeatTracker {
    /// log2 of the region size in bytes.
    region_shift: u32,
    max_regions: usize,
    /// Regions covering the volume when its size is known (the vector grows up to
    /// this); `None`: grow as writes arrive, up to `max_regions`.
    fixed_regions: Option<usize>,
    /// Decayed sectors written per region.
    counts: Vec<u32>,
    /// Halve every this many bytes written; `None`: [`HALF_LIFE_SPANS`] times the
    /// tracked span (at least [`MIN_HALF_LIFE_BYTES`]).
    half_life_bytes: Option<u64>,
    since_decay_bytes: u64,
    decays: u64,
}

impl Default for HeatTracker {
    fn default() -> Self {
        HeatTracker::new(None)
    }
}

impl HeatTracker {
    /// A tracker for a volume of `volume_size_bytes` (`None` or 0: unknown, grow as
    /// needed) with 4 KiB regions, [`DEFAULT_MAX_REGIONS`] and the default half-life.
    pub fn new(volume_size_bytes: Option<u64>) -> Self {
        HeatTracker::with_limits(
            volume_size_bytes,
            DEFAULT_REGION_BYTES,
            DEFAULT_MAX_REGIONS,
            None,
        )
    }

    /// A tracker with explicit limits. `region_bytes` is rounded up to a power of two
    /// of at least one sector; `max_regions` is at least 1; `half_life_bytes` of
    /// `None` (or 0) means [`HALF_LIFE_SPANS`] times the tracked span.
    pub fn with_limits(
        volume_size_bytes: Option<u64>,
        region_bytes: u64,
        max_regions: usize,
        half_life_bytes: Option<u64>,
    ) -> Self {
        let max_regions = max_regions.max(1);
        let mut region_shift = region_bytes
            .max(1 << SECTOR_SHIFT)
            .next_power_of_two()
            .trailing_zeros()
            .min(MAX_REGION_SHIFT);
        let size = volume_size_bytes.filter(|&s| s > 0);
        let fixed_regions = size.map(|s| {
            while region_shift < MAX_REGION_SHIFT
                && s.div_ceil(1u64 << region_shift) > max_regions as u64
            {
                region_shift += 1;
            }
            s.div_ceil(1u64 << region_shift).max(1) as usize
        });
        HeatTracker {
            region_shift,
            max_regions,
            fixed_regions,
            counts: Vec::new(),
            half_life_bytes: half_life_bytes.filter(|&h| h > 0),
            since_decay_bytes: 0,
            decays: 0,
        }
    }

    pub fn region_bytes(&self) -> u64 {
        1u64 << self.region_shift
    }

    /// Regions tracked so far (the highest written, plus one).
    pub fn regions(&self) -> usize {
        self.counts.len()
    }

    /// Bytes of counters held now, and the most the tracker will ever hold.
    pub fn memory_bytes(&self) -> (usize, usize) {
        let cap = self.fixed_regions.unwrap_or(self.max_regions);
        (self.counts.len() * size_of::<u32>(), cap * size_of::<u32>())
    }

    /// How many times the counters were halved.
    pub fn decays(&self) -> u64 {
        self.decays
    }

    /// The half-life in bytes written now.
    pub fn half_life_bytes(&self) -> u64 {
        self.half_life_bytes.unwrap_or_else(|| {
            (self.counts.len() as u64)
                .saturating_mul(1u64 << self.region_shift)
                .saturating_mul(HALF_LIFE_SPANS)
                .max(MIN_HALF_LIFE_BYTES)
        })
    }

    /// The region holding sector `lba`.
    pub fn region_of(&self, lba: u64) -> usize {
        let shift = self.region_shift - SECTOR_SHIFT;
        (lba >> shift).min(usize::MAX as u64) as usize
    }

    /// The decayed count of `region` (0: never written).
    pub fn heat(&self, region: usize) -> u32 {
        self.counts.get(region).copied().unwrap_or(0)
    }

    /// The heat of the region holding sector `lba`.
    pub fn heat_at(&self, lba: u64) -> u32 {
        self.heat(self.region_of(lba))
    }

    /// Merge neighbouring regions in pairs: the region size doubles.
    fn coarsen(&mut self) {
        let merged: Vec<u32> = self
            .counts
            .chunks(2)
            .map(|c| c.iter().fold(0u32, |a, &b| a.saturating_add(b)))
            .collect();
        self.counts = merged;
        self.region_shift += 1;
    }

    /// A client write of `sectors` at sector `lba`.
    pub fn record_write(&mut self, lba: u64, sectors: u64) {
        if sectors == 0 {
            return;
        }
        let last = lba.saturating_add(sectors - 1);
        let cap = self.fixed_regions.unwrap_or(self.max_regions);
        // Unknown size: make the last sector's region fit under the cap.
        while self.fixed_regions.is_none()
            && self.region_shift < MAX_REGION_SHIFT
            && self.region_of(last) >= cap
        {
            self.coarsen();
        }
        let first_region = self.region_of(lba);
        let last_region = self.region_of(last).min(cap - 1);
        if first_region > last_region {
            // Beyond a fixed volume size: nothing to track.
            return;
        }
        if self.counts.len() <= last_region {
            self.counts.resize(last_region + 1, 0);
        }
        let region_sectors = 1u64 << (self.region_shift - SECTOR_SHIFT);
        for region in first_region..=last_region {
            let start = (region as u64).saturating_mul(region_sectors).max(lba);
            let end = ((region as u64 + 1).saturating_mul(region_sectors)).min(last + 1);
            let n = end.saturating_sub(start).clamp(1, u32::MAX as u64) as u32;
            let c = &mut self.counts[region];
            *c = c.saturating_add(n);
        }
        self.since_decay_bytes = self
            .since_decay_bytes
            .saturating_add(sectors.saturating_mul(1 << SECTOR_SHIFT));
        let half_life = self.half_life_bytes();
        let due = self.since_decay_bytes / half_life;
        self.since_decay_bytes %= half_life;
        // After 32 halvings every counter is at its floor: no need to go on.
        for _ in 0..due.min(32) {
            self.decay();
        }
    }

    /// Halve every counter (a written region keeps at least 1).
    pub fn decay(&mut self) {
        for c in &mut self.counts {
            if *c > 1 {
                *c >>= 1;
            }
        }
        self.decays += 1;
    }

    /// Written regions, hottest first: (region, heat), ties by region.
    pub fn ranked(&self) -> Vec<(usize, u32)> {
        let mut v: Vec<(usize, u32)> = self
            .counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(i, &c)| (i, c))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// The heats of written regions, hottest first.
    pub fn sorted_heats(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.counts.iter().copied().filter(|&c| c > 0).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }

    /// The tracker's state as a checkpoint carries it.
    pub fn to_checkpoint(&self) -> CheckpointHeat {
        CheckpointHeat {
            since_decay_bytes: self.since_decay_bytes,
            decays: self.decays,
            region_shift: self.region_shift as u8,
            counts: self.counts.clone(),
        }
    }

    /// Bytes the tracker adds to a checkpoint payload now.
    pub fn checkpoint_bytes(&self) -> u64 {
        crate::format::checkpoint::heat_section_bytes(&self.counts)
    }

    /// Take over the counters a checkpoint carried, if they fit this tracker: the
    /// same region size (for a tracker that grows, at least its own, as coarsening
    /// only ever doubles it) and no more regions than it may hold. On a mismatch
    /// (another volume size, other limits) the tracker is left as it was and the
    /// reason returned: starting from zero costs only some separation until writes
    /// have built a distribution again.
    pub fn restore(&mut self, saved: &CheckpointHeat) -> Result<(), String> {
        let shift = u32::from(saved.region_shift);
        let shift_fits = match self.fixed_regions {
            Some(_) => shift == self.region_shift,
            None => (self.region_shift..=MAX_REGION_SHIFT).contains(&shift),
        };
        if !shift_fits {
            return Err(format!(
                "saved regions are 2^{shift} bytes, this tracker's 2^{}",
                self.region_shift
            ));
        }
        let cap = self.fixed_regions.unwrap_or(self.max_regions);
        if saved.counts.len() > cap {
            return Err(format!(
                "{} saved regions, this tracker holds at most {cap}",
                saved.counts.len()
            ));
        }
        self.region_shift = shift;
        self.counts.clone_from(&saved.counts);
        self.since_decay_bytes = saved.since_decay_bytes;
        self.decays = saved.decays;
        Ok(())
    }

    /// The distribution the cost model reads ([`crate::hylog::choose`]): (heat,
    /// written regions with that heat), hottest first.
    pub fn distribution(&self) -> Vec<(u32, u64)> {
        histogram(&self.sorted_heats())
    }
}

/// Run-length histogram of heats sorted hottest first: (heat, count).
pub fn histogram(sorted_heats: &[u32]) -> Vec<(u32, u64)> {
    sorted_heats
        .chunk_by(|a, b| a == b)
        .map(|run| (run[0], run.len() as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB_SECTORS: u64 = 2048;

    #[test]
    fn counts_split_across_regions_and_decay_by_halving() {
        let mut t = HeatTracker::with_limits(Some(64 << 20), 1 << 20, 1 << 20, Some(8 << 20));
        // 1 MiB straddling regions 0 and 1: half in each.
        t.record_write(MIB_SECTORS / 2, MIB_SECTORS);
        assert_eq!((t.heat(0), t.heat(1), t.heat(2)), (1024, 1024, 0));
        assert_eq!(t.decays(), 0);
        // 7 MiB more into region 5: the 8 MiB half-life passes once.
        for _ in 0..7 {
            t.record_write(5 * MIB_SECTORS, MIB_SECTORS);
        }
        assert_eq!(t.decays(), 1);
        assert_eq!((t.heat(0), t.heat(1), t.heat(5)), (512, 512, 7 * 1024));
        // The floor: a written region never decays to 0.
        for _ in 0..20 {
            t.decay();
        }
        assert_eq!((t.heat(0), t.heat(5), t.heat(6)), (1, 1, 0));
        assert_eq!(t.heat_at(5 * MIB_SECTORS + 3), 1);
    }

    #[test]
    fn a_huge_write_decays_a_bounded_number_of_times() {
        let mut t = HeatTracker::with_limits(Some(1 << 40), 1 << 20, 1 << 20, Some(1 << 20));
        t.record_write(0, (1u64 << 40) / 512);
        assert_eq!(t.decays(), 32);
        assert_eq!(t.heat(0), 1);
        assert_eq!(t.regions(), 1 << 20);
    }

    #[test]
    fn memory_is_bounded_by_volume_size_or_cap() {
        // 1 GiB volume: 2^18 regions of 4 KiB, 1 MiB of counters at most.
        let mut t = HeatTracker::new(Some(1 << 30));
        assert_eq!(t.region_bytes(), 4096);
        assert_eq!(t.memory_bytes().1, 1 << 20);
        t.record_write(0, (1 << 30) / 512);
        assert_eq!(t.memory_bytes(), (1 << 20, 1 << 20));
        // Writes beyond a fixed size are ignored, not tracked.
        t.record_write((1 << 30) / 512, 8);
        assert_eq!(t.regions(), 1 << 18);
        // The default cap: 4 MiB of counters whatever the size.
        for size in [1u64 << 32, 1 << 40, 1 << 50] {
            assert_eq!(HeatTracker::new(Some(size)).memory_bytes().1, 4 << 20);
        }
        assert_eq!(HeatTracker::new(Some(1 << 40)).region_bytes(), 1 << 20);
        assert_eq!(HeatTracker::new(None).memory_bytes().1, 4 << 20);

        // A volume too big for the cap gets larger regions.
        let t = HeatTracker::with_limits(Some(1 << 40), 1 << 20, 1024, None);
        assert_eq!(t.region_bytes(), 1 << 30);
        assert_eq!(t.memory_bytes().1, 4096);

        // Unknown size: regions double as writes land further out, never more than
        // the cap, and counts are merged, not lost.
        let mut t = HeatTracker::with_limits(None, 1 << 20, 16, None);
        t.record_write(0, 8);
        t.record_write(MIB_SECTORS, 8);
        t.record_write(100 * MIB_SECTORS, 8);
        assert!(t.regions() <= 16);
        assert_eq!(t.region_bytes(), 8 << 20);
        assert_eq!(t.heat(0), 16);
        assert_eq!(t.heat_at(100 * MIB_SECTORS), 8);
        t.record_write(u64::MAX / 1024, 8);
        assert!(t.regions() <= 16);
        assert_eq!(t.memory_bytes().1, 64);
        t.record_write(u64::MAX - 4, 8);
        assert!(t.regions() <= 16);
    }

    #[test]
    fn ranking_is_hottest_first_with_ties_by_region() {
        let mut t = HeatTracker::with_limits(Some(16 << 20), 1 << 20, 1 << 20, None);
        for (region, times) in [(3u64, 5), (1, 9), (7, 5), (0, 1)] {
            for _ in 0..times {
                t.record_write(region * MIB_SECTORS, 8);
            }
        }
        assert_eq!(t.ranked(), vec![(1, 72), (3, 40), (7, 40), (0, 8)]);
        assert_eq!(t.sorted_heats(), vec![72, 40, 40, 8]);
        assert_eq!(t.distribution(), vec![(72, 1), (40, 2), (8, 1)]);
    }

    #[test]
    fn a_saved_tracker_restores_exactly_and_a_mismatched_one_is_refused() {
        let mut t = HeatTracker::new(Some(64 << 20));
        for i in 0..5000u64 {
            t.record_write((i * 7919) % (64 * MIB_SECTORS), 8);
        }
        let saved = t.to_checkpoint();
        let mut fresh = HeatTracker::new(Some(64 << 20));
        fresh.restore(&saved).expect("same volume size");
        assert_eq!(fresh, t);
        // After restoring, both go on identically.
        t.record_write(0, 8);
        fresh.record_write(0, 8);
        assert_eq!(fresh, t);

        // A 1 TiB volume has 1 MiB regions: 4 KiB counters do not fit.
        let mut big = HeatTracker::new(Some(1 << 40));
        let before = big.clone();
        let err = big.restore(&saved).expect_err("other region size");
        assert!(err.contains("2^12"), "{err}");
        assert_eq!(big, before);
        // More regions than a small volume holds.
        let mut small = HeatTracker::new(Some(1 << 20));
        assert!(
            small
                .restore(&saved)
                .expect_err("too many")
                .contains("at most 256")
        );
        // A growing tracker takes coarser regions than its own, never finer.
        let mut growing = HeatTracker::new(None);
        let coarse = CheckpointHeat {
            region_shift: 16,
            ..saved.clone()
        };
        growing.restore(&coarse).expect("coarser is fine");
        assert_eq!(growing.region_bytes(), 1 << 16);
        let mut growing = HeatTracker::with_limits(None, 1 << 16, 1 << 20, None);
        assert!(growing.restore(&saved).is_err());
    }

    #[test]
    fn the_span_sets_the_half_life() {
        let mut t = HeatTracker::new(None);
        assert_eq!(t.half_life_bytes(), MIN_HALF_LIFE_BYTES);
        t.record_write(255 * MIB_SECTORS, 8);
        assert_eq!(t.half_life_bytes(), 8 * (255 << 20) + 8 * 4096);
    }
}
