//! Tests of [`plan_log_recovery`]: one per branch, then a seeded randomized check of
//! the plan's invariants over inputs the engine produces and inputs it should not.

use super::*;
use lsvd_trace::synthetic::prng::Rng;

use RecoveryMode::{AcceptPrefix, Strict};

fn range(first: u64, last: u64) -> SeqRange {
    SeqRange::new(first, last).expect("first <= last")
}

fn plan(
    tail: Option<u64>,
    chain: Option<(u64, u64)>,
    store: u64,
    mode: RecoveryMode,
) -> Result<LogRecoveryPlan, LogRecoveryRefusal> {
    plan_log_recovery(&LogRecoveryInput {
        cache_tail_seq: tail,
        chain: chain.map(|(first, last)| range(first, last)),
        store_last_record_seq: store,
        store_last_written_by_this_log: true,
        mode,
    })
}

/// The plan in both modes, which must agree (nothing to refuse or warn about).
fn plan_both(tail: Option<u64>, chain: Option<(u64, u64)>, store: u64) -> LogRecoveryPlan {
    let strict = plan(tail, chain, store, Strict).expect("strict accepts");
    let accept = plan(tail, chain, store, AcceptPrefix).expect("accept-prefix accepts");
    assert_eq!(strict, accept, "the modes differ only on loss");
    assert!(strict.warnings.is_empty());
    assert_eq!(strict.bridge_through, None);
    strict
}

#[test]
fn seq_range_is_never_empty() {
    assert_eq!(SeqRange::new(5, 4), None);
    let r = range(5, 7);
    assert_eq!((r.first(), r.last()), (5, 7));
    assert!(r.contains(5) && r.contains(7) && !r.contains(4) && !r.contains(8));
    assert_eq!(r.seqs().collect::<Vec<_>>(), [5, 6, 7]);
    assert_eq!(range(u64::MAX, u64::MAX).seqs().count(), 1);
}

#[test]
fn without_a_chain_nothing_is_replayed_and_writes_continue_after_the_store() {
    // A new cache without superblock, after an empty store and after a full one; a
    // clean stop (everything uploaded, the tail is the next record to write); a store
    // ahead of the log's tail.
    for (tail, store) in [(None, 0), (None, 17), (Some(11), 10), (Some(3), 10)] {
        let want = LogRecoveryPlan {
            replay: None,
            keep: None,
            bridge_through: None,
            next_record_seq: store + 1,
            warnings: Vec::new(),
        };
        let p = plan_both(tail, None, store);
        assert_eq!(p, want, "tail {tail:?}, store {store}");
    }
}

#[test]
fn chain_entirely_in_store_replays_nothing() {
    let p = plan_both(Some(5), Some((5, 9)), 9);
    assert_eq!((p.replay, p.next_record_seq), (None, 10));
    assert_eq!(
        p.keep,
        Some(range(5, 9)),
        "the log keeps what the store has"
    );
}

#[test]
fn chain_ending_before_the_store_replays_nothing() {
    // The store went further than the log (records released and overwritten after
    // the superblock was written): continue after the store.
    let p = plan_both(Some(5), Some((5, 9)), 12);
    assert_eq!((p.replay, p.next_record_seq), (None, 13));
    assert_eq!(
        p.keep, None,
        "records 10-12 are in the store only: they may hold newer versions of the \
         chain's blocks, which kept records would shadow"
    );
}

#[test]
fn chain_partly_in_store_replays_the_rest() {
    let p = plan_both(Some(5), Some((5, 12)), 8);
    assert_eq!((p.replay, p.next_record_seq), (Some(range(9, 12)), 13));
    assert_eq!(p.keep, Some(range(5, 8)), "kept and replayed meet");
}

#[test]
fn chain_starting_right_after_the_store_is_replayed_whole() {
    let p = plan_both(Some(9), Some((9, 12)), 8);
    assert_eq!((p.replay, p.next_record_seq), (Some(range(9, 12)), 13));
    assert_eq!(p.keep, None, "nothing of the chain is in the store");
    let p = plan_both(Some(1), Some((1, 1)), 0);
    assert_eq!((p.replay, p.next_record_seq), (Some(range(1, 1)), 2));
}

#[test]
fn log_released_records_the_store_lacks_strict_refuses() {
    let refusal = LogRecoveryRefusal::LogReleasedRecordsStoreLacks {
        store_last_record_seq: 8,
        released_through: 11,
    };
    assert_eq!(plan(Some(12), None, 8, Strict), Err(refusal));
    assert_eq!(plan(Some(12), Some((12, 15)), 8, Strict), Err(refusal));
    assert_eq!(
        refusal.to_string(),
        "the store holds records only through 8, but the write log had already released records up to 11: objects the store acknowledged are missing"
    );
}

