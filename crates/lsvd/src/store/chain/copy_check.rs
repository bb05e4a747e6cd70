//! Each copy of a position on its own, for `lsvd check`: the copies named, one copy
//! read without falling back to the other or repairing anything, and the copies
//! compared key by key. Reads and writes that serve clients are in [`super::position`].

use super::position::{Copy, Drive};
use crate::error::{Error, ErrorKind};
use crate::store::fs::{FsStore, valid_key};
use crate::store::{ObjectStore, StoreResult};

impl Drive {
    /// The directories of this position, in the order [`Drive::read_one_copy`]
    /// numbers them (a copy out of service included).
    pub fn copy_names(&self) -> Vec<String> {
        self.copies
            .iter()
            .map(|c| c.dir.display().to_string())
            .collect()
    }

    /// The whole of `key` from copy `copy` alone: no fallback, no repair, no copy
    /// dropped (`lsvd check` reads every copy this way). `NotFound` if that copy
    /// lacks it, `Permanent` if the copy is out of service.
    pub async fn read_one_copy(&self, key: &str, copy: usize) -> StoreResult<Vec<u8>> {
        valid_key(key)?;
        let Some(c) = self.copies.get(copy) else {
            return Err(Error::bad_input(format!(
                "drive {}: no copy {copy} (it has {})",
                self.index,
                self.copies.len()
            )));
        };
        let Some(s) = c.store() else {
            return Err(Error::new(
                ErrorKind::Permanent,
                format!(
                    "copy {} of drive {} is out of service (it could not be opened or failed)",
                    c.dir.display(),
                    self.index
                ),
            ));
        };
        s.get(key).await
    }

    /// Compare the two copies of a mirrored position for the keys under `prefix`:
    /// one line per key missing from a copy or whose copies differ (size or bytes),
    /// and one if a copy is out of service. Reads every object of both copies.
    pub async fn compare_copies(&self, prefix: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.copies.len() < 2 {
            return problems;
        }
        let live: Vec<(&Copy, &FsStore)> = self.live().collect();
        if live.len() < 2 {
            problems.push(format!(
                "drive {}: only one copy in service (degraded; the next open rebuilds the other)",
                self.index
            ));
            return problems;
        }
        let mut listings = Vec::new();
        for (copy, store) in &live[..2] {
            match store.list(prefix).await {
                Ok(l) => listings.push(
                    l.into_iter()
                        .map(|e| (e.key, e.size_bytes))
                        .collect::<std::collections::BTreeMap<String, u64>>(),
                ),
                Err(e) => {
                    problems.push(format!(
                        "drive {}: cannot list copy {}: {e}",
                        self.index,
                        copy.dir.display()
                    ));
                    return problems;
                }
            }
        }
        let keys: std::collections::BTreeSet<&String> =
            listings[0].keys().chain(listings[1].keys()).collect();
        for key in keys {
            let sizes = (listings[0].get(key), listings[1].get(key));
            let (missing_from, other) = match sizes {
                (Some(_), None) => (live[1].0, live[0].0),
                (None, Some(_)) => (live[0].0, live[1].0),
                _ => {
                    let same = match (live[0].1.get(key).await, live[1].1.get(key).await) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => false,
                    };
                    if !same {
                        problems.push(format!(
                            "drive {}: the copies of {key} in {} and {} differ",
                            self.index,
                            live[0].0.dir.display(),
                            live[1].0.dir.display()
                        ));
                    }
                    continue;
                }
            };
            problems.push(format!(
                "drive {}: {key} is missing from {} (its mirror {} has it; a read repairs it)",
                self.index,
                missing_from.dir.display(),
                other.dir.display()
            ));
        }
        problems
    }
}

/// [`Drive::compare_copies`] for every position of a chain or stripe.
pub async fn compare_all_copies(drives: &[Drive], prefix: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for drive in drives {
        problems.extend(drive.compare_copies(prefix).await);
    }
    problems
}
