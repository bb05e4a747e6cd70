//! One writer per volume across hosts: the lease.
//!
//! Why: the store offers put-if-absent and nothing else, and a process can be paused,
//! partitioned or killed at any moment. Three things together keep one writer:
//!
//! - **The claim** ([`acquire`], then `open::claim`): a process that will change a
//!   volume writes the next volume superblock generation with put-if-absent, with a
//!   new *epoch*, before it deletes or uploads anything. Every object it writes
//!   carries that epoch in its name, so two processes never write the same key, and
//!   recovery takes at each sequence number only the object of the epoch that owns it
//!   (`lsvd_core::history`): what a superseded writer still uploads is never history.
//! - **The lease** ([`renew`]): the holder writes a new generation every third of
//!   its lease timeout. Another process that sees no new generation for a whole
//!   timeout (measured on its own clock, from when it first saw the newest one) may
//!   claim the next generation. Of the two PUTs of that generation, one fails: a holder
//!   that loses it is fenced; a claimant that loses it sees the holder alive.
//! - **Holding acknowledgements** ([`Lease::wait_blocking`]): the holder answers
//!   requests only while its lease is valid: until 90% of the timeout after it *sent*
//!   the renewal that landed, on its monotonic clock and on the wall clock (a host
//!   suspended stops the first). A takeover needs the whole timeout to pass on the
//!   claimant's clock after the last renewal was visible, so by then the holder has
//!   stopped answering. A holder that could not renew in time (paused, partitioned, a
//!   full or refusing store) holds its answers until it renews, and fails them after
//!   the stall timeout; one that finds its next generation taken is fenced: every
//!   request fails, it uploads and deletes nothing more.
//!
//! What the lease cannot give back: writes the holder acknowledged but had not
//! uploaded when it stopped are not in the new holder's volume (the store has only
//! what was uploaded: a takeover after a crash is a recovery from the store alone).
//! A clean stop uploads everything and writes a generation flagged clean, which a
//! waiting standby takes over at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use lsvd_core::format::cache_super::CacheSuper;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;

use crate::fencing::volume_super::{WriteError, read_generation, read_newest};
use crate::keys::{parse_super_name, super_prefix};
use crate::locks::LockRank;
use crate::shared::Shared;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;
use lsvd_store::clock::{Clock, now_ns};

/// Words in the `Conflict` an open fails with when another process claimed the volume
/// (or its holder renewed) between the wait and the claim: a standby waits again.
pub const CLAIM_RACE: &str = "while this process";

pub use crate::fencing::lease_config::{
    DEFAULT_LEASE_POLL_MS, DEFAULT_LEASE_TIMEOUT_MS, LeaseConfig, Takeover, describe_this_process,
};

/// What [`acquire`] found: the generation to claim the volume at.
#[derive(Debug, Clone)]
pub(crate) struct Acquired {
    /// The newest generation, read when the volume was found free to claim (its
    /// holder let go, lapsed, or was this data directory's own).
    pub newest: Option<VolumeSuper>,
    /// The generation the claim writes: one past every generation listed.
    pub claim_generation: u64,
    /// The holder whose lease lapsed, when this is a takeover.
    pub took_over_from: Option<String>,
}

fn holder_name(sb: &VolumeSuper) -> String {
    if sb.holder.is_empty() {
        format!("a process of session {:016x}", sb.session)
    } else {
        sb.holder.clone()
    }
}

/// The newest generation number listed (corrupt ones too: the next claim must go
/// past them).
async fn newest_listed_generation(store: &DynStore, meta: &VolumeMeta) -> Result<u64> {
    let prefix = super_prefix(&meta.name);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    Ok(listing
        .iter()
        .filter_map(|e| parse_super_name(&e.key))
        .max()
        .unwrap_or(0))
}

