//! `lsvd replicate`: copy a volume (metadata, objects, checkpoints, snapshots) into
//! another store, so that the copy is always a prefix of the source's history.
//!
//! Why this is safe to do lazily and out of order: objects are immutable and named by
//! sequence number, and recovery (`store_recovery`) rebuilds a volume from its newest
//! usable checkpoint plus the *consecutive* run of objects after it. So a replica whose
//! objects arrive in any order is, at every moment, the source as of the last object of
//! that run: a prefix. What must be ordered is what tells recovery where to start:
//!
//! 1. data and GC objects (in any order, several at a time, resuming past those
//!    already copied);
//! 2. then checkpoints, oldest first, each only once every object it lists is there
//!    (recovery starts from the newest checkpoint it finds);
//! 3. then snapshot records (each after the objects it keeps);
//! 4. then, after checking that the replica recovers to at least what the source's
//!    newest volume superblock promises, that superblock generation, verbatim;
//! 5. the metadata, on the first pass (until then the replica is not a volume);
//! 6. last, objects the source deleted and the replica no longer needs.
//!
//! One pass copies what the source listed when it began. The source keeps running
//! (its GC deletes objects); an object that vanishes mid-pass restarts the pass from
//! a new listing, which names what GC wrote instead. `--follow` runs passes in a loop.
//!
//! The replica is never written by anything else: a superblock generation there that
//! the source did not write (someone served the replica) stops replication with
//! `Conflict`.

mod copy;
mod guard;
mod plan;
mod status;

pub use status::{replica_of, replica_statuses};

use copy::{
    copy_key, copy_objects, copy_snapshot_records, copy_superblock, delete_gone_snapshots,
    get_verified, put_object,
};
use guard::{check_not_served, check_parent_replicated, check_target_identity, ensure_distinct};
use plan::{listed_objects, plan_pass};
use status::{record_status, status_bytes};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use lsvd_core::format::object::ObjectKind;

use super::keys::{meta_key, object_key, objects_prefix, parse_object_name, replica_of_key};
use super::lineage::{clones_prefix, load_lineage, parent_key};
use super::store_meta::read_meta;
use super::store_recovery::recover_store_as_of;
use super::volume_super::read_newest;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{DynStore, PutMode};

/// How many times a pass starts again because the source changed under it.
const MAX_ATTEMPTS: u32 = 20;

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
    /// Objects copied at the same time (each held in memory whole while copied).
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
    /// Needed objects the replica already had (an interrupted pass resumed).
    pub objects_present: u64,
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
    /// Times the pass started again because the source changed under it.
    pub restarts: u32,
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

/// Copy volume `name` from `source` into `target` once (see the module doc). Errors:
/// `NotFound` (no such volume), `Conflict` (the target holds another volume of that
/// name, or the replica was written by someone else), `BadInput` (a clone whose parent
/// is not replicated yet), `Corrupt` (a source object fails its checks), `Transient`
/// (the source kept changing), or a store error's kind.
pub async fn replicate_once(
    source: &DynStore,
    target: &DynStore,
    name: &str,
    options: &ReplicateOptions,
    progress: &ReplicateProgress,
) -> Result<PassReport> {
    ensure_distinct(source, target).await?;
    let started_unix_ms = unix_ms();
    let mut last_race = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        match pass(source, target, name, options, progress, started_unix_ms).await {
            Ok(mut report) => {
                report.restarts = attempt;
                record_status(source, target, name, &report, started_unix_ms).await;
                return Ok(report);
            }
            Err(PassError::Failed(e)) => return Err(e),
            Err(PassError::Raced(Raced(why))) => {
                crate::log::info(&format!("replicate {name}: {why}; starting the pass again"));
                last_race = why;
            }
        }
    }
    Err(Error::new(
        ErrorKind::Transient,
        format!(
            "volume '{name}' changed under the copy {MAX_ATTEMPTS} times (last: {last_race}); try again"
        ),
    ))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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

