//! The workload: concurrent tasks issuing stamped writes, trims, write-zeroes, FUA
//! writes, FLUSHes and verifying reads against a disk, recording everything in the
//! [`History`].
//!
//! Rules that keep the history checkable:
//! - no two operations touching the same block are ever in flight together (a block
//!   lock table), so each block's operations are totally ordered;
//! - every write gets a fresh id and stamps each block with (block, id, checksum).
//!
//! Optional *store barriers* pause the workload, FLUSH, and wait until the store holds
//! every record written so far; the time of each success is a store point (what the
//! cache-lost rule relies on).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lsvd_engine::Volume;

use super::history::{Content, History, OpKind};
use super::nbd::NbdConn;
use super::rng::Rng;
use super::stamp::{self, BLOCK, Seen};
use crate::common::{NO_LIMIT, Poller, let_ms_pass, poll_every_async, wait_every_async};

/// No single operation may take longer than this; longer is reported as a hang.
pub const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// The disk under test.
#[derive(Clone)]
pub enum Target {
    /// The engine in this process.
    Vol(Arc<Volume>),
    /// An `lsvd serve` process over NBD; `wlog` is its write-log file. With a
    /// `syncer`, a store barrier runs `lsvd sync` instead of watching the write log
    /// drain (which a log that keeps uploaded records, `--log-free-target`, may not
    /// do for a long time).
    Nbd {
        conns: Vec<Arc<NbdConn>>,
        wlog: PathBuf,
        syncer: Option<super::process::Syncer>,
    },
}

impl Target {
    /// An `lsvd serve` process's disk through `conns` (see [`Target::Nbd`]).
    pub fn nbd(
        conns: &[Arc<NbdConn>],
        wlog: &Path,
        syncer: Option<super::process::Syncer>,
    ) -> Target {
        Target::Nbd {
            conns: conns.to_vec(),
            wlog: wlog.to_path_buf(),
            syncer,
        }
    }

    fn conn(&self, worker: usize) -> Option<&NbdConn> {
        match self {
            Target::Vol(_) => None,
            Target::Nbd { conns, .. } => Some(&conns[worker % conns.len()]),
        }
    }

    pub async fn write(&self, w: usize, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        match self {
            Target::Vol(v) => Ok(v.write(offset, data, fua).await?),
            Target::Nbd { .. } => self.conn_or_err(w)?.write(offset, &data, fua).await,
        }
    }

    pub async fn zero(
        &self,
        w: usize,
        offset: u64,
        len: u64,
        kind: OpKind,
        fua: bool,
    ) -> io::Result<()> {
        match self {
            Target::Vol(v) => Ok(v.write_zeroes(offset, len, fua).await?),
            Target::Nbd { .. } => {
                let c = self.conn_or_err(w)?;
                if kind == OpKind::Trim {
                    c.trim(offset, len, fua).await
                } else {
                    c.write_zeroes(offset, len, fua).await
                }
            }
        }
    }

    pub async fn flush(&self, w: usize) -> io::Result<()> {
        match self {
            Target::Vol(v) => Ok(v.flush().await?),
            Target::Nbd { .. } => self.conn_or_err(w)?.flush().await,
        }
    }

    pub async fn read(&self, w: usize, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        match self {
            Target::Vol(v) => Ok(v.read(offset, len).await?),
            Target::Nbd { .. } => self.conn_or_err(w)?.read(offset, len).await,
        }
    }

    fn conn_or_err(&self, w: usize) -> io::Result<&NbdConn> {
        self.conn(w)
            .ok_or_else(|| io::Error::other("not an NBD target"))
    }

    /// Does the store hold every record written so far? (Only meaningful while no
    /// operation is in flight.)
    pub async fn drained(&self) -> bool {
        match self {
            Target::Vol(v) => {
                let s = v.status();
                s.log_used_bytes == 0 && s.uploads_pending == 0
            }
            Target::Nbd { wlog, .. } => super::process::log_drained(wlog).unwrap_or(false),
        }
    }

    /// A store barrier by `lsvd sync`, if this target has a syncer: Some(true) once
    /// the store holds every write acknowledged so far.
    async fn sync_barrier(&self) -> Option<bool> {
        match self {
            Target::Nbd {
                syncer: Some(s), ..
            } => Some(s.sync(Duration::from_secs(30)).await.unwrap_or(false)),
            _ => None,
        }
    }

