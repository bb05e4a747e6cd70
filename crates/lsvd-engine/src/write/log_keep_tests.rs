//! The write log keeps uploaded records (`EngineConfig::log_free_target_bytes`): reads
//! of their data need no GET while they are kept; they give way when the log needs the
//! space, without losing or staling anything; a crash with kept records recovers the
//! same data; a shrink drops kept data past the new end, so a grow reads zeros there.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::lifecycle::snapshot_tests::{BLOCK, BLOCKS, config, versions, write_all};
use crate::test_support::open_v;
use crate::{EngineConfig, Volume, create_volume};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

/// A 32 MiB log keeping `free_target` free (None: the default, which keeps nothing in
/// a log this small).
fn keep_config(free_target: Option<u64>) -> EngineConfig {
    EngineConfig {
        log_size_bytes: 32 << 20,
        log_free_target_bytes: free_target,
        ..config()
    }
}

async fn open(store: &DynStore, dir: &std::path::Path, cfg: EngineConfig) -> Arc<Volume> {
    open_v(store, dir, cfg, "open").await.0
}

/// Flush, then wait until every record is in the store.
async fn settle(vol: &Volume) {
    vol.flush().await.expect("flush");
    // Polled without sleeping, so a moment where the status says "nothing waits"
    // too early is seen. The deadline bounds a hang; it is not a timing assertion.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let s = vol.status();
        if s.log_used_bytes == 0 && s.uploads_pending == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("uploads did not finish");
}

fn gets(vol: &Volume) -> u64 {
    vol.stats().store_gets.load(Ordering::Relaxed)
}

async fn new_volume() -> DynStore {
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    store
}

/// Every block written at version 1, and in the store.
async fn write_all_and_settle(vol: &Volume) {
    write_all(vol, 1).await;
    settle(vol).await;
}

