//! Read-cache tests: hits and CLOCK eviction, partial reads, admission of uploaded data
//! and its bound, and crash safety of the slot table (a reopened cache never returns
//! bytes that are not the chunk its key names, whatever writes were lost).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lsvd_core::VolumeId;
use lsvd_trace::synthetic::prng::Rng;

use super::*;
use crate::cache_dev::FileCache;
use lsvd_store::testutil::TempDir;

const CHUNK: u64 = READ_CACHE_CHUNK_BYTES;

/// (object seq, chunk) of an object of epoch 0, as these tests name chunks.
type Key = (u64, u64);

/// The volume whose objects these tests cache.
const OWNER: VolumeId = VolumeId([5; 16]);

/// Object `seq` of epoch 0 of volume [`OWNER`].
fn o(seq: u64) -> CacheObject {
    CacheObject::new(OWNER, seq, 0)
}

fn devices(dir: &TempDir, slots: u64) -> (Arc<dyn CacheDevice>, Arc<dyn CacheDevice>) {
    let (data, _) = FileCache::open_or_create(&dir.path().join("c"), slots * CHUNK).expect("file");
    let (table, _) =
        FileCache::open_or_create(&dir.path().join("c.slots"), slot_table::file_bytes(slots))
            .expect("file");
    (Arc::new(data), Arc::new(table))
}

/// [`devices`] in a new directory named by `tag` (returned, to keep them).
fn devices_in(tag: &str, slots: u64) -> (TempDir, Arc<dyn CacheDevice>, Arc<dyn CacheDevice>) {
    let dir = TempDir::new(tag);
    let (data, table) = devices(&dir, slots);
    (dir, data, table)
}

/// A read cache of `slots` chunks for volume `[5; 16]`, on devices in a new directory
/// (returned, to keep them).
fn new_cache(tag: &str, slots: u64) -> (TempDir, ReadCache) {
    let (dir, dev, table) = devices_in(tag, slots);
    let rc = ReadCache::open(dev, table, VolumeId([5; 16])).expect("open");
    (dir, rc)
}

/// Chunks `0..n` of object 1 inserted as a client's reads, and read again (so they
/// are referenced).
fn read_chunks(rc: &ReadCache, n: u64) {
    for i in 0..n {
        rc.insert(o(1), i, &chunk((1, i)));
        assert!(whole(rc, (1, i)).is_some());
    }
}

/// The bytes of chunk `key`, distinct for every key and every 4 KiB block.
fn chunk(key: Key) -> Vec<u8> {
    let mut v = vec![0u8; CHUNK as usize];
    for (i, b) in v.chunks_mut(8).enumerate() {
        b.copy_from_slice(&(key.0 << 40 ^ key.1 << 20 ^ i as u64).to_le_bytes());
    }
    v
}

fn whole(rc: &ReadCache, key: Key) -> Option<Vec<u8>> {
    rc.get(o(key.0), key.1, 0, CHUNK)
}

