//! What replication passes under way keep in the store: the deletes after a
//! checkpoint (old checkpoints, objects GC emptied) ask [`Holds`] first, as they ask
//! the snapshots' pins.
//!
//! Why: `lsvd replicate` copies the volume as its newest superblock described it when
//! a pass began: from that superblock's checkpoint `C`, the objects `C` lists, and
//! every object (checkpoints too) numbered after `C` up to the newest it listed, below
//! `T`. GC deletes what a checkpoint left out once the next one is named, and every
//! checkpoint but the newest two, so two checkpoints into a long pass the objects it
//! still had to copy were gone, and the pass started again from a newer checkpoint,
//! under heavy GC possibly forever. Now the replicator registers the pass in its
//! status record in the source store (`<volume>/replicas/<id>`,
//! docs/format/replica-status.md: `C`, `T` and when the pass began), and the engine
//! reads those records once per checkpoint, before its deletes, and keeps what a
//! registered pass needs:
//!
//! - checkpoint `C` itself, and the checkpoints numbered between `C` and `T`;
//! - every object numbered below `T` that some checkpoint `L` left out with `C < L`.
//!   Such an object was numbered before `L` and was live at every checkpoint between
//!   its number and `L`: either its number is below `C` and `C` lists it, or it is
//!   after `C`. An object left out by `C` or earlier is in neither, so it goes as
//!   before.
//!
//! Reading after naming the checkpoint is enough: a checkpoint `K` deletes only what
//! the checkpoint before `K` does not need, so a pass that registered before `K`'s
//! deletes is seen by them, and one based on `K` or the checkpoint before it needs
//! nothing they delete. The replicator lists, registers, then checks that the source's
//! newest superblock still names the checkpoint it registered (no deletes since).
//!
//! Kept objects stay in the deferred-delete list and are deleted after a later
//! checkpoint once no registered pass needs them (or, if the server stops first,
//! found below the checkpoint at the next open, which deletes them as garbage).
//!
//! Bounded, so a replicator that died or hangs cannot make the store grow without
//! end: a pass that began more than [`EngineConfig::replica_hold_ms`] ago (`lsvd serve
//! --replica-hold`, 1 hour by default) is not waited for, and when what the passes
//! keep exceeds [`EngineConfig::replica_hold_max_bytes`] (`--replica-hold-max`) the
//! deletes go ahead; each with a warning, once per pass. Such a pass finds objects
//! gone and starts again from a newer checkpoint, as every pass did before.
//!
//! [`EngineConfig::replica_hold_ms`]: crate::config::EngineConfig::replica_hold_ms
//! [`EngineConfig::replica_hold_max_bytes`]: crate::config::EngineConfig::replica_hold_max_bytes

use std::collections::BTreeSet;

use lsvd_core::format::replica_status::decode_replica_status;

use crate::keys::replicas_prefix;
use crate::locks::LockRank;
use crate::shared::Shared;

/// One registered pass: what it copies from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hold {
    /// Its status record's key, for messages.
    pub key: String,
    /// The replica store it copies to.
    pub peer: String,
    /// The source checkpoint it copies from as (sequence number, epoch); None: the
    /// source had none, every object is needed.
    pub checkpoint: Option<(u64, u64)>,
    /// It copies nothing numbered from here on.
    pub through_seq: u64,
    pub started_unix_ms: u64,
}

impl Hold {
    fn base_seq(&self) -> u64 {
        self.checkpoint.map_or(0, |c| c.0)
    }
}

/// The passes registered when the latest checkpoint was named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Holds(pub Vec<Hold>);

impl Holds {
    /// Does some pass need object `seq`, which checkpoint `left_out_by` left out
    /// (listed by the pass's checkpoint, or numbered after it, below its end)?
    pub(crate) fn keeps_object(&self, seq: u64, left_out_by: u64) -> bool {
        self.0
            .iter()
            .any(|h| h.base_seq() < left_out_by && seq < h.through_seq)
    }

    /// Does some pass copy checkpoint `seq` (written under `epoch`): the one it copies
    /// from, or one in the run it copies after that?
    pub(crate) fn keeps_checkpoint(&self, seq: u64, epoch: u64) -> bool {
        self.0.iter().any(|h| {
            h.checkpoint == Some((seq, epoch)) || (h.base_seq() < seq && seq < h.through_seq)
        })
    }
}

/// The holds now, and the warnings given (each once).
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    /// As read after the latest checkpoint was named.
    pub current: Holds,
    /// Keys of the warnings already given.
    warned: BTreeSet<String>,
}

impl HoldState {
    /// Give warning `msg` unless the one keyed `key` was given already. Bounded: the
    /// set is emptied past a few thousand keys (a warning may then come again).
    pub(crate) fn warn_once(&mut self, key: String, msg: &str) {
        if self.warned.len() >= 4096 {
            self.warned.clear();
        }
        if self.warned.insert(key) {
            lsvd_store::log::warn(msg);
        }
    }
}