    /// Read every block of a disk of `nblocks` blocks.
    pub async fn read_all(&self, nblocks: u64) -> io::Result<Vec<Seen>> {
        const CHUNK: u64 = 64;
        let mut out = Vec::with_capacity(nblocks as usize);
        let mut b = 0;
        while b < nblocks {
            let n = CHUNK.min(nblocks - b);
            let mut attempt = 0;
            let data = loop {
                let r = tokio::time::timeout(
                    OP_TIMEOUT,
                    self.read(0, b * BLOCK as u64, n * BLOCK as u64),
                )
                .await
                .map_err(|_| io::Error::other("read hung"))?;
                match r {
                    Ok(d) => break d,
                    // Retry only when told to (diagnosis aid; see the crate docs).
                    Err(_) if attempt < 3 && tolerate_read_errors() => {
                        attempt += 1;
                        TRANSIENT_READ_ERRORS.fetch_add(1, Ordering::Relaxed);
                        let_ms_pass(200).await;
                    }
                    Err(e) => {
                        let map = match self {
                            Target::Vol(v) => {
                                let lo = b * (BLOCK as u64 / 512);
                                let hi = lo + n * (BLOCK as u64 / 512);
                                let m: Vec<_> = v
                                    .store_map_snapshot()
                                    .into_iter()
                                    .filter(|&(l, s, _, _)| l < hi && lo < l + s)
                                    .collect();
                                format!(
                                    "; store map there (lba, sectors, object, offset): {m:?}; {:?}",
                                    v.status()
                                )
                            }
                            Target::Nbd { .. } => String::new(),
                        };
                        return Err(io::Error::new(
                            e.kind(),
                            format!("blocks {b}..{}: {e} (after {attempt} retries){map}", b + n),
                        ));
                    }
                }
            };
            for (i, chunk) in data.chunks(BLOCK).enumerate() {
                out.push(stamp::decode(b + i as u64, chunk));
            }
            b += n;
        }
        Ok(out)
    }
}

/// Reads that failed and were retried (only with `LSVD_ORACLE_TOLERATE_READ_ERRORS`).
pub static TRANSIENT_READ_ERRORS: AtomicU64 = AtomicU64::new(0);

/// `LSVD_ORACLE_TOLERATE_READ_ERRORS=1` retries failed reads of the recovered disk
/// instead of reporting them (to look past one bug while hunting another).
fn tolerate_read_errors() -> bool {
    std::env::var("LSVD_ORACLE_TOLERATE_READ_ERRORS").is_ok_and(|v| v == "1")
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub seed: u64,
    pub nblocks: u64,
    pub workers: usize,
    /// Stop issuing after this many operations.
    pub max_ops: u64,
    /// Crash (call the crash hook) when this many operations have been acknowledged.
    pub crash_after_acks: Option<u64>,
    /// Most operations land in blocks `0..hot_blocks` (overwrites).
    pub hot_blocks: u64,
    pub max_write_blocks: u64,
    pub p_flush: f64,
    pub p_fua: f64,
    pub p_trim: f64,
    pub p_write_zeroes: f64,
    pub p_read: f64,
    /// Store barriers to run at random points.
    pub store_barriers: u32,
}

impl Spec {
    pub fn random(rng: &mut Rng, nblocks: u64) -> Spec {
        let max_ops = rng.range(200, 2500);
        Spec {
            seed: rng.next_u64(),
            nblocks,
            workers: *rng.pick(&[4, 8, 16, 32]),
            max_ops,
            crash_after_acks: if rng.chance(0.85) {
                Some(rng.range(1, max_ops))
            } else {
                None
            },
            hot_blocks: (nblocks / *rng.pick(&[2, 8, 32])).max(64),
            max_write_blocks: *rng.pick(&[1, 4, 16, 64]),
            p_flush: *rng.pick(&[0.01, 0.05, 0.15]),
            p_fua: *rng.pick(&[0.0, 0.02, 0.1]),
            p_trim: *rng.pick(&[0.0, 0.05, 0.15]),
            p_write_zeroes: *rng.pick(&[0.0, 0.03]),
            p_read: *rng.pick(&[0.0, 0.05, 0.2]),
            store_barriers: 0,
        }
    }
}

