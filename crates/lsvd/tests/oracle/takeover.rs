//! Two servers, one volume: real `lsvd serve` processes on one store, each with a data
//! directory of its own (two hosts, `a` and `b`), leases of [`LEASE`].
//!
//! - [`episode`] with [`TakeoverKind::Kill`]: the holder serves the workload, a
//!   standby waits (`--standby`); the holder is SIGKILLed; the standby takes over when
//!   the lease lapses and must serve a prefix that holds everything the store was seen
//!   to hold (rule `CacheLost`: store barriers and `lsvd sync` of the holder at random
//!   moments are the store points); the workload goes on there, and the old holder's
//!   host comes back as the next standby (its write log now a superseded session's),
//!   so takeovers chain within an episode. In a third of the rounds it is first
//!   started as a plain server, which must refuse in one line naming the holder; in a
//!   quarter the new holder is restarted and must read back the same disk.
//! - [`TakeoverKind::Stop`]: the same, but the holder is paused (SIGSTOP) with requests
//!   in flight; once the standby serves, it is resumed (SIGCONT) after 0 to 600 ms:
//!   requests sent to it after the resume (on its connections, on a new one) must
//!   fail, it must exit non-zero saying it was fenced, and only then is the new
//!   holder's disk read and judged, and read again after the new holder's own restart
//!   (a kill, or a clean stop with its data directory deleted): the resumed holder
//!   changed and deleted nothing the new one needs. Requests in flight at the pause
//!   answered with success after the resume are counted; see [`known_bugs`] for what
//!   the engine gets wrong here.
//! - [`race_episode`]: both hosts started at the same moment, plain `serve` each (or
//!   one of them a standby): exactly one serves, a plain loser exits with one line
//!   naming the winner's pid, a standby loser stands by; then the winner is SIGKILLed
//!   and the loser (restarted, or the standby by itself) must serve a prefix
//!   (`CacheLost`).
//!
//! Each episode ends with clean stops, after which each host's data directory in turn
//! must serve exactly the last state: the host with a superseded write log either
//! serves it or refuses, naming `--discard-superseded-log`, and serves it with that.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::checker::{self, Rule};
use super::history::{Content, History};
use super::nbd::NbdConn;
use super::proc_kinds::{note_gc, random_args, to_seen};
use super::process::{Server, VOLUME};
use super::rng::Rng;
use super::stamp::{self, BLOCK, Seen};
use super::workload::{self, Control, Hooks, Spec, Target};
use super::{Failure, Stats, TempDir};
use crate::common::{NO_LIMIT, Poller, let_ms_pass, poll_until_async, wait_every_async};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverKind {
    /// The holder is SIGKILLed.
    Kill,
    /// The holder is paused with SIGSTOP, then resumed with SIGCONT after the takeover.
    Stop,
}

const NBLOCKS: u64 = 4096; // 16 MiB

/// `--lease-timeout` of every server here: a takeover after a crash takes about this.
pub const LEASE: &str = "2s";

/// How long a takeover, a refusal, a fenced holder's exit or a clean stop may take.
const PATIENCE: Duration = Duration::from_secs(60);

const HOSTS: [&str; 2] = ["a", "b"];

/// The cases that once showed engine bugs are all run (each bug has its regression
/// test, `engine_bug_*` in `crash_oracle.rs`):
/// - a paused holder is also resumed 3.5 s and 5 s after the takeover, past the new
///   holder's fourth lease renewal, and must be fenced;
/// - requests sent before the pause and answered with success after the resume are
///   violations (requests sent after the resume must fail too);
/// - the new holder is sometimes restarted before it wrote anything, which leaves a
///   hole in the object numbers that the claim after it must not vouch for.
fn known_bugs() -> bool {
    true
}

/// How long after the takeover a paused holder is resumed (see [`known_bugs`]).
fn resume_delays_ms() -> &'static [u64] {
    if known_bugs() {
        &[0, 300, 600, 3500, 5000]
    } else {
        &[0, 300, 600]
    }
}

/// The refusal a claim gives for a hole the history forgot: the message of
/// `engine_bug_a_hole_in_the_history_is_vouched_for_two_claims_later`, named in a
/// failure that shows it.
const KNOWN_HOLE_BUG: &str = "a later claim of the volume recovered past it";

/// A note for a failure that carries the known hole bug's message.
fn name_known_bug(what: String) -> String {
    if what.contains(KNOWN_HOLE_BUG) {
        format!(
            "{what}\n(this is the engine bug of `engine_bug_a_hole_in_the_history_is_vouched_for_two_claims_later`)"
        )
    } else {
        what
    }
}

