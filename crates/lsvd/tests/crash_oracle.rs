//! The crash oracle: drive a workload, crash the disk in many ways at random moments,
//! recover, read every block back and check the recovered disk against the client-side
//! history and the guarantees of the design brief.
//!
//! # The workload
//!
//! 4 to 32 concurrent tasks issue writes (1 to 64 blocks of 4 KiB, some with FUA),
//! TRIMs, WRITE_ZEROES, FLUSHes and verifying reads, mostly in a hot region so blocks are
//! overwritten many times. No two operations touching the same block are ever in flight
//! together, so the operations on one block are totally ordered. Every block a write
//! carries is stamped with (block number, write id, a 64-bit check), so a block read
//! back is exactly one of: zeros, one identified write, or garbage (`oracle::stamp`;
//! every block also ends in its own CRC32C, the case that defeated the version-1
//! record checksum, see `engine_bug_record_crc_blind_to_self_checksummed_blocks`).
//!
//! The history records, on one logical clock, each operation's issue time (just
//! before it is sent) and completion time (just after the answer), and the same for
//! FLUSHes. `ack(X) < issue(W)` means X was acknowledged before W was sent.
//!
//! # The checks (`oracle::checker`)
//!
//! After recovery every block is read. Per block, what it shows is a position in that
//! block's list of operations: the contents at the start of the round (the base, read
//! back after the previous recovery), a write (the one whose id it carries), or, for
//! zeros, the base if it was zero or any TRIM / WRITE_ZEROES of that block.
//!
//! 1. *Identity*: no block shows garbage (a torn or corrupt block, a bad checksum, a
//!    stamp of another block), nor a write that never targeted that block.
//! 2. *Durability floor* `F`: every operation acknowledged before `F` must be present or
//!    superseded (the block shows it or a later operation on that block; for zeros,
//!    some zeroing operation at or after it, or the zero base at no requirement).
//!    - cache intact (rule `CacheIntact`): `F` is the issue time of the latest
//!      completed FLUSH or FUA write, and every completed FUA write itself is
//!      required: "every write acknowledged before a completed FLUSH is present";
//!    - cache lost (`CacheLost`): `F` is the latest *store point*: a moment at which the
//!      workload was paused after a FLUSH and the store was seen to hold every record
//!      written so far (in process: `status()` shows an empty write log and no pending
//!      upload; for `lsvd serve`: the write log's superblock tail has no record behind
//!      it). Everything acknowledged before it must survive the loss of the cache;
//!    - prefix only (`PrefixOnly`, after objects were deliberately deleted): `F = 0`.
//! 3. *Prefix*: if any block shows operation W (write or zeroing), every operation
//!    acknowledged before W was issued must be present or superseded. This is applied
//!    to a fixpoint with the floor: the cut `T` is the maximum of `F` and the issue
//!    times of every shown operation (for a zero block, the earliest zeroing operation
//!    that satisfies the requirement), and every block must be at or after its newest
//!    operation acknowledged before `T`. A state failing this is not a prefix of any
//!    order consistent with what the client saw ("never a mix").
//! 4. *Liveness*: no operation fails before the crash (during store outages writes
//!    must stall, not fail), no operation hangs for 60 s, and reads during the workload
//!    return the latest acknowledged contents.
//! 5. Per kind, extra checks: strict mode must refuse to start exactly when records
//!    the write log had already released are missing from the store (then accept-prefix
//!    must give a prefix); a crash during recovery followed by another recovery must
//!    find the same disk the first recovery served, when it was read; at the end of an
//!    episode a clean shutdown and reopen must give back exactly the same disk.
//!
//! 6. *Snapshots* (in-process kinds except store faults): a third of the rounds start
//!    with a snapshot of the idle volume; at the end of the episode each must read
//!    back exactly the base of the round it was taken in, after every later crash,
//!    recovery and GC pass; then each is deleted and the volume must be unchanged.
//!
//! The recovered state becomes the base of the next round (the volume lives on
//! through several crashes: log wrap-around, many checkpoints, stranded objects).
//! Rounds judged by the cache-lost rule first wait until the store holds the base.
//!
//! # Garbage collection under crashes
//!
//! The engine configurations make GC eager (start thresholds up to 0.9, small passes,
//! small volumes overwritten in a hot region), so GC relocation races client
//! overwrites of the blocks it is moving. In a third of the in-process rounds the crash
//! is armed to fire just after the first to third GC pass of the round starts (during
//! its reads, its GC object uploads, or before its checkpoint is durable) instead of at
//! an acknowledgement. Each test's summary line counts GC passes, rounds with a pass,
//! crashes with a pass in flight and GC copies superseded by client writes (for
//! `lsvd serve`: passes recorded in the store's checkpoints); a test fails if no GC
//! pass ran in any of its rounds.
//!
//! # Crash kinds (one test each)
//!
//! - `process_sigkill` (i): `lsvd serve` over NBD (1-3 connections, requests
//!   pipelined), SIGKILL at a random acknowledgement, restart; cache intact.
//! - `power_loss` (ii): in process on a `FaultyCache`; power fails at a random
//!   acknowledgement or at a random device I/O: unsynced writes are lost except a random
//!   subset, the last (sometimes every) unsynced write torn at 512-byte granularity.
//! - `store_faults` (iii): failed PUTs, PUTs that land but report failure, delays
//!   (out-of-order completion), short outages and sometimes a long one that fills the
//!   write log; process crash or power loss; sometimes the newest objects are then
//!   deleted (uploads that never landed). Judged with the cache intact and, on a copy of
//!   the store, with the cache lost too.
//! - `cache_lost` and `process_cache_deleted` (iv): the cache device is replaced by an
//!   empty one / the write-log file is deleted before restart.
//! - `recovery_crash` (v): after a crash, the first recovery is itself crashed (at a
//!   chosen device I/O, store mutation, or moment while replayed records upload); the
//!   second recovery is judged by the same rule.
//! - `takeover_sigkill`: two `lsvd serve` on one store, each with its own data directory
//!   (two hosts, `--lease-timeout 2s`); the holder SIGKILLed, the `--standby` takes over
//!   when the lease lapses; cache lost (the store points: barriers and `lsvd sync` of the
//!   holder at random moments); the old host stands by next, so takeovers chain.
//! - `takeover_sigstop`: as above, the holder paused (SIGSTOP) with requests in flight and
//!   resumed (SIGCONT) after the takeover: requests sent after the resume fail, it exits
//!   fenced, the new holder's disk is judged after that and again after its own restart.
//! - `two_servers_race`: both hosts started at once (plain, or one a standby): exactly one
//!   serves, a plain loser refuses in one line naming the winner; the winner SIGKILLed, the
//!   loser recovers; cache lost (`oracle::takeover` has the details of all three).
//!
//! The takeover kinds found three engine bugs, each with its regression test below
//! (`engine_bug_*`: a holder resumed late was not fenced; answers decided before a
//! pause were sent after the takeover; a hole a claim left in the history was required
//! two claims later); they run every case that showed them.
//!
//! # Against S3
//!
//! Under `LSVD_TEST_STORE=s3` (see `common/mod.rs`) the process kinds keep their
//! volume in the test bucket instead of a local directory, so SIGKILL, recovery and
//! rebuild from the store run against a real S3 server:
//! `scripts/with-versitygw.sh env LSVD_TEST_STORE=s3 LSVD_ORACLE_POINTS=5 cargo test -p
//! lsvd --test crash_oracle process_`. The in-process kinds always use an in-memory
//! (sometimes a local directory) store behind the fault-injecting `FaultyStore`,
//! whatever the variable says.
//!
//! # Encrypted and compressed volumes
//!
//! `LSVD_ORACLE_ENCRYPT=1` creates the process kinds' volume with `--encrypt` (every
//! command gets a key file through `LSVD_KEY_FILE`), and `LSVD_ORACLE_COMPRESSION=C`
//! with `--compression C`: sealing and compression sit where objects enter the store,
//! and these runs show that recovery, GC and takeover keep the prefix rule across
//! them. scripts/test.sh runs the process and takeover kinds once both ways (short).
//!
//! # Seeds and replay
//!
//! Every choice comes from a seed. A failure prints the crash kind, the episode seed,
//! the crash point and the command replaying it, e.g.
//! `LSVD_ORACLE_SEED=0x1234 LSVD_ORACLE_POINTS=3 cargo test -p lsvd --test crash_oracle power_loss -- --nocapture`
//! (timing is real, so a replay follows the same choices but not always the same
//! interleaving; rerun a few times). `LSVD_ORACLE_POINTS=N` sets the crash points per
//! test; `LSVD_SOAK=1` runs 25 times the default with clock-derived seeds.
//! `LSVD_ORACLE_TOLERATE_READ_ERRORS=1` retries failed reads (counting them) instead of
//! reporting them, to look past a read failure while hunting something else (it was
//! used past the read/GC-deletion race, `engine_bug_read_racing_gc_deletion_fails`).
//!
//! Defaults: 290 crash points (power_loss 100, recovery_crash 50, process_sigkill 40,
//! cache_lost 30, process_cache_deleted 20, store_faults 20, two_servers_race 12,
//! takeover_sigkill 10, takeover_sigstop 8, each store_faults point judged twice), 3 to 4
//! minutes for the whole file in a debug build on 2 cores before the two-host kinds,
//! which take 35 to 55 s each more (mostly waiting: every takeover after a crash waits
//! out a 2 s lease).
//!
//! A failure message also carries forensics for the first blocks named: every record in
//! the crash image (live or stale) and every store object that maps the block, whose
//! stamp sits there, and the device writes that touched it.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;
mod oracle;

