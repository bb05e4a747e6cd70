//! Applying an object step by step ends where applying it at once does, and every
//! intermediate state is one the rest of the engine can safely see.

use lsvd_trace::synthetic::prng::Rng;

use super::tests::{ext, object as header};
use super::*;
use crate::format::object::{ExtentSource, ObjectExtent};
use crate::gc::{GcConfig, select_victims};

const VOLUME_SECTORS: u64 = 8192;

/// A random data object (non-overlapping extents, some trims) or, when the map has
/// data, a GC object relocating some of it (some sources deliberately stale).
fn random_object(rng: &mut Rng, state: &StoreState, seq: u64) -> ObjectHeader {
    let pieces: Vec<_> = state.map().iter().collect();
    if !pieces.is_empty() && rng.below(3) == 0 {
        let mut extents = Vec::new();
        for p in pieces.iter().take(80) {
            if rng.below(2) == 0 {
                continue;
            }
            let stale = rng.below(5) == 0;
            extents.push(ObjectExtent {
                lba: p.lba,
                sectors: p.sectors as u32,
                source: Some(ExtentSource {
                    object_seq: p.location.object_seq,
                    object_offset: p.location.offset + if stale { 512 } else { 0 },
                }),
            });
        }
        return header(ObjectKind::Gc, seq, &extents, &[]);
    }
    let mut extents = Vec::new();
    let mut lba = rng.below(64);
    while lba < VOLUME_SECTORS && extents.len() < 60 {
        let sectors = 1 + rng.below(24).min(VOLUME_SECTORS - lba - 1);
        extents.push(ObjectExtent {
            lba,
            sectors: sectors as u32,
            source: None,
        });
        lba += sectors + rng.below(300);
    }
    let trims: Vec<(u64, u64)> = (0..rng.below(3))
        .map(|_| {
            let start = rng.below(VOLUME_SECTORS - 1);
            (start, 1 + rng.below((VOLUME_SECTORS - start).min(9000)))
        })
        .collect();
    header(ObjectKind::Data, seq, &extents, &trims)
}

fn assert_accounting_exact(s: &StoreState) {
    assert_eq!(s.live_bytes(), s.map().mapped_sectors() * 512);
    let mut per_object: BTreeMap<u64, u64> = BTreeMap::new();
    for p in s.map().iter() {
        *per_object.entry(p.location.object_seq).or_default() += p.sectors * 512;
    }
    for (seq, o) in s.objects() {
        assert_eq!(
            o.live_bytes,
            per_object.get(seq).copied().unwrap_or(0),
            "object {seq}"
        );
    }
}

/// Where each sector of the volume maps, worked out one sector at a time from the
/// object's own extent offsets: the reference both ways of applying are held to.
struct SectorModel(Vec<Option<ObjLoc>>);

impl SectorModel {
    fn apply(&mut self, h: &ObjectHeader) {
        for &(lba, sectors) in &h.trims {
            self.0[lba as usize..(lba + sectors) as usize].fill(None);
        }
        for (e, offset) in h.extent_offsets() {
            for i in 0..e.sectors as u64 {
                let sector = &mut self.0[(e.lba + i) as usize];
                let new = Some(ObjLoc {
                    object_seq: h.seq,
                    offset: offset + i * 512,
                });
                match e.source {
                    None => *sector = new,
                    Some(src) => {
                        let expected = Some(ObjLoc {
                            object_seq: src.object_seq,
                            offset: src.object_offset + i * 512,
                        });
                        if *sector == expected {
                            *sector = new;
                        }
                    }
                }
            }
        }
    }

    /// Sectors `[lba, lba + n)` map where the model says.
    fn assert_range_is(&self, s: &StoreState, lba: u64, n: u64, what: &str) {
        let mut got: Vec<Option<ObjLoc>> = vec![None; n as usize];
        for p in s.map().lookup(lba, n) {
            if let Some(loc) = p.location {
                for i in 0..p.sectors {
                    got[(p.lba - lba + i) as usize] = Some(loc.advance_sectors(i));
                }
            }
        }
        let want = &self.0[lba as usize..(lba + n) as usize];
        if let Some(bad) = (0..n as usize).find(|&i| got[i] != want[i]) {
            panic!(
                "{what}: sector {} was reported applied but maps to {:?}, expected {:?}",
                lba + bad as u64,
                got[bad],
                want[bad]
            );
        }
    }

