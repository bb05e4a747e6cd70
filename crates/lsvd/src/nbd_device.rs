//! Serving a volume over NBD: the `BlockDevice` implementation.
//!
//! The NBD server speaks `io::Error`; every engine error goes through
//! `From<lsvd_core::error::Error> for io::Error`, whose kind mapping decides the errno the
//! client sees (EINVAL for bad requests, ESHUTDOWN while shutting down, EIO for the
//! rest).
//!
//! `lsvd serve` runs each connection on a thread of its own (`lsvd_nbd`'s connection
//! threads). The engine's async work (reads that go to the store, read-ahead, the
//! tasks they spawn, the store client's connections) stays on the runtime the volume
//! was opened on: a connection's runtime ends with the connection. So the async
//! methods below run there ([`NbdVolume::on_engine`]); writes, flushes and trims are
//! started and appended on the connection's thread (`start`, `unplug`).
//!
//! Nothing here holds memory in proportion to a length the client chose: a CACHE
//! (up to 4 GiB) is read a piece at a time ([`PIECE_BYTES`]) and each piece dropped,
//! unwritten ranges skipped; a NO_HOLE WRITE_ZEROES writes zeros a piece at a time;
//! at most [`PIECES_IN_FLIGHT`] pieces of either are in memory per export, whatever
//! the number of connections and requests; a BLOCK_STATUS walks the map in windows
//! and stops at a reply's worth of extents. READ and WRITE are bounded by the maximum request size
//! and the server's payload budget (lsvd_nbd's `Limits`).
//!
//! QoS limits (crate::qos) are applied here, before a request reaches the engine:
//! READ, WRITE, TRIM and WRITE_ZEROES wait in [`Throttle::admit`] (FLUSH, CACHE and
//! BLOCK_STATUS are not counted). While a limit is set, `start` declines them so they
//! take the async path, where they can wait. Waiting requests hold their NBD
//! in-flight permits (lsvd_nbd's `Limits::max_in_flight`, `max_in_flight_bytes`), so
//! what waits is bounded as what runs is.
//!
//! Besides `base:allocation`, a volume offers the meta contexts
//! `qemu:dirty-bitmap:SNAP`, one per snapshot: what changed since it (`dirty`).

mod dirty;

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};

use lsvd_nbd::server::{MAX_REPLY_EXTENTS, NoticeLimiter};
use lsvd_nbd::{
    AllocationExtent, BlockDevice, BlockSizes, Completion, STATE_HOLE, STATE_ZERO, StartOp,
    ZeroRequest,
};
use tokio::sync::Semaphore;

use lsvd_engine::Volume;

use crate::qos::{Direction, Throttle};

/// Largest request we accept; clients learn it from NBD_INFO_BLOCK_SIZE.
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

/// What a CACHE reads, and a NO_HOLE WRITE_ZEROES writes, at a time: a multiple of
/// the read cache's 64 KiB chunks.
pub const PIECE_BYTES: u64 = 1 << 20;

/// Pieces of CACHE and NO_HOLE WRITE_ZEROES in memory at once, over every connection
/// to one export (8 MiB): neither is counted in the NBD server's payload budget, and
/// there may be many such requests in flight. (The engine takes a write's buffer by
/// value, so each zero piece is a fresh buffer; this bounds them.)
pub const PIECES_IN_FLIGHT: usize = 8;

/// How much of the volume one look at the map covers for BLOCK_STATUS: at most this
/// many bytes / 512 runs come back from one look (64 Ki runs, 1 MiB).
const STATUS_WINDOW_BYTES: u64 = 32 << 20;

pub struct NbdVolume {
    pub volume: Arc<Volume>,
    max_request_bytes: u32,
    /// The runtime the volume was opened on, where its async work runs.
    engine: tokio::runtime::Handle,
    /// [`PIECES_IN_FLIGHT`] permits, one per piece being read or written.
    pieces: Arc<Semaphore>,
    /// Lines saying why reads (and CACHE, BLOCK_STATUS) failed.
    failures: Arc<FailureLog>,
    /// The export's QoS limits, if the server applies any.
    throttle: Option<Arc<Throttle>>,
    /// The snapshots connections compare with (`qemu:dirty-bitmap:SNAP`).
    dirty: Arc<dirty::DirtyBitmaps>,
}

