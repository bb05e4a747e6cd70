//! Store decorators written once: a [`Layer`] says what it does around one call, and
//! [`Layered`] forwards every method of [`ObjectStore`] through it.
//!
//! Why: each decorator (retry, fault injection, read-only, the tests' hook store)
//! used to forward the trait's fifteen methods by hand, and a method it forgot fell
//! back to the trait's default, silently: a forgotten `get_range_copies` turned off
//! the mirrored chain's copy fallback under that decorator. Here a method added to
//! the trait is added to [`Layered`] once, and every layer sees it as a [`Call`].
//!
//! A layer gets the call (what is asked, owned, for its decisions and messages) and
//! `next`, which starts the call on the inner store; it may run `next` once (most
//! layers), several times (retry), or not at all (a refusal, an injected fault).
//! Methods that are not calls on the store (`describe`, `metrics`, `is_local`,
//! `admit_uploads_to_cache`) pass through, with hooks for the first two.

use std::ops::{Deref, Range};

use bytes::Bytes;

use crate::{
    BoxFuture, CopyBytes, DynStore, ListEntry, ObjectStore, Placement, PutMode, StoreMetric,
    StoreResult,
};

/// One call on a store, as a [`Layer`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `put` and `put_placed`.
    Put {
        key: String,
        mode: PutMode,
        size_bytes: usize,
    },
    Get {
        key: String,
    },
    /// `get_range`, and `get_range_background` (`background` set).
    GetRange {
        key: String,
        range: Range<u64>,
        background: bool,
    },
    List {
        prefix: String,
    },
    Delete {
        key: String,
    },
    GetRangeCopies {
        key: String,
        range: Range<u64>,
    },
    RepairCopies {
        key: String,
    },
    CopiesOf {
        key: String,
    },
    GetCopy {
        key: String,
        copy: usize,
    },
}

impl Call {
    /// True if the call changes what the store holds.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Call::Put { .. } | Call::Delete { .. } | Call::RepairCopies { .. }
        )
    }

    /// The call for messages: `put K`, `get K bytes 0..4096`, `list 'P'`, ...
    pub fn describe(&self) -> String {
        match self {
            Call::Put { key, .. } => format!("put {key}"),
            Call::Get { key } => format!("get {key}"),
            Call::GetRange { key, range, .. } => format!("get {key} bytes {range:?}"),
            Call::List { prefix } => format!("list '{prefix}'"),
            Call::Delete { key } => format!("delete {key}"),
            Call::GetRangeCopies { key, .. } => format!("get copies of {key}"),
            Call::RepairCopies { key } => format!("repair {key}"),
            Call::CopiesOf { key } => format!("name the copies of {key}"),
            Call::GetCopy { key, copy } => format!("get copy {copy} of {key}"),
        }
    }
}

/// A call's result, to come: what a layer answers and what [`Next`] starts.
pub type CallFuture<'a, T> = BoxFuture<'a, StoreResult<T>>;

/// Starts the call on the inner store; a layer may run it more than once.
pub type Next<'a, T> = Box<dyn FnMut() -> CallFuture<'a, T> + Send + 'a>;

/// What a decorator does around each call on the store it wraps.
pub trait Layer: Send + Sync + 'static {
    /// Answer `call`, with `next` starting it on the inner store.
    fn around<'a, T: Send + 'a>(&'a self, call: Call, next: Next<'a, T>) -> CallFuture<'a, T>;

    /// The decorated store's description, given the inner store's.
    fn describe(&self, inner: String) -> String {
        inner
    }

    /// The decorated store's metrics, given the inner store's.
    fn metrics(&self, inner: Vec<StoreMetric>) -> Vec<StoreMetric> {
        inner
    }
}

/// `inner` with `layer` around every call. Derefs to the layer, so a decorator's own
/// controls (a fault switch, its counters) are reached through the store.
pub struct Layered<L> {
    inner: DynStore,
    layer: L,
}

impl<L: Layer> Layered<L> {
    pub fn wrap(inner: DynStore, layer: L) -> Self {
        Layered { inner, layer }
    }

    pub fn inner(&self) -> &DynStore {
        &self.inner
    }

    /// The same store with its layer changed by `f` (builder-style settings).
    pub fn map_layer(self, f: impl FnOnce(L) -> L) -> Self {
        Layered {
            inner: self.inner,
            layer: f(self.layer),
        }
    }
}

impl<L: Layer> Layered<L> {
    /// `call` through the layer; each time the layer starts it, `start` runs it on the
    /// inner store with the call's key (or prefix).
    fn around_keyed<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        key: &str,
        mut start: impl FnMut(&'a DynStore, &str) -> CallFuture<'a, T> + Send + 'a,
    ) -> CallFuture<'a, T> {
        let (inner, key) = (&self.inner, key.to_string());
        self.layer
            .around(call, Box::new(move || start(inner, &key)))
    }
}