/// Two hosts on one store; the volume is created by host a.
fn two_hosts(tmp: &TempDir, rng: &mut Rng) -> Result<([Server; 2], String), String> {
    let mut args = random_args(rng);
    if args.gc_start == 0.0 {
        // GC always on: its passes race the takeovers.
        args.gc_start = 0.85;
    }
    let store = tmp.path().join("store");
    let mut a = Server::create(&tmp.path().join("a"), &store, "16M", args.clone())
        .map_err(|e| e.to_string())?;
    a.set_tag("a");
    let b = Server::attach(&tmp.path().join("b"), &store, args.clone(), "b");
    let mut hosts = [a, b];
    for h in &mut hosts {
        h.extra = vec!["--lease-timeout".to_string(), LEASE.to_string()];
    }
    let ctx = format!(
        "two lsvd serve processes (hosts a, b: a data directory each, one store), --lease-timeout {LEASE}, 16 MiB volume, {args:?}, dir {}",
        tmp.path().display()
    );
    Ok((hosts, ctx))
}

/// A failure with the context, the round's notes and both hosts' last log lines.
fn failure(round: u32, ctx: &str, notes: &[String], hosts: &[Server; 2], what: String) -> Failure {
    Failure::new(
        round,
        name_known_bug(format!(
            "{ctx}\nround notes:\n  {}\n{what}\nhost a stderr (tail):\n{}\nhost b stderr (tail):\n{}",
            notes.join("\n  "),
            hosts[0].stderr_tail(),
            hosts[1].stderr_tail()
        )),
    )
}

/// [`failure`] once the rounds are over.
fn after_the_last_round(rounds: u32, ctx: &str, hosts: &[Server; 2], what: String) -> Failure {
    let notes = ["after the last round".to_string()];
    failure(rounds.saturating_sub(1), ctx, &notes, hosts, what)
}

/// Wait until the server printed `what`; an error if it exits or takes too long.
async fn wait_for_log(host: &Server, what: &str, within: Duration) -> Result<(), String> {
    let printed_or_exited = || {
        let outcome = match host.exited() {
            _ if host.log().contains(what) => Some(Ok(())),
            Some(st) => Some(Err(format!("exited ({st}) before it printed {what:?}"))),
            None => None,
        };
        std::future::ready(outcome)
    };
    poll_until_async(within, printed_or_exited)
        .await
        .unwrap_or_else(|| Err(format!("did not print {what:?} within {within:?}")))
}

/// Start `host` as a standby (`--standby`, which discards a superseded write log when
/// it takes over) and wait until it stands by.
async fn start_standby(host: &mut Server) -> Result<(), String> {
    host.spawn_with(&["--standby"])
        .map_err(|e| format!("starting the standby: {e}"))?;
    wait_for_log(host, "standing by", PATIENCE)
        .await
        .map_err(|e| format!("the standby {e}"))
}

/// Does the server at `socket` answer an NBD read of the volume (within 5 s)?
async fn answers(socket: &Path) -> bool {
    if !socket.exists() {
        return false;
    }
    // Serving means answering a read with data: a fenced server still takes
    // handshakes for the few seconds before it exits, and answers EIO.
    let read = async {
        let c = NbdConn::connect(socket, VOLUME).await?;
        let r = c.read(0, 4096).await;
        c.disconnect().await;
        r
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), read).await,
        Ok(Ok(_))
    )
}

/// Read every block through `conns`.
async fn read_disk(conns: &[Arc<NbdConn>], wlog: &Path) -> Result<Vec<Seen>, String> {
    Target::nbd(conns, wlog, None)
        .read_all(NBLOCKS)
        .await
        .map_err(|e| e.to_string())
}

/// Err(`what` and the blocks whose contents differ from `want`, at most 10) unless
/// `seen` is `want`.
fn same_disk(seen: &[Seen], want: &[Content], what: &str) -> Result<(), String> {
    let diff: Vec<String> = seen
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (s, c))| **s != to_seen(**c))
        .take(10)
        .map(|(b, (s, c))| format!("block {b}: {s:?}, expected {c:?}"))
        .collect();
    if diff.is_empty() {
        return Ok(());
    }
    Err(format!("{what}:\n  {}", diff.join("\n  ")))
}

/// Reads `host`'s disk through `conns`: Err (after `what`) unless it is `want`.
async fn check_disk(
    conns: &[Arc<NbdConn>],
    host: &Server,
    want: &[Content],
    what: &str,
) -> Result<(), String> {
    let seen = read_disk(conns, &host.wlog())
        .await
        .map_err(|e| format!("{what}: reading it failed: {e}"))?;
    same_disk(&seen, want, &format!("{what}: not the state it must serve"))
}

async fn disconnect(conns: &[Arc<NbdConn>]) {
    for c in conns {
        c.disconnect().await;
    }
}

/// Has every thread of process `pid` stopped (state `T` in /proc)?
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        // The state follows the command name in parentheses.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if state != Some('T') {
            return false;
        }
        any = true;
    }
    any
}

