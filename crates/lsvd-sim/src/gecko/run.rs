//! The discrete-event loop: closed-loop clients and one GC worker issue requests to
//! the drives; each request's completion is an event on the simulated clock.
//!
//! Clients: `clients · queue_depth` slots, each with one request outstanding; when it
//! completes the slot issues the next (no think time). A write of `io_bytes` at a
//! uniformly random aligned logical address is appended at the log's main head
//! (allocated and mapped when issued, so requests reach each drive's FIFO in log
//! order); a read goes to wherever the map says the block is. A write that finds no
//! free segment outside the GC reserve waits until GC frees one.
//!
//! GC: while the free-segment fraction is below `gc_start_free` (and, once started,
//! until it is back above `gc_stop_free`) the worker picks victims one at a time:
//! reads a victim's written part in one request per drive, then appends the blocks
//! still live (checked at that moment through the inverse map) at the main head
//! (stripe, chain move-to-tail) or at the victim drive's own GC head (chain
//! compact-in-body), and frees the victim when that write completes. Reading and
//! writing are a two-stage pipeline: the next victim is read while the previous
//! one's live data is written.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::array::Array;
use super::cache::CachedReads;
use super::config::Config;
use super::device::Op;
use super::layout::{BLOCK_BYTES, ChainGc, LayoutKind, Log, SegState};
use super::report::{Interval, RunResult, Summary};
use super::trace::TraceMix;
use lsvd_core::error::{Error, Result};
use lsvd_trace::synthetic::prng::SplitMix64;

/// Retry interval of an idle GC worker that found nothing to do or no space.
const GC_RETRY_NS: u64 = 10_000_000;

/// The workload's generator: splitmix64 (the trace crate's), so a run is fixed by its
/// seed.
struct Rng(SplitMix64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.next_u64() % n }
    }
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Slot(u32),
    GcRead,
    GcWrite,
    GcRetry,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bytes {
    app_write: u64,
    app_read: u64,
    gc_read: u64,
    gc_write: u64,
}

/// A victim in the GC pipeline: its segment and the bytes read or moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Victim {
    segment: u64,
    bytes: u64,
}

/// The GC worker: a two-stage pipeline, so the next victim is read while the live
/// data of the previous one is written (at most one read and one write outstanding,
/// and one victim read but waiting for the write stage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Gc {
    reading: Option<Victim>,
    read_waiting: Option<Victim>,
    writing: Option<Victim>,
}

struct Sim<'a> {
    cfg: &'a Config,
    log: Log,
    array: Array,
    reads: CachedReads,
    rng: Rng,
    events: BinaryHeap<Reverse<(u64, u64, Who)>>,
    seq: u64,
    /// Per slot: what its outstanding request is (op, bytes).
    slot_op: Vec<(Op, u64)>,
    stalled: VecDeque<u32>,
    gc: Gc,
    gc_active: bool,
    gc_retry_pending: bool,
    totals: Bytes,
    series: Vec<Bytes>,
    gc_started: Option<(u64, Bytes)>,
    /// The first client completion (the start of the no-GC window).
    first_done: Option<(u64, Bytes)>,
    /// Trace mix: the next request to issue.
    next_request: usize,
    requests_done: u64,
    first_stall_ns: Option<u64>,
    victims: u64,
    gc_no_space: u64,
}

