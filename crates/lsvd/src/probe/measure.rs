//! The measurements of `lsvd probe`: timed I/O loops on a scratch file opened with
//! `O_DIRECT` (buffered if the filesystem refuses it).
//!
//! Why a module of its own: this is the only code in the probe that touches the disk
//! and reads the clock; the decisions (`super::decide`) are pure functions of what it
//! returns, so they can be tested on synthetic numbers.
//!
//! Every loop runs for a bounded time (`seconds_per_test`; a latency test goes on
//! until it has [`MIN_LATENCY_SAMPLES`]) and at most [`MAX_OPS_PER_TEST`] operations,
//! so every latency vector is bounded too. Each test starts with an untimed fdatasync,
//! so it does not pay for flushing the writes of the test before. Buffers are
//! [`AlignedBuf`]s (4096-byte aligned, as `O_DIRECT` needs); the data written is
//! pseudo-random, so a device that compresses or deduplicates does not flatter itself.

#![expect(
    clippy::disallowed_methods,
    reason = "the probe measures real devices in real time"
)]

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lsvd_trace::synthetic::prng::Rng;
use serde::{Deserialize, Serialize};

use lsvd_core::error::{Error, Result};

/// Alignment of every I/O buffer (and the largest logical block size we expect).
pub const BUF_ALIGN_BYTES: usize = 4096;
/// Upper bound on operations in one timed test (and on latency samples kept).
pub const MAX_OPS_PER_TEST: usize = 1 << 20;
/// Write sizes of the sweep: 512 B to 8 KiB in 512 B steps.
pub const SWEEP_SIZES_BYTES: [u32; 16] = [
    512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120, 5632, 6144, 6656, 7168, 7680, 8192,
];
/// Queue depths of the parallelism test (one thread per outstanding write).
pub const QUEUE_DEPTHS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Sizes of the sequential-write test (group-commit cap).
pub const SEQ_SIZES_BYTES: [u32; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// The write-size sweep runs in this many rounds (see `write_sweep`).
pub const SWEEP_ROUNDS: u32 = 5;
/// Latency tests take at least this many samples, even past their time.
pub const MIN_LATENCY_SAMPLES: usize = 5;
/// The probe's unit of "small I/O": one 4 KiB block.
pub const BLOCK_BYTES: u32 = 4096;
/// Chunk of the pre-write.
const PREWRITE_CHUNK_BYTES: usize = 1 << 20;

/// A heap buffer aligned to [`BUF_ALIGN_BYTES`], zero-filled on allocation. The only
/// `unsafe` of the probe lives here.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` (at least 1, a multiple of the alignment is not
    /// required).
    pub fn new(len_bytes: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len_bytes.max(1), BUF_ALIGN_BYTES)
            .expect("probe buffers are small and 4096 is a power of two");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, layout }
    }

    /// A buffer of `len_bytes` filled with pseudo-random bytes from `seed`.
    pub fn random(len_bytes: usize, seed: u64) -> AlignedBuf {
        let mut buf = AlignedBuf::new(len_bytes);
        let mut rng = Rng::new(seed);
        for chunk in buf.as_mut_slice().chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        buf
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialized (zeroed) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// The scratch file: created in the probed directory, removed when dropped (also when
/// a measurement fails half-way).
pub struct Scratch {
    path: PathBuf,
    file: File,
    /// A second handle without `O_DIRECT`, for the buffered comparison.
    buffered: File,
    /// Whether `file` was opened with `O_DIRECT` and the filesystem accepted a write.
    pub direct: bool,
    pub size_bytes: u64,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn open_scratch(path: &Path, direct: bool) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

impl Scratch {
    /// Create the scratch file in `dir` and write `size_bytes` (a multiple of 1 MiB) of
    /// pseudo-random data to it, then fdatasync. Returns it with the pre-write's
    /// bandwidth in bytes per second.
    pub fn create(dir: &Path, size_bytes: u64) -> Result<(Scratch, f64)> {
        Scratch::create_with(dir, size_bytes, true)
    }

    /// [`Scratch::create`], but `try_direct: false` goes straight to buffered I/O, as
    /// if the filesystem had refused `O_DIRECT` (tests of the fallback on filesystems
    /// that accept it).
    pub fn create_with(dir: &Path, size_bytes: u64, try_direct: bool) -> Result<(Scratch, f64)> {
        let name = format!(
            ".lsvd-probe-{}-{:x}.tmp",
            std::process::id(),
            seed_from_clock() & 0xffff_ffff
        );
        let path = dir.join(name);
        let io_err = |what: &str, e: io::Error| {
            Error::local_io(format!("probe: {what} {}", path.display()), e)
        };
        // create_new: never clobber a file of someone else.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_err("cannot create scratch file", e))?;
        let buffered = file;
        let direct_file = match open_scratch(&path, true) {
            Ok(_) if !try_direct => None,
            Ok(f) => Some(f),
            Err(e) if is_einval(&e) => None,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(io_err("cannot open scratch file with O_DIRECT", e));
            }
        };
        let fallback = match buffered.try_clone() {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(io_err("cannot reopen scratch file", e));
            }
        };
        let direct = direct_file.is_some();
        let mut scratch = Scratch {
            path,
            file: direct_file.unwrap_or(fallback),
            buffered,
            direct,
            size_bytes,
        };
        // From here on, dropping `scratch` removes the file.
        let chunk = AlignedBuf::random(PREWRITE_CHUNK_BYTES, seed_from_clock());
        // Some filesystems accept O_DIRECT at open and refuse the first write.
        if scratch.direct
            && let Err(e) = scratch
                .file
                .write_all_at(&chunk.as_slice()[..BLOCK_BYTES as usize], 0)
        {
            if !is_einval(&e) {
                return Err(scratch.err("cannot write", e));
            }
            scratch.file = scratch
                .buffered
                .try_clone()
                .map_err(|e| scratch.err("cannot reopen", e))?;
            scratch.direct = false;
        }
        let start = Instant::now();
        let mut at = 0u64;
        while at < size_bytes {
            let n = (size_bytes - at).min(PREWRITE_CHUNK_BYTES as u64) as usize;
            scratch
                .file
                .write_all_at(&chunk.as_slice()[..n], at)
                .map_err(|e| scratch.err("cannot pre-write", e))?;
            at += n as u64;
        }
        scratch
            .file
            .sync_data()
            .map_err(|e| scratch.err("cannot fdatasync", e))?;
        let bytes_per_sec = size_bytes as f64 / start.elapsed().as_secs_f64().max(1e-9);
        Ok((scratch, bytes_per_sec))
    }

    /// fdatasync, untimed, before a test: writes of the test before (still in the
    /// device's volatile cache) must not be billed to the next test's first flush.
    fn settle(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| self.err("cannot fdatasync", e))
    }

    fn err(&self, what: &str, e: io::Error) -> Error {
        Error::local_io(format!("probe: {what} {}", self.path.display()), e)
    }
}

