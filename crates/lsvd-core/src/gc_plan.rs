//! A GC pass's live data, planned from the victims' own object headers.
//!
//! Each object's header lists the extents it holds and where their bytes sit in it
//! ([`ObjectHeader::extent_offsets`]). A piece of the store map is live in a victim
//! exactly when it points at the bytes the victim's header put there, so a pass need
//! only look up the ranges its victims' headers list: as many map lookups as the
//! victims hold extents, where [`crate::gc::live_extents`] walks the whole map (262,144
//! extents for 1 GiB of random 4 KiB writes, whichever objects are collected). This is
//! how the LSVD paper plans GC; the live engine reads the headers anyway, to verify
//! what it copies, and the simulator keeps them.
//!
//! The result is the same data [`crate::gc::live_extents`] gives, in LBA order, with
//! neighbours that continue each other in the same victim joined into one relocation
//! (`gc_plan_matches_the_map_scan` checks it on random histories).

use crate::format::SECTOR_BYTES;
use crate::format::object::{ObjectExtent, ObjectHeader};
use crate::gc::Relocation;
use crate::store_state::{ObjLoc, StoreState};

/// Append to `out` the live extents of object `seq`, given its header's extents with
/// their byte offsets (`extent_offsets`): the map pieces inside each extent that still
/// point at the same bytes of `seq`. In the header's order; see [`in_lba_order`].
pub fn live_extents_of_object(
    state: &StoreState,
    seq: u64,
    extents: impl IntoIterator<Item = (ObjectExtent, u64)>,
    out: &mut Vec<Relocation>,
) {
    for (e, offset) in extents {
        state.map().for_each_in(e.lba, u64::from(e.sectors), |p| {
            let Some(source) = p.location else { return };
            let here = ObjLoc {
                object_seq: seq,
                offset: offset + (p.lba - e.lba) * SECTOR_BYTES,
            };
            if source == here {
                push_joined(
                    out,
                    Relocation {
                        lba: p.lba,
                        sectors: p.sectors,
                        source,
                    },
                );
            }
        });
    }
}

/// The live extents of every header in `victims`, in LBA order.
pub fn live_extents_of_headers<'a>(
    state: &StoreState,
    victims: impl IntoIterator<Item = &'a ObjectHeader>,
) -> Vec<Relocation> {
    let mut out = Vec::new();
    for h in victims {
        live_extents_of_object(state, h.seq, h.extent_offsets(), &mut out);
    }
    in_lba_order(&mut out);
    out
}

/// Sort relocations (disjoint, as live extents are) by LBA, and join each to the one
/// before it where it continues it: the next sectors of the volume from the next
/// bytes of the same object.
pub fn in_lba_order(relocations: &mut Vec<Relocation>) {
    relocations.sort_unstable_by_key(|r| r.lba);
    let mut joined: Vec<Relocation> = Vec::with_capacity(relocations.len());
    for r in relocations.drain(..) {
        push_joined(&mut joined, r);
    }
    *relocations = joined;
}

/// Defragmenting GC (the LSVD paper's "defrag", Table 5): if the gap between
/// relocations `a` and `b` (`b` after `a` in LBA order) is 1 to `max_hole_sectors`
/// sectors long and wholly mapped to objects the volume owns, append the map's pieces
/// there to `holes` and return true. Relocated too, they make `a`, the gap and `b` one
/// run of the GC object, and so one map extent where there were at least three: the
/// map shrinks, and reads of the range need fewer pieces, for a few more bytes moved.
/// A gap that is partly unmapped (never written, trimmed) or holds a clone's base data
/// is left alone: filling it would not join anything, or would stop sharing.
pub fn hole_between(
    state: &StoreState,
    a: &Relocation,
    b: &Relocation,
    max_hole_sectors: u64,
    holes: &mut Vec<Relocation>,
) -> bool {
    let start = a.lba + a.sectors;
    let Some(gap) = b.lba.checked_sub(start) else {
        return false;
    };
    if gap == 0 || gap > max_hole_sectors {
        return false;
    }
    let before = holes.len();
    let mut mapped = 0u64;
    state.map().for_each_in(start, gap, |p| {
        if let Some(source) = p.location
            && !state.is_shared(source.object_seq)
        {
            mapped += p.sectors;
            holes.push(Relocation {
                lba: p.lba,
                sectors: p.sectors,
                source,
            });
        }
    });
    if mapped != gap {
        holes.truncate(before);
        return false;
    }
    true
}

