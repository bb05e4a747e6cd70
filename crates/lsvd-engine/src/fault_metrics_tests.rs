//! The store going away under writes: the write log fills, writes wait (never fail),
//! and the episode is counted (`log_full_waits`, `log_full`) next to the failed
//! uploads (`store_put_retries`); when the store is back every write lands.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::EngineConfig;
use crate::test_support::{log_config, open_behind_faults, pause, poll_until, wait_until};
use lsvd_store::DynStore;
use lsvd_store::faulty::FaultyStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

/// 256 KiB batches closed after 20 ms, a log of `log_size_bytes`.
fn config(log_size_bytes: u64) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 20,
        log_size_bytes,
        ..EngineConfig::default()
    }
}

/// Asserts 256 KiB chunks `chunks` of `vol` hold what the tests write there: every
/// byte of chunk `i` is `i % 250 + 1`.
async fn assert_chunks(vol: &crate::Volume, chunks: std::ops::Range<u64>) {
    for i in chunks {
        let got = vol.read(i * (256 << 10), 256 << 10).await.expect("read");
        assert!(got.iter().all(|b| *b == (i % 250) as u8 + 1), "chunk {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_log_makes_writes_wait_and_is_counted() {
    let dir = TempDir::new("engine-log-full");
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem, 64 << 20, &dir, config(4 << 20)).await;
    faulty.set_outage(true);
    // 32 MiB into a 4 MiB log with the store away: the writer must stop and wait.
    let writer = {
        let vol = vol.clone();
        tokio::spawn(async move {
            for i in 0..128u64 {
                vol.write(i * (256 << 10), vec![(i % 250) as u8 + 1; 256 << 10], false)
                    .await
                    .expect("a write waits for space, it does not fail");
            }
        })
    };
    let stats = vol.stats();
    poll_until(Duration::from_secs(30), async || {
        stats.log_full.load(Ordering::Relaxed)
    })
    .await;
    assert!(
        stats.log_full.load(Ordering::Relaxed),
        "the log never filled: {:?}",
        vol.status()
    );
    assert_eq!(stats.log_full_waits.load(Ordering::Relaxed), 1);
    assert!(!writer.is_finished(), "writes went on with the log full");
    assert!(stats.store_put_retries.load(Ordering::Relaxed) > 0);

    faulty.set_outage(false);
    tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("writes resume once the store is back")
        .expect("writer task");
    assert!(!stats.log_full.load(Ordering::Relaxed));
    assert_chunks(&vol, 0..128).await;
    vol.shutdown().await.expect("shutdown");
}

/// A volume whose store fails ranged reads (object data) and that wants GC: every
/// 256 KiB of 8 MiB written, then the first half of each again, so a third of what
/// is stored is dead, spread over every first-round object. No read cache: every
/// read of uploaded data, GC's too, is a GET. On `clock` if given.
async fn gc_wanted_with_reads_failing(
    name: &str,
    clock: Option<Arc<lsvd_store::clock::ManualClock>>,
) -> (Arc<crate::Volume>, Arc<FaultyStore>, TempDir) {
    const MIB: u64 = 1 << 20;
    let dir = TempDir::new(name);
    let mut config = EngineConfig {
        read_cache_bytes: 0,
        gc_min_rate_bytes: 0,
        ..config(32 * MIB)
    };
    if let Some(clock) = clock {
        config.clock = lsvd_store::clock::SharedClock(clock);
    }
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem, 8 * MIB, &dir, config).await;
    faulty.set_range_reads_failing(true);
    for (round, len) in [(1u8, 256u64 << 10), (2, 128 << 10)] {
        for i in 0..8 * 4u64 {
            vol.write(
                i * (256 << 10),
                vec![round * 10 + (i % 7) as u8; len as usize],
                false,
            )
            .await
            .expect("write");
        }
        vol.flush().await.expect("flush");
    }
    (vol, faulty, dir)
}