/// Operations per second and bytes per second of one timed test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub iops: f64,
    pub bytes_per_sec: f64,
}

impl Rate {
    fn of(ops: u64, io_bytes: u64, elapsed: Duration) -> Rate {
        let secs = elapsed.as_secs_f64().max(1e-9);
        Rate {
            iops: ops as f64 / secs,
            bytes_per_sec: (ops * io_bytes) as f64 / secs,
        }
    }
}

/// Median and 99th percentile of a latency test, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub samples: u64,
    pub median_us: f64,
    pub p99_us: f64,
}

impl Latency {
    /// From samples in nanoseconds (sorted here). None for no samples.
    pub fn of(samples_ns: &mut [u64]) -> Option<Latency> {
        if samples_ns.is_empty() {
            return None;
        }
        samples_ns.sort_unstable();
        let at = |q: f64| {
            let i = ((samples_ns.len() - 1) as f64 * q).round() as usize;
            samples_ns[i.min(samples_ns.len() - 1)] as f64 / 1000.0
        };
        Some(Latency {
            samples: samples_ns.len() as u64,
            median_us: at(0.5),
            p99_us: at(0.99),
        })
    }
}

/// One row of the write-size sweep. `rate` is None when the device refused the size
/// (EINVAL: smaller than its logical block size under `O_DIRECT`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub size_bytes: u32,
    pub rate: Option<Rate>,
}

