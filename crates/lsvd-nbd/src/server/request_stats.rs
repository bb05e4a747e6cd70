//! How many requests of each kind an export answered and how long they took, from the
//! request's header read to its reply handed to the connection's writer.
//!
//! Why in the server: every request passes here whichever way the device takes it (the
//! `start` fast path or a task), so one place counts them all, the same way for every
//! device. The numbers are plain counters and a fixed-bucket histogram per kind
//! (Prometheus's histogram shape), updated with relaxed atomics: no lock and no
//! allocation per request, and memory fixed per export whatever the load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::request::Op;

/// Upper bounds of the latency buckets, in seconds (the last bucket, +Inf, is implied).
pub const LATENCY_BUCKETS_SECS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    5.0,
];

/// The request kinds counted, in [`RequestStats::kinds`] order.
pub const KINDS: [&str; 7] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "cache",
];

/// One kind's numbers.
#[derive(Default)]
struct KindStats {
    count: AtomicU64,
    sum_ns: AtomicU64,
    /// Requests at or under each bound of [`LATENCY_BUCKETS_SECS`] (not cumulative).
    buckets: [AtomicU64; LATENCY_BUCKETS_SECS.len()],
}

/// One export's request counts and latencies.
#[derive(Default)]
pub struct RequestStats {
    kinds: [KindStats; KINDS.len()],
}

/// What a reader sees of one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSnapshot {
    pub kind: &'static str,
    pub count: u64,
    pub sum_secs: f64,
    /// Cumulative counts at each bound of [`LATENCY_BUCKETS_SECS`] (Prometheus `le`).
    pub cumulative: [u64; LATENCY_BUCKETS_SECS.len()],
}

impl RequestStats {
    /// Count a request of kind index `kind` that took `took`.
    pub(crate) fn record(&self, kind: usize, took: Duration) {
        let Some(k) = self.kinds.get(kind) else {
            return;
        };
        k.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        k.sum_ns.fetch_add(ns, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS_SECS.iter().position(|&b| secs <= b) {
            k.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every kind's numbers now.
    pub fn kinds(&self) -> Vec<KindSnapshot> {
        KINDS
            .iter()
            .zip(&self.kinds)
            .map(|(&kind, k)| {
                let mut cumulative = [0u64; LATENCY_BUCKETS_SECS.len()];
                let mut total = 0;
                for (c, b) in cumulative.iter_mut().zip(&k.buckets) {
                    total += b.load(Ordering::Relaxed);
                    *c = total;
                }
                KindSnapshot {
                    kind,
                    count: k.count.load(Ordering::Relaxed),
                    sum_secs: k.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                    cumulative,
                }
            })
            .collect()
    }
}

/// The kind index of `op` in [`KINDS`].
pub(crate) fn kind_of(op: &Op) -> usize {
    match op {
        Op::Read { .. } => 0,
        Op::Write { .. } => 1,
        Op::Flush => 2,
        Op::Trim { .. } => 3,
        Op::WriteZeroes(_) => 4,
        Op::BlockStatus { .. } => 5,
        Op::Cache { .. } => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sums_and_cumulative_buckets() {
        let s = RequestStats::default();
        s.record(1, Duration::from_micros(30));
        s.record(1, Duration::from_micros(700));
        s.record(1, Duration::from_secs(9));
        s.record(0, Duration::from_millis(3));
        s.record(99, Duration::from_millis(3));
        let kinds = s.kinds();
        let write = &kinds[1];
        assert_eq!(write.kind, "write");
        assert_eq!(write.count, 3);
        assert!(
            (write.sum_secs - 9.00073).abs() < 1e-9,
            "{}",
            write.sum_secs
        );
        // 30 µs in the first bucket, 700 µs under 1 ms, 9 s only in +Inf.
        assert_eq!(write.cumulative[0], 1);
        assert_eq!(write.cumulative[3], 1);
        assert_eq!(write.cumulative[4], 2);
        assert_eq!(write.cumulative[LATENCY_BUCKETS_SECS.len() - 1], 2);
        assert_eq!(kinds[0].count, 1);
        assert_eq!(kinds[0].cumulative[6], 1, "3 ms is under 5 ms");
        assert_eq!(kinds[0].cumulative[5], 0, "and over 2.5 ms");
        assert_eq!(kinds.iter().map(|k| k.count).sum::<u64>(), 4);
    }
}
