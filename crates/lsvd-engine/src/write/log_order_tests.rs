//! Overlapped log writes (`log_order`): callers are answered in log order even when a
//! later record lands first, and after a crash that left a later record whole behind
//! a torn one, recovery keeps only the records before the torn one and the log space
//! after it is written again correctly.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::cache_dev::CacheDevice;
use crate::cache_dev::faulty::{DevEvent, FaultyCache};
use crate::test_support::{log_block as block, log_config, poll_until, wait_until};
use crate::{EngineConfig, Volume, create_volume, open_volume_on};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;

const CACHE_BYTES: u64 = 16 << 20;
/// A one-write record: a 512-byte header, then the 4 KiB block.
const RECORD_4K: usize = 512 + 4096;

fn config(in_flight: usize) -> EngineConfig {
    // Nothing is uploaded during the test: recovery must take the log.
    EngineConfig {
        log_writes_in_flight: in_flight,
        ..log_config(8 << 20, 600_000, CACHE_BYTES)
    }
}

async fn read_block(vol: &Volume, b: u64) -> Vec<u8> {
    vol.read(b * 4096, 4096).await.expect("read")
}

/// One-write records written to a device: (offset, the block), in issue order.
type Seen = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// Where the first record [`record_writes`] saw was written.
fn first_write_at(seen: &Seen) -> Option<u64> {
    seen.lock().expect("lock").first().map(|w| w.0)
}

/// Watch the one-write records written to `cache`.
fn record_writes(cache: &FaultyCache) -> Seen {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    cache.set_write_hook(Box::new(move |ev| {
        if let DevEvent::Write { offset, data } = ev
            && data.len() == RECORD_4K
            && data.starts_with(b"LSVDREC\0")
        {
            s.lock()
                .expect("hook lock")
                .push((offset, data[512..].to_vec()));
        }
    }));
    seen
}

/// A memory store holding a new volume "v" of 16 MiB.
async fn store_with_a_volume() -> DynStore {
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", 16 << 20).await.expect("create");
    store
}

/// Crashes `vol` and returns the device the next process finds: what of `cache`
/// survived the crash.
fn crash_and_restart(vol: &Volume, cache: &FaultyCache) -> Arc<FaultyCache> {
    vol.crash();
    FaultyCache::from_image(cache.process_crash())
}

async fn open(store: &DynStore, cache: &Arc<FaultyCache>, in_flight: usize) -> Arc<Volume> {
    let c: Arc<dyn CacheDevice> = cache.clone();
    let (vol, _) = open_volume_on(store.clone(), "v", c, "faulty", config(in_flight))
        .await
        .expect("open");
    vol
}

/// Record N torn, record N+1 whole (possible with overlapped writes): recovery keeps
/// the records before N only, and new records reuse N's place without exposing N+1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_record_after_a_torn_one_is_never_recovered() {
    let store = store_with_a_volume().await;
    let cache = FaultyCache::new(CACHE_BYTES);
    let seen = record_writes(&cache);
    let vol = open(&store, &cache, 4).await;
    vol.write(0, block(0, 1), false).await.expect("write A");
    vol.flush().await.expect("flush");
    // Awaited one by one: two records, N and N+1.
    vol.write(4096, block(1, 1), false).await.expect("write N");
    vol.write(2 * 4096, block(2, 1), false)
        .await
        .expect("write N+1");
    vol.crash();
    let mut image = cache.process_crash();
    let (torn_at, n_plus_1_at) = {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 3, "three one-write records: {seen:?}");
        assert_eq!(seen[1].1, block(1, 1));
        assert_eq!(seen[2].1, block(2, 1));
        (seen[1].0, seen[2].0)
    };
    // Tear record N: its last sectors never landed.
    let tail = (torn_at as usize + 512 + 2048)..(torn_at as usize + RECORD_4K);
    image[tail].fill(0);

    let cache = FaultyCache::from_image(image);
    let seen = record_writes(&cache);
    let vol = open(&store, &cache, 4).await;
    assert_eq!(read_block(&vol, 0).await, block(0, 1), "A was flushed");
    assert_eq!(read_block(&vol, 1).await, vec![0u8; 4096], "N is torn");
    assert_eq!(
        read_block(&vol, 2).await,
        vec![0u8; 4096],
        "N+1 lies after a torn record: never exposed"
    );
    // A later write works and takes N's place in the log. Old N+1 still follows it,
    // with the right sequence number, but chained to the old N: never taken.
    vol.write(3 * 4096, block(3, 2), true)
        .await
        .expect("write FUA");
    assert_eq!(
        first_write_at(&seen),
        Some(torn_at),
        "the first new record reuses N's place"
    );
    let cache = crash_and_restart(&vol, &cache);
    let seen = record_writes(&cache);
    let vol = open(&store, &cache, 16).await;
    assert_eq!(read_block(&vol, 0).await, block(0, 1));
    assert_eq!(read_block(&vol, 1).await, vec![0u8; 4096]);
    assert_eq!(
        read_block(&vol, 2).await,
        vec![0u8; 4096],
        "old N+1 stays out"
    );
    assert_eq!(read_block(&vol, 3).await, block(3, 2));
    // And the place of old N+1 is written again.
    vol.write(4 * 4096, block(4, 3), false)
        .await
        .expect("write");
    vol.flush().await.expect("flush");
    assert_eq!(
        first_write_at(&seen),
        Some(n_plus_1_at),
        "the next record takes old N+1's place"
    );
    let cache = crash_and_restart(&vol, &cache);
    let vol = open(&store, &cache, 1).await;
    assert_eq!(read_block(&vol, 0).await, block(0, 1));
    assert_eq!(read_block(&vol, 1).await, vec![0u8; 4096]);
    assert_eq!(read_block(&vol, 2).await, vec![0u8; 4096]);
    assert_eq!(read_block(&vol, 3).await, block(3, 2));
    assert_eq!(read_block(&vol, 4).await, block(4, 3));
    vol.shutdown().await.expect("shutdown");
}

