//! What changed in a volume since one of its snapshots, read from the live maps: the
//! engine half of `lsvd export-diff` and of the `qemu:dirty-bitmap:SNAP` NBD context.
//!
//! Why here: the decision itself is sans-I/O (`lsvd_core::changes`); this module
//! gathers what it needs. The baseline (a snapshot's end and the blocks it had data
//! in) is read once from the store; then each question walks the write-log and store
//! maps under the state lock, lets go of it, and for data the garbage collector moved
//! since the snapshot reads the gc object's header (cached) to learn where each
//! extent came from. Data moved twice since the snapshot (a gc object's source is
//! itself newer than the snapshot) is reported as changed: a backup reads a little
//! more than it needs, never less.

use std::collections::HashMap;
use std::sync::Arc;

use lsvd_core::changes::{Baseline, Change, Now, Written};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::extent_map::{ExtentMap, Piece};
use lsvd_core::format::object::{ObjectExtent, ObjectKind};
use lsvd_core::format::snapshot::SnapshotRecord;
use lsvd_core::log_map::LogLoc;
use lsvd_core::store_state::ObjLoc;

use crate::keys::object_key;
use crate::lifecycle::snapshot::{list_snapshots, read_snapshot, snapshot_state};
use crate::recovery::store_recovery::read_header;
use crate::volume::Volume;

const SECTOR_BYTES: u64 = 512;
/// Gc headers kept per baseline (each holds one object's extent list).
const HEADER_CACHE_ENTRIES: usize = 256;

/// What a volume is compared against: one of its snapshots, or the empty volume.
pub struct ChangeBase {
    /// The snapshot's name (`None`: the empty volume).
    pub snapshot: Option<String>,
    baseline: Baseline,
    /// Extents of gc objects newer than the baseline, by object number.
    gc_extents: tokio::sync::Mutex<HashMap<u64, Arc<Vec<ObjectExtent>>>>,
}

impl ChangeBase {
    /// Objects numbered below this are in the baseline.
    pub fn through_seq(&self) -> u64 {
        self.baseline.through_seq
    }
}

/// A piece of the map as gathered under the lock.
enum Gathered {
    Settled(Now),
    /// In a gc object newer than the baseline: where it came from decides.
    Moved {
        object_seq: u64,
        epoch: u64,
    },
}

impl Volume {
    /// The baseline for [`Volume::changes`]: snapshot `snap` of this volume, or the
    /// empty volume. `NotFound` (naming the snapshots there are) if there is no such
    /// snapshot; `BadInput` for a snapshot newer than what this handle reads (a
    /// snapshot export compared with a later snapshot).
    pub async fn change_base(&self, snap: Option<&str>) -> Result<ChangeBase> {
        let shared = &self.shared;
        let Some(snap) = snap else {
            return Ok(ChangeBase {
                snapshot: None,
                baseline: Baseline::empty(),
                gc_extents: Default::default(),
            });
        };
        let record = read_snapshot(&shared.store, &shared.meta, snap).await?;
        if let Some(own) = self.snapshot_record().await?
            && own.through_seq < record.through_seq
        {
            return Err(Error::bad_input(format!(
                "snapshot '{snap}' is newer than '{}': compare a snapshot with an older one",
                own.name
            )));
        }
        let state = snapshot_state(&shared.store, &shared.meta, &record).await?;
        let mapped = ExtentMap::from_sorted(state.map().iter().map(|p| Piece {
            lba: p.lba,
            sectors: p.sectors,
            location: (),
        }))
        .map_err(|p| {
            Error::new(
                ErrorKind::Corrupt,
                format!("snapshot map overlaps at {p:?}"),
            )
        })?;
        Ok(ChangeBase {
            snapshot: Some(record.name.clone()),
            baseline: Baseline {
                through_seq: record.through_seq,
                last_record_seq: record.last_record_seq,
                mapped,
            },
            gc_extents: Default::default(),
        })
    }

    /// How `[offset, offset + len)` compares with `base`: runs of (bytes, change) that
    /// add up to `len`. Costs map walks and, for data garbage-collected since the
    /// snapshot, one header read per gc object (cached in `base`).
    pub async fn changes(
        &self,
        base: &ChangeBase,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Change)>> {
        self.check_range(offset, len)?;
        let gathered = self.gather(&base.baseline, offset / SECTOR_BYTES, len / SECTOR_BYTES);
        let mut pieces = Vec::with_capacity(gathered.len());
        for (lba, sectors, g) in gathered {
            match g {
                Gathered::Settled(now) => pieces.push((lba, sectors, now)),
                Gathered::Moved { object_seq, epoch } => {
                    let extents = self.gc_extents(base, object_seq, epoch).await?;
                    origins(&base.baseline, &extents, lba, sectors, &mut pieces);
                }
            }
        }
        let runs = base.baseline.classify(pieces);
        Ok(runs
            .into_iter()
            .map(|(sectors, c)| (sectors * SECTOR_BYTES, c))
            .collect())
    }

