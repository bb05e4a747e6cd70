//! The one retry layer of the store: which errors are worth another try, how long to
//! wait between tries, and a decorator ([`RetryStore`]) that retries a store's calls
//! that way, each call within a deadline.
//!
//! Why one: retrying was written in several places with different rules (which kinds,
//! which delays, for how long), and a full disk or a refused key was retried forever.
//! The rules, for every store [`super::open_store`] opens (local directory, chain,
//! stripe, S3, GCS, Azure; `mem://` excepted) and for loops elsewhere that retry
//! store calls themselves ([`is_retryable`], [`Backoff`]):
//!
//! * Only [`Transient`](ErrorKind::Transient) is retried (timeouts, 5xx, resets,
//!   throttling). `Full`, `Denied`, `Corrupt`, `Permanent`, `NotFound` and
//!   `AlreadyExists` are answers: returned at once (docs/SEMANTICS.md, "Store error
//!   classes").
//! * Delays grow exponentially with "equal jitter": the `n`-th waits a random time in
//!   `[d/2, d)`, `d = min(max, first * 2^(n-1))`, so clients that failed together do
//!   not retry together. The randomness is a seeded generator (splitmix64), never the
//!   clock: the same seed gives the same delays. Sleeps go through an injected
//!   [`Clock`](crate::clock::Clock) (tests move a [`ManualClock`](crate::clock::ManualClock)).
//! * Every call has a deadline ([`RetryPolicy::deadline`], default 300 s) and every
//!   attempt a timeout ([`RetryPolicy::attempt_timeout`], default 120 s, shortened
//!   to what is left of the deadline): an attempt that does not answer in time is a
//!   `Transient` "no answer within", and no retry is started that would end past the
//!   deadline. The last error is returned with the number of attempts appended.
//!
//! What each call gets:
//!
//! * `get`, `get_range`, `list`, `delete`: up to [`RetryPolicy::attempts`] tries
//!   (default 4: delays of 100-200, 200-400, 400-800 ms).
//! * `put(Overwrite)` is idempotent: [`RetryPolicy::put_attempts`] tries (default 1).
//! * `put(IfAbsent)`: one attempt, with the attempt timeout. It is not safe to
//!   re-send here: if an attempt lands but its answer is lost, a re-send reports
//!   `AlreadyExists`, and only the caller knows whether an earlier attempt of its own
//!   could have written the key. The engine's uploader retries uploads itself (with a
//!   fencing check between attempts) and treats `AlreadyExists` with its own bytes as
//!   landed.
//!
//! A local read that is answered at once (the local store serves small ranges inline)
//! costs no timer: an attempt's timeout is armed only if its first poll is pending.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use super::layer::{Call, CallFuture, Layer, Layered, Next};
use super::{DynStore, PutMode, StoreResult};
use crate::clock::SharedClock;
use lsvd_core::error::{Error, ErrorKind};

/// Is an error of `kind` worth another try? Only [`ErrorKind::Transient`]: every other
/// kind is the store's answer, and asking again gets the same one (a full disk stays
/// full until someone makes room, a refused key stays refused).
pub fn is_retryable(kind: ErrorKind) -> bool {
    kind == ErrorKind::Transient
}

