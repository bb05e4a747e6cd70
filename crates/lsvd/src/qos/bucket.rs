//! The token buckets behind a volume's limits: pure logic, time passed in as
//! nanoseconds, so the arithmetic (burst, refill, rate changes) is tested without a
//! clock or a runtime.
//!
//! A request takes its cost from every bucket that applies to it at once, even when
//! that leaves a bucket below zero: the deficit is what earlier requests owe, and the
//! request waits until the bucket has refilled it ([`TokenBucket::take`] says for how
//! long). So each request learns its own wait the moment it arrives, waits without a
//! lock, and requests are let through in the order they arrived (FIFO), whichever
//! connection sent them.

use super::limits::Limits;

const NS_PER_SEC: f64 = 1e9;

/// A token bucket: `rate_per_sec` tokens a second, at most `capacity` saved up (the
/// burst). Its level may go below zero: tokens promised to requests still waiting.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    rate_per_sec: u64,
    capacity: f64,
    level: f64,
    /// When `level` was last brought up to date.
    at_ns: u64,
}

impl TokenBucket {
    /// A full bucket: `rate_per_sec` (at least 1) tokens a second, `burst_ns` of them
    /// saved up at most.
    pub fn new(rate_per_sec: u64, burst_ns: u64, now_ns: u64) -> Self {
        let rate_per_sec = rate_per_sec.max(1);
        let capacity = capacity(rate_per_sec, burst_ns);
        TokenBucket {
            rate_per_sec,
            capacity,
            level: capacity,
            at_ns: now_ns,
        }
    }

    pub fn rate_per_sec(&self) -> u64 {
        self.rate_per_sec
    }

    /// Tokens in the bucket at `now_ns` (negative: owed to waiting requests).
    pub fn level(&mut self, now_ns: u64) -> f64 {
        self.refill(now_ns);
        self.level
    }

    fn refill(&mut self, now_ns: u64) {
        // Time never goes back; a caller that read the clock before another did may
        // pass a slightly older time: nothing to add then.
        let elapsed_ns = now_ns.saturating_sub(self.at_ns);
        self.at_ns = self.at_ns.max(now_ns);
        let added = elapsed_ns as f64 * self.rate_per_sec as f64 / NS_PER_SEC;
        self.level = (self.level + added).min(self.capacity);
    }

    /// Take `tokens` at `now_ns`; how long the taker must wait (0: go now) until the
    /// bucket has refilled what it is short of.
    pub fn take(&mut self, tokens: u64, now_ns: u64) -> u64 {
        self.refill(now_ns);
        self.level -= tokens as f64;
        if self.level >= 0.0 {
            0
        } else {
            (-self.level * NS_PER_SEC / self.rate_per_sec as f64).ceil() as u64
        }
    }

    /// A new rate and burst from `now_ns` on (a reload): what was saved stays, up to
    /// the new capacity; what is owed is paid back at the new rate.
    pub fn set_rate(&mut self, rate_per_sec: u64, burst_ns: u64, now_ns: u64) {
        self.refill(now_ns);
        self.rate_per_sec = rate_per_sec.max(1);
        self.capacity = capacity(self.rate_per_sec, burst_ns);
        self.level = self.level.min(self.capacity);
    }
}

fn capacity(rate_per_sec: u64, burst_ns: u64) -> f64 {
    rate_per_sec as f64 * burst_ns as f64 / NS_PER_SEC
}

/// Reads or writes: each has limits of its own, and both count against the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Read, Direction::Write];

    pub fn index(self) -> usize {
        self as usize
    }

    /// As in metrics' `op` label.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// One volume's buckets: for each limit that is set, a bucket. A request is let
/// through once every bucket that applies to it allows.
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    limits: Limits,
    iops: Option<TokenBucket>,
    bps: Option<TokenBucket>,
    /// Per direction ([`Direction::index`]).
    dir_iops: [Option<TokenBucket>; 2],
    dir_bps: [Option<TokenBucket>; 2],
}