use oracle::inproc::{self, Kind};
use oracle::proc_kinds::{self, ProcKind};
use oracle::takeover::{self, TakeoverKind};
use oracle::{Plan, run_plan};

/// Crash points per episode (one volume lives through them).
const ROUNDS: u32 = 5;

/// One `#[test]` per crash kind: `name`, its default seed, crash points and rounds
/// (see [`Plan::new`]), what it crashes, and the episode it runs.
macro_rules! crash_kind_test {
    ($name:ident, $seed:expr, $points:expr, $rounds:expr, $what:expr, $episode:expr) => {
        #[test]
        fn $name() {
            let plan = Plan::new(stringify!($name), $seed, $points, $rounds);
            run_plan(plan, $what, $episode);
        }
    };
}

crash_kind_test!(
    power_loss,
    0x5eed_0002,
    100,
    ROUNDS,
    "power loss, cache intact",
    |seed, rounds, stats| { inproc::episode(Kind::PowerLoss, seed, rounds, stats) }
);
crash_kind_test!(
    store_faults,
    0x5eed_0003,
    20,
    ROUNDS,
    "store faults + crash, cache intact and cache lost",
    |seed, rounds, stats| { inproc::episode(Kind::StoreFaults, seed, rounds, stats) }
);
crash_kind_test!(
    cache_lost,
    0x5eed_0004,
    30,
    ROUNDS,
    "cache device lost (in process)",
    |seed, rounds, stats| { inproc::episode(Kind::CacheLost, seed, rounds, stats) }
);
crash_kind_test!(
    recovery_crash,
    0x5eed_0005,
    50,
    ROUNDS,
    "crash during recovery, then recovery again",
    |seed, rounds, stats| { inproc::episode(Kind::RecoveryCrash, seed, rounds, stats) }
);
crash_kind_test!(
    process_sigkill,
    0x5eed_0001,
    40,
    ROUNDS,
    "SIGKILL of lsvd serve, cache intact",
    |seed, rounds, stats| { proc_kinds::episode(ProcKind::Kill, seed, rounds, stats) }
);
crash_kind_test!(
    process_cache_deleted,
    0x5eed_0006,
    20,
    ROUNDS,
    "SIGKILL of lsvd serve, write log deleted",
    |seed, rounds, stats| { proc_kinds::episode(ProcKind::CacheDeleted, seed, rounds, stats) }
);
crash_kind_test!(
    takeover_sigkill,
    0x5eed_0007,
    10,
    ROUNDS,
    "SIGKILL of the holder, a standby takes over, cache lost",
    |seed, rounds, stats| { takeover::episode(TakeoverKind::Kill, seed, rounds, stats) }
);
crash_kind_test!(
    takeover_sigstop,
    0x5eed_0008,
    8,
    4,
    "SIGSTOP of the holder, a standby takes over, SIGCONT: fenced; cache lost",
    |seed, rounds, stats| { takeover::episode(TakeoverKind::Stop, seed, rounds, stats) }
);
crash_kind_test!(
    two_servers_race,
    0x5eed_0009,
    12,
    4,
    "two servers started at once (one may be a standby), winner SIGKILLed, cache lost",
    takeover::race_episode
);

