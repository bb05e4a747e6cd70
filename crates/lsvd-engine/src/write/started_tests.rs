//! Operations started without a task and appended at `unplug` (`crate::write::started`): on
//! the unplugging thread when it may (a runtime worker also syncs and waits for log
//! space, in `block_in_place`), by the log writer thread when not (a FLUSH or FUA at
//! the head of the queue or a full log on a thread outside the runtime, several log
//! writes in flight), in the order they were started, every one answered exactly
//! once, none lost at shutdown.

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::lifecycle::snapshot_tests::{BLOCK, BLOCKS, config, stamp, versions};
use crate::test_support::open_v;
use crate::{EngineConfig, Volume, create_volume, open_volume};
use lsvd_core::error::{ErrorKind, Result};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

async fn open(cfg: EngineConfig) -> (Arc<Volume>, DynStore, TempDir) {
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let dir = TempDir::new("engine-started");
    let vol = open_v(&store, dir.path(), cfg, "open").await.0;
    (vol, store, dir)
}

/// Answers arrive on a channel: (tag, result).
type Answers = mpsc::Receiver<(u64, Result<()>)>;

fn answer_to(tx: &mpsc::Sender<(u64, Result<()>)>, tag: u64) -> crate::Answer {
    let tx = tx.clone();
    Box::new(move |r| {
        let _ = tx.send((tag, r));
    })
}

fn handoffs(vol: &Volume) -> u64 {
    vol.stats().log_handoffs.load(Ordering::Relaxed)
}

/// Asserts who did `vol`'s blocking work for operations started on `thread`: the
/// thread itself (`by_itself` says what) unless it is a plain thread, which hands it to
/// the log writer thread (`handed_off` says what).
fn assert_handoffs(thread: Thread, vol: &Volume, by_itself: &str, handed_off: &str) {
    match thread {
        Thread::RuntimeWorker | Thread::Own => {
            assert_eq!(handoffs(vol), 0, "{thread:?}: {by_itself}")
        }
        Thread::Plain => assert!(handoffs(vol) > 0, "{handed_off}"),
    }
}