impl Sim<'_> {
    fn schedule(&mut self, at_ns: u64, who: Who) {
        self.seq += 1;
        self.events.push(Reverse((at_ns, self.seq, who)));
    }

    /// Submits the log-address runs to the drives; returns the last completion.
    fn submit(&mut self, now: u64, op: Op, runs: &[(u64, u64)]) -> u64 {
        let mut done = now;
        for &(addr, bytes) in runs {
            for (drive, off, len) in self.log.geo.place(addr, bytes) {
                done = done.max(self.array.submit(now, op, drive, off, len));
            }
        }
        done
    }

    fn account(&mut self, now: u64, f: impl Fn(&mut Bytes)) {
        f(&mut self.totals);
        let i = (now / self.cfg.interval_ns) as usize;
        if i >= self.series.len() {
            self.series.resize(i + 1, Bytes::default());
        }
        if let Some(b) = self.series.get_mut(i) {
            f(b);
        }
    }

    fn issue(&mut self, slot: u32, now: u64) {
        if let Some(mix) = self.cfg.trace.as_deref() {
            self.issue_traced(mix, slot, now);
            return;
        }
        let per_io = self.cfg.io_bytes / BLOCK_BYTES;
        let units = self.log.map.len() as u64 / per_io.max(1);
        let read = self.rng.unit() >= self.cfg.write_fraction;
        let first = self.rng.below(units) * per_io;
        if read {
            let lbas: Vec<u64> = (first..first + per_io).collect();
            let done = self.read(now, &lbas);
            self.set_slot(slot, (Op::Read, self.cfg.io_bytes));
            self.schedule(done.max(now + 1), Who::Slot(slot));
            return;
        }
        if !self.log.can_append(0, per_io, false) {
            self.first_stall_ns.get_or_insert(now);
            self.stalled.push_back(slot);
            return;
        }
        let lbas: Vec<u64> = (first..first + per_io).collect();
        let Some(runs) = self.log.append(0, &lbas, false, now) else {
            self.stalled.push_back(slot);
            return;
        };
        self.admit(&lbas);
        let done = self.submit(now, Op::Write, &runs);
        self.set_slot(slot, (Op::Write, self.cfg.io_bytes));
        self.schedule(done, Who::Slot(slot));
    }

    /// The next request of the trace mix (none left: the slot stays idle).
    fn issue_traced(&mut self, mix: &TraceMix, slot: u32, now: u64) {
        let Some(r) = mix.requests.get(self.next_request) else {
            return;
        };
        let bytes = r.blocks.len() as u64 * BLOCK_BYTES;
        if !r.write {
            self.next_request += 1;
            let done = self.read(now, &r.blocks);
            self.set_slot(slot, (Op::Read, bytes));
            self.schedule(done.max(now + 1), Who::Slot(slot));
            return;
        }
        let blocks = r.blocks.len() as u64;
        let appended = if self.log.can_append(0, blocks, false) {
            self.log.append(0, &r.blocks, false, now)
        } else {
            None
        };
        let Some(runs) = appended else {
            self.first_stall_ns.get_or_insert(now);
            self.stalled.push_back(slot);
            return;
        };
        self.next_request += 1;
        self.admit(&r.blocks);
        let done = self.submit(now, Op::Write, &runs);
        self.set_slot(slot, (Op::Write, bytes));
        self.schedule(done, Who::Slot(slot));
    }

    /// A client reads `lbas`: the tail cache serves what it holds, the drives the
    /// rest (each block where the map points). Returns when the last piece is read.
    fn read(&mut self, now: u64, lbas: &[u64]) -> u64 {
        let runs = self.reads.read(&self.log, lbas);
        self.submit(now, Op::Read, &runs)
    }

    /// A client wrote `lbas`: into the tail cache.
    fn admit(&mut self, lbas: &[u64]) {
        self.reads.admit(lbas);
    }

    fn set_slot(&mut self, slot: u32, v: (Op, u64)) {
        if let Some(s) = self.slot_op.get_mut(slot as usize) {
            *s = v;
        }
    }

    fn wake_stalled(&mut self, now: u64) {
        let per_io = self.cfg.io_bytes / BLOCK_BYTES;
        while !self.stalled.is_empty() && self.log.can_append(0, per_io, false) {
            if let Some(slot) = self.stalled.pop_front() {
                self.issue(slot, now);
            }
        }
    }

    fn gc_head(&self, victim: u64) -> usize {
        match (self.log.geo.kind, self.cfg.chain_gc) {
            (LayoutKind::Chain, ChainGc::CompactInBody) => 1 + self.log.geo.pool_of(victim),
            _ => 0,
        }
    }

    fn retry_gc_later(&mut self, now: u64) {
        if !self.gc_retry_pending {
            self.gc_retry_pending = true;
            self.schedule(now + GC_RETRY_NS, Who::GcRetry);
        }
    }

    /// Starts reading the next victim if GC should run and the read stage is free.
    fn maybe_gc(&mut self, now: u64) {
        if self.cfg.gc_start_free == 0.0
            || self.gc.reading.is_some()
            || self.gc.read_waiting.is_some()
        {
            return;
        }
        let free = self.log.free_fraction();
        self.gc_active = if self.gc_active {
            free < self.cfg.gc_stop_free
        } else {
            free < self.cfg.gc_start_free
        };
        if !self.gc_active {
            return;
        }
        if self.gc_started.is_none() {
            self.gc_started = Some((now, self.totals));
        }
        // Empty victims are freed without I/O; at most every segment once.
        for _ in 0..self.log.segs.len() {
            let Some(v) = self.log.victim(self.cfg.policy, now) else {
                break;
            };
            let Some(seg) = self.log.segs.get(v as usize).copied() else {
                break;
            };
            if seg.live_blocks == 0 {
                self.log.release(v);
                self.victims += 1;
                continue;
            }
            let bytes = seg.written_blocks * BLOCK_BYTES;
            let start = v * self.log.geo.segment_bytes;
            self.log.set_state(v, SegState::Cleaning);
            let done = self.submit(now, Op::Read, &[(start, bytes)]);
            self.gc.reading = Some(Victim { segment: v, bytes });
            self.schedule(done, Who::GcRead);
            return;
        }
        self.wake_stalled(now);
        self.retry_gc_later(now);
    }

    /// A victim has been read: on to the write stage (or wait for it).
    fn gc_read_done(&mut self, now: u64) {
        let Some(v) = self.gc.reading.take() else {
            return;
        };
        self.account(now, |b| b.gc_read += v.bytes);
        if self.gc.writing.is_some() {
            self.gc.read_waiting = Some(v);
        } else {
            self.start_gc_write(v, now);
        }
        self.maybe_gc(now);
    }

    /// Appends what is still live in the victim at its GC head.
    fn start_gc_write(&mut self, v: Victim, now: u64) {
        let live = self.log.live_in(v.segment);
        if live.is_empty() {
            self.log.release(v.segment);
            self.victims += 1;
            self.wake_stalled(now);
            return;
        }
        let head = self.gc_head(v.segment);
        let runs = if self.log.can_append(head, live.len() as u64, true) {
            self.log.append(head, &live, true, now)
        } else {
            None
        };
        let Some(runs) = runs else {
            // No space even in the reserve: give the victim back and try later.
            self.gc_no_space += 1;
            self.log.set_state(v.segment, SegState::Closed);
            self.retry_gc_later(now);
            return;
        };
        let done = self.submit(now, Op::Write, &runs);
        self.gc.writing = Some(Victim {
            segment: v.segment,
            bytes: live.len() as u64 * BLOCK_BYTES,
        });
        self.schedule(done, Who::GcWrite);
    }

    /// The live data is durable elsewhere: the victim is free.
    fn gc_write_done(&mut self, now: u64) {
        if let Some(v) = self.gc.writing.take() {
            self.account(now, |b| b.gc_write += v.bytes);
            self.log.release(v.segment);
            self.victims += 1;
        }
        if let Some(v) = self.gc.read_waiting.take() {
            self.start_gc_write(v, now);
        }
        self.wake_stalled(now);
        self.maybe_gc(now);
    }

    fn slot_done(&mut self, slot: u32, now: u64) {
        let (op, bytes) = self
            .slot_op
            .get(slot as usize)
            .copied()
            .unwrap_or((Op::Write, 0));
        if self.first_done.is_none() {
            self.first_done = Some((now, self.totals));
        }
        self.requests_done += 1;
        match op {
            Op::Write => self.account(now, |b| b.app_write += bytes),
            Op::Read => self.account(now, |b| b.app_read += bytes),
        }
        self.issue(slot, now);
        self.maybe_gc(now);
    }
}