/// Why a request failed, for the log: the client sees only an errno. At most a line a
/// second per export (a store outage fails every read that needs a GET), with a count
/// of the lines held back. A volume that is shutting down is not worth a line. Writes,
/// trims and flushes fail only once the volume has failed (the engine says why once:
/// `volume NAME failed: ...`) or while it shuts down, so they are not logged here.
struct FailureLog {
    export: String,
    limiter: Mutex<NoticeLimiter>,
}

impl FailureLog {
    /// `r`, as the NBD server wants it; a failure logged (rate-limited), the line
    /// returned.
    fn check<T>(
        &self,
        request: impl FnOnce() -> String,
        r: lsvd_core::error::Result<T>,
    ) -> (io::Result<T>, Option<String>) {
        let e = match r {
            Ok(v) => return (Ok(v), None),
            Err(e) => e,
        };
        let mut line = None;
        if e.kind != lsvd_core::error::ErrorKind::ShuttingDown
            && let Ok(mut limiter) = self.limiter.lock()
        {
            line = limiter.admit(|| format!("{}: {} failed: {e}", self.export, request()));
        }
        if let Some(line) = &line {
            lsvd_store::log::warn(line);
        }
        (Err(e.into()), line)
    }
}

impl NbdVolume {
    /// Must be called on the runtime that opened `volume` (its async work runs there).
    pub fn new(volume: Arc<Volume>, log_capacity_bytes: u64) -> Self {
        // A request must fit in one log record, which may use at most half the log
        // (a snapshot export writes nothing: only reads are bounded).
        let limit = if volume.snapshot_name().is_some() {
            MAX_REQUEST_BYTES
        } else {
            (log_capacity_bytes / 4).min(MAX_REQUEST_BYTES as u64) as u32
        };
        let max_request_bytes = if limit.is_power_of_two() {
            limit
        } else {
            limit.next_power_of_two() / 2
        };
        NbdVolume {
            max_request_bytes: max_request_bytes.max(1 << 20),
            engine: tokio::runtime::Handle::current(),
            pieces: Arc::new(Semaphore::new(PIECES_IN_FLIGHT)),
            failures: Arc::new(FailureLog {
                export: volume.export_name(),
                limiter: Mutex::default(),
            }),
            throttle: None,
            dirty: Arc::default(),
            volume,
        }
    }

    /// Requests wait for `throttle`'s limits before they reach the volume.
    pub fn with_throttle(mut self, throttle: Arc<Throttle>) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// Wait until a request of `bytes` in direction `dir` is within the limits.
    async fn admit(&self, dir: Direction, bytes: u64) {
        if let Some(t) = &self.throttle {
            t.admit(dir, bytes).await;
        }
    }

    /// Must data requests take the async path, to wait for a limit?
    fn throttled(&self) -> bool {
        self.throttle.as_ref().is_some_and(|t| t.is_limited())
    }

    /// Run `work` on the engine's runtime: here if this is one of its threads,
    /// otherwise (a connection thread) as a task there, whose answer comes back.
    async fn on_engine<T, F>(&self, work: impl FnOnce(Arc<Volume>) -> F) -> io::Result<T>
    where
        F: Future<Output = io::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let work = work(Arc::clone(&self.volume));
        if !lsvd_nbd::server::on_connection_thread() {
            return work.await;
        }
        self.engine
            .spawn(work)
            .await
            .unwrap_or_else(|e| Err(io::Error::other(format!("engine task failed: {e}"))))
    }
}

