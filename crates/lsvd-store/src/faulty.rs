//! A fault-injecting object store decorator, for crash tests and fault tests.
//!
//! Why: every fault the engine must answer cleanly (issue 41: "every fault ends in a
//! bounded, clean answer") has to be producible on demand, on any store, while a test
//! watches: a store that fails for a while, refuses the credentials, runs out of room
//! or crawls. It wraps any store (memory, a local directory, a chain, S3).
//!
//! Two kinds of fault:
//!
//! * *Crash-test faults*, driven by a seeded generator ([`FaultPlan`]): PUTs that fail
//!   before landing, land but report failure, or complete after a delay (so uploads
//!   finish out of order); an *outage* ([`FaultyStore::set_outage`]) failing every PUT;
//!   a *kill* ([`FaultyStore::kill`]): the process using the store died, so every later
//!   operation fails, including PUTs already issued but still delayed: they never land.
//!   Tests wrap the shared inner store in a new `FaultyStore` for each process
//!   incarnation, so a crashed engine's leftover tasks cannot change the store the next
//!   incarnation recovers from.
//! * *Switched faults* ([`Faults`], shared as an `Arc` so a test flips them while the
//!   engine runs): for any of PUT, GET, ranged GET, LIST and DELETE ([`Ops`]), fail
//!   every call, or the next N, with a [`Fault`] (transient, 403 denied, quota, full
//!   disk); slow every call by N ms (on the injected clock); lose the replies of the
//!   next N PUTs (they land, and report a transient failure); or take the whole store
//!   away (every call fails transient until it is back).
//!
//! Each failure is an error of the class the real store gives for it
//! (docs/SEMANTICS.md, "Store error classes"), so what a test sees is what production
//! would.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::layer::{Call, CallFuture, Layer, Layered, Next};
use super::{BoxFuture, DynStore, StoreResult};
use crate::clock::SharedClock;
use lsvd_core::error::{Error, ErrorKind};

#[derive(Debug, Clone, Copy, Default)]
pub struct FaultPlan {
    /// Probability a PUT fails without landing.
    pub fail_put: f64,
    /// Probability a PUT lands but reports failure.
    pub land_then_fail: f64,
    /// Largest random delay added to a PUT, in milliseconds.
    pub max_put_delay_ms: u64,
}

/// What the decorator did, for test reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub puts: u64,
    /// PUTs that landed in the inner store (including those reported as failed).
    pub landed: u64,
    /// PUTs failed without landing (injected, outage, switched fault or killed).
    pub failed: u64,
    /// PUTs that landed but were reported as failed.
    pub lost_replies: u64,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    landed: AtomicU64,
    failed: AtomicU64,
    lost_replies: AtomicU64,
}

/// A set of store operations a switched fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ops(u8);

impl Ops {
    /// `put` and `put_placed` (and `repair_copies`, which writes).
    pub const PUT: Ops = Ops(1);
    /// `get` (and `get_copy`).
    pub const GET: Ops = Ops(2);
    /// `get_range`, `get_range_background` (and `get_range_copies`).
    pub const GET_RANGE: Ops = Ops(4);
    pub const LIST: Ops = Ops(8);
    pub const DELETE: Ops = Ops(16);
    /// Whole and ranged GETs.
    pub const READS: Ops = Ops(2 | 4);
    pub const ALL: Ops = Ops(31);

    fn slots(self) -> impl Iterator<Item = usize> {
        (0..OP_COUNT).filter(move |i| self.0 & (1 << i) != 0)
    }

    fn slot(self) -> usize {
        self.0.trailing_zeros() as usize
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, other: Ops) -> Ops {
        Ops(self.0 | other.0)
    }
}

const OP_COUNT: usize = 5;