/// The store away for object reads only: GC passes (which GET their victims' live data) are
/// given up and counted, a client read miss fails and is counted; once reads work again
/// GC completes and every block reads back. The soak test found the engine living
/// through an outage with no upload attempted (client batches held behind a GC pass
/// that could not read), which `store_put_retries` alone did not show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_gets_and_given_up_gc_passes_are_counted() {
    let (vol, faulty, _dir) = gc_wanted_with_reads_failing("engine-get-failures", None).await;
    let stats = vol.stats();
    wait_until("a GC pass given up", async || {
        stats.gc_passes_failed.load(Ordering::Relaxed) > 0
    })
    .await;
    assert!(stats.store_get_failures.load(Ordering::Relaxed) > 0);
    assert_eq!(
        vol.status().gc_passes,
        0,
        "a GC pass completed without reads"
    );
    // The second half of each chunk is first-round data, uploaded (its log space
    // freed) and in no cache: a read of it is a GET, and fails.
    let before = stats.store_get_failures.load(Ordering::Relaxed);
    vol.read(128 << 10, 4096)
        .await
        .expect_err("a read miss with the store away for reads");
    assert!(stats.store_get_failures.load(Ordering::Relaxed) > before);

    faulty.set_range_reads_failing(false);
    wait_until("a GC pass once reads work", async || {
        vol.status().gc_passes > 0
    })
    .await;
    for i in 0..8 * 4u64 {
        let got = vol.read(i * (256 << 10), 256 << 10).await.expect("read");
        let (new, old) = got.split_at(128 << 10);
        assert!(new.iter().all(|b| *b == 20 + (i % 7) as u8), "chunk {i}");
        assert!(old.iter().all(|b| *b == 10 + (i % 7) as u8), "chunk {i}");
    }
    vol.shutdown().await.expect("shutdown");
}

/// Data objects of volume "v" in the store.
fn data_objects(mem: &MemStore) -> usize {
    mem.snapshot()
        .iter()
        .filter(|(k, _)| k.starts_with("v/obj/") && k.ends_with(".d"))
        .count()
}

/// A store that refuses DELETE: dead objects stay (counted), one failed delete per
/// checkpoint rather than one per object, and once deletes work again the next
/// checkpoints delete them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_deletes_of_dead_objects_are_counted_and_retried() {
    let dir = TempDir::new("engine-delete-fail");
    let mem = MemStore::new();
    let config = EngineConfig {
        checkpoint_every_objects: 2,
        ..log_config(64 << 10, 20, 16 << 20)
    };
    let (vol, faulty) = open_behind_faults(Arc::new(mem.clone()), 8 << 20, &dir, config).await;
    let stats = vol.stats();
    // Each round overwrites the same 64 KiB: one object, and the one before is dead.
    let round = |fill: u8| {
        let vol = vol.clone();
        async move {
            vol.write(0, vec![fill; 64 << 10], false)
                .await
                .expect("write");
            vol.flush().await.expect("flush");
            wait_until("uploads", async || vol.status().uploads_pending == 0).await;
        }
    };
    faulty.set_deletes_failing(true);
    for fill in 1..=20u8 {
        round(fill).await;
    }
    let failed = stats.object_deletes_failed.load(Ordering::Relaxed);
    assert!(failed > 0, "no delete was tried");
    assert_eq!(stats.objects_deleted.load(Ordering::Relaxed), 0);
    assert!(
        data_objects(&mem) >= 20,
        "{} data objects",
        data_objects(&mem)
    );
    // One failed delete per checkpoint at most, not one per dead object.
    let checkpoints = stats.checkpoints_written.load(Ordering::Relaxed);
    assert!(
        failed <= checkpoints,
        "{failed} failed deletes for {checkpoints} checkpoints"
    );

    faulty.set_deletes_failing(false);
    for fill in 21..=26u8 {
        round(fill).await;
    }
    wait_until("the dead objects deleted", async || data_objects(&mem) <= 4).await;
    assert!(stats.objects_deleted.load(Ordering::Relaxed) >= 20);
    assert_eq!(
        vol.read(0, 64 << 10).await.expect("read"),
        vec![26; 64 << 10]
    );
    vol.shutdown().await.expect("shutdown");
}