/// One row of the parallelism test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QdPoint {
    pub queue_depth: u32,
    pub rate: Rate,
}

/// One row of the sequential-write test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeqPoint {
    pub size_bytes: u32,
    pub rate: Rate,
}

/// Everything measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// Bytes per second of the sequential pre-write (1 MiB writes, then one fdatasync).
    pub prewrite_bytes_per_sec: f64,
    /// Random writes of 512 B .. 8 KiB at QD1, each at an offset that is a multiple of
    /// its size.
    pub write_sweep: Vec<SweepPoint>,
    /// 4 KiB write + fdatasync at QD1 over the pre-written region (rewrite).
    pub sync_rewrite: Latency,
    /// 4 KiB write + fdatasync at QD1 at the end of the file (append; it grows).
    pub sync_append: Latency,
    /// 4 KiB write + fdatasync at QD1 over the pre-written region, without `O_DIRECT`.
    pub sync_rewrite_buffered: Latency,
    /// 4 KiB random writes at each queue depth (one thread per outstanding write).
    pub parallel_writes: Vec<QdPoint>,
    /// Sequential writes of 4 KiB .. 4 MiB at QD1 within the pre-written region.
    pub sequential_writes: Vec<SeqPoint>,
    /// 4 KiB random reads at QD1.
    pub random_read: Latency,
}

/// How long and how many operations each test may take.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub seconds_per_test: f64,
}

impl Budget {
    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds_per_test)
    }
}

/// Run every measurement on `scratch`.
pub fn measure_all(
    scratch: &Scratch,
    budget: Budget,
    prewrite_bytes_per_sec: f64,
) -> Result<Measurements> {
    let seed = seed_from_clock();
    let largest_bytes = SEQ_SIZES_BYTES.iter().copied().max().unwrap_or(BLOCK_BYTES);
    let data = AlignedBuf::random(largest_bytes as usize, seed);
    let write_sweep = write_sweep(scratch, &data, budget, seed)?;
    let sync_rewrite = sync_writes(scratch, &scratch.file, &data, budget, false, seed)?;
    let sync_rewrite_buffered =
        sync_writes(scratch, &scratch.buffered, &data, budget, false, seed)?;
    let sync_append = sync_writes(scratch, &scratch.file, &data, budget, true, seed)?;
    let parallel_writes = parallel_writes(scratch, budget, seed)?;
    let sequential_writes = sequential_writes(scratch, &data, budget)?;
    let random_read = random_reads(scratch, budget, seed)?;
    Ok(Measurements {
        prewrite_bytes_per_sec,
        write_sweep,
        sync_rewrite,
        sync_append,
        sync_rewrite_buffered,
        parallel_writes,
        sequential_writes,
        random_read,
    })
}

/// QD1 random writes of each sweep size at offsets that are multiples of the size.
///
/// The sizes take turns: [`SWEEP_ROUNDS`] rounds, each giving every size a slice of its
/// time, so a device (or a virtual machine's host) that speeds up or slows down during
/// the sweep skews all sizes alike instead of the few measured at that moment.
fn write_sweep(
    scratch: &Scratch,
    data: &AlignedBuf,
    budget: Budget,
    seed: u64,
) -> Result<Vec<SweepPoint>> {
    let mut rng = Rng::new(seed ^ 1);
    let slice = budget.duration() / SWEEP_ROUNDS;
    let max_ops_per_slice = (MAX_OPS_PER_TEST / SWEEP_ROUNDS as usize) as u64;
    // Per size: operations, time spent, refused.
    let mut totals = [(0u64, Duration::ZERO, false); SWEEP_SIZES_BYTES.len()];
    for _round in 0..SWEEP_ROUNDS {
        for (i, &size_bytes) in SWEEP_SIZES_BYTES.iter().enumerate() {
            let (ops_total, time_total, refused) = &mut totals[i];
            if *refused {
                continue;
            }
            scratch.settle()?;
            let slots = scratch.size_bytes / u64::from(size_bytes);
            let buf = &data.as_slice()[..size_bytes as usize];
            let start = Instant::now();
            let mut ops = 0u64;
            while start.elapsed() < slice && ops < max_ops_per_slice {
                let at = rng.below(slots) * u64::from(size_bytes);
                match scratch.file.write_all_at(buf, at) {
                    Ok(()) => ops += 1,
                    Err(e) if is_einval(&e) && *ops_total == 0 && ops == 0 => {
                        *refused = true;
                        break;
                    }
                    Err(e) => return Err(scratch.err("write sweep failed on", e)),
                }
            }
            *ops_total += ops;
            *time_total += start.elapsed();
        }
    }
    Ok(SWEEP_SIZES_BYTES
        .iter()
        .zip(totals)
        .map(|(&size_bytes, (ops, time, refused))| SweepPoint {
            size_bytes,
            rate: (!refused).then(|| Rate::of(ops, u64::from(size_bytes), time)),
        })
        .collect())
}

