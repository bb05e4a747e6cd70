//! The object store, behind one narrow trait.
//!
//! The engine needs six operations: put (optionally only if absent), get, ranged get,
//! list, delete, and a description for messages. Implementations: a local directory
//! (the embedded default, durable through fsync), several local drives as one chained
//! log or stripe (`chain:`, `stripe:`), S3, Google Cloud Storage and Azure Blob Storage
//! (`s3://`, `gs://`, `az://`: one [`cloud`] store over `object_store`), memory
//! (tests), and fault-injecting decorators (crash tests). Put-if-absent is the only atomic primitive the design relies on;
//! nothing needs compare-and-swap.
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod azure;
pub mod chain;
pub mod clock;
pub mod cloud;
pub mod cloud_errors;
pub mod direct_buf;
pub mod faulty;
pub mod fs;
pub mod gcs;
pub mod layer;
pub mod log;
pub mod mem;
pub mod read_only;
pub mod retry;
pub mod s3;
pub mod s3_credentials;
pub mod sealed;
pub mod selftest;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod xts;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use lsvd_core::error::{Error, ErrorKind, Result};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors of the stores are the crate's [`Error`]. A store uses the kinds
/// `NotFound`, `AlreadyExists` (put-if-absent of a taken key), `Transient` (worth
/// retrying: timeouts, throttling, connection errors, 5xx), `Full` (no room: a full
/// filesystem, a quota, every drive of a chain full), `Denied` (credentials or file
/// permissions refused), `Corrupt` and `Permanent` (not worth retrying: a bad request,
/// a device error); only `Transient` is retried ([`retry::is_retryable`]). The table
/// of what each store answers is in docs/SEMANTICS.md, "Store error classes". Opening
/// a store can also fail with `BadInput`, `Unsupported` or `LocalIo`.
pub type StoreError = Error;
pub type StoreResult<T> = Result<T>;

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

/// Who is writing an object, for stores that choose among several devices (the
/// chained-drive store keeps GC output off the drive clients write to). Other stores
/// ignore it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Placement {
    /// Client data (and anything without a hint).
    #[default]
    Client,
    /// Garbage-collection output relocating live data out of `victim_keys`.
    Gc { victim_keys: Vec<String> },
}

pub trait ObjectStore: Send + Sync + 'static {
    /// Store `data` under `key`. `data` is shared and cheap to clone, so a retry or a
    /// caller that keeps the object (the uploader, for its next attempt) never copies
    /// the whole body.
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>>;
    /// [`put`](Self::put) with a hint on where the object belongs. Decorators forward
    /// it; stores with one place for everything ignore it (the default).
    fn put_placed(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        let _ = placement;
        self.put(key, data, mode)
    }
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
    /// True if reads from this store are local disk reads (the local directory, memory):
    /// then there is no point copying uploaded data into the read cache.
    fn is_local(&self) -> bool {
        false
    }
    /// Should the engine copy what it uploads into its read cache (under
    /// `--read-cache-admit auto`)? Yes for remote stores; the chain store says yes too,
    /// though local, so reads of fresh data stay off the drive taking the writes.
    fn admit_uploads_to_cache(&self) -> bool {
        !self.is_local()
    }
    /// True if the store seals what it holds under `<volume>/obj/` (an encrypted
    /// volume's [`sealed::SealedStore`]): the engine refuses to open an encrypted
    /// volume over a store that does not, so no plaintext object is ever written to it.
    fn seals_objects(&self) -> bool {
        false
    }
    /// The store's own counters and gauges, for `lsvd serve --metrics` and `lsvd info`
    /// (none for most stores).
    fn metrics(&self) -> Vec<StoreMetric> {
        Vec::new()
    }
    /// Bytes `range` of `key` from each copy the store keeps of it (the mirrored
    /// chain: both directories of its position), each read on its own, in the order
    /// reads try them; a copy that cannot be read is left out. It exists because
    /// [`get_range`](Self::get_range) hides the copies: when what it returned fails
    /// the engine's checksums, another copy may still be good, and only the engine
    /// can tell. Empty for stores with one copy (the default): nothing else to try.
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        let _ = (key, range);
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Overwrite each copy of `key` whose bytes differ from `good`, the whole object
    /// as the caller verified it (the engine, after a read fell back to a good copy).
    /// A copy that no longer holds the key is left alone: the object was deleted
    /// meanwhile, and a repair must not bring it back. Returns the copies rewritten
    /// (none for stores with one copy, the default).
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let _ = (key, good);
        Box::pin(async { Ok(Vec::new()) })
    }
    /// The copies the store keeps of `key`, named for messages (the mirrored chain:
    /// the directories of the position holding it), numbered as
    /// [`get_copy`](Self::get_copy) takes them. It exists so that `lsvd check` can
    /// verify every copy, not only the one reads happen to reach. Stores with one copy
    /// name one: themselves (the default).
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let _ = key;
        let me = self.describe();
        Box::pin(async move { Ok(vec![me]) })
    }
    /// The whole of `key` as copy `copy` (of [`copies_of`](Self::copies_of)) holds it,
    /// read from that copy alone: no other copy tried, nothing repaired. `NotFound` if
    /// that copy lacks it. Stores with one copy read copy 0 with
    /// [`get`](Self::get) (the default).
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        if copy == 0 {
            return self.get(key);
        }
        let e = Error::bad_input(format!("{key}: no copy {copy} (the store keeps one)"));
        Box::pin(async move { Err(e) })
    }
}

