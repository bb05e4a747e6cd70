//! lsvd: a log-structured virtual disk.
//!
//! The binary's pieces as a library, so integration tests can use them: the command
//! line and `lsvd serve`, the NBD glue over the engine (`lsvd-engine`), the config
//! file, metrics, TLS, the control socket, the device probe and live trace replay.
//! The layers below are crates of their own (README.md of each under `crates/`).
//! Failures are [`lsvd_core::error::Error`].
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod cli;
pub mod config_file;
pub mod control;
mod json_out;
pub mod metrics;
pub mod nbd_device;
pub mod probe;
pub mod qos;
pub mod replay;
pub mod tls;
