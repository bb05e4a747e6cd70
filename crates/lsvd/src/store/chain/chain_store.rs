//! The chained-drive store (`chain:DIR0,DIR1,...`): Gecko's chained log over local
//! drives, behind the same trait as one directory.
//!
//! Client objects go to the tail drive only; when it has no room for the next one the
//! tail moves to the next drive in chain order that has room (wrapping round to reuse
//! what GC freed), and the move is recorded in every drive's record. GC output goes to
//! the body: the drive its victims are on, else another drive that is not the tail
//! (compact-in-body, the default), or to the tail like client data (move-to-tail). So
//! under compact-in-body the tail drive sees client writes and nothing else, as long as
//! the body has room.
//!
//! Objects are found by listing: at open every drive is listed into an in-memory index
//! (key -> drive, size); puts and deletes keep it current, and a key it does not know
//! is looked for on every drive before it is called missing. The index also keeps
//! put-if-absent atomic across drives within the process: a key that exists or is
//! being written somewhere goes to that drive, where the local store's link refuses
//! it. Keys that are not log objects (volume metadata, superblocks, snapshot records,
//! links) have a fixed home drive (a hash of the key), so put-if-absent on them is
//! atomic between processes too, as fencing needs.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use super::drives::{DriveSpec, GcPlacement, describe};
use super::meta::{DRIVE_RECORD_NAME, DriveRecord, Layout};
use super::open::{open_drives, persist_tail};
use super::position::{Drive, Read};
use super::{home_drive, is_log_object, merge_listings, reserved_key_error};
use crate::error::{Error, ErrorKind, Result};
use crate::store::fs::valid_key;
use crate::store::{
    BoxFuture, CopyBytes, ListEntry, ObjectStore, Placement, PutMode, StoreMetric, StoreResult,
};

/// Without `drive_size`, a drive is full this far before its filesystem is: room for
/// the filesystem's own blocks and the temporary file of a put.
const FREE_SPACE_MARGIN_BYTES: u64 = 64 << 20;

/// Writes one drive has taken since open (for tests, benchmarks and messages).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriveCounters {
    /// Successful puts of every kind.
    pub puts: u64,
    pub put_bytes: u64,
    /// Of those, puts hinted as GC output.
    pub gc_puts: u64,
    /// Of those, log objects put without a GC hint (client data, checkpoints).
    pub client_object_puts: u64,
}

#[derive(Clone)]
pub struct ChainStore {
    inner: Arc<Inner>,
}

struct Inner {
    drives: Vec<Drive>,
    /// The set's identity (chain id, layout, drive count) for the records written on a
    /// tail move.
    base: DriveRecord,
    drive_size_bytes: Option<u64>,
    gc: GcPlacement,
    state: Mutex<State>,
    /// Held while drive records are rewritten, so tail moves are recorded in order.
    record_lock: Mutex<()>,
    describe: String,
}

#[derive(Clone, Copy)]
struct Located {
    drive: usize,
    size_bytes: u64,
}

struct State {
    index: HashMap<String, Located>,
    /// Puts in flight: the drive each key is going to, and how many puts of it.
    in_flight: HashMap<String, (usize, u32)>,
    used_bytes: Vec<u64>,
    /// Bytes of puts in flight, per drive.
    reserved_bytes: Vec<u64>,
    tail: usize,
    generation: u64,
    counters: Vec<DriveCounters>,
    /// GC puts that went to the drive that was the tail when they were placed.
    gc_puts_to_tail: u64,
    /// Object reads, and those that reached the drive that was the tail then.
    reads: u64,
    tail_reads: u64,
}