/// `lsvd sync` of the holder at `n` random acknowledgement counts below `horizon`;
/// each success before the crash is a store point (the tick taken just before the
/// command: every write acknowledged before it is in the store). A success answered
/// after the fence mark is a late success (a fenced holder claimed durability).
fn spawn_syncs(
    host: &Server,
    hist: &Arc<History>,
    ctl: &Arc<Control>,
    mut rng: Rng,
    n: u32,
    horizon: u64,
    stats: &Arc<Stats>,
) -> tokio::task::JoinHandle<()> {
    let (syncer, hist, ctl, stats) = (host.syncer(), hist.clone(), ctl.clone(), stats.clone());
    tokio::spawn(async move {
        let mut at: Vec<u64> = (0..n).map(|_| rng.below(horizon)).collect();
        at.sort_unstable();
        for point in at {
            if !ctl
                .wait_for_acks(point, || ctl.crashed.load(Ordering::SeqCst))
                .await
            {
                return;
            }
            if ctl.crashed.load(Ordering::SeqCst) {
                return;
            }
            let t = hist.now();
            let ok = syncer.sync(Duration::from_secs(30)).await.unwrap_or(false);
            let done = hist.now();
            let mark = ctl.fence_mark.load(Ordering::SeqCst);
            if ok && mark != 0 && done > mark {
                ctl.late_successes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!(
                        "lsvd sync (started t={t}) succeeded on the resumed holder (answered by t={done}, resumed t={mark})"
                    ));
            }
            if ok && !ctl.crashed.load(Ordering::SeqCst) {
                hist.store_point(t);
                stats.add("syncs_ok", 1);
            } else {
                stats.add("syncs_failed_or_after_crash", 1);
            }
        }
    })
}

/// Requests on the resumed (fenced) holder's connections and on a new connection:
/// each must fail, or end when the holder exits; never succeed. Violations.
async fn probe_resumed(conns: &[Arc<NbdConn>], socket: &Path, id: u64) -> Vec<String> {
    let mut v = Vec::new();
    let judge = |what: String,
                 r: Result<std::io::Result<()>, tokio::time::error::Elapsed>,
                 v: &mut Vec<String>| {
        match r {
        Ok(Ok(())) => v.push(format!("{what} on the resumed holder succeeded")),
        Ok(Err(_)) => {}
        Err(_) => v.push(format!(
            "{what} on the resumed holder neither failed nor ended with its exit within {PATIENCE:?}"
        )),
    }
    };
    let block = NBLOCKS - 1;
    let data = stamp::write_data(block, 1, id);
    for (i, c) in conns.iter().enumerate() {
        let w = tokio::time::timeout(PATIENCE, c.write(block * BLOCK as u64, &data, false)).await;
        judge(format!("WRITE on connection {i}"), w, &mut v);
        let f = tokio::time::timeout(PATIENCE, c.flush()).await;
        judge(format!("FLUSH on connection {i}"), f, &mut v);
        let r = tokio::time::timeout(PATIENCE, c.read(0, BLOCK as u64)).await;
        judge(
            format!("READ on connection {i}"),
            r.map(|r| r.map(drop)),
            &mut v,
        );
    }
    // A new connection (while it still listens): its write must fail too.
    if let Ok(Ok(c)) =
        tokio::time::timeout(Duration::from_secs(5), NbdConn::connect(socket, VOLUME)).await
    {
        let w = tokio::time::timeout(PATIENCE, c.write(block * BLOCK as u64, &data, true)).await;
        judge("FUA WRITE on a new connection".to_string(), w, &mut v);
        c.disconnect().await;
    }
    v
}