/// Shared run state.
#[derive(Default)]
pub struct Control {
    pub issued: AtomicU64,
    pub acked: AtomicU64,
    pub inflight: AtomicUsize,
    pub paused: AtomicBool,
    pub stop: AtomicBool,
    /// The crash hook has run.
    pub crashed: AtomicBool,
    pub hangs: Mutex<Vec<String>>,
    pub barriers_ok: AtomicU64,
    pub barriers_failed: AtomicU64,
    /// A tick of the history's clock (0: none): every successful answer the workload
    /// gets later is listed in `late_successes`. Set just before a paused holder is
    /// resumed after a takeover (the workload issues nothing after a crash, so these
    /// are requests sent before the pause).
    pub fence_mark: AtomicU64,
    pub late_successes: Mutex<Vec<String>>,
}

impl Control {
    /// Waits until `point` requests were acknowledged (true), or the run stops or
    /// `crashed()` says the disk crashed first (false).
    pub async fn wait_for_acks(&self, point: u64, crashed: impl Fn() -> bool) -> bool {
        let reached = || self.acked.load(Ordering::SeqCst) >= point;
        let stopped = || self.stop.load(Ordering::SeqCst) || crashed();
        wait_every_async(Duration::from_millis(2), NO_LIMIT, || {
            reached() || stopped()
        })
        .await;
        reached()
    }
}

pub struct Hooks {
    /// Crash the disk now (kill the process, fail the device...). Called at most once.
    pub crash: Box<dyn Fn() + Send + Sync>,
    /// Has the environment crashed on its own (an armed device failure)? Errors after
    /// that are expected.
    pub env_crashed: Box<dyn Fn() -> bool + Send + Sync>,
    /// What the disk says about itself, for hang reports.
    pub diag: Box<dyn Fn() -> String + Send + Sync>,
}

impl Hooks {
    /// The hooks for an `lsvd serve` process: `crash` (a signal to it) is the only way
    /// it crashes, and it has nothing to say about itself in hang reports.
    pub fn server_process(crash: impl Fn() + Send + Sync + 'static) -> Hooks {
        Hooks {
            crash: Box::new(crash),
            env_crashed: Box::new(|| false),
            diag: Box::new(|| "(a server process)".to_string()),
        }
    }
}

struct Shared {
    target: Target,
    spec: Spec,
    hist: Arc<History>,
    ids: Arc<AtomicU64>,
    ctl: Arc<Control>,
    hooks: Hooks,
    busy: Mutex<Vec<bool>>,
}

impl Shared {
    fn crashed(&self) -> bool {
        self.ctl.crashed.load(Ordering::SeqCst) || (self.hooks.env_crashed)()
    }

    fn crash_now(&self) {
        if !self.ctl.crashed.swap(true, Ordering::SeqCst) {
            (self.hooks.crash)();
        }
        self.ctl.stop.store(true, Ordering::SeqCst);
    }

    fn try_lock(&self, first: u64, n: u64) -> bool {
        let mut b = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let r = first as usize..(first + n) as usize;
        if b[r.clone()].iter().any(|&x| x) {
            return false;
        }
        b[r].iter_mut().for_each(|x| *x = true);
        true
    }

    fn unlock(&self, first: u64, n: u64) {
        let mut b = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        b[first as usize..(first + n) as usize]
            .iter_mut()
            .for_each(|x| *x = false);
    }

    /// A successful answer came at tick `t`: list it if that is after the fence mark.
    fn answered(&self, t: u64, what: impl FnOnce() -> String) {
        let mark = self.ctl.fence_mark.load(Ordering::SeqCst);
        if mark != 0 && t > mark {
            self.ctl
                .late_successes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("{} (answered t={t}, resumed t={mark})", what()));
        }
    }

    fn failed(&self, what: String) {
        if !self.crashed() {
            // What the disk was doing when it failed (for an in-process volume, its
            // pipeline too): a stalled write then says what it waited for.
            self.hist
                .unexpected_error(format!("{what}; disk: {}", (self.hooks.diag)()));
        }
        self.ctl.stop.store(true, Ordering::SeqCst);
    }
}