#[test]
fn log_released_records_the_store_lacks_accept_prefix_warns_with_an_empty_chain() {
    let p = plan(Some(12), None, 8, AcceptPrefix).expect("accept-prefix continues");
    let warning = LogRecoveryWarning::LogReleasedRecordsStoreLacks {
        store_last_record_seq: 8,
        released_through: 11,
    };
    assert_eq!(
        p,
        LogRecoveryPlan {
            replay: None,
            keep: None,
            bridge_through: None,
            next_record_seq: 9,
            warnings: vec![warning],
        }
    );
    assert_eq!(
        warning.to_string(),
        "the store holds records only through 8, but the write log had already released records up to 11: objects the store acknowledged are missing, continuing from what the store has"
    );
}

#[test]
fn log_released_records_the_store_lacks_accept_prefix_bridges_the_chain() {
    // What the engine sees: the chain starts at the tail, past the gap.
    let p = plan(Some(12), Some((12, 15)), 8, AcceptPrefix).expect("accept-prefix continues");
    assert_eq!(
        p,
        LogRecoveryPlan {
            replay: None,
            keep: None,
            bridge_through: Some(15),
            next_record_seq: 16,
            warnings: vec![
                LogRecoveryWarning::LogReleasedRecordsStoreLacks {
                    store_last_record_seq: 8,
                    released_through: 11,
                },
                LogRecoveryWarning::RecordsPastGapDropped {
                    store_last_record_seq: 8,
                    dropped: range(12, 15),
                },
            ],
        }
    );
    assert_eq!(
        p.warnings[1].to_string(),
        "write log resumes at record 12 but the store ends at record 8: records 9 through 11 are missing, so write-log records 12 through 15 are dropped"
    );
}

#[test]
fn gap_between_store_and_chain_strict_refuses_and_accept_prefix_bridges() {
    // The tail itself is fine; the chain does not start there (or there is no tail).
    for tail in [Some(9), None] {
        let refusal = plan(tail, Some((11, 14)), 8, Strict).expect_err("gap refused");
        assert_eq!(
            refusal,
            LogRecoveryRefusal::GapBetweenStoreAndLog {
                store_last_record_seq: 8,
                log_resumes_at: 11,
            }
        );
        assert_eq!(
            refusal.to_string(),
            "write log resumes at record 11 but the store ends at record 8: records are missing"
        );
        let p = plan(tail, Some((10, 14)), 8, AcceptPrefix).expect("accept-prefix continues");
        assert_eq!(
            p,
            LogRecoveryPlan {
                replay: None,
                keep: None,
                bridge_through: Some(14),
                next_record_seq: 15,
                warnings: vec![LogRecoveryWarning::RecordsPastGapDropped {
                    store_last_record_seq: 8,
                    dropped: range(10, 14),
                }],
            }
        );
        assert_eq!(
            p.warnings[0].to_string(),
            "write log resumes at record 10 but the store ends at record 8: record 9 is missing, so write-log records 10 through 14 are dropped"
        );
    }
    // Only the part of the chain past the store is dropped and bridged.
    let p = plan(Some(9), Some((20, 20)), 8, AcceptPrefix).expect("continues");
    assert_eq!(p.bridge_through, Some(20));
    assert_eq!(
        p.warnings[0].to_string(),
        "write log resumes at record 20 but the store ends at record 8: records 9 through 19 are missing, so write-log record 20 is dropped"
    );
}