/// QD1 4 KiB write + fdatasync through `file`: random offsets in the pre-written
/// region, or (append) one after another past its end. The appended tail is cut off
/// again afterwards.
fn sync_writes(
    scratch: &Scratch,
    file: &File,
    data: &AlignedBuf,
    budget: Budget,
    append: bool,
    seed: u64,
) -> Result<Latency> {
    let mut rng = Rng::new(seed ^ 2);
    let block = u64::from(BLOCK_BYTES);
    let buf = &data.as_slice()[..BLOCK_BYTES as usize];
    let slots = scratch.size_bytes / block;
    // Appends grow the file: at most 65536 of them (256 MiB), in practice
    // seconds_per_test / fdatasync latency.
    let max_ops = MAX_OPS_PER_TEST.min(if append { 1 << 16 } else { usize::MAX });
    let mut samples = Vec::new();
    scratch.settle()?;
    let start = Instant::now();
    let mut end = scratch.size_bytes;
    while (start.elapsed() < budget.duration() || samples.len() < MIN_LATENCY_SAMPLES)
        && samples.len() < max_ops
    {
        let at = if append {
            let at = end;
            end += block;
            at
        } else {
            rng.below(slots) * block
        };
        let t = Instant::now();
        file.write_all_at(buf, at)
            .map_err(|e| scratch.err("write failed on", e))?;
        file.sync_data()
            .map_err(|e| scratch.err("fdatasync failed on", e))?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    if append {
        file.set_len(scratch.size_bytes)
            .map_err(|e| scratch.err("cannot truncate", e))?;
    }
    Latency::of(&mut samples).ok_or_else(|| no_samples("write + fdatasync"))
}

fn no_samples(what: &str) -> Error {
    Error::new(
        lsvd_core::error::ErrorKind::LocalIo,
        format!("probe: {what} completed no operation in the time given"),
    )
}

/// 4 KiB random writes from `qd` threads at once, for each queue depth.
fn parallel_writes(scratch: &Scratch, budget: Budget, seed: u64) -> Result<Vec<QdPoint>> {
    let block = u64::from(BLOCK_BYTES);
    let slots = scratch.size_bytes / block;
    let mut points = Vec::with_capacity(QUEUE_DEPTHS.len());
    for queue_depth in QUEUE_DEPTHS {
        let per_thread_max = (MAX_OPS_PER_TEST / queue_depth as usize) as u64;
        scratch.settle()?;
        let start = Instant::now();
        let results: Vec<io::Result<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..queue_depth)
                .map(|t| {
                    let file = &scratch.file;
                    s.spawn(move || -> io::Result<u64> {
                        let buf = AlignedBuf::random(BLOCK_BYTES as usize, seed ^ u64::from(t));
                        let mut rng = Rng::new(seed ^ (u64::from(t) << 32) ^ 3);
                        let mut ops = 0u64;
                        while start.elapsed() < budget.duration() && ops < per_thread_max {
                            file.write_all_at(buf.as_slice(), rng.below(slots) * block)?;
                            ops += 1;
                        }
                        Ok(ops)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("probe thread panicked")))
                })
                .collect()
        });
        let elapsed = start.elapsed();
        let mut ops = 0u64;
        for r in results {
            ops += r.map_err(|e| scratch.err("parallel write failed on", e))?;
        }
        points.push(QdPoint {
            queue_depth,
            rate: Rate::of(ops, block, elapsed),
        });
    }
    Ok(points)
}