/// Plugs holes pair after pair of a pass's relocations within the pass's budget: the
/// one step [`plug_holes`] and the engine's walk (a slice at a time, letting go of its
/// lock) share.
#[derive(Debug, Clone, Copy)]
pub struct HolePlugger {
    max_hole_sectors: u64,
    /// Sectors the pass may still add: `GcConfig::pass_bytes` (which bounds the store)
    /// less what its relocations already move.
    budget_sectors: u64,
}

impl HolePlugger {
    /// For a pass of `relocations` with a budget of `pass_bytes`; None if
    /// `max_hole_bytes` turns plugging off.
    pub fn new(relocations: &[Relocation], max_hole_bytes: u64, pass_bytes: u64) -> Option<Self> {
        let max_hole_sectors = max_hole_bytes / SECTOR_BYTES;
        if max_hole_sectors == 0 {
            return None;
        }
        let planned: u64 = relocations.iter().map(|r| r.sectors).sum();
        Some(HolePlugger {
            max_hole_sectors,
            budget_sectors: (pass_bytes / SECTOR_BYTES).saturating_sub(planned),
        })
    }

    /// [`hole_between`] `a` and `b` if the gap fits what is left of the budget.
    pub fn plug(
        &mut self,
        state: &StoreState,
        a: &Relocation,
        b: &Relocation,
        holes: &mut Vec<Relocation>,
    ) -> bool {
        let gap = b.lba.saturating_sub(a.lba + a.sectors);
        if gap > self.budget_sectors || !hole_between(state, a, b, self.max_hole_sectors, holes) {
            return false;
        }
        self.budget_sectors -= gap;
        true
    }
}

/// [`hole_between`] over every neighbouring pair of `relocations` (in LBA order, as
/// planned), while the holes fit in the pass's budget ([`HolePlugger`]): the list with
/// the holes' pieces added, in LBA order and joined. `max_hole_bytes` 0 leaves it as
/// it is.
pub fn plug_holes(
    state: &StoreState,
    relocations: &mut Vec<Relocation>,
    max_hole_bytes: u64,
    pass_bytes: u64,
) {
    let Some(mut plugger) = HolePlugger::new(relocations, max_hole_bytes, pass_bytes) else {
        return;
    };
    let mut holes = Vec::new();
    for w in relocations.windows(2) {
        plugger.plug(state, &w[0], &w[1], &mut holes);
    }
    if !holes.is_empty() {
        relocations.extend(holes);
        in_lba_order(relocations);
    }
}

