//! The live engine: one open volume.
//!
//! ```text
//!  NBD tasks ──write/trim/flush──▶ [bounded queue] ──▶ log writer thread (writer)
//!                                                      │ group commit: one record,
//!                                                      │ one pwrite, one fdatasync
//!                                                      ▼
//!                      overlay map + pipeline (lsvd_core::pipeline, under `state`):
//!                      batches, sequence numbers, upload queue, apply order, GC passes,
//!                      checkpoint cadence
//!                                                      │ next_upload
//!                                                      ▼
//!           uploader task: read a batch back from the log (or take a GC object, or a
//!           checkpoint), PUT it (put: retry forever), apply in sequence order (apply),
//!           free the log (log_tail); checkpoints are named and prune (checkpoint)
//!  gc task: read victims' live data, encode GC objects, hand them to the pipeline
//!  NBD tasks ──read──▶ overlay map ▶ log │ store map ▶ ranged GET (chunk-verified) │ zeros
//! ```
//!
//! Modules import in one direction: `volume` and `open` start the tasks (`writer`,
//! `uploader`, `checkpoint`, `gc`, `read`); tasks use `put`, `apply`, `log_tail` and
//! `shared`; `shared` holds the state and the pipeline from `lsvd-core`, where every
//! policy lives.
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod cache_dev;
pub(crate) mod cache_layout;
#[cfg(test)]
mod chain_tests;
pub mod config;
#[cfg(test)]
mod error_kind_tests;
#[cfg(test)]
mod fault_metrics_tests;
pub mod fencing;
pub mod keys;
pub mod lifecycle;
pub mod local_encryption;
mod locks;
pub mod maintenance;
pub(crate) mod open;
#[cfg(test)]
mod panic_tests;
mod read;
pub mod recovery;
mod shared;
pub(crate) mod store_meta;
mod supervise;
#[cfg(test)]
mod tests;
mod volume;
pub mod write;

pub use config::{EngineConfig, MIN_LOG_SIZE_BYTES, RecoveryMode};
pub use fencing::volume_super::read_newest as newest_volume_super;
pub use lifecycle::admin::{
    LOOKS, ReplicaInfo, VolumeInfo, create_volume, create_volume_with, current_size_bytes,
    held_now, inspect_volume, list_volumes, list_volumes_and_leftovers, look_again, now_unix_ms,
};
pub use lifecycle::changes::ChangeBase;
pub use lifecycle::clone::create_clone;
pub use lifecycle::delete::{DeletePlan, delete_volume, plan_delete};
pub use lifecycle::encryption::{local_keys, rotate_key, unlock, unlock_pair, unlock_volume};
pub use lifecycle::lineage::load_lineage;
pub use lifecycle::lineage::{list_clones, refuse_if_cloned};
pub use lifecycle::rename::{Renamed, rename_volume};
pub use lifecycle::replicate::{
    PassReport, ReplicateOptions, ReplicateProgress, ReplicateRun, replicate_once, replicate_pass,
};
pub use lifecycle::resize::Resized;
pub use lifecycle::settings::{read_settings, set_compression};
pub use lifecycle::snapshot::{
    list_snapshots, read_snapshot, split_export_name, validate_snapshot_name,
};
pub use lsvd_core::changes::Change;
pub use open::{OpenReport, open_snapshot, open_volume, open_volume_on};
pub use read::cache::{HOST_CACHE_STEM, HostReadCache, READ_CACHE_CHUNK_BYTES};
pub use shared::{LogPos, Stats};
pub use store_meta::{is_being_deleted, read_meta};
pub use volume::{Answer, LeaseStatus, Volume, VolumeStatus};

// Declared apart from the modules above: fixtures for the tests, not a part of the engine.
#[cfg(test)]
mod test_support;
