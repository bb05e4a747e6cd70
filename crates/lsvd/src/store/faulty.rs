//! A fault-injecting object store decorator for crash tests.
//!
//! Wraps any store and, driven by a seeded generator, makes PUTs fail before landing,
//! land but report failure, or complete after a delay (so uploads finish out of
//! order). Reads and lists pass through.
//!
//! Two switches model whole-store events:
//! - an *outage* ([`FaultyStore::set_outage`]): every PUT fails until it ends;
//! - a *kill* ([`FaultyStore::kill`]): the process using the store died. Every later
//!   operation fails, including PUTs already issued but still delayed: they never
//!   land. Tests wrap the shared inner store in a new `FaultyStore` for each process
//!   incarnation, so a crashed engine's leftover tasks cannot change the store the
//!   next incarnation recovers from.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, DynStore, ListEntry, ObjectStore, Placement, PutMode, StoreResult};
use crate::error::{Error, ErrorKind};

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
    /// PUTs failed without landing (injected, outage or killed).
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

pub struct FaultyStore {
    inner: DynStore,
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
    counters: Counters,
}

impl FaultyStore {
    /// A read with this store's faults: the plan's delay, then failure once killed.
    fn faulty_read<'a>(
        &'a self,
        key: &str,
        read: impl FnOnce(&'a dyn ObjectStore, &str) -> BoxFuture<'a, StoreResult<Vec<u8>>> + Send + 'a,
    ) -> BoxFuture<'a, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            self.get_delay().await;
            if self.is_killed() {
                return Err(Self::killed_err("getting", &key));
            }
            read(&*self.inner, &key).await
        })
    }

    pub fn new(inner: DynStore, plan: FaultPlan, seed: u64) -> Self {
        FaultyStore {
            inner,
            plan,
            rng: Mutex::new(seed | 1),
            outage: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            range_reads_failing: AtomicBool::new(false),
            deletes_failing: AtomicBool::new(false),
            kill_after: Mutex::new(None),
            get_delay_ms: AtomicU64::new(0),
            counters: Counters::default(),
        }
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

    async fn get_delay(&self) {
        let ms = self.get_delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    fn killed_err(what: &str, key: &str) -> Error {
        Error::new(
            ErrorKind::Transient,
            format!("{what} {key}: store client is gone (simulated crash)"),
        )
    }
}

impl ObjectStore for FaultyStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.put_placed(key, data, mode, &Placement::Client)
    }
    fn put_placed(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        let placement = placement.clone();
        let delay = (self.next_f64() * self.plan.max_put_delay_ms as f64) as u64;
        let fail = self.next_f64() < self.plan.fail_put;
        let land_then_fail = self.next_f64() < self.plan.land_then_fail;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.mutation();
        Box::pin(async move {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if self.is_killed() {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(Self::killed_err("putting", &key));
            }
            // The outage is judged when the request reaches the store, after the delay.
            if fail || self.outage.load(Ordering::SeqCst) {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!("injected failure putting {key}"),
                ));
            }
            self.inner.put_placed(&key, data, mode, &placement).await?;
            self.counters.landed.fetch_add(1, Ordering::Relaxed);
            if land_then_fail {
                self.counters.lost_replies.fetch_add(1, Ordering::Relaxed);
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!("injected lost reply putting {key}"),
                ));
            }
            Ok(())
        })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.faulty_read(key, |inner, key| inner.get(key))
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        if let Some(e) = self.range_read_failure(key) {
            return Box::pin(async move { Err(e) });
        }
        self.faulty_read(key, move |inner, key| inner.get_range(key, range))
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        if let Some(e) = self.range_read_failure(key) {
            return Box::pin(async move { Err(e) });
        }
        // The inner store's own background path (the local store's blocking pool), so
        // GC under test reads as it does live.
        self.faulty_read(key, move |inner, key| {
            inner.get_range_background(key, range)
        })
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        if self.is_killed() {
            let e = Self::killed_err("listing", prefix);
            return Box::pin(async move { Err(e) });
        }
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.mutation();
        if self.is_killed() {
            let e = Self::killed_err("deleting", key);
            return Box::pin(async move { Err(e) });
        }
        if self.deletes_failing.load(Ordering::SeqCst) {
            let e = Error::new(
                ErrorKind::Permanent,
                format!("injected failure deleting {key}: access denied"),
            );
            return Box::pin(async move { Err(e) });
        }
        self.inner.delete(key)
    }
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn admit_uploads_to_cache(&self) -> bool {
        self.inner.admit_uploads_to_cache()
    }
    fn metrics(&self) -> Vec<crate::store::StoreMetric> {
        self.inner.metrics()
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> crate::store::BoxFuture<'_, crate::store::StoreResult<Vec<crate::store::CopyBytes>>> {
        if self.is_killed() {
            let e = Self::killed_err("reading copies of", key);
            return Box::pin(async move { Err(e) });
        }
        self.inner.get_range_copies(key, range)
    }
    fn repair_copies(
        &self,
        key: &str,
        good: Bytes,
    ) -> crate::store::BoxFuture<'_, crate::store::StoreResult<Vec<String>>> {
        // A write: nothing reaches the store after a simulated crash.
        self.mutation();
        if self.is_killed() {
            let e = Self::killed_err("repairing", key);
            return Box::pin(async move { Err(e) });
        }
        self.inner.repair_copies(key, good)
    }
    fn copies_of(
        &self,
        key: &str,
    ) -> crate::store::BoxFuture<'_, crate::store::StoreResult<Vec<String>>> {
        self.inner.copies_of(key)
    }
    fn get_copy(
        &self,
        key: &str,
        copy: usize,
    ) -> crate::store::BoxFuture<'_, crate::store::StoreResult<Vec<u8>>> {
        if self.is_killed() {
            let e = Self::killed_err("reading a copy of", key);
            return Box::pin(async move { Err(e) });
        }
        self.inner.get_copy(key, copy)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::mem::MemStore;

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
}
