//! Garbage-collection planning: when to collect, which objects, and what to move.
//!
//! GC runs with hysteresis: it starts when the store's utilization (live bytes over
//! stored bytes) falls below `start_utilization` and keeps going until it rises above
//! `stop_utilization`. Each pass picks victims by policy, up to a budget of live bytes
//! to copy, and lists their live extents in LBA order (from the victims' headers:
//! [`crate::gc_plan`]). Relocated data goes into GC
//! objects of its own (never mixed with fresh client writes: cold data stays with cold
//! data), and each relocated extent carries its source so it applies only where the
//! map still points there. The live engine and the simulator both use this module.
//!
//! The `hylog` policy also separates what GC moves by how hot it is (see
//! [`crate::hylog`], `docs/sim/hylog.md`): the model cuts the data into up to
//! [`crate::hylog::MAX_CLASSES`] heat classes by the write-frequency tracker's counts
//! ([`crate::heat`]), and relocated data of each class goes into GC objects of its own
//! ([`split_by_heat`], [`group_relocations_by_class`]), so data of different classes
//! never shares a GC object.

use std::collections::BTreeSet;

use crate::format::SECTOR_BYTES;
use crate::format::object::{ExtentSource, ObjectExtent, ObjectHeader, ObjectKind};
use crate::heat::HeatTracker;
use crate::hylog::HotChoice;
use crate::live_rates::LiveWriteRates;
use crate::store_state::{ObjLoc, StoreState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcPolicy {
    /// Least live data first: cheapest to clean now.
    Greedy,
    /// LFS cost-benefit: (1 - u) * age / (1 + u), highest first. Prefers old, cold
    /// objects that will stay clean once compacted.
    CostBenefit,
    /// HyLog: each pass cuts the data into heat classes (up to
    /// [`crate::hylog::MAX_CLASSES`]) so that, by the measured write frequencies and
    /// the utilization, the modelled write cost is smallest, and writes relocated data
    /// of each class into GC objects of its own. Victims are taken like
    /// cost-benefit while hot and cold are separated, with the live data's measured
    /// write rate in place of the object's age ([`crate::live_rates`]: cold data is
    /// cleaned dense, hot data left to empty), like greedy when the model finds
    /// nothing to separate (a uniform workload).
    HyLog,
}

impl std::str::FromStr for GcPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "greedy" => Ok(GcPolicy::Greedy),
            "cost-benefit" | "costbenefit" => Ok(GcPolicy::CostBenefit),
            "hylog" => Ok(GcPolicy::HyLog),
            _ => Err(format!(
                "unknown GC policy '{s}' (use greedy, cost-benefit or hylog)"
            )),
        }
    }
}

impl std::fmt::Display for GcPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
            GcPolicy::HyLog => "hylog",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcConfig {
    /// Start collecting below this utilization. Default 0.70. 0 disables GC.
    pub start_utilization: f64,
    /// Stop collecting above this utilization. Default 0.75.
    pub stop_utilization: f64,
    pub policy: GcPolicy,
    /// Live bytes copied per pass, at most (at least one victim is always taken).
    /// Default 32 MiB.
    pub pass_bytes: u64,
    /// Defragmenting GC: a gap of at most this many bytes between two extents a pass
    /// relocates is relocated with them where it is wholly mapped
    /// ([`crate::gc_plan::plug_holes`]), joining the three into one map extent (the
    /// LSVD paper plugs gaps of 8 KiB). Default 0, off: on small random writes it
    /// moves 8-14% more bytes for 9-39% fewer extents (docs/seeds.md).
    pub defrag_hole_bytes: u64,
}

/// The bytes one GC pass moves at most, for batches of `batch_size_bytes`: four
/// batches, and at least 32 MiB (the engine's and `lsvd serve`'s default).
pub fn pass_bytes_for_batch(batch_size_bytes: u64) -> u64 {
    batch_size_bytes.saturating_mul(4).max(32 << 20)
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            start_utilization: 0.70,
            stop_utilization: 0.75,
            policy: GcPolicy::Greedy,
            pass_bytes: pass_bytes_for_batch(0),
            defrag_hole_bytes: 0,
        }
    }
}

