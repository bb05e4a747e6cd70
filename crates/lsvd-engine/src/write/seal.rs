//! The last step of building an object: its header written into the room left for it
//! in front of the data (format version 4), or, when the volume compresses, the object
//! encoded again as version 5 with its chunks compressed where that saves space.
//!
//! Uploads and GC both lay an object's data out in one buffer first; only this step
//! knows the volume's compression, so neither builder has two shapes.

use lsvd_core::compression::Compression;
use lsvd_core::format::object::{ObjectSpec, encode_compressed_object, finish_object_in_place};
use lsvd_store::direct_buf::DirectBuf;

/// Seal `buf` (`header_len` bytes of room, then the data section) as the object
/// `spec`, compressed with `compression`. Runs on a blocking thread: compressing
/// megabytes takes milliseconds.
pub(crate) fn seal_object(
    spec: &ObjectSpec<'_>,
    mut buf: DirectBuf,
    header_len: usize,
    compression: Compression,
) -> DirectBuf {
    if compression.is_none() {
        finish_object_in_place(spec, buf.as_mut_slice(), header_len);
        return buf;
    }
    let object = encode_compressed_object(spec, &buf.as_mut_slice()[header_len..], compression);
    DirectBuf::filled(object.len(), |v| v.extend_from_slice(&object))
}

// A volume that compresses, end to end (written, read, reopened, replicated).
#[cfg(test)]
#[path = "compression_tests.rs"]
mod compression_tests;
