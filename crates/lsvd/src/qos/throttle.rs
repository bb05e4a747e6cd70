//! The live side of one export's limits: requests wait here, on the export's clock,
//! for what its [`Limiter`] says; and what they waited is counted for the metrics.
//!
//! The limiter's lock is held only to reserve (no I/O, no await): each request learns
//! its wait at once and sleeps on its own, so the order requests were admitted in is
//! the order they arrived in, across every connection to the export. Nothing of the
//! engine is held while a request waits: it has not reached the engine yet.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lsvd_store::clock::{Clock, now_ns};

use super::bucket::{Direction, Limiter};
use super::limits::Limits;

pub struct Throttle {
    export: String,
    clock: Arc<dyn Clock>,
    limiter: Mutex<Limiter>,
    /// Whether any limit is set: the fast path's check, without the lock.
    limited: AtomicBool,
    /// Per [`Direction::index`]: nanoseconds requests spent waiting, and how many
    /// requests waited.
    throttled_ns: [AtomicU64; 2],
    throttled_requests: [AtomicU64; 2],
}

impl Throttle {
    pub fn new(export: &str, limits: &Limits, clock: Arc<dyn Clock>) -> Arc<Self> {
        let limiter = Limiter::new(limits, now_ns(&*clock));
        Arc::new(Throttle {
            export: export.to_string(),
            limited: AtomicBool::new(limiter.is_limited()),
            limiter: Mutex::new(limiter),
            clock,
            throttled_ns: Default::default(),
            throttled_requests: Default::default(),
        })
    }

    pub fn export(&self) -> &str {
        &self.export
    }

    fn limiter(&self) -> MutexGuard<'_, Limiter> {
        // The limiter's state is valid after any panic: every update is complete.
        self.limiter.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Is any limit set? (If not, requests go straight through.)
    pub fn is_limited(&self) -> bool {
        self.limited.load(Ordering::Relaxed)
    }

    pub fn limits(&self) -> Limits {
        *self.limiter().limits()
    }

    /// New limits, in force for every request from now on (those already waiting
    /// keep the wait they were given).
    pub fn set_limits(&self, limits: &Limits) {
        let mut l = self.limiter();
        l.set_limits(limits, now_ns(&*self.clock));
        self.limited.store(l.is_limited(), Ordering::Relaxed);
    }

    /// Wait until a request of `bytes` in direction `dir` is within the limits.
    pub async fn admit(&self, dir: Direction, bytes: u64) {
        if !self.is_limited() {
            return;
        }
        let wait_ns = self.limiter().reserve(dir, bytes, now_ns(&*self.clock));
        if wait_ns == 0 {
            return;
        }
        self.clock.sleep(Duration::from_nanos(wait_ns)).await;
        self.throttled_ns[dir.index()].fetch_add(wait_ns, Ordering::Relaxed);
        self.throttled_requests[dir.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Seconds requests in direction `dir` spent waiting.
    pub fn throttled_secs(&self, dir: Direction) -> f64 {
        self.throttled_ns[dir.index()].load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// The Prometheus text of every export's throttling and limits.
pub fn render(throttles: &[Arc<Throttle>]) -> String {
    let mut out = String::new();
    let mut per_op = |name: &str, help: &str, value: &dyn Fn(&Throttle, Direction) -> f64| {
        let _ = writeln!(out, "# HELP lsvd_{name} {help}");
        let _ = writeln!(out, "# TYPE lsvd_{name} counter");
        for t in throttles {
            for dir in Direction::ALL {
                let _ = writeln!(
                    out,
                    "lsvd_{name}{{volume=\"{}\",op=\"{}\"}} {}",
                    t.export,
                    dir.name(),
                    value(t, dir)
                );
            }
        }
    };
    per_op(
        "throttled_seconds_total",
        "Time requests waited for the volume's QoS limits (--limit-*, [volumes.NAME]), \
         summed over requests (this process).",
        &|t, d| t.throttled_secs(d),
    );
    per_op(
        "throttled_requests_total",
        "Requests that waited for the volume's QoS limits (this process).",
        &|t, d| t.throttled_requests[d.index()].load(Ordering::Relaxed) as f64,
    );
    let _ = writeln!(
        out,
        "# HELP lsvd_qos_limit The volume's QoS limits in force, by config key \
         (per second: I/Os or bytes; 0: none)."
    );
    let _ = writeln!(out, "# TYPE lsvd_qos_limit gauge");
    for t in throttles {
        for (key, value) in t.limits().by_key() {
            let _ = writeln!(
                out,
                "lsvd_qos_limit{{volume=\"{}\",limit=\"{key}\"}} {value}",
                t.export
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_store::clock::ManualClock;

    /// Requests over the limit wait on the clock, in the order they came, and the
    /// wait is counted; a reload applies to the next request.
    #[tokio::test]
    async fn requests_wait_in_order_and_the_wait_is_counted() {
        let clock = ManualClock::new();
        let limits = Limits {
            write_iops: Some(10),
            burst: Some(Duration::ZERO),
            ..Limits::default()
        };
        let t = Throttle::new("v", &limits, clock.clone());
        assert!(t.is_limited());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..3 {
            let (t, tx) = (t.clone(), tx.clone());
            tokio::spawn(async move {
                t.admit(Direction::Write, 4096).await;
                let _ = tx.send(i);
            });
            tokio::task::yield_now().await;
        }
        // Reads are not limited.
        t.admit(Direction::Read, 1 << 20).await;
        for (i, ms) in [(0, 100), (1, 100), (2, 100)] {
            assert!(rx.try_recv().is_err(), "{i} went early");
            clock.advance(Duration::from_millis(ms));
            // Let the woken task run.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(rx.try_recv().ok(), Some(i));
        }
        assert!((t.throttled_secs(Direction::Write) - 0.6).abs() < 1e-6);
        assert_eq!(t.throttled_secs(Direction::Read), 0.0);
        let text = render(std::slice::from_ref(&t));
        assert!(text.contains("lsvd_throttled_requests_total{volume=\"v\",op=\"write\"} 3"));
        assert!(text.contains("lsvd_qos_limit{volume=\"v\",limit=\"limit_write_iops\"} 10"));
        t.set_limits(&Limits::default());
        assert!(!t.is_limited());
        t.admit(Direction::Write, 4096).await;
        assert!(render(&[t]).contains("lsvd_qos_limit{volume=\"v\",limit=\"limit_write_iops\"} 0"));
    }
}