impl BlockDevice for NbdVolume {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_bytes: self.max_request_bytes,
        }
    }

    fn read_only(&self) -> bool {
        self.volume.snapshot_name().is_some()
    }

    fn flush_is_global(&self) -> bool {
        // One log writer serves every connection, so a FLUSH covers all of them.
        true
    }

    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.admit(Direction::Read, u64::from(length)).await;
        let what = move || format!("read of {length} bytes at {offset}");
        // Local data (the log, the read cache) is read right here, on any thread.
        if let Some(r) = self.volume.read_local(offset, length as u64) {
            return self.failures.check(what, r).0;
        }
        let failures = Arc::clone(&self.failures);
        self.on_engine(move |volume| async move {
            failures
                .check(what, volume.read(offset, length as u64).await)
                .0
        })
        .await
    }

    /// Local data (the log, the read cache) is read on the connection's thread
    /// without a task; a read that needs the store, or waits for a QoS limit, takes
    /// the task path (`read`).
    fn read_now(&self, offset: u64, length: u32) -> Option<io::Result<Vec<u8>>> {
        if self.throttled() {
            return None;
        }
        let r = self.volume.read_local(offset, length as u64)?;
        let what = move || format!("read of {length} bytes at {offset}");
        Some(self.failures.check(what, r).0)
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.admit(Direction::Write, data.len() as u64).await;
        self.on_engine(move |volume| async move { Ok(volume.write(offset, data, fua).await?) })
            .await
    }

    async fn flush(&self) -> io::Result<()> {
        self.on_engine(|volume| async move { Ok(volume.flush().await?) })
            .await
    }

    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.admit(Direction::Write, 0).await;
        self.on_engine(move |volume| async move {
            Ok(volume.write_zeroes(offset, length as u64, fua).await?)
        })
        .await
    }

    async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
        let ZeroRequest {
            offset,
            length,
            fua,
            no_hole,
        } = request;
        self.admit(Direction::Write, 0).await;
        let pieces = Arc::clone(&self.pieces);
        self.on_engine(move |volume| async move {
            if !no_hole {
                return Ok(volume.write_zeroes(offset, length as u64, fua).await?);
            }
            // The client wants the range allocated: write real zeros, a piece at a
            // time, each piece's buffer counted against the export's few.
            let end = offset + length as u64;
            let mut at = offset;
            while at < end {
                let n = PIECE_BYTES.min(end - at);
                let _piece = pieces
                    .acquire()
                    .await
                    .map_err(|_| io::Error::other("pieces closed"))?;
                volume.write(at, vec![0u8; n as usize], false).await?;
                at += n;
            }
            if fua {
                volume.flush().await?;
            }
            Ok(())
        })
        .await
    }

    /// At most a reply's worth of extents ([`MAX_REPLY_EXTENTS`]; the client asks
    /// again for the rest), the map looked at a window at a time.
    async fn block_status(&self, offset: u64, length: u32) -> io::Result<Vec<AllocationExtent>> {
        let end = offset + u64::from(length);
        let mut extents: Vec<AllocationExtent> = Vec::new();
        let mut at = offset;
        while at < end && extents.len() < MAX_REPLY_EXTENTS {
            let n = STATUS_WINDOW_BYTES.min(end - at);
            let runs = self.failures.check(
                || format!("block status of {length} bytes at {offset}"),
                self.volume.allocation(at, n),
            );
            for (bytes, allocated) in runs.0? {
                let flags = if allocated {
                    0
                } else {
                    STATE_HOLE | STATE_ZERO
                };
                // Lengths add up to at most `length`, a u32.
                lsvd_nbd::push_extent(&mut extents, bytes as u32, flags);
            }
            at += n;
        }
        Ok(extents)
    }

    /// Reading pulls the range's object chunks into the read cache: a piece at a
    /// time, each dropped once read; ranges never written hold nothing to fetch.
    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        let pieces = Arc::clone(&self.pieces);
        let failures = Arc::clone(&self.failures);
        self.on_engine(move |volume| async move {
            let end = offset + u64::from(length);
            let mut at = offset;
            let what = || format!("CACHE of {length} bytes at {offset}");
            while at < end {
                let n = PIECE_BYTES.min(end - at);
                let runs = failures.check(what, volume.allocation(at, n)).0?;
                if runs.iter().any(|&(_, allocated)| allocated) {
                    let _piece = pieces
                        .acquire()
                        .await
                        .map_err(|_| io::Error::other("pieces closed"))?;
                    drop(failures.check(what, volume.read(at, n).await).0?);
                }
                at += n;
            }
            Ok(())
        })
        .await
    }

    /// `qemu:dirty-bitmap:SNAP` for the volume's snapshots (`dirty`).
    async fn meta_contexts(&self, prefix: &str) -> io::Result<Vec<String>> {
        let dirty = Arc::clone(&self.dirty);
        let prefix = prefix.to_string();
        self.on_engine(move |volume| async move { Ok(dirty.contexts(&volume, &prefix).await?) })
            .await
    }

    /// STATE_DIRTY where written since the snapshot, a window at a time (`dirty`).
    async fn meta_context_status(
        &self,
        name: &str,
        offset: u64,
        length: u32,
    ) -> io::Result<Vec<AllocationExtent>> {
        let Some(snapshot) = dirty::DirtyBitmaps::snapshot(name) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no such meta context",
            ));
        };
        let snapshot = snapshot.to_string();
        let dirty = Arc::clone(&self.dirty);
        let failures = Arc::clone(&self.failures);
        self.on_engine(move |volume| async move {
            let answer = async {
                let base = dirty.base(&volume, &snapshot).await?;
                dirty::status(&volume, &base, offset, length).await
            };
            let what = || format!("dirty status since {snapshot} of {length} bytes at {offset}");
            failures.check(what, answer.await).0
        })
        .await
    }

    /// Writes, flushes and trims are queued for the next `unplug`, which appends them
    /// as one group commit (`lsvd_engine::write::started`) and answers the client when it retires.
    /// A WRITE_ZEROES that must stay allocated writes real zeros in pieces: it takes
    /// the task path, and so does every data request while a QoS limit is set (to
    /// wait there; a FLUSH is not limited).
    fn start(&self, op: StartOp, done: Completion) -> Result<(), (StartOp, Completion)> {
        if let StartOp::WriteZeroes(ZeroRequest { no_hole: true, .. }) = op {
            return Err((op, done));
        }
        if !matches!(op, StartOp::Flush) && self.throttled() {
            return Err((op, done));
        }
        let answer: lsvd_engine::Answer = Box::new(move |r: lsvd_core::error::Result<()>| {
            done.complete(r.map_err(io::Error::from))
        });
        match op {
            StartOp::Write { offset, data, fua } => {
                self.volume.start_write(offset, data, fua, answer)
            }
            StartOp::Flush => self.volume.start_flush(answer),
            StartOp::Trim {
                offset,
                length,
                fua,
            }
            | StartOp::WriteZeroes(ZeroRequest {
                offset,
                length,
                fua,
                ..
            }) => self
                .volume
                .start_write_zeroes(offset, u64::from(length), fua, answer),
        }
        Ok(())
    }

    /// On a connection thread the append (and a FLUSH's `fdatasync`) happens right
    /// here: the thread serves this connection alone.
    fn unplug(&self) {
        if lsvd_nbd::server::on_connection_thread() {
            self.volume.unplug_on_own_thread();
        } else {
            self.volume.unplug();
        }
    }

    /// The lease, checked right before each write of answers to the socket.
    fn may_answer_now(&self) -> bool {
        self.volume.may_answer_now()
    }

    /// The lease, checked as each answer is sent: a server paused after it finished a
    /// request must not answer it once another has taken the volume over.
    fn answerable(&self) -> impl Future<Output = io::Result<()>> + Send {
        // The common case costs two clock reads and no reference count.
        let slow = (!self.volume.may_answer_now()).then(|| self.volume.clone());
        async move {
            match slow {
                None => Ok(()),
                Some(volume) => volume.answerable().await.map_err(io::Error::from),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_engine::{EngineConfig, create_volume, open_volume};
    use lsvd_nbd::STATE_DIRTY;
    use lsvd_store::DynStore;
    use lsvd_store::mem::MemStore;
    use lsvd_store::testutil::TempDir;

    const MIB: u64 = 1 << 20;

    /// What an NBD client sees for each kind.
    #[test]
    fn every_kind_maps_to_the_expected_nbd_errno() {
        use lsvd_core::error::ErrorKind;
        use lsvd_nbd::proto::consts::{EINVAL, EIO, ENOSPC, ENOTSUP, EPERM, ESHUTDOWN};
        use lsvd_nbd::proto::transmission::error_code;
        for kind in ErrorKind::ALL {
            let want = match kind {
                ErrorKind::BadInput => EINVAL,
                ErrorKind::ReadOnly => EPERM,
                ErrorKind::Unsupported => ENOTSUP,
                ErrorKind::ShuttingDown => ESHUTDOWN,
                ErrorKind::Full => ENOSPC,
                ErrorKind::Denied
                | ErrorKind::NotFound
                | ErrorKind::AlreadyExists
                | ErrorKind::Corrupt
                | ErrorKind::Conflict
                | ErrorKind::DataLoss
                | ErrorKind::Transient
                | ErrorKind::Permanent
                | ErrorKind::LocalIo
                | ErrorKind::VolumeFailed => EIO,
            };
            let e = lsvd_core::error::Error::new(kind, "x");
            assert_eq!(error_code(&std::io::Error::from(e)), want, "{kind:?}");
        }
    }

    async fn device(dir: &TempDir, size_bytes: u64) -> NbdVolume {
        let store: DynStore = Arc::new(MemStore::new());
        create_volume(&store, "v", size_bytes)
            .await
            .expect("create");
        let config = EngineConfig {
            log_size_bytes: 16 * MIB,
            ..EngineConfig::default()
        };
        let (volume, _) = open_volume(store, "v", dir.path(), config)
            .await
            .expect("open");
        NbdVolume::new(volume, 16 * MIB)
    }

    /// BLOCK_STATUS looks at the map a window at a time; runs that cross a window's
    /// edge come back as one extent, and the extents cover the range exactly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn block_status_merges_runs_across_windows() {
        let dir = TempDir::new("nbd-device-status");
        let dev = device(&dir, 128 * MIB).await;
        // 2 MiB of data across the first window's end, 1 MiB across the second's.
        for at in [31 * MIB, 32 * MIB, 63 * MIB + MIB / 2] {
            dev.write(at, vec![7u8; MIB as usize], false)
                .await
                .expect("write");
        }
        let hole = STATE_HOLE | STATE_ZERO;
        // Lengths in half MiB.
        let ext = |halves: u64, flags| AllocationExtent {
            length_bytes: (halves * MIB / 2) as u32,
            flags,
        };
        let got = dev
            .block_status(0, (128 * MIB - 512) as u32)
            .await
            .expect("status");
        let mut want = vec![
            ext(62, hole),
            ext(4, 0),
            ext(61, hole),
            ext(2, 0),
            ext(127, hole),
        ];
        want.last_mut().expect("extents").length_bytes -= 512;
        assert_eq!(got, want);
        dev.volume.shutdown().await.expect("shutdown");
    }

    /// `qemu:dirty-bitmap:SNAP`: offered per snapshot (listed by the prefix, one by
    /// its name, none for an unknown one or another namespace); dirty where written or
    /// discarded since the snapshot (a discard of what the snapshot held as a hole is
    /// not a change); a snapshot taken again under the same name is compared with anew
    /// once selected again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dirty_bitmaps_report_what_changed_since_a_snapshot() {
        let dir = TempDir::new("nbd-device-dirty");
        let dev = device(&dir, 64 * MIB).await;
        dev.write(0, vec![1u8; 2 * MIB as usize], false)
            .await
            .expect("write");
        dev.volume.create_snapshot("s1").await.expect("snapshot");
        dev.write(4 * MIB, vec![2u8; 4096], false)
            .await
            .expect("write");
        dev.trim(MIB, MIB as u32, false).await.expect("trim");
        dev.trim(8 * MIB, MIB as u32, false)
            .await
            .expect("trim a hole");
        let s1 = "qemu:dirty-bitmap:s1";
        assert_eq!(
            dev.meta_contexts("qemu:dirty-bitmap:").await.expect("list"),
            vec![s1]
        );
        assert_eq!(dev.meta_contexts("qemu:").await.expect("list"), vec![s1]);
        assert_eq!(dev.meta_contexts(s1).await.expect("select"), vec![s1]);
        for none in [
            "qemu:dirty-bitmap:s2",
            "base:",
            "x-other:",
            "qemu:allocation-depth",
        ] {
            assert!(
                dev.meta_contexts(none).await.expect("list").is_empty(),
                "{none}"
            );
        }
        let ext = |length_bytes: u64, flags| AllocationExtent {
            length_bytes: length_bytes as u32,
            flags,
        };
        let status = |name: &'static str, len: u64| {
            let dev = &dev;
            async move {
                dev.meta_context_status(name, 0, len as u32)
                    .await
                    .expect("status")
            }
        };
        assert_eq!(
            status(s1, 64 * MIB).await,
            vec![
                ext(MIB, 0),
                ext(MIB, STATE_DIRTY),
                ext(2 * MIB, 0),
                ext(4096, STATE_DIRTY),
                ext(60 * MIB - 4096, 0),
            ]
        );
        assert!(
            dev.meta_context_status("qemu:dirty-bitmap:nope", 0, 4096)
                .await
                .is_err()
        );
        dev.volume.delete_snapshot("s1").await.expect("delete");
        dev.volume
            .create_snapshot("s1")
            .await
            .expect("snapshot again");
        assert_eq!(dev.meta_contexts(s1).await.expect("select"), vec![s1]);
        assert_eq!(status(s1, 64 * MIB).await, vec![ext(64 * MIB, 0)]);
        dev.volume.shutdown().await.expect("shutdown");
    }

    /// A failed read is logged with why, at most a line a second, the rest counted; a
    /// volume shutting down is not worth a line.
    #[test]
    fn failures_are_logged_at_most_once_a_second() {
        let log = FailureLog {
            export: "v".into(),
            limiter: Mutex::default(),
        };
        let failed = || -> lsvd_core::error::Result<()> {
            Err(lsvd_core::error::Error::new(
                lsvd_core::error::ErrorKind::Corrupt,
                "chunk checksum mismatch",
            ))
        };
        let (r, line) = log.check(|| "read of 4096 bytes at 0".into(), failed());
        assert!(r.is_err());
        assert_eq!(
            line.as_deref(),
            Some("v: read of 4096 bytes at 0 failed: chunk checksum mismatch")
        );
        assert_eq!(log.check(|| "read".into(), failed()).1, None);
        let (_, line) = log.check(
            || "read".into(),
            Err::<(), _>(lsvd_core::error::Error::new(
                lsvd_core::error::ErrorKind::ShuttingDown,
                "closing",
            )),
        );
        assert_eq!(line, None);
        assert_eq!(log.limiter.lock().expect("lock").take_held_back(), 1);
        assert!(log.check(|| "read".into(), Ok(())).0.is_ok());
    }

    /// NO_HOLE zeroing in pieces: the range reads as zeros and stays allocated, up to
    /// an end that is not a piece boundary; a CACHE over written and unwritten ranges
    /// succeeds and leaves the data as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_hole_zeroing_and_cache_work_a_piece_at_a_time() {
        let dir = TempDir::new("nbd-device-zero");
        let dev = device(&dir, 64 * MIB).await;
        let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
        dev.write(MIB, data.clone(), false).await.expect("write");
        let (at, len) = (MIB + 4096, 2 * MIB + MIB / 2);
        dev.write_zeroes(ZeroRequest {
            offset: at,
            length: len as u32,
            fua: true,
            no_hole: true,
        })
        .await
        .expect("zero");
        let got = dev.read(MIB, 4 * MIB as u32).await.expect("read");
        let mut want = data;
        want[4096..4096 + len as usize].fill(0);
        assert!(got == want, "zeroed range or its neighbours wrong");
        let status = dev.block_status(MIB, 4 * MIB as u32).await.expect("status");
        assert_eq!(
            status,
            vec![AllocationExtent {
                length_bytes: 4 * MIB as u32,
                flags: 0
            }],
            "NO_HOLE left the range allocated"
        );
        dev.cache(0, (64 * MIB) as u32).await.expect("cache");
        assert!(dev.read(MIB, 4 * MIB as u32).await.expect("read") == want);
        dev.volume.shutdown().await.expect("shutdown");
    }
}
