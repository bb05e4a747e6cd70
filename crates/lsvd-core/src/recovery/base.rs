//! Which checkpoint recovery starts from when the newest cannot be read.
//!
//! Why: the store keeps the newest two checkpoints, and a checkpoint only summarises
//! the objects before it, so when the newest checkpoint is corrupt (its checksums fail)
//! or missing (the volume superblock names it but the listing lacks it), the previous
//! one, replayed forward through every object after it, gives the same volume. This
//! module makes that choice over sequence numbers; the engine reads the checkpoints.
//!
//! The engine asks [`BaseChooser::next_candidate`] which checkpoint to read, newest
//! first; one that fails its checks is added to the failed list and the next is
//! tried; once one reads (or none is left) [`BaseChooser::base`] says what to replay.
//! Checkpoints passed over are [`Step::Skip`]ped in the replay: a checkpoint changes
//! nothing in the map, so stepping over its number gives the same state.
//!
//! The fallback is complete only if every object between the older checkpoint and
//! the newest skipped one is still in the store. Objects that held no live data when
//! a checkpoint was written are deleted once it is named, so a corrupt newest
//! checkpoint can leave the run from the previous one short; [`Base::short_of`] names
//! the first missing object, and the engine then refuses in strict mode (those
//! objects were acknowledged) or keeps the prefix in accept-prefix mode.

use std::collections::{BTreeMap, BTreeSet};

use super::ListedObject;
use crate::history::{History, Owner};

/// One step of the replay after the base checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read the header of the object with this sequence number and epoch, and apply
    /// it.
    Apply(u64, u64),
    /// A checkpoint passed over (unreadable or missing): its number is used, nothing
    /// is applied.
    Skip(u64),
    /// The history jumps to this sequence number: a claim numbered its objects past
    /// every number in the store (the numbers in between belong to no object of the
    /// history).
    Jump(u64),
}

/// Where recovery starts and what it replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The checkpoint to load (sequence number, epoch), `None` to start from an
    /// empty volume.
    pub checkpoint: Option<(u64, u64)>,
    /// The objects after it, in sequence order, up to the first gap.
    pub steps: Vec<Step>,
    /// Newer checkpoints passed over, newest first (the operator is warned about each).
    pub skipped: Vec<u64>,
    /// Listed objects after the base that are not part of the history: past the first
    /// gap, in a hole the history jumps over, or of another epoch than the one that
    /// owns their number (a superseded writer's). `(seq, epoch)`.
    pub stranded: Vec<(u64, u64)>,
    /// Checkpoints were skipped, and the replay stops at this missing object before
    /// it has passed the newest of them: objects that checkpoint covered are gone.
    pub short_of: Option<u64>,
    /// The replay stops at this missing object although a later claim recovered
    /// past it (the history vouches for it): the store lost an object.
    pub vouched_missing: Option<u64>,
}

/// The choice of base over one listing.
#[derive(Debug, Clone)]
pub struct BaseChooser {
    /// Every listed object: sequence number -> the epochs listed with it (and
    /// whether that one is a checkpoint).
    listed: BTreeMap<u64, Vec<(u64, bool)>>,
    /// Listed checkpoints and checkpoints the volume superblock names, newest first,
    /// with the epoch of the one that counts.
    candidates: Vec<(u64, u64)>,
    /// Named checkpoints the listing lacks.
    missing: BTreeSet<u64>,
    history: History,
}

impl BaseChooser {
    /// `named_checkpoints`: the checkpoints the newest volume superblock names (newest
    /// and previous); those not listed (with the epoch `history` gives them) count as
    /// missing. `history`: which epoch owns which number (the superblock's).
    pub fn new(
        listed: &[ListedObject],
        named_checkpoints: &[u64],
        history: &History,
    ) -> BaseChooser {
        let mut by_seq: BTreeMap<u64, Vec<(u64, bool)>> = BTreeMap::new();
        for o in listed {
            let at = by_seq.entry(o.seq).or_default();
            if !at.iter().any(|&(e, _)| e == o.epoch) {
                at.push((o.epoch, o.is_checkpoint));
            }
        }
        let mut chooser = BaseChooser {
            listed: by_seq,
            candidates: Vec::new(),
            missing: BTreeSet::new(),
            history: history.clone(),
        };
        for &c in named_checkpoints {
            match history.owner(c) {
                Owner::Epoch(e) if chooser.is_listed(c, e) => {}
                Owner::Epoch(e) => {
                    chooser.missing.insert(c);
                    chooser.candidates.push((c, e));
                }
                _ => {}
            }
        }
        let listed_checkpoints: Vec<(u64, u64)> = chooser
            .listed
            .keys()
            .filter_map(|&seq| chooser.history_object(seq).map(|e| (seq, e)))
            .filter(|&(seq, e)| chooser.is_checkpoint(seq, e))
            .collect();
        chooser.candidates.extend(listed_checkpoints);
        chooser.candidates.sort_unstable_by(|a, b| b.cmp(a));
        chooser.candidates.dedup_by_key(|c| c.0);
        chooser
    }

