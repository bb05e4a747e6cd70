//! One position of a chain or stripe: a directory, or two directories kept as mirrors
//! (`chain:A+A2,B+B2`).
//!
//! A mirrored put writes the first working copy (which decides put-if-absent), then
//! the other (overwrite): it completes when both are durable. A read that finds a copy
//! missing or unreadable reads the other and writes the object back to the first
//! (repair). A copy that fails for good (an I/O error, refused permissions, no room:
//! anything but "missing", "taken" or a transient error) is dropped, with a warning,
//! and the position serves from the other copy (degraded) until the next open (or
//! `lsvd chain rebuild`), which brings the copy in step with its sibling. A full copy
//! is dropped only once its mirror has taken the object: with no room on either, the
//! put fails `Full` and both copies stay. A copy that reads but holds wrong bytes only
//! the engine can tell (its checksums): it asks for every copy of the range
//! ([`Drive::read_copies`]) and, once it has verified a good one, has the others
//! rewritten from it ([`Drive::rewrite_differing`]).
//!
//! Opened read-only ([`crate::OpenMode::ReadOnly`]: `lsvd info`, `check`,
//! `inspect`, `list`), a position changes nothing: puts and deletes are refused, a
//! read that finds a copy missing reads the other and writes nothing back, a copy that
//! fails is left out of this process's reads without flagging its sibling's record,
//! and a copy the open found behind its mirror is read around (`lsvd check` still
//! reads it, copy by copy, to report what it lacks).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::meta::{DRIVE_RECORD_NAME, DriveRecord, read_drive_record, write_drive_record};
use crate::fs::{FsStore, blocking, valid_key};
use crate::{CopyBytes, ListEntry, ObjectStore, PutMode, StoreMetric, StoreResult};
use lsvd_core::error::{Error, ErrorKind, Result};

/// A read to send to the position holding a key.
pub enum Read {
    Whole,
    Range(Range<u64>),
    Background(Range<u64>),
}

/// One directory of a position.
pub struct Copy {
    pub dir: PathBuf,
    /// None if it could not be opened.
    store: Option<FsStore>,
    failed: AtomicBool,
    /// Dropped while serving (see [`Drive::fail`]), for the metric.
    dropped: AtomicBool,
    /// Found behind its mirror by a read-only open, which may not bring it in step:
    /// out of service for reads, still read by [`Drive::read_one_copy`].
    behind: AtomicBool,
}

impl Copy {
    pub fn new(dir: PathBuf, store: Option<FsStore>) -> Copy {
        let failed = AtomicBool::new(store.is_none());
        Copy {
            dir,
            store,
            failed,
            dropped: AtomicBool::new(false),
            behind: AtomicBool::new(false),
        }
    }
    pub(super) fn store(&self) -> Option<&FsStore> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.store.as_ref()
    }
    pub fn is_live(&self) -> bool {
        self.store().is_some()
    }
    /// Take the copy out of service at open (it cannot be brought in step with its
    /// sibling: no room). Not counted as dropped while serving.
    pub(super) fn take_out(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }
    /// True if the copy opened but was dropped while serving.
    fn dropped(&self) -> bool {
        self.dropped.load(Ordering::Relaxed)
    }
    /// Take the copy out of service for a read-only open that found it behind its
    /// mirror (it missed writes or deletes): reads go to the mirror, and only
    /// [`Drive::read_one_copy`] still reads it.
    pub(super) fn set_behind(&self) {
        self.behind.store(true, Ordering::SeqCst);
        self.take_out();
    }
    /// The copy's store for reading it on its own: a live copy, or one a read-only
    /// open found behind.
    pub(super) fn store_for_check(&self) -> Option<&FsStore> {
        if self.behind.load(Ordering::Relaxed) {
            return self.store.as_ref();
        }
        self.store()
    }
}

/// A position: one copy, or two mirrored copies.
pub struct Drive {
    pub index: usize,
    pub copies: Vec<Copy>,
    /// Opened read-only: nothing on its copies is written, created or deleted.
    pub read_only: bool,
}

/// An error that says the copy itself cannot serve (failed, full, refuses this
/// process), not that the key is missing or taken or the copy fails for a moment.
fn copy_broken(e: &Error) -> bool {
    !matches!(
        e.kind,
        ErrorKind::NotFound | ErrorKind::AlreadyExists | ErrorKind::Transient
    )
}

