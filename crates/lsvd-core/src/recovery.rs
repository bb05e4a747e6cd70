//! Recovery planning at open: which objects in the store form the volume, and which
//! are stranded past a gap (the store side, [`plan_recovery`]); then what to do with
//! the write log given what the store holds (the log side, [`plan_log_recovery`]).
//!
//! Both are pure decisions over sequence numbers, kept apart from the engine's I/O so
//! every branch can be tested exhaustively and the simulator and the engine decide
//! alike.
//!
//! Store side. The rule (LSVD section 3.3): start from the newest valid checkpoint
//! ([`BaseChooser`] falls back past one that is corrupt or missing) and take
//! the longest run of consecutive sequence numbers after it. Objects after the first
//! gap were uploaded out of order while an earlier upload never landed; replaying them
//! would break prefix consistency, so they are stranded and must be deleted before the
//! volume accepts a new write (a later object with the same sequence number would
//! otherwise be ambiguous).
//!
//! Log side. The write log holds records the store may not have yet; the store's
//! objects say through which record they hold the log (`last_record_seq`). Records the
//! store already holds are skipped, the rest are replayed, and if the log and the store
//! do not meet (records in between are in neither), [`RecoveryMode`] decides: refuse,
//! or continue from what the store has and tell the operator what was lost.

use std::fmt;

mod base;
mod continuity;
mod parts;
pub use base::{Base, BaseChooser, Step};
pub use continuity::RecordContinuity;
pub use parts::PartGroup;

/// What a listing says about one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListedObject {
    pub seq: u64,
    /// The epoch in its name (0 for names without one: written before epochs).
    pub epoch: u64,
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

/// What to do when the store and the write log together cannot give back everything
/// that was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Refuse to start if anything acknowledged cannot be recovered.
    Strict,
    /// Start from the longest prefix that can be recovered, reporting what was lost.
    AcceptPrefix,
}

/// A non-empty run of consecutive record sequence numbers, `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRange {
    first: u64,
    last: u64,
}

impl SeqRange {
    /// The run `first..=last`, or `None` if `first > last` (an empty run).
    pub fn new(first: u64, last: u64) -> Option<SeqRange> {
        (first <= last).then_some(SeqRange { first, last })
    }
    pub fn first(&self) -> u64 {
        self.first
    }
    pub fn last(&self) -> u64 {
        self.last
    }
    pub fn contains(&self, seq: u64) -> bool {
        (self.first..=self.last).contains(&seq)
    }
    /// The sequence numbers of the run, in order.
    pub fn seqs(&self) -> std::ops::RangeInclusive<u64> {
        self.first..=self.last
    }
}

/// What the engine found at open, as sequence numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecoveryInput {
    /// The cache superblock's `tail_seq` (the first record the log still needed), or
    /// `None` if the cache has no superblock (a new or empty write log).
    pub cache_tail_seq: Option<u64>,
    /// The verified record chain followed from the superblock's tail: a consecutive
    /// run of sequence numbers, `None` if no record was found. The engine finds a chain
    /// only when a superblock exists; the plan treats the chain the same either way.
    pub chain: Option<SeqRange>,
    /// The last write-log record the store holds (`last_record_seq` of the newest
    /// applied object; 0 if none).
    pub store_last_record_seq: u64,
    /// The store's newest volume superblock was written by the session that last
    /// wrote this log (its session id is the log's epoch): nobody else has written
    /// the volume since, so the log's records the store has are still its newest
    /// versions of their blocks. Without it the log keeps none of them.
    pub store_last_written_by_this_log: bool,
    pub mode: RecoveryMode,
}

