//! The object store, behind one narrow trait.
//!
//! The engine needs six operations: put (optionally only if absent), get, ranged get,
//! list, delete, and a description for messages. Implementations: a local directory
//! (the embedded default, durable through fsync), memory (tests), and fault-injecting
//! decorators (crash tests). Put-if-absent is the only atomic primitive the design
//! relies on; nothing needs compare-and-swap.

pub mod faulty;
pub mod fs;
pub mod mem;
pub mod retry;
pub mod s3;
pub mod selftest;

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    NotFound,
    AlreadyExists,
    /// Worth retrying: timeouts, throttling, connection errors, 5xx.
    Transient,
    /// Not worth retrying: bad credentials, bad request, permanent I/O errors.
    Permanent,
}

#[derive(Debug, Clone)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.kind == StoreErrorKind::NotFound
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for StoreError {}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    Overwrite,
    /// Fail with `AlreadyExists` if the key exists; atomic under races.
    IfAbsent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub key: String,
    pub size_bytes: u64,
}

pub trait ObjectStore: Send + Sync + 'static {
    /// Store `data` under `key`. `data` is shared and cheap to clone, so a retry or a
    /// caller that keeps the object (the uploader, for its next attempt) never copies
    /// the whole body.
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>>;
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>>;
    /// Bytes `range` of the object; a range past the end returns what exists.
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>>;
    /// [`get_range`](Self::get_range) for background work (GC reading its victims): a
    /// store that serves small ranges inline on the calling runtime thread (the local
    /// store) serves these off the runtime, so they never hold up client I/O.
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.get_range(key, range)
    }
    /// Every key that starts with `prefix`, in lexicographic order.
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>>;
    /// Deleting a missing key succeeds.
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>>;
    /// Where this store is, for messages (never includes credentials).
    fn describe(&self) -> String;
}

pub type DynStore = Arc<dyn ObjectStore>;

/// Open a store from a URL: `file:///path`, a plain path, `s3://BUCKET/PREFIX`, or
/// `mem://` (tests).
///
/// `s3://` takes its endpoint, region and credentials from the `AWS_*` environment
/// variables (see [`s3`]; `lsvd.toml` can set them instead through
/// `config_file::LsvdConfig::open_store`) and is wrapped in [`retry::RetryStore`] with
/// the default [`retry::RetryPolicy`]. Opening does no I/O: run [`selftest::run`] to
/// check the store before serving from it.
pub fn open_store(url: &str) -> Result<DynStore, String> {
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(Arc::new(fs::FsStore::open(std::path::Path::new(path))?));
    }
    if url.starts_with("mem://") {
        return Ok(Arc::new(mem::MemStore::new()));
    }
    if url.starts_with("s3://") {
        return s3::open_with_retry(
            url,
            &s3::S3Settings::default(),
            &retry::RetryPolicy::default(),
        );
    }
    if let Some((scheme, _)) = url.split_once("://") {
        let hint = match scheme {
            "gs" | "az" | "abfs" | "abfss" | "azure" => {
                " (Google Cloud Storage and Azure would work through object_store's `gcp`/`azure` \
                 features, which this build leaves out)"
            }
            _ => "",
        };
        return Err(format!(
            "store URL scheme '{scheme}://' is not supported by this build{hint} \
             (supported: file://PATH, a plain path, s3://BUCKET/PREFIX)"
        ));
    }
    Ok(Arc::new(fs::FsStore::open(std::path::Path::new(url))?))
}
