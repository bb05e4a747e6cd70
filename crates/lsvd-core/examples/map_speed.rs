//! Time per store-map operation (`ExtentMap<ObjLoc>`), the companion of `map_memory`:
//! builds maps of 100k and 1M extents from random 4 KiB..64 KiB writes over a 64 GiB
//! volume, then times random 4 KiB overwrites (the hot path of client writes),
//! random 4 KiB..64 KiB inserts (which split and merge), random 4 KiB lookups and a
//! full iteration. Prints nanoseconds per operation, the median of three runs. With
//! `--log`, also for the write-log map (`ExtentMap<LogLoc>`, whose locations the map
//! does not pack).
//!
//! `cargo run --release -p lsvd-core --example map_speed [-- --log]`

// A benchmark of this process's CPU time: real time is the point.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::Instant;

use lsvd_core::extent_map::{ExtentMap, Location};
use lsvd_core::log_map::LogLoc;
use lsvd_core::store_state::ObjLoc;

const VOLUME_SECTORS: u64 = (64 << 30) / 512;

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A random write of 4 KiB..64 KiB (`max_blocks` 4 KiB blocks at most), 4 KiB aligned.
fn random_write(next: &mut impl FnMut() -> u64, max_blocks: u64) -> (u64, u64) {
    let sectors = 8 * (1 + next() % max_blocks);
    let lba = (next() % (VOLUME_SECTORS / 8)) * 8;
    (lba.min(VOLUME_SECTORS - sectors), sectors)
}

/// The location of the `writes`th 4 KiB write in the store: 2048 to an object.
fn obj_loc(writes: u64) -> ObjLoc {
    ObjLoc {
        object_seq: writes / 2048,
        offset: (writes % 2048) * 4096,
    }
}

/// Its location in the write log (a location the map does not pack).
fn log_loc(writes: u64) -> LogLoc {
    LogLoc::Data {
        record_seq: writes,
        offset: writes * 4096,
    }
}

/// Nanoseconds per op of `ops` calls of `f`.
fn time(ops: u64, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..ops {
        f();
    }
    t.elapsed().as_nanos() as f64 / ops as f64
}

fn run<L: Location>(extents: usize, seed: u64, loc: fn(u64) -> L) -> [f64; 5] {
    let mut next = xorshift(seed);
    let mut map: ExtentMap<L> = ExtentMap::new();
    let mut writes = 0u64;
    let t = Instant::now();
    while map.extent_count() < extents {
        let (lba, sectors) = random_write(&mut next, 16);
        map.insert(lba, sectors, loc(writes), |_| {});
        writes += 1;
    }
    let build = t.elapsed().as_nanos() as f64 / writes as f64;
    const OPS: u64 = 1_000_000;
    let overwrite = time(OPS, || {
        let (lba, sectors) = random_write(&mut next, 1);
        let mut displaced = 0;
        map.insert(lba, sectors, loc(writes), |p| displaced += p.sectors);
        black_box(displaced);
        writes += 1;
    });
    let mixed = time(OPS, || {
        let (lba, sectors) = random_write(&mut next, 16);
        let mut displaced = 0;
        map.insert(lba, sectors, loc(writes), |p| displaced += p.sectors);
        black_box(displaced);
        writes += 1;
    });
    let lookup = time(OPS, || {
        let (lba, sectors) = random_write(&mut next, 1);
        let mut mapped = 0;
        map.for_each_in(lba, sectors, |p| {
            if p.location.is_some() {
                mapped += p.sectors
            }
        });
        black_box(mapped);
    });
    let count = map.extent_count() as u64;
    let iter = time(1, || {
        black_box(map.iter().map(|p| p.sectors).sum::<u64>());
    }) / count as f64;
    [build, overwrite, mixed, lookup, iter]
}

fn table<L: Location>(what: &str, loc: fn(u64) -> L) {
    println!("{what}");
    println!(
        "{:>10} {:>10} {:>14} {:>12} {:>12} {:>10}",
        "extents", "build ns", "4k overwrite", "mixed insert", "4k lookup", "iter"
    );
    for extents in [100_000usize, 1_000_000] {
        let mut runs: Vec<[f64; 5]> = (0..3).map(|i| run(extents, 0x9e37_79b9 + i, loc)).collect();
        let mut median = [0.0; 5];
        for (k, m) in median.iter_mut().enumerate() {
            runs.sort_by(|a, b| a[k].total_cmp(&b[k]));
            *m = runs[1][k];
        }
        println!(
            "{extents:>10} {:>10.1} {:>14.1} {:>12.1} {:>12.1} {:>10.2}",
            median[0], median[1], median[2], median[3], median[4]
        );
    }
}

fn main() {
    table("store map (ObjLoc)", obj_loc);
    if std::env::args().any(|a| a == "--log") {
        table("write-log map (LogLoc, not packed)", log_loc);
    }
}
