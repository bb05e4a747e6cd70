//! A volume's life in the store, mostly while no server has it open: create, list and
//! describe (`admin`), the `settings` its owner may change, snapshots, writable clones
//! and their `lineage`, resize, rename, delete, and replication to another store.

pub(crate) mod admin;
pub mod changes;
#[cfg(test)]
mod changes_tests;
pub(crate) mod clone;
#[cfg(test)]
mod clone_gc_tests;
#[cfg(test)]
mod clone_tests;
pub(crate) mod delete;
#[cfg(test)]
mod delete_tests;
pub mod encryption;
pub mod lineage;
pub(crate) mod rename;
#[cfg(test)]
mod rename_tests;
pub(crate) mod replicate;
#[cfg(test)]
mod replicate_tests;
pub(crate) mod resize;
#[cfg(test)]
mod resize_tests;
pub mod settings;
pub(crate) mod snapshot;
#[cfg(test)]
pub(crate) mod snapshot_tests;