#[test]
fn extreme_sequence_numbers_do_not_panic() {
    const MAX: u64 = u64::MAX;
    let exhausted = Err(LogRecoveryRefusal::SequenceNumbersExhausted { last_seq: MAX });
    for mode in [Strict, AcceptPrefix] {
        // Nothing can follow the store's last record or the chain's.
        assert_eq!(plan(None, None, MAX, mode), exhausted);
        assert_eq!(plan(Some(MAX), Some((MAX, MAX)), MAX, mode), exhausted);
        assert_eq!(
            plan(Some(MAX - 1), Some((MAX - 1, MAX)), MAX - 2, mode),
            exhausted
        );
        assert_eq!(plan(Some(0), Some((0, MAX)), 0, mode), exhausted);
        // One short of the end still works.
        let p = plan(Some(MAX - 1), Some((MAX - 1, MAX - 1)), MAX - 2, mode).expect("fits");
        assert_eq!(
            (p.replay, p.next_record_seq),
            (Some(range(MAX - 1, MAX - 1)), MAX)
        );
        assert_eq!(
            plan(None, None, MAX - 1, mode).map(|p| p.next_record_seq),
            Ok(MAX)
        );
    }
    // A tail far past an empty store.
    assert_eq!(
        plan(Some(MAX), None, 0, Strict),
        Err(LogRecoveryRefusal::LogReleasedRecordsStoreLacks {
            store_last_record_seq: 0,
            released_through: MAX - 1,
        })
    );
    let p = plan(Some(MAX), None, 0, AcceptPrefix).expect("continues");
    assert_eq!((p.next_record_seq, p.warnings.len()), (1, 1));
    assert_eq!(
        plan(Some(MAX), Some((MAX, MAX)), 0, AcceptPrefix),
        exhausted,
        "bridging through the last sequence number leaves none for the next record"
    );
    assert_eq!(
        LogRecoveryRefusal::SequenceNumbersExhausted { last_seq: MAX }.to_string(),
        "record sequence numbers are exhausted: the newest record is 18446744073709551615, and no record can follow it"
    );
    // Every combination of edge values, in both modes: never a panic.
    let edges = [0, 1, 2, MAX / 2, MAX - 2, MAX - 1, MAX];
    for &store in &edges {
        for tail in edges.iter().copied().map(Some).chain([None]) {
            for &first in &edges {
                for &last in &edges {
                    let chain = SeqRange::new(first, last);
                    for mode in [Strict, AcceptPrefix] {
                        let _ = plan_log_recovery(&LogRecoveryInput {
                            cache_tail_seq: tail,
                            chain,
                            store_last_record_seq: store,
                            store_last_written_by_this_log: true,
                            mode,
                        });
                    }
                }
            }
        }
    }
}

/// A sequence number near `base`: small numbers, or ones near u64::MAX.
fn seq_near(rng: &mut Rng, base: u64) -> u64 {
    base.saturating_add(rng.below(45))
}

fn random_input(rng: &mut Rng) -> LogRecoveryInput {
    let base = if rng.chance(0.1) { u64::MAX - 50 } else { 0 };
    let store = seq_near(rng, base);
    let tail = (!rng.chance(0.2)).then(|| seq_near(rng, base));
    let chain = if rng.chance(0.3) {
        None
    } else {
        // Mostly what the engine finds (a chain from the tail), sometimes not.
        let first = match tail {
            Some(t) if rng.chance(0.6) => t,
            _ => seq_near(rng, base),
        };
        SeqRange::new(first, first.saturating_add(rng.below(12)))
    };
    let mode = if rng.chance(0.5) {
        Strict
    } else {
        AcceptPrefix
    };
    LogRecoveryInput {
        cache_tail_seq: tail,
        chain,
        store_last_record_seq: store,
        store_last_written_by_this_log: rng.chance(0.8),
        mode,
    }
}