impl GcPolicy {
    /// Does this policy separate hot from cold data (and so need a
    /// [`HeatTracker`] fed with every client write)?
    pub fn tracks_heat(&self) -> bool {
        matches!(self, GcPolicy::HyLog)
    }

    /// The victim order to use now: hylog orders like cost-benefit while it separates
    /// hot from cold data (given write rates, [`select_victims_by_rate`], by rate
    /// rather than age) and like greedy otherwise; the others are their own order.
    pub fn victim_order(&self, separating: bool) -> GcPolicy {
        match self {
            GcPolicy::HyLog if separating => GcPolicy::CostBenefit,
            GcPolicy::HyLog => GcPolicy::Greedy,
            p => *p,
        }
    }
}

impl GcConfig {
    pub fn validate(&self) -> Result<(), String> {
        let ok = (0.0..1.0).contains(&self.start_utilization)
            && self.stop_utilization > self.start_utilization
            && self.stop_utilization <= 1.0;
        if !ok && self.start_utilization != 0.0 {
            return Err(format!(
                "GC thresholds must satisfy 0 <= start < stop <= 1 (got start {} stop {})",
                self.start_utilization, self.stop_utilization
            ));
        }
        if self.pass_bytes == 0 {
            return Err("GC pass size must be positive".into());
        }
        Ok(())
    }

    pub fn enabled(&self) -> bool {
        self.start_utilization > 0.0
    }
}

/// Live bytes over stored bytes of the objects the volume owns (1.0 for an empty
/// store): a clone's GC weighs only its own objects, never the ancestors' it shares
/// ([`StoreState::set_shared_below`]), which it can neither collect nor free.
pub fn utilization(state: &StoreState) -> f64 {
    let stored = state.owned_stored_bytes();
    if stored == 0 {
        1.0
    } else {
        state.owned_live_bytes() as f64 / stored as f64
    }
}

/// Should a pass run now? `active` says whether the previous pass was part of an
/// ongoing collection (hysteresis).
pub fn should_collect(state: &StoreState, cfg: &GcConfig, active: bool) -> bool {
    if !cfg.enabled() {
        return false;
    }
    let u = utilization(state);
    if active {
        u < cfg.stop_utilization
    } else {
        u < cfg.start_utilization
    }
}

/// Back-pressure on client objects: may a client object of `object_bytes` go to the
/// store now, with `pending_bytes` of data and GC objects already on their way (queued,
/// uploading, or uploaded but not yet applied)?
///
/// Yes while the store would stay within `live / start_utilization + slack_bytes` (the
/// engine passes one batch). GC starts once the store passes `live / start`, so client
/// objects wait only when GC has fallen behind; with a pass of at most one batch the
/// store then never holds more than live/start plus two batches. Always yes with GC
/// disabled, and when nothing is pending and the store is within live/start (GC would
/// not run, so waiting could never end).
pub fn client_object_fits(
    state: &StoreState,
    cfg: &GcConfig,
    pending_bytes: u64,
    object_bytes: u64,
    slack_bytes: u64,
) -> bool {
    if !cfg.enabled() {
        return true;
    }
    // A clone's own objects only: GC cannot shrink the ancestors' it shares.
    let limit = state.owned_live_bytes() as f64 / cfg.start_utilization;
    let stored = state.owned_stored_bytes() as f64;
    if pending_bytes == 0 && stored <= limit {
        return true;
    }
    stored + (pending_bytes + object_bytes) as f64 <= limit + slack_bytes as f64
}