/// A new volume (its store returned) open with its files in a new directory named by
/// `tag`, keeping 8 MiB of uploaded data in its log, every block written and settled.
async fn kept_volume(tag: &str) -> (DynStore, TempDir, Arc<Volume>) {
    let store = new_volume().await;
    let dir = TempDir::new(tag);
    let vol = open(&store, dir.path(), keep_config(Some(8 << 20))).await;
    write_all_and_settle(&vol).await;
    (store, dir, vol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_data_is_read_from_the_log_until_the_log_needs_the_space() {
    let (store, dir, vol) = kept_volume("engine-log-keep").await;
    let s = vol.status();
    assert!(
        s.log_retained_bytes >= BLOCKS * BLOCK,
        "the 4 MiB just uploaded stay in the log: {} bytes kept",
        s.log_retained_bytes
    );
    let before = gets(&vol);
    assert_eq!(versions(&vol).await, vec![1; BLOCKS as usize]);
    assert_eq!(gets(&vol), before, "uploaded data read back without a GET");

    // Ten more passes over the volume: 40 MiB through a 32 MiB log, so kept records
    // give way (in the writer too, when a record does not fit).
    for version in 2..=11 {
        write_all(&vol, version).await;
    }
    settle(&vol).await;
    let s = vol.status();
    assert!(
        s.log_retained_bytes <= s.log_capacity_bytes - (8 << 20) + (1 << 20),
        "the log keeps its free target (one batch of slack): {} of {} bytes kept",
        s.log_retained_bytes,
        s.log_capacity_bytes
    );
    assert_eq!(versions(&vol).await, vec![11; BLOCKS as usize]);

    // A crash with records kept: the log's tail is behind the store's end, and
    // recovery replays nothing the store has.
    vol.crash();
    drop(vol);
    let vol = open(&store, dir.path(), keep_config(Some(8 << 20))).await;
    assert_eq!(versions(&vol).await, vec![11; BLOCKS as usize]);
    write_all(&vol, 12).await;
    vol.shutdown().await.expect("shutdown");
    // From the store alone.
    let other = TempDir::new("engine-log-keep-store-only");
    let vol = open(&store, other.path(), keep_config(Some(8 << 20))).await;
    assert_eq!(versions(&vol).await, vec![12; BLOCKS as usize]);
    vol.shutdown().await.expect("shutdown");
}

/// The contrast: a log that frees each record once uploaded reads it with a GET (so
/// the test above would notice a kept record not being used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_keeps_nothing_reads_uploaded_data_from_the_store() {
    let store = new_volume().await;
    let dir = TempDir::new("engine-log-keep-none");
    for target in [None, Some(u64::MAX)] {
        let vol = open(&store, dir.path(), keep_config(target)).await;
        write_all_and_settle(&vol).await;
        // Nothing waits and nothing is kept: every record is freed, and with it its
        // overlay entries (a record applied but not yet freed counts as used, so
        // `settle` cannot return between the two).
        let s = vol.status();
        assert_eq!(
            (s.log_retained_bytes, s.log_map_extents),
            (0, 0),
            "{target:?}"
        );
        let before = gets(&vol);
        assert_eq!(versions(&vol).await, vec![1; BLOCKS as usize]);
        assert!(gets(&vol) > before, "{target:?}: read from the store");
        vol.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_drops_kept_data_past_the_new_end() {
    let (_store, _dir, vol) = kept_volume("engine-log-keep-shrink").await;
    assert!(vol.status().log_retained_bytes > 0);
    let half = BLOCKS / 2;
    vol.resize(half * BLOCK, true).await.expect("shrink");
    vol.resize(BLOCKS * BLOCK, false).await.expect("grow");
    let mut want = vec![1; half as usize];
    want.extend(vec![0; (BLOCKS - half) as usize]);
    assert_eq!(versions(&vol).await, want, "zeros past the old cut");
    vol.shutdown().await.expect("shutdown");
}

async fn open_report(
    store: &DynStore,
    dir: &std::path::Path,
) -> (Arc<Volume>, crate::open::OpenReport) {
    open_v(store, dir, keep_config(Some(8 << 20)), "open").await
}

/// A new volume (its store returned) opened by [`open_report`] with its files in a
/// new directory named by `tag` (returned), every block written and settled.
async fn written_and_reopenable(tag: &str) -> (DynStore, TempDir, Arc<Volume>) {
    let store = new_volume().await;
    let dir = TempDir::new(tag);
    let (vol, _) = open_report(&store, dir.path()).await;
    write_all_and_settle(&vol).await;
    (store, dir, vol)
}

/// What the log kept is read from it after a crash and after a clean stop too: the
/// next open takes the records the store has back into the overlay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_records_are_read_from_the_log_after_a_crash_and_after_a_clean_stop() {
    let (store, dir, vol) = written_and_reopenable("engine-log-keep-restart").await;
    vol.crash();
    drop(vol);

    let (vol, report) = open_report(&store, dir.path()).await;
    assert!(report.log_records_kept > 0, "{report:?}");
    assert_eq!(report.log_records_replayed, 0, "the store has every record");
    assert!(vol.status().log_retained_bytes >= BLOCKS * BLOCK);
    let before = gets(&vol);
    assert_eq!(versions(&vol).await, vec![1; BLOCKS as usize]);
    assert_eq!(gets(&vol), before, "read from the log after a crash");
    // Newer writes over kept ones read back as the newer version, before and after
    // their upload.
    write_all(&vol, 2).await;
    assert_eq!(versions(&vol).await, vec![2; BLOCKS as usize]);
    settle(&vol).await;
    vol.shutdown().await.expect("shutdown");

    let (vol, report) = open_report(&store, dir.path()).await;
    assert!(report.log_records_kept > 0, "a clean stop keeps them too");
    let before = gets(&vol);
    assert_eq!(versions(&vol).await, vec![2; BLOCKS as usize]);
    assert_eq!(gets(&vol), before, "read from the log after a clean stop");
    vol.shutdown().await.expect("shutdown");
}

/// A shrink (then a grow) after the records were written: taking them back at open
/// must not bring back the data the shrink dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_records_taken_back_at_open_leave_out_what_a_shrink_dropped() {
    let (store, dir, vol) = written_and_reopenable("engine-log-keep-shrink-restart").await;
    let half = BLOCKS / 2;
    vol.resize(half * BLOCK, true).await.expect("shrink");
    vol.resize(BLOCKS * BLOCK, false).await.expect("grow");
    settle(&vol).await;
    vol.crash();
    drop(vol);
    let (vol, report) = open_report(&store, dir.path()).await;
    assert!(report.log_records_kept > 0, "{report:?}");
    let mut want = vec![1; half as usize];
    want.extend(vec![0; (BLOCKS - half) as usize]);
    assert_eq!(versions(&vol).await, want, "zeros past the old cut");
    vol.shutdown().await.expect("shutdown");
}

/// Another session (another host, another data directory) wrote the volume after
/// this log's session: the log's records may be older than the store's versions, so
/// the log keeps none of them for reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_keeps_nothing_once_another_session_wrote_the_volume() {
    let store = new_volume().await;
    let here = TempDir::new("engine-log-keep-here");
    let elsewhere = TempDir::new("engine-log-keep-elsewhere");
    let (vol, _) = open_report(&store, here.path()).await;
    write_all_and_settle(&vol).await;
    vol.shutdown().await.expect("shutdown");

    let (vol, _) = open_report(&store, elsewhere.path()).await;
    write_all(&vol, 2).await;
    vol.shutdown().await.expect("shutdown");

    for _ in 0..2 {
        let (vol, report) = open_report(&store, here.path()).await;
        assert_eq!(report.log_records_kept, 0, "{report:?}");
        assert_eq!(versions(&vol).await, vec![2; BLOCKS as usize]);
        vol.shutdown().await.expect("shutdown");
    }
}

