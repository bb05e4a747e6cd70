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