/// What to do with the write log at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecoveryPlan {
    /// Chain records to replay (apply to the map and batch again): those the store does
    /// not hold. When present it starts at `store_last_record_seq + 1` and ends at the
    /// chain's last record.
    pub replay: Option<SeqRange>,
    /// Chain records the store holds already (from the chain's first through the
    /// store's last record): the log keeps them, and reads of their data stay local,
    /// until it needs the space. None when records past a gap were dropped (the log
    /// and the store do not line up there, so nothing of the log is trusted for reads),
    /// when the chain ends before the store does (the store has newer records the log
    /// lost: a power failure before a sync), or when another session wrote the volume
    /// after this log's (`store_last_written_by_this_log`: a block it wrote since would
    /// read stale).
    pub keep: Option<SeqRange>,
    /// Accept-prefix only: records past a gap were dropped; upload an empty batch
    /// covering records through this one so the store and the log line up again.
    pub bridge_through: Option<u64>,
    /// Sequence number of the next record the log writer appends: one past both the
    /// chain and the store.
    pub next_record_seq: u64,
    /// What accept-prefix let through, for the operator. Empty in strict mode.
    pub warnings: Vec<LogRecoveryWarning>,
}

/// Data loss accept-prefix mode continued past. Each reads as one sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRecoveryWarning {
    /// The write log had released records (through `released_through`) that the store
    /// does not hold: objects the store acknowledged are missing.
    LogReleasedRecordsStoreLacks {
        store_last_record_seq: u64,
        released_through: u64,
    },
    /// The chain resumes past a gap after the store's last record; its records cannot
    /// be replayed in order, so they are dropped and bridged.
    RecordsPastGapDropped {
        store_last_record_seq: u64,
        dropped: SeqRange,
    },
}

impl fmt::Display for LogRecoveryWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogRecoveryWarning::LogReleasedRecordsStoreLacks {
                store_last_record_seq,
                released_through,
            } => write!(
                f,
                "the store holds records only through {store_last_record_seq}, but the write log had already released records up to {released_through}: objects the store acknowledged are missing, continuing from what the store has"
            ),
            LogRecoveryWarning::RecordsPastGapDropped {
                store_last_record_seq,
                dropped,
            } => {
                let missing = SeqRange::new(
                    store_last_record_seq.saturating_add(1),
                    dropped.first().saturating_sub(1),
                );
                write!(
                    f,
                    "write log resumes at record {} but the store ends at record {store_last_record_seq}: ",
                    dropped.first()
                )?;
                if let Some(missing) = missing {
                    let missing = Records(missing);
                    write!(f, "{missing} {} missing, so ", missing.verb())?;
                }
                let dropped = Records(*dropped);
                write!(f, "write-log {dropped} {} dropped", dropped.verb())
            }
        }
    }
}

/// "record 7" or "records 7 through 9", for messages.
struct Records(SeqRange);

impl Records {
    fn verb(&self) -> &'static str {
        if self.0.first == self.0.last {
            "is"
        } else {
            "are"
        }
    }
}

impl fmt::Display for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SeqRange { first, last } = self.0;
        if first == last {
            write!(f, "record {first}")
        } else {
            write!(f, "records {first} through {last}")
        }
    }
}

/// Why the log cannot be recovered as asked. Each reads as one sentence; the engine
/// adds how to continue anyway where that is possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRecoveryRefusal {
    /// Strict: the write log had released records (through `released_through`) that
    /// the store does not hold.
    LogReleasedRecordsStoreLacks {
        store_last_record_seq: u64,
        released_through: u64,
    },
    /// Strict: the records to replay do not start right after the store's last record.
    GapBetweenStoreAndLog {
        store_last_record_seq: u64,
        log_resumes_at: u64,
    },
    /// Either mode: the newest record (in the store or the log) has the largest
    /// sequence number there is, so no record can follow it.
    SequenceNumbersExhausted { last_seq: u64 },
}

impl fmt::Display for LogRecoveryRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogRecoveryRefusal::LogReleasedRecordsStoreLacks {
                store_last_record_seq,
                released_through,
            } => write!(
                f,
                "the store holds records only through {store_last_record_seq}, but the write log had already released records up to {released_through}: objects the store acknowledged are missing"
            ),
            LogRecoveryRefusal::GapBetweenStoreAndLog {
                store_last_record_seq,
                log_resumes_at,
            } => write!(
                f,
                "write log resumes at record {log_resumes_at} but the store ends at record {store_last_record_seq}: records are missing"
            ),
            LogRecoveryRefusal::SequenceNumbersExhausted { last_seq } => write!(
                f,
                "record sequence numbers are exhausted: the newest record is {last_seq}, and no record can follow it"
            ),
        }
    }
}