/// The cache device lost the log's newest record, which the store has (uploaded from
/// memory before a power failure): the log must keep nothing at the next open (its
/// records would shadow the store's newer data), and the records written after that
/// open must be found by the open after it (new records continue the sequence after
/// the store's last record; a tail left at the old records would have the scan stop
/// at the gap and lose them, FUA-acknowledged writes included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_lost_records_the_store_has_keeps_nothing_and_loses_nothing_after() {
    use crate::cache_dev::CacheDevice;
    use crate::cache_dev::faulty::{DevEvent, FaultyCache};
    use std::sync::Mutex;

    let store = new_volume().await;
    let cfg = EngineConfig {
        batch_timeout_ms: 20,
        ..keep_config(Some(8 << 20))
    };
    let open_on = |cache: &Arc<FaultyCache>| {
        let c: Arc<dyn CacheDevice> = cache.clone();
        let (store, cfg) = (store.clone(), cfg.clone());
        async move {
            crate::open_volume_on(store, "v", c, "faulty", cfg)
                .await
                .expect("open")
        }
    };
    let cache = FaultyCache::new(32 << 20);
    // Where records are written: (offset, length), in order.
    let records = Arc::new(Mutex::new(Vec::new()));
    let seen = records.clone();
    cache.set_write_hook(Box::new(move |ev| {
        if let DevEvent::Write { offset, data } = ev
            && data.starts_with(b"LSVDREC\0")
        {
            seen.lock().expect("lock").push((offset, data.len()));
        }
    }));
    let (vol, _) = open_on(&cache).await;
    write_all_and_settle(&vol).await;
    // One more record, in the store (settle waits for it) and then torn in the log.
    vol.write(0, crate::lifecycle::snapshot_tests::stamp(0, 2), false)
        .await
        .expect("write");
    settle(&vol).await;
    vol.crash();
    let mut image = cache.process_crash();
    let (last_at, last_len) = *records.lock().expect("lock").last().expect("records");
    let (at, len) = (last_at as usize, last_len);
    image[at + len / 2..at + len].fill(0);

    let cache = FaultyCache::from_image(image);
    let (vol, report) = open_on(&cache).await;
    assert_eq!(report.log_records_kept, 0, "{report:?}");
    let mut want = vec![1; BLOCKS as usize];
    want[0] = 2;
    assert_eq!(
        versions(&vol).await,
        want,
        "block 0 from the store, not the log"
    );
    // Acknowledged and durable (FUA), then a process crash.
    vol.write(BLOCK, crate::lifecycle::snapshot_tests::stamp(1, 3), true)
        .await
        .expect("FUA write");
    vol.crash();
    let image = cache.process_crash();

    let cache = FaultyCache::from_image(image);
    let (vol, _) = open_on(&cache).await;
    want[1] = 3;
    assert_eq!(
        versions(&vol).await,
        want,
        "the FUA write after the reopen survives"
    );
    vol.shutdown().await.expect("shutdown");
}