impl ChainStore {
    /// Open (or create, if every directory is blank) the chain `spec` describes, and
    /// list every drive into the index.
    pub fn open(spec: &DriveSpec) -> Result<ChainStore> {
        let opened = open_drives(&spec.dirs, Layout::Chain)?;
        let n = opened.drives.len();
        let mut index = HashMap::new();
        let mut used_bytes = vec![0u64; n];
        for (d, listing) in opened.listings.into_iter().enumerate() {
            for e in listing {
                match index.entry(e.key) {
                    Entry::Vacant(v) => {
                        used_bytes[d] += e.size_bytes;
                        v.insert(Located {
                            drive: d,
                            size_bytes: e.size_bytes,
                        });
                    }
                    Entry::Occupied(o) => crate::log::warn(&format!(
                        "chain: {} is on drive {} and drive {d}; using drive {}",
                        o.key(),
                        o.get().drive,
                        o.get().drive
                    )),
                }
            }
        }
        let tail = usize::from(opened.current.tail_index);
        let describe = describe("chain", &opened.drives);
        crate::log::debug(&format!(
            "{describe}: {} keys, tail on drive {tail} (generation {})",
            index.len(),
            opened.current.generation
        ));
        Ok(ChainStore {
            inner: Arc::new(Inner {
                base: opened.current,
                drives: opened.drives,
                drive_size_bytes: spec.drive_size_bytes,
                gc: spec.gc,
                state: Mutex::new(State {
                    index,
                    in_flight: HashMap::new(),
                    used_bytes,
                    reserved_bytes: vec![0; n],
                    tail,
                    generation: opened.current.generation,
                    counters: vec![DriveCounters::default(); n],
                    gc_puts_to_tail: 0,
                    reads: 0,
                    tail_reads: 0,
                }),
                record_lock: Mutex::new(()),
                describe,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The drive new client objects go to.
    pub fn tail(&self) -> usize {
        self.lock().tail
    }

    /// Puts per drive since open.
    pub fn drive_counters(&self) -> Vec<DriveCounters> {
        self.lock().counters.clone()
    }

    /// GC puts placed on the drive that was the tail at the time (0 under
    /// compact-in-body while the body has room).
    pub fn gc_puts_to_tail(&self) -> u64 {
        self.lock().gc_puts_to_tail
    }

    /// Bytes of the keys each drive holds, as the index knows them.
    pub fn used_bytes(&self) -> Vec<u64> {
        self.lock().used_bytes.clone()
    }

    /// Bytes drive `d` can still take.
    fn room(&self, st: &State, d: usize) -> u64 {
        match self.inner.drive_size_bytes {
            Some(cap) => cap.saturating_sub(st.used_bytes[d] + st.reserved_bytes[d]),
            None => self.inner.drives[d]
                .free_bytes()
                .saturating_sub(st.reserved_bytes[d] + FREE_SPACE_MARGIN_BYTES),
        }
    }

    /// The drive `key` goes to, and whether the tail moved to it.
    fn choose(
        &self,
        st: &mut State,
        key: &str,
        size_bytes: u64,
        placement: &Placement,
    ) -> StoreResult<(usize, bool)> {
        if let Some(l) = st.index.get(key) {
            return Ok((l.drive, false));
        }
        if let Some(&(d, _)) = st.in_flight.get(key) {
            return Ok((d, false));
        }
        if !is_log_object(key) {
            return Ok((home_drive(key, self.inner.drives.len()), false));
        }
        if let Placement::Gc { victim_keys } = placement
            && self.inner.gc == GcPlacement::CompactInBody
            && let Some(d) = self.body_drive(st, victim_keys, size_bytes)
        {
            return Ok((d, false));
        }
        self.tail_drive(st, size_bytes)
    }

    /// The tail if it has room, else the next drive in chain order that has (which
    /// becomes the tail).
    fn tail_drive(&self, st: &mut State, size_bytes: u64) -> StoreResult<(usize, bool)> {
        let n = self.inner.drives.len();
        if self.room(st, st.tail) >= size_bytes {
            return Ok((st.tail, false));
        }
        for step in 1..n {
            let d = (st.tail + step) % n;
            if self.room(st, d) >= size_bytes {
                st.tail = d;
                st.generation += 1;
                return Ok((d, true));
            }
        }
        Err(Error::new(
            ErrorKind::Transient,
            format!(
                "{}: no drive has room for {size_bytes} more bytes (GC may free some)",
                self.inner.describe
            ),
        ))
    }

    /// A drive of the body for GC output: the one holding most of the victims' bytes
    /// if it has room, else the body drive with the most room; None if no body drive
    /// has room (or there is no body).
    fn body_drive(&self, st: &State, victim_keys: &[String], size_bytes: u64) -> Option<usize> {
        let n = self.inner.drives.len();
        let mut victim_bytes = vec![0u64; n];
        for k in victim_keys {
            if let Some(l) = st.index.get(k) {
                victim_bytes[l.drive] += l.size_bytes.max(1);
            }
        }
        let mut body: Vec<(usize, u64)> = (0..n)
            .filter(|&d| d != st.tail)
            .map(|d| (d, self.room(st, d)))
            .collect();
        body.sort_by_key(|&(d, room)| {
            (
                std::cmp::Reverse(victim_bytes[d]),
                std::cmp::Reverse(room),
                d,
            )
        });
        body.into_iter()
            .find(|&(_, room)| room >= size_bytes)
            .map(|(d, _)| d)
    }

    /// Record the current tail on every drive (after a move). A failure is only
    /// reported: objects are found by listing, the record only says where the tail is.
    async fn record_tail(&self) {
        let this = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _order = this
                .inner
                .record_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (tail, generation) = {
                let st = this.lock();
                (st.tail, st.generation)
            };
            persist_tail(&this.inner.drives, &this.inner.base, tail, generation)
                .map(|()| (tail, generation))
        })
        .await;
        match result {
            Ok(Ok((tail, generation))) => crate::log::info(&format!(
                "{}: tail moved to drive {tail} ({}), generation {generation}",
                self.inner.describe,
                self.inner.drives[tail].describe()
            )),
            Ok(Err(e)) => crate::log::warn(&format!(
                "{}: tail moved but not recorded: {e}",
                self.inner.describe
            )),
            Err(e) => crate::log::warn(&format!(
                "{}: recording the tail failed: {e}",
                self.inner.describe
            )),
        }
    }

    /// The drive holding `key` on disk, looked for on every drive (and remembered).
    fn find(&self, key: &str) -> StoreResult<Option<usize>> {
        valid_key(key)?;
        for (d, drive) in self.inner.drives.iter().enumerate() {
            if let Some(size_bytes) = drive.stat(key) {
                let mut st = self.lock();
                if let Entry::Vacant(v) = st.index.entry(key.to_string()) {
                    v.insert(Located {
                        drive: d,
                        size_bytes,
                    });
                    st.used_bytes[d] += size_bytes;
                }
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    async fn put_inner(
        &self,
        key: String,
        data: Bytes,
        mode: PutMode,
        placement: Placement,
    ) -> StoreResult<()> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        valid_key(&key)?;
        let size_bytes = data.len() as u64;
        let (drive, known, moved, to_tail) = {
            let mut st = self.lock();
            let known = st.index.contains_key(&key) || st.in_flight.contains_key(&key);
            let (d, moved) = self.choose(&mut st, &key, size_bytes, &placement)?;
            st.reserved_bytes[d] += size_bytes;
            st.in_flight.entry(key.clone()).or_insert((d, 0)).1 += 1;
            (d, known, moved, d == st.tail)
        };
        let result = async {
            if moved {
                self.record_tail().await;
            }
            // Written by another process on another drive since open: taken.
            if mode == PutMode::IfAbsent && !known {
                for (d, other) in self.inner.drives.iter().enumerate() {
                    if d != drive && other.stat(&key).is_some() {
                        return Err(Error::new(
                            ErrorKind::AlreadyExists,
                            format!("{key} exists on drive {d} ({})", other.describe()),
                        ));
                    }
                }
            }
            self.inner.drives[drive].put(&key, data, mode).await
        }
        .await;
        let mut st = self.lock();
        st.reserved_bytes[drive] -= size_bytes;
        if let Entry::Occupied(mut e) = st.in_flight.entry(key.clone()) {
            e.get_mut().1 -= 1;
            if e.get().1 == 0 {
                e.remove();
            }
        }
        match &result {
            Ok(()) => {
                let old = st.index.insert(key.clone(), Located { drive, size_bytes });
                if let Some(old) = old {
                    st.used_bytes[old.drive] -= old.size_bytes.min(st.used_bytes[old.drive]);
                }
                st.used_bytes[drive] += size_bytes;
                let gc = matches!(placement, Placement::Gc { .. });
                let client_object = !gc && is_log_object(&key);
                let c = &mut st.counters[drive];
                c.puts += 1;
                c.put_bytes += size_bytes;
                c.gc_puts += u64::from(gc);
                c.client_object_puts += u64::from(client_object);
                st.gc_puts_to_tail += u64::from(gc && to_tail);
            }
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                drop(st);
                // Known now, wherever it is.
                let _ = self.find(&key);
            }
            Err(_) => {}
        }
        result
    }

    async fn read(&self, key: String, read: Read) -> StoreResult<Vec<u8>> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        let known = self.lock().index.get(&key).map(|l| l.drive);
        if let Some(d) = known {
            self.count_read(d);
            match self.inner.drives[d].read(&key, &read).await {
                Err(e) if e.is_not_found() => {
                    // Gone from there (deleted by another process): forget it.
                    self.forget(&key, d);
                }
                r => return r,
            }
        }
        match self.find(&key)? {
            Some(d) => {
                self.count_read(d);
                self.inner.drives[d].read(&key, &read).await
            }
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    fn count_read(&self, drive: usize) {
        let mut st = self.lock();
        st.reads += 1;
        if drive == st.tail {
            st.tail_reads += 1;
        }
    }

    /// Object reads so far, and those that reached the drive that was the tail then.
    pub fn read_counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.reads, st.tail_reads)
    }

    fn forget(&self, key: &str, drive: usize) {
        let mut st = self.lock();
        if let Entry::Occupied(e) = st.index.entry(key.to_string())
            && e.get().drive == drive
        {
            let gone = e.remove();
            st.used_bytes[drive] -= gone.size_bytes.min(st.used_bytes[drive]);
        }
    }

    /// The drive holding `key`: the index's, else looked for on every drive.
    fn locate(&self, key: &str) -> StoreResult<Option<usize>> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(key));
        }
        let known = self.lock().index.get(key).map(|l| l.drive);
        match known {
            Some(d) => Ok(Some(d)),
            None => self.find(key),
        }
    }