/// How a switched fault fails a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A timeout or a reset: `Transient`.
    Transient,
    /// HTTP 403 AccessDenied (or EACCES on a local store): `Denied`.
    Denied,
    /// S3 `QuotaExceeded` (HTTP 403, as versitygw and Ceph send it): `Full`.
    QuotaExceeded,
    /// ENOSPC from the local store, as [`super::fs::FsStore`] reports it: `Full`, with
    /// the `io::Error` as its source.
    DiskFull,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::Transient => 1,
            Fault::Denied => 2,
            Fault::QuotaExceeded => 3,
            Fault::DiskFull => 4,
        }
    }

    fn from_code(code: u8) -> Option<Fault> {
        match code {
            1 => Some(Fault::Transient),
            2 => Some(Fault::Denied),
            3 => Some(Fault::QuotaExceeded),
            4 => Some(Fault::DiskFull),
            _ => None,
        }
    }

    /// The error this fault gives `what` (e.g. "put v/obj/1.d").
    pub fn error(self, what: &str) -> Error {
        match self {
            Fault::Transient => Error::new(
                ErrorKind::Transient,
                format!("{what}: connection reset by peer (injected)"),
            ),
            Fault::Denied => Error::new(
                ErrorKind::Denied,
                format!("{what}: HTTP 403 AccessDenied: Access Denied. (injected)"),
            ),
            Fault::QuotaExceeded => Error::new(
                ErrorKind::Full,
                format!(
                    "{what}: HTTP 403 QuotaExceeded: Your request was denied due to quota exceeded. (injected)"
                ),
            ),
            Fault::DiskFull => {
                let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
                Error::with_source(
                    super::fs::io_error_kind(&e),
                    format!("{what} (injected)"),
                    e,
                )
            }
        }
    }
}

/// The switched faults of one operation.
#[derive(Default)]
struct Slot {
    /// [`Fault::code`], 0 for none.
    fault: AtomicU8,
    /// Calls still to fail; `u64::MAX`: every call until healed.
    remaining: AtomicU64,
    /// Delay before each call, in milliseconds.
    delay_ms: AtomicU64,
    /// Calls failed by the switched fault or the store being away.
    injected: AtomicU64,
}

/// Faults a test switches on and off at run time, shared between the test and one or
/// more [`FaultyStore`]s ([`FaultyStore::with_faults`]).
#[derive(Default)]
pub struct Faults {
    slots: [Slot; OP_COUNT],
    away: AtomicBool,
    /// PUTs still to land but report a lost reply ([`Faults::lose_next_replies`]).
    replies_to_lose: AtomicU64,
}

impl Faults {
    /// No faults.
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults::default())
    }

    /// Fail every call of `ops` with `fault` from now on (until [`heal`](Self::heal)).
    pub fn fail(&self, ops: Ops, fault: Fault) {
        self.fail_next(ops, fault, u64::MAX);
    }

    /// Fail the next `calls` calls of each operation in `ops` with `fault`, then let
    /// them through again.
    pub fn fail_next(&self, ops: Ops, fault: Fault, calls: u64) {
        for i in ops.slots() {
            self.slots[i].remaining.store(calls, Ordering::SeqCst);
            self.slots[i].fault.store(fault.code(), Ordering::SeqCst);
        }
    }

    /// No more failures for `ops` (delays stay).
    pub fn heal(&self, ops: Ops) {
        for i in ops.slots() {
            self.slots[i].fault.store(0, Ordering::SeqCst);
        }
    }

    /// Delay every call of `ops` by `ms` milliseconds before it reaches the store (0:
    /// no delay). On the store's clock ([`FaultyStore::with_clock`]).
    pub fn slow(&self, ops: Ops, ms: u64) {
        for i in ops.slots() {
            self.slots[i].delay_ms.store(ms, Ordering::SeqCst);
        }
    }

    /// Take the whole store away (every call of every operation fails `Transient`,
    /// "connection refused") or bring it back.
    pub fn set_away(&self, away: bool) {
        self.away.store(away, Ordering::SeqCst);
    }

    pub fn is_away(&self) -> bool {
        self.away.load(Ordering::SeqCst)
    }

    /// The next `puts` PUTs land but their reply is lost: each reports a transient
    /// failure (a store that died, or a connection cut, after it stored the object).
    pub fn lose_next_replies(&self, puts: u64) {
        self.replies_to_lose.store(puts, Ordering::SeqCst);
    }

    /// Takes one lost reply, if any are left to lose.
    fn take_lost_reply(&self) -> bool {
        self.replies_to_lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
            .is_ok()
    }

    /// Every fault and delay off, the store back.
    pub fn clear(&self) {
        self.replies_to_lose.store(0, Ordering::SeqCst);
        self.heal(Ops::ALL);
        self.slow(Ops::ALL, 0);
        self.set_away(false);
    }

    /// Calls of `ops` failed so far by a switched fault or the store being away.
    pub fn injected(&self, ops: Ops) -> u64 {
        ops.slots()
            .map(|i| self.slots[i].injected.load(Ordering::SeqCst))
            .sum()
    }

    fn delay(&self, op: Ops) -> Duration {
        Duration::from_millis(self.slots[op.slot()].delay_ms.load(Ordering::SeqCst))
    }

    /// The failure for a call of `op` on `what` now, if any (counted).
    fn failure(&self, op: Ops, what: &str) -> Option<Error> {
        let slot = &self.slots[op.slot()];
        let err = if self.is_away() {
            Error::new(
                ErrorKind::Transient,
                format!("{what}: connection refused: the store is away (injected)"),
            )
        } else {
            let fault = Fault::from_code(slot.fault.load(Ordering::SeqCst))?;
            let took = slot
                .remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| match r {
                    0 => None,
                    u64::MAX => Some(u64::MAX),
                    r => Some(r - 1),
                })
                .is_ok();
            if !took {
                return None;
            }
            fault.error(what)
        };
        slot.injected.fetch_add(1, Ordering::SeqCst);
        Some(err)
    }
}