/// GC passes given up in a row wait 1 s, 2 s, 4 s, then 8 s between them (plus up to
/// the GC loop's 1 s poll), as docs/SEMANTICS.md says: on a manual clock, the clock
/// time between consecutive failed passes follows that schedule, and a pass retried
/// every second (the behaviour before the backoff) would fail this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_up_gc_passes_back_off_from_one_to_eight_seconds() {
    use lsvd_store::clock::{Clock, ManualClock};
    let clock = ManualClock::new();
    let (vol, faulty, _dir) =
        gc_wanted_with_reads_failing("engine-gc-backoff", Some(clock.clone())).await;
    let stats = vol.stats();
    // Clock time of each failed pass, stepping 50 ms at a time with real time in
    // between for the tasks to act on it.
    let step = Duration::from_millis(50);
    let mut failures: Vec<Duration> = Vec::new();
    let mut seen = 0;
    for _ in 0..2400 {
        clock.advance(step);
        pause().await;
        let n = stats.gc_passes_failed.load(Ordering::Relaxed);
        if n > seen {
            assert_eq!(n, seen + 1, "two passes failed within one step");
            seen = n;
            failures.push(clock.now());
        }
        if failures.len() == 7 {
            break;
        }
    }
    assert_eq!(failures.len(), 7, "failed passes at {failures:?}");
    let gaps: Vec<f64> = failures
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    for (i, gap) in gaps.iter().enumerate() {
        let wait = f64::from(1u32 << i.min(3));
        assert!(
            // Each failure is seen within one 50 ms step of when it happened.
            *gap >= wait - 0.1 && *gap <= wait + 1.0 + 0.1,
            "gap {i} between failed passes is {gap:.2} s, expected {wait} s plus at most the 1 s poll: {gaps:?}"
        );
    }
    // Shutting down waits for the GC task, asleep on the manual clock: keep time
    // moving until it is done.
    faulty.set_range_reads_failing(false);
    let shutdown = tokio::spawn(async move { vol.shutdown().await });
    for _ in 0..6000 {
        if shutdown.is_finished() {
            break;
        }
        clock.advance(step);
        pause().await;
    }
    shutdown
        .await
        .expect("shutdown task")
        .expect("shutdown within 300 s of clock time");
}

/// A volume with a 4 MiB write log whose writes find the log full within a few
/// writes once `fault` is switched on for PUTs, with a 500 ms stall timeout.
async fn stalled_volume(
    name: &str,
    fault: Option<lsvd_store::faulty::Fault>,
) -> (Arc<crate::Volume>, Arc<FaultyStore>, TempDir) {
    let dir = TempDir::new(name);
    let config = EngineConfig {
        stall_timeout_ms: 500,
        ..config(4 << 20)
    };
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem, 64 << 20, &dir, config).await;
    match fault {
        Some(f) => faulty.faults().fail(lsvd_store::faulty::Ops::PUT, f),
        None => faulty.set_outage(true),
    }
    (vol, faulty, dir)
}

/// The errno an NBD client gets for `e`.
fn nbd_errno(e: &lsvd_core::error::Error) -> u32 {
    lsvd_nbd::proto::transmission::error_code(&std::io::Error::from(e.clone()))
}

/// Writes until one is refused; returns the chunks acknowledged and the refusal.
async fn write_until_refused(vol: &crate::Volume) -> (u64, lsvd_core::error::Error) {
    for i in 0..256u64 {
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            vol.write(i * (256 << 10), vec![(i % 250) as u8 + 1; 256 << 10], false),
        )
        .await
        .expect("a write stalled past the stall timeout without an answer");
        if let Err(e) = r {
            return (i, e);
        }
    }
    panic!("64 MiB went into a 4 MiB log with the store refusing every upload");
}

/// The store away while the write log fills: the write that finds no room waits the
/// stall timeout and fails with EIO, the next fails at once, a FLUSH still answers
/// (for what was acknowledged), and nothing acknowledged is lost: once the store is
/// back every acknowledged chunk reads back and writes are accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_log_full_past_the_stall_timeout_fails_writes_with_eio() {
    let log = lsvd_store::log::capture::Capture::start();
    let (vol, faulty, _dir) = stalled_volume("engine-log-stall", None).await;
    let stats = vol.stats();
    let started = std::time::Instant::now();
    let (acked, e) = write_until_refused(&vol).await;
    assert_eq!(e.kind, lsvd_core::error::ErrorKind::Transient, "{e}");
    assert_eq!(nbd_errno(&e), lsvd_nbd::proto::consts::EIO, "{e}");
    assert!(acked > 0, "no write was accepted before the log filled");
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(stats.log_stalled.load(Ordering::SeqCst));
    // The stall is said once, with what the log waits for (every stalling test's line
    // has this shape, whichever volume says it).
    let said = log.lines_with("further writes fail at once until the log has room");
    assert!(
        said.iter().any(|l| l.contains("uploads: next seq")),
        "the stall line names no uploads: {said:?}"
    );
    // The next write that does not fit fails at once, and is counted.
    let at_once = std::time::Instant::now();
    vol.write(acked * (256 << 10), vec![9; 256 << 10], false)
        .await
        .expect_err("a write while the log is stalled");
    assert!(
        at_once.elapsed() < Duration::from_millis(400),
        "waited {:?}",
        at_once.elapsed()
    );
    assert!(stats.log_full_failures.load(Ordering::Relaxed) >= 2);
    vol.flush()
        .await
        .expect("a FLUSH answers for what was acknowledged");

    faulty.set_outage(false);
    wait_until("the log has room", async || {
        !stats.log_stalled.load(Ordering::SeqCst)
    })
    .await;
    vol.write(0, vec![0xee; 4096], false)
        .await
        .expect("writes are accepted again once uploads free room");
    assert!(!stats.log_stalled.load(Ordering::SeqCst));
    assert_chunks(&vol, 1..acked).await;
    vol.shutdown().await.expect("shutdown");
}

