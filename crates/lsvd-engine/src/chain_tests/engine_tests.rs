//! A real volume on a chain of small drives: overwrites with GC running, data read
//! back and compared (live and after a reopen), and where every object landed.
//! Compact-in-body must keep every GC object off the drive that was the tail when it
//! was written; move-to-tail is run too, to show the check can fail.

use std::path::PathBuf;
use std::sync::Arc;

use crate::test_support::{
    create_and_open, gc_config, poll_until, settle, verify, verify_from_store_alone, wait_until,
    write_next_versions,
};
use crate::{EngineConfig, create_volume, open_volume};
use lsvd_store::DynStore;
use lsvd_store::chain::chain_store::ChainStore;
use lsvd_store::chain::drives::parse_spec;
use lsvd_store::testutil::TempDir;

const BLOCK: u64 = 4096;
/// 8 MiB volume.
const BLOCKS: u64 = 2048;
/// Writes of 64 KiB.
const WRITE_BLOCKS: u64 = 16;

fn config() -> EngineConfig {
    super::copy_fallback_tests::config(gc_config().gc)
}

/// Objects of each kind (`d`, `g`, `c`) in each drive directory.
fn files_per_drive(dirs: &[PathBuf]) -> Vec<[usize; 3]> {
    dirs.iter()
        .map(|d| {
            let mut n = [0usize; 3];
            if let Ok(entries) = std::fs::read_dir(d.join("v/obj")) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    match name.rsplit('.').next() {
                        Some("d") => n[0] += 1,
                        Some("g") => n[1] += 1,
                        Some("c") => n[2] += 1,
                        _ => {}
                    }
                }
            }
            n
        })
        .collect()
}

struct Outcome {
    gc_puts: Vec<u64>,
    gc_puts_to_tail: u64,
    gc_passes: u64,
    tail_moves: u64,
}