impl Limiter {
    pub fn new(limits: &Limits, now_ns: u64) -> Self {
        let mut l = Limiter::default();
        l.set_limits(limits, now_ns);
        l
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Does any limit apply?
    pub fn is_limited(&self) -> bool {
        self.limits.any()
    }

    /// Apply new limits from `now_ns` on. A bucket whose limit stays set keeps what it
    /// saved and what it owes (at the new rate); a newly set limit starts full; a
    /// removed one is dropped.
    pub fn set_limits(&mut self, limits: &Limits, now_ns: u64) {
        let burst_ns = limits.burst_ns();
        let update = |b: &mut Option<TokenBucket>, rate: Option<u64>| {
            *b = match (b.take(), rate.filter(|&r| r > 0)) {
                (_, None) => None,
                (Some(mut b), Some(r)) => {
                    b.set_rate(r, burst_ns, now_ns);
                    Some(b)
                }
                (None, Some(r)) => Some(TokenBucket::new(r, burst_ns, now_ns)),
            };
        };
        update(&mut self.iops, limits.iops);
        update(&mut self.bps, limits.bps);
        update(&mut self.dir_iops[0], limits.read_iops);
        update(&mut self.dir_iops[1], limits.write_iops);
        update(&mut self.dir_bps[0], limits.read_bps);
        update(&mut self.dir_bps[1], limits.write_bps);
        self.limits = *limits;
    }

    /// A request of `bytes` in direction `dir` arrives at `now_ns`: it counts one I/O
    /// (and `bytes`, if any) against every limit that applies; how long it must wait.
    pub fn reserve(&mut self, dir: Direction, bytes: u64, now_ns: u64) -> u64 {
        let d = dir.index();
        let mut wait_ns = 0;
        for b in [&mut self.iops, &mut self.dir_iops[d]]
            .into_iter()
            .flatten()
        {
            wait_ns = wait_ns.max(b.take(1, now_ns));
        }
        if bytes > 0 {
            for b in [&mut self.bps, &mut self.dir_bps[d]].into_iter().flatten() {
                wait_ns = wait_ns.max(b.take(bytes, now_ns));
            }
        }
        wait_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    /// Requests let through by `l` from `start_ns`, each sent the moment the previous
    /// one may go, over `secs` seconds.
    fn admitted_in(l: &mut Limiter, dir: Direction, bytes: u64, start_ns: u64, secs: u64) -> u64 {
        let end = start_ns + secs * SEC;
        let (mut now, mut n) = (start_ns, 0);
        loop {
            now += l.reserve(dir, bytes, now);
            if now >= end {
                return n;
            }
            n += 1;
        }
    }

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_paces_at_the_rate() {
        // 100 a second, 1 s of burst: 100 at once, the 101st 10 ms later.
        let mut b = TokenBucket::new(100, SEC, 0);
        for _ in 0..100 {
            assert_eq!(b.take(1, 0), 0);
        }
        assert_eq!(b.take(1, 0), 10 * MS);
        assert_eq!(b.take(1, 0), 20 * MS, "the next waits behind the first");
        // 30 ms later the deficit of 2 is paid and 1 token saved.
        assert_eq!(b.take(1, 30 * MS), 0);
        assert!((b.level(30 * MS) - 0.0).abs() < 1e-9);
    }

    #[test]
    fn an_idle_bucket_refills_only_up_to_its_burst() {
        let mut b = TokenBucket::new(1000, SEC / 2, 0);
        assert_eq!(b.take(500, 0), 0);
        assert_eq!(
            b.level(10 * SEC),
            500.0,
            "capacity: half a second of the rate"
        );
        assert_eq!(b.take(600, 10 * SEC), 100 * MS);
        // No burst at all: requests are spaced at the rate from the first.
        let mut even = TokenBucket::new(4, 0, 0);
        assert_eq!(even.take(1, 0), 250 * MS);
        assert_eq!(even.take(1, 0), 500 * MS);
    }

    #[test]
    fn a_request_larger_than_the_burst_waits_for_its_bytes() {
        // 1 MiB/s with 1 s of burst: a 4 MiB write goes at once, the next waits 3 s.
        let mib = 1 << 20;
        let mut b = TokenBucket::new(mib, SEC, 0);
        assert_eq!(b.take(4 * mib, 0), 3 * SEC);
        assert_eq!(
            b.take(1, 3 * SEC),
            1 + (SEC / mib),
            "the next queues behind it"
        );
    }

    #[test]
    fn the_steady_rate_is_the_limit_plus_one_burst() {
        let limits = Limits {
            iops: Some(500),
            ..Limits::default()
        };
        let mut l = Limiter::new(&limits, 0);
        let n = admitted_in(&mut l, Direction::Write, 4096, 0, 10);
        // 10 s at 500/s plus a second's burst (the request the loop cut off at the
        // end was counted against the bucket, not here).
        assert!((5499..=5500).contains(&n), "{n}");
        // Past the burst, exactly the rate.
        let later = admitted_in(&mut l, Direction::Write, 4096, 10 * SEC, 4);
        assert!((1999..=2000).contains(&later), "{later}");
    }

    #[test]
    fn directions_have_their_own_limits_and_share_the_total() {
        let limits = Limits {
            read_iops: Some(100),
            write_iops: Some(50),
            burst: Some(std::time::Duration::ZERO),
            ..Limits::default()
        };
        let mut l = Limiter::new(&limits, 0);
        assert_eq!(admitted_in(&mut l, Direction::Read, 0, 0, 2), 199);
        assert_eq!(admitted_in(&mut l, Direction::Write, 0, 0, 2), 99);
        // A total below both: the sum of the two is held to it.
        let limits = Limits {
            iops: Some(100),
            read_iops: Some(80),
            burst: Some(std::time::Duration::ZERO),
            ..Limits::default()
        };
        let mut l = Limiter::new(&limits, 0);
        let (mut reads, mut writes, mut now) = (0, 0, 0);
        while now < 10 * SEC {
            let r = l.reserve(Direction::Read, 0, now);
            let w = l.reserve(Direction::Write, 0, now);
            reads += 1;
            writes += 1;
            now += r.max(w);
        }
        assert!(reads + writes <= 100 * 10 + 2, "{reads} + {writes}");
        assert!(reads + writes >= 100 * 10 - 2, "{reads} + {writes}");
    }

    #[test]
    fn bytes_limit_reads_and_writes_but_trims_count_only_as_ios() {
        let limits = Limits {
            write_bps: Some(1 << 20),
            burst: Some(std::time::Duration::ZERO),
            ..Limits::default()
        };
        let mut l = Limiter::new(&limits, 0);
        // 256 writes of 4 KiB a second.
        assert_eq!(admitted_in(&mut l, Direction::Write, 4096, 0, 1), 255);
        // A trim (no bytes) does not wait on the bytes owed.
        assert_eq!(l.reserve(Direction::Write, 0, SEC), 0);
        // Reads are not limited at all.
        assert_eq!(l.reserve(Direction::Read, 1 << 20, SEC), 0);
        assert!(l.is_limited());
        assert!(!Limiter::new(&Limits::default(), 0).is_limited());
    }

    #[test]
    fn reloaded_limits_apply_at_once_and_keep_what_is_owed() {
        let slow = Limits {
            iops: Some(100),
            burst: Some(std::time::Duration::ZERO),
            ..Limits::default()
        };
        let mut l = Limiter::new(&slow, 0);
        assert_eq!(admitted_in(&mut l, Direction::Write, 0, 0, 1), 99);
        // Raised: 400 a second from now on.
        let fast = Limits {
            iops: Some(400),
            ..slow
        };
        l.set_limits(&fast, SEC);
        assert_eq!(l.limits(), &fast);
        let n = admitted_in(&mut l, Direction::Write, 0, SEC, 1);
        assert!((398..=400).contains(&n), "{n}");
        // Removed: nothing waits.
        l.set_limits(&Limits::default(), 2 * SEC);
        assert!(!l.is_limited());
        assert_eq!(l.reserve(Direction::Write, 1 << 30, 2 * SEC), 0);
        // Set again: a new, full bucket (1 s of burst by default).
        l.set_limits(
            &Limits {
                write_iops: Some(10),
                ..Limits::default()
            },
            3 * SEC,
        );
        assert_eq!(admitted_in(&mut l, Direction::Write, 0, 3 * SEC, 1), 19);
        // A zero limit is no limit.
        l.set_limits(
            &Limits {
                iops: Some(0),
                ..Limits::default()
            },
            5 * SEC,
        );
        assert!(!l.is_limited());
    }
}
