//! Recovery planning: which objects in the store form the volume, and which are
//! stranded past a gap.
//!
//! The rule (LSVD section 3.3): start from the newest checkpoint and take the longest
//! run of consecutive sequence numbers after it. Objects after the first gap were
//! uploaded out of order while an earlier upload never landed; replaying them would
//! break prefix consistency, so they are stranded and must be deleted before the
//! volume accepts a new write (a later object with the same sequence number would
//! otherwise be ambiguous).

/// What a listing says about one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListedObject {
    pub seq: u64,
    pub is_checkpoint: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Checkpoints to try, newest first; the first valid one is the base. If none is
    /// valid, replay starts from sequence 1 with an empty volume.
    pub checkpoint_candidates: Vec<u64>,
    /// For each candidate base (same order, then the no-checkpoint case last): the
    /// objects to replay after it, in order.
    pub replay_after: Vec<Vec<u64>>,
    /// Objects past the first gap after the newest checkpoint.
    pub stranded: Vec<u64>,
}

/// The consecutive run of sequence numbers starting at `start`, from sorted `seqs`.
fn run_from(seqs: &[u64], start: u64) -> Vec<u64> {
    let from = seqs.partition_point(|&s| s < start);
    seqs[from..]
        .iter()
        .zip(start..)
        .take_while(|(s, expect)| **s == *expect)
        .map(|(s, _)| *s)
        .collect()
}

pub fn plan_recovery(listed: &[ListedObject]) -> RecoveryPlan {
    let mut seqs: Vec<u64> = listed.iter().map(|o| o.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let mut checkpoints: Vec<u64> = listed
        .iter()
        .filter(|o| o.is_checkpoint)
        .map(|o| o.seq)
        .collect();
    checkpoints.sort_unstable_by(|a, b| b.cmp(a));
    checkpoints.dedup();
    let mut replay_after: Vec<Vec<u64>> = checkpoints
        .iter()
        .map(|&c| run_from(&seqs, c + 1))
        .collect();
    replay_after.push(run_from(&seqs, 1));
    let end_of_run = match checkpoints.first() {
        Some(&c) => c + 1 + replay_after[0].len() as u64,
        None => 1 + replay_after[replay_after.len() - 1].len() as u64,
    };
    let stranded = seqs.iter().copied().filter(|&s| s >= end_of_run).collect();
    RecoveryPlan {
        checkpoint_candidates: checkpoints,
        replay_after,
        stranded,
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

    #[test]
    fn stops_at_first_gap() {
        let p = plan_recovery(&[obj(1), obj(2), obj(3), obj(5), obj(6)]);
        assert!(p.checkpoint_candidates.is_empty());
        assert_eq!(p.replay_after, vec![vec![1, 2, 3]]);
        assert_eq!(p.stranded, vec![5, 6]);
    }

    #[test]
    fn starts_at_newest_checkpoint_and_ignores_old_gaps() {
        // 2 and 3 were garbage collected; checkpoint 7 covers everything below it.
        let p = plan_recovery(&[
            obj(1),
            obj(4),
            obj(5),
            obj(6),
            ckpt(7),
            obj(8),
            obj(9),
            obj(11),
        ]);
        assert_eq!(p.checkpoint_candidates, vec![7]);
        assert_eq!(p.replay_after[0], vec![8, 9]);
        assert_eq!(p.stranded, vec![11]);
    }

    #[test]
    fn empty_store() {
        let p = plan_recovery(&[]);
        assert_eq!(p.replay_after, vec![Vec::<u64>::new()]);
        assert!(p.stranded.is_empty());
    }

    #[test]
    fn missing_first_object_strands_everything_without_checkpoint() {
        let p = plan_recovery(&[obj(2), obj(3)]);
        assert_eq!(p.replay_after, vec![Vec::<u64>::new()]);
        assert_eq!(p.stranded, vec![2, 3]);
    }
}