/// A takeover episode: see the module docs.
pub async fn episode(
    kind: TakeoverKind,
    seed: u64,
    rounds: u32,
    stats: Arc<Stats>,
) -> Result<(), Failure> {
    let mut rng = Rng::new(seed);
    let mut tmp = TempDir::new(match kind {
        TakeoverKind::Kill => "tk-kill",
        TakeoverKind::Stop => "tk-stop",
    });
    // Kept for a post-mortem unless the episode passes.
    tmp.keep = true;
    let (mut hosts, ctx) = two_hosts(&tmp, &mut rng).map_err(|e| Failure::new(0, e))?;
    let nconns = rng.range(1, 3) as usize;
    let ctx = format!("{ctx}, {nconns} NBD connections");
    let mut notes: Vec<String> = Vec::new();
    let mut conns = hosts[0]
        .start(nconns)
        .await
        .map_err(|e| failure(0, &ctx, &notes, &hosts, format!("host a: {e}")))?;
    start_standby(&mut hosts[1])
        .await
        .map_err(|e| failure(0, &ctx, &notes, &hosts, format!("host b: {e}")))?;
    let ids = Arc::new(AtomicU64::new(1));
    let mut contents = vec![Content::Zero; NBLOCKS as usize];
    let mut holder = 0usize;
    let mut gc_seen = (0u64, 0u64);
    for round in 0..rounds {
        let (h, s) = (holder, 1 - holder);
        notes = vec![format!(
            "host {} holds the volume, host {} stands by",
            HOSTS[h], HOSTS[s]
        )];
        let fail = |what: String, notes: &Vec<String>, hosts: &[Server; 2]| {
            failure(round, &ctx, notes, hosts, what)
        };
        if std::os::unix::net::UnixStream::connect(&hosts[s].socket).is_ok() {
            return Err(fail(
                format!(
                    "the standby (host {}) accepts connections before it took the volume over",
                    HOSTS[s]
                ),
                &notes,
                &hosts,
            ));
        }
        let hist = Arc::new(History::new(contents.clone()));
        let mut spec = Spec::random(&mut rng, NBLOCKS);
        spec.store_barriers = rng.range(0, 2) as u32;
        if kind == TakeoverKind::Stop && spec.crash_after_acks.is_none() {
            // Paused with requests in flight.
            spec.crash_after_acks = Some(rng.range(1, spec.max_ops));
        }
        let syncs = rng.range(0, 3) as u32;
        let horizon = spec.crash_after_acks.unwrap_or(spec.max_ops).max(2);
        notes.push(format!(
            "workload {spec:?}, {syncs} lsvd syncs of the holder"
        ));
        let ctl = Arc::new(Control::default());
        let crash: Box<dyn Fn() + Send + Sync> = match kind {
            TakeoverKind::Kill => Box::new(hosts[h].killer()),
            TakeoverKind::Stop => Box::new(hosts[h].signaller(libc::SIGSTOP)),
        };
        let hooks = Hooks::server_process(crash);
        let host = &hosts[h];
        let sync_task = spawn_syncs(host, &hist, &ctl, rng.fork(), syncs, horizon, &stats);
        let target = Target::nbd(&conns, &host.wlog(), Some(host.syncer()));
        let workload_task = tokio::spawn(workload::run(
            target,
            spec,
            hist.clone(),
            ids.clone(),
            hooks,
            ctl.clone(),
        ));
        let resume_after_ms = *rng.pick(resume_delays_ms());
        // Until the crash (or the end of the workload, then a random moment later).
        let crashed_or_done = || ctl.crashed.load(Ordering::SeqCst) || workload_task.is_finished();
        wait_every_async(Duration::from_millis(2), NO_LIMIT, crashed_or_done).await;
        if !ctl.crashed.swap(true, Ordering::SeqCst) {
            let wait = rng.below(300);
            notes.push(format!(
                "the workload ended; crashed {wait} ms later, nothing in flight"
            ));
            let_ms_pass(wait).await;
            match kind {
                TakeoverKind::Kill => hosts[h].killer()(),
                TakeoverKind::Stop => {
                    hosts[h].signal(libc::SIGSTOP);
                }
            }
        }
        let crashed_at = Instant::now();
        let crash_tick = hist.now();
        notes.push(format!(
            "{} host {} (t={crash_tick})",
            match kind {
                TakeoverKind::Kill => "SIGKILLed",
                TakeoverKind::Stop => "SIGSTOPped",
            },
            HOSTS[h]
        ));
        let old_pid = hosts[h].pid();
        match kind {
            TakeoverKind::Kill => hosts[h].kill(),
            TakeoverKind::Stop => {
                // The pause is the crash: nothing can be answered from here on.
                let pid = old_pid.unwrap_or(0);
                let (every, limit) = (Duration::from_millis(1), Duration::from_secs(5));
                if !wait_every_async(every, limit, || all_threads_stopped(pid)).await {
                    return Err(fail(
                        format!("host {} did not stop on SIGSTOP", HOSTS[h]),
                        &notes,
                        &hosts,
                    ));
                }
            }
        }
        // The standby takes over.
        let new_conns = match hosts[s].connect_within(nconns, PATIENCE).await {
            Ok(c) => c,
            Err(e) => {
                return Err(fail(
                    format!("the standby (host {}) did not take over: {e}", HOSTS[s]),
                    &notes,
                    &hosts,
                ));
            }
        };
        let took = crashed_at.elapsed();
        stats.add("takeovers", 1);
        stats.add("takeover_ms_total", took.as_millis() as u64);
        stats.max("takeover_ms_max", took.as_millis() as u64);
        notes.push(format!(
            "host {} served {} ms after the crash",
            HOSTS[s],
            took.as_millis()
        ));
        if !hosts[s].log().contains("took v over") {
            return Err(fail(
                format!(
                    "host {} serves but did not say it took the volume over",
                    HOSTS[s]
                ),
                &notes,
                &hosts,
            ));
        }
        let mut extra_violations = Vec::new();
        if kind == TakeoverKind::Stop {
            notes.push(format!(
                "resumed host {} {resume_after_ms} ms after the takeover",
                HOSTS[h]
            ));
            // Answers the holder sent before it stopped were read long ago (the
            // takeover took a lease timeout): whatever succeeds from here on, it
            // answered after it was resumed.
            let_ms_pass(resume_after_ms).await;
            ctl.fence_mark.store(hist.now(), Ordering::SeqCst);
            hosts[h].signal(libc::SIGCONT);
            let id = ids.fetch_add(1, Ordering::SeqCst);
            extra_violations.extend(probe_resumed(&conns, &hosts[h].socket, id).await);
        }
        let out = match tokio::time::timeout(PATIENCE + PATIENCE, workload_task).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(fail(format!("workload task: {e}"), &notes, &hosts)),
            Err(_) => {
                return Err(fail(
                    "the workload did not end after the crash".into(),
                    &notes,
                    &hosts,
                ));
            }
        };
        ctl.stop.store(true, Ordering::SeqCst);
        let _ = sync_task.await;
        if kind == TakeoverKind::Stop {
            match hosts[h].wait_exit(PATIENCE).await {
                None => extra_violations.push(format!(
                    "the resumed holder (host {}) still runs {PATIENCE:?} after it was resumed",
                    HOSTS[h]
                )),
                Some(st) if st.success() => extra_violations.push(format!(
                    "the resumed holder (host {}) exited successfully; a fenced server exits non-zero",
                    HOSTS[h]
                )),
                Some(_) => {}
            }
            let log = hosts[h].log();
            if !(log.contains("fenced") && log.contains("took the volume over")) {
                extra_violations.push(format!(
                    "the resumed holder (host {}) did not say it was fenced",
                    HOSTS[h]
                ));
            }
            // Requests sent before the pause that the holder answered with success
            // once resumed: answers it had decided on (its lease checked) before the
            // pause and sent after it
            // (`engine_bug_answers_decided_before_a_pause_are_sent_after_the_takeover`).
            let late = ctl
                .late_successes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            stats.add("in_flight_requests_acked_after_resume", late.len() as u64);
            if !late.is_empty() {
                notes.push(format!(
                    "requests in flight at the pause answered with success after the resume: {}",
                    late.join("; ")
                ));
                if known_bugs() {
                    extra_violations.extend(
                        late.iter()
                            .map(|l| format!("the fenced holder answered with success: {l}")),
                    );
                }
            }
            hosts[h].kill();
        }
        // In the pause kind the new holder's disk is read once the old holder has
        // resumed and exited: it must not have changed anything.
        let seen = read_disk(&new_conns, &hosts[s].wlog()).await.map_err(|e| {
            fail(
                format!("reading the disk through the new holder: {e}"),
                &notes,
                &hosts,
            )
        })?;
        disconnect(&conns).await;
        conns = new_conns;
        out.count(&stats);
        notes.push(out.summary());
        let rec = hist.snapshot();
        let unanswered = rec.ops.iter().filter(|o| o.acked().is_none()).count();
        stats.add("requests_unanswered_at_crash", unanswered as u64);
        stats.add("crash_points", 1);
        let what = "rule CacheLost violated after the takeover";
        let (rule, hangs) = (Rule::CacheLost, &out.hangs);
        checker::judge(&rec, &seen, rule, extra_violations, hangs, &stats, what)
            .map_err(|e| fail(e, &notes, &hosts))?;
        contents = checker::contents(&seen)
            .ok_or_else(|| fail("garbage in a checked state".into(), &notes, &hosts))?;
        // After a pause, the resumed holder must have deleted nothing the new one
        // needs: the disk reads the same after the new holder's own restart.
        if kind == TakeoverKind::Stop || rng.chance(0.25) {
            // First a write the new holder puts into the store, unless the known
            // hole bug is to be shown (see `known_bugs`).
            let block = rng.below(NBLOCKS);
            if !known_bugs() {
                let id = ids.fetch_add(1, Ordering::SeqCst);
                let w = conns[0]
                    .write(block * BLOCK as u64, &stamp::write_data(block, 1, id), true)
                    .await;
                let synced = hosts[s].syncer().sync(PATIENCE).await;
                if w.is_err() || !matches!(synced, Ok(true)) {
                    return Err(fail(
                        format!("a write to the new holder and lsvd sync: {w:?}, {synced:?}"),
                        &notes,
                        &hosts,
                    ));
                }
                contents[block as usize] = Content::Write(id);
                notes.push(format!(
                    "wrote block {block} (#{id}) to host {} and synced it",
                    HOSTS[s]
                ));
            }
            disconnect(&conns).await;
            let wipe = rng.chance(0.5);
            if wipe {
                notes.push(format!(
                    "stopped host {} cleanly, deleted its data directory, restarted it",
                    HOSTS[s]
                ));
                stop_cleanly(&mut hosts[s], "the new holder")
                    .await
                    .map_err(|e| fail(e, &notes, &hosts))?;
                let _ = std::fs::remove_dir_all(&hosts[s].data);
            } else {
                notes.push(format!("SIGKILLed host {} and restarted it", HOSTS[s]));
                hosts[s].kill();
            }
            conns = hosts[s]
                .start(nconns)
                .await
                .map_err(|e| fail(format!("restarting the new holder: {e}"), &notes, &hosts))?;
            let what = "the new holder's disk after its own restart";
            check_disk(&conns, &hosts[s], &contents, what)
                .await
                .map_err(|what| fail(what, &notes, &hosts))?;
            stats.add("new_holder_restarts_checked", 1);
        }
        note_gc(&hosts[s], &stats, &mut gc_seen, true);
        // The old holder's host comes back as the next standby. Sometimes first as a
        // plain server: the volume is live, so it must refuse in one line naming the
        // holder.
        if rng.chance(0.3) {
            let holder_pid = hosts[s].pid().unwrap_or(0);
            notes.push(format!(
                "started host {} as a plain server while host {} (pid {holder_pid}) serves",
                HOSTS[h], HOSTS[s]
            ));
            if let Err(e) = expect_refusal(&mut hosts[h], holder_pid, &[]).await {
                return Err(fail(e, &notes, &hosts));
            }
            stats.add("refusals_checked", 1);
        }
        start_standby(&mut hosts[h])
            .await
            .map_err(|e| fail(format!("host {}: {e}", HOSTS[h]), &notes, &hosts))?;
        holder = s;
    }
    // Clean stops; then each host's data directory in turn must serve exactly the
    // last state (the standby's holds a superseded session's write log).
    let (h, s) = (holder, 1 - holder);
    let end = |what: String, hosts: &[Server; 2]| after_the_last_round(rounds, &ctx, hosts, what);
    disconnect(&conns).await;
    for i in [s, h] {
        stop_cleanly(&mut hosts[i], &format!("host {}", HOSTS[i]))
            .await
            .map_err(|e| end(e, &hosts))?;
    }
    note_gc(&hosts[h], &stats, &mut gc_seen, false);
    for i in [s, h] {
        serve_exactly(&mut hosts[i], &contents, &stats)
            .await
            .map_err(|e| end(format!("host {}: {e}", HOSTS[i]), &hosts))?;
    }
    tmp.keep = false;
    Ok(())
}