/// Wait for `n` answers (a bound on a hang, not a timing assertion); panics on a
/// second answer to one tag.
fn collect(rx: &Answers, n: usize) -> Vec<(u64, Result<()>)> {
    let mut out: Vec<(u64, Result<()>)> = Vec::new();
    while out.len() < n {
        let got = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("every started operation is answered");
        assert!(
            out.iter().all(|(tag, _)| *tag != got.0),
            "operation {} answered twice",
            got.0
        );
        out.push(got);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_writes_are_appended_at_unplug_and_read_back() {
    let (vol, _store, _dir) = open(config()).await;
    let (tx, rx) = mpsc::channel();
    for b in 0..BLOCKS {
        vol.start_write(b * BLOCK, stamp(b, 1), false, answer_to(&tx, b));
    }
    let appended_before = vol.stats().log_records.load(Ordering::Relaxed);
    assert_eq!(appended_before, 0, "nothing is appended before the unplug");
    vol.unplug();
    for (tag, r) in collect(&rx, BLOCKS as usize) {
        r.unwrap_or_else(|e| panic!("write {tag}: {e}"));
    }
    assert_eq!(versions(&vol).await, vec![1; BLOCKS as usize]);
    assert_eq!(handoffs(&vol), 0, "appended by the unplugging thread");
    // Appended as group commits, not a record per write.
    let records = vol.stats().log_records.load(Ordering::Relaxed);
    assert!(
        records < BLOCKS / 4,
        "{records} records for {BLOCKS} writes"
    );
    vol.shutdown().await.expect("shutdown");
}

/// Where a test starts and unplugs its operations.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Thread {
    /// A worker of the multi-thread runtime (as the NBD server's readers are): it
    /// blocks for syncs and log space itself, in `block_in_place`.
    RuntimeWorker,
    /// A thread outside any runtime: what blocks is left to the log writer thread.
    Plain,
    /// A thread outside any runtime that may block outright (as an NBD connection's
    /// own thread does, `Volume::unplug_on_own_thread`): it syncs and waits itself.
    Own,
}

/// Unplug as `thread` does.
fn unplug(v: &Volume, thread: Thread) {
    match thread {
        Thread::Own => v.unplug_on_own_thread(),
        Thread::RuntimeWorker | Thread::Plain => v.unplug(),
    }
}

/// Run `f` on `thread`, and wait for it. A plain thread is a `std::thread` (a thread of
/// tokio's blocking pool is inside the runtime, where `block_in_place` is allowed);
/// it is joined from the blocking pool so that no runtime worker waits for it.
async fn run_on(thread: Thread, f: impl FnOnce() + Send + 'static) {
    match thread {
        Thread::RuntimeWorker => tokio::spawn(async move { f() }).await.expect("task"),
        Thread::Plain | Thread::Own => {
            tokio::task::spawn_blocking(move || std::thread::spawn(f).join().expect("thread"))
                .await
                .expect("join")
        }
    }
}

/// A FLUSH (and a FUA write) is synced, and so is everything after it, by the
/// unplugging thread on a runtime worker or a thread of its own, and by the log writer
/// thread from any other; the order of the writes to one block still decides what it
/// reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_are_appended_in_order_by_a_worker_or_the_writer_thread() {
    for thread in [Thread::RuntimeWorker, Thread::Plain, Thread::Own] {
        let (vol, _store, _dir) = open(config()).await;
        let (tx, rx) = mpsc::channel();
        let syncs = || vol.stats().log_syncs.load(Ordering::Relaxed);
        let before = syncs();
        let v = vol.clone();
        run_on(thread, move || {
            v.start_write(0, stamp(0, 1), false, answer_to(&tx, 1));
            v.start_flush(answer_to(&tx, 2));
            v.start_write(0, stamp(0, 2), false, answer_to(&tx, 3));
            v.start_write(BLOCK, stamp(1, 2), true, answer_to(&tx, 4));
            v.start_write(0, stamp(0, 3), false, answer_to(&tx, 5));
            unplug(&v, thread);
        })
        .await;
        for (tag, r) in collect(&rx, 5) {
            r.unwrap_or_else(|e| panic!("{thread:?}: operation {tag}: {e}"));
        }
        assert!(
            syncs() > before,
            "{thread:?}: the FLUSH and the FUA write were synced"
        );
        assert_handoffs(
            thread,
            &vol,
            "synced by the unplugging thread",
            "synced by the writer thread",
        );
        let v = versions(&vol).await;
        assert_eq!(
            (v[0], v[1]),
            (3, 2),
            "{thread:?}: the last write started wins"
        );
        vol.shutdown().await.expect("shutdown");
    }
}

/// Many threads start and unplug at once, with flushes among the writes: runtime
/// workers (which sync in `block_in_place`, holding the appender while the others start
/// and unplug), plain threads (which hand syncs to the writer thread) and threads of
/// their own (which sync outright, as NBD connection threads do): every operation is
/// answered once, and each block holds its thread's last version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unplugs_lose_nothing() {
    let (vol, _store, _dir) = open(config()).await;
    let (tx, rx) = mpsc::channel();
    const THREADS: u64 = 6;
    const ROUNDS: u64 = 50;
    let per_thread = BLOCKS / THREADS;
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let (vol, tx) = (vol.clone(), tx.clone());
        let thread = [Thread::RuntimeWorker, Thread::Plain, Thread::Own][t as usize % 3];
        threads.push(tokio::spawn(run_on(thread, move || {
            let mut tag = t << 32;
            for round in 1..=ROUNDS {
                for i in 0..4 {
                    let b = t * per_thread + (round * 7 + i) % per_thread;
                    tag += 1;
                    vol.start_write(b * BLOCK, stamp(b, round), false, answer_to(&tx, tag));
                }
                if round % 10 == 0 {
                    tag += 1;
                    vol.start_flush(answer_to(&tx, tag));
                }
                unplug(&vol, thread);
            }
        })));
    }
    for t in threads {
        t.await.expect("thread");
    }
    let n = (THREADS * ROUNDS * 4 + THREADS * ROUNDS / 10) as usize;
    for (tag, r) in collect(&rx, n) {
        r.unwrap_or_else(|e| panic!("operation {tag:x}: {e}"));
    }
    let mut want = vec![0u64; BLOCKS as usize];
    for t in 0..THREADS {
        for round in 1..=ROUNDS {
            for i in 0..4 {
                want[(t * per_thread + (round * 7 + i) % per_thread) as usize] = round;
            }
        }
    }
    assert_eq!(versions(&vol).await, want);
    vol.shutdown().await.expect("shutdown");
}