/// splitmix64's increment.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform value in [0, 1) from 64 random bits.
fn fraction(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The delay before try `failed + 1` (`failed` >= 1), given a uniform `r` in [0, 1):
/// `d = min(max, first * 2^(failed-1))`, then a time in `[d/2, d)`.
fn jittered(first: Duration, max: Duration, failed: u32, r: f64) -> Duration {
    let exp = first.saturating_mul(1u32 << failed.saturating_sub(1).min(20));
    let cap = exp.min(max);
    cap / 2 + cap.mul_f64(r.clamp(0.0, 1.0) / 2.0)
}

/// A seed for jitter that differs between processes and stores, without the clock:
/// the standard library's per-process random hash keys.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// Delays for a retry loop: the first [`Backoff::FIRST`] (50 ms), doubling, capped at
/// [`Backoff::MAX`] (5 s), each with equal jitter (a random time in `[d/2, d)`) drawn
/// from a seeded generator. An endless iterator; [`Backoff::reset`] after a success.
///
/// For loops that cannot use [`RetryStore`] (the engine's uploads, which check fencing
/// between attempts):
///
/// ```
/// use lsvd_core::error::ErrorKind;
/// use lsvd_store::retry::{Backoff, is_retryable};
/// let mut backoff = Backoff::new(7);
/// for kind in [ErrorKind::Transient, ErrorKind::Full] {
///     if !is_retryable(kind) {
///         break; // reported at once
///     }
///     let delay = backoff.next_delay(); // sleep this long on the injected clock
///     assert!(delay < Backoff::FIRST);
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    failures: u32,
    rng: u64,
}

impl Backoff {
    /// The first delay (before jitter).
    pub const FIRST: Duration = Duration::from_millis(50);
    /// The largest delay.
    pub const MAX: Duration = Duration::from_secs(5);

    /// [`FIRST`](Self::FIRST) doubling to [`MAX`](Self::MAX), jitter drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_bounds(Self::FIRST, Self::MAX, seed)
    }

    /// `first` doubling to `max`, jitter drawn from `seed`.
    pub fn with_bounds(first: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            first,
            max: max.max(first),
            failures: 0,
            rng: seed,
        }
    }

    /// The delay after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.rng = self.rng.wrapping_add(GAMMA);
        jittered(self.first, self.max, self.failures, fraction(mix(self.rng)))
    }

    /// Failures counted since the start or the last [`reset`](Self::reset).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Start again from the first delay (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Iterator for Backoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// What [`put_if_absent_retried`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutIfAbsent {
    /// This call's put created the key.
    Landed,
    /// The key exists, holding these bytes: an earlier attempt of the caller's whose
    /// answer was lost, or another writer's. Only the caller can tell which.
    Exists(Vec<u8>),
}

