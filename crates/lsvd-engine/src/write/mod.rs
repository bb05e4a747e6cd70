//! The write flow: a client write becomes a write-log record, then part of an object.
//!
//! ```text
//! NBD write ─▶ started (appended by the reading thread) or writer (group commit:
//!              one record, one pwrite, one fdatasync; log_order completes overlapped
//!              writes in log order; log_space accounts the circular log)
//!           ─▶ recent_records (newest records in memory) ─▶ uploader (batches the
//!              pipeline hands out) ─▶ put (put-if-absent under the claim's own name)
//!           ─▶ apply (store map, in sequence order) ─▶ log_tail (free the log);
//!              log_index is written every eighth of the log, for fast recovery
//! ```

pub(crate) mod apply;
mod by_record;
pub mod log_index;
#[cfg(test)]
mod log_index_tests;
#[cfg(test)]
mod log_keep_tests;
pub(crate) mod log_order;
#[cfg(test)]
mod log_order_tests;
pub mod log_space;
pub(crate) mod log_tail;
pub(crate) mod put;
pub(crate) mod recent_records;
pub(crate) mod seal;
pub(crate) mod started;
#[cfg(test)]
mod started_tests;
#[cfg(test)]
mod sync_tests;
pub(crate) mod uploader;
pub(crate) mod writer;
