//! Each copy of a position on its own, for `lsvd check`: the copies named, and one
//! copy read without falling back to the other or repairing anything. Reads and writes that serve clients are in [`super::position`].

use super::position::Drive;
use crate::error::{Error, ErrorKind};
use crate::store::fs::valid_key;
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
}

/// Tests: every key under `prefix` read from each of its copies on its own
/// ([`ObjectStore::copies_of`], [`ObjectStore::get_copy`], what `lsvd check` does): one
/// line per copy that lacks a key and per key whose copies differ.
#[cfg(test)]
pub async fn copy_problems(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for entry in store.list(prefix).await.expect("list") {
        let key = entry.key;
        let copies = store.copies_of(&key).await.expect("copies");
        let mut read = Vec::new();
        for (i, dir) in copies.iter().enumerate() {
            match store.get_copy(&key, i).await {
                Ok(b) => read.push(b),
                Err(e) if e.is_not_found() => problems.push(format!("{key}: missing from {dir}")),
                Err(e) => problems.push(format!("{key}: cannot read the copy in {dir}: {e}")),
            }
        }
        if read.windows(2).any(|w| w[0] != w[1]) {
            problems.push(format!("{key}: the copies differ"));
        }
    }
    problems
}
