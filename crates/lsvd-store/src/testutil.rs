//! Helpers for unit tests: self-cleaning temporary directories, listing a store's
//! keys, checking reads and deletes, log objects whose bytes name their key, the
//! directories of a mirrored chain, and the prefix check of the replication oracles.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The keys `store` lists under `prefix`, in its order.
pub async fn list_keys(store: &dyn crate::ObjectStore, prefix: &str) -> Vec<String> {
    let entries = store.list(prefix).await.expect("list");
    entries.into_iter().map(|e| e.key).collect()
}

/// The key of data object `seq` of volume `v` (a log object: a chain places it on its
/// tail).
pub fn data_object_key(seq: u64) -> String {
    format!("v/obj/{seq:016x}.d")
}

/// `len` bytes that repeat `key`: an object whose contents say which key it is.
pub fn key_body(key: &str, len: usize) -> bytes::Bytes {
    bytes::Bytes::from(key.bytes().cycle().take(len).collect::<Vec<u8>>())
}

/// Reads `key` whole from `store` and asserts it holds `want`.
pub async fn assert_holds(store: &dyn crate::ObjectStore, key: &str, want: &[u8]) {
    let got = store
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"));
    assert!(got == want, "contents of {key}");
}

/// Two mirrored chain positions under `root`, `[[a, a2], [b, b2]]`, and the drive list
/// of a `chain:` URL naming them (`A+A2,B+B2`, without options).
pub fn mirrored_positions(root: &TempDir) -> (Vec<[PathBuf; 2]>, String) {
    let pos: Vec<[PathBuf; 2]> = ["a", "b"]
        .iter()
        .map(|n| [root.path().join(n), root.path().join(format!("{n}2"))])
        .collect();
    let list: Vec<String> = pos
        .iter()
        .map(|[x, y]| format!("{}+{}", x.display(), y.display()))
        .collect();
    (pos, list.join(","))
}

/// Deletes `key` twice (deleting what is missing succeeds too) and asserts it is gone.
pub async fn assert_deleted_twice(store: &dyn crate::ObjectStore, key: &str) {
    store.delete(key).await.expect("delete");
    store.delete(key).await.expect("delete missing is ok");
    let gone = store.get(key).await.expect_err("gone");
    assert!(gone.is_not_found(), "{key}: {gone}");
}

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
/// (a put of a key, a listing of a prefix) goes to the inner store.
pub type HookStore = crate::layer::Layered<Hook>;

/// The [`HookStore`]'s layer.
pub struct Hook {
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

impl crate::layer::Layered<Hook> {
    pub fn new(
        inner: crate::DynStore,
        is_point: impl Fn(HookOp<'_>) -> bool + Send + Sync + 'static,
        nth: u64,
        hook: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> HookStore {
        let hook = Hook {
            is_point: Box::new(is_point),
            nth,
            seen: Default::default(),
            hook: std::sync::Mutex::new(Some(Box::pin(hook))),
        };
        crate::layer::Layered::wrap(inner, hook)
    }
}

impl Hook {
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

impl crate::layer::Layer for Hook {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: crate::layer::Call,
        mut next: crate::layer::Next<'a, T>,
    ) -> crate::layer::CallFuture<'a, T> {
        let hook = match &call {
            crate::layer::Call::Put { key, .. } => self.hook_for(HookOp::Put(key)),
            crate::layer::Call::List { prefix } => self.hook_for(HookOp::List(prefix)),
            _ => None,
        };
        Box::pin(async move {
            if let Some(h) = hook {
                h.await;
            }
            next().await
        })
    }
}

/// The length of the prefix of `writes` (block, version), applied to a volume never
/// written, after which the blocks hold `state`; None when no prefix does (a mix of
/// points, or a write that is not in `writes`). Versions are unique, so at most one
/// prefix matches.
pub fn prefix_len(writes: &[(u64, u64)], state: &[u64]) -> Option<usize> {
    let mut now = vec![0u64; state.len()];
    let mut differ = state.iter().filter(|&&v| v != 0).count();
    if differ == 0 {
        return Some(0);
    }
    for (i, &(b, v)) in writes.iter().enumerate() {
        let b = b as usize;
        let was = now[b] == state[b];
        now[b] = v;
        match (was, now[b] == state[b]) {
            (true, false) => differ += 1,
            (false, true) => differ -= 1,
            _ => {}
        }
        if differ == 0 {
            return Some(i + 1);
        }
    }
    None
}

/// The value of the store metric `name` (panics naming it if the store has none).
pub fn store_metric(s: &dyn crate::ObjectStore, name: &str) -> f64 {
    s.metrics()
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no store metric {name}"))
        .value
}

/// Every entry under `dir`, recursively (an unreadable directory is passed over):
/// each path, and whether it is a directory.
pub fn entries_under(dir: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let is_dir = p.is_dir();
            if is_dir {
                todo.push(p.clone());
            }
            out.push((p, is_dir));
        }
    }
    out
}
