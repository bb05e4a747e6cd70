//! Each copy of a position on its own, for `lsvd check`: the copies named, one copy
//! read without falling back to the other or repairing anything, and every copy of a
//! key read and compared ([`compare_key_copies`], for any store). Reads and writes
//! that serve clients are in [`super::position`].

use super::position::Drive;
use crate::fs::valid_key;
use crate::{ObjectStore, StoreResult};
use lsvd_core::error::{Error, ErrorKind};

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
        let Some(s) = c.store_for_check() else {
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

/// What reading every copy of one key on its own found.
pub struct KeyCopies {
    /// The copies' names ([`ObjectStore::copies_of`]).
    pub names: Vec<String>,
    /// Copies that could not be read, with why (`NotFound`: the copy lacks the key).
    pub unreadable: Vec<(usize, Error)>,
    /// The copies read, when they do not all hold the same bytes.
    pub differing: Option<Vec<usize>>,
}

/// Every copy of `key` read on its own ([`ObjectStore::get_copy`]: no fallback, no
/// repair) and compared byte for byte; nothing is read when the store keeps one copy.
/// Err only if the copies cannot be named.
pub async fn compare_key_copies(store: &dyn ObjectStore, key: &str) -> StoreResult<KeyCopies> {
    let names = store.copies_of(key).await?;
    let mut found = KeyCopies {
        names,
        unreadable: Vec::new(),
        differing: None,
    };
    if found.names.len() < 2 {
        return Ok(found);
    }
    let mut read: Vec<(usize, Vec<u8>)> = Vec::new();
    for i in 0..found.names.len() {
        match store.get_copy(key, i).await {
            Ok(b) => read.push((i, b)),
            Err(e) => found.unreadable.push((i, e)),
        }
    }
    if let Some(((_, first), rest)) = read.split_first()
        && rest.iter().any(|(_, b)| b != first)
    {
        found.differing = Some(read.iter().map(|(i, _)| *i).collect());
    }
    Ok(found)
}

/// Tests: [`compare_key_copies`] for every key under `prefix`, one line per copy
/// that lacks a key or cannot be read and per key whose copies differ.
#[cfg(any(test, feature = "testutil"))]
pub async fn copy_problems(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for entry in store.list(prefix).await.expect("list") {
        let key = entry.key;
        let found = compare_key_copies(store, &key).await.expect("copies");
        for (i, e) in found.unreadable {
            let dir = &found.names[i];
            problems.push(if e.is_not_found() {
                format!("{key}: missing from {dir}")
            } else {
                format!("{key}: cannot read the copy in {dir}: {e}")
            });
        }
        if found.differing.is_some() {
            problems.push(format!("{key}: the copies differ"));
        }
    }
    problems
}
