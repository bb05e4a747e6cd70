//! Block I/O workloads for the lsvd simulator and replay tool.
//!
//! lsvd's design questions (garbage-collection cost, cache hit rates, write
//! amplification) can only be answered against realistic access patterns.
//! This crate turns the published block traces in their many ad-hoc formats
//! into one stream of [`Request`]s, and generates synthetic workloads
//! ([`synthetic`]) for the cases no trace covers.
//!
//! Reading a trace:
//!
//! ```no_run
//! use lsvd_trace::{Format, TraceReader, detect_format};
//! # fn main() -> Result<(), lsvd_trace::Error> {
//! let path = "msr-cambridge1-sample.csv";
//! let mut reader = TraceReader::open(path, detect_format(path)?)?;
//! while let Some(req) = reader.next_request()? {
//!     let _ = (req.time_ns, reader.volume_name(req.volume), req.offset_bytes);
//! }
//! println!("{:?}", reader.stats());
//!
//! // Or as a plain iterator; an I/O error ends it and is kept:
//! let mut reader = TraceReader::open(path, Format::Msr)?;
//! let writes = reader.by_ref().filter(|r| r.op == lsvd_trace::Op::Write).count();
//! let stats = reader.finish()?;
//! # let _ = (writes, stats);
//! # Ok(()) }
//! ```
//!
//! Every reader normalizes time to nanoseconds since the trace's first
//! record and sizes to bytes; the per-format notes are in [`formats`].
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod error;
mod format;
pub mod formats;
mod input;
mod numbers;
mod reader;
pub mod synthetic;
mod units;
mod volumes;

pub use error::Error;
pub use format::{Format, FormatChoice, detect_format};
pub use reader::{MAX_BAD_LINES_KEPT, ParseStats, TraceReader};
pub use synthetic::{Pattern, Synthetic, SyntheticSpec, synthetic};
pub use units::{MIN_REQUESTS_TO_JUDGE, SECTOR_BYTES, Units, units_warning};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a request does to its byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read the range.
    Read,
    /// Write the range.
    Write,
    /// Discard (TRIM/UNMAP) the range.
    Trim,
}

/// One block I/O request, in the units every consumer of this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// Arrival time in nanoseconds since the trace's first record.
    pub time_ns: u64,
    /// Dense volume id, in order of first appearance; see
    /// [`TraceReader::volume_name`].
    pub volume: u32,
    /// What the request does.
    pub op: Op,
    /// Start of the range in bytes.
    pub offset_bytes: u64,
    /// Length of the range in bytes; never zero.
    pub length_bytes: u64,
}