impl Drive {
    /// The first directory (for free space and messages).
    pub fn dir(&self) -> &Path {
        self.live()
            .next()
            .map_or(&self.copies[0].dir, |(c, _)| c.dir.as_path())
    }

    /// `A` or `A+A2`.
    pub fn describe(&self) -> String {
        let dirs: Vec<String> = self
            .copies
            .iter()
            .map(|c| c.dir.display().to_string())
            .collect();
        dirs.join("+")
    }

    pub(super) fn live(&self) -> impl Iterator<Item = (&Copy, &FsStore)> {
        self.copies.iter().filter_map(|c| c.store().map(|s| (c, s)))
    }

    /// Drop `copy` after `e` if another copy is still live; false if it is the last.
    /// Read-only, the copy is left out of this process's reads and nothing is noted
    /// on the drives.
    fn fail(&self, copy: &Copy, e: &Error) -> bool {
        if self.live().filter(|(c, _)| !std::ptr::eq(*c, copy)).count() == 0 {
            return false;
        }
        if self.read_only {
            if !copy.failed.swap(true, Ordering::SeqCst) {
                crate::log::warn(&format!(
                    "drive {}: copy {} failed ({e}); reading from its mirror",
                    self.index,
                    copy.dir.display()
                ));
            }
            return true;
        }
        if !copy.failed.swap(true, Ordering::SeqCst) {
            copy.dropped.store(true, Ordering::SeqCst);
            let what = match e.kind {
                ErrorKind::Full => "is full",
                ErrorKind::Denied => "refuses this process",
                _ => "failed",
            };
            crate::log::warn(&format!(
                "drive {}: copy {} {what} ({e}); serving from its mirror (degraded) until \
                 `lsvd chain rebuild` or the next open brings it in step",
                self.index,
                copy.dir.display()
            ));
            self.mark_mirror_stale();
        }
        true
    }

    /// True if a copy of this position is out of service.
    pub fn degraded(&self) -> bool {
        self.copies.iter().any(|c| !c.is_live())
    }

    /// Flag the live copies' records: their mirror misses what is written from now on
    /// (the next open that finds it makes it an exact copy again).
    pub fn mark_mirror_stale(&self) {
        if self.read_only {
            return;
        }
        for (c, _) in self.live() {
            let result = read_drive_record(&c.dir).and_then(|r| match r {
                Some(r) if !r.mirror_stale => write_drive_record(
                    &c.dir,
                    &DriveRecord {
                        mirror_stale: true,
                        ..r
                    },
                ),
                _ => Ok(()),
            });
            if let Err(e) = result {
                crate::log::warn(&format!(
                    "drive {}: cannot note on {} that its mirror is stale: {e}",
                    self.index,
                    c.dir.display()
                ));
            }
        }
    }

    /// The error of a write to a position opened read-only.
    fn read_only_error(&self, what: &str, key: &str) -> Error {
        Error::new(
            ErrorKind::ReadOnly,
            format!(
                "{what} {key} on drive {} ({}): opened read-only",
                self.index,
                self.describe()
            ),
        )
    }

    fn no_copy(&self) -> Error {
        Error::new(
            ErrorKind::Permanent,
            format!(
                "drive {} ({}): no working copy",
                self.index,
                self.describe()
            ),
        )
    }

    /// Size of `key` on a live copy that has it.
    pub fn stat(&self, key: &str) -> Option<u64> {
        self.live().find_map(|(c, _)| {
            std::fs::metadata(c.dir.join(key))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        })
    }