/// The regression tests below run on a two-thread runtime.
fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test)
}

/// Two hosts on one new 16M volume in `tmp`, with a 1 s lease: `a` created (not
/// started), `b` attached to the same store.
fn two_hosts_with_short_lease(
    tmp: &oracle::TempDir,
) -> (oracle::process::Server, oracle::process::Server) {
    use oracle::process::{Server, ServerArgs};
    let store = tmp.path().join("store");
    let args = ServerArgs {
        batch_size: "1M".into(),
        batch_timeout_ms: 100,
        uploads: 1,
        read_cache_size: "0".into(),
        gc_start: 0.0,
        gc_policy: "greedy".into(),
        log_free_target: "all".into(),
        gc_headroom: "auto".into(),
        gc_defrag_hole: "0".into(),
    };
    let lease = vec!["--lease-timeout".to_string(), "1s".to_string()];
    let mut a = Server::create(&tmp.path().join("a"), &store, "16M", args.clone())
        .expect("create the volume");
    a.extra = lease.clone();
    let mut b = Server::attach(&tmp.path().join("b"), &store, args, "b");
    b.extra = lease;
    (a, b)
}

/// Starts `b` as a standby and waits (up to 30 s) until it says it stands by.
async fn start_standby(b: &mut oracle::process::Server) {
    b.spawn_with(&["--standby"]).expect("start the standby");
    let standing_by = || b.log().contains("standing by");
    common::wait_until_async(std::time::Duration::from_secs(30), standing_by).await;
}