/// Start `host` as a plain server (with `flags`) while another process holds the
/// volume: it must exit non-zero with one line that names the holder's pid.
async fn expect_refusal(host: &mut Server, holder_pid: u32, flags: &[&str]) -> Result<(), String> {
    host.spawn_with(flags)
        .map_err(|e| format!("starting a second server: {e}"))?;
    let Some(st) = host.wait_exit(PATIENCE).await else {
        host.kill();
        return Err(format!(
            "a second plain server of the live volume still runs after {PATIENCE:?}:\n{}",
            host.log()
        ));
    };
    check_refusal(st, &host.log(), holder_pid)
}

/// A refusal: non-zero exit, one line, naming `holder_pid` (besides the warning of a
/// server started with `--discard-superseded-log` that discarded records first).
fn check_refusal(st: std::process::ExitStatus, log: &str, holder_pid: u32) -> Result<(), String> {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| !(l.starts_with("lsvd: warn:") && l.contains("a superseded session")))
        .collect();
    if st.success()
        || lines.len() != 1
        || !lines[0].contains(&format!("pid {holder_pid}"))
        || !lines[0].contains("lsvd: error:")
    {
        return Err(format!(
            "a second server of the live volume must exit non-zero with one line naming the holder (pid {holder_pid}); it exited {st} and printed:\n{log}"
        ));
    }
    Ok(())
}

