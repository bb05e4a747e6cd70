//! The oracle proper: is a recovered disk a state the guarantees allow, given the
//! client-side history?
//!
//! Per block, the operations touching it are totally ordered (the workload never has two
//! overlapping operations in flight), so a block's recovered contents name a position
//! in that block's list: the base contents (position -1), a write, or, for zeros, one of
//! the trims (or the base, if it was zero). See the crate docs for the rules.

use super::Stats;
use super::history::{Content, Record, Time};
use super::stamp::Seen;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Process crash or power loss with the write log intact: flushed data is present,
    /// and the state is a prefix.
    CacheIntact,
    /// Write log lost: a prefix that includes everything the store was seen to hold.
    CacheLost,
    /// Only the prefix property (objects were deliberately removed from the store).
    PrefixOnly,
}

#[derive(Debug, Default)]
pub struct CheckReport {
    pub violations: Vec<String>,
    /// Acknowledged operations that did not survive (allowed: not covered by a flush).
    pub lost_acked: usize,
    /// Blocks showing an operation that was in flight or failed at the crash.
    pub shows_unacked: usize,
    /// Blocks the durability rule constrained (required position >= 0).
    pub constrained_blocks: usize,
}

#[derive(Debug, Clone)]
enum State {
    /// Position in the block's list; -1 is the base contents.
    At(isize),
    /// Zeros: every position that could have produced them.
    Zero(Vec<isize>),
    Bad,
}

const MAX_REPORTED: usize = 25;

/// Check `seen` (every block of the recovered disk) against `rec` under `rule`.
/// Judges `seen` against `rec` under `rule` and counts it in `stats` (checks,
/// acknowledged writes lost as the rule allows, blocks showing unacknowledged
/// writes). An error led by `what` (which rule, where) listing the violations, the
/// `extra` ones and the workload's `hangs`, if there are any.
pub fn judge(
    rec: &Record,
    seen: &[Seen],
    rule: Rule,
    extra: Vec<String>,
    hangs: &[String],
    stats: &Stats,
    what: &str,
) -> Result<(), String> {
    let r = check(rec, seen, rule);
    stats.add(&format!("checks_{rule:?}"), 1);
    stats.add("acked_ops_lost_legitimately", r.lost_acked as u64);
    stats.add("blocks_showing_unacked_ops", r.shows_unacked as u64);
    let mut v = r.violations;
    v.extend(extra);
    v.extend(hangs.iter().map(|h| format!("hang: {h}")));
    if v.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{what} ({} ops, {} flushes, {} store points):\n  - {}",
        rec.ops.len(),
        rec.flushes.len(),
        rec.store_points.len(),
        v.join("\n  - ")
    ))
}