/// The engine settings of the regression tests: batches of `batch_size_bytes` sealed
/// after `batch_timeout_ms`, a 16 MiB write log, the rest default.
fn small_batches(batch_size_bytes: u64, batch_timeout_ms: u64) -> lsvd_engine::EngineConfig {
    lsvd_engine::EngineConfig {
        batch_size_bytes,
        batch_timeout_ms,
        log_size_bytes: 16 << 20,
        ..lsvd_engine::EngineConfig::default()
    }
}

/// A new volume `v` of `size` bytes on an in-memory store behind a [`FaultyStore`]
/// (returned, to inject faults), opened with `config` on a new faulty cache.
async fn open_on_faulty_store(
    size: u64,
    config: lsvd_engine::EngineConfig,
) -> (
    std::sync::Arc<lsvd_store::faulty::FaultyStore>,
    std::sync::Arc<lsvd_engine::Volume>,
) {
    use std::sync::Arc;

    use lsvd_engine::cache_dev::CacheDevice;
    use lsvd_engine::cache_dev::faulty::FaultyCache;
    use lsvd_store::DynStore;
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    use lsvd_store::mem::MemStore;

    let base: DynStore = Arc::new(MemStore::new());
    lsvd_engine::create_volume(&base, "v", size)
        .await
        .expect("create");
    let store = Arc::new(FaultyStore::new(base, FaultPlan::default(), 1));
    let s: DynStore = store.clone();
    let c: Arc<dyn CacheDevice> = FaultyCache::new(16 << 20);
    let (vol, _) = lsvd_engine::open_volume_on(s, "v", c, "faulty", config)
        .await
        .expect("open");
    (store, vol)
}

/// Engine bug found by `takeover_sigstop` (episode seed 0x232de0e9569247fe, crash point
/// 3 with `LSVD_ORACLE_POINTS=8`: "WRITE on connection 0 on the resumed holder
/// succeeded", "the resumed holder (host a) still runs 60s after it was resumed"),
/// reduced: a holder paused (SIGSTOP) until the standby has taken the volume over and
/// renewed its lease four times, then resumed (SIGCONT), is not fenced. Every
/// superblock write deletes the generation four below it (`delete_old`,
/// `engine/volume_super.rs`), so by then the generation right after the paused
/// holder's last one is gone; the resumed holder's renewal (`renew_once`,
/// `engine/lease.rs`: generation last + 1, put-if-absent) lands in that gap, counts as
/// a renewal, and the holder acknowledges writes again, uploads objects and
/// checkpoints under its old epoch and renews on, one step behind the new holder whose
/// old generations it deletes in turn: two servers hold the volume. Its check before
/// each upload (`volume_super::superseded`: only generation current + 1) misses the
/// newer generations too. Fixed: kept as a regression test.
#[test]
fn engine_bug_a_holder_resumed_after_four_renewals_of_the_new_one_is_not_fenced() {
    use std::time::Duration;

    use oracle::TempDir;
    use oracle::stamp::{BLOCK, write_data};

    block_on(async {
        let tmp = TempDir::new("bug-fence");
        let (mut a, mut b) = two_hosts_with_short_lease(&tmp);
        let conns = a.start(1).await.expect("host a serves");
        conns[0]
            .write(0, &write_data(0, 1, 1), true)
            .await
            .expect("a write before the pause");
        start_standby(&mut b).await;
        assert!(a.signal(libc::SIGSTOP), "pause host a");
        let b_conns = b
            .connect_within(1, Duration::from_secs(30))
            .await
            .expect("the standby takes over");
        // The new holder renews every third of its lease: four renewals in 1.33 s.
        common::let_time_pass_async(Duration::from_secs(3)).await;
        assert!(a.signal(libc::SIGCONT), "resume host a");
        let late = tokio::time::timeout(
            Duration::from_secs(20),
            conns[0].write(BLOCK as u64, &write_data(1, 1, 2), true),
        )
        .await;
        let exited = a.wait_exit(Duration::from_secs(10)).await;
        b_conns[0].disconnect().await;
        assert!(
            !matches!(late, Ok(Ok(()))),
            "the paused holder, resumed 3 s after the takeover, acknowledged a FUA write; it runs on ({exited:?}):\n{}",
            a.stderr_tail()
        );
    });
}