fn mb_per_s(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        bytes as f64 / 1e6 / (ns as f64 / 1e9)
    }
}

/// Runs one simulation.
pub fn simulate(cfg: &Config) -> Result<RunResult> {
    simulate_with_log(cfg).map(|(r, _)| r)
}

/// [`simulate`], also returning the log's final state (for tests).
pub fn simulate_with_log(cfg: &Config) -> Result<(RunResult, Log)> {
    cfg.validate()?;
    let geo = cfg.geo;
    let mut log = Log::new(geo, cfg.logical_blocks());
    // Precondition: the address space written once, in order, before the clock starts.
    let lbas: Vec<u64> = (0..cfg.logical_blocks()).collect();
    for chunk in lbas.chunks(geo.blocks_per_segment() as usize) {
        if log.append(0, chunk, false, 0).is_none() {
            return Err(Error::bad_input(
                "--fill: the address space does not fit in the log",
            ));
        }
    }
    let slots = cfg.clients * cfg.queue_depth;
    let mut sim = Sim {
        cfg,
        log,
        array: Array::new(&cfg.device, geo.drives, cfg.copies, geo.drive_bytes),
        reads: CachedReads::new(cfg.tail_cache_blocks, cfg.logical_blocks()),
        rng: Rng(SplitMix64::new(cfg.seed)),
        events: BinaryHeap::new(),
        seq: 0,
        slot_op: vec![(Op::Write, 0); slots as usize],
        stalled: VecDeque::new(),
        gc: Gc::default(),
        gc_active: false,
        gc_retry_pending: false,
        totals: Bytes::default(),
        series: Vec::new(),
        gc_started: None,
        first_done: None,
        next_request: 0,
        requests_done: 0,
        first_stall_ns: None,
        victims: 0,
        gc_no_space: 0,
    };
    for slot in 0..slots {
        sim.issue(slot, 0);
    }
    sim.maybe_gc(0);
    let mut end = 0;
    while let Some(Reverse((at, _, who))) = sim.events.pop() {
        if at > cfg.duration_ns {
            break;
        }
        end = at;
        match who {
            Who::Slot(s) => sim.slot_done(s, at),
            Who::GcRead => sim.gc_read_done(at),
            Who::GcWrite => sim.gc_write_done(at),
            Who::GcRetry => {
                sim.gc_retry_pending = false;
                sim.maybe_gc(at);
            }
        }
    }
    let end = if sim.events.is_empty() {
        end
    } else {
        cfg.duration_ns
    };
    let r = result(cfg, &sim, end);
    Ok((r, sim.log))
}

