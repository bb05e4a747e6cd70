//! An in-memory object store for unit tests and the simulator equivalence test.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{BoxFuture, ListEntry, ObjectStore, PutMode, StoreResult};
use lsvd_core::error::{Error, ErrorKind};

#[derive(Clone, Default)]
pub struct MemStore {
    // `Bytes` shares the buffer the caller put: no copy on put.
    objects: Arc<Mutex<BTreeMap<String, Bytes>>>,
    /// Told apart in [`ObjectStore::describe`] (`mem://NAME`), for tests that use
    /// several stores.
    name: String,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that describes itself as `mem://NAME`.
    pub fn named(name: &str) -> Self {
        MemStore {
            name: name.to_string(),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        // A panic while holding this lock can only come from a test assertion.
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A store holding the same objects as this one now, independent of it (tests
    /// that recover one store state twice).
    pub fn deep_copy(&self) -> MemStore {
        MemStore {
            objects: Arc::new(Mutex::new(self.lock().clone())),
            name: self.name.clone(),
        }
    }

    /// Keys and sizes, for assertions.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect()
    }
}

fn not_found(key: &str) -> Error {
    Error::new(ErrorKind::NotFound, format!("object {key} not found"))
}

impl ObjectStore for MemStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        let mut map = self.lock();
        let r = if mode == PutMode::IfAbsent && map.contains_key(key) {
            Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("object {key} exists"),
            ))
        } else {
            map.insert(key.to_string(), data);
            Ok(())
        };
        Box::pin(async move { r })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let r = self
            .lock()
            .get(key)
            .map(|v| v.to_vec())
            .ok_or_else(|| not_found(key));
        Box::pin(async move { r })
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let r = self
            .lock()
            .get(key)
            .map(|v| {
                let end = (range.end as usize).min(v.len());
                let start = (range.start as usize).min(end);
                v[start..end].to_vec()
            })
            .ok_or_else(|| not_found(key));
        Box::pin(async move { r })
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let r = self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ListEntry {
                key: k.clone(),
                size_bytes: v.len() as u64,
            })
            .collect();
        Box::pin(async move { Ok(r) })
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.lock().remove(key);
        Box::pin(async { Ok(()) })
    }
    fn describe(&self) -> String {
        format!("mem://{}", self.name)
    }
    fn is_local(&self) -> bool {
        true
    }
}