/// Engine bug found by `takeover_sigstop` under `LSVD_ORACLE_KNOWN_BUGS=1` (23
/// requests in 8 pauses of its default run; e.g. episode seed 0x232de0e9569247fe,
/// crash point 2: "the fenced holder answered with success: WRITE #721 blocks 10..11
/// succeeded (answered t=1042, resumed t=1040)"), reduced: a holder paused while it
/// answers a group of requests, resumed after a standby took the volume over, sends
/// the rest of that group's successes. The lease is checked once per group before
/// the answers are handed to the connection threads (`engine/log_order.rs`, the
/// `lease_wait_blocking` before `done.send`; reads: `Volume::read` and
/// `Volume::read_local`, `engine/volume.rs`), so a pause between that check and the
/// socket write lets answers decided under the old lease out after the takeover. (The
/// data is not at stake: writes the old holder acknowledged and had not uploaded are
/// lost at a takeover either way; but its clients see successes from a server that no
/// longer holds the volume.) 32 clients keep the server answering; the 300th answer
/// pauses it, as an acknowledgement triggers the oracle's crash, so the pause often
/// lands while it sends a group; up to 20 attempts (in 7 runs here the first late
/// answer came at attempt 2, 3, 4, 6, 7 and 12, and once not within 5). Fixed: the
/// NBD server asks the device right before each batch of answers goes to the socket
/// (`BlockDevice::answerable`, lsvd's lease), and sends them as errors once it may
/// not answer; kept as a regression test.
#[test]
fn engine_bug_answers_decided_before_a_pause_are_sent_after_the_takeover() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use oracle::TempDir;
    use oracle::stamp::{BLOCK, write_data};

    block_on(async {
        let mut late_total = Vec::new();
        // Before the fix, 2 to 12 attempts showed it; as a regression test, 8 (20 with
        // LSVD_ORACLE_POINTS set, as for the long runs).
        let attempts = if std::env::var("LSVD_ORACLE_POINTS").is_ok() {
            20
        } else {
            8
        };
        for attempt in 0..attempts {
            let tmp = TempDir::new("bug-late-answers");
            let (mut a, mut b) = two_hosts_with_short_lease(&tmp);
            let conns = a.start(2).await.expect("host a serves");
            start_standby(&mut b).await;
            // 32 clients write (and now and then FLUSH) as fast as they are
            // answered; the 300th answer pauses A, and they send nothing more.
            let pause = Arc::new(a.signaller(libc::SIGSTOP));
            let paused = Arc::new(AtomicBool::new(false));
            let answers = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let mut tasks = Vec::new();
            for w in 0..32u64 {
                let c = conns[w as usize % 2].clone();
                let (pause, paused, answers) = (pause.clone(), paused.clone(), answers.clone());
                tasks.push(tokio::spawn(async move {
                    let mut out = Vec::new();
                    let mut i = 0u64;
                    while !paused.load(Ordering::SeqCst) {
                        i += 1;
                        let block = w * 64 + (i % 16) * 4;
                        let r = if i.is_multiple_of(7) {
                            c.flush().await
                        } else {
                            c.write(
                                block * BLOCK as u64,
                                &write_data(block, 4, w << 32 | i),
                                false,
                            )
                            .await
                        };
                        out.push((r.is_ok(), Instant::now()));
                        if answers.fetch_add(1, Ordering::SeqCst) + 1 == 300
                            && !paused.swap(true, Ordering::SeqCst)
                        {
                            pause();
                        }
                    }
                    out
                }));
            }
            let every = Duration::from_millis(1);
            common::wait_every_async(every, common::NO_LIMIT, || paused.load(Ordering::SeqCst))
                .await;
            let b_conns = b
                .connect_within(1, Duration::from_secs(30))
                .await
                .expect("the standby takes over");
            common::let_ms_pass(200).await;
            let resumed = Instant::now();
            assert!(a.signal(libc::SIGCONT), "resume host a");
            let mut late = 0;
            for t in tasks {
                let out = tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .expect("every request is answered or fails once A exits")
                    .expect("join");
                late += out.iter().filter(|(ok, at)| *ok && *at > resumed).count();
            }
            b_conns[0].disconnect().await;
            late_total.push(late);
            if late > 0 {
                break;
            }
            eprintln!("attempt {attempt}: no late answer");
        }
        assert!(
            late_total.iter().all(|&n| n == 0),
            "requests answered with success after the paused holder was resumed (the standby had taken over), per attempt: {late_total:?}"
        );
    });
}

