//! `lsvd replicate`: copy a volume (metadata, objects, checkpoints, snapshots) into
//! another store, so that the copy is always a state the source really had: the
//! source's history (`lsvd_core::history`) up to some object, never a mix of two
//! points and never an object the history does not hold.
//!
//! Why this is safe to do lazily and out of order: objects are immutable and named by
//! sequence number and epoch, and recovery (`store_recovery`) rebuilds a volume from
//! its newest usable checkpoint plus the *consecutive* run of the history's objects
//! after it (the epoch that owns each number, stopping at the first gap, write-log
//! records continuing object to object). So a replica whose objects arrive in any
//! order is, at every moment, the source as of the last object of that run: a prefix.
//! What must be ordered is what tells recovery where to start:
//!
//! 1. register the pass in the source store (its status record names the checkpoint
//!    it copies from: the serving engine's GC keeps what the pass needs for a bounded
//!    time, `engine::replica_hold`);
//! 2. data and GC objects (in any order, several at a time, resuming past those
//!    already copied);
//! 3. then checkpoints, oldest first, each only once every object it lists is there
//!    (recovery starts from the newest checkpoint it finds);
//! 4. then snapshot records (each after the objects it keeps);
//! 5. then, after checking that the replica recovers, with no violation, to at least
//!    what the source's newest volume superblock promises, and that no claim of the
//!    source since took what the replica recovers out of the history, that
//!    superblock generation, verbatim;
//! 6. the metadata, on the first pass (until then the replica is not a volume);
//! 7. last, objects the source deleted and the replica no longer needs.
//!
//! An object counts as copied by its identity, never its size: the replica's object
//! of that name must begin with the same bytes as the source's, through the header
//! CRC (which covers the chunk CRCs, so the whole content). One that differs (a
//! number used twice before epochs, a copy someone else wrote) is replaced. Identities
//! verified once are remembered for the run ([`ReplicateRun`]), so `--follow` reads
//! no header twice.
//!
//! One pass copies what the source listed when it began. The source keeps running;
//! an object that vanishes mid-pass anyway (the hold ran out, the source restarted
//! and removed what was not its history) restarts the pass from a new listing.
//! `--follow` runs passes in a loop.
//!
//! An encrypted volume replicates without its key: its objects are then copied sealed,
//! as stored, checked by envelope, name and size (`get_verified`); what a sealed
//! checkpoint lists is taken to be every object below it (`listed_objects`), and the
//! replica is checked by name before the superblock is copied (`Recovered::by_name`:
//! the checkpoint, then the history's run after it without a gap), since it cannot be
//! recovered. With the key both stores seal, and a pass is a plain volume's.
//!
//! The replica is never written by anything else: a superblock generation there that
//! the source did not write (someone served the replica) stops replication with
//! `Conflict`.

mod copy;
mod guard;
mod identity;
mod plan;
mod status;

pub use identity::ReplicateRun;
pub use status::{replica_of, replica_statuses};

use copy::{
    copy_key, copy_objects, copy_snapshot_records, copy_superblock, delete_gone_snapshots,
    get_verified, put_object,
};
use guard::{check_not_served, check_parent_replicated, check_target_identity, ensure_distinct};
use identity::{Identity, same_object};
use plan::{listed_objects, plan_pass};
#[cfg(test)]
pub(crate) use status::unfinished_status;
use status::{mark_replica_pass, record_pass, record_status, status_bytes};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use lsvd_core::format::object::ObjectKind;
use lsvd_core::format::replica_status::PassInProgress;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::{VolumeSuper, decode_volume_super};
use lsvd_core::history::Owner;

use crate::fencing::volume_super::read_newest;
use crate::keys::{
    keys_key, meta_key, object_key, objects_prefix, parse_object_name, replica_of_key,
    settings_key, super_key,
};
use crate::lifecycle::lineage::{clones_prefix, load_lineage, parent_key};
use crate::recovery::store_recovery::recover_store_as_of;
use crate::store_meta::read_meta;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::{DynStore, PutMode};

/// How many times a pass starts again because the source changed under it. With the
/// source's GC keeping what a registered pass needs, a pass starts again only when
/// the source restarted meanwhile (or the hold ran out, or could not be registered).
const MAX_ATTEMPTS: u32 = 20;