/// Put `bytes` under `key` if it is absent, trying again after a `Transient` failure
/// (at most `attempts` tries, `backoff`'s delays slept on `clock`); a key that exists
/// is read back and handed to the caller. The one retry rule of the writes that must
/// never overwrite (volume superblocks, snapshot records), where a retry after a lost
/// answer finds the caller's own object. Any other failure is returned at once; the
/// last transient one after `attempts` tries, saying so. `what` names the write for
/// the warning logged at the first retry.
pub async fn put_if_absent_retried(
    store: &dyn super::ObjectStore,
    key: &str,
    bytes: bytes::Bytes,
    attempts: u32,
    clock: &dyn crate::clock::Clock,
    backoff: &mut Backoff,
    what: &str,
) -> StoreResult<PutIfAbsent> {
    let attempts = attempts.max(1);
    let mut tried = 0;
    loop {
        tried += 1;
        match store.put(key, bytes.clone(), PutMode::IfAbsent).await {
            Ok(()) => return Ok(PutIfAbsent::Landed),
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                return store
                    .get(key)
                    .await
                    .map(PutIfAbsent::Exists)
                    .map_err(|e| e.context(format!("{key} exists but cannot be read back")));
            }
            Err(mut e) if is_retryable(e.kind) => {
                if tried >= attempts {
                    if attempts > 1 {
                        e.message = format!("{} (gave up after {attempts} attempts)", e.message);
                    }
                    return Err(e);
                }
                if tried == 1 {
                    crate::log::warn(&format!("{what} failed, retrying: {e}"));
                }
                clock.sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per get/get_range/list/delete, including the first. Default 4. Minimum 1.
    pub attempts: u32,
    /// Tries per `put(Overwrite)`. Default 1 (no retry). `put(IfAbsent)`: always 1.
    pub put_attempts: u32,
    /// Delay after the first failure (before jitter). Default 200 ms.
    pub initial_backoff: Duration,
    /// Largest delay between attempts. Default 5 s.
    pub max_backoff: Duration,
    /// Timeout of one attempt of any call. Default 120 s (the S3 client's own request
    /// timeouts are shorter; this catches hangs, a local store's too).
    pub attempt_timeout: Duration,
    /// The longest one call takes, its retries and their delays included: no retry is
    /// started that would end later. Default 300 s (the S3 client's timeout for a
    /// PUT or a whole-object GET).
    pub deadline: Duration,
    /// Seed of the jitter. `None` (the default): [`random_seed`], different in every
    /// process; tests set one to get the same delays on every run.
    pub jitter_seed: Option<u64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            put_attempts: 1,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(120),
            deadline: Duration::from_secs(300),
            jitter_seed: None,
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `failed + 1`, given a uniform random `r` in [0, 1).
    fn delay(&self, failed: u32, r: f64) -> Duration {
        jittered(self.initial_backoff, self.max_backoff, failed, r)
    }
}

/// The retry rule, as a [`Layer`]: every call that fails `Transient` is tried again,
/// within the policy's attempts and deadline.
pub struct Retry {
    policy: RetryPolicy,
    rng: AtomicU64,
    clock: SharedClock,
}

/// A store whose calls are retried by [`Retry`].
pub type RetryStore = Layered<Retry>;

impl Layered<Retry> {
    /// Wrap `inner`, with the jitter seeded from the policy's
    /// [`jitter_seed`](RetryPolicy::jitter_seed), else [`random_seed`] (so processes
    /// that fail together spread their retries), on the system clock.
    pub fn new(inner: DynStore, policy: RetryPolicy) -> Self {
        let seed = policy.jitter_seed.unwrap_or_else(random_seed);
        Self::with_seed(inner, policy, seed)
    }

    /// Wrap `inner` with the jitter drawn from `seed`: the same seed gives the same
    /// delays (tests).
    pub fn with_seed(inner: DynStore, policy: RetryPolicy, seed: u64) -> Self {
        Layered::wrap(
            inner,
            Retry {
                policy,
                rng: AtomicU64::new(seed),
                clock: SharedClock::default(),
            },
        )
    }

    /// The same store, timing attempts and sleeping between them on `clock`.
    pub fn with_clock(self, clock: SharedClock) -> Self {
        self.map_layer(|r| Retry { clock, ..r })
    }
}

impl Retry {
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A uniform value in [0, 1) (splitmix64 over a shared counter).
    fn random(&self) -> f64 {
        let z = self
            .rng
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        fraction(mix(z))
    }

    /// One attempt, given `budget` to answer. The timer is armed only if the first
    /// poll does not answer (a local read served inline needs none).
    async fn attempt<T>(
        &self,
        budget: Duration,
        fut: impl Future<Output = StoreResult<T>>,
        what: &impl Fn() -> String,
    ) -> StoreResult<T> {
        let mut fut = std::pin::pin!(fut);
        if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
        {
            return r;
        }
        let mut timer = self.clock.sleep(budget);
        tokio::select! {
            biased;
            r = fut.as_mut() => r,
            () = &mut timer => Err(Error::new(
                ErrorKind::Transient,
                format!("{}: no answer within {budget:?}", what()),
            )),
        }
    }

    async fn retry<T, F, Fut, W>(&self, what: W, attempts: u32, mut op: F) -> StoreResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
        W: Fn() -> String,
    {
        let attempts = attempts.max(1);
        let deadline = self.policy.deadline;
        let start = self.clock.now();
        let mut failed = 0u32;
        loop {
            let spent = self.clock.now().saturating_sub(start);
            let budget = self
                .policy
                .attempt_timeout
                .min(deadline.saturating_sub(spent));
            let mut e = match self.attempt(budget, op(), &what).await {
                Ok(v) => return Ok(v),
                Err(e) if is_retryable(e.kind) => e,
                Err(e) => return Err(e),
            };
            failed += 1;
            if failed >= attempts {
                if attempts > 1 {
                    e.message = format!("{} (gave up after {attempts} attempts)", e.message);
                }
                return Err(e);
            }
            let delay = self.policy.delay(failed, self.random());
            let spent = self.clock.now().saturating_sub(start);
            if spent.saturating_add(delay) >= deadline {
                let plural = if failed == 1 { "" } else { "s" };
                e.message = format!(
                    "{} (gave up after {failed} attempt{plural} in {spent:?}: the deadline is {deadline:?})",
                    e.message
                );
                return Err(e);
            }
            crate::log::debug(&format!(
                "{} failed (attempt {failed} of {attempts}), retrying in {delay:?}: {e}",
                what()
            ));
            self.clock.sleep(delay).await;
        }
    }
}

impl Layer for Retry {
    fn around<'a, T: Send + 'a>(&'a self, call: Call, mut next: Next<'a, T>) -> CallFuture<'a, T> {
        // A put-if-absent is never retried: a retry after a lost reply would find its
        // own object and answer `AlreadyExists`; its caller decides. An overwrite (a
        // put, a copy repair) is retried only as the policy's `put_attempts` say.
        let attempts = match call {
            Call::Put {
                mode: PutMode::IfAbsent,
                ..
            } => 1,
            Call::Put { .. } | Call::RepairCopies { .. } => self.policy.put_attempts,
            _ => self.policy.attempts,
        };
        // Described only if it fails: no formatting on the read path's successful GETs.
        Box::pin(async move { self.retry(|| call.describe(), attempts, &mut next).await })
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use bytes::Bytes;

    use super::*;
    use crate::BoxFuture;
    use crate::clock::{Clock as _, ManualClock};
    use crate::mem::MemStore;
    use crate::{ListEntry, ObjectStore, StoreError};
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
        /// A store whose calls never answer.
        fn hanging() -> Self {
            Flaky {
                hang: true,
                ..Flaky::new(0, ErrorKind::Transient)
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
            deadline: Duration::from_secs(60),
            jitter_seed: Some(SEED),
        }
    }

    /// Run `fut` to the end with `clock` moved on by `step` whenever something sleeps
    /// on it (and nothing else can run): time passes only as the test says.
    /// A retry store over `inner` with jitter seeded by `SEED`, on a manual clock.
    fn on_manual(inner: DynStore, policy: RetryPolicy) -> (RetryStore, Arc<ManualClock>) {
        let clock = ManualClock::new();
        let store =
            RetryStore::with_seed(inner, policy, SEED).with_clock(SharedClock(clock.clone()));
        (store, clock)
    }

    async fn on_manual_clock<T>(
        clock: &ManualClock,
        step: Duration,
        fut: impl std::future::Future<Output = T>,
    ) -> T {
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                biased;
                v = &mut fut => return v,
                () = tokio::task::yield_now() => {
                    if clock.sleepers() > 0 {
                        clock.advance(step);
                    }
                }
            }
        }
    }

    /// The put-if-absent retry rule: transient failures are retried on the clock, a
    /// key that exists is read back for the caller to judge, anything else is final.
    #[tokio::test]
    async fn put_if_absent_retried_retries_reads_back_and_gives_up() {
        let clock = ManualClock::new();
        let put = |store: Arc<Flaky>, key: &'static str, attempts: u32| {
            let clock = clock.clone();
            async move {
                let mut backoff = Backoff::new(1);
                let fut = put_if_absent_retried(
                    store.as_ref(),
                    key,
                    Bytes::from_static(b"mine"),
                    attempts,
                    &*clock,
                    &mut backoff,
                    "test put",
                );
                on_manual_clock(&clock, Duration::from_secs(1), fut).await
            }
        };
        // Two transient failures, then it lands.
        let flaky = Arc::new(Flaky::new(2, ErrorKind::Transient));
        assert_eq!(
            put(flaky.clone(), "a", 3).await.expect("lands"),
            PutIfAbsent::Landed
        );
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 3);
        // The key exists (an earlier attempt's answer lost): its bytes come back.
        assert_eq!(
            put(flaky.clone(), "a", 3).await.expect("exists"),
            PutIfAbsent::Exists(b"mine".to_vec())
        );
        // Out of attempts: the last transient error, saying so.
        let e = put(Arc::new(Flaky::new(9, ErrorKind::Transient)), "b", 3)
            .await
            .expect_err("gives up");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("gave up after 3 attempts"), "{e}");
        // A definite answer is not retried.
        let denied = Arc::new(Flaky::new(9, ErrorKind::Denied));
        let e = put(denied.clone(), "c", 3).await.expect_err("denied");
        assert_eq!(e.kind, ErrorKind::Denied);
        assert_eq!(denied.calls.load(Ordering::SeqCst), 1);
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

    /// Only `Transient` is retried: a full store, refused credentials, corrupt bytes
    /// and the rest are answers, returned after one call. `Full` and `Denied` did not
    /// exist before; a full local store was `Transient` and retried.
    #[tokio::test]
    async fn does_not_retry_definite_answers() {
        for kind in ErrorKind::ALL {
            assert_eq!(is_retryable(kind), kind == ErrorKind::Transient, "{kind:?}");
        }
        for kind in [
            ErrorKind::Full,
            ErrorKind::Denied,
            ErrorKind::Corrupt,
            ErrorKind::Permanent,
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
        ] {
            let flaky = Arc::new(Flaky::new(100, kind));
            let s = RetryStore::with_seed(flaky.clone(), fast(), SEED);
            assert_eq!(s.delete("k").await.expect_err("fails").kind, kind);
            let e = s
                .put("k", Bytes::from_static(b"a"), PutMode::Overwrite)
                .await
                .expect_err("fails");
            assert_eq!(e.kind, kind);
            assert_eq!(flaky.calls.load(Ordering::SeqCst), 2, "{kind:?}");
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

    /// A hanging attempt ends at its timeout, on the injected clock (no real time
    /// passes), and counts as a transient failure.
    #[tokio::test]
    async fn attempts_have_a_deadline() {
        let flaky = Arc::new(Flaky::hanging());
        let policy = RetryPolicy {
            attempts: 2,
            attempt_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(600),
            ..fast()
        };
        let (s, clock) = on_manual(flaky.clone(), policy);
        let e = on_manual_clock(&clock, Duration::from_millis(500), s.get("k"))
            .await
            .expect_err("hangs");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("no answer within 30s"), "{e}");
        assert!(e.message.contains("gave up after 2 attempts"), "{e}");
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 2);
        assert!(clock.now() >= Duration::from_secs(60), "{:?}", clock.now());
    }

    /// A call ends by its deadline however many attempts are left: no retry starts
    /// that would end past it, and an attempt gets no more than what is left. Before,
    /// only the count of attempts bounded a call (up to 4 x 120 s).
    #[tokio::test]
    async fn calls_end_by_their_deadline() {
        // Failing fast: attempts stop before the deadline, well short of 100.
        let flaky = Arc::new(Flaky::new(u32::MAX, ErrorKind::Transient));
        let policy = RetryPolicy {
            attempts: 100,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            deadline: Duration::from_secs(3),
            ..fast()
        };
        let (s, clock) = on_manual(flaky.clone(), policy);
        let e = on_manual_clock(&clock, Duration::from_millis(10), s.list(""))
            .await
            .expect_err("always failing");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("the deadline is 3s"), "{e}");
        let calls = flaky.calls.load(Ordering::SeqCst);
        assert!((4..=12).contains(&calls), "{calls} attempts in 3 s");
        assert!(clock.now() < Duration::from_secs(3), "{:?}", clock.now());

        // Hanging: the one attempt gets the whole deadline (shorter than its timeout)
        // and no retry follows.
        let hanging = Arc::new(Flaky::hanging());
        let policy = RetryPolicy {
            attempt_timeout: Duration::from_secs(120),
            deadline: Duration::from_secs(2),
            ..fast()
        };
        let (s, clock) = on_manual(hanging.clone(), policy);
        let e = on_manual_clock(&clock, Duration::from_millis(100), s.get("k"))
            .await
            .expect_err("hangs");
        assert!(e.message.contains("no answer within 2s"), "{e}");
        assert!(e.message.contains("gave up after 1 attempt in 2s"), "{e}");
        assert_eq!(hanging.calls.load(Ordering::SeqCst), 1);
        assert_eq!(clock.now(), Duration::from_secs(2));
    }

    /// Put-if-absent is tried once (a re-send could not tell its own landed write from
    /// another writer's), but within the attempt timeout: a hang ends.
    #[tokio::test]
    async fn put_if_absent_is_tried_once_within_the_timeout() {
        let hanging = Arc::new(Hangs);
        let (s, clock) = on_manual(hanging, fast());
        let e = on_manual_clock(
            &clock,
            Duration::from_millis(50),
            s.put("k", Bytes::from_static(b"a"), PutMode::IfAbsent),
        )
        .await
        .expect_err("hangs");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("put k: no answer within 200ms"), "{e}");
        assert_eq!(clock.now(), Duration::from_millis(200));
    }

    /// Every call hangs.
    struct Hangs;

    impl ObjectStore for Hangs {
        fn put(&self, _: &str, _: Bytes, _: PutMode) -> BoxFuture<'_, StoreResult<()>> {
            Box::pin(std::future::pending())
        }
        fn get(&self, _: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            Box::pin(std::future::pending())
        }
        fn get_range(&self, _: &str, _: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            Box::pin(std::future::pending())
        }
        fn list(&self, _: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
            Box::pin(std::future::pending())
        }
        fn delete(&self, _: &str) -> BoxFuture<'_, StoreResult<()>> {
            Box::pin(std::future::pending())
        }
        fn describe(&self) -> String {
            "hangs://".into()
        }
    }

    /// The engine's helper: 50 ms doubling to 5 s, each delay in [d/2, d), the same
    /// delays from the same seed, back to the start after a reset.
    #[test]
    fn backoff_doubles_to_its_cap_with_seeded_jitter() {
        let mut b = Backoff::new(42);
        let delays: Vec<Duration> = b.by_ref().take(12).collect();
        let mut d = Backoff::FIRST;
        for (i, got) in delays.iter().enumerate() {
            assert!(
                *got >= d / 2 && *got < d,
                "delay {i}: {got:?} not in [{:?}, {d:?})",
                d / 2
            );
            d = (d * 2).min(Backoff::MAX);
        }
        assert_eq!(b.failures(), 12);
        assert_eq!(
            delays,
            Backoff::new(42).take(12).collect::<Vec<_>>(),
            "seeded"
        );
        assert_ne!(
            delays,
            Backoff::new(43).take(12).collect::<Vec<_>>(),
            "jittered"
        );
        b.reset();
        assert!(b.next_delay() < Backoff::FIRST);
        let mut small =
            Backoff::with_bounds(Duration::from_millis(10), Duration::from_millis(15), 1);
        assert!(small.nth(10).is_some_and(|d| d < Duration::from_millis(15)));
    }

    /// Retry delays come from the seed: two stores with the same seed wait the same
    /// (virtual) time for the same failures.
    #[tokio::test]
    async fn retry_delays_come_from_the_seed() {
        let mut spent = Vec::new();
        for seed in [5, 5, 6] {
            let flaky = Arc::new(Flaky::new(3, ErrorKind::Transient));
            let policy = RetryPolicy {
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                jitter_seed: Some(seed),
                ..fast()
            };
            let clock = ManualClock::new();
            let s = RetryStore::new(flaky, policy).with_clock(SharedClock(clock.clone()));
            on_manual_clock(&clock, Duration::from_millis(1), s.list(""))
                .await
                .expect("fourth attempt");
            spent.push(clock.now());
        }
        assert_eq!(spent[0], spent[1]);
        assert_ne!(spent[0], spent[2]);
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
