//! Chained logging (Gecko, issue 15) on modelled drives: `lsvd sim --layout chain:N`
//! and `--layout stripe:N`.
//!
//! A log of fixed-size segments spread over N drives, written by closed-loop clients
//! issuing random writes, cleaned by a GC worker once free segments run low. `stripe`
//! lays the log over RAID-0, so GC reads and writes hit every drive the clients
//! write to; `chain` puts the log tail on one drive at a time and cleans only the
//! body, writing what it moves either back into the body (compact-in-body) or to the
//! tail (move-to-tail). The drives are queues with HDD or SSD service-time models on
//! a simulated clock, so application and GC throughput over time can be compared with
//! Gecko's measurements. See `docs/sim/gecko.md`.
//!
//! * [`config`]: one simulation's settings and their checks.
//! * [`device`]: service-time models and the per-drive FIFO.
//! * [`array`]: the drives under a layout, optionally mirrored.
//! * [`cache`]: the tail cache (LRU of client-written blocks) in front of reads.
//! * [`layout`]: segments, placement over drives, maps, allocation, victim choice.
//! * [`run`]: the event loop (clients, GC worker).
//! * [`trace`]: trace-driven clients (several traces mixed).
//! * [`report`]: summaries, text table, SVG.
//! * [`cli`]: the command-line options.

pub mod array;
pub mod cache;
pub mod cli;
pub mod config;
pub mod device;
pub mod layout;
pub mod report;
pub mod run;
pub mod trace;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod tests;