/// How many times registering a pass reads the newest superblock again when a
/// checkpoint was named meanwhile.
const REGISTER_ATTEMPTS: u32 = 4;

/// Counters a pass updates as it copies (shared with a progress display).
#[derive(Debug, Default)]
pub struct ReplicateProgress {
    pub objects_total: AtomicU64,
    pub objects_done: AtomicU64,
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
}

/// How a pass runs.
#[derive(Debug, Clone)]
pub struct ReplicateOptions {
    /// Objects copied (or compared) at the same time (each held in memory whole while
    /// copied).
    pub jobs: usize,
}

impl Default for ReplicateOptions {
    fn default() -> Self {
        ReplicateOptions { jobs: 4 }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PassReport {
    pub objects_copied: u64,
    pub bytes_copied: u64,
    /// Needed objects the replica already had (an interrupted pass resumed, or an
    /// earlier pass copied them).
    pub objects_present: u64,
    /// Objects (checkpoints too) the replica held under the same name with other
    /// bytes: replaced by the source's.
    pub objects_replaced: u64,
    /// Objects (checkpoints too) present in the replica whose identity this pass read
    /// and compared (those verified earlier in the run are not read again).
    pub identities_checked: u64,
    pub checkpoints_copied: u64,
    pub snapshots_copied: u64,
    pub snapshots_deleted: u64,
    /// Objects deleted from the replica because the source deleted them.
    pub objects_deleted: u64,
    /// The source superblock generation the replica now carries.
    pub generation: Option<u64>,
    /// The replica recovers every object below this sequence number.
    pub replica_next_seq: u64,
    /// The source's newest listed object, plus one, when the pass began.
    pub source_next_seq: u64,
    /// The source checkpoint the pass copied from (sequence number, epoch).
    pub checkpoint: Option<(u64, u64)>,
    /// Times the pass started again because the source changed under it.
    pub restarts: u32,
    /// Whether the source store took the pass's registration (its GC then keeps what
    /// the pass needs).
    pub registered: bool,
}

/// The pass met a source that changed under it (an object GC deleted): start again.
struct Raced(String);

enum PassError {
    Raced(Raced),
    Failed(Error),
}

impl From<Error> for PassError {
    fn from(e: Error) -> Self {
        PassError::Failed(e)
    }
}

fn raced(why: String) -> PassError {
    PassError::Raced(Raced(why))
}

/// Copy volume `name` from `source` into `target` once (see the module doc), with
/// nothing remembered from earlier passes. Errors as [`replicate_pass`].
pub async fn replicate_once(
    source: &DynStore,
    target: &DynStore,
    name: &str,
    options: &ReplicateOptions,
    progress: &ReplicateProgress,
) -> Result<PassReport> {
    let run = ReplicateRun::default();
    replicate_pass(source, target, name, options, &run, progress).await
}

/// One pass of `run` (one `lsvd replicate`, or every pass of `--follow`). Errors:
/// `NotFound` (no such volume), `Conflict` (the target holds another volume of that
/// name, or the replica was written by someone else), `BadInput` (a clone whose parent
/// is not replicated yet), `Corrupt` (a source object fails its checks), `Transient`
/// (the source kept changing), or a store error's kind.
pub async fn replicate_pass(
    source: &DynStore,
    target: &DynStore,
    name: &str,
    options: &ReplicateOptions,
    run: &ReplicateRun,
    progress: &ReplicateProgress,
) -> Result<PassReport> {
    ensure_distinct(source, target).await?;
    let started_unix_ms = lsvd_store::clock::unix_ms_now();
    let mut last_race = String::new();
    let mut registered = false;
    let mut outcome = None;
    for attempt in 0..MAX_ATTEMPTS {
        let job = Job {
            source,
            target,
            name,
            options,
            run,
            progress,
            started_unix_ms,
        };
        let result = pass(&job, &mut registered).await;
        match result {
            Ok(mut report) => {
                report.restarts = attempt;
                let meta = read_meta(source, name).await?;
                record_status(source, target, &meta, &report, started_unix_ms).await;
                return Ok(report);
            }
            Err(PassError::Failed(e)) => {
                outcome = Some(e);
                break;
            }
            Err(PassError::Raced(Raced(why))) => {
                lsvd_store::log::info(&format!("replicate {name}: {why}; starting the pass again"));
                last_race = why;
            }
        }
    }
    // No pass under way any more: the source need not keep anything for it.
    if registered && let Ok(meta) = read_meta(source, name).await {
        record_pass(source, target, &meta, None).await;
    }
    Err(outcome.unwrap_or_else(|| {
        Error::new(
            ErrorKind::Transient,
            format!(
                "volume '{name}' changed under the copy {MAX_ATTEMPTS} times (last: {last_race}); try again"
            ),
        )
    }))
}

/// Objects of one listing: (sequence number, epoch) → (kind, size in bytes).
type Listing = BTreeMap<(u64, u64), (ObjectKind, u64)>;

async fn list_objects(store: &DynStore, name: &str) -> Result<Listing> {
    let listing = store.list(&objects_prefix(name)).await.map_err(|e| {
        e.context(format!(
            "cannot list objects of '{name}' in {}",
            store.describe()
        ))
    })?;
    Ok(listing
        .iter()
        .filter_map(|e| {
            parse_object_name(&e.key).map(|n| ((n.seq, n.epoch), (n.kind, e.size_bytes)))
        })
        .collect())
}

/// The checkpoint a pass from `sb` copies from, as (sequence number, epoch).
fn base_of(sb: &VolumeSuper) -> Option<(u64, u64)> {
    sb.newest_checkpoint
        .map(|c| (c, sb.history.epoch_of(c).unwrap_or(0)))
}

/// The source's newest superblock generation and its bytes, read at once: the pass
/// puts those bytes in the replica at its end, by which time the source has long
/// deleted the generation (it keeps a few, and writes one at every checkpoint and
/// lease renewal).
async fn newest_verbatim(
    source: &DynStore,
    meta: &VolumeMeta,
) -> std::result::Result<Option<(VolumeSuper, Bytes)>, PassError> {
    for _ in 0..REGISTER_ATTEMPTS {
        let Some(sb) = read_newest(source, meta).await? else {
            return Ok(None);
        };
        let key = super_key(&meta.name, sb.generation);
        match source.get(&key).await {
            Ok(bytes) if decode_volume_super(&bytes).is_ok_and(|d| d == sb) => {
                return Ok(Some((sb, Bytes::from(bytes))));
            }
            Ok(_) => {
                return Err(PassError::Failed(Error::new(
                    ErrorKind::Corrupt,
                    format!("{key} changed while it was read"),
                )));
            }
            Err(e) if e.is_not_found() => continue, // a newer one landed meanwhile
            Err(e) => return Err(PassError::Failed(e.context(format!("reading {key}")))),
        }
    }
    Err(raced(format!(
        "the newest superblock generation of '{}' was deleted each time it was read",
        meta.name
    )))
}

/// What a pass copies from: the source's newest superblock generation (with its
/// bytes) and its listing, the pass registered in between.
struct Start {
    newest: Option<(VolumeSuper, Bytes)>,
    src: Listing,
    /// The source store took the registration.
    registered: bool,
}

/// Read the newest superblock generation, list the source's objects, and register
/// the pass in the source store (the checkpoint it copies from, the end of the
/// listing); then read the newest generation again: if it still names that
/// checkpoint, no checkpoint was named since, so nothing the pass needs was deleted
/// and every later checkpoint's deletes see the registration
/// (`engine::replica_hold`). Otherwise start over (a few times; then go on, and
/// should something vanish, the pass starts again).
async fn register_and_list(
    source: &DynStore,
    target: &DynStore,
    meta: &VolumeMeta,
    registered: &mut bool,
) -> std::result::Result<Start, PassError> {
    let mut last = None;
    for _ in 0..REGISTER_ATTEMPTS {
        let newest = newest_verbatim(source, meta).await?;
        let src = list_objects(source, &meta.name).await?;
        let Some((sb, _)) = &newest else {
            return Ok(Start {
                newest,
                src,
                registered: false,
            });
        };
        let base = base_of(sb);
        let pass = PassInProgress {
            started_unix_ms: lsvd_store::clock::unix_ms_now().max(1),
            checkpoint: base,
            through_seq: src.keys().next_back().map_or(0, |s| s.0 + 1),
        };
        if !record_pass(source, target, meta, Some(pass)).await {
            return Ok(Start {
                newest,
                src,
                registered: false,
            });
        }
        *registered = true;
        let again = read_newest(source, meta).await?;
        let start = Start {
            newest,
            src,
            registered: true,
        };
        if again.as_ref().is_none_or(|a| base_of(a) == base) {
            return Ok(start);
        }
        last = Some(start);
    }
    // Checkpoints kept coming: go on with the last listing.
    last.ok_or_else(|| raced("no registration attempt".to_string()))
}

/// A claim of the source since `sb` (a restart, a takeover) may have taken objects
/// that the replica recovers out of the history: an upload that landed after its
/// writer died, past what the claim recovered. The numbers the replica recovers
/// (after its checkpoint `base`, below `next`) must have the same owner in `now`,
/// the source's newest superblock. A replica that showed such an object would hold a
/// state the source never had.
fn check_still_history(
    sb: &VolumeSuper,
    now: &VolumeSuper,
    base: Option<u64>,
    next: u64,
) -> std::result::Result<(), String> {
    if now.epoch == sb.epoch {
        return Ok(()); // no claim since: the history only grew
    }
    let mut seq = base.map_or(1, |c| c + 1);
    while seq < next {
        match sb.history.owner(seq) {
            Owner::Hole { resumes_at } => {
                seq = resumes_at;
                continue;
            }
            Owner::Unknown => {}
            Owner::Epoch(e) => {
                let owner = now.history.owner(seq);
                if owner != Owner::Epoch(e) {
                    return Err(format!(
                        "the source was claimed again (epoch {}) while the pass ran, and object {seq:016x} of epoch {e}, which the copy recovers, is not its history's any more ({owner:?})",
                        now.epoch
                    ));
                }
            }
        }
        seq += 1;
    }
    Ok(())
}

/// What one pass works with.
struct Job<'a> {
    source: &'a DynStore,
    target: &'a DynStore,
    name: &'a str,
    options: &'a ReplicateOptions,
    run: &'a ReplicateRun,
    progress: &'a ReplicateProgress,
    /// When the first attempt of the pass began.
    started_unix_ms: u64,
}

/// One attempt at a pass; `registered` is set once the source store holds its
/// registration.
async fn pass(job: &Job<'_>, registered: &mut bool) -> std::result::Result<PassReport, PassError> {
    let Job {
        source,
        target,
        name,
        run,
        ..
    } = *job;
    let meta = read_meta(source, name).await?;
    // An encrypted volume's objects are copied opened and sealed again with the same
    // data key, or without the key as stored (`lifecycle::encryption::unlock_pair`).
    let opaque = crate::lifecycle::encryption::opaque(source, &meta);
    if opaque != crate::lifecycle::encryption::opaque(target, &meta) {
        return Err(PassError::Failed(Error::bad_input(format!(
            "volume '{name}' is encrypted: give both stores its key, or neither"
        ))));
    }
    let lineage = load_lineage(source, &meta).await?;
    check_target_identity(target, &meta).await?;
    check_not_served(source, target, &meta).await?;
    check_parent_replicated(target, &meta, &lineage).await?;
    let Start {
        newest,
        src,
        registered: took,
    } = register_and_list(source, target, &meta, registered).await?;
    let sb = newest.as_ref().map(|(sb, _)| sb.clone());
    if sb.as_ref().is_some_and(|s| s.deleting) {
        return Err(PassError::Failed(
            crate::fencing::volume_super::being_deleted(name),
        ));
    }
    let dst = list_objects(target, name).await?;
    run.forget_all_but(&src);
    let mut report = PassReport {
        source_next_seq: src.keys().next_back().map_or(0, |s| s.0 + 1),
        checkpoint: sb.as_ref().and_then(base_of),
        registered: took,
        ..Default::default()
    };
    if sb.is_none() && !src.is_empty() {
        return Err(PassError::Failed(Error::new(
            ErrorKind::Unsupported,
            format!(
                "volume '{name}' has objects but no volume superblock: serve it once with this build, then replicate"
            ),
        )));
    }
    let plan = plan_pass(source, &meta, &lineage, sb.as_ref(), &src).await?;
    // Objects of a newer claim than the replica's superblock arrive before the
    // superblock that claimed them: the replica's record says so meanwhile.
    if let Some(have) = read_newest(target, &meta).await?
        && plan
            .objects
            .iter()
            .chain(&plan.checkpoints)
            .any(|o| o.1 > have.epoch)
    {
        let pass = PassInProgress {
            started_unix_ms: job.started_unix_ms.max(1),
            checkpoint: report.checkpoint,
            through_seq: report.source_next_seq,
        };
        mark_replica_pass(target, &meta, have.generation, pass, &source.describe()).await?;
    }

    // 2. Data and GC objects, any order: those missing, and those present whose
    // identity is not known to be the source's yet.
    let mut todo = Vec::new();
    for o in &plan.objects {
        let (kind, size) = src[o];
        let check = match dst.get(o) {
            None => false,
            Some(&(_, have)) if have != size => {
                lsvd_store::log::warn(&format!(
                    "replicate {name}: the replica's {} is {have} bytes, the source's {size}: replacing it",
                    object_key(name, o.0, o.1, kind)
                ));
                report.objects_replaced += 1;
                false
            }
            Some(_) if run.verified(*o, size) => {
                report.objects_present += 1;
                continue;
            }
            Some(_) => true,
        };
        todo.push(copy::Item {
            seq: o.0,
            epoch: o.1,
            kind,
            size_bytes: size,
            check_first: check,
        });
    }
    job.progress
        .objects_total
        .fetch_add(todo.len() as u64, Ordering::Relaxed);
    job.progress.bytes_total.fetch_add(
        todo.iter()
            .filter(|i| !i.check_first)
            .map(|i| i.size_bytes)
            .sum::<u64>(),
        Ordering::Relaxed,
    );
    let done = copy_objects(source, target, &meta, todo, job.options.jobs, job.progress).await?;
    for d in done {
        run.remember((d.seq, d.epoch), d.identity);
        report.identities_checked += u64::from(d.checked);
        if d.copied {
            report.objects_copied += 1;
            report.bytes_copied += d.identity.total_bytes;
            report.objects_replaced += u64::from(d.checked);
        } else {
            report.objects_present += 1;
        }
    }

    // 3. Checkpoints, oldest first, each once what it lists is there.
    for &c in &plan.checkpoints {
        let key = object_key(name, c.0, c.1, ObjectKind::Checkpoint);
        let size = src[&c].1;
        if let Some(&(_, have)) = dst.get(&c) {
            if have == size && run.verified(c, size) {
                continue;
            }
            if have == size {
                report.identities_checked += 1;
                if let Some(identity) = same_object(source, target, &key, size).await? {
                    run.remember(c, identity);
                    continue;
                }
            }
            lsvd_store::log::warn(&format!(
                "replicate {name}: the replica's {key} is not the source's checkpoint: replacing it"
            ));
            report.objects_replaced += 1;
        }
        let bytes = match plan.fetched.get(&c) {
            Some(b) => b.clone(),
            None => get_verified(source, &meta, c.0, c.1, ObjectKind::Checkpoint).await?,
        };
        let listed = listed_objects(&meta, &lineage, c, &bytes, opaque.then_some(&src))?;
        if let Some(missing) = listed.iter().find(|&&s| !plan.holds(s)) {
            return Err(raced(format!(
                "checkpoint {key} lists object {:016x} (epoch {}), which the source no longer holds",
                missing.0, missing.1
            )));
        }
        let identity = Identity::of(&bytes);
        put_object(target, &key, bytes).await?;
        run.remember(c, identity);
        report.checkpoints_copied += 1;
        report.bytes_copied += size;
    }

    // 4. Snapshot records; records the source deleted go.
    report.snapshots_copied = copy_snapshot_records(target, &meta, &plan.snapshots).await?;
    report.snapshots_deleted = delete_gone_snapshots(target, &meta, &plan.snapshots).await?;

    // 5. The superblock, once the replica recovers, by the source's superblock (which
    // epoch owns which number), without a violation (no gap before what it promises,
    // write-log records continuing object to object) at least as far as it promises.
    // Without the key (sealed objects copied as stored) the replica is checked by
    // name: the checkpoint, and the history's run after it without a gap.
    let rec = match opaque {
        false => Recovered::of(&recover_store_as_of(target, &meta, sb.clone()).await?),
        true => Recovered::by_name(&list_objects(target, name).await?, sb.as_ref()),
    };
    report.replica_next_seq = rec.next_seq;
    if let Some((sb, sb_bytes)) = &newest {
        if let Some(why) = &rec.violation {
            return Err(raced(format!(
                "the copy does not recover as superblock generation {} says ({why})",
                sb.generation
            )));
        }
        if rec.checkpoint_seq < sb.newest_checkpoint || report.replica_next_seq < sb.durable_through
        {
            return Err(raced(format!(
                "the copy recovers to object {:016x}, short of superblock generation {}",
                report.replica_next_seq, sb.generation
            )));
        }
        if let Some(now) = read_newest(source, &meta).await? {
            check_still_history(sb, &now, rec.checkpoint_seq, report.replica_next_seq)
                .map_err(raced)?;
        }
        copy_superblock(target, &meta, sb, sb_bytes.clone()).await?;
        report.generation = Some(sb.generation);
        let bytes = status_bytes(&meta, &report, job.started_unix_ms, &source.describe())?;
        target
            .put(
                &replica_of_key(name),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await
            .map_err(|e| e.context("writing the replica's status record"))?;
    }

    // 6. The metadata (and a clone's links): now the replica is a volume; its settings
    // and an encrypted volume's key record as they are now (`lsvd config` and `lsvd
    // key rotate` change them, so they are overwritten), the key record first.
    copy_replaced(source, target, &keys_key(name)).await?;
    copy_key(source, target, &meta_key(name)).await?;
    copy_replaced(source, target, &settings_key(name)).await?;
    if let Some(parent) = lineage.0.last() {
        copy_key(source, target, &parent_key(name)).await?;
        copy_key(
            source,
            target,
            &format!("{}{name}", clones_prefix(&parent.name)),
        )
        .await?;
    }

    // 7. What the source deleted and the replica no longer needs.
    let base = rec.checkpoint_seq.unwrap_or(0);
    for (&(seq, epoch), &(kind, _)) in dst.range(..(base, 0)) {
        if !src.contains_key(&(seq, epoch)) && !plan.holds((seq, epoch)) {
            target
                .delete(&object_key(name, seq, epoch, kind))
                .await
                .map_err(|e| e.context("deleting an object the source deleted"))?;
            report.objects_deleted += 1;
        }
    }
    Ok(report)
}

/// What step 5 learns of the replica: where it recovers from and to.
struct Recovered {
    checkpoint_seq: Option<u64>,
    next_seq: u64,
    violation: Option<String>,
}

impl Recovered {
    fn of(rec: &crate::recovery::store_recovery::StoreRecovery) -> Self {
        Recovered {
            checkpoint_seq: rec.checkpoint_seq,
            next_seq: rec.state.next_object_seq(),
            violation: rec.superblock_violation.clone(),
        }
    }

    /// The replica as its names say, for sealed objects that cannot be opened: the
    /// superblock's checkpoint if the replica holds it, then the history's objects
    /// after it up to the first gap.
    fn by_name(dst: &Listing, sb: Option<&VolumeSuper>) -> Self {
        let history = sb.map_or_else(lsvd_core::history::History::legacy, |s| s.history.clone());
        let checkpoint = sb
            .and_then(|s| s.newest_checkpoint)
            .map(|c| (c, history.epoch_of(c).unwrap_or(0)))
            .filter(|c| dst.contains_key(c));
        let from = checkpoint.map_or(1, |c| c.0 + 1);
        let run = plan::history_run(&history, dst, from, None).unwrap_or_default();
        Recovered {
            checkpoint_seq: checkpoint.map(|c| c.0),
            next_seq: run.last().map_or(from, |o| o.0 + 1),
            violation: None,
        }
    }
}

/// Copy `key` (none: nothing to copy), replacing the replica's.
async fn copy_replaced(source: &DynStore, target: &DynStore, key: &str) -> Result<()> {
    match source.get(key).await {
        Ok(bytes) => target
            .put(key, Bytes::from(bytes), PutMode::Overwrite)
            .await
            .map_err(|e| e.context(format!("writing {key}"))),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.context(format!("reading {key}"))),
    }
}
