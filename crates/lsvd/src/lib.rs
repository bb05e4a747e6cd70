//! lsvd: a log-structured virtual disk.
//!
//! The binary's pieces as a library, so integration tests and the simulator can use
//! them: the engine (one open volume), object stores, the cache device, the NBD glue
//! and the command line. The engine, the stores and the command line report failures
//! as [`lsvd_core::error::Error`].

pub mod cli;
pub mod config_file;
pub mod control;
pub mod metrics;
pub mod nbd_device;
pub mod probe;
pub mod replay;
pub mod tls;