/// The faults, as a [`Layer`]; reached through a [`FaultyStore`] (which derefs to it).
pub struct Faulty {
    plan: FaultPlan,
    rng: Mutex<u64>,
    /// While set, every PUT fails (a store outage).
    pub outage: AtomicBool,
    killed: AtomicBool,
    /// While set, every ranged GET fails.
    range_reads_failing: AtomicBool,
    /// While set, every DELETE fails (a store policy without delete permission).
    deletes_failing: AtomicBool,
    /// Kill the store when this many more PUTs or DELETEs have been issued.
    kill_after: Mutex<Option<u64>>,
    /// Delay before every GET (slow reads that race with other work).
    get_delay_ms: AtomicU64,
    faults: Arc<Faults>,
    clock: SharedClock,
    counters: Counters,
}

/// A store with [`Faulty`]'s faults around every call.
pub type FaultyStore = Layered<Faulty>;

impl Layered<Faulty> {
    pub fn new(inner: DynStore, plan: FaultPlan, seed: u64) -> Self {
        Layered::wrap(inner, Faulty::new(plan, seed))
    }

    /// The same store, switched by `faults` (shared with the test, and with other
    /// stores that should see the same faults).
    pub fn with_faults(self, faults: Arc<Faults>) -> Self {
        self.map_layer(|f| Faulty { faults, ..f })
    }

    /// The same store, with its delays (the plan's, [`Faults::slow`], the GET delay)
    /// slept on `clock`.
    pub fn with_clock(self, clock: SharedClock) -> Self {
        self.map_layer(|f| Faulty { clock, ..f })
    }
}

impl Faulty {
    fn new(plan: FaultPlan, seed: u64) -> Self {
        Faulty {
            plan,
            rng: Mutex::new(seed | 1),
            outage: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            range_reads_failing: AtomicBool::new(false),
            deletes_failing: AtomicBool::new(false),
            kill_after: Mutex::new(None),
            get_delay_ms: AtomicU64::new(0),
            faults: Faults::new(),
            clock: SharedClock::default(),
            counters: Counters::default(),
        }
    }