    fn assert_is(&self, s: &StoreState, what: &str) {
        let mut got = vec![None; self.0.len()];
        for p in s.map().iter() {
            for i in 0..p.sectors {
                got[(p.lba + i) as usize] = Some(p.location.advance_sectors(i));
            }
        }
        if let Some(bad) = (0..got.len()).find(|&i| got[i] != self.0[i]) {
            panic!(
                "{what}: sector {bad} maps to {:?}, expected {:?}",
                got[bad], self.0[bad]
            );
        }
    }
}

#[test]
fn stepwise_apply_ends_where_apply_at_once_does() {
    for seed in 1..=40u64 {
        let mut rng = Rng::new(seed);
        let mut whole = StoreState::new(VOLUME_SECTORS * 512);
        let mut stepped = StoreState::new(VOLUME_SECTORS * 512);
        let mut model = SectorModel(vec![None; VOLUME_SECTORS as usize]);
        for seq in 1..=30 {
            let h = random_object(&mut rng, &whole, seq);
            model.apply(&h);
            whole.apply(&h).expect("apply at once");
            model.assert_is(&whole, &format!("seed {seed} object {seq}, at once"));
            let budget = 1 + rng.below(8) as usize;
            stepped.begin_apply(h.clone()).expect("begin");
            let mut released = Vec::new();
            let done = loop {
                // Every intermediate state: exact accounting, the object neither dead
                // nor a victim, and no sequence advance a checkpoint could capture.
                assert_accounting_exact(&stepped);
                assert_eq!(stepped.applying_seq(), Some(seq));
                assert_eq!(stepped.next_object_seq(), seq);
                assert!(!stepped.dead_objects().contains(&seq));
                let cfg = GcConfig::default();
                assert!(!select_victims(&stepped, &cfg, seq, |_| false).contains(&seq));
                let before = released.len();
                let done = stepped.apply_step(budget, |lba, n, last| released.push((lba, n, last)));
                // What a step reports, the engine stops reading from the write log:
                // the store map must already hold its final version there (a trim
                // slice reported before the object's extent over it was applied made
                // a read return zeros for an acknowledged write).
                for &(lba, n, _) in &released[before..] {
                    model.assert_range_is(&stepped, lba, n, &format!("seed {seed} object {seq}"));
                }
                if let Some(done) = done {
                    break done;
                }
            };
            assert_eq!(done, h);
            assert_eq!(stepped.applying_seq(), None);
            assert_eq!(stepped.next_object_seq(), seq + 1);
            assert_eq!(stepped.last_record_seq(), seq * 10);
            // Everything the object covers was reported, with its record sequence.
            let mut reported = vec![false; VOLUME_SECTORS as usize];
            for &(lba, n, _) in &released {
                reported[lba as usize..(lba + n) as usize].fill(true);
            }
            let mut covered = vec![false; VOLUME_SECTORS as usize];
            let ranges = h.extents.iter().map(|e| (e.lba, e.sectors as u64));
            for (lba, n) in ranges.chain(h.trims.iter().copied()) {
                covered[lba as usize..(lba + n) as usize].fill(true);
            }
            assert!(reported == covered, "seed {seed} object {seq}");
            assert!(released.iter().all(|r| r.2 == seq * 10));
            model.assert_is(&stepped, &format!("seed {seed} object {seq}, in steps"));
            assert_eq!(
                stepped.map().iter().collect::<Vec<_>>(),
                whole.map().iter().collect::<Vec<_>>(),
                "seed {seed} object {seq}"
            );
            assert_eq!(
                stepped.objects(),
                whole.objects(),
                "seed {seed} object {seq}"
            );
            assert_accounting_exact(&stepped);
        }
    }
}