/// Start `host` (no other server runs; the volume was stopped cleanly) and read the
/// disk: exactly `want`. A write log of a superseded session may be refused, naming
/// `--discard-superseded-log`; then it is started with that.
async fn serve_exactly(host: &mut Server, want: &[Content], stats: &Stats) -> Result<(), String> {
    host.spawn().map_err(|e| e.to_string())?;
    let mut conns = match host.connect_within(1, PATIENCE).await {
        Ok(c) => c,
        Err(e) => {
            let log = host.log();
            if !(log.contains("superseded") && log.contains("--discard-superseded-log")) {
                return Err(format!(
                    "did not serve, nor refuse a superseded write log: {e}"
                ));
            }
            let lines = log.lines().count();
            if lines != 1 {
                return Err(format!(
                    "the refusal of a superseded write log is not one line:\n{log}"
                ));
            }
            stats.add("superseded_logs_refused", 1);
            host.spawn_with(&["--discard-superseded-log"])
                .map_err(|e| e.to_string())?;
            host.connect_within(1, PATIENCE)
                .await
                .map_err(|e| format!("with --discard-superseded-log: {e}"))?
        }
    };
    let seen = read_disk(&conns, &host.wlog()).await?;
    let same = same_disk(
        &seen,
        want,
        "after clean stops the disk differs from the last state",
    );
    disconnect(&conns).await;
    conns.clear();
    same?;
    stop_cleanly(host, "the server").await
}

/// Stops `host` (`name` in the error): Err unless it exits successfully within
/// [`PATIENCE`].
async fn stop_cleanly(host: &mut Server, name: &str) -> Result<(), String> {
    match host.stop_within(PATIENCE).await {
        Ok(st) if st.success() => Ok(()),
        other => Err(format!("clean stop of {name}: {other:?}")),
    }
}

