//! Property checks behind lsvd's coverage-guided fuzz targets.
//!
//! Each `src/bin/*.rs` is a one-line AFL++ harness that hands the fuzzer's bytes to one
//! function here. Keeping the checks in a library means they are ordinary, reviewable
//! Rust, and `cargo test` in this package replays the seed corpora through them without
//! AFL (see `tests/corpus.rs`). Every check panics on a violated property; AFL counts
//! the abort as a crash and keeps the input.
//!
//! What each target checks is written in `docs/fuzzing.md`.

pub mod bytes;
pub mod format_targets;
pub mod nbd_proto;
pub mod nbd_session;
pub mod nbd_volume;
pub mod trace_parse;

#[cfg(test)]
mod corpus_tests;
