//! A retrying decorator for any store: bounded retries with exponential backoff and
//! jitter, and a deadline for each attempt.
//!
//! * `get`, `get_range`, `list`, `delete`: up to [`RetryPolicy::attempts`] tries while
//!   the error is `Transient` (or the attempt hit its deadline). `NotFound`,
//!   `AlreadyExists` and `Permanent` errors return at once. The last error is returned
//!   with the number of attempts appended.
//! * `put(IfAbsent)` passes straight through, without a deadline: it is not safe to
//!   re-send here. If an attempt lands but its answer is lost, a re-send reports
//!   `AlreadyExists`, and only the caller knows whether an earlier attempt of its own
//!   could have written the key. The engine's uploader already retries uploads
//!   forever and treats `AlreadyExists` after a failed attempt as "landed"; the
//!   underlying client bounds each request with its own timeout.
//! * `put(Overwrite)` is idempotent: it gets [`RetryPolicy::put_attempts`] tries
//!   (default 1, i.e. pass-through) with the same backoff.
//!
//! Delays: attempt `n` (from 1) waits `min(max_backoff, initial_backoff * 2^(n-1))`,
//! of which a random half is jitter ("equal jitter"), so clients that failed together
//! do not retry together.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, DynStore, ListEntry, ObjectStore, Placement, PutMode, StoreResult};
use crate::error::{Error, ErrorKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per get/get_range/list/delete, including the first. Default 4. Minimum 1.
    pub attempts: u32,
    /// Tries per `put(Overwrite)`. Default 1 (pass-through). `put(IfAbsent)`: always 1.
    pub put_attempts: u32,
    /// Delay after the first failure (before jitter). Default 200 ms.
    pub initial_backoff: Duration,
    /// Largest delay between attempts. Default 5 s.
    pub max_backoff: Duration,
    /// Deadline for one attempt of get/get_range/list/delete/put(Overwrite). Default
    /// 120 s (the S3 client's own request timeouts are shorter; this catches hangs).
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            put_attempts: 1,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `failed + 1`, given a uniform random `r` in [0, 1).
    fn delay(&self, failed: u32, r: f64) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << failed.saturating_sub(1).min(20));
        let cap = exp.min(self.max_backoff);
        cap / 2 + cap.mul_f64(r.clamp(0.0, 1.0) / 2.0)
    }
}

pub struct RetryStore {
    inner: DynStore,
    policy: RetryPolicy,
    rng: AtomicU64,
}