/// One copy's bytes ([`ObjectStore::get_range_copies`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyBytes {
    /// Which copy (its directory), for messages.
    pub copy: String,
    pub bytes: Vec<u8>,
}

/// One metric a store reports: `lsvd_store_{name}` in the Prometheus output.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMetric {
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    pub help: &'static str,
    pub value: f64,
}

pub type DynStore = Arc<dyn ObjectStore>;

/// The store URL forms [`open_store`] knows, for messages.
pub const KNOWN_STORE_URLS: &str = "file://PATH, a plain path, s3://BUCKET/PREFIX, \
     gs://BUCKET/PREFIX, az://CONTAINER/PREFIX, chain:DIR0,DIR1[,...][?OPTIONS], \
     stripe:DIR0,DIR1[,...]";

/// Open a store from a URL: `file:///path`, a plain path, `s3://BUCKET/PREFIX`,
/// `gs://BUCKET/PREFIX` (Google Cloud Storage), `az://CONTAINER/PREFIX` (Azure Blob
/// Storage), `chain:DIR0,DIR1[,...][?OPTIONS]` and `stripe:DIR0,DIR1[,...]` (several
/// local drives, see [`chain`]), or `mem://` (tests).
///
/// The cloud stores take their settings from their standard environment variables:
/// `AWS_*` for `s3://` (see [`s3`]; `lsvd.toml` can set them instead through
/// `config_file::LsvdConfig::open_store`), `GOOGLE_*` for `gs://` (see [`gcs`]) and
/// `AZURE_*` for `az://` (see [`azure`]). Every store but `mem://` is wrapped in
/// [`retry::RetryStore`] with the default [`retry::RetryPolicy`] (see
/// [`open_store_with`]). Opening does no I/O: run [`selftest::run`] to check the store
/// before serving from it.
pub fn open_store(url: &str) -> Result<DynStore> {
    open_store_with(url, &retry::RetryPolicy::default())
}

/// How a store is opened: for the commands that may change it, or for reading only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// `lsvd serve`, and the commands that take the data directory's lock or write to
    /// the store: an open may do the store's own upkeep (a chain creates its drive
    /// records, brings a mirror copy that was away or blank in step, and its reads
    /// write a missing copy back).
    #[default]
    ReadWrite,
    /// `lsvd info`, `check`, `inspect`, `list`, `snapshot list`: nothing in the store
    /// changes, not even a directory created. They take no lock and may run beside a
    /// live server, so upkeep is left to the commands that hold the lock: a chain's
    /// mirror copy found behind is read around, not repaired, and every put, delete
    /// or repair is refused ([`read_only::ReadOnlyStore`]).
    ReadOnly,
}