    /// The record of the snapshot this handle reads (`None` for the volume itself).
    pub async fn snapshot_record(&self) -> Result<Option<SnapshotRecord>> {
        match &self.shared.snapshot {
            Some(name) => Ok(Some(
                read_snapshot(&self.shared.store, &self.shared.meta, name).await?,
            )),
            None => Ok(None),
        }
    }

    /// The names of this volume's snapshots, oldest first.
    pub async fn snapshot_names(&self) -> Result<Vec<String>> {
        let list = list_snapshots(&self.shared.store, &self.shared.meta).await?;
        Ok(list.into_iter().map(|r| r.name).collect())
    }

    /// The map pieces of `[lba, lba + sectors)`, each placed against `baseline` where
    /// the maps alone can tell.
    fn gather(&self, baseline: &Baseline, lba: u64, sectors: u64) -> Vec<(u64, u64, Gathered)> {
        let st = self.shared.lock();
        let store = st.pipeline.store();
        let mut out = Vec::new();
        st.log_map.for_each_in(lba, sectors, |p| match p.location {
            Some(LogLoc::Data { record_seq, .. }) => out.push((
                p.lba,
                p.sectors,
                Gathered::Settled(Now::Written(baseline.record(record_seq))),
            )),
            Some(LogLoc::Zero { .. }) => {
                out.push((p.lba, p.sectors, Gathered::Settled(Now::Zeros)))
            }
            None => store.map().for_each_in(p.lba, p.sectors, |q| {
                let g = match q.location {
                    None => Gathered::Settled(Now::Zeros),
                    Some(ObjLoc { object_seq, .. }) => {
                        let written = baseline.object(object_seq);
                        match store.objects().get(&object_seq) {
                            Some(info)
                                if written == Written::After
                                    && info.kind == ObjectKind::Gc
                                    && !baseline.is_empty() =>
                            {
                                Gathered::Moved {
                                    object_seq,
                                    epoch: info.epoch,
                                }
                            }
                            _ => Gathered::Settled(Now::Written(written)),
                        }
                    }
                };
                out.push((q.lba, q.sectors, g));
            }),
        });
        out
    }

    /// The extents of gc object `object_seq`, from `base`'s cache or its header.
    async fn gc_extents(
        &self,
        base: &ChangeBase,
        object_seq: u64,
        epoch: u64,
    ) -> Result<Arc<Vec<ObjectExtent>>> {
        let mut cache = base.gc_extents.lock().await;
        if let Some(e) = cache.get(&object_seq) {
            return Ok(e.clone());
        }
        let key = object_key(&self.shared.meta.name, object_seq, epoch, ObjectKind::Gc);
        let header = read_header(&self.shared.store, &key).await?;
        let extents = Arc::new(header.extents);
        if cache.len() >= HEADER_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(object_seq, extents.clone());
        Ok(extents)
    }
}

/// Split `[lba, lba + sectors)`, held by a gc object with `extents`, by where each
/// part came from. A part no extent covers, or whose source is not in the baseline,
/// counts as written after it.
fn origins(
    baseline: &Baseline,
    extents: &[ObjectExtent],
    lba: u64,
    sectors: u64,
    out: &mut Vec<(u64, u64, Now)>,
) {
    let end = lba + sectors;
    let mut at = lba;
    let mut covering: Vec<&ObjectExtent> = extents
        .iter()
        .filter(|e| e.lba < end && e.lba + u64::from(e.sectors) > lba)
        .collect();
    covering.sort_by_key(|e| e.lba);
    for e in covering {
        let from = e.lba.max(at);
        let to = (e.lba + u64::from(e.sectors)).min(end);
        if from > at {
            out.push((at, from - at, Now::Written(Written::After)));
        }
        if to > from {
            let written = match e.source {
                Some(s) => baseline.object(s.object_seq),
                None => Written::After,
            };
            out.push((from, to - from, Now::Written(written)));
            at = to;
        }
    }
    if at < end {
        out.push((at, end - at, Now::Written(Written::After)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_core::format::object::ExtentSource;

    fn ext(lba: u64, sectors: u32, source: Option<u64>) -> ObjectExtent {
        ObjectExtent {
            lba,
            sectors,
            source: source.map(|s| ExtentSource {
                object_seq: s,
                object_offset: 0,
            }),
        }
    }

    #[test]
    fn moved_data_is_placed_by_its_source() {
        let baseline = Baseline {
            through_seq: 10,
            last_record_seq: 5,
            mapped: ExtentMap::new(),
        };
        // Sectors 0..8 came from object 3 (in the snapshot), 8..16 from object 12
        // (after it); 16..20 is not in the header at all.
        let extents = [ext(8, 8, Some(12)), ext(0, 8, Some(3))];
        let mut out = Vec::new();
        origins(&baseline, &extents, 4, 16, &mut out);
        assert_eq!(
            out,
            vec![
                (4, 4, Now::Written(Written::Before)),
                (8, 8, Now::Written(Written::After)),
                (16, 4, Now::Written(Written::After)),
            ]
        );
    }
}