    /// The switched faults of this store.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    /// Start or end an outage: while on, every PUT fails without landing.
    pub fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
    }

    /// Start or end failing object reads: while on, every ranged GET fails.
    pub fn set_range_reads_failing(&self, on: bool) {
        self.range_reads_failing.store(on, Ordering::SeqCst);
    }

    /// Start or end failing deletes: while on, every DELETE fails.
    pub fn set_deletes_failing(&self, on: bool) {
        self.deletes_failing.store(on, Ordering::SeqCst);
    }

    fn range_read_failure(&self, key: &str) -> Option<Error> {
        self.range_reads_failing.load(Ordering::SeqCst).then(|| {
            Error::new(
                ErrorKind::Transient,
                format!("injected failure getting {key}"),
            )
        })
    }

    /// The process died: from now on every operation fails, and PUTs still waiting
    /// out their delay never land.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }

    /// Delay every later GET (and ranged GET) by `ms` before it reaches the store.
    pub fn set_get_delay_ms(&self, ms: u64) {
        self.get_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Kill the store when the `n`-th PUT or DELETE from now is issued (that one fails
    /// too): a crash at a chosen point of recovery or upload.
    pub fn kill_after_mutations(&self, n: u64) {
        *self.kill_after.lock().unwrap_or_else(|p| p.into_inner()) = Some(n);
    }

    /// Count a PUT or DELETE against an armed kill.
    fn mutation(&self) {
        let mut g = self.kill_after.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = g.as_mut() {
            if *n <= 1 {
                *g = None;
                self.kill();
            } else {
                *n -= 1;
            }
        }
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    pub fn stats(&self) -> FaultStats {
        let c = &self.counters;
        FaultStats {
            puts: c.puts.load(Ordering::Relaxed),
            landed: c.landed.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            lost_replies: c.lost_replies.load(Ordering::Relaxed),
        }
    }

    fn next_f64(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn sleep(&self, d: Duration) {
        if !d.is_zero() {
            self.clock.sleep(d).await;
        }
    }

    /// The error of a call on a store whose client is gone; `what` names the call.
    fn killed_err(what: &str) -> Error {
        Error::new(
            ErrorKind::Transient,
            format!("{what}: store client is gone (simulated crash)"),
        )
    }

    /// A call of `op` with the switched faults: its delay, then failure once killed,
    /// while the store is away or a fault is on, else `next`.
    fn switched<'a, T: Send + 'a>(
        &'a self,
        op: Ops,
        what: String,
        mut next: Next<'a, T>,
    ) -> CallFuture<'a, T> {
        Box::pin(async move {
            self.sleep(self.faults.delay(op)).await;
            if self.is_killed() {
                return Err(Self::killed_err(&what));
            }
            if let Some(e) = self.faults.failure(op, &what) {
                return Err(e);
            }
            next().await
        })
    }

    /// A read with this store's faults: the GET delay, then the switched faults.
    fn faulty_read<'a, T: Send + 'a>(
        &'a self,
        op: Ops,
        key: String,
        next: Next<'a, T>,
    ) -> CallFuture<'a, T> {
        Box::pin(async move {
            let get_delay_ms = self.get_delay_ms.load(Ordering::SeqCst);
            self.sleep(Duration::from_millis(get_delay_ms)).await;
            self.switched(op, format!("get {key}"), next).await
        })
    }

    /// A put with the plan's faults (drawn when the put is issued) and the switched
    /// ones.
    fn faulty_put<'a, T: Send + 'a>(
        &'a self,
        key: String,
        mut next: Next<'a, T>,
    ) -> BoxFuture<'a, StoreResult<T>> {
        let delay = (self.next_f64() * self.plan.max_put_delay_ms as f64) as u64;
        let fail = self.next_f64() < self.plan.fail_put;
        let land_then_fail = self.next_f64() < self.plan.land_then_fail;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.mutation();
        Box::pin(async move {
            self.sleep(Duration::from_millis(delay) + self.faults.delay(Ops::PUT))
                .await;
            if self.is_killed() {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(Self::killed_err(&format!("putting {key}")));
            }
            // The outage is judged when the request reaches the store, after the delay.
            if fail || self.outage.load(Ordering::SeqCst) {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!("injected failure putting {key}"),
                ));
            }
            if let Some(e) = self.faults.failure(Ops::PUT, &format!("put {key}")) {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
            let answer = next().await?;
            self.counters.landed.fetch_add(1, Ordering::Relaxed);
            if land_then_fail || self.faults.take_lost_reply() {
                self.counters.lost_replies.fetch_add(1, Ordering::Relaxed);
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!("injected lost reply putting {key}"),
                ));
            }
            Ok(answer)
        })
    }
}