/// Two servers started at the same moment: see the module docs.
pub async fn race_episode(seed: u64, rounds: u32, stats: Arc<Stats>) -> Result<(), Failure> {
    let mut rng = Rng::new(seed);
    let mut tmp = TempDir::new("race");
    tmp.keep = true;
    let (mut hosts, ctx) = two_hosts(&tmp, &mut rng).map_err(|e| Failure::new(0, e))?;
    let nconns = rng.range(1, 3) as usize;
    let ctx = format!("{ctx}, {nconns} NBD connections");
    let ids = Arc::new(AtomicU64::new(1));
    let mut contents = vec![Content::Zero; NBLOCKS as usize];
    let mut gc_seen = (0u64, 0u64);
    for round in 0..rounds {
        let mut notes: Vec<String> = Vec::new();
        let fail = |what: String, notes: &Vec<String>, hosts: &[Server; 2]| {
            failure(round, &ctx, notes, hosts, what)
        };
        // Both at the same moment: plain servers, or one of them a standby.
        let standby = rng.chance(0.35).then(|| rng.below(2) as usize);
        let first = rng.below(2) as usize;
        let delay_ms = *rng.pick(&[0u64, 0, 2, 10, 50]);
        notes.push(format!(
            "started host {} then, {delay_ms} ms later, host {}{}",
            HOSTS[first],
            HOSTS[1 - first],
            match standby {
                Some(i) => format!(" (host {} with --standby)", HOSTS[i]),
                None => String::new(),
            }
        ));
        for (n, i) in [first, 1 - first].into_iter().enumerate() {
            if n == 1 && delay_ms > 0 {
                let_ms_pass(delay_ms).await;
            }
            // A host killed in an earlier round holds a superseded session's write
            // log: discard it, so that both race for the claim itself.
            let flags: &[&str] = if standby == Some(i) {
                &["--standby"]
            } else {
                &["--discard-superseded-log"]
            };
            hosts[i]
                .spawn_with(flags)
                .map_err(|e| fail(format!("starting host {}: {e}", HOSTS[i]), &notes, &hosts))?;
        }
        let started = Instant::now();
        // Exactly one serves.
        let mut taken_over = false;
        let mut poll = Poller::new(Duration::from_millis(10), NO_LIMIT);
        let winner = loop {
            poll.tick().await;
            let serving: Vec<usize> = {
                let mut v = Vec::new();
                for (i, host) in hosts.iter().enumerate() {
                    if host.exited().is_none() && answers(&host.socket).await {
                        v.push(i);
                    }
                }
                v
            };
            // One poll reads from each host in turn, each read taking up to 5 s: the
            // first may have been superseded (a lease that lapsed on a starved host)
            // by the time the second answered. Two winners answer together still.
            let serving = if serving.len() == 2 {
                let_ms_pass(100).await;
                let mut still = Vec::new();
                for (i, host) in hosts.iter().enumerate() {
                    if host.exited().is_none() && answers(&host.socket).await {
                        still.push(i);
                    }
                }
                if still.len() < 2 {
                    taken_over = true;
                    notes.push(format!(
                        "both hosts answered one poll, then only {still:?}: a takeover during the race"
                    ));
                    stats.add("races_with_a_takeover", 1);
                }
                still
            } else {
                serving
            };
            if serving.len() == 2 {
                return Err(fail(
                    "both servers of the race serve the volume".into(),
                    &notes,
                    &hosts,
                ));
            }
            if let [w] = serving[..] {
                break w;
            }
            if hosts[0].exited().is_some() && hosts[1].exited().is_some() {
                return Err(fail(
                    "neither server of the race serves the volume: both exited".into(),
                    &notes,
                    &hosts,
                ));
            }
            if started.elapsed() > PATIENCE {
                return Err(fail(
                    format!("no server of the race served within {PATIENCE:?}"),
                    &notes,
                    &hosts,
                ));
            }
        };
        let loser = 1 - winner;
        let winner_pid = hosts[winner].pid().unwrap_or(0);
        notes.push(format!(
            "host {} (pid {winner_pid}) won after {} ms",
            HOSTS[winner],
            started.elapsed().as_millis()
        ));
        if standby == Some(winner) {
            stats.add("races_won_by_a_standby", 1);
        }
        if standby == Some(loser) {
            // A standby that lost stands by: running, serving nothing.
            if hosts[loser].exited().is_some() || answers(&hosts[loser].socket).await {
                return Err(fail(
                    "the standby that lost the race exited or serves".into(),
                    &notes,
                    &hosts,
                ));
            }
            stats.add("races_lost_by_a_standby", 1);
        } else {
            let Some(st) = hosts[loser].wait_exit(PATIENCE).await else {
                return Err(fail(
                    format!("the loser of the race still runs after {PATIENCE:?}"),
                    &notes,
                    &hosts,
                ));
            };
            let log = hosts[loser].log();
            if taken_over {
                // It served, then the winner took the volume over from it: fenced.
                if st.success() || !log.contains("fenced:") {
                    return Err(fail(
                        format!(
                            "the server taken over during the race must exit non-zero, fenced; it exited {st}:\n{log}"
                        ),
                        &notes,
                        &hosts,
                    ));
                }
            } else {
                check_refusal(st, &log, winner_pid).map_err(|e| fail(e, &notes, &hosts))?;
            }
            stats.add("refusals_checked", 1);
            // Lost the put-if-absent of the claim, or found the winner's lease live.
            stats.add(
                if log.contains("while this process") {
                    "races_lost_at_the_claim"
                } else {
                    "races_lost_to_a_live_lease"
                },
                1,
            );
        }
        let mut conns = hosts[winner]
            .connect(nconns)
            .await
            .map_err(|e| fail(format!("connecting to the winner: {e}"), &notes, &hosts))?;
        // The volume was stopped cleanly: the winner serves exactly the last state.
        let what = "the winner's disk after the clean stop";
        check_disk(&conns, &hosts[winner], &contents, what)
            .await
            .map_err(|what| fail(what, &notes, &hosts))?;
        // The workload on the winner, SIGKILLed at a random acknowledgement.
        let hist = Arc::new(History::new(contents.clone()));
        let mut spec = Spec::random(&mut rng, NBLOCKS);
        spec.store_barriers = rng.range(0, 2) as u32;
        let syncs = rng.range(0, 2) as u32;
        let horizon = spec.crash_after_acks.unwrap_or(spec.max_ops).max(2);
        notes.push(format!(
            "workload {spec:?}, {syncs} lsvd syncs of the winner"
        ));
        let ctl = Arc::new(Control::default());
        let killer = Arc::new(hosts[winner].killer());
        let hooks = Hooks::server_process({
            let k = killer.clone();
            move || k()
        });
        let host = &hosts[winner];
        let sync_task = spawn_syncs(host, &hist, &ctl, rng.fork(), syncs, horizon, &stats);
        let target = Target::nbd(&conns, &host.wlog(), Some(host.syncer()));
        let out = workload::run(target, spec, hist.clone(), ids.clone(), hooks, ctl.clone()).await;
        if !ctl.crashed.swap(true, Ordering::SeqCst) {
            let wait = rng.below(300);
            notes.push(format!("killed {wait} ms after the workload ended"));
            let_ms_pass(wait).await;
            killer();
        }
        ctl.stop.store(true, Ordering::SeqCst);
        hosts[winner].kill();
        let _ = sync_task.await;
        disconnect(&conns).await;
        out.count(&stats);
        // The loser takes over: a standby by itself, a plain loser restarted (it
        // waits for the winner's lease to lapse).
        let killed_at = Instant::now();
        if standby != Some(loser) {
            notes.push(format!("restarted host {}", HOSTS[loser]));
            hosts[loser]
                .spawn()
                .map_err(|e| fail(format!("restarting the loser: {e}"), &notes, &hosts))?;
        }
        conns = match hosts[loser].connect_within(nconns, PATIENCE).await {
            Ok(c) => c,
            Err(e) if standby != Some(loser) && hosts[loser].log().contains("superseded") => {
                // Its write log holds what a superseded session acknowledged:
                // refused with the way out.
                if !hosts[loser].log().contains("--discard-superseded-log") {
                    return Err(fail(
                        format!("the refusal of a superseded write log names no way out: {e}"),
                        &notes,
                        &hosts,
                    ));
                }
                stats.add("superseded_logs_refused", 1);
                notes.push(
                    "refused its superseded write log; restarted with --discard-superseded-log"
                        .into(),
                );
                hosts[loser]
                    .spawn_with(&["--discard-superseded-log"])
                    .map_err(|e| fail(format!("restarting the loser: {e}"), &notes, &hosts))?;
                hosts[loser]
                    .connect_within(nconns, PATIENCE)
                    .await
                    .map_err(|e| {
                        fail(format!("the loser did not take over: {e}"), &notes, &hosts)
                    })?
            }
            Err(e) => {
                return Err(fail(
                    format!("the loser did not take over: {e}"),
                    &notes,
                    &hosts,
                ));
            }
        };
        let took = killed_at.elapsed();
        stats.add("takeovers", 1);
        stats.max("takeover_ms_max", took.as_millis() as u64);
        let seen = read_disk(&conns, &hosts[loser].wlog())
            .await
            .map_err(|e| fail(format!("reading the loser's disk: {e}"), &notes, &hosts))?;
        let rec = hist.snapshot();
        stats.add("crash_points", 1);
        let what = "rule CacheLost violated after the loser took over";
        let (rule, hangs) = (Rule::CacheLost, &out.hangs);
        checker::judge(&rec, &seen, rule, Vec::new(), hangs, &stats, what)
            .map_err(|e| fail(e, &notes, &hosts))?;
        contents = checker::contents(&seen)
            .ok_or_else(|| fail("garbage in a checked state".into(), &notes, &hosts))?;
        note_gc(&hosts[loser], &stats, &mut gc_seen, true);
        // A clean stop: the next race starts from a volume nobody holds.
        disconnect(&conns).await;
        stop_cleanly(&mut hosts[loser], &format!("host {}", HOSTS[loser]))
            .await
            .map_err(|e| fail(e, &notes, &hosts))?;
    }
    // The last winner's data directory holds a superseded session's write log.
    let end = |what: String, hosts: &[Server; 2]| after_the_last_round(rounds, &ctx, hosts, what);
    for i in 0..2 {
        serve_exactly(&mut hosts[i], &contents, &stats)
            .await
            .map_err(|e| end(format!("host {}: {e}", HOSTS[i]), &hosts))?;
    }
    tmp.keep = false;
    Ok(())
}
