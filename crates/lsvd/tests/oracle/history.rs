//! The client-side history of one round: what was issued, what was acknowledged, and
//! when, on one logical clock.
//!
//! Times are ticks of a counter taken under one lock: an operation's issue tick is
//! taken just before it is handed to the disk, its completion tick just after the
//! answer arrives. So `ack(X) < issue(W)` means X had been acknowledged before W was
//! sent: the disk must order X before W.

use std::sync::Mutex;

pub type Time = u64;

/// What a block holds, as far as the workload is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Zero,
    Write(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Write,
    /// NBD TRIM / engine write_zeroes: reads return zeros afterwards.
    Trim,
    /// NBD WRITE_ZEROES: the same contract as TRIM.
    WriteZeroes,
}

impl OpKind {
    pub fn zeroes(self) -> bool {
        !matches!(self, OpKind::Write)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    InFlight,
    Acked(Time),
    Failed(Time),
}

#[derive(Debug, Clone)]
pub struct OpRec {
    pub id: u64,
    pub kind: OpKind,
    pub fua: bool,
    pub first_block: u64,
    pub blocks: u64,
    pub issue: Time,
    pub outcome: Outcome,
}

impl OpRec {
    pub fn acked(&self) -> Option<Time> {
        match self.outcome {
            Outcome::Acked(t) => Some(t),
            _ => None,
        }
    }
    pub fn content(&self) -> Content {
        if self.kind.zeroes() {
            Content::Zero
        } else {
            Content::Write(self.id)
        }
    }
    pub fn describe(&self) -> String {
        let what = match self.kind {
            OpKind::Write => "write",
            OpKind::Trim => "trim",
            OpKind::WriteZeroes => "write_zeroes",
        };
        let outcome = match self.outcome {
            Outcome::InFlight => "in flight at the crash".to_string(),
            Outcome::Acked(t) => format!("acked t={t}"),
            Outcome::Failed(t) => format!("failed t={t}"),
        };
        format!(
            "{what}{} #{} blocks {}..{} (issued t={}, {outcome})",
            if self.fua { "+FUA" } else { "" },
            self.id,
            self.first_block,
            self.first_block + self.blocks,
            self.issue
        )
    }
}

#[derive(Debug, Clone, Copy)]
pub struct FlushRec {
    pub issue: Time,
    pub outcome: Outcome,
}

/// Everything the checker needs about one round.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Contents at the start of the round (what the previous recovery read back). It is
    /// durable for every rule the round is judged by.
    pub base: Vec<Content>,
    /// In issue order.
    pub ops: Vec<OpRec>,
    pub flushes: Vec<FlushRec>,
    /// Times `t` at which the store was seen to hold every record written so far: every
    /// operation acknowledged before `t` is in the store.
    pub store_points: Vec<Time>,
    /// Operations that failed although no crash had happened (a violation by itself).
    pub unexpected_errors: Vec<String>,
    /// Reads during the workload that did not return the latest acknowledged data.
    pub read_mismatches: Vec<String>,
}

#[derive(Debug)]
struct Inner {
    clock: Time,
    rec: Record,
    /// Latest known content per block: `None` while unknown (an op failed).
    latest: Vec<Option<Content>>,
}

impl Inner {
    /// The next tick of the history's clock.
    fn tick(&mut self) -> Time {
        self.clock += 1;
        self.clock
    }
}

impl Outcome {
    /// The outcome of an answer at tick `t`: success or error.
    fn answered(ok: bool, t: Time) -> Outcome {
        if ok {
            Outcome::Acked(t)
        } else {
            Outcome::Failed(t)
        }
    }
}

/// The shared, lock-protected history the workload tasks append to.
#[derive(Debug)]
pub struct History {
    inner: Mutex<Inner>,
}

impl History {
    pub fn new(base: Vec<Content>) -> Self {
        let latest = base.iter().map(|c| Some(*c)).collect();
        History {
            inner: Mutex::new(Inner {
                clock: 1,
                rec: Record {
                    base,
                    ..Default::default()
                },
                latest,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a tick.
    pub fn now(&self) -> Time {
        self.lock().tick()
    }

    /// Record an operation as issued now; returns its index.
    pub fn begin_op(
        &self,
        id: u64,
        kind: OpKind,
        fua: bool,
        first_block: u64,
        blocks: u64,
    ) -> usize {
        let mut g = self.lock();
        let issue = g.tick();
        g.rec.ops.push(OpRec {
            id,
            kind,
            fua,
            first_block,
            blocks,
            issue,
            outcome: Outcome::InFlight,
        });
        g.rec.ops.len() - 1
    }

    /// When operation `index` was issued.
    pub fn issued_at(&self, index: usize) -> Time {
        self.lock().rec.ops[index].issue
    }

    /// Record the answer to operation `index` now; returns the tick.
    pub fn end_op(&self, index: usize, ok: bool) -> Time {
        let mut g = self.lock();
        let t = g.tick();
        let op = &mut g.rec.ops[index];
        op.outcome = Outcome::answered(ok, t);
        let (first, n, content) = (op.first_block, op.blocks, op.content());
        for b in first..first + n {
            g.latest[b as usize] = if ok { Some(content) } else { None };
        }
        t
    }

    pub fn begin_flush(&self) -> usize {
        let mut g = self.lock();
        let issue = g.tick();
        g.rec.flushes.push(FlushRec {
            issue,
            outcome: Outcome::InFlight,
        });
        g.rec.flushes.len() - 1
    }

    /// Record the answer to FLUSH `index` now; returns the tick.
    pub fn end_flush(&self, index: usize, ok: bool) -> Time {
        let mut g = self.lock();
        let t = g.tick();
        g.rec.flushes[index].outcome = Outcome::answered(ok, t);
        t
    }

    pub fn store_point(&self, t: Time) {
        self.lock().rec.store_points.push(t);
    }

    pub fn unexpected_error(&self, what: String) {
        self.lock().rec.unexpected_errors.push(what);
    }

    pub fn read_mismatch(&self, what: String) {
        self.lock().rec.read_mismatches.push(what);
    }

    /// The latest acknowledged contents of blocks `first..first+n` (None if unknown).
    pub fn latest(&self, first: u64, n: u64) -> Vec<Option<Content>> {
        let g = self.lock();
        g.latest[first as usize..(first + n) as usize].to_vec()
    }

    pub fn snapshot(&self) -> Record {
        self.lock().rec.clone()
    }
}
