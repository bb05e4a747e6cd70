//! A local directory as the object store: the embedded default.
//!
//! Each key is a file under the root. A put writes a temporary file, fsyncs it, and
//! moves it into place (rename for overwrite, link for put-if-absent, which fails
//! atomically if the name exists), then fsyncs the directory: an acknowledged put
//! survives power loss. Listing walks the directory tree.
//!
//! Large puts (objects) bypass the page cache with `O_DIRECT` where the filesystem
//! allows it: a buffered 8 MiB `write` took 21 ms of kernel CPU at the median on ext4
//! (page-cache allocation and delayed-allocation bookkeeping per 4 KiB page), time a
//! client request waiting for that CPU shares; copied through a small aligned buffer
//! and written directly it takes a fraction of that.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;

use super::direct_buf::DIRECT_ALIGN;
use super::{BoxFuture, ListEntry, ObjectStore, PutMode, StoreResult};
use lsvd_core::error::{Error, ErrorKind};

#[derive(Clone)]
pub struct FsStore {
    inner: Arc<FsInner>,
}

struct FsInner {
    root: PathBuf,
    tmp_counter: AtomicU64,
    /// Set once the filesystem refused `O_DIRECT`: every put is buffered from then on.
    direct_refused: AtomicBool,
}

/// Puts of at least this many bytes are written with `O_DIRECT`.
const DIRECT_MIN_BYTES: usize = 1 << 20;

/// Bytes copied into the aligned buffer and written per `pwrite`.
const DIRECT_CHUNK_BYTES: usize = 1 << 20;

/// `what` failed on `path`: the store's kind for `e` ([`io_error_kind`]), with `e` as
/// the source.
fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::with_source(io_error_kind(&e), format!("{what} {}", path.display()), e)
}

