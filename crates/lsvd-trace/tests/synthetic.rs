//! Synthetic workloads: determinism, alignment, and the shape of each
//! pattern.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use lsvd_trace::{Op, Pattern, Request, SyntheticSpec, synthetic};

const KIB4: u64 = 4096;

fn spec(pattern: Pattern, blocks: u64, requests: u64) -> SyntheticSpec {
    SyntheticSpec {
        pattern,
        volume_size_bytes: blocks * KIB4,
        io_size_bytes: KIB4,
        requests,
        write_fraction: 0.3,
        seed: 42,
        precondition: false,
    }
}

fn run(spec: SyntheticSpec) -> Vec<Request> {
    synthetic(spec).expect("valid spec").collect()
}

/// Accesses per block, most accessed first.
fn sorted_counts(reqs: &[Request], blocks: u64) -> Vec<u64> {
    let mut counts = vec![0u64; blocks as usize];
    for r in reqs {
        counts[(r.offset_bytes / KIB4) as usize] += 1;
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

#[test]
fn same_seed_same_stream_other_seed_other_stream() {
    for pattern in [
        Pattern::Uniform,
        Pattern::HotCold {
            hot_fraction: 0.2,
            hot_share: 0.8,
        },
        Pattern::Zipf { theta: 0.99 },
        Pattern::Sequential,
    ] {
        let s = spec(pattern, 1000, 2000);
        assert_eq!(run(s), run(s), "{pattern}");
        let other = SyntheticSpec { seed: 43, ..s };
        assert_ne!(run(s), run(other), "{pattern}");
    }
}

#[test]
fn requests_are_aligned_in_range_and_mixed() {
    let s = SyntheticSpec {
        // A partial block at the end is never touched.
        volume_size_bytes: 1000 * KIB4 + 100,
        ..spec(Pattern::Zipf { theta: 1.2 }, 1000, 20_000)
    };
    let reqs = run(s);
    assert_eq!(reqs.len(), 20_000);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.offset_bytes % KIB4, 0);
        assert!(r.offset_bytes + r.length_bytes <= 1000 * KIB4);
        assert_eq!(r.length_bytes, KIB4);
        assert_eq!(r.volume, 0);
        assert_eq!(r.time_ns, i as u64);
    }
    let writes = reqs.iter().filter(|r| r.op == Op::Write).count();
    assert!(
        (5_400..6_600).contains(&writes),
        "{writes} writes of 20000 at 0.3"
    );
}

#[test]
fn hotcold_shares_are_right() {
    let blocks = 1000;
    let n = 200_000;
    let s = spec(
        Pattern::HotCold {
            hot_fraction: 0.2,
            hot_share: 0.8,
        },
        blocks,
        n,
    );
    let counts = sorted_counts(&run(s), blocks);
    // Hot blocks average 800 accesses, cold ones 50: the top 200 are the
    // hot set.
    let hot: u64 = counts[..200].iter().sum();
    let share = hot as f64 / n as f64;
    assert!((0.79..0.81).contains(&share), "hot share {share}");
    assert!(counts[199] > 5 * counts[200], "hot/cold boundary is sharp");
}

#[test]
fn zipf_is_skewed_like_zipf() {
    let blocks = 10_000u64;
    let n = 200_000;
    let theta = 0.99;
    let counts = sorted_counts(&run(spec(Pattern::Zipf { theta }, blocks, n)), blocks);
    let norm: f64 = (1..=blocks).map(|k| (k as f64).powf(-theta)).sum();
    // The top 1% of blocks gets the share the formula predicts (~52%).
    let predicted: f64 = (1..=100).map(|k| (k as f64).powf(-theta)).sum::<f64>() / norm;
    let got = counts[..100].iter().sum::<u64>() as f64 / n as f64;
    assert!(
        (got - predicted).abs() < 0.01,
        "top 1%: {got} vs {predicted}"
    );
    // The most popular block: p(1) = 1/norm (~10%).
    let top = counts[0] as f64 / n as f64;
    assert!(
        (top - 1.0 / norm).abs() < 0.005,
        "top block {top} vs {}",
        1.0 / norm
    );
    // Uniform, by contrast, is flat.
    let flat = sorted_counts(&run(spec(Pattern::Uniform, blocks, n)), blocks);
    assert!(flat[0] < 60, "uniform max {}", flat[0]);
}

#[test]
fn hot_blocks_are_spread_over_the_volume() {
    let blocks = 10_000u64;
    let reqs = run(spec(Pattern::Zipf { theta: 0.99 }, blocks, 50_000));
    let mut counts = vec![0u64; blocks as usize];
    for r in &reqs {
        counts[(r.offset_bytes / KIB4) as usize] += 1;
    }
    let mut order: Vec<usize> = (0..blocks as usize).collect();
    order.sort_unstable_by(|&a, &b| counts[b].cmp(&counts[a]));
    let top = &order[..20];
    let (min, max) = (top.iter().min(), top.iter().max());
    assert!(
        max.zip(min)
            .is_some_and(|(max, min)| max - min > blocks as usize / 2),
        "top blocks {top:?} are clustered"
    );
}

#[test]
fn sequential_wraps() {
    let s = SyntheticSpec {
        write_fraction: 1.0,
        ..spec(Pattern::Sequential, 5, 12)
    };
    let offsets: Vec<u64> = run(s).iter().map(|r| r.offset_bytes / KIB4).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]);
}

#[test]
fn precondition_writes_the_whole_volume_first() {
    let s = SyntheticSpec {
        precondition: true,
        write_fraction: 0.0,
        ..spec(Pattern::Uniform, 8, 5)
    };
    assert_eq!(s.total_requests(), 13);
    let g = synthetic(s).expect("valid spec");
    assert_eq!(g.size_hint(), (13, Some(13)));
    let reqs: Vec<Request> = g.collect();
    for (i, r) in reqs[..8].iter().enumerate() {
        assert_eq!((r.op, r.offset_bytes), (Op::Write, i as u64 * KIB4));
    }
    assert!(reqs[8..].iter().all(|r| r.op == Op::Read));
    assert_eq!(reqs.last().map(|r| r.time_ns), Some(12));
}
