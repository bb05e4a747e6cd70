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

mod admin;
mod apply;
pub mod cache_dev;
pub(crate) mod cache_layout;
#[cfg(test)]
mod chain_tests;
mod checkpoint;
#[cfg(test)]
mod checkpoint_tests;
pub(crate) mod clone;
#[cfg(test)]
mod clone_tests;
pub mod config;
mod delete;
#[cfg(test)]
mod delete_tests;
#[cfg(test)]
mod error_kind_tests;
#[cfg(test)]
mod fault_metrics_tests;
mod gc;
#[cfg(test)]
mod heat_tests;
#[cfg(test)]
mod integrity_tests;
pub mod keys;
pub mod lease;
mod lease_config;
pub mod lineage;
pub mod log_index;
#[cfg(test)]
mod log_index_tests;
#[cfg(test)]
mod log_keep_tests;
mod log_order;
#[cfg(test)]
mod log_order_tests;
pub mod log_scan;
pub mod log_space;
mod log_tail;
pub(crate) mod open;
#[cfg(test)]
mod panic_tests;
mod pins;
mod put;
mod read;
mod read_cache;
mod recent_records;
mod rename;
#[cfg(test)]
mod rename_tests;
mod replica_hold;
mod replicate;
#[cfg(test)]
mod replicate_tests;
mod resize;
#[cfg(test)]
mod resize_tests;
mod shared;
mod snapshot;
#[cfg(test)]
mod snapshot_tests;
mod started;
#[cfg(test)]
mod started_tests;
pub(crate) mod store_meta;
pub mod store_recovery;
mod supervise;
#[cfg(test)]
mod sync_tests;
#[cfg(test)]
mod tests;
mod uploader;
mod volume;
pub(crate) mod volume_super;
#[cfg(test)]
mod volume_super_tests;
mod writer;

pub use admin::{
    LOOKS, ReplicaInfo, VolumeInfo, create_volume, current_size_bytes, held_now, inspect_volume,
    list_volumes, list_volumes_and_leftovers, look_again, now_unix_ms,
};
pub use clone::create_clone;
pub use config::{EngineConfig, MIN_LOG_SIZE_BYTES, RecoveryMode};
pub use delete::{DeletePlan, delete_volume, plan_delete};
pub use lineage::load_lineage;
pub use lineage::{list_clones, refuse_if_cloned};
pub use open::{OpenReport, open_snapshot, open_volume, open_volume_on};
pub use rename::{Renamed, rename_volume};
pub use replicate::{
    PassReport, ReplicateOptions, ReplicateProgress, ReplicateRun, replicate_once, replicate_pass,
};
pub use resize::Resized;
pub use shared::{LogPos, Stats};
pub use snapshot::{list_snapshots, read_snapshot, split_export_name, validate_snapshot_name};
pub use store_meta::{is_being_deleted, read_meta};
pub use volume::{Answer, LeaseStatus, Volume, VolumeStatus};
pub use volume_super::read_newest as newest_volume_super;