/// A full store (ENOSPC, a quota) behind a full write log: writes fail with ENOSPC;
/// a store refusing the credentials: EIO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_answers_enospc_for_a_full_store_and_eio_for_a_denied_one() {
    use lsvd_nbd::proto::consts::{EIO, ENOSPC};
    use lsvd_store::faulty::{Fault, Ops};
    for (fault, kind, errno) in [
        (Fault::DiskFull, lsvd_core::error::ErrorKind::Full, ENOSPC),
        (
            Fault::QuotaExceeded,
            lsvd_core::error::ErrorKind::Full,
            ENOSPC,
        ),
        (Fault::Denied, lsvd_core::error::ErrorKind::Denied, EIO),
    ] {
        let (vol, faulty, _dir) = stalled_volume("engine-log-stall-kind", Some(fault)).await;
        let (acked, e) = write_until_refused(&vol).await;
        assert_eq!(e.kind, kind, "{fault:?}: {e}");
        assert_eq!(nbd_errno(&e), errno, "{fault:?}: {e}");
        faulty.faults().heal(Ops::PUT);
        vol.flush()
            .await
            .expect("flush once the store takes uploads");
        for i in 0..acked {
            let got = vol.read(i * (256 << 10), 256 << 10).await.expect("read");
            assert!(
                got.iter().all(|b| *b == (i % 250) as u8 + 1),
                "{fault:?}: chunk {i}"
            );
        }
        vol.shutdown().await.expect("shutdown");
    }
}

/// An upload refused once (a quota), then stored by the store but its reply lost (the
/// store died, or the connection was cut, after writing it): the retry finds the object
/// there, which is the store answering again. The soak test found the outage said
/// ("store unavailable") with no line saying it was over, because only a PUT that
/// succeeded said so; and the store-full gauge stayed up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_landed_with_its_reply_lost_ends_the_outage() {
    use lsvd_store::faulty::{Fault, Ops};
    let log = lsvd_store::log::capture::Capture::start();
    let dir = TempDir::new("engine-lost-reply");
    let mem: DynStore = Arc::new(MemStore::new());
    crate::create_volume(&mem, "lostreply", 8 << 20)
        .await
        .expect("create");
    let faulty = Arc::new(FaultyStore::new(
        mem.clone(),
        lsvd_store::faulty::FaultPlan::default(),
        1,
    ));
    let (vol, _) = crate::open_volume(faulty.clone(), "lostreply", dir.path(), config(32 << 20))
        .await
        .expect("open");
    faulty.faults().fail_next(Ops::PUT, Fault::QuotaExceeded, 1);
    faulty.faults().lose_next_replies(1);
    vol.write(0, vec![9; 256 << 10], false)
        .await
        .expect("write");
    vol.flush().await.expect("flush");
    let stats = vol.stats();
    poll_until(Duration::from_secs(30), async || {
        stats.objects_written.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert!(stats.objects_written.load(Ordering::Relaxed) >= 1);
    assert_eq!(faulty.stats().lost_replies, 1, "the reply was lost");
    assert_eq!(stats.store_put_retries.load(Ordering::Relaxed), 2);
    assert_eq!(
        log.lines_with("volume lostreply: the store refuses uploads")
            .len(),
        1,
        "{:?}",
        log.lines_with("lostreply")
    );
    assert_eq!(
        log.lines_with("store reachable again: lostreply/obj/")
            .len(),
        1,
        "the end of the outage is said: {:?}",
        log.lines_with("lostreply")
    );
    assert!(
        !stats.store_full.load(Ordering::SeqCst),
        "the store answered: it is not full any more"
    );
    let got = vol.read(0, 256 << 10).await.expect("read");
    assert!(got.iter().all(|b| *b == 9));
    vol.shutdown().await.expect("shutdown");
}

/// An upload waiting out its retry backoff tries again as soon as another upload
/// lands. Objects are applied in sequence order, so one whose PUT keeps failing holds
/// up every later one, and the write-log space they take: in the crash oracle's
/// `store_faults` (seed 0x50cc446c11b6df0d under CI load, 20% of PUTs failing plus
/// short outages) writes once waited 30 s on a full log behind one object that failed
/// 11 times in a row, asleep up to 5 s between tries, while the other upload slot
/// kept landing objects. On a manual clock that never moves a backoff never ends by
/// itself: only the landing can end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_upload_ends_the_retry_backoff_of_the_others() {
    let clock = lsvd_store::clock::ManualClock::new();
    let (vol, faulty, _dir) = first_upload_failing("engine-retry-on-landing", &clock, 2).await;
    let stats = vol.stats();
    // The first object backs off; the second, written once the store is back, lands:
    // the first tries again and both are applied, without the clock moving.
    faulty.set_outage(false);
    vol.write(256 << 10, vec![2; 256 << 10], false)
        .await
        .expect("write");
    let applied = poll_until(Duration::from_secs(10), async || {
        vol.status().uploads_pending == 0
    })
    .await;
    assert!(
        applied,
        "the failed upload still waits out its backoff after another landed: {}",
        vol.describe_pipeline()
    );
    assert_eq!(stats.objects_written.load(Ordering::Relaxed), 2);
    assert_chunks(&vol, 0..2).await;
    shutdown_on_manual_clock(vol, &clock).await;
}