impl std::error::Error for LogRecoveryRefusal {}

/// Decide what to do with the write log at open (see [`LogRecoveryInput`] and
/// [`LogRecoveryPlan`]):
///
/// 1. If the superblock's tail is past `store_last_record_seq + 1`, the log released
///    records the store lacks: strict refuses, accept-prefix warns and goes on. Only
///    when this log's session wrote the store last: a log another session has
///    superseded released records into a history that is not the volume's any more
///    (what it held that the volume lacks is the engine's to refuse or discard).
/// 2. The chain's records after `store_last_record_seq` are the ones to replay; those
///    up to it are kept (the store has them; the log serves reads of them).
/// 3. If they do not start at `store_last_record_seq + 1`, records in between are in
///    neither: strict refuses; accept-prefix drops them, warns, and bridges through
///    the last of them.
/// 4. The next record is one past the larger of the chain's last record and the
///    store's last record (refused in either mode if there is none).
///
/// The input comes from disk: no arithmetic here can overflow.
pub fn plan_log_recovery(input: &LogRecoveryInput) -> Result<LogRecoveryPlan, LogRecoveryRefusal> {
    let store = input.store_last_record_seq;
    // None when the store holds u64::MAX: no sequence number comes after it.
    let store_next = store.checked_add(1);
    let mut warnings = Vec::new();

    if let (Some(tail), Some(expected)) = (input.cache_tail_seq, store_next)
        && tail > expected
        && input.store_last_written_by_this_log
    {
        let released_through = tail - 1;
        match input.mode {
            RecoveryMode::Strict => {
                return Err(LogRecoveryRefusal::LogReleasedRecordsStoreLacks {
                    store_last_record_seq: store,
                    released_through,
                });
            }
            RecoveryMode::AcceptPrefix => {
                warnings.push(LogRecoveryWarning::LogReleasedRecordsStoreLacks {
                    store_last_record_seq: store,
                    released_through,
                })
            }
        }
    }

    // The chain's records the store does not hold: after `store`, through its end.
    let mut replay = match (input.chain, store_next) {
        (Some(chain), Some(store_next)) => {
            SeqRange::new(chain.first().max(store_next), chain.last())
        }
        _ => None,
    };
    let mut bridge_through = None;
    if let Some(run) = replay
        && Some(run.first()) != store_next
    {
        match input.mode {
            RecoveryMode::Strict => {
                return Err(LogRecoveryRefusal::GapBetweenStoreAndLog {
                    store_last_record_seq: store,
                    log_resumes_at: run.first(),
                });
            }
            RecoveryMode::AcceptPrefix => {
                warnings.push(LogRecoveryWarning::RecordsPastGapDropped {
                    store_last_record_seq: store,
                    dropped: run,
                });
                bridge_through = Some(run.last());
                replay = None;
            }
        }
    }

    // Kept records must be the newest versions the store has of their blocks: every
    // record the store holds after the chain's first must be in the chain. A chain
    // that ends before the store does (the cache device lost records the store got,
    // say from memory before a power failure) would shadow the store's newer data.
    let keep = match input.chain {
        Some(chain)
            if bridge_through.is_none()
                && input.store_last_written_by_this_log
                && chain.last() >= store =>
        {
            SeqRange::new(chain.first(), store)
        }
        _ => None,
    };

    let last_seq = input.chain.map_or(0, |c| c.last()).max(store);
    let next_record_seq = last_seq
        .checked_add(1)
        .ok_or(LogRecoveryRefusal::SequenceNumbersExhausted { last_seq })?;
    Ok(LogRecoveryPlan {
        replay,
        keep,
        bridge_through,
        next_record_seq,
        warnings,
    })
}

#[cfg(test)]
#[path = "recovery_log_tests.rs"]
mod log_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A data object of epoch 0 (shared with the submodules' tests).
    pub(super) fn obj(seq: u64) -> ListedObject {
        ListedObject {
            seq,
            epoch: 0,
            is_checkpoint: false,
        }
    }
    /// A checkpoint object of epoch 0.
    pub(super) fn ckpt(seq: u64) -> ListedObject {
        ListedObject {
            seq,
            epoch: 0,
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
