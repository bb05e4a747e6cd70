//! The GC side of the pipeline: when a pass may run, which victims it takes, and how
//! its objects join the sequence.
//!
//! A pass goes: [`Pipeline::gc_plan`] (victims, marked busy) → the driver reads their
//! live data ([`crate::gc_plan`]) → [`Pipeline::gc_reserve`] (numbers for its
//! objects and its closing checkpoint; client batches wait unnumbered meanwhile) → the
//! driver builds the objects → [`Pipeline::gc_queue`] → uploads → the closing
//! checkpoint leaves the victims out and is finished
//! ([`Pipeline::checkpoint_finished`]), which ends the pass.

use std::collections::BTreeSet;

use crate::extent_map::Location;
use crate::gc::{GcConfig, select_victims_by_rate, should_collect};
use crate::live_rates::LiveWriteRates;

use super::{Pipeline, Queued};

/// A GC pass the pipeline allowed: collect these objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPass {
    pub victims: BTreeSet<u64>,
}

impl<L: Location, G> Pipeline<L, G> {
    /// May a GC pass start now, and over which victims? None while writes have
    /// stopped, a pass is in progress, client objects wait for upload (more than
    /// `gc_max_backlog`), or utilization is fine (with hysteresis: once started, GC
    /// goes on until utilization rises above the stop threshold). When GC should
    /// collect but finds no victims it is *stalled*: client batches are no longer held
    /// for it.
    pub fn gc_plan(&mut self) -> Option<GcPass> {
        self.gc_plan_with_rates(None)
    }

    /// [`gc_plan`](Self::gc_plan) with the write rates of the objects' live data
    /// (used only where [`gc_wants_write_rates`](Self::gc_wants_write_rates) says so:
    /// hylog while it separates; ignored otherwise).
    pub fn gc_plan_with_rates(&mut self, rates: Option<&LiveWriteRates>) -> Option<GcPass> {
        if !self.gc_may_start() {
            return None;
        }
        if !should_collect(&self.store, &self.cfg.gc, self.gc.active) {
            self.gc.active = false;
            self.gc.stalled = false;
            return None;
        }
        let cfg = GcConfig {
            policy: self.cfg.gc.policy.victim_order(self.gc.separating),
            ..self.cfg.gc
        };
        let rates = rates.filter(|_| self.uses_write_rates());
        let victims =
            select_victims_by_rate(&self.store, &cfg, self.next_object_seq, |_| false, rates);
        if victims.is_empty() {
            self.gc.active = false;
            if !self.gc.stalled {
                self.gc.stalled = true;
                self.release_held();
                self.wakes.uploader = true;
            }
            return None;
        }
        self.gc.stalled = false;
        self.gc.active = true;
        self.gc.busy = victims.iter().copied().collect();
        Some(GcPass {
            victims: self.gc.busy.clone(),
        })
    }

    /// Would [`gc_plan_with_rates`](Self::gc_plan_with_rates) start a pass now and
    /// order its victims by write rate ([`crate::live_rates`])? Then the driver
    /// measures the rates first (a walk over the map, so only when they are used).
    pub fn gc_wants_write_rates(&self) -> bool {
        self.uses_write_rates()
            && self.gc_may_start()
            && should_collect(&self.store, &self.cfg.gc, self.gc.active)
    }

    /// hylog orders victims by write rate while it separates.
    fn uses_write_rates(&self) -> bool {
        self.cfg.gc.policy.tracks_heat() && self.gc.separating
    }

    /// Writes go on, no pass is in progress and client objects do not wait (unless
    /// the store has headroom: then GC runs beside them).
    fn gc_may_start(&self) -> bool {
        !(self.writes_stopped
            || !self.gc.busy.is_empty()
            || self.gc.reserved.is_some()
            || (self.cfg.gc_headroom_bytes == 0 && self.queue.len() > self.cfg.gc_max_backlog))
    }

    /// Under the hylog policy: does the latest choice separate hot from cold data?
    /// (The driver sets this after each pass's choice; it orders the next pass's
    /// victims, see [`crate::gc::GcPolicy::victim_order`] and
    /// [`gc_wants_write_rates`](Self::gc_wants_write_rates).)
    pub fn set_gc_separating(&mut self, separating: bool) {
        self.gc.separating = separating;
    }

    /// The pass has read its victims and will make `objects` GC objects: number them
    /// and the checkpoint that closes the pass (`objects + 1` consecutive numbers, the
    /// first returned). Until [`gc_queue`](Self::gc_queue), nothing else is numbered.
    /// None once writes have stopped (the pass is dropped: the drain does not wait for
    /// work that was not needed).
    pub fn gc_reserve(&mut self, objects: usize) -> Option<u64> {
        if self.writes_stopped {
            self.gc_abandon();
            return None;
        }
        let first = self.allocate_seqs(objects as u64 + 1);
        self.gc.reserved = Some(first..first + objects as u64 + 1);
        Some(first)
    }

    /// Queue the pass's objects (`(bytes, object)` in the order of their reserved
    /// numbers) and its closing checkpoint.
    pub fn gc_queue(&mut self, objects: Vec<(u64, G)>) {
        let Some(range) = self.gc.reserved.take() else {
            panic!("gc_queue without gc_reserve");
        };
        assert_eq!(
            range.end - range.start,
            objects.len() as u64 + 1,
            "a pass queues the objects it reserved numbers for"
        );
        for (seq, (bytes, object)) in (range.start..).zip(objects) {
            self.add_pending(seq, bytes);
            self.push_queue(Queued::Gc { seq, object });
        }
        let checkpoint = range.end - 1;
        self.queue_checkpoint(checkpoint);
        self.gc.pass_checkpoint = Some(checkpoint);
        self.release_held();
    }

    /// The pass failed before it reserved numbers (a read failed): its victims are
    /// free again and a later pass may retry.
    pub fn gc_abandon(&mut self) {
        debug_assert!(
            self.gc.reserved.is_none(),
            "numbers reserved: the pass must queue"
        );
        self.gc.busy.clear();
        self.gc.pass_checkpoint = None;
    }
}