/// Engine bug found by `takeover_sigstop` (episode seed 0xf5e17413e8054a5c, crash point
/// 4: "the standby did not take over: ... object 0000000000000202 is missing from the
/// store, but a later claim of the volume recovered past it: the store lost data it
/// had acknowledged"), reduced in process, without a second server: a claim that finds
/// an object past a gap (an upload that landed while an earlier one did not) numbers
/// its own objects after it, leaving a hole in the history that recovery jumps over
/// (`History::claim` records where the claim's segment starts). If that session
/// writes nothing before the next claim, the next claim recovers through the hole
/// (its `after_seq` is the last number of the hole) and drops the segment that
/// described the hole (`History::claim` keeps only segments starting at or before
/// `after_seq`, `lsvd-core/src/history.rs`): the hole's numbers now belong to the old
/// epoch and are vouched for, so the open after that refuses to start, naming an
/// object that never existed in the history. Fixed: kept as a regression test.
#[test]
fn engine_bug_a_hole_in_the_history_is_vouched_for_two_claims_later() {
    use std::sync::Arc;
    use std::time::Duration;

    use lsvd_core::format::object::ObjectKind;
    use lsvd_engine::cache_dev::CacheDevice;
    use lsvd_engine::cache_dev::faulty::FaultyCache;
    use lsvd_engine::keys::{object_key, parse_object_name};
    use lsvd_store::mem::MemStore;
    use lsvd_store::{DynStore, PutMode};

    block_on(async {
        let store: DynStore = Arc::new(MemStore::new());
        lsvd_engine::create_volume(&store, "v", 16 << 20)
            .await
            .expect("create");
        let config = small_batches(64 << 10, 5);
        // A new cache device for every open: each recovers from the store alone.
        let open = |n: u32| {
            let (store, config) = (store.clone(), config.clone());
            async move {
                let c: Arc<dyn CacheDevice> = FaultyCache::new(16 << 20);
                lsvd_engine::open_volume_on(store, "v", c, &format!("cache{n}"), config).await
            }
        };
        let (vol, first) = open(1).await.expect("first open");
        vol.write(0, vec![1u8; 4096], true).await.expect("write");
        inproc::wait_drained(&vol, Duration::from_secs(5)).await;
        vol.crash();
        // An upload past a gap that landed: the next object but one, of the first
        // session's epoch (the bytes do not matter, it is never read).
        let listed = store.list("v/obj/").await.expect("list");
        let last = listed
            .iter()
            .filter_map(|e| parse_object_name(&e.key))
            .map(|n| n.seq)
            .max()
            .expect("an object");
        let stray = object_key("v", last + 2, first.epoch, ObjectKind::Data);
        store
            .put(
                &stray,
                bytes::Bytes::from_static(b"stray"),
                PutMode::IfAbsent,
            )
            .await
            .expect("put the stray object");
        // Claim 2 jumps over the hole (and deletes the stray object); it writes
        // nothing. Claim 3 recovers through the hole.
        let (vol, _) = open(2).await.expect("second open: skips the hole");
        vol.crash();
        let (vol, _) = open(3).await.expect("third open");
        vol.crash();
        let fourth = open(4).await;
        assert!(
            fourth.is_ok(),
            "the fourth open refuses a volume nothing was lost from: {}",
            fourth.err().map(|e| e.to_string()).unwrap_or_default()
        );
        let (vol, _) = fourth.expect("checked");
        assert_eq!(vol.read(0, 4096).await.expect("read"), vec![1u8; 4096]);
        vol.shutdown().await.expect("shutdown");
    });
}

