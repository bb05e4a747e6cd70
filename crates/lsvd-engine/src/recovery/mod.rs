//! Recovery: rebuild a volume's state after a stop or a crash.
//!
//! `store_recovery` rebuilds the store map from the newest checkpoint and the objects
//! after it (a prefix: the first gap ends it); `log_scan` follows the write log's record
//! chain on the cache device and replays what the store lacks. `crate::open` drives
//! both and then starts the tasks.

#[cfg(test)]
mod integrity_tests;
pub(crate) mod log_plan;
pub mod log_scan;
pub mod store_recovery;