    async fn read_copies(&self, key: String, range: Range<u64>) -> StoreResult<Vec<CopyBytes>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].read_copies(&key, range).await,
            None => Ok(Vec::new()),
        }
    }

    async fn repair_copies_inner(&self, key: String, good: Bytes) -> StoreResult<Vec<String>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].rewrite_differing(&key, good).await,
            None => Ok(Vec::new()),
        }
    }

    async fn copies_of_inner(&self, key: String) -> StoreResult<Vec<String>> {
        match self.locate(&key)? {
            Some(d) => Ok(self.inner.drives[d].copy_names()),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    async fn get_copy_inner(&self, key: String, copy: usize) -> StoreResult<Vec<u8>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].read_one_copy(&key, copy).await,
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    async fn delete_inner(&self, key: String) -> StoreResult<()> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        let known = self.lock().index.get(&key).map(|l| l.drive);
        let drive = match known {
            Some(d) => Some(d),
            None => self.find(&key)?,
        };
        if let Some(d) = drive {
            self.inner.drives[d].delete(&key).await?;
            self.forget(&key, d);
        }
        Ok(())
    }
}

impl ObjectStore for ChainStore {
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
        let key = key.to_string();
        let placement = placement.clone();
        Box::pin(self.put_inner(key, data, mode, placement))
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        Box::pin(self.read(key.to_string(), Read::Whole))
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        Box::pin(self.read(key.to_string(), Read::Range(range)))
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        Box::pin(self.read(key.to_string(), Read::Background(range)))
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let prefix = prefix.to_string();
        let this = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || merge_listings(&this.inner.drives, &prefix))
                .await
                .map_err(|e| Error::with_source(ErrorKind::Transient, "store task failed", e))?
        })
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(self.delete_inner(key.to_string()))
    }
    fn describe(&self) -> String {
        self.inner.describe.clone()
    }
    fn is_local(&self) -> bool {
        true
    }
    fn verify_copies<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, StoreResult<Vec<String>>> {
        Box::pin(async move {
            Ok(super::position::compare_all_copies(&self.inner.drives, prefix).await)
        })
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        Box::pin(self.read_copies(key.to_string(), range))
    }
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        Box::pin(self.repair_copies_inner(key.to_string(), good))
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        Box::pin(self.copies_of_inner(key.to_string()))
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        Box::pin(self.get_copy_inner(key.to_string(), copy))
    }
    /// The tail cache: what is uploaded goes into the read cache too, so reads of
    /// fresh data stay off the drive taking the writes.
    fn admit_uploads_to_cache(&self) -> bool {
        true
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        let (reads, tail_reads) = self.read_counts();
        let (tail, degraded) = {
            let st = self.lock();
            let degraded = self.inner.drives.iter().filter(|d| d.degraded()).count();
            (st.tail, degraded)
        };
        vec![
            StoreMetric {
                name: "reads_total",
                kind: "counter",
                help: "Object reads (whole or ranged) the store served.",
                value: reads as f64,
            },
            StoreMetric {
                name: "tail_reads_total",
                kind: "counter",
                help: "Of those, reads that reached the drive taking new writes (the tail): what the read cache did not absorb.",
                value: tail_reads as f64,
            },
            StoreMetric {
                name: "tail_drive",
                kind: "gauge",
                help: "Position of the drive taking new writes.",
                value: tail as f64,
            },
            StoreMetric {
                name: "degraded_positions",
                kind: "gauge",
                help: "Mirrored positions serving from one copy (the other failed; rebuilt at the next open).",
                value: degraded as f64,
            },
        ]
    }
}