/// The store error class of a failed file operation (docs/SEMANTICS.md, "Store error
/// classes"). The errno decides where there is one; errors made up by the standard
/// library (no errno) go by their `io::ErrorKind`.
///
/// * `ENOSPC`, `EDQUOT`: [`Full`](ErrorKind::Full). Room comes back only when someone
///   makes it (GC deleting objects, the operator); retrying in a loop meanwhile only
///   hides the problem, so it is reported at once.
/// * `EACCES`, `EPERM`, `EROFS`: [`Denied`](ErrorKind::Denied): the store's files
///   refuse this process.
/// * `EINTR`, `EAGAIN`, `ETIMEDOUT`, `ENOMEM`, `ENOBUFS`, `EMFILE`, `ENFILE`, `EBUSY`,
///   `ESTALE`, and the network errors a store directory on NFS or FUSE passes on:
///   [`Transient`](ErrorKind::Transient), a retry may well succeed.
/// * `EIO` and everything else (`EFBIG`, `ENAMETOOLONG`, `ENOTDIR`, `EINVAL`, ...):
///   [`Permanent`](ErrorKind::Permanent). `EIO` is the device failing a request after
///   its own retries; sending the same request again rarely helps, and on a mirrored
///   chain it is what drops the failing copy.
pub(crate) fn io_error_kind(e: &std::io::Error) -> ErrorKind {
    if let Some(errno) = e.raw_os_error() {
        return match errno {
            libc::ENOENT => ErrorKind::NotFound,
            libc::EEXIST => ErrorKind::AlreadyExists,
            libc::ENOSPC | libc::EDQUOT => ErrorKind::Full,
            libc::EACCES | libc::EPERM | libc::EROFS => ErrorKind::Denied,
            libc::EINTR
            | libc::EAGAIN
            | libc::ETIMEDOUT
            | libc::ENOMEM
            | libc::ENOBUFS
            | libc::EMFILE
            | libc::ENFILE
            | libc::EBUSY
            | libc::ESTALE
            | libc::ENOTCONN
            | libc::ECONNRESET
            | libc::ECONNABORTED
            | libc::EHOSTDOWN
            | libc::EHOSTUNREACH
            | libc::ENETDOWN
            | libc::ENETUNREACH => ErrorKind::Transient,
            _ => ErrorKind::Permanent,
        };
    }
    use std::io::ErrorKind as Io;
    match e.kind() {
        Io::NotFound => ErrorKind::NotFound,
        Io::AlreadyExists => ErrorKind::AlreadyExists,
        Io::StorageFull | Io::QuotaExceeded => ErrorKind::Full,
        Io::PermissionDenied | Io::ReadOnlyFilesystem => ErrorKind::Denied,
        Io::Interrupted | Io::WouldBlock | Io::TimedOut => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

pub(crate) fn valid_key(key: &str) -> StoreResult<()> {
    let ok = !key.is_empty()
        && !key.starts_with('/')
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.starts_with(".tmp"));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Permanent,
            format!("invalid object key '{key}'"),
        ))
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Create `path` and write `data` with `O_DIRECT`: its whole blocks straight from
/// `data` if that is aligned ([`DirectBuf`]), the rest (or everything, if unaligned)
/// through an aligned buffer of at most [`DIRECT_CHUNK_BYTES`]; the last block is
/// padded with zeros, then the file is cut to the exact length.
fn write_direct(path: &Path, data: &[u8]) -> std::io::Result<fs::File> {
    // Like File::create: a temporary file left by a crashed process of the same pid
    // is replaced (create_new would report AlreadyExists, which callers read as "the
    // key exists").
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut at = 0usize;
    if data.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
        // Whole blocks without a copy; write_all_at reports a short write's unaligned
        // rest (EINVAL) rather than writing wrongly.
        at = data.len() - data.len() % DIRECT_ALIGN;
        f.write_all_at(&data[..at], 0)?;
        if at == data.len() {
            return Ok(f);
        }
    }
    let chunk_bytes = (data.len() - at)
        .next_multiple_of(DIRECT_ALIGN)
        .min(DIRECT_CHUNK_BYTES);
    let mut buf = vec![0u8; chunk_bytes + DIRECT_ALIGN];
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
    let buf = &mut buf[start..start + chunk_bytes];
    while at < data.len() {
        let n = (data.len() - at).min(chunk_bytes);
        let padded = n.next_multiple_of(DIRECT_ALIGN);
        buf[..n].copy_from_slice(&data[at..at + n]);
        buf[n..padded].fill(0);
        // One aligned pwrite per chunk; a short write would leave an unaligned rest,
        // which write_all_at reports (EINVAL) rather than writing wrongly.
        f.write_all_at(&buf[..padded], at as u64)?;
        at += n;
    }
    if !data.len().is_multiple_of(DIRECT_ALIGN) {
        f.set_len(data.len() as u64)?;
    }
    Ok(f)
}

impl FsStore {
    /// The store in directory `root`, created if missing.
    pub fn open(root: &Path) -> lsvd_core::error::Result<Self> {
        fs::create_dir_all(root).map_err(|e| {
            Error::local_io(
                format!("cannot create store directory {}", root.display()),
                e,
            )
        })?;
        Self::open_existing(root)
    }