#[test]
fn one_object_at_a_time() {
    let mut s = StoreState::new(VOLUME_SECTORS * 512);
    s.begin_apply(header(ObjectKind::Data, 1, &[ext(0, 8), ext(16, 8)], &[]))
        .expect("begin");
    assert_eq!(s.apply_step(1, |_, _, _| {}), None);
    let err = s
        .begin_apply(header(ObjectKind::Data, 2, &[ext(0, 8)], &[]))
        .expect_err("second object while the first is in progress");
    assert_eq!(
        err,
        ApplyError::OutOfOrder {
            expected: 1,
            got: 2
        }
    );
    assert!(s.apply_step(1, |_, _, _| {}).is_some());
    s.apply(&header(ObjectKind::Data, 2, &[ext(0, 8)], &[]))
        .expect("in order once the first is done");
    assert_eq!(s.objects()[&1].live_bytes, 8 * 512);
    // With nothing in progress, a step does nothing.
    assert_eq!(s.apply_step(10, |_, _, _| panic!("nothing to apply")), None);
}

#[test]
fn a_large_trim_is_applied_in_slices() {
    let mut s = StoreState::new(VOLUME_SECTORS * 512);
    let extents: Vec<ObjectExtent> = (0..VOLUME_SECTORS / 16).map(|i| ext(i * 16, 8)).collect();
    s.apply(&header(ObjectKind::Data, 1, &extents, &[]))
        .expect("apply");
    s.begin_apply(header(ObjectKind::Data, 2, &[], &[(0, VOLUME_SECTORS)]))
        .expect("begin");
    let mut steps = 0;
    while s.apply_step(64, |_, _, _| {}).is_none() {
        steps += 1;
        assert_accounting_exact(&s);
    }
    // One slice of the trim per step once the budget is spent: two slices.
    assert_eq!(steps, VOLUME_SECTORS / TRIM_SLICE_SECTORS - 1);
    assert_eq!(s.map().mapped_sectors(), 0);
    assert_eq!(s.objects()[&1].live_bytes, 0);
}

#[test]
fn gaps_leave_out_covered_sectors() {
    let cover = merged_ranges([(40, 48), (10, 20), (15, 25), (60, 70)].into_iter());
    assert_eq!(cover, vec![(10, 25), (40, 48), (60, 70)]);
    let gaps = |lba, n| {
        let mut v = Vec::new();
        for_each_gap(&cover, lba, n, |l, s| v.push((l, s)));
        v
    };
    assert_eq!(gaps(0, 80), vec![(0, 10), (25, 15), (48, 12), (70, 10)]);
    assert_eq!(gaps(12, 5), vec![]);
    assert_eq!(gaps(20, 30), vec![(25, 15), (48, 2)]);
    assert_eq!(gaps(0, 5), vec![(0, 5)]);
    assert_eq!(gaps(70, 3), vec![(70, 3)]);
    assert_eq!(gaps(65, 10), vec![(70, 5)]);
    let mut none = Vec::new();
    for_each_gap(&[], 5, 3, |l, s| none.push((l, s)));
    assert_eq!(none, vec![(5, 3)]);
}

/// The crash oracle's failure: an object zeroes sectors 7464+80 (an older record) and
/// writes sector 7512 (a newer one). Applied in steps, the trim slice must not release
/// the write-log copy of 7512 before the extent over it is in the store map, or a read
/// between the two steps returns zeros for an acknowledged write.
#[test]
fn a_write_inside_a_trim_of_the_same_object_stays_readable_between_steps() {
    let mut s = StoreState::new(VOLUME_SECTORS * 512);
    let old: Vec<ObjectExtent> = (0..20).map(|i| ext(7464 + i * 4, 4)).collect();
    s.apply(&header(ObjectKind::Data, 1, &old, &[]))
        .expect("apply");
    let mut log = crate::log_map::LogMap::new();
    log.zero(7464, 80, 15);
    log.write(7512, 8, 16, 4096);
    s.begin_apply(header(ObjectKind::Data, 2, &[ext(7512, 8)], &[(7464, 80)]))
        .expect("begin");
    // A budget of 1: the trim (which displaces 20 entries) is a step of its own.
    let read_7512 = |s: &StoreState, log: &crate::log_map::LogMap| {
        if log.lookup(7512, 1)[0].location.is_some() {
            "log"
        } else if s.map().lookup(7512, 1)[0].location.is_some() {
            "store"
        } else {
            "zeros"
        }
    };
    let mut steps = 0;
    while s
        .apply_step(1, |lba, n, last| log.release(lba, n, last))
        .is_none()
    {
        steps += 1;
        assert_ne!(read_7512(&s, &log), "zeros", "after step {steps}");
    }
    assert_eq!(steps, 1, "the trim and the extent were separate steps");
    assert_eq!(read_7512(&s, &log), "store");
    assert_eq!(
        log.extent_count(),
        0,
        "everything the object holds was released"
    );
}