/// [`open_store`] with the retries of `policy` (`lsvd.toml`'s `[retry]`): the one
/// retry layer every store gets, local directory, chain and stripe as much as the
/// cloud stores. `mem://` (tests) is not wrapped: it never fails for a while.
pub fn open_store_with(url: &str, policy: &retry::RetryPolicy) -> Result<DynStore> {
    open_store_mode(url, policy, OpenMode::ReadWrite)
}

/// [`open_store_with`] in `mode`: [`OpenMode::ReadOnly`] opens the local stores
/// without creating or repairing anything and wraps every store in
/// [`read_only::ReadOnlyStore`].
pub fn open_store_mode(url: &str, policy: &retry::RetryPolicy, mode: OpenMode) -> Result<DynStore> {
    let store = open_store_inner(url, policy, mode)?;
    Ok(match mode {
        OpenMode::ReadWrite => store,
        OpenMode::ReadOnly => Arc::new(read_only::ReadOnlyStore::new(store)),
    })
}

/// The local directory at `path` as a store opened in `mode`.
fn open_dir(path: &std::path::Path, mode: OpenMode) -> Result<fs::FsStore> {
    match mode {
        OpenMode::ReadWrite => fs::FsStore::open(path),
        OpenMode::ReadOnly => fs::FsStore::open_read_only(path),
    }
}

fn open_store_inner(url: &str, policy: &retry::RetryPolicy, mode: OpenMode) -> Result<DynStore> {
    let retrying =
        |inner: DynStore| -> DynStore { Arc::new(retry::RetryStore::new(inner, policy.clone())) };
    if let Some(path) = url.strip_prefix("file://") {
        let fs = open_dir(std::path::Path::new(path), mode)?;
        return Ok(retrying(Arc::new(fs)));
    }
    if url.starts_with("mem://") {
        return Ok(Arc::new(mem::MemStore::new()));
    }
    if let Some(spec) = url.strip_prefix("chain:") {
        return Ok(retrying(chain::open_chain_mode(spec, mode)?));
    }
    if let Some(spec) = url.strip_prefix("stripe:") {
        return Ok(retrying(chain::open_stripe_mode(spec, mode)?));
    }
    if url.starts_with("s3://") {
        return s3::open_with_retry(url, &s3::S3Settings::default(), policy);
    }
    if url.starts_with("gs://") {
        return gcs::open_with_retry(url, &cloud::ClientSettings::default(), policy);
    }
    if url.starts_with("az://") {
        return azure::open_with_retry(url, &cloud::ClientSettings::default(), policy);
    }
    if let Some(scheme) = url_scheme(url) {
        let hint = match scheme {
            "abfs" | "abfss" | "azure" | "adl" => {
                " (for Azure Blob Storage write az://CONTAINER/PREFIX and set \
                 AZURE_STORAGE_ACCOUNT_NAME)"
            }
            "gcs" => " (for Google Cloud Storage write gs://BUCKET/PREFIX)",
            _ => "",
        };
        return Err(Error::new(
            ErrorKind::BadInput,
            format!(
                "store URL scheme '{scheme}:' is not known{hint} (known: {KNOWN_STORE_URLS}; \
                 a directory whose name has a colon: ./{url})"
            ),
        ));
    }
    let fs = open_dir(std::path::Path::new(url), mode)?;
    Ok(retrying(Arc::new(fs)))
}

/// The scheme of a store URL (`s3` of `s3://b/p`, `chain` of `chain:a,b`): letters,
/// digits, `+ - .` starting with a letter, then a colon. None for a plain path (which
/// may still hold a colon after a `/` or a `.`: `./a:b`, `/srv/a:b`).
fn url_scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}