    fn is_listed(&self, seq: u64, epoch: u64) -> bool {
        self.listed
            .get(&seq)
            .is_some_and(|v| v.iter().any(|&(e, _)| e == epoch))
    }

    fn is_checkpoint(&self, seq: u64, epoch: u64) -> bool {
        self.listed
            .get(&seq)
            .is_some_and(|v| v.iter().any(|&(e, c)| e == epoch && c))
    }

    /// The epoch of the listed object that is the history's object `seq`, if one is
    /// listed: the owner's, where the history says; below what it describes, the
    /// only one listed (several are ambiguous: none).
    fn history_object(&self, seq: u64) -> Option<u64> {
        let at = self.listed.get(&seq)?;
        match self.history.owner(seq) {
            Owner::Epoch(e) => at.iter().any(|&(x, _)| x == e).then_some(e),
            Owner::Hole { .. } => None,
            Owner::Unknown => match at.as_slice() {
                [(e, _)] => Some(*e),
                _ => None,
            },
        }
    }

    /// The next checkpoint to read (sequence number, epoch): the newest that is
    /// listed and not in `failed`. `None`: start without a checkpoint.
    pub fn next_candidate(&self, failed: &[u64]) -> Option<(u64, u64)> {
        self.candidates
            .iter()
            .copied()
            .find(|(c, _)| !self.missing.contains(c) && !failed.contains(c))
    }

    /// Is `seq` a checkpoint the volume superblock names that the listing lacks?
    pub fn is_missing(&self, seq: u64) -> bool {
        self.missing.contains(&seq)
    }

    /// Every checkpoint, newest first (listed, and named but missing), with its epoch.
    pub fn candidates(&self) -> &[(u64, u64)] {
        &self.candidates
    }

    /// Start from `checkpoint` (one that was read and verified, or `None`), passing
    /// over every newer candidate.
    pub fn base(&self, checkpoint: Option<u64>) -> Base {
        let skipped: Vec<u64> = self
            .candidates
            .iter()
            .map(|c| c.0)
            .filter(|&c| checkpoint.is_none_or(|b| c > b))
            .collect();
        let skip: BTreeSet<u64> = skipped.iter().copied().collect();
        let mut steps = Vec::new();
        let mut applied: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut next = checkpoint.map_or(1, |c| c.saturating_add(1));
        loop {
            if let Owner::Hole { resumes_at } = self.history.owner(next) {
                steps.push(Step::Jump(resumes_at));
                next = resumes_at;
                continue;
            }
            if skip.contains(&next) {
                steps.push(Step::Skip(next));
            } else if let Some(e) = self.history_object(next) {
                steps.push(Step::Apply(next, e));
                applied.insert((next, e));
            } else {
                break;
            }
            match next.checked_add(1) {
                Some(n) => next = n,
                None => break,
            }
        }
        let end = next;
        let after_base = |s: u64| checkpoint.is_none_or(|b| s > b);
        let stranded = self
            .listed
            .iter()
            .filter(|&(&s, _)| after_base(s))
            .flat_map(|(&s, v)| v.iter().map(move |&(e, _)| (s, e)))
            .filter(|o| !applied.contains(o) && !skip.contains(&o.0))
            .collect();
        let short_of = skipped
            .first()
            .filter(|&&newest| end <= newest)
            .map(|_| end);
        let vouched_missing = self.history.vouched(end).then_some(end);
        Base {
            checkpoint: checkpoint.and_then(|c| {
                self.candidates
                    .iter()
                    .find(|x| x.0 == c)
                    .copied()
                    .or_else(|| self.history_object(c).map(|e| (c, e)))
            }),
            steps,
            skipped,
            stranded,
            short_of,
            vouched_missing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::recovery::tests::{ckpt, obj};
    use Step::{Apply, Jump, Skip};

    fn legacy() -> History {
        History::legacy()
    }

    /// Objects 1..=3, checkpoint 4, objects 5..=6, checkpoint 7, objects 8..=9.
    fn two_checkpoints() -> Vec<ListedObject> {
        vec![
            obj(1),
            obj(2),
            obj(3),
            ckpt(4),
            obj(5),
            obj(6),
            ckpt(7),
            obj(8),
            obj(9),
        ]
    }

    #[test]
    fn the_newest_valid_checkpoint_is_the_base() {
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4], &legacy());
        assert_eq!(c.next_candidate(&[]), Some((7, 0)));
        let b = c.base(Some(7));
        assert_eq!(b.steps, vec![Apply(8, 0), Apply(9, 0)]);
        assert!(b.skipped.is_empty() && b.stranded.is_empty() && b.short_of.is_none());
    }