pub fn check(rec: &Record, seen: &[Seen], rule: Rule) -> CheckReport {
    let mut report = CheckReport::default();
    let v = &mut report.violations;
    for e in &rec.unexpected_errors {
        v.push(format!("operation failed before any crash: {e}"));
    }
    for e in &rec.read_mismatches {
        v.push(format!(
            "read during the workload returned stale or wrong data: {e}"
        ));
    }
    let nblocks = rec.base.len();
    assert_eq!(seen.len(), nblocks, "one observation per block");
    let ops = &rec.ops;
    let mut per_block: Vec<Vec<usize>> = vec![Vec::new(); nblocks];
    for (i, op) in ops.iter().enumerate() {
        for b in op.first_block..op.first_block + op.blocks {
            per_block[b as usize].push(i);
        }
    }

    // The durability floor: operations acknowledged before `floor` must be present.
    let mut floor: Time = 0;
    let mut floor_why = String::from("nothing");
    let raise = |t: Time, why: String, floor: &mut Time, floor_why: &mut String| {
        if t > *floor {
            *floor = t;
            *floor_why = why;
        }
    };
    match rule {
        Rule::CacheIntact => {
            for f in &rec.flushes {
                if let super::history::Outcome::Acked(a) = f.outcome {
                    raise(
                        f.issue,
                        format!("the FLUSH issued at t={} (completed t={a})", f.issue),
                        &mut floor,
                        &mut floor_why,
                    );
                }
            }
            for op in ops {
                if op.fua && op.acked().is_some() {
                    raise(
                        op.issue,
                        format!("the completed {}", op.describe()),
                        &mut floor,
                        &mut floor_why,
                    );
                }
            }
        }
        Rule::CacheLost => {
            for &t in &rec.store_points {
                raise(
                    t,
                    format!("the store holding every record at t={t}"),
                    &mut floor,
                    &mut floor_why,
                );
            }
        }
        Rule::PrefixOnly => {}
    }
    let fua_required = rule == Rule::CacheIntact;

    // What each block shows.
    let mut states = Vec::with_capacity(nblocks);
    for b in 0..nblocks {
        let list = &per_block[b];
        let st = match &seen[b] {
            Seen::Garbage(why) => {
                let ops_here: Vec<String> = list.iter().map(|&i| ops[i].describe()).collect();
                v.push(format!(
                    "block {b}: garbage: {why}; base {:?}; this round's operations on the block: [{}]",
                    rec.base[b],
                    ops_here.join("; ")
                ));
                State::Bad
            }
            Seen::Write(id) => {
                if let Some(p) = list
                    .iter()
                    .position(|&i| ops[i].id == *id && !ops[i].kind.zeroes())
                {
                    State::At(p as isize)
                } else if rec.base[b] == Content::Write(*id) {
                    State::At(-1)
                } else {
                    let elsewhere = ops.iter().find(|o| o.id == *id);
                    v.push(match elsewhere {
                        Some(o) => format!(
                            "block {b}: shows data of {} which never wrote this block",
                            o.describe()
                        ),
                        None => format!(
                            "block {b}: shows write #{id}, which is not in this round's history and not the base contents ({:?})",
                            rec.base[b]
                        ),
                    });
                    State::Bad
                }
            }
            Seen::Zero => {
                let mut c: Vec<isize> = Vec::new();
                if rec.base[b] == Content::Zero {
                    c.push(-1);
                }
                c.extend(
                    list.iter()
                        .enumerate()
                        .filter(|(_, i)| ops[**i].kind.zeroes())
                        .map(|(p, _)| p as isize),
                );
                State::Zero(c)
            }
        };
        states.push(st);
    }

    // Required position of block `b` when everything acknowledged before `t` must be
    // present.
    let required = |b: usize, t: Time| -> isize {
        let mut r = -1isize;
        for (p, &i) in per_block[b].iter().enumerate() {
            let op = &ops[i];
            if let Some(a) = op.acked()
                && (a < t || (fua_required && op.fua))
            {
                r = p as isize;
            }
        }
        r
    };

    // Prefix: a visible operation implies everything acknowledged before it was issued.
    // Iterate to a fixpoint, since which trim explains a zero block depends on `t`.
    let mut t = floor;
    let mut t_why = floor_why;
    loop {
        let mut next = t;
        let mut next_why = None;
        for b in 0..nblocks {
            let shown = match &states[b] {
                State::At(p) if *p >= 0 => Some(*p),
                State::Zero(c) => {
                    let r = required(b, t);
                    c.iter().copied().find(|&p| p >= r).filter(|&p| p >= 0)
                }
                _ => None,
            };
            if let Some(p) = shown {
                let op = &ops[per_block[b][p as usize]];
                if op.issue > next {
                    next = op.issue;
                    next_why = Some(format!("block {b} showing {}", op.describe()));
                }
            }
        }
        if next == t {
            break;
        }
        t = next;
        if let Some(w) = next_why {
            t_why = w;
        }
    }

    // Judge every block against the final cut.
    let mut reported = 0usize;
    for b in 0..nblocks {
        let r = required(b, t);
        if r >= 0 {
            report.constrained_blocks += 1;
        }
        let list = &per_block[b];
        let describe_pos = |p: isize| -> String {
            if p < 0 {
                format!("its base contents {:?}", rec.base[b])
            } else {
                ops[list[p as usize]].describe()
            }
        };
        let bad = match &states[b] {
            State::At(p) => {
                if *p >= 0 && ops[list[*p as usize]].acked().is_none() {
                    report.shows_unacked += 1;
                }
                (*p < r).then(|| format!("shows {}", describe_pos(*p)))
            }
            State::Zero(c) => {
                if !c.iter().any(|&p| p >= r) {
                    Some(format!(
                        "reads zeros (possible sources: {})",
                        if c.is_empty() {
                            "none".to_string()
                        } else {
                            c.iter()
                                .map(|&p| describe_pos(p))
                                .collect::<Vec<_>>()
                                .join("; ")
                        }
                    ))
                } else {
                    None
                }
            }
            State::Bad => None,
        };
        // Count acknowledged operations on this block newer than what it shows.
        let shown_max = match &states[b] {
            State::At(p) => *p,
            State::Zero(c) => c.iter().copied().max().unwrap_or(-1),
            State::Bad => isize::MAX,
        };
        if shown_max != isize::MAX {
            report.lost_acked += list
                .iter()
                .enumerate()
                .filter(|(p, i)| *p as isize > shown_max && ops[**i].acked().is_some())
                .count();
        }
        if let Some(what) = bad {
            if reported < MAX_REPORTED {
                v.push(format!(
                    "block {b}: {what}, but {} must be present or superseded: it was acknowledged before {t_why}",
                    describe_pos(r)
                ));
            }
            reported += 1;
        }
    }
    if reported > MAX_REPORTED {
        v.push(format!(
            "... and {} more blocks missing required data",
            reported - MAX_REPORTED
        ));
    }
    report
}