/// What happened.
#[derive(Debug, Default)]
pub struct RunOutcome {
    pub issued: u64,
    pub acked: u64,
    pub crashed: bool,
    pub hangs: Vec<String>,
    pub barriers_ok: u64,
    pub barriers_failed: u64,
}

impl RunOutcome {
    /// Adds the run's operations and store barriers to the episode's statistics.
    pub fn count(&self, stats: &super::Stats) {
        stats.add("ops_issued", self.issued);
        stats.add("ops_acked", self.acked);
        stats.add("store_points", self.barriers_ok);
        stats.add("store_barriers_timed_out", self.barriers_failed);
    }

    /// The run in one line, for an episode's notes.
    pub fn summary(&self) -> String {
        format!(
            "run: {} issued, {} acked, crashed by the ack trigger: {}",
            self.issued, self.acked, self.crashed
        )
    }
}

/// Run the workload until it has issued `max_ops` operations or crashed. The crash hook
/// runs when `crash_after_acks` operations have been acknowledged. `extra` tasks (fault
/// injectors) run alongside and are aborted at the end.
pub async fn run(
    target: Target,
    spec: Spec,
    hist: Arc<History>,
    ids: Arc<AtomicU64>,
    hooks: Hooks,
    ctl: Arc<Control>,
) -> RunOutcome {
    let shared = Arc::new(Shared {
        busy: Mutex::new(vec![false; spec.nblocks as usize]),
        target,
        spec: spec.clone(),
        hist,
        ids,
        ctl: ctl.clone(),
        hooks,
    });
    let mut rng = Rng::new(spec.seed);
    let mut tasks = Vec::new();
    for w in 0..spec.workers {
        let s = shared.clone();
        let r = rng.fork();
        tasks.push(tokio::spawn(async move { worker(s, w, r).await }));
    }
    let barrier_task = (spec.store_barriers > 0).then(|| {
        let s = shared.clone();
        let r = rng.fork();
        tokio::spawn(async move { barriers(s, r).await })
    });
    for t in tasks {
        let _ = t.await;
    }
    if let Some(b) = barrier_task {
        // Workers are done; a barrier waiting for work to resume would wait forever.
        shared.ctl.stop.store(true, Ordering::SeqCst);
        let _ = b.await;
    }
    let hangs = ctl.hangs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    RunOutcome {
        issued: ctl.issued.load(Ordering::SeqCst),
        acked: ctl.acked.load(Ordering::SeqCst),
        crashed: ctl.crashed.load(Ordering::SeqCst),
        hangs,
        barriers_ok: ctl.barriers_ok.load(Ordering::SeqCst),
        barriers_failed: ctl.barriers_failed.load(Ordering::SeqCst),
    }
}

enum Action {
    Write { fua: bool },
    Zero(OpKind),
    Flush,
    Read,
}

fn choose(spec: &Spec, rng: &mut Rng) -> Action {
    let x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut acc = spec.p_flush;
    if x < acc {
        return Action::Flush;
    }
    acc += spec.p_trim;
    if x < acc {
        return Action::Zero(OpKind::Trim);
    }
    acc += spec.p_write_zeroes;
    if x < acc {
        return Action::Zero(OpKind::WriteZeroes);
    }
    acc += spec.p_read;
    if x < acc {
        return Action::Read;
    }
    Action::Write {
        fua: rng.chance(spec.p_fua),
    }
}

fn pick_range(spec: &Spec, rng: &mut Rng, max_blocks: u64) -> (u64, u64) {
    let region = if rng.chance(0.7) {
        spec.hot_blocks.min(spec.nblocks)
    } else {
        spec.nblocks
    };
    // Small requests are common, large ones rare.
    let cap = 1u64 << rng.below(64 - max_blocks.max(1).leading_zeros() as u64);
    let n = rng.range(1, cap.min(max_blocks).max(1)).min(region);
    let first = rng.below(region - n + 1);
    (first, n)
}

async fn timed<T>(
    s: &Shared,
    what: &str,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> Option<io::Result<T>> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => Some(r),
        Err(_) => {
            s.ctl
                .hangs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!(
                    "{what} did not complete within {}s (crashed: {}); disk: {}",
                    OP_TIMEOUT.as_secs(),
                    s.crashed(),
                    (s.hooks.diag)()
                ));
            s.ctl.stop.store(true, Ordering::SeqCst);
            None
        }
    }
}

