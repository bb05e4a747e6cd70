//! Helpers of the VM crash test (`vm_crash.rs`): the guest under qemu and the file-tree
//! oracle.

pub mod files;
pub mod guest;
