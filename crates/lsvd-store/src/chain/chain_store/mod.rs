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
//!
//! Split along its seams: this file holds the store's state and its opening;
//! [`placement`] decides which drive a put goes to (and moves the tail); [`ops`] puts,
//! reads and deletes, keeping the index current; [`object_store`] is the trait.

mod object_store;
mod ops;
mod placement;

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
use crate::fs::{blocking, valid_key};
use crate::{
    BoxFuture, CopyBytes, ListEntry, ObjectStore, OpenMode, Placement, PutMode, StoreMetric,
    StoreResult,
};
use lsvd_core::error::{Error, ErrorKind, Result};

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
    /// Opened read-only: puts and deletes are refused before a drive is chosen (a
    /// put could move the tail, which rewrites every drive's record).
    read_only: bool,
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
    /// Drives whose filesystem answered a put with "full" (before `drive_size` or the
    /// free space seen said so): no room until a delete there, or until no drive has
    /// room (then every drive is tried again).
    full: Vec<bool>,
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
        Self::open_mode(spec, OpenMode::ReadWrite)
    }

    /// [`open`](Self::open) in `mode`: read-only, nothing on the drives changes (see
    /// [`super::open`]) and every put and delete is refused.
    pub fn open_mode(spec: &DriveSpec, mode: OpenMode) -> Result<ChainStore> {
        let opened = open_drives(&spec.dirs, Layout::Chain, mode)?;
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
                    full: vec![false; n],
                    tail,
                    generation: opened.current.generation,
                    counters: vec![DriveCounters::default(); n],
                    gc_puts_to_tail: 0,
                    reads: 0,
                    tail_reads: 0,
                }),
                record_lock: Mutex::new(()),
                describe,
                read_only: mode == OpenMode::ReadOnly,
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
}
