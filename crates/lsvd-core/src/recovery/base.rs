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

use std::collections::BTreeSet;

use super::ListedObject;

/// One step of the replay after the base checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read the object's header and apply it.
    Apply(u64),
    /// A checkpoint passed over (unreadable or missing): its number is used, nothing
    /// is applied.
    Skip(u64),
}

/// Where recovery starts and what it replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The checkpoint to load, `None` to start from an empty volume.
    pub checkpoint: Option<u64>,
    /// The objects after it, in sequence order, up to the first gap.
    pub steps: Vec<Step>,
    /// Newer checkpoints passed over, newest first (the operator is warned about each).
    pub skipped: Vec<u64>,
    /// Listed objects past the first gap.
    pub stranded: Vec<u64>,
    /// Checkpoints were skipped, and the replay stops at this missing object before
    /// it has passed the newest of them: objects that checkpoint covered are gone.
    pub short_of: Option<u64>,
}

/// The choice of base over one listing.
#[derive(Debug, Clone)]
pub struct BaseChooser {
    /// Every listed sequence number, sorted.
    seqs: Vec<u64>,
    /// Listed checkpoints and checkpoints the volume superblock names, newest first.
    candidates: Vec<u64>,
    /// Named checkpoints the listing lacks.
    missing: BTreeSet<u64>,
}