/// A log with no room for the next group: a runtime worker waits for space (and frees
/// kept records) itself, in `block_in_place`, as does a thread of its own, outright;
/// any other thread leaves that to the writer thread. Either way everything is answered
/// and read back. Runs with the log kept full of uploaded records (free target 0: the
/// uploads free nothing, only a writer that finds no room does), so records must be
/// freed to go on. With any other target, the freeing after uploads may keep ahead of
/// the writes, and whether a group ever finds the log full is up to timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_is_waited_for_by_a_worker_or_the_writer_thread() {
    for thread in [Thread::RuntimeWorker, Thread::Plain, Thread::Own] {
        let cfg = EngineConfig {
            log_size_bytes: 16 << 20,
            log_free_target_bytes: Some(0),
            ..config()
        };
        let (vol, _store, _dir) = open(cfg).await;
        let (tx, rx) = mpsc::channel();
        // 5 passes over 4 MiB through a 16 MiB log: the log fills and records give way.
        for version in 1..=5 {
            let (v, tx) = (vol.clone(), tx.clone());
            run_on(thread, move || {
                for b in 0..BLOCKS {
                    let tag = version << 32 | b;
                    v.start_write(b * BLOCK, stamp(b, version), false, answer_to(&tx, tag));
                    if b % 64 == 63 {
                        unplug(&v, thread);
                    }
                }
                unplug(&v, thread);
            })
            .await;
            for (tag, r) in collect(&rx, BLOCKS as usize) {
                r.unwrap_or_else(|e| panic!("{thread:?}: write {tag:x}: {e}"));
            }
        }
        // 20 MiB of records went through a 16 MiB log: had no space been found, the
        // answers above would not have come.
        assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize]);
        assert_handoffs(
            thread,
            &vol,
            "waited for by the unplugging thread",
            "waited for by the writer thread",
        );
        vol.shutdown().await.expect("shutdown");
    }
}

/// With several log writes in flight every group is the writer thread's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_writes_in_flight_the_thread_appends() {
    let cfg = EngineConfig {
        log_writes_in_flight: 4,
        ..config()
    };
    let (vol, _store, _dir) = open(cfg).await;
    let (tx, rx) = mpsc::channel();
    for b in 0..BLOCKS {
        vol.start_write(b * BLOCK, stamp(b, 7), b % 100 == 0, answer_to(&tx, b));
        if b % 16 == 15 {
            vol.unplug();
        }
    }
    vol.unplug();
    for (tag, r) in collect(&rx, BLOCKS as usize) {
        r.unwrap_or_else(|e| panic!("write {tag}: {e}"));
    }
    assert_eq!(versions(&vol).await, vec![7; BLOCKS as usize]);
    assert!(handoffs(&vol) > 0);
    vol.shutdown().await.expect("shutdown");
}

/// Operations started and never unplugged are appended by the shutdown; those started
/// after it are refused; none is left unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_appends_what_was_started_and_refuses_the_rest() {
    let (vol, store, dir) = open(config()).await;
    let (tx, rx) = mpsc::channel();
    for b in 0..8 {
        vol.start_write(b * BLOCK, stamp(b, 9), false, answer_to(&tx, b));
    }
    vol.shutdown().await.expect("shutdown");
    for (tag, r) in collect(&rx, 8) {
        r.unwrap_or_else(|e| panic!("write {tag} started before the shutdown: {e}"));
    }
    vol.start_write(0, stamp(0, 10), false, answer_to(&tx, 100));
    vol.start_flush(answer_to(&tx, 101));
    vol.unplug();
    for (tag, r) in collect(&rx, 2) {
        match r {
            Err(e) => assert!(
                matches!(e.kind, ErrorKind::ShuttingDown | ErrorKind::VolumeFailed),
                "operation {tag}: {e}"
            ),
            Ok(()) => panic!("operation {tag} after the shutdown succeeded"),
        }
    }
    drop(vol);
    let vol = open_volume(store, "v", dir.path(), config())
        .await
        .expect("reopen")
        .0;
    let v = versions(&vol).await;
    assert_eq!(&v[..8], &[9; 8], "the started writes are in the volume");
    vol.shutdown().await.expect("shutdown");
}