/// Wait until volume `meta` may be claimed, reading only (nothing in the store
/// changes): at once when nobody holds it (never opened, stopped cleanly), when
/// `own_log` (this data directory's write log, whose lock this process holds) says
/// its last holder was one of its sessions, or under [`Takeover::Immediate`]. Otherwise watch the
/// holder's generations for its lease timeout: one that renews is refused
/// (`Conflict`, naming it) or, under [`Takeover::Wait`], waited for; one that lets go
/// or lapses is taken over.
pub(crate) async fn acquire(
    store: &DynStore,
    meta: &VolumeMeta,
    own_log: Option<CacheSuper>,
    config: &LeaseConfig,
    clock: &dyn Clock,
) -> Result<Acquired> {
    let name = &meta.name;
    let mut said_waiting = false;
    // Looks in which the listing named a generation newer than the newest read.
    let mut newer_listed = 0u32;
    'outer: loop {
        let newest = read_newest(store, meta).await?;
        let listed = newest_listed_generation(store, meta).await?;
        // A generation landed between the read and the listing (another process
        // claimed the volume just now): decide on it, never claim past a generation
        // not looked at (that took over a live server at once). One that stays newer
        // than what reads is corrupt (`read_newest` passes over it): go on past it.
        if listed > newest.as_ref().map_or(0, |s| s.generation) && newer_listed < 10 {
            newer_listed += 1;
            clock.sleep(Duration::from_millis(20)).await;
            continue 'outer;
        }
        let free = |took_over_from| Acquired {
            claim_generation: listed.max(newest.as_ref().map_or(0, |s| s.generation)) + 1,
            newest: newest.clone(),
            took_over_from,
        };
        let Some(sb) = newest.clone() else {
            return Ok(free(None));
        };
        if sb.deleting {
            return Err(crate::fencing::volume_super::being_deleted(name));
        }
        if sb.clean
            || config.takeover == Takeover::Immediate
            || own_log.is_some_and(|log| log.is_own_session(sb.session))
        {
            return Ok(free(None));
        }
        if sb.lease_timeout_ms == 0 {
            // Its holder keeps no lease (a build before leases, or the engine API
            // without one): there is nothing to wait for.
            lsvd_store::log::warn(&format!(
                "volume {name} was last held by {} without a lease and not stopped cleanly; taking it over",
                holder_name(&sb)
            ));
            return Ok(free(Some(holder_name(&sb))));
        }
        // Someone holds it: watch for its renewals for a whole lease timeout.
        let timeout_ms = sb.lease_timeout_ms;
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        let mut current = sb;
        let mut seen_at = clock.now();
        loop {
            clock
                .sleep(Duration::from_millis(config.poll_ms.max(1)))
                .await;
            // Said once the holder is late (a live one renews every third of its
            // timeout), or at once by a standby: a refusal stays one line.
            let late = clock.now().saturating_sub(seen_at) > timeout / 3 + timeout / 10;
            if !said_waiting && (late || config.takeover == Takeover::Wait) {
                let what = match config.takeover {
                    Takeover::Wait => "standing by".to_string(),
                    _ => format!("waiting up to {timeout_ms} ms in all for its lease to lapse"),
                };
                lsvd_store::log::info(&format!(
                    "volume {name} is held by {} (superblock generation {}): {what}",
                    holder_name(&current),
                    current.generation
                ));
                said_waiting = true;
            }
            match read_generation(store, meta, current.generation + 1).await {
                Ok(next) => {
                    if next.clean || next.deleting {
                        continue 'outer;
                    }
                    if config.takeover != Takeover::Wait {
                        return Err(Error::new(
                            ErrorKind::Conflict,
                            format!(
                                "volume '{name}' is served by {} (it renewed its lease just now); refusing to open it. Stop that server first, or run `lsvd serve {name} --standby` to take over when it stops",
                                holder_name(&next)
                            ),
                        ));
                    }
                    current = next;
                    seen_at = clock.now();
                }
                Err(e) if e.is_not_found() => {
                    if clock.now().saturating_sub(seen_at) >= timeout {
                        // Lapsed, unless something newer appeared meanwhile (a
                        // generation we skipped): look again from a fresh listing.
                        let newest_now = newest_listed_generation(store, meta).await?;
                        if newest_now != current.generation {
                            continue 'outer;
                        }
                        lsvd_store::log::warn(&format!(
                            "volume {name}: the lease of {} lapsed (no renewal for {timeout_ms} ms); taking over",
                            holder_name(&current)
                        ));
                        return Ok(Acquired {
                            claim_generation: newest_now + 1,
                            took_over_from: Some(holder_name(&current)),
                            newest: Some(current),
                        });
                    }
                }
                // A corrupt generation: a fresh look decides.
                Err(e) if e.kind == ErrorKind::Corrupt => continue 'outer,
                // The store is away: nobody can claim meanwhile, keep watching.
                Err(e) => {
                    lsvd_store::log::warn(&format!(
                        "volume {name}: cannot read the holder's lease ({e}); still watching"
                    ));
                }
            }
        }
    }
}