/// The contents a checked state leaves for the next round's base.
pub fn contents(seen: &[Seen]) -> Option<Vec<Content>> {
    seen.iter()
        .map(|s| match s {
            Seen::Zero => Some(Content::Zero),
            Seen::Write(id) => Some(Content::Write(*id)),
            Seen::Garbage(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::history::{History, OpKind};
    use super::*;

    /// Records request `id` (`kind` on `blocks` blocks from `first`, no FUA) as issued,
    /// then acknowledged.
    fn acked(h: &History, id: u64, kind: OpKind, first: u64, blocks: u64) {
        let i = h.begin_op(id, kind, false, first, blocks);
        h.end_op(i, true);
    }

    /// Three blocks; write A to block 0, flush, write B to block 1, write C to block 2
    /// issued after B's ack.
    fn history() -> Record {
        let h = History::new(vec![Content::Zero; 3]);
        acked(&h, 1, OpKind::Write, 0, 1);
        let f = h.begin_flush();
        h.end_flush(f, true);
        acked(&h, 2, OpKind::Write, 1, 1);
        acked(&h, 3, OpKind::Write, 2, 1);
        h.snapshot()
    }

    #[test]
    fn accepts_prefixes() {
        let rec = history();
        for seen in [
            vec![Seen::Write(1), Seen::Zero, Seen::Zero],
            vec![Seen::Write(1), Seen::Write(2), Seen::Zero],
            vec![Seen::Write(1), Seen::Write(2), Seen::Write(3)],
        ] {
            let r = check(&rec, &seen, Rule::CacheIntact);
            assert!(r.violations.is_empty(), "{seen:?}: {:?}", r.violations);
        }
    }

    #[test]
    fn rejects_lost_flushed_data_holes_and_garbage() {
        let rec = history();
        let lost = check(
            &rec,
            &[Seen::Zero, Seen::Zero, Seen::Zero],
            Rule::CacheIntact,
        );
        assert_eq!(lost.violations.len(), 1, "{:?}", lost.violations);
        let ok_prefix = check(
            &rec,
            &[Seen::Zero, Seen::Zero, Seen::Zero],
            Rule::PrefixOnly,
        );
        assert!(ok_prefix.violations.is_empty());
        let hole = check(
            &rec,
            &[Seen::Write(1), Seen::Zero, Seen::Write(3)],
            Rule::PrefixOnly,
        );
        assert_eq!(hole.violations.len(), 1, "{:?}", hole.violations);
        let wrong = check(
            &rec,
            &[Seen::Write(2), Seen::Zero, Seen::Zero],
            Rule::PrefixOnly,
        );
        assert_eq!(wrong.violations.len(), 1, "{:?}", wrong.violations);
        let garbage = check(
            &rec,
            &[Seen::Write(1), Seen::Garbage("x".into()), Seen::Zero],
            Rule::PrefixOnly,
        );
        assert_eq!(garbage.violations.len(), 1);
    }

    #[test]
    fn trims_explain_zeros_and_imply_their_past() {
        let h = History::new(vec![Content::Zero; 2]);
        acked(&h, 1, OpKind::Write, 0, 1);
        acked(&h, 2, OpKind::Write, 1, 1);
        acked(&h, 3, OpKind::Trim, 0, 1);
        let rec = h.snapshot();
        // Zeros at block 0 are fine alone (base or trim)...
        let r = check(&rec, &[Seen::Zero, Seen::Zero], Rule::PrefixOnly);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // ...and with block 1 written.
        let r = check(&rec, &[Seen::Zero, Seen::Write(2)], Rule::PrefixOnly);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // Showing the write at block 0 while block 1 lost its older write is a hole:
        // no, write 1 was acked before write 2 was issued, not the other way round.
        let r = check(&rec, &[Seen::Write(1), Seen::Zero], Rule::PrefixOnly);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn a_visible_trim_implies_what_was_acked_before_it() {
        let h = History::new(vec![Content::Write(9), Content::Zero]);
        acked(&h, 2, OpKind::Write, 1, 1);
        acked(&h, 3, OpKind::Trim, 0, 1);
        let rec = h.snapshot();
        let r = check(&rec, &[Seen::Zero, Seen::Zero], Rule::PrefixOnly);
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        let r = check(&rec, &[Seen::Write(9), Seen::Zero], Rule::PrefixOnly);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }
}