fn push_joined(out: &mut Vec<Relocation>, r: Relocation) {
    if let Some(last) = out.last_mut()
        && last.lba + last.sectors == r.lba
        && last.source.advance_sectors(last.sectors) == r.source
    {
        last.sectors += r.sectors;
        return;
    }
    out.push(r);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::format::object::{ObjectKind, header_without_data};
    use crate::gc::{gc_object_header, group_relocations, live_extents};
    use crate::test_rng::xorshift64;

    /// Every sector a relocation list moves: (lba, object, byte offset).
    fn per_sector(rel: &[Relocation]) -> Vec<(u64, u64, u64)> {
        rel.iter()
            .flat_map(|r| {
                (0..r.sectors).map(move |i| {
                    let src = r.source.advance_sectors(i);
                    (r.lba + i, src.object_seq, src.offset)
                })
            })
            .collect()
    }

    /// Random histories: data objects of random writes (overlapping each other and
    /// themselves), trims, and GC passes planned from headers whose objects are
    /// applied. At every step, for random victim sets, the plan from headers moves
    /// exactly the sectors the map scan finds, in LBA order, never two neighbours
    /// left unjoined.
    #[test]
    fn gc_plan_matches_the_map_scan() {
        for seed in [1u64, 7, 0x5eed, 0xdead_beef] {
            let mut rng = xorshift64(seed);
            let volume_sectors = 4096u64;
            let mut s = StoreState::new(volume_sectors * SECTOR_BYTES);
            let mut headers: BTreeMap<u64, ObjectHeader> = BTreeMap::new();
            let mut seq = 1u64;
            for step in 0..60 {
                let h = if step % 5 == 4 {
                    // A GC pass over a few objects, planned from their headers.
                    let victims: Vec<&ObjectHeader> = headers
                        .values()
                        .filter(|_| rng().is_multiple_of(3))
                        .collect();
                    let plan = live_extents_of_headers(&s, victims.iter().copied());
                    if plan.is_empty() {
                        continue;
                    }
                    let group = group_relocations(&plan, 1 << 30).remove(0);
                    gc_object_header(seq, seq, &group)
                } else {
                    let n = 1 + rng() % 40;
                    let extents = (0..n)
                        .map(|_| {
                            let sectors = 1 + (rng() % 24) as u32;
                            ObjectExtent {
                                lba: rng() % (volume_sectors - u64::from(sectors)),
                                sectors,
                                source: None,
                            }
                        })
                        .collect();
                    let trims = if rng().is_multiple_of(4) {
                        vec![(rng() % (volume_sectors - 64), 1 + rng() % 64)]
                    } else {
                        Vec::new()
                    };
                    header_without_data(ObjectKind::Data, seq, seq, extents, trims)
                };
                s.apply(&h).expect("in order");
                headers.insert(seq, h);
                seq += 1;
                for _ in 0..4 {
                    let chosen: BTreeSet<u64> = headers
                        .keys()
                        .copied()
                        .filter(|_| rng().is_multiple_of(2))
                        .collect();
                    let scan = live_extents(&s, &chosen);
                    let planned = live_extents_of_headers(&s, chosen.iter().map(|v| &headers[v]));
                    assert_eq!(
                        per_sector(&planned),
                        per_sector(&scan),
                        "seed {seed} step {step} victims {chosen:?}"
                    );
                    for w in planned.windows(2) {
                        assert!(w[0].lba + w[0].sectors <= w[1].lba, "LBA order");
                        let continues = w[0].lba + w[0].sectors == w[1].lba
                            && w[0].source.advance_sectors(w[0].sectors) == w[1].source;
                        assert!(!continues, "neighbours joined: {w:?}");
                    }
                }
            }
        }
    }

    /// Which write each byte position holds, and which write each sector of the volume
    /// should read: the oracle the GC tests hold the map to.
    #[derive(Default)]
    struct DataModel {
        at: std::collections::HashMap<(u64, u64), u64>,
        expected: Vec<Option<u64>>,
        next_write: u64,
    }

    impl DataModel {
        fn new(sectors: u64) -> Self {
            DataModel {
                expected: vec![None; sectors as usize],
                ..Default::default()
            }
        }

        /// `h` is stored and applied: its bytes hold fresh writes (data objects) or
        /// copies of their sources (GC objects).
        fn store(&mut self, h: &ObjectHeader) {
            for &(lba, sectors) in &h.trims {
                self.expected[lba as usize..(lba + sectors) as usize].fill(None);
            }
            for (e, offset) in h.extent_offsets() {
                for i in 0..u64::from(e.sectors) {
                    let here = (h.seq, offset + i * SECTOR_BYTES);
                    match e.source {
                        None => {
                            self.next_write += 1;
                            self.at.insert(here, self.next_write);
                            self.expected[(e.lba + i) as usize] = Some(self.next_write);
                        }
                        Some(src) => {
                            let from = (src.object_seq, src.object_offset + i * SECTOR_BYTES);
                            if let Some(&w) = self.at.get(&from) {
                                self.at.insert(here, w);
                            }
                        }
                    }
                }
            }
        }

        /// Every sector reads the write it should through the map.
        fn check(&self, s: &StoreState, what: &str) {
            let mut got = vec![None; self.expected.len()];
            for p in s.map().iter() {
                for i in 0..p.sectors {
                    let loc = p.location.advance_sectors(i);
                    got[(p.lba + i) as usize] = self.at.get(&(loc.object_seq, loc.offset)).copied();
                }
            }
            if let Some(bad) = (0..got.len()).find(|&i| got[i] != self.expected[i]) {
                panic!(
                    "{what}: sector {bad} reads write {:?}, expected {:?}",
                    got[bad], self.expected[bad]
                );
            }
        }
    }

    /// A GC pass over `victims` (planned from headers, holes of up to `hole_bytes`
    /// plugged), applied: its GC objects' headers.
    fn gc_pass(
        s: &mut StoreState,
        headers: &BTreeMap<u64, ObjectHeader>,
        victims: &[u64],
        hole_bytes: u64,
        seq: &mut u64,
    ) -> Vec<ObjectHeader> {
        let mut plan = live_extents_of_headers(s, victims.iter().map(|v| &headers[v]));
        plug_holes(s, &mut plan, hole_bytes, u64::MAX);
        let mut out = Vec::new();
        for group in group_relocations(&plan, 64 << 10) {
            let h = gc_object_header(*seq, *seq, &group);
            s.apply(&h).expect("in order");
            *seq += 1;
            out.push(h);
        }
        out
    }

    /// Random small writes and trims with GC passes, with holes of up to 8 KiB plugged
    /// and without: every sector keeps reading what was last written to it (the
    /// plugged data is copied, not invented), and plugging never leaves the map with
    /// more extents than the same history without it.
    #[test]
    fn plugged_holes_keep_every_sector_and_shrink_the_map() {
        for seed in [3u64, 11, 0xfeed] {
            let mut fewer_somewhere = false;
            let volume_sectors = 2048u64;
            let mut runs = Vec::new();
            for hole_bytes in [0u64, 8 << 10] {
                let mut rng = xorshift64(seed);
                let mut s = StoreState::new(volume_sectors * SECTOR_BYTES);
                let mut model = DataModel::new(volume_sectors);
                let mut headers: BTreeMap<u64, ObjectHeader> = BTreeMap::new();
                let mut seq = 1u64;
                let mut extents_after = Vec::new();
                for step in 0..80 {
                    if step % 4 == 3 {
                        let victims: Vec<u64> = headers
                            .keys()
                            .copied()
                            .filter(|v| s.objects().contains_key(v))
                            .filter(|_| rng().is_multiple_of(3))
                            .collect();
                        for h in gc_pass(&mut s, &headers, &victims, hole_bytes, &mut seq) {
                            model.store(&h);
                            headers.insert(h.seq, h);
                        }
                        model.check(&s, &format!("seed {seed} hole {hole_bytes} step {step}"));
                        extents_after.push(s.map().extent_count());
                        continue;
                    }
                    let extents = (0..1 + rng() % 30)
                        .map(|_| ObjectExtent {
                            lba: rng() % (volume_sectors - 8),
                            sectors: 1 + (rng() % 8) as u32,
                            source: None,
                        })
                        .collect();
                    let trims = if rng().is_multiple_of(5) {
                        vec![(rng() % (volume_sectors - 32), 1 + rng() % 32)]
                    } else {
                        Vec::new()
                    };
                    let h = header_without_data(ObjectKind::Data, seq, seq, extents, trims);
                    s.apply(&h).expect("in order");
                    model.store(&h);
                    headers.insert(seq, h);
                    seq += 1;
                }
                runs.push(extents_after);
            }
            // Both runs make the same client writes; GC differs only in plugged holes.
            for (without, with) in runs[0].iter().zip(&runs[1]) {
                fewer_somewhere |= with < without;
            }
            assert!(
                fewer_somewhere,
                "seed {seed}: plugging never shrank the map"
            );
        }
    }

    /// The paper's case: two relocated runs 4 KiB apart with other data between them
    /// become one map extent in the GC object; a gap larger than the limit, one with
    /// an unmapped sector, and one holding a clone's base data are left alone.
    #[test]
    fn a_small_hole_between_relocated_runs_is_plugged_and_joins_them() {
        let extent = |lba, sectors| ObjectExtent {
            lba,
            sectors,
            source: None,
        };
        let data = |seq, extents| header_without_data(ObjectKind::Data, seq, seq, extents, vec![]);
        let mut s = StoreState::new(1 << 20);
        // Object 1 (the base of a clone below), then 2 and 3; 2 is the victim.
        let one = data(1, vec![extent(300, 8)]);
        let two = data(
            2,
            vec![
                extent(0, 8),
                extent(16, 8),
                extent(100, 8),
                extent(140, 8),
                extent(200, 8),
                extent(212, 8),
                extent(292, 8),
                extent(308, 8),
            ],
        );
        let three = data(3, vec![extent(8, 8), extent(108, 32), extent(208, 2)]);
        for h in [&one, &two, &three] {
            s.apply(h).expect("apply");
        }
        s.set_shared_below(2);
        let mut plan = live_extents_of_headers(&s, [&two]);
        let planned = plan.clone();
        // A pass with no budget left plugs nothing; one with 8 sectors left, the gap.
        let planned_bytes = planned.iter().map(|r| r.sectors).sum::<u64>() * SECTOR_BYTES;
        plug_holes(&s, &mut plan, 8 << 10, planned_bytes + 7 * SECTOR_BYTES);
        assert_eq!(plan, planned, "over the pass's budget");
        plug_holes(&s, &mut plan, 8 << 10, planned_bytes + 8 * SECTOR_BYTES);
        // [8, 16) (object 3) is plugged; [108, 140) is 16 KiB, too large; [208, 212)
        // is half unmapped; [300, 308) is the clone's base data.
        let holes: Vec<(u64, u64, u64)> = plan
            .iter()
            .filter(|r| !planned.contains(r))
            .map(|r| (r.lba, r.sectors, r.source.object_seq))
            .collect();
        assert_eq!(holes, vec![(8, 8, 3)], "{plan:?}");
        let before = s.map().extent_count();
        let h = gc_object_header(4, 4, &group_relocations(&plan, 1 << 30).remove(0));
        s.apply(&h).expect("apply");
        let joined: Vec<_> = s.map().lookup(0, 24);
        assert_eq!(joined.len(), 1, "{joined:?}");
        assert_eq!(joined[0].location.map(|l| l.object_seq), Some(4));
        // Three extents (0-8, 8-16, 16-24) became one.
        assert_eq!(s.map().extent_count(), before - 2);
    }

    /// An object that wrote the same blocks twice: only the second copy is live, and
    /// the first copy's bytes are never planned even though its range is looked up.
    #[test]
    fn an_object_overwriting_itself_plans_only_the_copy_the_map_holds() {
        let mut s = StoreState::new(1 << 20);
        let extent = |lba, sectors| ObjectExtent {
            lba,
            sectors,
            source: None,
        };
        let h = header_without_data(
            ObjectKind::Data,
            1,
            1,
            vec![extent(0, 16), extent(8, 16)],
            Vec::new(),
        );
        s.apply(&h).expect("apply");
        let planned = live_extents_of_headers(&s, [&h]);
        let data = u64::from(h.header_bytes);
        assert_eq!(
            planned,
            vec![
                Relocation {
                    lba: 0,
                    sectors: 8,
                    source: ObjLoc {
                        object_seq: 1,
                        offset: data,
                    },
                },
                Relocation {
                    lba: 8,
                    sectors: 16,
                    source: ObjLoc {
                        object_seq: 1,
                        offset: data + 16 * SECTOR_BYTES,
                    },
                },
            ]
        );
    }
}
