//! Helpers for unit tests: self-cleaning temporary directories.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "lsvd-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A store that lets another process act at the worst moment of a command: `hook`
/// runs once, just before the `nth` call (counting from 1) that `is_point` matches
/// (a put of a key, a listing of a prefix) goes to `inner`.
pub struct HookStore {
    inner: crate::DynStore,
    is_point: Box<dyn Fn(HookOp<'_>) -> bool + Send + Sync>,
    nth: u64,
    seen: std::sync::atomic::AtomicU64,
    hook: std::sync::Mutex<Option<crate::BoxFuture<'static, ()>>>,
}

/// The calls a [`HookStore`] can stop before.
#[derive(Debug, Clone, Copy)]
pub enum HookOp<'a> {
    Put(&'a str),
    List(&'a str),
}

impl HookStore {
    pub fn new(
        inner: crate::DynStore,
        is_point: impl Fn(HookOp<'_>) -> bool + Send + Sync + 'static,
        nth: u64,
        hook: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> HookStore {
        HookStore {
            inner,
            is_point: Box::new(is_point),
            nth,
            seen: Default::default(),
            hook: std::sync::Mutex::new(Some(Box::pin(hook))),
        }
    }

    fn hook_for(&self, op: HookOp<'_>) -> Option<crate::BoxFuture<'static, ()>> {
        if !(self.is_point)(op) {
            return None;
        }
        let n = self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        (n == self.nth)
            .then(|| self.hook.lock().unwrap_or_else(|p| p.into_inner()).take())
            .flatten()
    }
}

impl crate::ObjectStore for HookStore {
    fn put(
        &self,
        key: &str,
        data: bytes::Bytes,
        mode: crate::PutMode,
    ) -> crate::BoxFuture<'_, crate::StoreResult<()>> {
        let hook = self.hook_for(HookOp::Put(key));
        let key = key.to_string();
        Box::pin(async move {
            if let Some(h) = hook {
                h.await;
            }
            self.inner.put(&key, data, mode).await
        })
    }
    fn get(&self, key: &str) -> crate::BoxFuture<'_, crate::StoreResult<Vec<u8>>> {
        self.inner.get(key)
    }
    fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> crate::BoxFuture<'_, crate::StoreResult<Vec<u8>>> {
        self.inner.get_range(key, range)
    }
    fn list(
        &self,
        prefix: &str,
    ) -> crate::BoxFuture<'_, crate::StoreResult<Vec<crate::ListEntry>>> {
        let hook = self.hook_for(HookOp::List(prefix));
        let prefix = prefix.to_string();
        Box::pin(async move {
            if let Some(h) = hook {
                h.await;
            }
            self.inner.list(&prefix).await
        })
    }
    fn delete(&self, key: &str) -> crate::BoxFuture<'_, crate::StoreResult<()>> {
        self.inner.delete(key)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