#[test]
fn hits_partial_reads_eviction_and_warm_restart() {
    let (_dir, dev, table) = devices_in("rcache", 4);
    let vol = VolumeId([5; 16]);
    let rc = ReadCache::open(dev.clone(), table.clone(), vol).expect("open");
    assert!(whole(&rc, (1, 0)).is_none());
    for i in 0..4 {
        rc.insert(o(1), i, &chunk((1, i)));
    }
    assert_eq!(whole(&rc, (1, 2)), Some(chunk((1, 2))));
    // Any range, read and checked 4 KiB block by block.
    assert_eq!(
        rc.get(o(1), 3, 5000, 9000),
        Some(chunk((1, 3))[5000..9000].to_vec())
    );
    assert_eq!(rc.get(o(1), 3, 9000, 9000), None, "empty range");
    // Full: a fifth chunk makes CLOCK evict an unreferenced one, not chunk 2.
    rc.insert(o(2), 0, &chunk((2, 0)));
    assert_eq!(whole(&rc, (2, 0)), Some(chunk((2, 0))));
    assert!(whole(&rc, (1, 2)).is_some());
    assert_eq!(rc.entries(), 4);
    // A short chunk (the end of an object): reads past its end miss.
    rc.insert(o(3), 0, &chunk((3, 0))[..6000]);
    assert_eq!(
        rc.get(o(3), 0, 4096, 6000),
        Some(chunk((3, 0))[4096..6000].to_vec())
    );
    assert_eq!(rc.get(o(3), 0, 4096, 8192), None);
    // Warm restart, with no shutdown at all: the table was written as chunks came in.
    let entries = rc.entries();
    drop(rc);
    let warm = ReadCache::open(dev.clone(), table.clone(), vol).expect("open");
    assert_eq!(warm.entries(), entries);
    assert_eq!(whole(&warm, (1, 2)), Some(chunk((1, 2))));
    drop(warm);
    // Another volume opening the table finds the chunks by their owner (a clone of
    // volume 5 reads them), but none is charged to it.
    let other = ReadCache::open(dev, table, VolumeId([6; 16])).expect("open");
    assert_eq!(other.entries(), 0);
    assert_eq!(whole(&other, (1, 2)), Some(chunk((1, 2))));
    let not_its = CacheObject::new(VolumeId([6; 16]), 1, 0);
    assert!(!other.contains(not_its, 2), "keyed by owner, not reader");
}

#[test]
fn a_damaged_block_is_a_miss_and_drops_the_chunk() {
    let (_dir, dev, table) = devices_in("rcache-damage", 2);
    let vol = VolumeId([5; 16]);
    let rc = ReadCache::open(dev.clone(), table, vol).expect("open");
    rc.insert(o(1), 0, &chunk((1, 0)));
    // Rot one byte of the third block on the device.
    dev.write_at(&[0xee], 2 * 4096 + 7).expect("write");
    assert_eq!(
        rc.get(o(1), 0, 0, 8192),
        Some(chunk((1, 0))[..8192].to_vec()),
        "blocks that are intact still read"
    );
    assert_eq!(rc.get(o(1), 0, 8192, 12288), None);
    assert!(!rc.contains(o(1), 0), "the damaged chunk is dropped");
}

#[test]
fn admitted_chunks_displace_at_most_half_and_never_push_out_read_data() {
    let (_dir, rc) = new_cache("rcache-admit", 16);
    // Eight chunks clients read, read again (referenced).
    read_chunks(&rc, 8);
    // A stream of uploads: many more chunks than the cache holds.
    for i in 0..200 {
        rc.admit(o(2), i, &chunk((2, i)));
    }
    for i in 0..8 {
        assert_eq!(whole(&rc, (1, i)), Some(chunk((1, i))), "read chunk {i}");
    }
    let admitted = (0..200).filter(|&i| rc.contains(o(2), i)).count();
    assert_eq!(admitted, 8, "half of the 16 slots");
    // The newest are the ones kept.
    assert!((192..200).all(|i| rc.contains(o(2), i)));
    assert_eq!(rc.admitted_chunks.load(Ordering::Relaxed), 200);
    // Reading an admitted chunk makes it read data: it is no longer replaced first.
    assert!(whole(&rc, (2, 192)).is_some());
    for i in 200..210 {
        rc.admit(o(2), i, &chunk((2, i)));
    }
    assert!(rc.contains(o(2), 192));
}