async fn pass(
    source: &DynStore,
    target: &DynStore,
    name: &str,
    options: &ReplicateOptions,
    progress: &ReplicateProgress,
    started_unix_ms: u64,
) -> std::result::Result<PassReport, PassError> {
    let meta = read_meta(source, name).await?;
    let lineage = load_lineage(source, &meta).await?;
    check_target_identity(target, &meta).await?;
    check_not_served(source, target, &meta).await?;
    check_parent_replicated(target, &meta, &lineage).await?;
    let sb = read_newest(source, &meta).await?;
    if sb.as_ref().is_some_and(|s| s.deleting) {
        return Err(PassError::Failed(super::volume_super::being_deleted(name)));
    }
    let src = list_objects(source, name).await?;
    let dst = list_objects(target, name).await?;
    let mut report = PassReport {
        source_next_seq: src.keys().next_back().map_or(0, |s| s.0 + 1),
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

    // 1. Data and GC objects, any order.
    let copy: Vec<(u64, u64, ObjectKind, u64)> = plan
        .objects
        .iter()
        .map(|o| (o.0, o.1, src[o].0, src[o].1))
        .filter(|&(seq, epoch, _, size)| {
            dst.get(&(seq, epoch)).is_none_or(|&(_, have)| have != size)
        })
        .collect();
    report.objects_present = (plan.objects.len() - copy.len()) as u64;
    progress
        .objects_total
        .fetch_add(copy.len() as u64, Ordering::Relaxed);
    progress.bytes_total.fetch_add(
        copy.iter().map(|(_, _, _, size)| size).sum::<u64>(),
        Ordering::Relaxed,
    );
    let (n, bytes) = copy_objects(source, target, &meta, copy, options.jobs, progress).await?;
    report.objects_copied = n;
    report.bytes_copied = bytes;

    // 2. Checkpoints, oldest first, each once what it lists is there.
    for &c in &plan.checkpoints {
        if dst.get(&c).is_some_and(|&(_, size)| size == src[&c].1) {
            continue;
        }
        let key = object_key(name, c.0, c.1, ObjectKind::Checkpoint);
        let bytes = match plan.fetched.get(&c) {
            Some(b) => b.clone(),
            None => get_verified(source, &meta, c.0, c.1, ObjectKind::Checkpoint).await?,
        };
        let listed = listed_objects(&meta, &lineage, c.0, c.1, &bytes)?;
        if let Some(missing) = listed.iter().find(|&&s| !plan.holds(s)) {
            return Err(PassError::Raced(Raced(format!(
                "checkpoint {key} lists object {:016x} (epoch {}), which the source no longer holds",
                missing.0, missing.1
            ))));
        }
        put_object(target, &key, bytes).await?;
        report.checkpoints_copied += 1;
        report.bytes_copied += src[&c].1;
    }

    // 3. Snapshot records; records the source deleted go.
    report.snapshots_copied = copy_snapshot_records(target, &meta, &plan.snapshots).await?;
    report.snapshots_deleted = delete_gone_snapshots(target, &meta, &plan.snapshots).await?;

    // 4. The superblock, once the replica recovers at least as far as it promises.
    // Recovered by the source's superblock: which epoch owns which number.
    let rec = recover_store_as_of(target, &meta, sb.clone()).await?;
    report.replica_next_seq = rec.state.next_object_seq();
    if let Some(sb) = &sb {
        if rec.checkpoint_seq < sb.newest_checkpoint || report.replica_next_seq < sb.durable_through
        {
            return Err(PassError::Raced(Raced(format!(
                "the copy recovers to object {:016x}, short of superblock generation {}",
                report.replica_next_seq, sb.generation
            ))));
        }
        copy_superblock(source, target, &meta, sb).await?;
        report.generation = Some(sb.generation);
        let bytes = status_bytes(&meta, &report, started_unix_ms, &source.describe())?;
        target
            .put(
                &replica_of_key(name),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await
            .map_err(|e| e.context("writing the replica's status record"))?;
    }

    // 5. The metadata (and a clone's links): now the replica is a volume.
    copy_key(source, target, &meta_key(name)).await?;
    if let Some(parent) = lineage.0.last() {
        copy_key(source, target, &parent_key(name)).await?;
        copy_key(
            source,
            target,
            &format!("{}{name}", clones_prefix(&parent.name)),
        )
        .await?;
    }

    // 6. What the source deleted and the replica no longer needs.
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