impl BaseChooser {
    /// `named_checkpoints`: the checkpoints the newest volume superblock names (newest
    /// and previous); those not listed count as missing.
    pub fn new(listed: &[ListedObject], named_checkpoints: &[u64]) -> BaseChooser {
        let mut seqs: Vec<u64> = listed.iter().map(|o| o.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let listed_seqs: BTreeSet<u64> = seqs.iter().copied().collect();
        let missing: BTreeSet<u64> = named_checkpoints
            .iter()
            .copied()
            .filter(|s| !listed_seqs.contains(s))
            .collect();
        let mut candidates: Vec<u64> = listed
            .iter()
            .filter(|o| o.is_checkpoint)
            .map(|o| o.seq)
            .chain(missing.iter().copied())
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        BaseChooser {
            seqs,
            candidates,
            missing,
        }
    }

    /// The next checkpoint to read: the newest that is listed and not in `failed`.
    /// `None`: start without a checkpoint.
    pub fn next_candidate(&self, failed: &[u64]) -> Option<u64> {
        self.candidates
            .iter()
            .copied()
            .find(|c| !self.missing.contains(c) && !failed.contains(c))
    }

    /// Is `seq` a checkpoint the volume superblock names that the listing lacks?
    pub fn is_missing(&self, seq: u64) -> bool {
        self.missing.contains(&seq)
    }

    /// Every checkpoint, newest first (listed, and named but missing).
    pub fn candidates(&self) -> &[u64] {
        &self.candidates
    }

    /// Start from `checkpoint` (one that was read and verified, or `None`), passing
    /// over every newer candidate.
    pub fn base(&self, checkpoint: Option<u64>) -> Base {
        let skipped: Vec<u64> = self
            .candidates
            .iter()
            .copied()
            .filter(|&c| checkpoint.is_none_or(|b| c > b))
            .collect();
        let skip: BTreeSet<u64> = skipped.iter().copied().collect();
        let listed: BTreeSet<u64> = self.seqs.iter().copied().collect();
        let mut steps = Vec::new();
        let mut next = checkpoint.map_or(1, |c| c.saturating_add(1));
        loop {
            if skip.contains(&next) {
                steps.push(Step::Skip(next));
            } else if listed.contains(&next) {
                steps.push(Step::Apply(next));
            } else {
                break;
            }
            match next.checked_add(1) {
                Some(n) => next = n,
                None => break,
            }
        }
        let end = next;
        let stranded = self.seqs.iter().copied().filter(|&s| s >= end).collect();
        let short_of = skipped
            .first()
            .filter(|&&newest| end <= newest)
            .map(|_| end);
        Base {
            checkpoint,
            steps,
            skipped,
            stranded,
            short_of,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(seq: u64) -> ListedObject {
        ListedObject {
            seq,
            is_checkpoint: false,
        }
    }
    fn ckpt(seq: u64) -> ListedObject {
        ListedObject {
            seq,
            is_checkpoint: true,
        }
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
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4]);
        assert_eq!(c.next_candidate(&[]), Some(7));
        let b = c.base(Some(7));
        assert_eq!(b.steps, vec![Step::Apply(8), Step::Apply(9)]);
        assert!(b.skipped.is_empty() && b.stranded.is_empty() && b.short_of.is_none());
    }

    #[test]
    fn a_corrupt_newest_checkpoint_falls_back_to_the_previous() {
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4]);
        assert_eq!(c.next_candidate(&[7]), Some(4));
        let b = c.base(Some(4));
        assert_eq!(b.skipped, vec![7]);
        assert_eq!(
            b.steps,
            vec![
                Step::Apply(5),
                Step::Apply(6),
                Step::Skip(7),
                Step::Apply(8),
                Step::Apply(9)
            ]
        );
        assert!(b.stranded.is_empty());
        assert_eq!(b.short_of, None);
    }

    #[test]
    fn a_missing_newest_checkpoint_is_bridged_when_the_superblock_names_it() {
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 7);
        let c = BaseChooser::new(&listed, &[7, 4]);
        assert!(c.is_missing(7));
        assert_eq!(c.next_candidate(&[]), Some(4), "7 cannot be read");
        let b = c.base(Some(4));
        assert_eq!(b.skipped, vec![7]);
        assert_eq!(b.steps[2], Step::Skip(7));
        assert_eq!(b.steps.len(), 5);
        assert_eq!(b.short_of, None);
        // Unnamed, the hole at 7 is a gap like any other: 8 and 9 are stranded.
        let c = BaseChooser::new(&listed, &[]);
        let b = c.base(c.next_candidate(&[]));
        assert_eq!(b.checkpoint, Some(4));
        assert!(b.skipped.is_empty());
        assert_eq!(b.stranded, vec![8, 9]);
        assert_eq!(b.short_of, None, "nothing was skipped");
    }

    #[test]
    fn a_fallback_that_cannot_reach_the_skipped_checkpoint_is_short() {
        // Object 5 held no live data at checkpoint 7 and was deleted after it.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 5);
        let c = BaseChooser::new(&listed, &[7, 4]);
        let b = c.base(Some(4));
        assert_eq!(b.steps, vec![]);
        assert_eq!(b.short_of, Some(5));
        assert_eq!(b.stranded, vec![6, 7, 8, 9]);
        // A gap after the skipped checkpoint is an ordinary gap.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 9);
        listed.push(obj(10));
        let b = BaseChooser::new(&listed, &[7, 4]).base(Some(4));
        assert_eq!(b.short_of, None);
        assert_eq!(b.stranded, vec![10]);
    }

    #[test]
    fn every_checkpoint_bad_starts_from_nothing() {
        let c = BaseChooser::new(&two_checkpoints(), &[7, 4]);
        assert_eq!(c.next_candidate(&[7, 4]), None);
        let b = c.base(None);
        assert_eq!(b.skipped, vec![7, 4]);
        assert_eq!(b.steps.len(), 9);
        assert_eq!(b.steps[3], Step::Skip(4));
        assert_eq!(b.short_of, None);
        // With object 1 garbage-collected long ago, nothing can be recovered.
        let mut listed = two_checkpoints();
        listed.retain(|o| o.seq != 1);
        let b = BaseChooser::new(&listed, &[7, 4]).base(None);
        assert_eq!(b.short_of, Some(1));
    }

    #[test]
    fn an_empty_store_has_an_empty_base() {
        let c = BaseChooser::new(&[], &[]);
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
            let c = BaseChooser::new(&listed, &[]);
            let b = c.base(c.next_candidate(&[]));
            assert_eq!(b.checkpoint, plan.checkpoint_candidates.first().copied());
            let applied: Vec<u64> = b
                .steps
                .iter()
                .map(|s| match s {
                    Step::Apply(x) | Step::Skip(x) => *x,
                })
                .collect();
            let want = if b.checkpoint.is_some() {
                plan.replay_after[0].clone()
            } else {
                plan.replay_after.last().cloned().unwrap_or_default()
            };
            assert_eq!(applied, want, "{listed:?}");
            assert_eq!(b.stranded, plan.stranded, "{listed:?}");
        }
    }
}