/// Read the registered passes (one LIST of `<volume>/replicas/`, one small GET per
/// replica) and keep those within the age bound, as [`HoldState::current`] too.
/// None when the records cannot be read: the caller deletes nothing this time (what
/// it would delete waits for the next checkpoint, as after a failed delete).
pub(crate) async fn load(shared: &Shared) -> Option<Holds> {
    let hold_ms = shared.config.replica_hold_ms;
    if hold_ms == 0 {
        return Some(Holds::default());
    }
    let name = &shared.meta.name;
    let warn = |key: String, msg: &str| {
        shared
            .lock_ranked(&shared.replica_holds, LockRank::ReplicaHolds)
            .warn_once(key, msg);
    };
    let entries = match shared.store.list(&replicas_prefix(name)).await {
        Ok(entries) => entries,
        Err(e) => {
            warn(
                "list".to_string(),
                &format!(
                    "volume {name}: cannot read the replicas' status records, so nothing is deleted after this checkpoint: {e}"
                ),
            );
            return None;
        }
    };
    let now_ms = shared.clock().unix_ms();
    let mut holds = Vec::new();
    for entry in entries {
        let bytes = match shared.store.get(&entry.key).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                warn(
                    "get".to_string(),
                    &format!(
                        "volume {name}: cannot read {}, so nothing is deleted after this checkpoint: {e}",
                        entry.key
                    ),
                );
                return None;
            }
        };
        let status = match decode_replica_status(&bytes) {
            Ok(s) if s.volume == shared.meta.volume => s,
            Ok(_) => continue,
            Err(e) => {
                warn(
                    format!("corrupt {}", entry.key),
                    &format!("{} is corrupt ({e}); ignoring it", entry.key),
                );
                continue;
            }
        };
        let Some(pass) = status.pass else {
            continue;
        };
        let age_ms = now_ms.saturating_sub(pass.started_unix_ms);
        if age_ms > hold_ms || pass.started_unix_ms > now_ms.saturating_add(hold_ms) {
            warn(
                format!("age {} {}", entry.key, pass.started_unix_ms),
                &format!(
                    "volume {name}: the replication pass to {} began {} s ago, longer than the replica hold ({} s): what it still needs is no longer kept (it starts again from a newer checkpoint)",
                    status.peer,
                    age_ms / 1000,
                    hold_ms / 1000
                ),
            );
            continue;
        }
        holds.push(Hold {
            key: entry.key,
            peer: status.peer,
            checkpoint: pass.checkpoint,
            through_seq: pass.through_seq,
            started_unix_ms: pass.started_unix_ms,
        });
    }
    let holds = Holds(holds);
    shared
        .lock_ranked(&shared.replica_holds, LockRank::ReplicaHolds)
        .current = holds.clone();
    Some(holds)
}

/// `holds` for the deletes after checkpoint `checkpoint`, unless what they alone would
/// keep of the objects due for deletion is more than the bound: then none, with a
/// warning once per set of passes.
pub(crate) fn bounded(shared: &Shared, holds: Holds, checkpoint: u64) -> Holds {
    let kept_bytes: u64 = shared
        .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
        .iter()
        .filter(|d| d.left_out_by < checkpoint && holds.keeps_object(d.seq, d.left_out_by))
        .map(|d| d.total_bytes)
        .sum();
    let max = shared.config.replica_hold_max_bytes;
    if kept_bytes <= max {
        return holds;
    }
    let key = holds
        .0
        .iter()
        .map(|h| format!("{}@{}", h.key, h.started_unix_ms))
        .collect::<Vec<_>>()
        .join(",");
    shared.lock_ranked(&shared.replica_holds, LockRank::ReplicaHolds)
        .warn_once(
            format!("bytes {key}"),
            &format!(
                "volume {}: replication passes to {} would keep {} MiB of garbage, more than the replica hold's bound ({} MiB): deleting it (those passes start again from a newer checkpoint)",
                shared.meta.name,
                holds
                    .0
                    .iter()
                    .map(|h| h.peer.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                kept_bytes >> 20,
                max >> 20
            ),
        );
    Holds::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(checkpoint: Option<(u64, u64)>, through_seq: u64) -> Hold {
        Hold {
            key: "v/replicas/x".into(),
            peer: "mem:x".into(),
            checkpoint,
            through_seq,
            started_unix_ms: 1,
        }
    }

    /// The rule of the module doc: a pass from checkpoint C through T keeps C, the
    /// checkpoints after it below T, and what a checkpoint after C left out below T.
    #[test]
    fn a_pass_keeps_its_checkpoint_and_what_later_checkpoints_left_out() {
        let holds = Holds(vec![hold(Some((20, 3)), 40)]);
        assert!(!holds.keeps_object(5, 10));
        assert!(!holds.keeps_object(5, 20), "left out by C itself");
        assert!(holds.keeps_object(5, 21), "listed by C, left out after");
        assert!(holds.keeps_object(30, 45), "after C");
        assert!(
            !holds.keeps_object(40, 45),
            "numbered after the pass listed"
        );
        assert!(holds.keeps_checkpoint(20, 3));
        assert!(!holds.keeps_checkpoint(20, 2), "another epoch's object");
        assert!(!holds.keeps_checkpoint(10, 3));
        assert!(holds.keeps_checkpoint(25, 3), "in the run after C");
        assert!(!holds.keeps_checkpoint(40, 3));
        let from_start = Holds(vec![hold(None, 9)]);
        assert!(from_start.keeps_object(1, 1));
        assert!(from_start.keeps_checkpoint(5, 1));
        assert!(!Holds::default().keeps_object(0, u64::MAX));
    }
}