impl<L: Layer> Layered<L> {
    /// A ranged GET through the layer: for the read path, or for `background` work.
    fn ranged_get(
        &self,
        key: &str,
        range: Range<u64>,
        background: bool,
    ) -> CallFuture<'_, Vec<u8>> {
        let call = Call::GetRange {
            key: key.into(),
            range: range.clone(),
            background,
        };
        self.around_keyed(call, key, move |inner, key| match background {
            false => inner.get_range(key, range.clone()),
            true => inner.get_range_background(key, range.clone()),
        })
    }
}

impl<L> Deref for Layered<L> {
    type Target = L;
    fn deref(&self) -> &L {
        &self.layer
    }
}

impl<L: Layer> ObjectStore for Layered<L> {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.put_placed(key, data, mode, &Placement::Client)
    }
    fn put_placed(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        let call = Call::Put {
            key: key.to_string(),
            mode,
            size_bytes: data.len(),
        };
        let (inner, key, placement) = (&self.inner, key.to_string(), placement.clone());
        // A `Bytes` clone shares the buffer: no copy per attempt.
        let next = move || inner.put_placed(&key, data.clone(), mode, &placement);
        self.layer.around(call, Box::new(next))
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let call = Call::Get { key: key.into() };
        self.around_keyed(call, key, |inner, key| inner.get(key))
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.ranged_get(key, range, false)
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.ranged_get(key, range, true)
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let call = Call::List {
            prefix: prefix.into(),
        };
        self.around_keyed(call, prefix, |inner, prefix| inner.list(prefix))
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        let call = Call::Delete { key: key.into() };
        self.around_keyed(call, key, |inner, key| inner.delete(key))
    }
    fn describe(&self) -> String {
        self.layer.describe(self.inner.describe())
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn seals_objects(&self) -> bool {
        self.inner.seals_objects()
    }
    fn admit_uploads_to_cache(&self) -> bool {
        self.inner.admit_uploads_to_cache()
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        self.layer.metrics(self.inner.metrics())
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        let call = Call::GetRangeCopies {
            key: key.into(),
            range: range.clone(),
        };
        self.around_keyed(call, key, move |inner, key| {
            inner.get_range_copies(key, range.clone())
        })
    }
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let call = Call::RepairCopies { key: key.into() };
        self.around_keyed(call, key, move |inner, key| {
            inner.repair_copies(key, good.clone())
        })
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let call = Call::CopiesOf { key: key.into() };
        self.around_keyed(call, key, |inner, key| inner.copies_of(key))
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let call = Call::GetCopy {
            key: key.into(),
            copy,
        };
        self.around_keyed(call, key, move |inner, key| inner.get_copy(key, copy))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::mem::MemStore;

    /// Records every call it sees.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Call>>);

    impl Layer for Recorder {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: Call,
            mut next: Next<'a, T>,
        ) -> CallFuture<'a, T> {
            self.0.lock().expect("recorder lock").push(call);
            next()
        }
        fn describe(&self, inner: String) -> String {
            format!("recorded({inner})")
        }
    }

    /// Every method of the trait that reaches the store is seen by the layer: the
    /// point of the generic layer (a hand-written decorator once missed one).
    #[tokio::test]
    async fn every_store_call_passes_through_the_layer() {
        let mem: DynStore = Arc::new(MemStore::new());
        let s = Layered::wrap(mem, Recorder::default());
        s.put("k", Bytes::from_static(b"abcd"), PutMode::IfAbsent)
            .await
            .expect("put");
        s.put_placed(
            "g",
            Bytes::from_static(b"xy"),
            PutMode::Overwrite,
            &Placement::Gc {
                victim_keys: vec!["k".into()],
            },
        )
        .await
        .expect("put placed");
        assert_eq!(s.get("k").await.expect("get"), b"abcd");
        assert_eq!(s.get_range("k", 1..3).await.expect("range"), b"bc");
        assert_eq!(s.get_range_background("k", 0..1).await.expect("bg"), b"a");
        assert_eq!(s.list("").await.expect("list").len(), 2);
        assert!(
            s.get_range_copies("k", 0..1)
                .await
                .expect("copies")
                .is_empty()
        );
        assert!(
            s.repair_copies("k", Bytes::from_static(b"abcd"))
                .await
                .expect("repair")
                .is_empty()
        );
        assert_eq!(s.copies_of("k").await.expect("copies of").len(), 1);
        assert_eq!(s.get_copy("k", 0).await.expect("copy 0"), b"abcd");
        s.delete("g").await.expect("delete");
        let names: Vec<String> =
            s.0.lock()
                .expect("lock")
                .iter()
                .map(Call::describe)
                .collect();
        assert_eq!(
            names,
            [
                "put k",
                "put g",
                "get k",
                "get k bytes 1..3",
                "get k bytes 0..1",
                "list ''",
                "get copies of k",
                "repair k",
                "name the copies of k",
                "get copy 0 of k",
                "delete g",
            ]
        );
        assert!(
            s.describe().starts_with("recorded(mem://"),
            "{}",
            s.describe()
        );
        let calls = s.0.lock().expect("lock");
        assert!(calls[0].writes() && calls[1].writes() && !calls[2].writes());
        assert_eq!(
            calls[0],
            Call::Put {
                key: "k".into(),
                mode: PutMode::IfAbsent,
                size_bytes: 4
            }
        );
    }
}