/// The lease of an open volume: until when it may answer requests, whether it was
/// fenced, and the counters the metrics show.
#[derive(Debug)]
pub(crate) struct Lease {
    /// 0: no lease (every check passes).
    pub(crate) timeout_ms: u32,
    /// Answers are allowed while the engine clock is below this (nanoseconds) and...
    valid_until_ns: AtomicU64,
    /// ...the wall clock below this (milliseconds since the Unix epoch).
    valid_until_unix_ms: AtomicU64,
    /// Another process took the volume over.
    pub(crate) fenced: AtomicBool,
    /// A clean shutdown is writing the last generation: no more renewals.
    pub(crate) stopping: AtomicBool,
    /// Why the last renewal failed, while renewals fail (what held answers end with).
    last_failure: Mutex<Option<Error>>,
    /// Set while answers wait for a renewal (one log line per episode).
    expired: AtomicBool,
    renewed: Condvar,
    renewed_lock: Mutex<()>,
    pub(crate) renewals: AtomicU64,
    pub(crate) renewal_failures: AtomicU64,
    /// Episodes in which answers waited for a renewal.
    pub(crate) expiries: AtomicU64,
    /// This open took the volume over from a holder whose lease lapsed.
    pub(crate) took_over: AtomicBool,
}

/// Share of the timeout the holder counts its lease valid for after sending the
/// renewal that landed: the rest covers clocks that run at different rates.
const VALID_SHARE_PERCENT: u64 = 90;

