//! The sans-I/O core of lsvd.
//!
//! Everything here is deterministic and does no I/O: the extent maps, the persisted
//! formats, batching and coalescing, the store state with its live-byte accounting,
//! recovery planning, GC planning and the write-frequency model GC uses. The live engine (crate `lsvd-engine`) and the
//! trace-driven simulator (crate `lsvd-sim`) both drive this code, so what the simulator
//! predicts is what the engine does.
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod batcher;
pub mod changes;
pub mod compression;
pub mod error;
pub mod extent_map;
pub mod format;
pub mod gc;
pub mod gc_plan;
pub mod heat;
pub mod history;
pub mod hylog;
pub mod live_rates;
pub mod log_map;
pub mod pipeline;
pub mod recovery;
pub mod size;
pub mod store_state;
#[cfg(test)]
mod test_rng;

pub use format::{SECTOR_BYTES, VolumeId};
