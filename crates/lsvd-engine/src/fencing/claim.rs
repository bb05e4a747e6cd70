//! Claiming a volume while opening it: the new volume superblock generation, taken
//! put-if-absent (in the foreground, or in the background after recovery so a
//! takeover waits out the old lease without holding up the open), the lease task
//! that keeps the claim alive, and how much of a superseded session's write log is
//! in the volume.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::cache_super::CacheSuper;
use lsvd_core::format::volume_super::VolumeSuper;
use lsvd_core::history::History;

use crate::locks::LockRank;
use crate::recovery::store_recovery::{StoreRecovery, settle_store};
use crate::shared::Shared;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// The task renewing the volume's lease, if it keeps one (a snapshot export writes
/// nothing and claims nothing).
pub(crate) fn spawn_lease_task(shared: &Arc<Shared>) -> Option<tokio::task::JoinHandle<()>> {
    (shared.snapshot.is_none() && shared.lease.enabled()).then(|| {
        crate::supervise::spawn(
            shared,
            "lease",
            crate::fencing::lease::renew(shared.clone()),
        )
    })
}

/// The newest record of write log `log` that its session got into the volume's
/// history, when another session has claimed the volume since: the log's records
/// after it were acknowledged by a superseded session and are not in the volume.
///
/// The log says which epoch its records belong to; the history's first segment of a
/// later epoch says where that epoch's part of the history ended (`after_seq`), and
/// that object's header how far in the log it reached. Where the history no longer
/// says (it was pruned past those segments, or the log predates epochs), only a log
/// closed cleanly is known to have uploaded everything; an unclean one counts as
/// superseded from its tail on.
pub(crate) async fn superseded_after(
    store: &DynStore,
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
    log: &CacheSuper,
    history: &History,
    last_in_store: u64,
) -> Result<u64> {
    if log.claimed_epoch != 0
        && let Some(next) = history
            .segments
            .iter()
            .find(|s| s.epoch > log.claimed_epoch)
    {
        if next.after_seq == 0 {
            return Ok(0);
        }
        // The object that ended that part of the history, found by its number.
        let prefix = format!(
            "{}{:016x}",
            crate::keys::objects_prefix(&meta.name),
            next.after_seq
        );
        let listed = store
            .list(&prefix)
            .await
            .map_err(|e| e.context(format!("cannot list {prefix}")))?;
        let want_epoch = history.epoch_of(next.after_seq);
        let found = listed.iter().find(|e| {
            crate::keys::parse_object_name(&e.key)
                .is_some_and(|n| n.seq == next.after_seq && want_epoch.is_none_or(|w| n.epoch == w))
        });
        return match found {
            Some(e) => {
                let header = crate::recovery::store_recovery::read_header(store, &e.key).await?;
                Ok(header.last_record_seq)
            }
            // Collected below a checkpoint since: what it held is in the store, as
            // is every record through the store's end.
            None => Ok(last_in_store),
        };
    }
    if log.clean {
        return Ok(u64::MAX);
    }
    Ok(log.tail_seq.saturating_sub(1).min(last_in_store))
}

/// What the claim writes: generation, epoch, and where its objects are numbered.
pub(crate) struct ClaimPlan {
    pub(crate) generation: u64,
    pub(crate) epoch: u64,
    /// The last sequence number of the recovered history.
    pub(crate) after_seq: u64,
    /// The first sequence number this claim uses.
    pub(crate) first_seq: u64,
}