/// Engine bug found by `recovery_crash` (episode seed 0xef3c70c190889735, crash point
/// 2: "recovery 1: store client dies at mutation 1 ... recovery 2: recovery failed:
/// write log faulty-cache holds 224 records ... that a superseded session of volume
/// 'v' acknowledged but never uploaded; session 2a7b42c37a6281e3 has claimed the
/// volume since"; failing since the lease commit 1a431de), reduced: a recovery that
/// stops at its claim (the store away, or the process killed, before the claim's PUT
/// lands) has already rewritten the write log's superblock with its own session and
/// epoch (`open_inner`, `engine/open.rs`: the cache superblock is written before
/// `claim`), so the next open no longer sees that this log wrote the volume last (the
/// newest volume superblock names the log's previous session) and refuses the log's
/// own acknowledged, never uploaded records as a superseded session's; the way out it
/// names, `--discard-superseded-log`, would drop them: acknowledged, flushed writes
/// lost after a crash with the cache intact. Fixed: kept as a regression test.
#[test]
fn engine_bug_a_recovery_stopped_at_its_claim_leaves_its_own_write_log_refused() {
    use std::sync::Arc;

    use lsvd_engine::EngineConfig;
    use lsvd_engine::cache_dev::CacheDevice;
    use lsvd_engine::cache_dev::faulty::FaultyCache;
    use lsvd_store::DynStore;
    use lsvd_store::clock::{Clock, SharedClock, SleepFuture, SystemClock};
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    use lsvd_store::mem::MemStore;

    /// The system clock, with every sleep cut to a millisecond.
    #[derive(Debug)]
    struct HastyClock(SystemClock);
    impl Clock for HastyClock {
        fn now(&self) -> std::time::Duration {
            self.0.now()
        }
        fn sleep(&self, d: std::time::Duration) -> SleepFuture {
            self.0.sleep(d.min(std::time::Duration::from_millis(1)))
        }
    }

    block_on(async {
        let base: DynStore = Arc::new(MemStore::new());
        lsvd_engine::create_volume(&base, "v", 16 << 20)
            .await
            .expect("create");
        let config = EngineConfig {
            log_size_bytes: 16 << 20,
            ..EngineConfig::default()
        };
        // A write acknowledged with FUA while the store is away: in the log only.
        let store = Arc::new(FaultyStore::new(base.clone(), FaultPlan::default(), 1));
        let cache = FaultyCache::new(16 << 20);
        let (s, c): (DynStore, Arc<dyn CacheDevice>) = (store.clone(), cache.clone());
        let (vol, _) = lsvd_engine::open_volume_on(s, "v", c, "log", config.clone())
            .await
            .expect("open");
        store.set_outage(true);
        vol.write(0, vec![7u8; 4096], true)
            .await
            .expect("FUA write");
        store.kill();
        let image = cache.process_crash();
        vol.crash();
        // Recovery 1: the process dies at its first store mutation, the claim (which
        // it retries: on a clock whose sleeps are short, not for 30 s).
        let store = Arc::new(FaultyStore::new(base.clone(), FaultPlan::default(), 2));
        store.kill_after_mutations(1);
        let cache = FaultyCache::from_image(image);
        let (s, c): (DynStore, Arc<dyn CacheDevice>) = (store.clone(), cache.clone());
        let hasty = EngineConfig {
            clock: SharedClock(Arc::new(HastyClock(SystemClock::new()))),
            ..config.clone()
        };
        // Without a lease the open may go on claiming in the background: the process
        // dies there all the same.
        if let Ok((vol, _)) = lsvd_engine::open_volume_on(s, "v", c, "log", hasty).await {
            vol.crash();
        }
        let image = cache.process_crash();
        // Recovery 2, the store healthy: the FUA write must be there.
        let c: Arc<dyn CacheDevice> = FaultyCache::from_image(image);
        let second = lsvd_engine::open_volume_on(base.clone(), "v", c, "log", config).await;
        let (vol, _) = match second {
            Ok(v) => v,
            Err(e) => panic!("recovery 2 refuses the write log of the last writer: {e}"),
        };
        assert_eq!(vol.read(0, 4096).await.expect("read"), vec![7u8; 4096]);
        vol.shutdown().await.expect("shutdown");
    });
}

/// Regression (found by `store_faults`, episode seed 0xbfddb26790c691a5, crash point
/// 3: "WRITE did not complete within 60s (crashed: true)"): a volume that fails (a
/// crash, a local I/O error) while writes wait for log space must fail those writes,
/// not leave them waiting forever for uploads that have stopped.
#[test]
fn regression_writes_waiting_for_log_space_fail_after_a_crash() {
    use std::time::Duration;

    use lsvd_engine::EngineConfig;

    block_on(async {
        let config = EngineConfig {
            checkpoint_every_objects: 3,
            ..small_batches(256 << 10, 20)
        };
        let (store, vol) = open_on_faulty_store(64 << 20, config).await;
        // The store goes away once the volume is open (an open claims the volume in
        // the store, so it needs the store).
        store.set_outage(true);
        // Fill the log while the store is down: writes stall once it is full.
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let v = vol.clone();
            tasks.push(tokio::spawn(async move {
                v.write(i * (512 << 10), vec![7u8; 512 << 10], false).await
            }));
        }
        // Nothing finishes while the log is full: 1.5 s for writes to land if they could.
        common::let_time_pass_async(Duration::from_millis(1500)).await;
        let done = tasks.iter().filter(|t| t.is_finished()).count();
        assert!(done < tasks.len(), "writes should be stalled on a full log");
        vol.crash();
        for t in tasks {
            let r = tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("a write waiting for log space hangs after the volume failed")
                .expect("join");
            let _ = r; // Ok (landed before the crash) or an error: either, but answered.
        }
    });
}