#[test]
fn admission_fills_free_slots_past_half_and_read_misses_still_get_room() {
    let (_dir, rc) = new_cache("rcache-admit-free", 16);
    // An empty cache: uploads may fill all of it (free space displaces nothing).
    for i in 0..16 {
        rc.admit(o(2), i, &chunk((2, i)));
    }
    assert!((0..16).all(|i| rc.contains(o(2), i)));
    // Past that, the oldest admitted chunks go first.
    for i in 16..20 {
        rc.admit(o(2), i, &chunk((2, i)));
    }
    assert!((0..4).all(|i| !rc.contains(o(2), i)));
    assert!((4..20).all(|i| rc.contains(o(2), i)));
    // A client's misses find room among the admitted chunks nobody read.
    for i in 0..10 {
        rc.insert(o(1), i, &chunk((1, i)));
        assert_eq!(whole(&rc, (1, i)), Some(chunk((1, i))));
    }
    // Slots freed by a deleted object are taken by admission before anything is
    // replaced.
    rc.forget_objects(&[1], false).expect("forget");
    let kept: Vec<u64> = (4..20).filter(|&i| rc.contains(o(2), i)).collect();
    for i in 100..110 {
        rc.admit(o(2), i, &chunk((2, i)));
    }
    assert!(
        kept.iter().all(|&i| rc.contains(o(2), i)),
        "nothing replaced"
    );
    assert!((100..110).all(|i| rc.contains(o(2), i)));
}

#[test]
fn prefetched_chunks_never_push_out_read_data_and_count_their_first_read() {
    let (_dir, rc) = new_cache("rcache-prefetch", 4);
    // Four chunks clients read, read again (referenced): the cache is full.
    read_chunks(&rc, 4);
    for i in 0..16 {
        assert!(!rc.prefetch(o(2), i, &chunk((2, i))), "no room: chunk {i}");
    }
    for i in 0..4 {
        assert_eq!(whole(&rc, (1, i)), Some(chunk((1, i))), "read chunk {i}");
    }
    // With room, prefetched chunks come in; the first read of one counts as a hit of
    // its whole length, later reads do not count again.
    let (_dir, rc) = new_cache("rcache-prefetch2", 8);
    assert!(rc.prefetch(o(3), 0, &chunk((3, 0))));
    assert!(rc.prefetch(o(3), 1, &chunk((3, 1))[..5000]));
    assert_eq!(rc.prefetched_bytes.load(Ordering::Relaxed), CHUNK + 5000);
    assert_eq!(
        rc.get(o(3), 0, 0, 4096),
        Some(chunk((3, 0))[..4096].to_vec())
    );
    assert_eq!(
        rc.get(o(3), 0, 4096, 8192),
        Some(chunk((3, 0))[4096..8192].to_vec())
    );
    assert_eq!(rc.prefetch_hit_bytes.load(Ordering::Relaxed), CHUNK);
}

/// A cache device that loses writes when told to: each write is dropped with the given
/// probability (as if the process died before the page cache wrote it back).
struct Lossy {
    inner: Arc<dyn CacheDevice>,
    lose: AtomicBool,
    rng: Mutex<Rng>,
}