async fn worker(s: Arc<Shared>, w: usize, mut rng: Rng) {
    let ctl = &s.ctl;
    let mut while_paused = Poller::new(Duration::from_millis(2), NO_LIMIT);
    loop {
        if ctl.stop.load(Ordering::SeqCst) || s.crashed() {
            return;
        }
        ctl.inflight.fetch_add(1, Ordering::SeqCst);
        if ctl.paused.load(Ordering::SeqCst) {
            ctl.inflight.fetch_sub(1, Ordering::SeqCst);
            while_paused.tick().await;
            continue;
        }
        if ctl.issued.fetch_add(1, Ordering::SeqCst) >= s.spec.max_ops {
            ctl.inflight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let keep_going = one_op(&s, w, &mut rng).await;
        ctl.inflight.fetch_sub(1, Ordering::SeqCst);
        if !keep_going {
            return;
        }
    }
}

/// Note an acknowledgement; crash if it is the chosen one.
fn acked(s: &Shared) {
    let n = s.ctl.acked.fetch_add(1, Ordering::SeqCst) + 1;
    if s.spec.crash_after_acks == Some(n) {
        s.crash_now();
    }
}

/// Records the outcome of a write or zero (history entry `i`): an answer counts as
/// acknowledged (`ok_line` describes it), an error fails the run (`request` names it).
/// Returns whether the worker goes on.
fn settle(
    s: &Shared,
    i: usize,
    r: io::Result<()>,
    request: &str,
    ok_line: impl FnOnce() -> String,
) -> bool {
    let t = s.hist.end_op(i, r.is_ok());
    match r {
        Ok(()) => {
            s.answered(t, ok_line);
            acked(s);
            true
        }
        Err(e) => {
            s.failed(format!("{request}: {e}"));
            false
        }
    }
}

/// One operation. Returns false when the worker should stop.
async fn one_op(s: &Shared, w: usize, rng: &mut Rng) -> bool {
    let spec = &s.spec;
    let action = choose(spec, rng);
    if let Action::Flush = action {
        let i = s.hist.begin_flush();
        let Some(r) = timed(s, "FLUSH", s.target.flush(w)).await else {
            return false;
        };
        let t = s.hist.end_flush(i, r.is_ok());
        return match r {
            Ok(()) => {
                s.answered(t, || "FLUSH succeeded".to_string());
                acked(s);
                true
            }
            Err(e) => {
                s.failed(format!("FLUSH: {e}"));
                false
            }
        };
    }
    let max_blocks = match action {
        Action::Write { .. } => spec.max_write_blocks,
        Action::Read => 64,
        _ => 32,
    };
    let (first, n) = loop {
        let (first, n) = pick_range(spec, rng, max_blocks);
        if s.try_lock(first, n) {
            break (first, n);
        }
        tokio::task::yield_now().await;
        if s.ctl.stop.load(Ordering::SeqCst) {
            return false;
        }
    };
    let offset = first * BLOCK as u64;
    let len = n * BLOCK as u64;
    let keep_going = match action {
        Action::Read => {
            let expect = s.hist.latest(first, n);
            let Some(r) = timed(s, "READ", s.target.read(w, offset, len)).await else {
                s.unlock(first, n);
                return false;
            };
            match r {
                Ok(data) => {
                    let t = s.hist.now();
                    s.answered(t, || {
                        format!("READ blocks {first}..{} succeeded", first + n)
                    });
                    if !s.crashed() {
                        for (i, chunk) in data.chunks(BLOCK).enumerate() {
                            let b = first + i as u64;
                            let got = stamp::decode(b, chunk);
                            let ok = match expect[i] {
                                None => true,
                                Some(Content::Zero) => got == Seen::Zero,
                                Some(Content::Write(id)) => got == Seen::Write(id),
                            };
                            if !ok {
                                s.hist.read_mismatch(format!(
                                    "block {b}: expected {:?}, read {got:?}",
                                    expect[i]
                                ));
                            }
                        }
                    }
                    true
                }
                Err(_) if tolerate_read_errors() && !s.crashed() => {
                    TRANSIENT_READ_ERRORS.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    s.failed(format!("READ blocks {first}..{}: {e}", first + n));
                    false
                }
            }
        }
        Action::Write { fua } => {
            let id = s.ids.fetch_add(1, Ordering::SeqCst);
            let data = stamp::write_data(first, n, id);
            let i = s.hist.begin_op(id, OpKind::Write, fua, first, n);
            let Some(r) = timed(s, "WRITE", s.target.write(w, offset, data, fua)).await else {
                s.unlock(first, n);
                return false;
            };
            let request = format!("WRITE #{id} blocks {first}..{}", first + n);
            settle(s, i, r, &request, || {
                let f = if fua { "+FUA" } else { "" };
                format!(
                    "WRITE{f} #{id} blocks {first}..{} (issued t={}) succeeded",
                    first + n,
                    s.hist.issued_at(i)
                )
            })
        }
        Action::Zero(kind) => {
            let fua = rng.chance(spec.p_fua);
            let id = s.ids.fetch_add(1, Ordering::SeqCst);
            let i = s.hist.begin_op(id, kind, fua, first, n);
            let Some(r) = timed(s, "TRIM", s.target.zero(w, offset, len, kind, fua)).await else {
                s.unlock(first, n);
                return false;
            };
            let request = format!("{kind:?} #{id} blocks {first}..{}", first + n);
            settle(s, i, r, &request, || format!("{request} succeeded"))
        }
        Action::Flush => true,
    };
    s.unlock(first, n);
    keep_going
}

/// Store barriers at random moments: quiesce, FLUSH, wait for the store to hold
/// everything, record the point, resume.
async fn barriers(s: Arc<Shared>, mut rng: Rng) {
    let ctl = &s.ctl;
    let horizon = s.spec.crash_after_acks.unwrap_or(s.spec.max_ops).max(2);
    let mut at: Vec<u64> = (0..s.spec.store_barriers)
        .map(|_| rng.below(horizon))
        .collect();
    at.sort_unstable();
    for point in at {
        if !ctl.wait_for_acks(point, || s.crashed()).await {
            return;
        }
        ctl.paused.store(true, Ordering::SeqCst);
        let idle = || ctl.inflight.load(Ordering::SeqCst) == 0;
        if !wait_every_async(Duration::from_millis(1), Duration::from_secs(60), idle).await {
            ctl.hangs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push("operations did not drain for a store barrier".into());
            ctl.stop.store(true, Ordering::SeqCst);
            ctl.paused.store(false, Ordering::SeqCst);
            return;
        }
        if s.crashed() {
            ctl.paused.store(false, Ordering::SeqCst);
            return;
        }
        let i = s.hist.begin_flush();
        let r = timed(&s, "barrier FLUSH", s.target.flush(0)).await;
        let ok = matches!(r, Some(Ok(())));
        let t = s.hist.end_flush(i, ok);
        if ok {
            s.answered(t, || "barrier FLUSH succeeded".to_string());
        }
        if !ok {
            if let Some(Err(e)) = r {
                s.failed(format!("barrier FLUSH: {e}"));
            }
            ctl.paused.store(false, Ordering::SeqCst);
            return;
        }
        let t0 = s.hist.now();
        let mut drained = false;
        let synced = s.target.sync_barrier().await;
        if let Some(ok) = synced {
            drained = ok && !s.crashed();
        }
        // Up to 4 s: long enough for a batch timeout and a few uploads; under store
        // faults a barrier may give up (it is then simply not a store point).
        if synced.is_none() {
            let s = &s;
            let limit = Duration::from_secs(4);
            let every = Duration::from_millis(20);
            drained = poll_every_async(every, limit, || async move {
                if s.target.drained().await {
                    return Some(true);
                }
                s.crashed().then_some(false)
            })
            .await
            .unwrap_or(false);
        }
        if drained {
            s.hist.store_point(t0);
            ctl.barriers_ok.fetch_add(1, Ordering::SeqCst);
        } else {
            ctl.barriers_failed.fetch_add(1, Ordering::SeqCst);
        }
        ctl.paused.store(false, Ordering::SeqCst);
    }
}
