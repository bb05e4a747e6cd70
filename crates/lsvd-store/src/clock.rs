//! Time, injected: every timer the engine uses goes through a [`Clock`].
//!
//! Why: batch timeouts, the checkpoint interval, upload retries and GC pacing all
//! depend on time. With time injected, a test can run them on a [`ManualClock`] that
//! moves only when the test says so, instead of sleeping and hoping the machine was
//! fast enough; and the pipeline (`lsvd_core::pipeline`) sees the same nanoseconds the
//! simulator gives it.
//!
//! [`SystemClock`] follows tokio's clock (so tests with tokio's paused time see
//! virtual time too); the log writer thread enters the runtime to read it.

// The one module that reads the system's time and sleeps on it (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock with sleeps, and the wall clock for timestamps.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Time since this clock's epoch; never goes back.
    fn now(&self) -> Duration;
    /// Complete once `d` has passed on this clock.
    fn sleep(&self, d: Duration) -> SleepFuture;
    /// Milliseconds since the Unix epoch, for timestamps written to the store.
    fn unix_ms(&self) -> u64 {
        unix_ms_now()
    }
}

/// Milliseconds since the Unix epoch on the system's wall clock: the timestamp of a
/// record written where no [`Clock`] is handed down (an offline command's metadata).
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Poll `done` every millisecond on this thread until it says yes or `limit` of real
/// time has passed; whether it said yes. For a bounded wait on another thread that
/// must end whatever clock the caller runs on (a manual clock may never move).
pub fn wait_real_time(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// 16 random bytes for an identifier (a volume, a chain, a session, a probe key): from
/// `/dev/urandom`, or where it cannot be read, the wall clock's nanoseconds and the
/// process id (unique enough for a name, never used as a key).
pub fn random_id_bytes() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut id).is_ok() {
            return id;
        }
    }
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes()
}

/// Nanoseconds since the clock's epoch, as the pipeline takes them.
pub fn now_ns(clock: &dyn Clock) -> u64 {
    clock.now().as_nanos().min(u64::MAX as u128) as u64
}

/// Run `fut` for at most `d` on `clock`; None if the time ran out first.
pub async fn timeout<T>(clock: &dyn Clock, d: Duration, fut: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        v = fut => Some(v),
        () = clock.sleep(d) => None,
    }
}

/// The real clock (tokio's, which tests may pause).
#[derive(Debug)]
pub struct SystemClock {
    epoch: tokio::time::Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            epoch: tokio::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        tokio::time::Instant::now().saturating_duration_since(self.epoch)
    }

    fn sleep(&self, d: Duration) -> SleepFuture {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock that moves only when told to ([`ManualClock::advance`]): for tests that
/// wait on timers (batch timeouts, the checkpoint interval, retries) without sleeping.
/// Wall-clock timestamps are the real time it was made at, plus how far it moved.
#[derive(Debug)]
pub struct ManualClock {
    inner: Mutex<ManualInner>,
    /// The wall clock when it was made, in milliseconds since the Unix epoch.
    start_unix_ms: u64,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            inner: Mutex::default(),
            start_unix_ms: unix_ms_now(),
        }
    }
}

#[derive(Debug, Default)]
struct ManualInner {
    now: Duration,
    next_id: u64,
    /// (deadline, id) -> wake-up of a sleeper.
    sleepers: BTreeMap<(Duration, u64), tokio::sync::oneshot::Sender<()>>,
}

impl ManualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(ManualClock::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Move time forward by `d`, waking every sleep that ends by then.
    pub fn advance(&self, d: Duration) {
        let due = {
            let mut inner = self.lock();
            inner.now += d;
            let now = inner.now;
            let later = inner.sleepers.split_off(&(now, u64::MAX));
            std::mem::replace(&mut inner.sleepers, later)
        };
        for (_, wake) in due {
            let _ = wake.send(());
        }
    }

    /// Sleeps waiting now.
    pub fn sleepers(&self) -> usize {
        self.lock().sleepers.len()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        self.lock().now
    }

    fn unix_ms(&self) -> u64 {
        self.start_unix_ms + self.now().as_millis() as u64
    }

    fn sleep(&self, d: Duration) -> SleepFuture {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut inner = self.lock();
            if d.is_zero() {
                return Box::pin(async {});
            }
            let deadline = inner.now + d;
            let id = inner.next_id;
            inner.next_id += 1;
            inner.sleepers.insert((deadline, id), tx);
        }
        Box::pin(async move {
            // A dropped clock never wakes its sleepers: they wait forever, as time
            // stands still.
            if rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// A clock to put in a configuration: cloned cheaply, the system clock by default.
#[derive(Debug, Clone)]
pub struct SharedClock(pub Arc<dyn Clock>);

impl Default for SharedClock {
    fn default() -> Self {
        SharedClock(Arc::new(SystemClock::new()))
    }
}

impl std::ops::Deref for SharedClock {
    type Target = dyn Clock;
    fn deref(&self) -> &dyn Clock {
        &*self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_in_deadline_order_only_when_advanced() {
        let clock = ManualClock::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for ms in [300u64, 100, 200] {
            let c = clock.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                c.sleep(Duration::from_millis(ms)).await;
                let _ = tx.send(ms);
            });
        }
        // Let the three tasks register their sleeps.
        while clock.sleepers() < 3 {
            tokio::task::yield_now().await;
        }
        assert!(
            rx.try_recv().is_err(),
            "nothing wakes while time stands still"
        );
        clock.advance(Duration::from_millis(150));
        assert_eq!(rx.recv().await, Some(100));
        assert!(rx.try_recv().is_err());
        clock.advance(Duration::from_millis(150));
        let mut got = vec![rx.recv().await, rx.recv().await];
        got.sort();
        assert_eq!(got, vec![Some(200), Some(300)]);
        assert_eq!(clock.now(), Duration::from_millis(300));
        assert_eq!(
            timeout(&*clock, Duration::ZERO, std::future::pending::<()>()).await,
            None
        );
    }
}