/// How much of its headroom the store has used, from 0 (within `live /
/// start_utilization + slack_bytes`, where [`client_object_fits`] needs no headroom)
/// to 1 (`headroom_bytes` past that: client objects wait for GC). The live engine
/// paces GC by it, so that a burst of client writes spends the headroom before GC
/// takes the CPU and the disk from them at full pace, and GC catches up once clients
/// are idle or the headroom runs short. Always 1 without headroom (GC runs at full pace
/// whenever it runs) and 0 with GC disabled.
pub fn headroom_used(
    state: &StoreState,
    cfg: &GcConfig,
    pending_bytes: u64,
    slack_bytes: u64,
    headroom_bytes: u64,
) -> f64 {
    if !cfg.enabled() {
        return 0.0;
    }
    if headroom_bytes == 0 {
        return 1.0;
    }
    let bound = state.owned_live_bytes() as f64 / cfg.start_utilization + slack_bytes as f64;
    let over = state.owned_stored_bytes() as f64 + pending_bytes as f64 - bound;
    (over / headroom_bytes as f64).clamp(0.0, 1.0)
}

/// Choose victims for one pass. `now_seq` is the next object sequence number (the
/// clock for ages); objects for which `busy` is true are skipped, and so are the
/// objects another volume owns ([`StoreState::is_shared`]: a clone's ancestors'),
/// whose data a clone shares rather than copies.
pub fn select_victims(
    state: &StoreState,
    cfg: &GcConfig,
    now_seq: u64,
    busy: impl Fn(u64) -> bool,
) -> Vec<u64> {
    select_victims_by_rate(state, cfg, now_seq, busy, None)
}

/// [`select_victims`]; with `rates` the cost-benefit order takes each object's
/// expected life by its live data's write rate
/// ([`LiveWriteRates::expected_life`]) in place of its age (hylog while it
/// separates). Greedy ignores `rates`.
pub fn select_victims_by_rate(
    state: &StoreState,
    cfg: &GcConfig,
    now_seq: u64,
    busy: impl Fn(u64) -> bool,
    rates: Option<&LiveWriteRates>,
) -> Vec<u64> {
    let mut candidates: Vec<(f64, u64, u64)> = Vec::new(); // (sort key, seq, live)
    let mut empty = Vec::new();
    for (&seq, o) in state.owned_objects() {
        if busy(seq)
            || state.applying_seq() == Some(seq)
            || o.live_bytes >= o.total_bytes.saturating_sub(o.header_bytes as u64)
        {
            continue;
        }
        if o.live_bytes == 0 {
            empty.push(seq);
            continue;
        }
        let data = o.total_bytes.max(1) as f64;
        let u = o.live_bytes as f64 / data;
        let key = match cfg.policy {
            // Callers resolve hylog with `victim_order`; unresolved it is greedy.
            GcPolicy::Greedy | GcPolicy::HyLog => u,
            GcPolicy::CostBenefit => {
                let age = match rates {
                    Some(r) => r.expected_life(seq),
                    None => now_seq.saturating_sub(seq).max(1) as f64,
                };
                -((1.0 - u) * age / (1.0 + u))
            }
        };
        candidates.push((key, seq, o.live_bytes));
    }
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut victims = empty;
    let mut budget = 0u64;
    for (_, seq, live) in candidates {
        if budget > 0 && budget + live > cfg.pass_bytes {
            break;
        }
        budget += live;
        victims.push(seq);
    }
    victims
}

/// A live extent to copy out of a victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relocation {
    pub lba: u64,
    pub sectors: u64,
    pub source: ObjLoc,
}

/// Live extents of `victims`, in LBA order, by a scan of the whole map: the reference
/// that [`crate::gc_plan`], which the engine and the simulator plan passes with, is
/// checked against.
pub fn live_extents(state: &StoreState, victims: &BTreeSet<u64>) -> Vec<Relocation> {
    state
        .map()
        .iter()
        .filter(|p| victims.contains(&p.location.object_seq))
        .map(|p| Relocation {
            lba: p.lba,
            sectors: p.sectors,
            source: p.location,
        })
        .collect()
}