impl Lease {
    pub(crate) fn new(timeout_ms: u32) -> Lease {
        Lease {
            timeout_ms,
            valid_until_ns: AtomicU64::new(if timeout_ms == 0 { u64::MAX } else { 0 }),
            valid_until_unix_ms: AtomicU64::new(u64::MAX),
            fenced: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            last_failure: Mutex::new(None),
            expired: AtomicBool::new(false),
            renewed: Condvar::new(),
            renewed_lock: Mutex::new(()),
            renewals: AtomicU64::new(0),
            renewal_failures: AtomicU64::new(0),
            expiries: AtomicU64::new(0),
            took_over: AtomicBool::new(false),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.timeout_ms > 0
    }

    fn valid_share(&self) -> Duration {
        Duration::from_millis(u64::from(self.timeout_ms) * VALID_SHARE_PERCENT / 100)
    }

    /// A generation sent at `sent_ns` / `sent_unix_ms` landed: the lease holds until
    /// 90% of the timeout after that.
    pub(crate) fn extend(&self, sent_ns: u64, sent_unix_ms: u64) {
        if !self.enabled() {
            return;
        }
        let share = self.valid_share();
        self.valid_until_ns.fetch_max(
            sent_ns.saturating_add(share.as_nanos() as u64),
            Ordering::SeqCst,
        );
        self.valid_until_unix_ms.store(
            sent_unix_ms.saturating_add(share.as_millis() as u64),
            Ordering::SeqCst,
        );
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.renewals.fetch_add(1, Ordering::Relaxed);
        let _g = self.renewed_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.renewed.notify_all();
    }

    /// May answers be given now?
    pub(crate) fn is_valid(&self, clock: &dyn Clock) -> bool {
        if !self.enabled() {
            return true;
        }
        !self.fenced.load(Ordering::SeqCst)
            && now_ns(clock) < self.valid_until_ns.load(Ordering::SeqCst)
            && clock.unix_ms() < self.valid_until_unix_ms.load(Ordering::SeqCst)
    }

    /// Is the lease held now (for metrics: 1 held, 0 not)?
    pub fn held(&self, clock: &dyn Clock) -> bool {
        self.enabled() && self.is_valid(clock)
    }

    fn note_failure(&self, e: Error) {
        self.renewal_failures.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    fn wake_all(&self) {
        let _g = self.renewed_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.renewed.notify_all();
    }

    /// The error answers get when the lease could not be renewed within the stall
    /// timeout: the kind of the renewal's failure (ENOSPC for a full store, EIO for the
    /// rest).
    fn stalled(&self, name: &str, waited: Duration) -> Error {
        let why = self
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let kind = match why.as_ref().map(|e| e.kind) {
            Some(ErrorKind::Full) => ErrorKind::Full,
            Some(ErrorKind::Denied) => ErrorKind::Denied,
            _ => ErrorKind::Transient,
        };
        let because = why.map_or_else(String::new, |e| format!(": {e}"));
        Error::new(
            kind,
            format!(
                "volume {name}: the lease could not be renewed for {} ms{because}; not acknowledging",
                waited.as_millis()
            ),
        )
    }
}

impl Shared {
    /// Wait until the lease allows an answer, on this thread (the appender, a
    /// connection thread): at once while it is valid; after a renewal when it lapsed;
    /// the volume's failure once fenced; a stall error after the stall timeout.
    pub(crate) fn lease_wait_blocking(&self) -> Result<()> {
        let Some(started) = self.lease_wait_begin() else {
            return Ok(());
        };
        loop {
            if let Some(answer) = self.lease_wait_over(started) {
                return answer;
            }
            let lease = &self.lease;
            let g = lease.renewed_lock.lock().unwrap_or_else(|p| p.into_inner());
            let _ = lease
                .renewed
                .wait_timeout(g, Duration::from_millis(20))
                .map_err(|_| ());
        }
    }

    /// [`lease_wait_blocking`](Self::lease_wait_blocking) for tasks.
    pub(crate) async fn lease_wait(&self) -> Result<()> {
        let Some(started) = self.lease_wait_begin() else {
            return Ok(());
        };
        loop {
            if let Some(answer) = self.lease_wait_over(started) {
                return answer;
            }
            self.clock().sleep(Duration::from_millis(20)).await;
        }
    }

    /// The start of a wait for the lease (on the clock), noting that it lapsed; None
    /// when it is valid and there is nothing to wait for.
    fn lease_wait_begin(&self) -> Option<Duration> {
        if self.lease.is_valid(self.clock()) {
            return None;
        }
        self.note_lease_expired();
        Some(self.clock().now())
    }

    /// The answer of a wait for the lease begun at `started`, once there is one: the
    /// volume's failure once fenced, Ok once the lease is valid again, a stall error
    /// after the stall timeout; None while it should go on waiting.
    fn lease_wait_over(&self, started: Duration) -> Option<Result<()>> {
        let lease = &self.lease;
        if lease.fenced.load(Ordering::SeqCst) || self.is_failed() {
            return Some(Err(self.failed_error()));
        }
        if lease.is_valid(self.clock()) {
            return Some(Ok(()));
        }
        let waited = self.clock().now().saturating_sub(started);
        let limit = Duration::from_millis(self.config.stall_timeout_ms);
        (waited >= limit).then(|| Err(lease.stalled(&self.meta.name, waited)))
    }

    fn note_lease_expired(&self) {
        if !self.lease.expired.swap(true, Ordering::SeqCst) {
            self.lease.expiries.fetch_add(1, Ordering::Relaxed);
            lsvd_store::log::warn(&format!(
                "volume {}: its lease is not renewed (the store did not take the last renewal in time, or this process was paused); holding acknowledgements until it is",
                self.meta.name
            ));
        }
    }

    /// Another process claimed the volume: fail it (every request gets EIO), upload
    /// and delete nothing more, and say so.
    pub(crate) fn fence(&self, by: &str) {
        self.lease.fenced.store(true, Ordering::SeqCst);
        self.fail(&format!(
            "fenced: {by} took the volume over; this server acknowledges, uploads and deletes nothing more (writes it acknowledged but had not uploaded are not in the volume)"
        ));
        self.lease.wake_all();
    }

    /// [`fence`](Self::fence) for a superblock write that found a generation taken by
    /// `holder` (empty when the other writer did not name itself).
    pub(crate) fn fence_superseded(&self, holder: String) {
        let by = if holder.is_empty() {
            "another lsvd process".to_string()
        } else {
            holder
        };
        self.fence(&by);
    }
}

/// Renew the lease of `shared`'s volume for as long as it is open: a new superblock
/// generation every third of the timeout (sooner after a failure), each extending
/// the lease from when it was sent. Stops when the volume fails, is fenced or shuts
/// down cleanly.
pub(crate) async fn renew(shared: Arc<Shared>) {
    let timeout = Duration::from_millis(u64::from(shared.lease.timeout_ms));
    let interval = timeout / 3;
    let retry = (timeout / 20).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut failures_in_a_row = 0u32;
    loop {
        let wait = if failures_in_a_row == 0 {
            interval
        } else {
            retry
        };
        shared.clock().sleep(wait).await;
        if shared.is_failed() || shared.lease.stopping.load(Ordering::SeqCst) {
            return;
        }
        shared.panic_point("lease");
        match renew_once(&shared).await {
            Ok(true) => {
                if failures_in_a_row > 0 {
                    lsvd_store::log::info(&format!(
                        "volume {}: lease renewed again after {failures_in_a_row} failed attempts",
                        shared.meta.name
                    ));
                }
                failures_in_a_row = 0;
                shared.lease.expired.store(false, Ordering::SeqCst);
            }
            Ok(false) => return,
            Err(e) => {
                failures_in_a_row += 1;
                if failures_in_a_row == 1 || failures_in_a_row.is_multiple_of(20) {
                    lsvd_store::log::warn(&format!(
                        "volume {}: lease renewal failed ({failures_in_a_row} in a row), retrying: {e}",
                        shared.meta.name
                    ));
                }
                shared.lease.note_failure(e);
            }
        }
    }
}

/// Write the next generation (the same content, a new number and time). Ok(false):
/// stop renewing (fenced, failed, or a clean shutdown took over).
async fn renew_once(shared: &Arc<Shared>) -> Result<bool> {
    let _serial = shared.volume_super_writes.lock().await;
    if shared.is_failed() || shared.lease.stopping.load(Ordering::SeqCst) {
        return Ok(false);
    }
    let next = {
        let last = shared
            .lock_ranked(&shared.volume_super, LockRank::VolumeSuper)
            .clone();
        VolumeSuper {
            generation: last.generation + 1,
            written_unix_ms: shared.clock().unix_ms(),
            ..last
        }
    };
    let sent_ns = shared.now_ns();
    let sent_unix_ms = shared.clock().unix_ms();
    match crate::fencing::volume_super::write(
        &shared.store,
        &shared.meta.name,
        &next,
        1,
        shared.clock(),
    )
    .await
    {
        Ok(()) => {
            if let Some(by) = crate::fencing::volume_super::newer_than(
                &shared.store,
                &shared.meta,
                next.generation,
            )
            .await?
            {
                shared.fence(&by);
                return Ok(false);
            }
            *shared.lock_ranked(&shared.volume_super, LockRank::VolumeSuper) = next;
            shared.lease.extend(sent_ns, sent_unix_ms);
            Ok(true)
        }
        Err(WriteError::Superseded { holder, .. }) => {
            shared.fence_superseded(holder);
            Ok(false)
        }
        Err(WriteError::Store(e)) => Err(e),
    }
}
