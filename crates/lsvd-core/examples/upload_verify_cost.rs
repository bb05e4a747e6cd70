//! The CPU cost of verifying write-log records before upload, for callgrind:
//!
//! ```text
//! cargo build --release -p lsvd-core --example upload_verify_cost
//! for m in setup before after; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/upload_verify_cost $m 2>&1 | grep 'Collected'
//! done
//! ```
//!
//! Builds one 8 MiB batch of 2048 records of one 4 KiB write each (as the log holds
//! them), then encodes the data object the uploader makes of it: `before` copies each
//! record's data into the object and checksums the object (the uploader until now);
//! `after` also decodes each record's header, compares it with the one written and
//! verifies its CRC32C and XXH3 data hash first (the uploader now). `setup` only
//! builds the records. (Instructions of `before` or `after` minus `setup`) / 2048 is
//! the cost per 4 KiB written.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use lsvd_core::format::VolumeId;
use lsvd_core::format::object::{
    ObjectExtent, ObjectKind, ObjectSpec, finish_object_in_place, object_header_len,
};
use lsvd_core::format::record::{
    ExtentKind, RecordExtent, decode_record_header, encode_record_parts, verify_record,
};

const RECORDS: usize = 2048;
const BLOCK: usize = 4096;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "after".into());
    let volume = VolumeId([3; 16]);
    // The log: records back to back, with the headers the writer kept.
    let mut log = Vec::new();
    let mut headers = Vec::new();
    let mut prev_crc = 0;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..RECORDS {
        let data: Vec<u8> = (0..BLOCK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let extents = [RecordExtent {
            lba: (i * 8) as u64,
            sectors: 8,
            kind: ExtentKind::Data,
        }];
        let (bytes, header) =
            encode_record_parts(volume, i as u64 + 1, prev_crc, &extents, &[&data]);
        prev_crc = header.crc;
        headers.push((log.len(), header));
        log.extend_from_slice(&bytes);
    }
    if mode == "setup" {
        println!("{}", log.len());
        return;
    }
    let verify = match mode.as_str() {
        "before" => false,
        "after" => true,
        other => panic!("mode {other}: expected setup, before or after"),
    };
    let extents: Vec<ObjectExtent> = (0..RECORDS)
        .map(|i| ObjectExtent {
            lba: (i * 8) as u64,
            sectors: 8,
            source: None,
        })
        .collect();
    let spec = ObjectSpec {
        kind: ObjectKind::Data,
        volume,
        seq: 1,
        last_record_seq: RECORDS as u64,
        extents: &extents,
        trims: &[],
        volume_size_bytes: None,
        parts_after: 0,
        epoch: 1,
        first_record_seq: 1,
    };
    let header_len = object_header_len(&spec, (RECORDS * BLOCK) as u64);
    let mut object = vec![0u8; header_len + RECORDS * BLOCK];
    let mut at = header_len;
    for (offset, h) in &headers {
        let hb = h.header_bytes as usize;
        let len = hb + h.data_bytes() as usize;
        if verify {
            // The whole record read back (a copy, as pread makes), verified, then its
            // data copied into the object.
            let record = log[*offset..*offset + len].to_vec();
            let decoded = decode_record_header(&record).expect("decodes");
            assert!(decoded == *h, "header changed");
            verify_record(h, &record).expect("verifies");
            object[at..at + BLOCK].copy_from_slice(&record[hb..]);
        } else {
            // The data alone read straight into the object.
            object[at..at + BLOCK].copy_from_slice(&log[*offset + hb..*offset + len]);
        }
        at += BLOCK;
    }
    finish_object_in_place(&spec, &mut object, header_len);
    println!("{}", object.len());
}