/// A cache device that holds back writes starting with `hold` until released.
struct GateCache {
    inner: Arc<FaultyCache>,
    hold: Vec<u8>,
    released: Mutex<bool>,
    wake: Condvar,
    held: AtomicBool,
}

impl CacheDevice for GateCache {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if buf.len() == RECORD_4K && buf[512..] == self.hold[..] {
            self.held.store(true, Ordering::SeqCst);
            let mut r = self.released.lock().expect("gate lock");
            while !*r {
                r = self.wake.wait(r).expect("gate wait");
            }
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

/// With several writes in flight, a record that lands before an earlier one waits for
/// it: its caller is answered, and a FLUSH after it too, only once the earlier one
/// has landed. The later record does reach the device meanwhile (overlap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_answered_in_log_order() {
    let store = store_with_a_volume().await;
    let faulty = FaultyCache::new(CACHE_BYTES);
    let seen = record_writes(&faulty);
    let gate = Arc::new(GateCache {
        inner: faulty.clone(),
        hold: block(1, 1),
        released: Mutex::new(false),
        wake: Condvar::new(),
        held: AtomicBool::new(false),
    });
    let c: Arc<dyn CacheDevice> = gate.clone();
    let (vol, _) = open_volume_on(store.clone(), "v", c, "gate", config(4))
        .await
        .expect("open");
    let v = vol.clone();
    let first = tokio::spawn(async move { v.write(4096, block(1, 1), false).await });
    wait_until("the first record held", async || {
        gate.held.load(Ordering::SeqCst)
    })
    .await;
    let v = vol.clone();
    let second = tokio::spawn(async move { v.write(2 * 4096, block(2, 1), false).await });
    let v = vol.clone();
    let flush = tokio::spawn(async move { v.flush().await });
    wait_until(
        "the second record written while the first is held",
        async || {
            seen.lock()
                .expect("lock")
                .iter()
                .any(|(_, d)| *d == block(2, 1))
        },
    )
    .await;
    // Time for a wrong answer to show: any of the three finishing ends the wait.
    poll_until(Duration::from_millis(50), async || {
        first.is_finished() || second.is_finished() || flush.is_finished()
    })
    .await;
    assert!(!first.is_finished(), "the held write is not answered");
    assert!(
        !second.is_finished(),
        "a later record is not answered before an earlier one landed"
    );
    assert!(!flush.is_finished(), "nor is a FLUSH after it");
    assert_eq!(
        read_block(&vol, 2).await,
        vec![0u8; 4096],
        "nor is its data mapped"
    );
    *gate.released.lock().expect("gate lock") = true;
    gate.wake.notify_all();
    first.await.expect("join").expect("first write");
    second.await.expect("join").expect("second write");
    flush.await.expect("join").expect("flush");
    assert_eq!(read_block(&vol, 1).await, block(1, 1));
    assert_eq!(read_block(&vol, 2).await, block(2, 1));
    vol.shutdown().await.expect("shutdown");
}