/// QD1 sequential writes of each size, wrapping around within the pre-written region.
fn sequential_writes(
    scratch: &Scratch,
    data: &AlignedBuf,
    budget: Budget,
) -> Result<Vec<SeqPoint>> {
    let mut points = Vec::with_capacity(SEQ_SIZES_BYTES.len());
    for size_bytes in SEQ_SIZES_BYTES {
        let size = u64::from(size_bytes);
        if size > scratch.size_bytes {
            break;
        }
        let buf = &data.as_slice()[..size_bytes as usize];
        scratch.settle()?;
        let start = Instant::now();
        let mut ops = 0u64;
        let mut at = 0u64;
        while start.elapsed() < budget.duration() && (ops as usize) < MAX_OPS_PER_TEST {
            if at + size > scratch.size_bytes {
                at = 0;
            }
            scratch
                .file
                .write_all_at(buf, at)
                .map_err(|e| scratch.err("sequential write failed on", e))?;
            at += size;
            ops += 1;
        }
        points.push(SeqPoint {
            size_bytes,
            rate: Rate::of(ops, size, start.elapsed()),
        });
    }
    Ok(points)
}

/// QD1 4 KiB random reads of the pre-written region.
fn random_reads(scratch: &Scratch, budget: Budget, seed: u64) -> Result<Latency> {
    let mut rng = Rng::new(seed ^ 4);
    let block = u64::from(BLOCK_BYTES);
    let slots = scratch.size_bytes / block;
    let mut buf = AlignedBuf::new(BLOCK_BYTES as usize);
    let mut samples = Vec::new();
    scratch.settle()?;
    let start = Instant::now();
    while (start.elapsed() < budget.duration() || samples.len() < MIN_LATENCY_SAMPLES)
        && samples.len() < MAX_OPS_PER_TEST
    {
        let t = Instant::now();
        scratch
            .file
            .read_exact_at(buf.as_mut_slice(), rng.below(slots) * block)
            .map_err(|e| scratch.err("read failed on", e))?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    Latency::of(&mut samples).ok_or_else(|| no_samples("random read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_sized() {
        for len in [1usize, 512, 4096, 5000, 1 << 20] {
            let b = AlignedBuf::random(len, 7);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        }
        let z = AlignedBuf::new(4096);
        assert!(z.as_slice().iter().all(|&b| b == 0));
    }

    /// Every measurement runs, direct and buffered, and the scratch file goes away.
    #[test]
    fn measure_all_runs_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("lsvd-probe-measure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for try_direct in [true, false] {
            let (scratch, prewrite) =
                Scratch::create_with(&dir, 16 << 20, try_direct).expect("scratch");
            if !try_direct {
                assert!(!scratch.direct);
            }
            assert!(prewrite > 0.0);
            let budget = Budget {
                seconds_per_test: 0.005,
            };
            let m = measure_all(&scratch, budget, prewrite).expect("measure");
            assert_eq!(m.write_sweep.len(), SWEEP_SIZES_BYTES.len());
            assert!(m.write_sweep.iter().any(|p| p.rate.is_some()));
            assert_eq!(m.parallel_writes.len(), QUEUE_DEPTHS.len());
            assert_eq!(m.sequential_writes.len(), SEQ_SIZES_BYTES.len());
            assert!(m.sync_append.samples >= MIN_LATENCY_SAMPLES as u64);
            assert!(m.random_read.samples >= MIN_LATENCY_SAMPLES as u64);
            let len = std::fs::metadata(&scratch.path).expect("scratch").len();
            assert_eq!(len, 16 << 20, "the appended tail is cut off again");
            drop(scratch);
            let left = std::fs::read_dir(&dir).expect("list").count();
            assert_eq!(left, 0, "scratch file removed (direct: {try_direct})");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn latency_percentiles() {
        let mut s: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let l = Latency::of(&mut s).expect("samples");
        assert_eq!(l.samples, 100);
        assert_eq!(l.median_us, 51.0);
        assert_eq!(l.p99_us, 99.0);
        assert!(Latency::of(&mut []).is_none());
    }
}