    /// The store in directory `root` for reading only: nothing is created. A missing
    /// directory is an empty store (it lists nothing, every key is `NotFound`), so a
    /// read-only command leaves no trace; a path that is not a directory is
    /// `BadInput`.
    pub fn open_read_only(root: &Path) -> lsvd_core::error::Result<Self> {
        match fs::metadata(root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::at(root)),
            _ => Self::open_existing(root),
        }
    }

    fn open_existing(root: &Path) -> lsvd_core::error::Result<Self> {
        let meta = fs::metadata(root)
            .map_err(|e| Error::local_io(format!("store {}", root.display()), e))?;
        if !meta.is_dir() {
            return Err(Error::bad_input(format!(
                "store {} is not a directory",
                root.display()
            )));
        }
        Ok(Self::at(root))
    }

    fn at(root: &Path) -> Self {
        FsStore {
            inner: Arc::new(FsInner {
                root: root.to_path_buf(),
                tmp_counter: AtomicU64::new(0),
                direct_refused: AtomicBool::new(false),
            }),
        }
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    fn put_sync(&self, key: &str, data: &[u8], mode: PutMode) -> StoreResult<()> {
        valid_key(key)?;
        let path = self.inner.root.join(key);
        #[cfg(test)]
        if let Some(errno) = injected::put_errno(&self.inner.root) {
            return Err(io_err(
                "write",
                &path,
                std::io::Error::from_raw_os_error(errno),
            ));
        }
        let dir = path.parent().unwrap_or(&self.inner.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| io_err("create directory", &dir, e))?;
        let n = self.inner.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".tmp.{}.{n}", std::process::id()));
        let result = (|| {
            let f = self.write_tmp(&tmp, data)?;
            f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
            match mode {
                PutMode::Overwrite => {
                    fs::rename(&tmp, &path).map_err(|e| io_err("rename to", &path, e))?
                }
                PutMode::IfAbsent => {
                    fs::hard_link(&tmp, &path).map_err(|e| io_err("link", &path, e))?
                }
            }
            sync_dir(&dir).map_err(|e| io_err("fsync directory", &dir, e))
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    /// Create `tmp` holding `data` (not yet synced): with `O_DIRECT` for large puts
    /// unless the filesystem refused it before, else buffered.
    fn write_tmp(&self, tmp: &Path, data: &[u8]) -> StoreResult<fs::File> {
        if data.len() >= DIRECT_MIN_BYTES && !self.inner.direct_refused.load(Ordering::Relaxed) {
            match write_direct(tmp, data) {
                Ok(f) => return Ok(f),
                // EINVAL: this filesystem (or this device's alignment) does not take
                // O_DIRECT. Say so once, then write buffered.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    let _ = fs::remove_file(tmp);
                    if !self.inner.direct_refused.swap(true, Ordering::Relaxed) {
                        crate::log::debug(&format!(
                            "store {}: O_DIRECT refused ({e}); writing objects through the page cache",
                            self.inner.root.display()
                        ));
                    }
                }
                Err(e) => return Err(io_err("write", tmp, e)),
            }
        }
        let mut f = fs::File::create(tmp).map_err(|e| io_err("create", tmp, e))?;
        f.write_all(data).map_err(|e| io_err("write", tmp, e))?;
        Ok(f)
    }

    fn get_range_sync(&self, key: &str, range: Option<Range<u64>>) -> StoreResult<Vec<u8>> {
        /// Most a ranged read reserves before reading: more than any object lsvd writes
        /// (a 32 MiB batch and its header).
        const RESERVE_CAP_BYTES: u64 = 64 << 20;
        valid_key(key)?;
        let path = self.inner.root.join(key);
        let mut f = fs::File::open(&path).map_err(|e| io_err("open", &path, e))?;
        let mut buf = Vec::new();
        match range {
            None => {
                f.read_to_end(&mut buf)
                    .map_err(|e| io_err("read", &path, e))?;
            }
            Some(r) => {
                // Room for the range up front: `read_to_end` through `Take` cannot see
                // the size, and grew the buffer by doubling, copying what it had read
                // each time. Capped, so a range far past the end (which returns what
                // exists) costs no more than that; no `fstat` on the read path.
                let want = r.end.saturating_sub(r.start);
                buf.reserve_exact(usize::try_from(want.min(RESERVE_CAP_BYTES)).unwrap_or(0));
                f.seek(SeekFrom::Start(r.start))
                    .map_err(|e| io_err("seek", &path, e))?;
                f.take(want)
                    .read_to_end(&mut buf)
                    .map_err(|e| io_err("read", &path, e))?;
            }
        }
        Ok(buf)
    }

    pub(crate) fn list_sync(&self, prefix: &str) -> StoreResult<Vec<ListEntry>> {
        let mut out = Vec::new();
        // Only walk the directory that can hold matching keys.
        let base = match prefix.rfind('/') {
            Some(i) => &prefix[..i + 1],
            None => "",
        };
        let start = self.inner.root.join(base);
        if !start.exists() {
            return Ok(out);
        }
        let mut stack = vec![(start, base.to_string())];
        while let Some((dir, rel)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("list", &dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_err("list", &dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(".tmp") {
                    continue;
                }
                let key = format!("{rel}{name}");
                // A key deleted while we list (GC, checkpoint pruning) is simply gone.
                let ft = match entry.file_type() {
                    Ok(ft) => ft,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err("stat", &entry.path(), e)),
                };
                if ft.is_dir() {
                    if prefix.starts_with(&key) || key.starts_with(prefix) {
                        stack.push((entry.path(), format!("{key}/")));
                    }
                } else if key.starts_with(prefix) {
                    let size_bytes = match entry.metadata() {
                        Ok(m) => m.len(),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io_err("stat", &entry.path(), e)),
                    };
                    out.push(ListEntry { key, size_bytes });
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete_sync(&self, key: &str) -> StoreResult<()> {
        valid_key(key)?;
        let path = self.inner.root.join(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("delete", &path, e)),
        }
    }
}

/// Unit tests make the puts of one store directory fail with an errno (a full or
/// read-only filesystem a test cannot mount), by the directory's path, so parallel
/// tests do not see each other's faults.
#[cfg(test)]
pub(crate) mod injected {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static PUT_ERRNO: Mutex<Vec<(PathBuf, i32)>> = Mutex::new(Vec::new());

    fn table() -> std::sync::MutexGuard<'static, Vec<(PathBuf, i32)>> {
        PUT_ERRNO.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on every put into the store directory `root` fails with `errno`
    /// (`None`: puts work again).
    pub(crate) fn fail_puts(root: &Path, errno: Option<i32>) {
        let mut t = table();
        t.retain(|(p, _)| p != root);
        if let Some(errno) = errno {
            t.push((root.to_path_buf(), errno));
        }
    }

    pub(super) fn put_errno(root: &Path) -> Option<i32> {
        table().iter().find(|(p, _)| p == root).map(|&(_, e)| e)
    }
}

/// Ranged reads up to this size are done inline, larger ones on the blocking pool.
const INLINE_READ_BYTES: u64 = 256 << 10;

/// `f` on tokio's blocking pool (file system calls that may wait on the disk), its
/// task failing counted as a transient store error. For the stores on local drives.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Transient, "store task failed", e))?
}

impl FsStore {
    /// `op` on the blocking pool, given the store and `key` (both owned by the task).
    fn blocking_on<T: Send + 'static>(
        &self,
        key: &str,
        op: impl FnOnce(&FsStore, &str) -> StoreResult<T> + Send + 'static,
    ) -> BoxFuture<'static, StoreResult<T>> {
        let (this, key) = (self.clone(), key.to_string());
        Box::pin(blocking(move || op(&this, &key)))
    }
}

