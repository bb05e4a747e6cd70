//! Maintenance of a live volume: what runs beside the client's I/O to keep the store
//! small and recovery short.
//!
//! `gc` reads the victims a GC pass names (the plan is `lsvd_core::pipeline`'s) and
//! writes their live data as new objects; `checkpoint` writes the maps so recovery
//! reads few objects; `pins` (snapshots) and `replica_hold` (replication passes under
//! way) say which deletes must wait.

pub(crate) mod checkpoint;
#[cfg(test)]
mod checkpoint_tests;
pub(crate) mod gc;
#[cfg(test)]
mod heat_tests;
pub(crate) mod pins;
pub(crate) mod replica_hold;