/// The object next to be applied, alone on its way and failing with a transient
/// error, is tried again at least once a second (its backoff capped at 1 s, not 5 s):
/// nothing else lands to end its backoff early, and everything behind it waits for it.
/// On a manual clock that moves only in jumps of 1.1 s (the cap plus the most jitter
/// adds, 50 ms), with the test waiting in real time for each try before the next jump:
/// every jump brings exactly one more try. Backoffs go 50, 100, 200, 400, 800 ms, then
/// 1 s; uncapped, the sixth would be 1.6 s and no try would come after its jump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upload_everything_waits_for_retries_at_least_once_a_second() {
    let clock = lsvd_store::clock::ManualClock::new();
    let (vol, faulty, _dir) = first_upload_failing("engine-head-backoff", &clock, 4).await;
    let stats = vol.stats();
    let jump = Duration::from_millis(1100);
    for tried in 1..10u64 {
        assert_eq!(stats.store_put_retries.load(Ordering::Relaxed), tried);
        clock.advance(jump);
        let retried = poll_until(Duration::from_secs(20), async || {
            stats.store_put_retries.load(Ordering::Relaxed) > tried
        })
        .await;
        assert!(
            retried,
            "no new try within 1.1 s of clock time after failed try {tried}: its backoff is over 1 s; {}",
            vol.describe_pipeline()
        );
        // The failed try sleeps again from the clock's present (it does not move
        // until the next jump): no second try comes meanwhile.
        pause().await;
    }
    assert_eq!(stats.store_put_retries.load(Ordering::Relaxed), 10);
    faulty.set_outage(false);
    shutdown_on_manual_clock(vol, &clock).await;
}

/// Volume "v" on a manual `clock` behind a store that is away, with `uploads` in
/// flight, its first object (one full 256 KiB batch) written and its PUT failed once.
/// No checkpoint between objects and no GC bound: what the test writes is all there is
/// to upload.
async fn first_upload_failing(
    name: &str,
    clock: &Arc<lsvd_store::clock::ManualClock>,
    uploads: usize,
) -> (Arc<crate::Volume>, Arc<FaultyStore>, TempDir) {
    let dir = TempDir::new(name);
    let config = EngineConfig {
        clock: lsvd_store::clock::SharedClock(clock.clone()),
        uploads_in_flight: uploads,
        checkpoint_every_objects: 100,
        gc: crate::test_support::no_gc(),
        ..config(16 << 20)
    };
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem, 64 << 20, &dir, config).await;
    faulty.set_outage(true);
    vol.write(0, vec![1; 256 << 10], false)
        .await
        .expect("write");
    let stats = vol.stats();
    wait_until("the first upload failed", async || {
        stats.store_put_retries.load(Ordering::Relaxed) > 0
    })
    .await;
    (vol, faulty, dir)
}

/// Shuts `vol` down, moving the manual `clock` on meanwhile: shutting down waits for
/// tasks asleep on it.
async fn shutdown_on_manual_clock(vol: Arc<crate::Volume>, clock: &lsvd_store::clock::ManualClock) {
    let shutdown = tokio::spawn(async move { vol.shutdown().await });
    for _ in 0..6000 {
        if shutdown.is_finished() {
            break;
        }
        clock.advance(Duration::from_millis(50));
        pause().await;
    }
    shutdown
        .await
        .expect("shutdown task")
        .expect("shutdown within 300 s of clock time");
}