impl CacheDevice for Lossy {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let dropped =
            self.lose.load(Ordering::Relaxed) && self.rng.lock().expect("lock").below(3) == 0;
        if dropped {
            return Ok(());
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A seeded random history of inserts, admissions, reads and deletions in which a
/// third of all writes (slot data and table entries alike, independently) are lost;
/// at random points the cache is reopened from the devices as they are: every chunk it
/// returns is exactly the chunk its key names.
#[test]
fn after_lost_writes_a_reopened_cache_returns_only_right_bytes() {
    for seed in 0..20u64 {
        let (_dir, dev, table) = devices_in("rcache-crash", 12);
        let lossy = |inner: Arc<dyn CacheDevice>, salt: u64| -> Arc<dyn CacheDevice> {
            Arc::new(Lossy {
                inner,
                lose: AtomicBool::new(true),
                rng: Mutex::new(Rng::new(seed * 2 + salt)),
            })
        };
        let (dev, table) = (lossy(dev, 0), lossy(table, 1));
        let vol = OWNER;
        let mut rng = Rng::new(seed);
        let mut rc = ReadCache::open(dev.clone(), table.clone(), vol).expect("open");
        let (mut reopened, mut hits_after) = (0, 0);
        for _ in 0..2000 {
            let key = (rng.below(6), rng.below(8));
            match rng.below(100) {
                0..=39 => rc.insert(o(key.0), key.1, &chunk(key)),
                40..=64 => rc.admit(o(key.0), key.1, &chunk(key)),
                65..=89 => {
                    let from = rng.below(CHUNK);
                    let to = from + 1 + rng.below(CHUNK - from);
                    if let Some(got) = rc.get(o(key.0), key.1, from, to) {
                        assert_eq!(got, chunk(key)[from as usize..to as usize], "seed {seed}");
                    }
                }
                90..=94 => rc.forget_objects(&[key.0], false).expect("forget"),
                _ => {
                    reopened += 1;
                    rc = ReadCache::open(dev.clone(), table.clone(), vol).expect("open");
                    for s in 0..6 {
                        for c in 0..8 {
                            if let Some(got) = whole(&rc, (s, c)) {
                                hits_after += 1;
                                assert_eq!(got, chunk((s, c)), "seed {seed}: after a crash");
                            }
                        }
                    }
                }
            }
        }
        assert!(
            reopened > 10 && hits_after > 0,
            "seed {seed}: {reopened} reopens"
        );
    }
}

#[test]
fn forgetting_durably_survives_a_reopen() {
    let (_dir, dev, table) = devices_in("rcache-forget", 4);
    let vol = OWNER;
    let rc = ReadCache::open(dev.clone(), table.clone(), vol).expect("open");
    rc.insert(o(5), 0, &chunk((5, 0)));
    rc.insert(o(6), 0, &chunk((6, 0)));
    rc.forget_objects(&[5], true).expect("forget");
    drop(rc);
    let rc = ReadCache::open(dev, table, vol).expect("open");
    assert!(
        !rc.contains(o(5), 0),
        "a stranded object's number is used again"
    );
    assert!(rc.contains(o(6), 0));
}

#[test]
fn the_index_keeps_its_entries_consistent() {
    // Everything the map names is a used slot with that key; the counters agree.
    let (_dir, dev, table) = devices_in("rcache-consistent", 8);
    let vol = OWNER;
    let rc = ReadCache::open(dev, table, vol).expect("open");
    let mut rng = Rng::new(3);
    for i in 0..3000u64 {
        let key = (rng.below(4), rng.below(6));
        match i % 6 {
            0 | 1 => rc.insert(o(key.0), key.1, &chunk(key)),
            2 | 3 => rc.admit(o(key.0), key.1, &chunk(key)),
            4 => {
                rc.get(o(key.0), key.1, 0, 4096);
            }
            _ => rc.forget_objects(&[key.0], false).expect("forget"),
        }
        let idx = rc.lock();
        let mut names: HashMap<u32, Key> = HashMap::new();
        for (&k, &s) in &idx.map {
            match idx.slots[s as usize] {
                SlotState::Used(slot) => assert_eq!(slot.key, k),
                other => panic!("map names slot {s} in state {other:?}"),
            }
            assert!(
                names.insert(s, (k.0.seq, k.1)).is_none(),
                "two keys in slot {s}"
            );
        }
        let used = idx
            .slots
            .iter()
            .filter(|s| matches!(s, SlotState::Used(_)))
            .count();
        assert_eq!(used, idx.map.len());
        let admitted = idx
            .slots
            .iter()
            .filter(|s| matches!(s, SlotState::Used(x) if x.admitted))
            .count();
        assert_eq!(admitted, idx.admitted_count);
        // The free list names every free slot, once.
        let mut free: Vec<u32> = idx.free.clone();
        free.sort_unstable();
        let free_slots: Vec<u32> = (0..idx.slots.len() as u32)
            .filter(|&s| matches!(idx.slots[s as usize], SlotState::Free))
            .collect();
        assert_eq!(free, free_slots);
        assert!(idx.admitted.len() <= 2 * idx.slots.len() + 1);
    }
}

/// Regression: the cache was keyed by sequence number alone, so an object of another
/// epoch under a number the cache held (a stranded object deleted at recovery and its
/// number taken by a new object, before epochs) was served the old object's bytes.
/// Now the epoch is part of the key, in memory and in the slot table.
#[test]
fn a_chunk_of_another_epoch_under_the_same_number_is_never_a_hit() {
    let (_dir, data, table) = devices_in("rcache-epoch", 8);
    let vol = OWNER;
    let rc = ReadCache::open(data.clone(), table.clone(), vol).expect("open");
    let old = CacheObject::new(vol, 7, 1);
    let new = CacheObject::new(vol, 7, 2);
    rc.insert(old, 0, &chunk((7, 0)));
    assert!(rc.contains(old, 0));
    assert!(!rc.contains(new, 0), "same number, other epoch");
    assert_eq!(rc.get(new, 0, 0, 4096), None);
    drop(rc);
    // After a restart too (the slot table names the epoch).
    let rc = ReadCache::open(data, table, vol).expect("reopen");
    assert!(rc.contains(old, 0), "warm");
    assert_eq!(rc.get(new, 0, 0, 4096), None);
    assert_eq!(
        rc.get(old, 0, 0, 4096),
        Some(chunk((7, 0))[..4096].to_vec())
    );
}

/// Volumes `vols` using one host cache of `slots` chunks (in a new directory, returned
/// to keep it).
fn shared_cache(
    tag: &str,
    slots: u64,
    vols: &[u8],
) -> (TempDir, Arc<HostReadCache>, Vec<ReadCache>) {
    let (dir, dev, table) = devices_in(tag, slots);
    let host = Arc::new(HostReadCache::open(dev, table).expect("open"));
    let handles = vols
        .iter()
        .map(|&v| ReadCache::for_volume(host.clone(), VolumeId([v; 16])))
        .collect();
    (dir, host, handles)
}

#[test]
fn volumes_sharing_a_cache_hit_each_others_chunks_by_owner() {
    let (_dir, host, rcs) = shared_cache("rcache-shared", 8, &[5, 6]);
    let (base, clone) = (&rcs[0], &rcs[1]);
    // The base reads two chunks of its object; the clone, reading the same object (its
    // ancestor's), hits them without a fetch.
    base.insert(o(1), 0, &chunk((1, 0)));
    base.insert(o(1), 1, &chunk((1, 1)));
    assert_eq!(whole(clone, (1, 1)), Some(chunk((1, 1))));
    // The clone's own object 1 is another object.
    let its_own = CacheObject::new(VolumeId([6; 16]), 1, 0);
    assert_eq!(clone.get(its_own, 0, 0, CHUNK), None);
    clone.insert(its_own, 0, &chunk((9, 0)));
    assert_eq!(whole(base, (1, 0)), Some(chunk((1, 0))), "not displaced");
    assert_eq!(clone.get(its_own, 0, 0, CHUNK), Some(chunk((9, 0))));
    assert_eq!((base.entries(), clone.entries(), host.entries()), (2, 1, 3));
    // Forgetting a deleted object drops only the forgetter's own.
    clone.forget_objects(&[1], false).expect("forget");
    assert!(!clone.contains(its_own, 0));
    assert!(clone.contains(o(1), 0), "the base's object 1 stays");
    // Several objects in one call (a checkpoint's dead victims).
    base.insert(o(2), 0, &chunk((2, 0)));
    base.insert(o(3), 4, &chunk((3, 4)));
    base.forget_objects(&[2, 3, 7], false).expect("forget");
    assert!(!base.contains(o(2), 0) && !base.contains(o(3), 4));
    assert!(base.contains(o(1), 1), "an object not named stays");
}

#[test]
fn one_volume_scanning_cannot_evict_another_below_its_share() {
    let (_dir, host, mut rcs) = shared_cache("rcache-fair", 16, &[5, 6]);
    let theirs = |seq: u64| CacheObject::new(VolumeId([6; 16]), seq, 0);
    // Volume 5 reads 8 chunks (its share of 16 slots between 2 volumes) and then goes
    // quiet; volume 6 scans 200 chunks nobody reads twice.
    read_chunks(&rcs[0], 8);
    for i in 0..200 {
        rcs[1].insert(theirs(100 + i / 8), i % 8, &chunk((100, i)));
    }
    for i in 0..8 {
        assert!(
            whole(&rcs[0], (1, i)).is_some(),
            "chunk {i} of the quiet volume"
        );
    }
    assert_eq!(rcs[0].entries(), 8);
    assert_eq!(rcs[1].entries(), 8, "the scanner recycles its own share");
    // Past its share a volume is fair game: a third volume's share is 16/3, so the
    // scanner takes from the quiet one down to that.
    let third = ReadCache::for_volume(host.clone(), VolumeId([7; 16]));
    for i in 0..40 {
        rcs[1].insert(theirs(300 + i / 8), i % 8, &chunk((300, i)));
    }
    assert!(rcs[0].entries() >= 5, "{} left", rcs[0].entries());
    assert!(rcs[0].entries() < 8, "above its share, it gave way");
    // A volume that closes leaves its chunks to anyone: the scanner takes them all.
    drop(third);
    rcs.remove(0);
    for i in 0..64 {
        rcs[0].insert(theirs(500 + i / 8), i % 8, &chunk((500, i)));
    }
    assert_eq!(rcs[0].entries(), 16);
    assert_eq!(host.entries(), 16);
}

#[test]
fn a_volume_alone_uses_the_whole_cache_and_reclaims_its_chunks_after_a_restart() {
    let (_dir, dev, table) = devices_in("rcache-adopt", 8);
    let host = Arc::new(HostReadCache::open(dev.clone(), table.clone()).expect("open"));
    let a = ReadCache::for_volume(host.clone(), OWNER);
    for i in 0..8 {
        a.insert(o(2), i, &chunk((2, i)));
    }
    assert_eq!(a.entries(), 8, "no share applies to a volume alone");
    drop((a, host));
    // After a restart the chunks are nobody's until their owner opens.
    let host = Arc::new(HostReadCache::open(dev, table).expect("reopen"));
    let other = ReadCache::for_volume(host.clone(), VolumeId([6; 16]));
    assert_eq!((other.entries(), host.entries()), (0, 8));
    let a = ReadCache::for_volume(host.clone(), OWNER);
    assert_eq!(
        a.entries(),
        8,
        "its own objects' chunks are charged to it again"
    );
    assert_eq!(whole(&other, (2, 3)), Some(chunk((2, 3))));
}

#[test]
fn a_shared_index_keeps_its_charges_consistent_as_volumes_come_and_go() {
    let (_dir, host, mut rcs) = shared_cache("rcache-charges", 12, &[1, 2, 3]);
    let mut rng = Rng::new(11);
    for _ in 0..4000 {
        let who = rng.below(3) as usize;
        let owner = VolumeId([1 + rng.below(3) as u8; 16]);
        let obj = CacheObject::new(owner, rng.below(4), 0);
        let c = rng.below(6);
        let data = chunk((obj.seq << 8 | u64::from(owner.0[0]), c));
        match rng.below(100) {
            0..=39 => rcs[who].insert(obj, c, &data),
            40..=59 => rcs[who].admit(obj, c, &data),
            60..=69 => {
                rcs[who].prefetch(obj, c, &data);
            }
            70..=89 => {
                if let Some(got) = rcs[who].get(obj, c, 0, CHUNK) {
                    assert_eq!(got, data);
                }
            }
            90..=95 => rcs[who].forget_objects(&[obj.seq], false).expect("forget"),
            _ => {
                let v = VolumeId([1 + who as u8; 16]);
                rcs[who] = ReadCache::for_volume(host.clone(), v);
            }
        }
        let idx = host.lock();
        let mut held = vec![0u32; idx.readers.len()];
        for s in &idx.slots {
            if let SlotState::Used(s) = s {
                held[usize::from(s.reader)] += 1;
                assert!(s.reader == NOBODY || idx.readers[usize::from(s.reader)].active);
            }
        }
        let counted: Vec<u32> = idx.readers.iter().map(|r| r.held).collect();
        assert_eq!(held, counted);
        assert_eq!(idx.active_readers, 3);
        assert_eq!(idx.readers.iter().filter(|r| r.active).count(), 3);
        assert!(idx.readers.len() <= 5, "reader slots are reused");
    }
}