    #[test]
    fn a_corrupt_newest_checkpoint_falls_back_to_the_previous() {
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4], &legacy());
        assert_eq!(c.next_candidate(&[7]), Some((4, 0)));
        let b = c.base(Some(4));
        assert_eq!(b.skipped, vec![7]);
        assert_eq!(
            b.steps,
            vec![Apply(5, 0), Apply(6, 0), Skip(7), Apply(8, 0), Apply(9, 0)]
        );
        assert!(b.stranded.is_empty());
        assert_eq!(b.short_of, None);
    }

    #[test]
    fn a_missing_newest_checkpoint_is_bridged_when_the_superblock_names_it() {
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 7);
        let c = BaseChooser::new(&listed, &[7, 4], &legacy());
        assert!(c.is_missing(7));
        assert_eq!(c.next_candidate(&[]), Some((4, 0)), "7 cannot be read");
        let b = c.base(Some(4));
        assert_eq!(b.skipped, vec![7]);
        assert_eq!(b.steps[2], Skip(7));
        assert_eq!(b.steps.len(), 5);
        assert_eq!(b.short_of, None);
        // Unnamed, the hole at 7 is a gap like any other: 8 and 9 are stranded.
        let c = BaseChooser::new(&listed, &[], &legacy());
        let b = c.base(c.next_candidate(&[]).map(|c| c.0));
        assert_eq!(b.checkpoint, Some((4, 0)));
        assert!(b.skipped.is_empty());
        assert_eq!(b.stranded, vec![(8, 0), (9, 0)]);
        assert_eq!(b.short_of, None, "nothing was skipped");
    }

    #[test]
    fn a_fallback_that_cannot_reach_the_skipped_checkpoint_is_short() {
        // Object 5 held no live data at checkpoint 7 and was deleted after it.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 5);
        let c = BaseChooser::new(&listed, &[7, 4], &legacy());
        let b = c.base(Some(4));
        assert_eq!(b.steps, vec![]);
        assert_eq!(b.short_of, Some(5));
        assert_eq!(b.stranded, vec![(6, 0), (8, 0), (9, 0)]);
        // A gap after the skipped checkpoint is an ordinary gap.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 9);
        listed.push(obj(10));
        let b = BaseChooser::new(&listed, &[7, 4], &legacy()).base(Some(4));
        assert_eq!(b.short_of, None);
        assert_eq!(b.stranded, vec![(10, 0)]);
    }

    #[test]
    fn every_checkpoint_bad_starts_from_nothing() {
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4], &legacy());
        assert_eq!(c.next_candidate(&[7, 4]), None);
        let b = c.base(None);
        assert_eq!(b.skipped, vec![7, 4]);
        assert_eq!(b.steps.len(), 9);
        assert_eq!(b.steps[3], Skip(4));
        assert_eq!(b.short_of, None);
        // With object 1 garbage-collected long ago, nothing can be recovered.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 1);
        let b = BaseChooser::new(&listed, &[7, 4], &legacy()).base(None);
        assert_eq!(b.short_of, Some(1));
    }

    #[test]
    fn an_empty_store_has_an_empty_base() {
        let c = BaseChooser::new(&[], &[], &legacy());
        assert_eq!(c.next_candidate(&[]), None);
        let b = c.base(None);
        assert!(b.steps.is_empty() && b.stranded.is_empty() && b.short_of.is_none());
    }

    /// The same choice as `plan_recovery` whenever the newest checkpoint is valid.
    #[test]
    fn agrees_with_plan_recovery_when_nothing_is_skipped() {
        for listed in [
            two_checkpoints(),
            vec![obj(1), obj(2), obj(4)],
            vec![obj(1), ckpt(5), obj(6), obj(8), ckpt(9)],
            vec![ckpt(3), obj(4), obj(6)],
        ] {
            let plan = super::super::plan_recovery(&listed);
            let c = BaseChooser::new(&listed, &[], &legacy());
            let b = c.base(c.next_candidate(&[]).map(|c| c.0));
            assert_eq!(
                b.checkpoint.map(|c| c.0),
                plan.checkpoint_candidates.first().copied()
            );
            let applied: Vec<u64> = b
                .steps
                .iter()
                .map(|s| match s {
                    Apply(x, _) | Skip(x) | Jump(x) => *x,
                })
                .collect();
            let want = if b.checkpoint.is_some() {
                plan.replay_after[0].clone()
            } else {
                plan.replay_after.last().cloned().unwrap_or_default()
            };
            assert_eq!(applied, want, "{listed:?}");
            let stranded: Vec<u64> = b.stranded.iter().map(|s| s.0).collect();
            assert_eq!(stranded, plan.stranded, "{listed:?}");
        }
    }

    fn at(seq: u64, epoch: u64, is_checkpoint: bool) -> ListedObject {
        ListedObject {
            seq,
            epoch,
            is_checkpoint,
        }
    }

    /// A history from `from_seq` of `(first_seq, epoch, after_seq)` segments.
    fn history(from_seq: u64, segments: &[(u64, u64, u64)]) -> History {
        History {
            from_seq,
            segments: segments
                .iter()
                .map(|&(first_seq, epoch, after_seq)| crate::history::Segment {
                    first_seq,
                    epoch,
                    after_seq,
                })
                .collect(),
        }
    }

    /// Epoch 1 wrote 1..=6 (checkpoint 4) and a stranded 8; epoch 2 recovered through
    /// 6 and numbered on from 9; a paused epoch-1 holder then landed 7 and 9 anyway.
    fn takeover() -> (Vec<ListedObject>, History) {
        let mut listed: Vec<ListedObject> = (1..=6).map(|s| at(s, 1, s == 4)).collect();
        listed.extend([
            at(7, 1, false),
            at(8, 1, false),
            at(9, 1, false),
            at(9, 2, false),
            at(10, 2, false),
            at(11, 2, true),
            at(12, 2, false),
        ]);
        (listed, history(0, &[(1, 1, 0), (9, 2, 6)]))
    }

    #[test]
    fn the_owning_epoch_is_the_history_and_the_rest_is_stranded() {
        let (listed, history) = takeover();
        let c = BaseChooser::new(&listed, &[11, 4], &history);
        assert_eq!(c.next_candidate(&[]), Some((11, 2)));
        let b = c.base(Some(11));
        assert_eq!(b.checkpoint, Some((11, 2)));
        assert_eq!(b.steps, vec![Apply(12, 2)]);
        assert!(
            b.stranded.is_empty(),
            "below the base: orphans, not stranded"
        );
        // From checkpoint 4: 5 and 6 of epoch 1, the jump, then epoch 2's own 9..12;
        // the superseded writer's 7, 8 and 9 are not the history.
        let b = c.base(Some(4));
        assert_eq!(
            b.steps,
            vec![
                Apply(5, 1),
                Apply(6, 1),
                Jump(9),
                Apply(9, 2),
                Apply(10, 2),
                Skip(11),
                Apply(12, 2),
            ]
        );
        assert_eq!(b.stranded, vec![(7, 1), (8, 1), (9, 1)]);
        assert_eq!((b.short_of, b.vouched_missing), (None, None));
    }

    #[test]
    fn an_object_a_later_claim_recovered_through_is_vouched_for() {
        let (mut listed, history) = takeover();
        listed.retain(|o| o.seq != 6);
        let b = BaseChooser::new(&listed, &[11, 4], &history).base(Some(4));
        assert_eq!(b.steps, vec![Apply(5, 1)]);
        assert_eq!(b.vouched_missing, Some(6));
        // The end of the newest claim's run is vouched for by nobody.
        let (mut listed, history) = takeover();
        listed.retain(|o| o.seq != 12);
        listed.push(at(13, 2, false));
        let b = BaseChooser::new(&listed, &[11, 4], &history).base(Some(11));
        assert_eq!((b.steps.len(), b.vouched_missing), (0, None));
        assert_eq!(b.stranded, vec![(13, 2)]);
    }

    #[test]
    fn a_named_checkpoint_of_another_epoch_than_its_owner_is_missing() {
        let (mut listed, history) = takeover();
        listed.retain(|o| o.seq != 11);
        listed.push(at(11, 1, true));
        let c = BaseChooser::new(&listed, &[11, 4], &history);
        assert!(
            c.is_missing(11),
            "epoch 2 owns 11; epoch 1's checkpoint is not it"
        );
        assert_eq!(c.next_candidate(&[]), Some((4, 1)));
        let b = c.base(Some(4));
        assert!(b.steps.contains(&Skip(11)));
    }

    #[test]
    fn below_what_the_history_describes_a_unique_object_counts() {
        let listed = vec![
            at(3, 1, true),
            at(4, 1, false),
            at(5, 2, false),
            at(5, 1, false),
        ];
        let history = history(5, &[(5, 2, 4)]);
        let c = BaseChooser::new(&listed, &[], &history);
        assert_eq!(c.next_candidate(&[]), Some((3, 1)));
        let b = c.base(Some(3));
        assert_eq!(b.steps, vec![Apply(4, 1), Apply(5, 2)]);
        assert_eq!(b.stranded, vec![(5, 1)]);
    }
}
