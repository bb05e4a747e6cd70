//! One writer per volume across hosts.
//!
//! The volume superblock (`volume_super`) is a sequence of generations in the store,
//! each written put-if-absent: a server claims the volume by writing the next one, and
//! numbers its objects under that claim, so a claim that loses the race can never
//! overwrite or delete another's objects. The `lease` keeps a claim alive and notices
//! being fenced; `lease_config` holds its settings.

pub(crate) mod claim;
pub mod lease;
pub(crate) mod lease_config;
pub(crate) mod volume_super;
#[cfg(test)]
mod volume_super_tests;