/// Fill the volume, overwrite it three times at random, let GC work, compare
/// everything, reopen from the directories and compare again. With `mirrored`, each
/// drive is a pair and both copies must hold the same objects.
async fn run(gc_option: &str, mirrored: bool) -> Outcome {
    let root = TempDir::new("chain-engine");
    let dirs: Vec<PathBuf> = (0..4)
        .map(|i| root.path().join(format!("drive{i}")))
        .collect();
    let mirrors: Vec<PathBuf> = (0..4)
        .map(|i| root.path().join(format!("mirror{i}")))
        .collect();
    let list: Vec<String> = dirs
        .iter()
        .zip(&mirrors)
        .map(|(d, m)| {
            if mirrored {
                format!("{}+{}", d.display(), m.display())
            } else {
                d.display().to_string()
            }
        })
        .collect();
    let spec_text = format!("{}?drive_size=6M{gc_option}", list.join(","));
    let chain = ChainStore::open(&parse_spec("chain", &spec_text).expect("spec")).expect("open");
    let store: DynStore = Arc::new(chain.clone());
    let data_dir = TempDir::new("chain-engine-data");
    let (volume, _) = create_and_open(&store, "v", BLOCKS * BLOCK, data_dir.path(), config()).await;
    let mut model = vec![0u64; BLOCKS as usize];
    let mut version = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let writes = BLOCKS / WRITE_BLOCKS * 4;
    for i in 0..writes {
        // The first pass fills the volume in order, the rest land at random.
        let first = if i < BLOCKS / WRITE_BLOCKS {
            i * WRITE_BLOCKS
        } else {
            (xorshift(&mut rng) % (BLOCKS / WRITE_BLOCKS)) * WRITE_BLOCKS
        };
        let run = first..first + WRITE_BLOCKS;
        write_next_versions(&volume, &mut model, run, &mut version).await;
    }
    volume.flush().await.expect("flush");
    settle(&volume).await;
    verify(&volume, &model).await;
    let status = volume.status();
    volume.shutdown().await.expect("shutdown");
    let counters = chain.drive_counters();
    let outcome = Outcome {
        gc_puts: counters.iter().map(|c| c.gc_puts).collect(),
        gc_puts_to_tail: chain.gc_puts_to_tail(),
        gc_passes: status.gc_passes,
        tail_moves: lsvd_store::chain::meta::read_drive_record(&dirs[0])
            .expect("record")
            .expect("present")
            .generation
            - 1,
    };
    eprintln!(
        "chain{gc_option}: gc passes {}, tail moves {}, per drive (puts, gc puts, bytes): {:?}, \
         files (d, g, c): {:?}, gc puts to the tail {}",
        outcome.gc_passes,
        outcome.tail_moves,
        counters
            .iter()
            .map(|c| (c.puts, c.gc_puts, c.put_bytes))
            .collect::<Vec<_>>(),
        files_per_drive(&dirs),
        outcome.gc_puts_to_tail
    );
    if mirrored {
        for (d, m) in dirs.iter().zip(&mirrors) {
            let names = |p: &PathBuf| -> Vec<String> {
                let mut v: Vec<String> = std::fs::read_dir(p.join("v/obj"))
                    .map(|r| {
                        r.flatten()
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                v.sort();
                v
            };
            assert_eq!(names(d), names(m), "both copies hold the same objects");
        }
    }
    // Reopened from the directories alone, with a fresh data directory: the same data.
    drop(store);
    let store = lsvd_store::open_store(&format!("chain:{spec_text}")).expect("reopen store");
    verify_from_store_alone(store, "chain-engine-data2", config(), &model).await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_in_body_keeps_gc_off_the_tail_of_a_live_volume() {
    let o = run("", false).await;
    assert!(o.gc_passes > 0, "GC ran");
    assert!(o.tail_moves > 0, "the tail moved");
    assert!(o.gc_puts.iter().sum::<u64>() > 0, "GC objects were written");
    assert_eq!(
        o.gc_puts_to_tail, 0,
        "a GC object went to the tail: {:?}",
        o.gc_puts
    );
    let o = run("&gc=move-to-tail", false).await;
    assert!(o.gc_passes > 0);
    assert_eq!(
        o.gc_puts_to_tail,
        o.gc_puts.iter().sum::<u64>(),
        "move-to-tail puts all GC output on the tail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_volume_on_mirrored_drives_keeps_both_copies_equal() {
    let o = run("", true).await;
    assert!(o.gc_passes > 0 && o.tail_moves > 0);
    assert_eq!(o.gc_puts_to_tail, 0);
}

/// The store stops (a crash) at the n-th put or delete, for n across a run that fills
/// drives, moves the tail and runs GC; the process is gone (the volume crashed, the
/// chain dropped); a new process opens the chain from its directories and the volume
/// from the intact cache: every flushed write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_store_mutation_loses_no_flushed_write() {
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    let mut mutations_seen = 0u64;
    for n in (1..120u64).step_by(7) {
        let root = TempDir::new("chain-engine-crash");
        let list: Vec<String> = (0..3)
            .map(|i| root.path().join(format!("drive{i}")).display().to_string())
            .collect();
        // 18 MiB of drives for 12 MiB of writes: full drives would stall uploads,
        // and GC does not run while uploads wait (ARCHITECTURE, "Chained-drive store").
        let spec_text = format!("{}?drive_size=6M", list.join(","));
        let chain =
            ChainStore::open(&parse_spec("chain", &spec_text).expect("spec")).expect("open");
        let store: DynStore = Arc::new(chain.clone());
        create_volume(&store, "v", (BLOCKS / 2) * BLOCK)
            .await
            .expect("create");
        let tracked = Arc::new(InFlight {
            inner: store.clone(),
            active: Default::default(),
        });
        let faulty = Arc::new(FaultyStore::new(tracked.clone(), FaultPlan::default(), n));
        let data_dir = TempDir::new("chain-engine-crash-data");
        let (volume, _) = open_volume(faulty.clone(), "v", data_dir.path(), config())
            .await
            .expect("open volume");
        faulty.kill_after_mutations(n);
        let mut model = vec![0u64; (BLOCKS / 2) as usize];
        let mut version = 0u64;
        let mut rng = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for round in 0..3 {
            for i in 0..(BLOCKS / 2 / WRITE_BLOCKS) {
                let first = if round == 0 {
                    i * WRITE_BLOCKS
                } else {
                    (xorshift(&mut rng) % (BLOCKS / 2 / WRITE_BLOCKS)) * WRITE_BLOCKS
                };
                let run = first..first + WRITE_BLOCKS;
                write_next_versions(&volume, &mut model, run, &mut version).await;
            }
            volume.flush().await.expect("flush");
            // Give uploads and GC a moment to reach the store (and the kill).
            poll_until(std::time::Duration::from_millis(20), async || {
                faulty.is_killed()
            })
            .await;
        }
        let stats = faulty.stats();
        mutations_seen = mutations_seen.max(stats.puts);
        // The process dies here if the store has not stopped it yet: nothing it
        // started (an upload, a checkpoint's superblock) may land after this.
        faulty.kill();
        volume.crash();
        // A dead process has nothing in flight: wait for puts and deletes already
        // handed to the drives.
        wait_until("the drives' puts and deletes in flight", async || {
            tracked.active.load(std::sync::atomic::Ordering::SeqCst) == 0
        })
        .await;
        drop(volume);
        drop(faulty);
        drop(tracked);
        drop(store);
        drop(chain);
        let store = lsvd_store::open_store(&format!("chain:{spec_text}")).expect("reopen store");
        let (volume, _) = open_volume(store, "v", data_dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("n={n}: reopen: {e}"));
        verify(&volume, &model).await;
        volume.shutdown().await.expect("shutdown");
    }
    assert!(
        mutations_seen > 20,
        "the runs reached the store: {mutations_seen} puts"
    );
}

/// Counts puts and deletes under way in the store it wraps. Each runs as a task of its
/// own, to its end, even if its caller is dropped: the engine's uploader is aborted
/// at the crash, and a put it had handed to a drive still lands (the drive's write is
/// on the blocking pool), as the syscalls of a dying process do. Counted on the
/// caller's future instead, a put dropped mid-flight was never uncounted and the test
/// waited its full minute, then failed (seen under the load of `store::` in parallel).
struct InFlight {
    inner: DynStore,
    active: Arc<std::sync::atomic::AtomicUsize>,
}

impl InFlight {
    fn track<T: Send + 'static>(
        &self,
        op: impl FnOnce(DynStore) -> lsvd_store::BoxFuture<'static, lsvd_store::StoreResult<T>>,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<T>> {
        use std::sync::atomic::Ordering;
        self.active.fetch_add(1, Ordering::SeqCst);
        let active = self.active.clone();
        let task = op(self.inner.clone());
        let handle = tokio::spawn(async move {
            let r = task.await;
            active.fetch_sub(1, Ordering::SeqCst);
            r
        });
        Box::pin(async move {
            handle.await.map_err(|e| {
                lsvd_core::error::Error::with_source(
                    lsvd_core::error::ErrorKind::Transient,
                    "store task failed",
                    e,
                )
            })?
        })
    }
}

impl lsvd_store::ObjectStore for InFlight {
    fn put(
        &self,
        key: &str,
        data: bytes::Bytes,
        mode: lsvd_store::PutMode,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<()>> {
        let key = key.to_string();
        self.track(move |s| Box::pin(async move { s.put(&key, data, mode).await }))
    }
    fn put_placed(
        &self,
        key: &str,
        data: bytes::Bytes,
        mode: lsvd_store::PutMode,
        placement: &lsvd_store::Placement,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<()>> {
        let key = key.to_string();
        let placement = placement.clone();
        self.track(move |s| {
            Box::pin(async move { s.put_placed(&key, data, mode, &placement).await })
        })
    }
    fn get(&self, key: &str) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<u8>>> {
        self.inner.get(key)
    }
    fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<u8>>> {
        self.inner.get_range(key, range)
    }
    fn get_range_background(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<u8>>> {
        self.inner.get_range_background(key, range)
    }
    fn list(
        &self,
        prefix: &str,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<lsvd_store::ListEntry>>> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<()>> {
        let key = key.to_string();
        self.track(move |s| Box::pin(async move { s.delete(&key).await }))
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn admit_uploads_to_cache(&self) -> bool {
        self.inner.admit_uploads_to_cache()
    }
    fn metrics(&self) -> Vec<lsvd_store::StoreMetric> {
        self.inner.metrics()
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<lsvd_store::CopyBytes>>> {
        self.inner.get_range_copies(key, range)
    }
    fn repair_copies(
        &self,
        key: &str,
        good: bytes::Bytes,
    ) -> lsvd_store::BoxFuture<'_, lsvd_store::StoreResult<Vec<String>>> {
        let key = key.to_string();
        self.track(move |s| Box::pin(async move { s.repair_copies(&key, good).await }))
    }
}

/// The tests' seeded xorshift64: the next value of `state`.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
