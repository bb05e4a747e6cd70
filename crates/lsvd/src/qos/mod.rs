//! Per-volume QoS limits: IOPS and bytes per second, for reads, writes, or both, with
//! a burst (docs/SEMANTICS.md, "QoS limits").
//!
//! Why: one client of a host's many volumes can otherwise take the whole write log,
//! the upload bandwidth and the store's request budget. Limits come from `lsvd serve
//! --limit-*` and the config file's `[volumes.NAME]` tables ([`limits`]); the
//! arithmetic is a sans-I/O token bucket per limit ([`bucket`]); requests wait in the
//! NBD device adapter ([`throttle`], used by `nbd_device.rs`) and never fail for a
//! limit; SIGHUP reloads the tables ([`reload`]).

pub mod bucket;
pub mod limits;
pub mod reload;
pub mod throttle;

pub use bucket::Direction;
pub use limits::{LimitArgs, Limits, VolumeSection};
pub use throttle::Throttle;
