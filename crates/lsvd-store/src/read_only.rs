//! A store opened for reading only ([`OpenMode::ReadOnly`](super::OpenMode)): what
//! `lsvd info`, `check`, `inspect`, `list` and `snapshot list` open.
//!
//! Why: those commands take no lock and may run beside a live server (on this host or
//! another), so they must not change anything the server relies on. Issue 40 found a
//! mirrored chain's open resyncing mirror copies, and its reads writing missing copies
//! back, under a read-only command; the chain itself now opens read-only (no resync,
//! rebuild, repair or record written, `chain::open`), and this decorator makes the
//! rule hold for every store, whatever a command's code path calls: a put, a delete
//! or a copy repair is refused with `ReadOnly` instead of reaching the store.

use std::ops::Range;

use bytes::Bytes;

use super::{
    BoxFuture, CopyBytes, DynStore, ListEntry, ObjectStore, Placement, PutMode, StoreMetric,
    StoreResult,
};
use lsvd_core::error::{Error, ErrorKind};

/// [`ObjectStore`] over `inner` that reads and never writes.
pub struct ReadOnlyStore {
    inner: DynStore,
}

impl ReadOnlyStore {
    pub fn new(inner: DynStore) -> Self {
        ReadOnlyStore { inner }
    }

    fn refused<T: Send + 'static>(&self, what: &str, key: &str) -> BoxFuture<'_, StoreResult<T>> {
        let e = Error::new(
            ErrorKind::ReadOnly,
            format!(
                "{what} {key}: {} is open read-only (a read-only command changes nothing in the store)",
                self.inner.describe()
            ),
        );
        Box::pin(async move { Err(e) })
    }
}

impl ObjectStore for ReadOnlyStore {
    fn put(&self, key: &str, _data: Bytes, _mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.refused("put", key)
    }
    fn put_placed(
        &self,
        key: &str,
        _data: Bytes,
        _mode: PutMode,
        _placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        self.refused("put", key)
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get_range(key, range)
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get_range_background(key, range)
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.refused("delete", key)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn admit_uploads_to_cache(&self) -> bool {
        self.inner.admit_uploads_to_cache()
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        self.inner.metrics()
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        self.inner.get_range_copies(key, range)
    }
    fn repair_copies(&self, key: &str, _good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        self.refused("repair the copies of", key)
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        self.inner.copies_of(key)
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.inner.get_copy(key, copy)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::mem::MemStore;

    #[tokio::test]
    async fn reads_pass_and_writes_are_refused() {
        let mem: DynStore = Arc::new(MemStore::new());
        mem.put("k", Bytes::from_static(b"v"), PutMode::Overwrite)
            .await
            .expect("put");
        let ro = ReadOnlyStore::new(mem.clone());
        assert_eq!(ro.get("k").await.expect("get"), b"v");
        assert_eq!(ro.list("").await.expect("list").len(), 1);
        for e in [
            ro.put("n", Bytes::new(), PutMode::IfAbsent)
                .await
                .expect_err("put refused"),
            ro.put_placed("n", Bytes::new(), PutMode::Overwrite, &Placement::Client)
                .await
                .expect_err("put refused"),
            ro.delete("k").await.expect_err("delete refused"),
        ] {
            assert_eq!(e.kind, ErrorKind::ReadOnly, "{e}");
        }
        let e = ro
            .repair_copies("k", Bytes::new())
            .await
            .expect_err("repair refused");
        assert_eq!(e.kind, ErrorKind::ReadOnly, "{e}");
        // Nothing reached the store.
        assert_eq!(mem.list("").await.expect("list").len(), 1);
        assert_eq!(mem.get("k").await.expect("still there"), b"v");
    }
}
