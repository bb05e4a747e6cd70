//! The crash oracle's pieces: see `crash_oracle.rs` for what is checked.

pub mod checker;
pub mod forensics;
pub mod history;
pub mod inproc;
pub mod nbd;
pub mod proc_kinds;
pub mod process;
pub mod rng;
pub mod stamp;
pub mod takeover;
pub mod workload;

use std::sync::Mutex;
use std::time::Instant;

/// The tests' temporary directory; an episode sets `keep` when it fails, for
/// post-mortems.
pub use crate::common::TempDir;

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// How many crash points to run and from which seeds.
#[derive(Debug, Clone)]
pub struct Plan {
    pub test: &'static str,
    /// (episode seed, crash points in that episode)
    pub episodes: Vec<(u64, u32)>,
}

impl Plan {
    /// `default_points` crash points, in episodes of `rounds` each (one volume lives
    /// through an episode's crashes). `LSVD_ORACLE_SEED` runs a single episode from
    /// that seed; `LSVD_ORACLE_POINTS` overrides the number of points; `LSVD_SOAK=1`
    /// multiplies it by 25 and picks the base seed from the clock.
    pub fn new(test: &'static str, default_base: u64, default_points: u32, rounds: u32) -> Plan {
        let points_env = std::env::var("LSVD_ORACLE_POINTS")
            .ok()
            .and_then(|s| parse_u64(&s));
        let soak = std::env::var("LSVD_SOAK").is_ok_and(|v| v != "0" && !v.is_empty());
        if let Some(seed) = std::env::var("LSVD_ORACLE_SEED")
            .ok()
            .and_then(|s| parse_u64(&s))
        {
            let n = points_env.map_or(rounds, |p| p as u32).max(1);
            return Plan {
                test,
                episodes: vec![(seed, n)],
            };
        }
        let mut points = points_env.map_or(default_points, |p| p as u32);
        let mut base = default_base;
        if soak {
            if points_env.is_none() {
                points *= 25;
            }
            base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
        }
        let mut episodes = Vec::new();
        let mut left = points;
        let mut i = 0u64;
        while left > 0 {
            let n = left.min(rounds);
            episodes.push((rng::mix(base ^ rng::mix(i + 1)), n));
            left -= n;
            i += 1;
        }
        Plan { test, episodes }
    }

    pub fn points(&self) -> u32 {
        self.episodes.iter().map(|e| e.1).sum()
    }
}

/// A violation, with what is needed to replay it.
#[derive(Debug)]
pub struct Failure {
    pub round: u32,
    pub what: String,
}

impl Failure {
    pub fn new(round: u32, what: impl Into<String>) -> Failure {
        Failure {
            round,
            what: what.into(),
        }
    }
}

/// Counters over a test, printed at the end.
#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Stats {
    pub fn add(&self, key: &str, n: u64) {
        *self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default() += n;
    }
    /// Keep the largest value seen under `key`.
    pub fn max(&self, key: &str, n: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let v = g.entry(key.to_string()).or_default();
        *v = (*v).max(n);
    }
    pub fn get(&self, key: &str) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
    pub fn summary(&self) -> String {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Run every episode of `plan` with `f(seed, rounds, stats)`; panic with a replay
/// command on the first failure.
pub fn run_plan<F, Fut>(plan: Plan, kind: &str, f: F)
where
    F: Fn(u64, u32, std::sync::Arc<Stats>) -> Fut,
    Fut: std::future::Future<Output = Result<(), Failure>>,
{
    let started = Instant::now();
    let stats = std::sync::Arc::new(Stats::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut done = 0u32;
    for &(seed, rounds) in &plan.episodes {
        let result = rt.block_on(f(seed, rounds, stats.clone()));
        if let Err(fail) = result {
            panic!(
                "\ncrash oracle violation\n  test: {test}\n  crash kind: {kind}\n  episode seed: {seed:#x}, crash point {point} of the episode ({done} earlier points of this run passed)\n  replay: LSVD_ORACLE_SEED={seed:#x} LSVD_ORACLE_POINTS={point} cargo test -p lsvd --test crash_oracle {test} -- --nocapture\n\n{what}\n",
                test = plan.test,
                point = fail.round + 1,
                what = fail.what,
            );
        }
        done += rounds;
    }
    eprintln!(
        "crash oracle {}: {} crash points ({kind}) in {:.1}s; {} retried_read_errors={}",
        plan.test,
        plan.points(),
        started.elapsed().as_secs_f64(),
        stats.summary(),
        workload::TRANSIENT_READ_ERRORS.load(std::sync::atomic::Ordering::Relaxed)
    );
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    // The workload must keep GC busy (relocation racing client writes, crashes
    // mid-pass): fail if it stops doing so. A single replayed episode may not, and the
    // S3 pass (20 process-level points against versitygw, LSVD_TEST_STORE=s3) does not
    // count GC passes; the local pass of the same tests enforces this.
    let on_s3 = std::env::var("LSVD_TEST_STORE").is_ok_and(|v| v == "s3");
    if std::env::var("LSVD_ORACLE_SEED").is_err() && !on_s3 {
        assert!(
            stats.get("gc_passes") > 0,
            "crash oracle {}: no GC pass ran in {} crash points; the workload no longer exercises GC",
            plan.test,
            plan.points()
        );
    }
}