/// Engine bug found by `power_loss` (episode seed 0x10241913fbd99eb3, crash point 4:
/// "reading the recovered disk failed: reading v/obj/0000000000000042.d: object ... not
/// found"), reproduced here without a crash: a client read planned against an object
/// fails if GC relocates that object's live data and deletes it before the read's GET
/// reaches the store. The read path retries only races with log reclamation
/// (`engine/read.rs`), not with object deletion. Regression test: reads now plan again
/// when their object was deleted under them.
#[test]
fn engine_bug_read_racing_gc_deletion_fails() {
    use std::time::Duration;

    use lsvd_core::gc::GcConfig;
    use lsvd_engine::EngineConfig;

    block_on(async {
        let config = EngineConfig {
            checkpoint_every_objects: 3,
            gc: GcConfig {
                start_utilization: 0.9,
                stop_utilization: 0.95,
                ..GcConfig::default()
            },
            ..small_batches(64 << 10, 20)
        };
        let (store, vol) = open_on_faulty_store(16 << 20, config).await;
        // Object A: 16 blocks. Then overwrite 15 of them: A is 1/16 live, a GC victim.
        vol.write(0, vec![1u8; 64 << 10], true)
            .await
            .expect("write");
        let drained = inproc::wait_drained(&vol, Duration::from_secs(30)).await;
        assert!(drained, "uploads did not drain");
        store.set_get_delay_ms(1500);
        let reader = {
            let v = vol.clone();
            tokio::spawn(async move { v.read(0, 4096).await })
        };
        // The read's GET is now waiting out its delay; everything else is fast.
        common::let_ms_pass(50).await;
        store.set_get_delay_ms(0);
        vol.write(4096, vec![2u8; 60 << 10], true)
            .await
            .expect("write");
        let got = reader.await.expect("join");
        assert!(
            got.is_ok(),
            "a read of live data failed because GC deleted its object: {:?}",
            got.err()
        );
        assert_eq!(got.expect("checked"), vec![1u8; 4096]);
        vol.shutdown().await.expect("shutdown");
    });
}

/// Engine bug found by `process_sigkill` against S3 (versitygw; episode seed
/// 0x769d3caec90fd8d2, crash point 5: "reading the recovered disk: blocks 448..512: NBD
/// error 5"; the server said "read kept racing with log reclamation or garbage
/// collection"), reproduced here without a crash: a read that spans object data and
/// write-log data used to plan, fetch every piece and then check that the log records
/// it read were not freed meanwhile, starting the whole read over if one was, at most 8
/// times. With object GETs taking a while (any real S3 store) and uploads freeing log
/// records all the time (after a recovery, or under a steady write load), every
/// attempt lost the race and the client got EIO. Regression test: reads now plan again
/// only the pieces a race invalidated, and read log pieces after the slow object ones.
#[test]
fn engine_bug_slow_object_reads_starve_reads_of_log_data() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use lsvd_core::gc::GcConfig;
    use lsvd_engine::EngineConfig;

    block_on(async {
        let config = EngineConfig {
            read_cache_bytes: 0,
            gc: GcConfig {
                start_utilization: 0.0,
                ..GcConfig::default()
            },
            ..small_batches(64 << 10, 5)
        };
        let (store, vol) = open_on_faulty_store(16 << 20, config).await;
        // Block 0 lives in an object.
        vol.write(0, vec![1u8; 4096], true).await.expect("write");
        inproc::wait_drained(&vol, Duration::from_secs(5)).await;
        assert_eq!(vol.status().log_used_bytes, 0, "block 0 uploaded");
        // Slow object reads, and a writer that keeps rewriting block 1: its newest
        // record is uploaded and freed a few milliseconds after it is written.
        store.set_get_delay_ms(60);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (v, stop) = (vol.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0u8;
                while !stop.load(Ordering::SeqCst) {
                    i = i.wrapping_add(1).max(2);
                    v.write(4096, vec![i; 4096], true).await.expect("write");
                    common::let_ms_pass(2).await; // a steady load, not a flood
                }
            })
        };
        common::let_ms_pass(50).await;
        let mut failures = Vec::new();
        for _ in 0..5 {
            match vol.read(0, 8192).await {
                Ok(got) => {
                    assert_eq!(&got[..4096], &[1u8; 4096][..], "block 0");
                    assert!(got[4096] >= 2 && got[4096..].iter().all(|&b| b == got[4096]));
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        stop.store(true, Ordering::SeqCst);
        writer.await.expect("writer");
        assert!(
            failures.is_empty(),
            "reads of object + log data failed under a steady upload load: {failures:?}"
        );
        vol.shutdown().await.expect("shutdown");
    });
}