fn failed<'a, T: Send + 'a>(e: Error) -> BoxFuture<'a, StoreResult<T>> {
    Box::pin(async move { Err(e) })
}

impl Layer for Faulty {
    fn around<'a, T: Send + 'a>(&'a self, call: Call, mut next: Next<'a, T>) -> CallFuture<'a, T> {
        match call {
            Call::Put { key, .. } => self.faulty_put(key, next),
            Call::Get { key } => self.faulty_read(Ops::GET, key, next),
            Call::GetRange { key, .. } => match self.range_read_failure(&key) {
                Some(e) => failed(e),
                // The inner store's own background path (the local store's blocking
                // pool) for background reads, so GC under test reads as it does live.
                None => self.faulty_read(Ops::GET_RANGE, key, next),
            },
            Call::List { prefix } => self.switched(Ops::LIST, format!("list '{prefix}'"), next),
            Call::Delete { key } => {
                self.mutation();
                if self.is_killed() {
                    return failed(Self::killed_err(&format!("deleting {key}")));
                }
                if self.deletes_failing.load(Ordering::SeqCst) {
                    return failed(Error::new(
                        ErrorKind::Permanent,
                        format!("injected failure deleting {key}: access denied"),
                    ));
                }
                self.switched(Ops::DELETE, format!("delete {key}"), next)
            }
            Call::GetRangeCopies { key, .. } => {
                if self.is_killed() {
                    return failed(Self::killed_err(&format!("reading copies of {key}")));
                }
                self.switched(Ops::GET_RANGE, format!("get copies of {key}"), next)
            }
            Call::RepairCopies { key } => {
                // A write: nothing reaches the store after a simulated crash.
                self.mutation();
                if self.is_killed() {
                    return failed(Self::killed_err(&format!("repairing {key}")));
                }
                self.switched(Ops::PUT, format!("repair {key}"), next)
            }
            Call::CopiesOf { .. } => next(),
            Call::GetCopy { key, copy } => {
                if self.is_killed() {
                    return failed(Self::killed_err(&format!("reading a copy of {key}")));
                }
                self.switched(Ops::GET, format!("get copy {copy} of {key}"), next)
            }
        }
    }

    fn describe(&self, inner: String) -> String {
        format!("faulty({inner})")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::clock::{Clock as _, ManualClock};
    use crate::mem::MemStore;
    use crate::retry::{RetryPolicy, RetryStore};
    use crate::testutil::TempDir;
    use crate::{ObjectStore, PutMode};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn kill_stops_delayed_puts_and_outage_fails_puts() {
        rt().block_on(async {
            let mem = MemStore::new();
            let plan = FaultPlan {
                max_put_delay_ms: 20,
                ..Default::default()
            };
            let f = Arc::new(FaultyStore::new(Arc::new(mem.clone()), plan, 7));
            f.set_outage(true);
            assert!(
                f.put("a", Bytes::from_static(&[1]), PutMode::IfAbsent)
                    .await
                    .is_err()
            );
            f.set_outage(false);
            f.put("a", Bytes::from_static(&[1]), PutMode::IfAbsent)
                .await
                .expect("put");
            let g = f.clone();
            let pending = tokio::spawn(async move {
                g.put("b", Bytes::from_static(&[2]), PutMode::IfAbsent)
                    .await
                    .is_err()
            });
            f.kill();
            assert!(
                pending.await.expect("join"),
                "a put in flight at the kill fails"
            );
            assert!(f.get("a").await.is_err());
            assert!(f.get_range("a", 0..1).await.is_err());
            assert!(
                f.get_range_background("a", 0..1).await.is_err(),
                "GC's reads see the kill too"
            );
            assert_eq!(mem.snapshot().len(), 1, "only the first put landed");
            let s = f.stats();
            assert_eq!((s.puts, s.landed), (3, 1));
        });
    }

    /// A memory store holding "k" = "v".
    async fn seeded_mem() -> MemStore {
        let mem = MemStore::new();
        let seed = mem.put("k", Bytes::from_static(b"v"), PutMode::Overwrite);
        seed.await.expect("seed");
        mem
    }

    /// Every operation, one at a time, failed by every switched fault: the call
    /// fails with the class the real store gives, nothing reaches the inner store, the
    /// other operations pass, and healing lets the operation through again.
    #[test]
    fn switched_faults_fail_each_operation_with_its_class() {
        rt().block_on(async {
            let mem = seeded_mem().await;
            let f = FaultyStore::new(Arc::new(mem.clone()), FaultPlan::default(), 1);
            let faults = f.faults().clone();
            let cases = [
                (Fault::Transient, ErrorKind::Transient),
                (Fault::Denied, ErrorKind::Denied),
                (Fault::QuotaExceeded, ErrorKind::Full),
                (Fault::DiskFull, ErrorKind::Full),
            ];
            for (fault, kind) in cases {
                for op in [Ops::PUT, Ops::GET, Ops::GET_RANGE, Ops::LIST, Ops::DELETE] {
                    faults.fail(op, fault);
                    let results = [
                        (
                            Ops::PUT,
                            f.put("n", Bytes::from_static(b"x"), PutMode::IfAbsent)
                                .await
                                .err(),
                        ),
                        (Ops::GET, f.get("k").await.err()),
                        (Ops::GET_RANGE, f.get_range("k", 0..1).await.err()),
                        (
                            Ops::GET_RANGE,
                            f.get_range_background("k", 0..1).await.err(),
                        ),
                        (Ops::LIST, f.list("").await.err()),
                        (Ops::DELETE, f.delete("n").await.err()),
                    ];
                    for (which, err) in results {
                        if which == op {
                            let e = err.unwrap_or_else(|| panic!("{op:?} {fault:?}: not failed"));
                            assert_eq!(e.kind, kind, "{op:?} {fault:?}: {e}");
                            assert!(e.to_string().contains("injected"), "{e}");
                        } else {
                            assert!(err.is_none(), "{which:?} failed under a fault of {op:?}");
                        }
                    }
                    faults.heal(op);
                    // A failed put left nothing; the put beside a failed delete landed.
                    let want = if op == Ops::DELETE { 2 } else { 1 };
                    assert_eq!(mem.snapshot().len(), want, "{op:?} {fault:?}");
                    f.delete("n").await.expect("healed");
                }
            }
            // A full disk is ENOSPC underneath, as the local store reports it.
            let e = Fault::DiskFull.error("put k");
            let io = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .expect("an io::Error source");
            assert_eq!(io.raw_os_error(), Some(libc::ENOSPC));
            assert_eq!(faults.injected(Ops::ALL), 4 * 6);
            assert_eq!(faults.injected(Ops::GET_RANGE), 4 * 2);
            let s = f.stats();
            assert_eq!(s.failed, 4, "the failed puts are counted");
        });
    }

    /// `fail_next` fails a number of calls, then lets them through: the retry layer on
    /// top retries a transient failure and returns a denied one at once.
    #[test]
    fn a_few_failures_then_through_under_the_retry_layer() {
        rt().block_on(async {
            let mem = seeded_mem().await;
            let faulty = Arc::new(FaultyStore::new(Arc::new(mem), FaultPlan::default(), 1));
            let policy = RetryPolicy {
                initial_backoff: Duration::ZERO,
                jitter_seed: Some(1),
                ..RetryPolicy::default()
            };
            let s = RetryStore::new(faulty.clone(), policy);
            faulty.faults().fail_next(Ops::READS, Fault::Transient, 2);
            assert_eq!(s.get("k").await.expect("third try"), b"v");
            assert_eq!(faulty.faults().injected(Ops::GET), 2);
            assert_eq!(s.get_range("k", 0..1).await.expect("third try"), b"v");
            faulty.faults().fail_next(Ops::LIST, Fault::Denied, 2);
            for _ in 0..2 {
                let e = s.list("").await.expect_err("denied, at once");
                assert_eq!(e.kind, ErrorKind::Denied);
            }
            assert_eq!(faulty.faults().injected(Ops::LIST), 2, "not retried");
            assert_eq!(s.list("").await.expect("then through").len(), 1);
        });
    }

    /// The store away: every call fails transient until it is back; slow calls wait
    /// their delay on the injected clock, and only that long.
    #[test]
    fn the_store_away_and_slow_calls() {
        rt().block_on(async {
            let mem = MemStore::new();
            let clock = ManualClock::new();
            let f = Arc::new(
                FaultyStore::new(Arc::new(mem.clone()), FaultPlan::default(), 1)
                    .with_clock(SharedClock(clock.clone())),
            );
            f.faults().set_away(true);
            let e = f
                .put("a", Bytes::from_static(b"1"), PutMode::IfAbsent)
                .await
                .expect_err("away");
            assert_eq!(e.kind, ErrorKind::Transient);
            assert!(e.to_string().contains("away"), "{e}");
            for e in [
                f.get("a").await.err(),
                f.get_range("a", 0..1).await.err(),
                f.list("").await.map(|_| ()).err(),
                f.delete("a").await.err(),
            ] {
                assert_eq!(e.expect("away").kind, ErrorKind::Transient);
            }
            assert_eq!(f.faults().injected(Ops::ALL), 5);
            f.faults().set_away(false);
            f.put("a", Bytes::from_static(b"1"), PutMode::IfAbsent)
                .await
                .expect("back");

            f.faults().slow(Ops::LIST, 500);
            let g = f.clone();
            let listing = tokio::spawn(async move { g.list("").await.map(|l| l.len()) });
            while clock.sleepers() == 0 {
                tokio::task::yield_now().await;
            }
            clock.advance(Duration::from_millis(499));
            tokio::task::yield_now().await;
            assert!(!listing.is_finished(), "still waiting out its delay");
            clock.advance(Duration::from_millis(1));
            assert_eq!(listing.await.expect("join").expect("list"), 1);
            // Other operations are not slowed.
            assert_eq!(f.get("a").await.expect("get"), b"1");
            f.faults().clear();
            assert_eq!(f.list("").await.expect("list").len(), 1);
            assert_eq!(clock.now(), Duration::from_millis(500));
        });
    }

    /// Over a local directory and a chain: a full disk injected on PUT is what the
    /// local store itself reports for ENOSPC (`Full`), reads still work, and the same
    /// shared switches drive two decorators at once.
    #[test]
    fn decorates_the_local_and_the_chain_store() {
        rt().block_on(async {
            let dir = TempDir::new("faulty-over-fs");
            let fs: DynStore = Arc::new(crate::fs::FsStore::open(dir.path()).expect("fs"));
            let chain_dir = TempDir::new("faulty-over-chain");
            let chain =
                crate::chain::open_chain(&format!("{0}/a,{0}/b", chain_dir.path().display()))
                    .expect("chain");
            let faults = Faults::new();
            for inner in [fs, chain] {
                inner
                    .put("v/meta", Bytes::from_static(b"m"), PutMode::Overwrite)
                    .await
                    .expect("seed");
                let f = FaultyStore::new(inner.clone(), FaultPlan::default(), 1)
                    .with_faults(faults.clone());
                faults.fail(Ops::PUT, Fault::DiskFull);
                let e = f
                    .put(
                        "v/obj/0000000000000001.d",
                        Bytes::from_static(b"x"),
                        PutMode::IfAbsent,
                    )
                    .await
                    .expect_err("full");
                assert_eq!(e.kind, ErrorKind::Full, "{e}");
                assert!(e.to_string().contains("No space left on device"), "{e}");
                assert_eq!(f.get("v/meta").await.expect("reads work"), b"m");
                assert!(f.describe().starts_with("faulty("), "{}", f.describe());
                faults.heal(Ops::PUT);
                f.put(
                    "v/obj/0000000000000001.d",
                    Bytes::from_static(b"x"),
                    PutMode::IfAbsent,
                )
                .await
                .expect("room again");
            }
            assert_eq!(faults.injected(Ops::PUT), 2);
        });
    }
}
