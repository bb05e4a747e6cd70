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

use super::DynStore;
use super::layer::{Call, CallFuture, Layer, Layered, Next};
use lsvd_core::error::{Error, ErrorKind};

/// The read-only rule, as a [`Layer`]: reads pass, writes are refused.
pub struct ReadOnly {
    /// The inner store's description, for the refusal.
    store: String,
}

/// [`ObjectStore`](super::ObjectStore) over an inner store that reads and never writes.
pub type ReadOnlyStore = Layered<ReadOnly>;

impl Layered<ReadOnly> {
    pub fn new(inner: DynStore) -> Self {
        let store = inner.describe();
        Layered::wrap(inner, ReadOnly { store })
    }
}

impl Layer for ReadOnly {
    fn around<'a, T: Send + 'a>(&'a self, call: Call, mut next: Next<'a, T>) -> CallFuture<'a, T> {
        if !call.writes() {
            return next();
        }
        let e = Error::new(
            ErrorKind::ReadOnly,
            format!(
                "{}: {} is open read-only (a read-only command changes nothing in the store)",
                call.describe(),
                self.store
            ),
        );
        Box::pin(async move { Err(e) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::mem::MemStore;
    use crate::{ObjectStore, Placement, PutMode};

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