    /// Every key under `prefix` on any live copy, in order, without the drive record.
    pub fn list_sync(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        let mut all = Vec::new();
        let mut listed = false;
        let mut last_err = None;
        for (c, s) in self.live() {
            match s.list_sync(prefix) {
                Ok(l) => {
                    all.extend(l);
                    listed = true;
                }
                Err(e) if copy_broken(&e) && self.fail(c, &e) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        if !listed {
            return Err(last_err.unwrap_or_else(|| self.no_copy()));
        }
        all.retain(|e| e.key != DRIVE_RECORD_NAME);
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all.dedup_by(|a, b| a.key == b.key);
        Ok(all)
    }

    /// The live copies a write (`op`) of `key` goes to; refuses a bad key (the caller's
    /// mistake, not a broken copy), a read-only open, and a position with no copy left.
    fn live_to_write(&self, op: &str, key: &str) -> StoreResult<Vec<(&Copy, &FsStore)>> {
        valid_key(key)?;
        if self.read_only {
            return Err(self.read_only_error(op, key));
        }
        let live: Vec<(&Copy, &FsStore)> = self.live().collect();
        if live.is_empty() {
            return Err(self.no_copy());
        }
        Ok(live)
    }

    /// Put on every live copy: the first that takes it decides put-if-absent, the
    /// others follow with overwrite. A key the deciding copy has already is made sure
    /// of on the others too. A copy without room is skipped and, once another copy has
    /// taken the object, dropped (the position degrades); if no copy has room the put
    /// fails `Full` and every copy stays in service.
    pub async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> StoreResult<()> {
        let live = self.live_to_write("put", key)?;
        // Copies that answered Full, dropped only once another copy holds the object.
        let mut full: Vec<(&Copy, Error)> = Vec::new();
        let mut decided = None;
        for (i, (c, s)) in live.iter().enumerate() {
            match s.put(key, data.clone(), mode).await {
                Ok(()) => {
                    decided = Some(i);
                    break;
                }
                Err(e) if e.kind == ErrorKind::AlreadyExists => {
                    for (to, to_store) in &live[i + 1..] {
                        self.ensure(s, to, to_store, key).await?;
                    }
                    for (c, e) in &full {
                        self.fail(c, e);
                    }
                    return Err(e);
                }
                Err(e) if e.kind == ErrorKind::Full => full.push((*c, e)),
                Err(e) if copy_broken(&e) && self.fail(c, &e) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(i) = decided else {
            // No copy took it: out of room everywhere (or the last copy broke).
            return Err(full.pop().map_or_else(|| self.no_copy(), |(_, e)| e));
        };
        for (c, s) in &live[i + 1..] {
            match s.put(key, data.clone(), PutMode::Overwrite).await {
                Ok(()) => {}
                Err(e) if copy_broken(&e) && self.fail(c, &e) => {}
                Err(e) => return Err(e),
            }
        }
        for (c, e) in &full {
            self.fail(c, e);
        }
        Ok(())
    }

    /// Copy `key` from `from` to `to` if `to` lacks it.
    async fn ensure(
        &self,
        from: &FsStore,
        to: &Copy,
        to_store: &FsStore,
        key: &str,
    ) -> StoreResult<()> {
        if to.dir.join(key).is_file() {
            return Ok(());
        }
        let data = from.get(key).await?;
        match to_store
            .put(key, Bytes::from(data), PutMode::Overwrite)
            .await
        {
            Err(e) if copy_broken(&e) && self.fail(to, &e) => Ok(()),
            r => r,
        }
    }

    /// Read from the first live copy that has the key; copies found missing or
    /// unreadable on the way get it written back.
    pub async fn read(&self, key: &str, read: &Read) -> StoreResult<Vec<u8>> {
        valid_key(key)?;
        let mut needs_repair: Vec<(&Copy, &FsStore)> = Vec::new();
        let mut last_err = None;
        for (c, s) in self.live() {
            let result = match read {
                Read::Whole => s.get(key).await,
                Read::Range(r) => s.get_range(key, r.clone()).await,
                Read::Background(r) => s.get_range_background(key, r.clone()).await,
            };
            match result {
                Ok(v) => {
                    if !self.read_only {
                        for (to, to_store) in needs_repair {
                            self.repair(s, to, to_store, key).await;
                        }
                    }
                    return Ok(v);
                }
                Err(e) => {
                    if e.is_not_found() || copy_broken(&e) {
                        needs_repair.push((c, s));
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| self.no_copy()))
    }

    async fn repair(&self, from: &FsStore, to: &Copy, to_store: &FsStore, key: &str) {
        let result = match from.get(key).await {
            Ok(data) => {
                to_store
                    .put(key, Bytes::from(data), PutMode::Overwrite)
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => crate::log::warn(&format!(
                "drive {}: {key} was missing or unreadable on {}; repaired from its mirror",
                self.index,
                to.dir.display()
            )),
            Err(e) => {
                if !(copy_broken(&e) && self.fail(to, &e)) {
                    crate::log::warn(&format!(
                        "drive {}: repairing {key} on {} failed: {e}",
                        self.index,
                        to.dir.display()
                    ));
                }
            }
        }
    }

    /// Bytes `range` of `key` from each live copy that can read it (none for a
    /// position of one copy: there is nothing else to offer).
    pub async fn read_copies(&self, key: &str, range: Range<u64>) -> StoreResult<Vec<CopyBytes>> {
        valid_key(key)?;
        let mut out = Vec::new();
        if self.copies.len() < 2 {
            return Ok(out);
        }
        for (c, s) in self.live() {
            if let Ok(bytes) = s.get_range_background(key, range.clone()).await {
                out.push(CopyBytes {
                    copy: c.dir.display().to_string(),
                    bytes,
                });
            }
        }
        Ok(out)
    }

    /// Rewrite, in place, each live copy of `key` whose bytes differ from `good` (the
    /// whole object, verified by the caller). In place, not a new file renamed over
    /// the old: a copy deleted meanwhile stays deleted. Returns the copies rewritten.
    pub async fn rewrite_differing(&self, key: &str, good: Bytes) -> StoreResult<Vec<String>> {
        valid_key(key)?;
        if self.read_only {
            return Err(self.read_only_error("rewrite", key));
        }
        let mut rewritten = Vec::new();
        if self.copies.len() < 2 {
            return Ok(rewritten);
        }
        for (c, s) in self.live() {
            match s.get(key).await {
                Ok(bytes) if bytes[..] == good[..] => continue,
                Err(e) if e.is_not_found() => continue,
                _ => {}
            }
            let path = c.dir.join(key);
            let data = good.clone();
            let result = blocking(move || Ok(rewrite_in_place(&path, &data))).await?;
            match result {
                Ok(true) => rewritten.push(c.dir.display().to_string()),
                Ok(false) => {}
                Err(e) => {
                    let e = Error::with_source(
                        ErrorKind::Permanent,
                        format!("rewriting {key} on {}", c.dir.display()),
                        e,
                    );
                    if !self.fail(c, &e) {
                        return Err(e);
                    }
                }
            }
        }
        Ok(rewritten)
    }

    /// Delete from every live copy.
    pub async fn delete(&self, key: &str) -> StoreResult<()> {
        let live = self.live_to_write("delete", key)?;
        for (c, s) in live {
            match s.delete(key).await {
                Ok(()) => {}
                Err(e) if copy_broken(&e) && self.fail(c, &e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Bytes free on the fullest live copy's filesystem.
    pub fn free_bytes(&self) -> u64 {
        self.live()
            .map(|(c, _)| fs_free_bytes(&c.dir))
            .min()
            .unwrap_or(0)
    }
}

/// The metrics of mirrored positions, for the chain's and the stripe's
/// [`ObjectStore::metrics`]: positions serving from one copy, and copies dropped while
/// serving (failed, full or refused).
pub fn mirror_metrics(drives: &[Drive]) -> Vec<StoreMetric> {
    let degraded = drives.iter().filter(|d| d.degraded()).count();
    let dropped: usize = drives
        .iter()
        .map(|d| d.copies.iter().filter(|c| c.dropped()).count())
        .sum();
    vec![
        StoreMetric {
            name: "degraded_positions",
            kind: "gauge",
            help: "Mirrored positions serving from one copy (the other failed, is full or refuses writes; brought in step at the next open or by `lsvd chain rebuild`).",
            value: degraded as f64,
        },
        StoreMetric {
            name: "mirror_copies_dropped_total",
            kind: "counter",
            help: "Mirror copies taken out of service while serving: a failed copy, a full one (its mirror took the object) or one that refuses writes.",
            value: dropped as f64,
        },
    ]
}

/// Overwrite the file at `path` with `data` and make it durable, if the file is
/// there (false if not: it is not created).
fn rewrite_in_place(path: &Path, data: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    file.write_all_at(data, 0)?;
    file.set_len(data.len() as u64)?;
    file.sync_all()?;
    Ok(true)
}

/// Bytes free for unprivileged writers on the filesystem holding `dir` (0 if it
/// cannot be asked).
fn fs_free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}
