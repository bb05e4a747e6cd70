//! A fault-injecting object store decorator for crash tests.
//!
//! Wraps any store and, driven by a seeded generator, makes PUTs fail before landing,
//! land but report failure, or complete after a delay (so uploads finish out of
//! order). Reads and lists pass through.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{
    BoxFuture, DynStore, ListEntry, ObjectStore, PutMode, StoreError, StoreErrorKind, StoreResult,
};

#[derive(Debug, Clone, Copy, Default)]
pub struct FaultPlan {
    /// Probability a PUT fails without landing.
    pub fail_put: f64,
    /// Probability a PUT lands but reports failure.
    pub land_then_fail: f64,
    /// Largest random delay added to a PUT, in milliseconds.
    pub max_put_delay_ms: u64,
}

pub struct FaultyStore {
    inner: DynStore,
    plan: FaultPlan,
    rng: Mutex<u64>,
    /// While set, every PUT fails (a store outage).
    pub outage: AtomicBool,
}

impl FaultyStore {
    pub fn new(inner: DynStore, plan: FaultPlan, seed: u64) -> Self {
        FaultyStore {
            inner,
            plan,
            rng: Mutex::new(seed | 1),
            outage: AtomicBool::new(false),
        }
    }

    fn next_f64(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl ObjectStore for FaultyStore {
    fn put(&self, key: &str, data: Vec<u8>, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        let delay = (self.next_f64() * self.plan.max_put_delay_ms as f64) as u64;
        let fail = self.outage.load(Ordering::SeqCst) || self.next_f64() < self.plan.fail_put;
        let land_then_fail = self.next_f64() < self.plan.land_then_fail;
        Box::pin(async move {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if fail {
                return Err(StoreError::new(
                    StoreErrorKind::Transient,
                    format!("injected failure putting {key}"),
                ));
            }
            self.inner.put(&key, data, mode).await?;
            if land_then_fail {
                return Err(StoreError::new(
                    StoreErrorKind::Transient,
                    format!("injected lost reply putting {key}"),
                ));
            }
            Ok(())
        })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get_range(key, range)
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.inner.delete(key)
    }
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}
