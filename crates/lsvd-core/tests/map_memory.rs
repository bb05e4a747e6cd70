//! The store map's memory per extent stays within issue 45's bound (32 bytes; the
//! LSVD paper reports 24): heap bytes counted by a counting global allocator while a
//! map is built from random 4 KiB..64 KiB writes, as `examples/map_memory.rs` does.
//! One test in this binary, so nothing else allocates meanwhile.

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

#[test]
fn the_store_map_holds_an_extent_in_at_most_32_heap_bytes() {
    let volume_sectors: u64 = (64 << 30) / 512;
    let mut map: ExtentMap<ObjLoc> = ExtentMap::new();
    let base = LIVE_BYTES.load(Ordering::Relaxed);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut writes = 0u64;
    for target in [10_000usize, 200_000] {
        while map.extent_count() < target {
            let sectors = 8 * (1 + next() % 16);
            let lba = ((next() % (volume_sectors / 8)) * 8).min(volume_sectors - sectors);
            let loc = ObjLoc {
                object_seq: writes / 2048,
                offset: (writes % 2048) * 4096,
            };
            map.insert(lba, sectors, loc, |_| {});
            writes += 1;
        }
        let heap = LIVE_BYTES.load(Ordering::Relaxed) - base;
        let per_extent = heap as f64 / map.extent_count() as f64;
        assert!(
            per_extent <= 32.0,
            "{per_extent:.1} heap bytes per extent at {} extents",
            map.extent_count()
        );
    }
    // A map reloaded from a checkpoint (ascending extents) is packed fuller still.
    let pieces: Vec<_> = map.iter().collect();
    let count = pieces.len();
    drop(map);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let reloaded = ExtentMap::from_sorted(pieces.iter().copied()).expect("sorted");
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert_eq!(reloaded.extent_count(), count);
    assert!(
        heap as f64 / count as f64 <= 20.0,
        "{:.1} heap bytes per extent after from_sorted",
        heap as f64 / count as f64
    );
}