#[test]
fn plans_keep_their_invariants_on_random_inputs() {
    let mut rng = Rng::new(0x5eed_1095);
    let (mut replays, mut bridges, mut refusals) = (0, 0, 0);
    for case in 0..20_000 {
        let input = random_input(&mut rng);
        let store = input.store_last_record_seq;
        let chain_last = input.chain.map(|c| c.last());
        let newest = chain_last.unwrap_or(0).max(store);
        // Only this log's own releases count: a superseded log's do not.
        let tail_past_store = input.store_last_written_by_this_log
            && input
                .cache_tail_seq
                .is_some_and(|t| store.checked_add(1).is_some_and(|next| t > next));
        let gap = input
            .chain
            .is_some_and(|c| c.last() > store && c.first() > store + 1);
        let what = format!("case {case}: {input:?}");
        match plan_log_recovery(&input) {
            Ok(p) => {
                if let Some(r) = p.replay {
                    replays += 1;
                    let chain = input.chain.expect("replay comes from the chain");
                    assert!(r.first() > store, "{what}");
                    assert_eq!(Some(r.first()), store.checked_add(1), "{what}");
                    assert_eq!(r.last(), chain.last(), "{what}");
                    assert!(chain.contains(r.first()), "{what}");
                }
                assert!(p.next_record_seq > store, "{what}");
                assert!(chain_last.is_none_or(|l| p.next_record_seq > l), "{what}");
                assert_eq!(p.next_record_seq, newest + 1, "{what}");
                if let Some(b) = p.bridge_through {
                    bridges += 1;
                    assert_eq!(input.mode, AcceptPrefix, "strict never bridges: {what}");
                    assert_eq!(p.replay, None, "{what}");
                    assert_eq!(Some(b), chain_last, "{what}");
                    assert!(b > store, "{what}");
                }
                // Kept records are the chain's records the store has, and only
                // when nothing was dropped past a gap; they end where the replay
                // starts.
                if let Some(k) = p.keep {
                    let chain = input.chain.expect("kept records come from the chain");
                    assert_eq!(p.bridge_through, None, "{what}");
                    assert!(input.store_last_written_by_this_log, "{what}");
                    assert_eq!(k.first(), chain.first(), "{what}");
                    assert_eq!(k.last(), store, "{what}");
                    assert!(chain.last() >= store, "{what}");
                    if let Some(r) = p.replay {
                        assert_eq!(k.last() + 1, r.first(), "{what}");
                    }
                } else {
                    assert!(
                        p.bridge_through.is_some()
                            || !input.store_last_written_by_this_log
                            || input
                                .chain
                                .is_none_or(|c| c.first() > store || c.last() < store),
                        "{what}"
                    );
                }
                // Every chain record past the store is replayed or bridged, never
                // silently lost.
                let past_store = chain_last.is_some_and(|l| l > store);
                assert_eq!(
                    past_store,
                    p.replay.is_some() || p.bridge_through.is_some(),
                    "{what}"
                );
                assert_eq!(p.bridge_through.is_some(), gap, "{what}");
                match input.mode {
                    Strict => {
                        assert!(p.warnings.is_empty(), "{what}");
                        assert!(!tail_past_store && !gap, "{what}");
                    }
                    AcceptPrefix => assert_eq!(
                        p.warnings.len(),
                        usize::from(tail_past_store) + usize::from(gap),
                        "{what}"
                    ),
                }
                // Accept-prefix plans exactly what strict does when strict accepts.
                if input.mode == Strict {
                    let accept = plan_log_recovery(&LogRecoveryInput {
                        mode: AcceptPrefix,
                        ..input
                    });
                    assert_eq!(accept, Ok(p), "{what}");
                }
            }
            Err(refusal) => {
                refusals += 1;
                match refusal {
                    LogRecoveryRefusal::SequenceNumbersExhausted { last_seq } => {
                        assert_eq!((last_seq, newest), (u64::MAX, u64::MAX), "{what}");
                    }
                    LogRecoveryRefusal::LogReleasedRecordsStoreLacks {
                        store_last_record_seq,
                        released_through,
                    } => {
                        assert_eq!(input.mode, Strict, "{what}");
                        assert!(tail_past_store, "{what}");
                        assert_eq!(store_last_record_seq, store);
                        assert_eq!(Some(released_through + 1), input.cache_tail_seq);
                    }
                    LogRecoveryRefusal::GapBetweenStoreAndLog {
                        store_last_record_seq,
                        log_resumes_at,
                    } => {
                        assert_eq!(input.mode, Strict, "{what}");
                        assert!(gap && !tail_past_store, "{what}");
                        assert_eq!(store_last_record_seq, store);
                        assert!(log_resumes_at > store + 1, "{what}");
                    }
                }
                assert!(!format!("{refusal}").is_empty());
            }
        }
    }
    // The generator reaches every outcome.
    assert!(
        replays > 1000 && bridges > 500 && refusals > 1000,
        "{replays} {bridges} {refusals}"
    );
}

/// Regression (found by the crash oracle's `takeover_sigstop`): a log another session
/// has superseded had released records into its own session's view of the store,
/// which the volume's history (the other session's) does not hold. That is no loss
/// for strict recovery to refuse: what such a log holds past its session's part of
/// the history is the engine's to refuse or discard as superseded.
#[test]
fn a_superseded_logs_releases_are_not_refused() {
    let input = LogRecoveryInput {
        cache_tail_seq: Some(370),
        chain: Some(range(370, 372)),
        store_last_record_seq: 350,
        store_last_written_by_this_log: true,
        mode: Strict,
    };
    assert!(matches!(
        plan_log_recovery(&input),
        Err(LogRecoveryRefusal::LogReleasedRecordsStoreLacks { .. })
    ));
    // The engine dropped the superseded records (past 350) before asking.
    let superseded = LogRecoveryInput {
        chain: None,
        store_last_written_by_this_log: false,
        ..input
    };
    let p = plan_log_recovery(&superseded).expect("nothing of this log's to refuse");
    assert_eq!((p.replay, p.keep, p.next_record_seq), (None, None, 351));
}