impl RetryStore {
    /// Wrap `inner`, with the jitter seeded from the clock and the process id (so
    /// processes that fail together spread their retries).
    pub fn new(inner: DynStore, policy: RetryPolicy) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()).rotate_left(32);
        Self::with_seed(inner, policy, seed)
    }

    /// Wrap `inner` with the jitter drawn from `seed`: the same seed gives the same
    /// delays (tests).
    pub fn with_seed(inner: DynStore, policy: RetryPolicy, seed: u64) -> Self {
        RetryStore {
            inner,
            policy,
            rng: AtomicU64::new(seed | 1),
        }
    }

    pub fn inner(&self) -> &DynStore {
        &self.inner
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A uniform value in [0, 1) (splitmix64 over a shared counter).
    fn random(&self) -> f64 {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn retry<T, F, Fut>(&self, what: &str, attempts: u32, mut op: F) -> StoreResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let attempts = attempts.max(1);
        let mut failed = 0u32;
        loop {
            let result = match tokio::time::timeout(self.policy.attempt_timeout, op()).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(
                    ErrorKind::Transient,
                    format!("{what}: no answer within {:?}", self.policy.attempt_timeout),
                )),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.kind == ErrorKind::Transient => {
                    failed += 1;
                    if failed >= attempts {
                        let mut e = e;
                        if attempts > 1 {
                            e.message =
                                format!("{} (gave up after {attempts} attempts)", e.message);
                        }
                        return Err(e);
                    }
                    crate::log::debug(&format!(
                        "{what} failed (attempt {failed} of {attempts}), retrying: {e}"
                    ));
                    tokio::time::sleep(self.policy.delay(failed, self.random())).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl ObjectStore for RetryStore {
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
        if mode == PutMode::IfAbsent || self.policy.put_attempts <= 1 {
            return self.inner.put_placed(key, data, mode, placement);
        }
        let key = key.to_string();
        let placement = placement.clone();
        Box::pin(async move {
            self.retry(&format!("put {key}"), self.policy.put_attempts, || {
                // A `Bytes` clone shares the buffer: no copy per attempt.
                self.inner.put_placed(&key, data.clone(), mode, &placement)
            })
            .await
        })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            self.retry(&format!("get {key}"), self.policy.attempts, || {
                self.inner.get(&key)
            })
            .await
        })
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            self.retry(
                &format!("get {key} bytes {range:?}"),
                self.policy.attempts,
                || self.inner.get_range(&key, range.clone()),
            )
            .await
        })
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            self.retry(
                &format!("get {key} bytes {range:?}"),
                self.policy.attempts,
                || self.inner.get_range_background(&key, range.clone()),
            )
            .await
        })
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            self.retry(&format!("list '{prefix}'"), self.policy.attempts, || {
                self.inner.list(&prefix)
            })
            .await
        })
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        Box::pin(async move {
            self.retry(&format!("delete {key}"), self.policy.attempts, || {
                self.inner.delete(&key)
            })
            .await
        })
    }
    fn describe(&self) -> String {
        self.inner.describe()
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
        self.inner.get_range_copies(key, range)
    }
    fn repair_copies(
        &self,
        key: &str,
        good: Bytes,
    ) -> crate::store::BoxFuture<'_, crate::store::StoreResult<Vec<String>>> {
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
        self.inner.get_copy(key, copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use crate::store::mem::MemStore;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;

    /// Fails the first `fail` calls of each operation with `kind`; can also hang.
    struct Flaky {
        inner: MemStore,
        fail: u32,
        kind: ErrorKind,
        calls: AtomicU32,
        hang: bool,
    }

    impl Flaky {
        fn new(fail: u32, kind: ErrorKind) -> Self {
            Flaky {
                inner: MemStore::new(),
                fail,
                kind,
                calls: AtomicU32::new(0),
                hang: false,
            }
        }
        fn gate(&self) -> Option<StoreError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            (n < self.fail).then(|| StoreError::new(self.kind, format!("injected #{n}")))
        }
    }

    impl ObjectStore for Flaky {
        fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
            if let Some(e) = self.gate() {
                return Box::pin(async move { Err(e) });
            }
            self.inner.put(key, data, mode)
        }
        fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            if self.hang {
                self.calls.fetch_add(1, Ordering::SeqCst);
                return Box::pin(std::future::pending());
            }
            if let Some(e) = self.gate() {
                return Box::pin(async move { Err(e) });
            }
            self.inner.get(key)
        }
        fn get_range(&self, key: &str, r: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            if let Some(e) = self.gate() {
                return Box::pin(async move { Err(e) });
            }
            self.inner.get_range(key, r)
        }
        fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
            if let Some(e) = self.gate() {
                return Box::pin(async move { Err(e) });
            }
            self.inner.list(prefix)
        }
        fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
            if let Some(e) = self.gate() {
                return Box::pin(async move { Err(e) });
            }
            self.inner.delete(key)
        }
        fn describe(&self) -> String {
            "flaky://".into()
        }
    }

    /// Jitter seed for every store under test: the delays are the same on every run.
    const SEED: u64 = 0x5EED_7E57;

    fn fast() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            put_attempts: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            attempt_timeout: Duration::from_millis(200),
        }
    }

    #[tokio::test]
    async fn retries_transient_errors_then_succeeds() {
        let flaky = Arc::new(Flaky::new(3, ErrorKind::Transient));
        flaky
            .inner
            .put("k", Bytes::from_static(b"v"), PutMode::Overwrite)
            .await
            .expect("seed");
        let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
        assert_eq!(s.get("k").await.expect("4th attempt succeeds"), b"v");
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 4);
        assert_eq!(s.describe(), "flaky://");
    }

    #[tokio::test]
    async fn gives_up_after_bounded_attempts() {
        let flaky = Arc::new(Flaky::new(100, ErrorKind::Transient));
        let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
        let e = s.list("").await.expect_err("always failing");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("gave up after 4 attempts"), "{e}");
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn does_not_retry_definite_answers() {
        for kind in [
            ErrorKind::Permanent,
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
        ] {
            let flaky = Arc::new(Flaky::new(100, kind));
            let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
            assert_eq!(s.delete("k").await.expect_err("fails").kind, kind);
            assert_eq!(flaky.calls.load(Ordering::SeqCst), 1, "{kind:?}");
        }
        // A missing object is NotFound at once, not after retries.
        let s = RetryStore::with_seed(Arc::new(MemStore::new()), fast(), SEED);
        assert!(s.get("missing").await.expect_err("nf").is_not_found());
    }

    #[tokio::test]
    async fn put_if_absent_passes_through_overwrite_retries() {
        let flaky = Arc::new(Flaky::new(1, ErrorKind::Transient));
        let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
        let e = s
            .put("k", Bytes::from_static(b"a"), PutMode::IfAbsent)
            .await
            .expect_err("one attempt only");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 1);

        let flaky = Arc::new(Flaky::new(2, ErrorKind::Transient));
        let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
        s.put("k", Bytes::from_static(b"a"), PutMode::Overwrite)
            .await
            .expect("third attempt lands");
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn attempts_have_a_deadline() {
        let mut flaky = Flaky::new(0, ErrorKind::Transient);
        flaky.hang = true;
        let flaky = Arc::new(flaky);
        let policy = RetryPolicy {
            attempts: 2,
            attempt_timeout: Duration::from_millis(30),
            ..fast()
        };
        let s = RetryStore::with_seed(flaky.clone(), policy, SEED);
        let t = std::time::Instant::now();
        let e = s.get("k").await.expect_err("hangs");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("no answer within"), "{e}");
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 2);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..RetryPolicy::default()
        };
        assert_eq!(p.delay(1, 0.0), Duration::from_millis(50));
        assert!(p.delay(1, 0.999_999) < Duration::from_millis(100));
        assert_eq!(p.delay(2, 0.0), Duration::from_millis(100));
        assert_eq!(p.delay(3, 0.0), Duration::from_millis(200));
        assert_eq!(p.delay(30, 0.0), Duration::from_millis(500));
        assert!(p.delay(30, 0.99) <= Duration::from_secs(1));
        let s = RetryStore::with_seed(Arc::new(MemStore::new()), p, SEED);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let r = s.random();
            assert!((0.0..1.0).contains(&r));
            seen.insert((r * 1000.0) as u32);
        }
        assert!(seen.len() > 50, "jitter should vary");
        // The same seed draws the same jitter.
        let again = RetryStore::with_seed(Arc::new(MemStore::new()), RetryPolicy::default(), SEED);
        let first = RetryStore::with_seed(Arc::new(MemStore::new()), RetryPolicy::default(), SEED);
        for _ in 0..10 {
            assert_eq!(again.random().to_bits(), first.random().to_bits());
        }
    }
}
