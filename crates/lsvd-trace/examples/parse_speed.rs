//! Measures trace parsing throughput (requests/s on one core), by default on
//! the largest shared sample, the CloudPhysics CSV.
//!
//! `cargo run --release -p lsvd-trace --example parse_speed [PATH [FORMAT|auto]]`

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use lsvd_trace::{FormatChoice, SyntheticSpec, TraceReader, synthetic};

const DEFAULT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/cloudphysics_libcachesim/cloudPhysicsIO.csv"
);

fn main() -> Result<(), lsvd_trace::Error> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| DEFAULT.to_string());
    let choice: FormatChoice = args.next().as_deref().unwrap_or("auto").parse()?;
    let format = choice.resolve(&path)?;

    // Repeat the (small) sample until at least a second has been measured.
    let mut requests = 0u64;
    let mut bytes = 0u64;
    let mut passes = 0u32;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let mut reader = TraceReader::open(&path, format)?;
        for r in reader.by_ref() {
            bytes = bytes.wrapping_add(r.length_bytes);
        }
        requests += reader.finish()?.requests;
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{format}: {requests} requests in {secs:.2} s ({passes} passes over {path}): {:.2} M requests/s (checksum {bytes})",
        requests as f64 / secs / 1e6
    );

    let spec = SyntheticSpec {
        pattern: "zipf:0.99".parse()?,
        volume_size_bytes: 1 << 40,
        requests: 10_000_000,
        ..SyntheticSpec::default()
    };
    let start = Instant::now();
    let sum = synthetic(spec)?.fold(0u64, |acc, r| acc.wrapping_add(r.offset_bytes));
    let secs = start.elapsed().as_secs_f64();
    println!(
        "synthetic {}: {:.2} M requests/s (checksum {sum})",
        spec.pattern,
        spec.requests as f64 / secs / 1e6
    );
    Ok(())
}