/// Claim the volume before anything reaches the store: write generation
/// `plan.generation` with a new epoch and the history that says where its objects
/// start, with put-if-absent. Another process that wrote that generation first (the
/// holder renewed, or a second claimant won) makes this a `Conflict`; so does a
/// newer generation found after it (the holder renewed further: this one only filled
/// a deleted number). A store that keeps failing fails the open: without the claim
/// nothing may be answered. Returns the claimed generation.
pub(crate) async fn claim(
    shared: &Arc<Shared>,
    plan: &ClaimPlan,
    mut history: History,
) -> Result<Claim> {
    let name = &shared.meta.name;
    history.claim(plan.epoch, plan.after_seq, plan.first_seq);
    let claimed = {
        let st = shared.lock();
        let store = st.pipeline.store();
        let checkpoints: Vec<u64> = store.checkpoints().keys().copied().collect();
        let previous_checkpoint = checkpoints.iter().rev().nth(1).copied();
        if let Some(from) = previous_checkpoint.or(checkpoints.last().copied()) {
            history.prune(from);
        }
        VolumeSuper {
            volume: shared.meta.volume,
            generation: plan.generation,
            // Random, and the write log's epoch too: the next open tells from it
            // whether this log's session was the volume's last writer.
            session: shared.index_epoch,
            clean: false,
            deleting: false,
            newest_checkpoint: checkpoints.last().copied(),
            previous_checkpoint,
            durable_through: store.whole_next_object_seq(),
            last_record_seq: store.last_record_seq(),
            written_unix_ms: shared.clock().unix_ms(),
            epoch: plan.epoch,
            lease_timeout_ms: shared.lease.timeout_ms,
            holder: shared.config.lease.holder.clone(),
            history,
        }
    };
    *shared.lock_ranked(&shared.volume_super, LockRank::VolumeSuper) = claimed.clone();
    shared.epoch.store(plan.epoch, Ordering::SeqCst);
    let sent_ns = shared.now_ns();
    let sent_unix_ms = shared.clock().unix_ms();
    let conflict = |holder: &str, generation: u64| {
        let who = if holder.is_empty() {
            "another lsvd process"
        } else {
            holder
        };
        Error::new(
            ErrorKind::Conflict,
            format!(
                "volume '{name}' is held by {who} (superblock generation {generation} appeared while this process opened it); refusing to start"
            ),
        )
    };
    // With a lease nothing may be answered before the claim: give the store about 30 s.
    // Without one, a few tries, then the claim goes on in the background.
    let attempts = if shared.lease.enabled() { 12 } else { 3 };
    match crate::fencing::volume_super::write(
        &shared.store,
        name,
        &claimed,
        attempts,
        shared.clock(),
    )
    .await
    {
        Ok(()) => {}
        Err(crate::fencing::volume_super::WriteError::Superseded {
            generation, holder, ..
        }) => return Err(conflict(&holder, generation)),
        // Without a lease nothing waits for the claim but the uploads: serve from the
        // write log now and claim in the background (the engine API's opens, which
        // own their store).
        Err(crate::fencing::volume_super::WriteError::Store(e)) if !shared.lease.enabled() => {
            lsvd_store::log::warn(&format!(
                "cannot write the volume superblock yet ({e}); serving from the write log, uploads wait"
            ));
            return Ok(Claim::InBackground(claimed));
        }
        Err(crate::fencing::volume_super::WriteError::Store(e)) => {
            return Err(e.context(format!("cannot claim volume '{name}'")));
        }
    }
    // A generation above ours means the holder is alive and ours filled a number it
    // had deleted: not a claim.
    let newest = crate::fencing::volume_super::read_newest(&shared.store, &shared.meta).await?;
    if let Some(sb) = newest
        && sb.generation > claimed.generation
    {
        return Err(conflict(&sb.holder, sb.generation));
    }
    shared.lease.extend(sent_ns, sent_unix_ms);
    Ok(Claim::Landed(claimed.generation))
}

/// How [`claim`] went.
pub(crate) enum Claim {
    /// The generation is in the store.
    Landed(u64),
    /// The store is away and the volume keeps no lease: keep trying in the
    /// background ([`claim_in_background`]); uploads and deletes wait for it.
    InBackground(VolumeSuper),
}

/// What follows a claim that landed: the write log's superblock names it, uploads may
/// start, and what is not the history's (stranded objects, a superseded writer's,
/// garbage, older superblock generations) is removed, now that this process holds
/// the volume. Returns the stranded objects deleted.
pub(crate) async fn finish_claim(
    shared: &Arc<Shared>,
    rec: &StoreRecovery,
    generation: u64,
) -> Result<Vec<u64>> {
    shared.volume_claimed.store(true, Ordering::SeqCst);
    // A crash before this leaves the store naming this open's session, which the
    // log knows too (its index epoch).
    let through = shared.lock().log_freeing_through;
    crate::write::log_tail::persist_tail_off_runtime(shared, through, false).await;
    if shared.is_failed() {
        return Err(shared.failed_error());
    }
    let name = &shared.meta.name;
    crate::fencing::volume_super::delete_all_old(&shared.store, name, generation).await;
    let deleted = settle_store(&shared.store, name, rec).await?;
    shared.upload_wake.notify_one();
    Ok(deleted)
}

/// Keep trying to write the open-time superblock generation of a volume without a
/// lease; uploads start when it lands. Fails the volume if another process claimed it
/// meanwhile.
pub(crate) async fn claim_in_background(
    shared: Arc<Shared>,
    claimed: VolumeSuper,
    rec: StoreRecovery,
) {
    use crate::fencing::volume_super::{WriteError, write};
    loop {
        if shared.is_failed() {
            return;
        }
        match write(
            &shared.store,
            &shared.meta.name,
            &claimed,
            12,
            shared.clock(),
        )
        .await
        {
            Ok(()) => {
                lsvd_store::log::info("volume superblock written; uploads resume");
                if let Err(e) = finish_claim(&shared, &rec, claimed.generation).await {
                    shared.fail(&format!("after the claim: {e}"));
                }
                return;
            }
            Err(e @ WriteError::Superseded { .. }) => {
                shared.fail(&e.to_string());
                return;
            }
            Err(WriteError::Store(_)) => {}
        }
    }
}