fn resize(seq: u64, size_bytes: u64, trims: &[(u64, u64)]) -> ObjectHeader {
    let mut h = header(ObjectKind::Data, seq, &[], trims);
    // Re-encode as version 2 by hand is the codec's test; here only the field matters.
    h.volume_size_bytes = Some(size_bytes);
    h
}

#[test]
fn a_resize_changes_the_size_where_it_applies() {
    let mut s = StoreState::new(VOLUME_SECTORS * 512);
    let past_end = header(ObjectKind::Data, 1, &[ext(VOLUME_SECTORS, 8)], &[]);
    assert_eq!(
        s.apply(&past_end),
        Err(ApplyError::BeyondVolume {
            object_seq: 1,
            lba: VOLUME_SECTORS
        })
    );
    s.apply(&resize(1, 2 * VOLUME_SECTORS * 512, &[]))
        .expect("grow");
    assert_eq!(s.volume_size_bytes, 2 * VOLUME_SECTORS * 512);
    s.apply(&header(
        ObjectKind::Data,
        2,
        &[ext(0, 8), ext(VOLUME_SECTORS, 8)],
        &[],
    ))
    .expect("a write past the old end");
    // A checkpoint carries the size.
    let c = s.to_checkpoint(false, Default::default());
    let back = StoreState::from_checkpoint(3, 0, &c).expect("loads");
    assert_eq!(back.volume_size_bytes, 2 * VOLUME_SECTORS * 512);

    // A shrink must trim what it cuts off.
    let err = s
        .apply(&resize(3, VOLUME_SECTORS * 512, &[]))
        .expect_err("no trim");
    assert_eq!(
        err,
        ApplyError::ShrinkWithoutTrim {
            object_seq: 3,
            size_bytes: VOLUME_SECTORS * 512
        }
    );
    s.apply(&resize(
        3,
        VOLUME_SECTORS * 512,
        &[(VOLUME_SECTORS, VOLUME_SECTORS)],
    ))
    .expect("shrink");
    assert_eq!(s.volume_size_bytes, VOLUME_SECTORS * 512);
    assert_eq!(s.map().mapped_sectors(), 8);
    assert_accounting_exact(&s);
    // A GC object planned before the shrink may still name data past the end: it
    // applies nowhere there.
    let gc = ObjectExtent {
        lba: VOLUME_SECTORS,
        sectors: 8,
        source: Some(crate::format::object::ExtentSource {
            object_seq: 2,
            object_offset: 0,
        }),
    };
    s.apply(&header(ObjectKind::Gc, 4, &[gc], &[]))
        .expect("a stale GC extent past the end");
    assert_eq!(s.map().mapped_sectors(), 8);
    assert_accounting_exact(&s);
}

/// A header whose extents overlap each other (lsvd never writes one, but a header read
/// from the store is input): the later extent wins, the object's live bytes are what
/// the map holds of it, and applying it does not underflow its count (a panic before
/// the fix, at once and step by step).
#[test]
fn an_object_overwriting_its_own_extents_keeps_exact_accounting() {
    let extents = [ext(0, 16), ext(8, 16), ext(4, 2), ext(100, 8)];
    for max_pieces in [1, 2, usize::MAX] {
        let mut s = StoreState::new(VOLUME_SECTORS * 512);
        s.apply(&header(ObjectKind::Data, 1, &[ext(0, 64)], &[]))
            .expect("apply");
        let h = header(ObjectKind::Data, 2, &extents, &[]);
        let mut model = SectorModel(vec![None; VOLUME_SECTORS as usize]);
        model.apply(&header(ObjectKind::Data, 1, &[ext(0, 64)], &[]));
        model.apply(&h);
        s.begin_apply(h).expect("in order");
        while s.apply_step(max_pieces, |_, _, _| {}).is_none() {}
        model.assert_is(&s, "after applying");
        assert_accounting_exact(&s);
        assert_eq!(s.objects()[&2].live_bytes, (24 + 8) * 512);
    }
}
