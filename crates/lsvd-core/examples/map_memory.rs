//! Heap bytes per extent of the store map (`ExtentMap<ObjLoc>`), the figure issue 45
//! asks about (the LSVD paper reports 24 bytes per extent). Counts every allocation
//! with a counting global allocator while a map is built from random 4 KiB..64 KiB
//! writes over a 64 GiB volume (at most about 2 million extents fit: random writes
//! overlap), and prints bytes per extent at a few sizes.
//!
//! `cargo run --release -p lsvd-core --example map_memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use lsvd_core::extent_map::ExtentMap;
use lsvd_core::store_state::ObjLoc;

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let volume_sectors: u64 = (64 << 30) / 512;
    let mut map: ExtentMap<ObjLoc> = ExtentMap::new();
    let base = LIVE_BYTES.load(Ordering::Relaxed);
    // xorshift: deterministic, no dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut writes = 0u64;
    println!(
        "{:>10} {:>10} {:>14} {:>16}",
        "writes", "extents", "heap bytes", "bytes/extent"
    );
    for target in [10_000u64, 100_000, 1_000_000] {
        while map.extent_count() < target as usize {
            let sectors = 8 * (1 + next() % 16);
            let lba = (next() % (volume_sectors / 8)) * 8;
            let lba = lba.min(volume_sectors - sectors);
            let loc = ObjLoc {
                object_seq: writes / 2048,
                offset: (writes % 2048) * 4096,
            };
            map.insert(lba, sectors, loc, |_| {});
            writes += 1;
        }
        let heap = LIVE_BYTES.load(Ordering::Relaxed) - base;
        println!(
            "{writes:>10} {:>10} {heap:>14} {:>16.1}",
            map.extent_count(),
            heap as f64 / map.extent_count() as f64
        );
    }
}