impl ObjectStore for FsStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.blocking_on(key, move |s, key| s.put_sync(key, &data, mode))
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.blocking_on(key, |s, key| s.get_range_sync(key, None))
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        // Small ranged reads of local files are cheaper inline than on the blocking pool;
        // large ones (GC reading its victims) would hold up a runtime thread serving
        // client I/O.
        if range.end.saturating_sub(range.start) > INLINE_READ_BYTES {
            return self.get_range_background(key, range);
        }
        let result = self.get_range_sync(key, Some(range));
        Box::pin(async move { result })
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        self.blocking_on(key, move |s, key| s.get_range_sync(key, Some(range)))
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        self.blocking_on(prefix, |s, prefix| s.list_sync(prefix))
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.blocking_on(key, |s, key| s.delete_sync(key))
    }
    fn describe(&self) -> String {
        format!("file://{}", self.inner.root.display())
    }
    fn is_local(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct_buf::DirectBuf;
    use crate::testutil::{TempDir, assert_deleted_twice, list_keys};

    /// Found by the crash oracle (`store_faults`, seed 0xec1e2e1e84be58ee): a listing
    /// failed with "stat ...: No such file or directory" because a checkpoint was
    /// deleted between reading the directory and looking at the entry.
    #[test]
    fn listing_while_keys_are_deleted_never_fails() {
        let dir = TempDir::new("fsstore-list-race");
        let s = FsStore::open(dir.path()).expect("open");
        let keys: Vec<String> = (0..3000).map(|i| format!("v/obj/{i:016x}.d")).collect();
        for k in &keys {
            s.put_sync(k, b"x", PutMode::IfAbsent).expect("put");
        }
        let deleter = {
            let s = s.clone();
            let keys = keys.clone();
            std::thread::spawn(move || {
                for k in keys.iter().rev() {
                    std::fs::remove_file(s.inner.root.join(k)).expect("delete");
                }
            })
        };
        let mut listings = 0;
        while !deleter.is_finished() {
            let l = s.list_sync("v/obj/").expect("a listing racing deletions");
            assert!(l.len() <= keys.len());
            listings += 1;
        }
        deleter.join().expect("deleter");
        assert!(listings > 0);
        assert!(s.list_sync("v/obj/").expect("list").is_empty());
    }

    /// Large puts go through `O_DIRECT` (chunks of 1 MiB, the last block padded then
    /// cut): every size around the chunk and block boundaries reads back exactly, in
    /// both modes. On ext4 (this project's machines) the direct path must have run.
    #[test]
    fn large_puts_read_back_exactly() {
        let dir = TempDir::new("fsstore-direct");
        let s = FsStore::open(dir.path()).expect("open");
        // A temporary file a crashed process with this pid left under the name the
        // first put uses: replaced, not taken for the key existing.
        std::fs::create_dir_all(dir.path().join("v/obj")).expect("mkdir");
        let stale = dir
            .path()
            .join(format!("v/obj/.tmp.{}.0", std::process::id()));
        std::fs::write(&stale, b"left by a crash").expect("stale tmp");
        let sizes = [
            DIRECT_MIN_BYTES,
            DIRECT_MIN_BYTES + 1,
            DIRECT_MIN_BYTES + DIRECT_ALIGN - 1,
            2 * DIRECT_CHUNK_BYTES + 512,
            3 * DIRECT_CHUNK_BYTES - 1,
            8 << 20,
        ];
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7 + j / 4096) as u8).collect();
            let mode = if i % 2 == 0 {
                PutMode::IfAbsent
            } else {
                PutMode::Overwrite
            };
            let key = format!("v/obj/{i:04}.d");
            s.put_sync(&key, &data, mode).expect("put");
            let back = s.get_range_sync(&key, None).expect("get");
            assert_eq!(back.len(), n, "size {n}");
            assert!(back == data, "contents of a {n}-byte put");
            let tail = s
                .get_range_sync(&key, Some(n as u64 - 10..n as u64 + 100))
                .expect("get tail");
            assert_eq!(tail, data[n - 10..], "tail of a {n}-byte put");
        }
        let on_ext4 = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(dir.path())
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "ext2/ext3");
        if on_ext4 {
            assert!(
                !s.inner.direct_refused.load(Ordering::Relaxed),
                "ext4 takes O_DIRECT: the direct path must have been used"
            );
        }
    }

    /// Objects built in a [`DirectBuf`] are written from it without a bounce copy:
    /// their bytes are aligned, whole blocks go straight out and only the tail is
    /// copied. Every size around the block and chunk boundaries reads back exactly, and
    /// a slice of the buffer not starting on a block (unaligned) still does.
    #[test]
    fn aligned_buffers_are_written_in_place_and_read_back_exactly() {
        let dir = TempDir::new("fsstore-directbuf");
        let s = FsStore::open(dir.path()).expect("open");
        let sizes = [
            DIRECT_MIN_BYTES,
            DIRECT_MIN_BYTES + 1,
            DIRECT_MIN_BYTES + DIRECT_ALIGN - 1,
            3 * DIRECT_CHUNK_BYTES + 512,
            (8 << 20) + 4608,
        ];
        for (i, &n) in sizes.iter().enumerate() {
            let pattern = |j: usize| (j * 13 + i * 5 + j / 4096) as u8;
            // Zeroed then written, or filled in order (alternately).
            let buf = if i % 2 == 0 {
                let mut buf = DirectBuf::zeroed(n);
                for (j, b) in buf.as_mut_slice().iter_mut().enumerate() {
                    *b = pattern(j);
                }
                buf
            } else {
                DirectBuf::filled(n, |v| v.extend((0..n).map(pattern)))
            };
            let bytes = buf.into_bytes();
            assert_eq!(bytes.len(), n);
            assert_eq!(
                bytes.as_ptr().align_offset(DIRECT_ALIGN),
                0,
                "a DirectBuf starts on a block"
            );
            let key = format!("v/obj/{i:04}.d");
            s.put_sync(&key, &bytes, PutMode::IfAbsent).expect("put");
            let back = s.get_range_sync(&key, None).expect("get");
            assert!(back[..] == bytes[..], "contents of a {n}-byte aligned put");
            // Off by one byte: the copying path.
            let unaligned = bytes.slice(1..);
            let key = format!("v/obj/{i:04}u.d");
            s.put_sync(&key, &unaligned, PutMode::IfAbsent)
                .expect("put");
            let back = s.get_range_sync(&key, None).expect("get");
            assert!(
                back[..] == unaligned[..],
                "contents of a {n}-byte unaligned put"
            );
        }
    }

    /// Every errno a store directory can answer with, and the class it is given (the
    /// table in docs/SEMANTICS.md, "Store error classes"). A full filesystem used to be
    /// `Transient`, so the engine retried its uploads forever.
    #[test]
    fn errors_are_classified_by_errno() {
        use std::io::Error as IoError;
        let cases = [
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EEXIST, ErrorKind::AlreadyExists),
            (libc::ENOSPC, ErrorKind::Full),
            (libc::EDQUOT, ErrorKind::Full),
            (libc::EACCES, ErrorKind::Denied),
            (libc::EPERM, ErrorKind::Denied),
            (libc::EROFS, ErrorKind::Denied),
            (libc::EINTR, ErrorKind::Transient),
            (libc::EAGAIN, ErrorKind::Transient),
            (libc::ETIMEDOUT, ErrorKind::Transient),
            (libc::ENOMEM, ErrorKind::Transient),
            (libc::EMFILE, ErrorKind::Transient),
            (libc::ESTALE, ErrorKind::Transient),
            (libc::ENOTCONN, ErrorKind::Transient),
            (libc::EIO, ErrorKind::Permanent),
            (libc::EFBIG, ErrorKind::Permanent),
            (libc::ENAMETOOLONG, ErrorKind::Permanent),
            (libc::ENOTDIR, ErrorKind::Permanent),
            (libc::EINVAL, ErrorKind::Permanent),
        ];
        for (errno, want) in cases {
            let e = io_err(
                "write",
                Path::new("/s/k"),
                IoError::from_raw_os_error(errno),
            );
            assert_eq!(e.kind, want, "errno {errno}: {e}");
            assert!(e.to_string().starts_with("write /s/k: "), "{e}");
        }
        // Errors without an errno go by their kind.
        for (kind, want) in [
            (std::io::ErrorKind::StorageFull, ErrorKind::Full),
            (std::io::ErrorKind::QuotaExceeded, ErrorKind::Full),
            (std::io::ErrorKind::PermissionDenied, ErrorKind::Denied),
            (std::io::ErrorKind::ReadOnlyFilesystem, ErrorKind::Denied),
            (std::io::ErrorKind::TimedOut, ErrorKind::Transient),
            (std::io::ErrorKind::NotFound, ErrorKind::NotFound),
            (std::io::ErrorKind::UnexpectedEof, ErrorKind::Permanent),
        ] {
            assert_eq!(io_error_kind(&IoError::new(kind, "x")), want, "{kind:?}");
        }
    }

    #[tokio::test]
    async fn put_get_list_delete() {
        let dir = TempDir::new("fsstore");
        let s = FsStore::open(dir.path()).expect("open");
        let key = "v/obj/0001.d";
        s.put(key, Bytes::from_static(b"hello"), PutMode::IfAbsent)
            .await
            .expect("put");
        let again = s
            .put(key, Bytes::from_static(b"other"), PutMode::IfAbsent)
            .await;
        assert_eq!(again.expect_err("exists").kind, ErrorKind::AlreadyExists);
        assert_eq!(s.get(key).await.expect("get"), b"hello");
        assert_eq!(s.get_range(key, 1..3).await.expect("range"), b"el");
        for meta in ["v/meta", "w/meta"] {
            s.put(meta, Bytes::from_static(b"m"), PutMode::Overwrite)
                .await
                .expect("put");
        }
        assert_eq!(list_keys(&s, "v/").await, vec!["v/meta", key]);
        assert_eq!(list_keys(&s, "v/obj/").await, vec![key]);
        assert_deleted_twice(&s, key).await;
        assert!(
            s.put("../escape", Bytes::new(), PutMode::Overwrite)
                .await
                .is_err()
        );
    }
}