/// Split relocations into GC objects of at most `object_bytes` of data each (an
/// extent is split if needed). Each group becomes one GC object.
pub fn group_relocations(relocations: &[Relocation], object_bytes: u64) -> Vec<Vec<Relocation>> {
    let max_sectors = (object_bytes / SECTOR_BYTES).max(8);
    let mut groups = Vec::new();
    let mut current = Vec::new();
    let mut current_sectors = 0u64;
    for r in relocations {
        let mut r = *r;
        while r.sectors > 0 {
            let room = max_sectors - current_sectors;
            let take = r.sectors.min(room).min(u32::MAX as u64 & !7);
            current.push(Relocation {
                lba: r.lba,
                sectors: take,
                source: r.source,
            });
            current_sectors += take;
            r = Relocation {
                lba: r.lba + take,
                sectors: r.sectors - take,
                source: r.source.advance_sectors(take),
            };
            if current_sectors >= max_sectors {
                groups.push(std::mem::take(&mut current));
                current_sectors = 0;
            }
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// Which GC objects a relocated extent goes into under hylog: its heat class, from
/// 0, the coldest (everything, when nothing is separated), to the hottest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeatClass(pub u8);

impl HeatClass {
    /// The coldest class: all data when the model does not separate.
    pub const COLDEST: HeatClass = HeatClass(0);

    /// Is this any class but the coldest (counted as "hot" in metrics)?
    pub fn is_hot(self) -> bool {
        self.0 > 0
    }
}

/// Split relocations by heat class (the class of the region each sector is in, per
/// `choice`): one list per class, coldest first (`choice.classes` lists). An extent
/// crossing regions of different classes is cut where the class changes (its source
/// advanced); otherwise it stays whole. Order is kept within each class.
pub fn split_by_heat(
    relocations: &[Relocation],
    tracker: &HeatTracker,
    choice: &HotChoice,
) -> Vec<Vec<Relocation>> {
    let classes = choice.class_models().len();
    let mut out = vec![Vec::new(); classes];
    if !choice.separates() {
        out[0] = relocations.to_vec();
        return out;
    }
    let class_at = |lba: u64| choice.class_of(tracker.heat_at(lba)).min(classes - 1);
    let region_sectors = (tracker.region_bytes() / SECTOR_BYTES).max(1);
    for r in relocations {
        let mut r = *r;
        while r.sectors > 0 {
            let class = class_at(r.lba);
            // Extend the run over following regions of the same class.
            let mut run = (region_sectors - r.lba % region_sectors).min(r.sectors);
            while run < r.sectors && class_at(r.lba + run) == class {
                run = (run + region_sectors).min(r.sectors);
            }
            out[class].push(Relocation {
                lba: r.lba,
                sectors: run,
                source: r.source,
            });
            r = Relocation {
                lba: r.lba + run,
                sectors: r.sectors - run,
                source: r.source.advance_sectors(run),
            };
        }
    }
    out
}

/// [`group_relocations`] per class: data of different classes never shares a GC
/// object. Each group is one GC object, labelled with its class, coldest class first.
/// With no tracker or a choice that does not separate, everything is in the coldest
/// class, grouped exactly as [`group_relocations`] would.
pub fn group_relocations_by_class(
    relocations: &[Relocation],
    object_bytes: u64,
    heat: Option<(&HeatTracker, &HotChoice)>,
) -> Vec<(HeatClass, Vec<Relocation>)> {
    let classes = match heat {
        Some((tracker, choice)) => split_by_heat(relocations, tracker, choice),
        None => vec![relocations.to_vec()],
    };
    let mut out = Vec::new();
    for (class, rel) in classes.iter().enumerate() {
        let class = HeatClass(u8::try_from(class).unwrap_or(u8::MAX));
        out.extend(
            group_relocations(rel, object_bytes)
                .into_iter()
                .map(|g| (class, g)),
        );
    }
    out
}

/// Object extents (with sources) for one GC group.
pub fn gc_object_extents(group: &[Relocation]) -> Vec<ObjectExtent> {
    group
        .iter()
        .map(|r| ObjectExtent {
            lba: r.lba,
            sectors: r.sectors as u32,
            source: Some(ExtentSource {
                object_seq: r.source.object_seq,
                object_offset: r.source.offset,
            }),
        })
        .collect()
}

/// The header a GC object for `group` will have, without encoding any data: what the
/// simulator applies, and what the engine checks its encoded objects against.
pub fn gc_object_header(seq: u64, last_record_seq: u64, group: &[Relocation]) -> ObjectHeader {
    let extents = gc_object_extents(group);
    crate::format::object::header_without_data(
        ObjectKind::Gc,
        seq,
        last_record_seq,
        extents,
        Vec::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::object::header_without_data;

    fn data(seq: u64, extents: &[(u64, u32)]) -> ObjectHeader {
        let e = extents
            .iter()
            .map(|&(lba, sectors)| ObjectExtent {
                lba,
                sectors,
                source: None,
            })
            .collect();
        header_without_data(ObjectKind::Data, seq, seq, e, Vec::new())
    }

    fn state_with_garbage() -> StoreState {
        let mut s = StoreState::new(1 << 30);
        s.apply(&data(1, &[(0, 800)])).expect("apply"); // 400 KiB
        s.apply(&data(2, &[(1000, 800)])).expect("apply");
        s.apply(&data(3, &[(0, 720)])).expect("apply"); // object 1 now 10% live
        s.apply(&data(4, &[(1000, 400)])).expect("apply"); // object 2 now 50% live
        s
    }

    #[test]
    fn greedy_takes_emptiest_first_and_respects_budget() {
        let s = state_with_garbage();
        let cfg = GcConfig {
            pass_bytes: 100 * 512,
            ..GcConfig::default()
        };
        let v = select_victims(&s, &cfg, 5, |_| false);
        assert_eq!(v, vec![1]);
        let cfg = GcConfig {
            pass_bytes: 1 << 30,
            ..GcConfig::default()
        };
        assert_eq!(select_victims(&s, &cfg, 5, |_| false), vec![1, 2]);
        assert_eq!(select_victims(&s, &cfg, 5, |seq| seq == 1), vec![2]);
    }

    /// A clone whose ancestors own objects 1 and 2 (it starts at 3): its GC leaves
    /// them alone however dead they are in its view, and weighs only its own objects.
    #[test]
    fn a_clone_collects_and_weighs_only_its_own_objects() {
        let mut s = state_with_garbage();
        s.set_shared_below(3);
        assert!(s.is_shared(2) && !s.is_shared(3));
        let all = GcConfig {
            pass_bytes: 1 << 30,
            ..GcConfig::default()
        };
        // Objects 3 and 4 are all live: nothing to collect, nothing to count against.
        assert!(select_victims(&s, &all, 5, |_| false).is_empty());
        assert_eq!(s.owned_live_bytes(), (720 + 400) * 512);
        assert_eq!(
            s.owned_stored_bytes(),
            s.objects()[&3].total_bytes + s.objects()[&4].total_bytes
        );
        assert!(utilization(&s) > 0.95, "{}", utilization(&s));
        assert!(!should_collect(&s, &all, false));
        assert!(!should_collect(&s, &all, true));
        // Client objects are held against the clone's own objects only.
        assert!(client_object_fits(&s, &all, 0, 1 << 20, 0));
        assert_eq!(headroom_used(&s, &all, 0, 0, 1 << 20), 0.0);
        // Its own object 3 half overwritten: that one is collected, still not 1 or 2.
        s.apply(&data(5, &[(0, 360)])).expect("apply");
        assert!(should_collect(
            &s,
            &GcConfig {
                start_utilization: 0.9,
                stop_utilization: 0.95,
                ..all
            },
            false
        ));
        assert_eq!(select_victims(&s, &all, 6, |_| false), vec![3]);
        // Not a clone: the ancestors' objects would be the first victims.
        s.set_shared_below(0);
        assert_eq!(select_victims(&s, &all, 6, |_| false), vec![1, 3, 2]);
    }

    #[test]
    fn relocation_moves_live_data_and_empties_victims() {
        let mut s = state_with_garbage();
        // (lba, sectors, mapped) of each piece of the first 2000 sectors.
        let pieces = |s: &StoreState| -> Vec<(u64, u64, bool)> {
            let lookup = s.map().lookup(0, 2000);
            lookup
                .iter()
                .map(|p| (p.lba, p.sectors, p.location.is_some()))
                .collect()
        };
        let before = pieces(&s);
        let victims: BTreeSet<u64> = [1, 2].into_iter().collect();
        let rel = live_extents(&s, &victims);
        assert_eq!(rel.iter().map(|r| r.sectors).sum::<u64>(), 80 + 400);
        let groups = group_relocations(&rel, 256 * 512);
        assert_eq!(groups.len(), 2);
        for (i, g) in groups.iter().enumerate() {
            let h = gc_object_header(5 + i as u64, 4, g);
            s.apply(&h).expect("apply gc");
        }
        assert_eq!(s.objects()[&1].live_bytes, 0);
        assert_eq!(s.objects()[&2].live_bytes, 0);
        let after = pieces(&s);
        // Same LBAs mapped, just elsewhere (extent boundaries may differ).
        let flat = |v: &[(u64, u64, bool)]| -> Vec<bool> {
            v.iter()
                .flat_map(|&(_, n, m)| std::iter::repeat_n(m, n as usize))
                .collect()
        };
        assert_eq!(flat(&before), flat(&after));
        s.forget_object(1);
        s.forget_object(2);
        assert!(utilization(&s) > 0.99);
    }

    #[test]
    fn client_objects_wait_only_while_the_store_is_over_its_bound() {
        // 1600 live sectors in 2720 stored (plus headers): utilization ~0.59.
        let s = state_with_garbage();
        let live = s.live_bytes();
        let stored = s.stored_bytes();
        let cfg = GcConfig::default();
        let limit = (live as f64 / cfg.start_utilization) as u64;
        assert!(stored > limit, "the state is over live/0.70");
        // Over the bound: no client object fits, however small, until GC catches up...
        assert!(!client_object_fits(&s, &cfg, 0, 4096, 64 << 10));
        // ...unless the slack covers the excess.
        let excess = stored - limit;
        assert!(client_object_fits(&s, &cfg, 0, 4096, excess + 4096 + 1));
        // Pending objects count against the room.
        assert!(!client_object_fits(&s, &cfg, 4096, 4096, excess + 4096 + 1));
        // GC disabled: never wait.
        let off = GcConfig {
            start_utilization: 0.0,
            ..cfg
        };
        assert!(client_object_fits(&s, &off, 1 << 30, 1 << 30, 0));
        // Under the bound with nothing pending: always go, even for an object larger
        // than the slack (otherwise nothing would ever make room).
        let lax = GcConfig {
            start_utilization: 0.3,
            stop_utilization: 0.4,
            ..cfg
        };
        assert!(client_object_fits(&s, &lax, 0, 1 << 30, 0));
        assert!(!client_object_fits(&s, &lax, 4096, 1 << 30, 0));
    }

    #[test]
    fn headroom_used_runs_from_the_bound_to_the_headroom_past_it() {
        let s = state_with_garbage();
        let cfg = GcConfig::default();
        let bound = s.live_bytes() as f64 / cfg.start_utilization;
        let excess = s.stored_bytes() as f64 - bound;
        assert!(excess > 0.0, "the state is over live/0.70");
        let slack = 4096;
        let over = excess - slack as f64;
        // Half the headroom used; all of it (and no more) once pending bytes add the
        // other half and some.
        let headroom = (2.0 * over) as u64;
        let half = headroom_used(&s, &cfg, 0, slack, headroom);
        assert!((half - 0.5).abs() < 1e-3, "{half}");
        let full = headroom_used(&s, &cfg, headroom / 2 + 1, slack, headroom);
        assert_eq!(full, 1.0, "pending bytes count; never past 1");
        // Within the bound plus slack: none used.
        assert_eq!(headroom_used(&s, &cfg, 0, excess as u64 + 1, headroom), 0.0);
        // No headroom: GC always at full pace. GC disabled: no pace at all.
        assert_eq!(headroom_used(&s, &cfg, 0, slack, 0), 1.0);
        let off = GcConfig {
            start_utilization: 0.0,
            ..cfg
        };
        assert_eq!(headroom_used(&s, &off, 0, slack, headroom), 0.0);
    }

    #[test]
    fn hysteresis() {
        let s = state_with_garbage();
        let u = utilization(&s);
        let cfg = GcConfig {
            start_utilization: u - 0.01,
            stop_utilization: u + 0.01,
            ..GcConfig::default()
        };
        assert!(!should_collect(&s, &cfg, false));
        assert!(should_collect(&s, &cfg, true));
        assert!(!should_collect(
            &s,
            &GcConfig {
                start_utilization: 0.0,
                ..cfg
            },
            true
        ));
    }

    /// 8 MiB of data in 1 MiB regions; regions 0 and 1 are hot, 5 is warm, the rest
    /// cold: three classes.
    fn heat_setup() -> (StoreState, HeatTracker, HotChoice) {
        let mib = 2048u64;
        let mut s = StoreState::new(64 << 20);
        // Object 1: all 8 MiB in two extents; object 2 overwrites bits of it, so
        // object 1 has garbage and its live extents cross region edges.
        s.apply(&data(
            1,
            &[(0, (4 * mib) as u32), (4 * mib, (4 * mib) as u32)],
        ))
        .expect("apply");
        s.apply(&data(2, &[(mib / 2, 16), (3 * mib, 64), (6 * mib + 5, 8)]))
            .expect("apply");
        let mut t = HeatTracker::with_limits(Some(64 << 20), 1 << 20, 1 << 20, None);
        for region in 0..8u64 {
            let times = match region {
                0 | 1 => 400,
                5 => 40,
                _ => 1,
            };
            for _ in 0..times {
                t.record_write(region * mib, 8);
            }
        }
        let choice = crate::hylog::choose(&t.distribution(), 0.8);
        assert_eq!(choice.classes, 3, "{choice:?}");
        (s, t, choice)
    }

    fn sectors_of(rel: &[Relocation]) -> Vec<(u64, u64, u64)> {
        let mut v: Vec<(u64, u64, u64)> = rel
            .iter()
            .flat_map(|r| {
                (0..r.sectors).map(move |i| {
                    let src = r.source.advance_sectors(i);
                    (r.lba + i, src.object_seq, src.offset)
                })
            })
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn classes_never_share_a_gc_object() {
        let (s, t, choice) = heat_setup();
        let victims: BTreeSet<u64> = [1].into_iter().collect();
        let rel = live_extents(&s, &victims);
        let region_sectors = t.region_bytes() / SECTOR_BYTES;
        let class_at = |lba: u64| HeatClass(choice.class_of(t.heat_at(lba)) as u8);
        assert_eq!(
            (0..8)
                .map(|r| class_at(r * region_sectors).0)
                .collect::<Vec<_>>(),
            vec![2, 2, 0, 0, 0, 1, 0, 0]
        );
        // Small objects so that each class spans several.
        let groups = group_relocations_by_class(&rel, 512 << 10, Some((&t, &choice)));
        let mut groups_per_class = [0usize; 3];
        let mut last_class = HeatClass::COLDEST;
        for (class, g) in &groups {
            assert!(*class >= last_class, "coldest class first");
            last_class = *class;
            let sectors: u64 = g.iter().map(|r| r.sectors).sum();
            assert!(sectors * SECTOR_BYTES <= 512 << 10);
            for r in g {
                // Every region an extent touches is of the group's class.
                let mut lba = r.lba;
                while lba < r.lba + r.sectors {
                    assert_eq!(class_at(lba), *class, "lba {lba} in a {class:?} group");
                    lba = (lba / region_sectors + 1) * region_sectors;
                }
                assert_eq!(class_at(r.lba + r.sectors - 1), *class);
            }
            groups_per_class[usize::from(class.0)] += 1;
        }
        assert!(
            groups_per_class.iter().all(|&n| n >= 2),
            "{groups_per_class:?}"
        );
        // Every live sector is moved exactly once, from where it is.
        let all: Vec<Relocation> = groups.iter().flat_map(|(_, g)| g.clone()).collect();
        assert_eq!(sectors_of(&all), sectors_of(&rel));
        // Without separation: exactly the plain grouping, all in the coldest class.
        let plain = group_relocations_by_class(&rel, 512 << 10, None);
        assert!(plain.iter().all(|(c, _)| *c == HeatClass::COLDEST));
        let plain: Vec<Vec<Relocation>> = plain.into_iter().map(|(_, g)| g).collect();
        assert_eq!(plain, group_relocations(&rel, 512 << 10));
        let none = HotChoice::none(0.8);
        let unsplit = group_relocations_by_class(&rel, 512 << 10, Some((&t, &none)));
        assert_eq!(unsplit.len(), plain.len());
        assert!(unsplit.iter().all(|(c, _)| !c.is_hot()));
    }

    #[test]
    fn class_split_gc_objects_apply_only_where_the_map_still_points_at_the_source() {
        let (mut s, t, choice) = heat_setup();
        let victims: BTreeSet<u64> = [1].into_iter().collect();
        let rel = live_extents(&s, &victims);
        let groups = group_relocations_by_class(&rel, 1 << 20, Some((&t, &choice)));
        // A client write lands after planning: 64 sectors in a hot region and 64 in a
        // cold one, both still mapped to the victim when the pass read them.
        s.apply(&data(3, &[(100, 64), (2 * 2048 + 100, 64)]))
            .expect("apply");
        for (i, (_, g)) in groups.iter().enumerate() {
            let h = gc_object_header(4 + i as u64, 3, g);
            s.apply(&h).expect("apply gc");
        }
        assert_eq!(s.objects()[&1].live_bytes, 0, "the victim is empty");
        for lba in [100u64, 163, 2 * 2048 + 100, 2 * 2048 + 163] {
            let p = s.map().lookup(lba, 1);
            let loc = p.first().and_then(|p| p.location).expect("mapped");
            assert_eq!(loc.object_seq, 3, "lba {lba}: the newer client write stays");
        }
        // Everything else of the volume is mapped, to GC objects or object 2.
        for p in s.map().lookup(0, 8 * 2048) {
            let seq = p.location.expect("mapped").object_seq;
            assert!(seq >= 2, "lba {} in {seq}", p.lba);
        }
    }

    #[test]
    fn hylog_parses_and_orders_victims_by_what_it_does() {
        let p: GcPolicy = "hylog".parse().expect("parse");
        assert_eq!(p, GcPolicy::HyLog);
        assert_eq!(p.to_string(), "hylog");
        assert!(p.tracks_heat() && !GcPolicy::Greedy.tracks_heat());
        assert_eq!(p.victim_order(true), GcPolicy::CostBenefit);
        assert_eq!(p.victim_order(false), GcPolicy::Greedy);
        assert_eq!(GcPolicy::Greedy.victim_order(true), GcPolicy::Greedy);
        let e = "lfs".parse::<GcPolicy>().expect_err("unknown");
        assert!(e.contains("hylog"), "{e}");
        let cfg = GcConfig {
            policy: p,
            ..GcConfig::default()
        };
        assert!(cfg.validate().is_ok());
    }
}