fn result(cfg: &Config, sim: &Sim<'_>, end: u64) -> RunResult {
    let t = &sim.totals;
    let (before_ns, before) = sim.gc_started.unwrap_or((end, *t));
    let (first_ns, first) = sim.first_done.unwrap_or((0, Bytes::default()));
    let no_gc_bytes = before.app_write.saturating_sub(first.app_write);
    let no_gc_ns = before_ns.saturating_sub(first_ns);
    let with_ns = end.saturating_sub(before_ns);
    let with_gc = sim.gc_started.map(|_| {
        (
            mb_per_s(t.app_write - before.app_write, with_ns),
            mb_per_s(t.gc_write - before.gc_write, with_ns),
            mb_per_s(t.gc_read - before.gc_read, with_ns),
        )
    });
    let iv = cfg.interval_ns;
    let intervals = end.div_ceil(iv.max(1));
    let series = (0..intervals)
        .map(|i| {
            let b = sim.series.get(i as usize).copied().unwrap_or_default();
            let span = iv.min(end - i * iv);
            Interval {
                start_s: (i * iv) as f64 / 1e9,
                app_write_mb_per_s: mb_per_s(b.app_write, span),
                app_read_mb_per_s: mb_per_s(b.app_read, span),
                gc_read_mb_per_s: mb_per_s(b.gc_read, span),
                gc_write_mb_per_s: mb_per_s(b.gc_write, span),
            }
        })
        .collect();
    RunResult {
        name: cfg.name(),
        layout: cfg.geo.kind,
        drives: cfg.geo.drives,
        chain_gc: (cfg.geo.kind == LayoutKind::Chain).then_some(cfg.chain_gc),
        summary: Summary {
            simulated_s: end as f64 / 1e9,
            gc_started_s: sim.gc_started.map(|(ns, _)| ns as f64 / 1e9),
            first_stall_s: sim.first_stall_ns.map(|ns| ns as f64 / 1e9),
            app_write_mb_per_s: mb_per_s(t.app_write, end),
            app_read_mb_per_s: mb_per_s(t.app_read, end),
            app_write_mb_per_s_before_gc: mb_per_s(no_gc_bytes, no_gc_ns),
            app_write_mb_per_s_with_gc: with_gc.map(|w| w.0),
            gc_write_mb_per_s_with_gc: with_gc.map(|w| w.1),
            gc_read_mb_per_s_with_gc: with_gc.map(|w| w.2),
            requests_done: sim.requests_done,
            gc_victims: sim.victims,
            gc_moved_bytes: t.gc_write,
            gc_no_space: sim.gc_no_space,
            tail_moves_s: sim
                .log
                .tail_moves
                .iter()
                .map(|&(ns, d)| (ns as f64 / 1e9, d))
                .collect(),
            drive_busy_fraction: sim.array.busy_fractions(end),
            tail_cache: sim.reads.stats(),
        },
        series,
    }
}
