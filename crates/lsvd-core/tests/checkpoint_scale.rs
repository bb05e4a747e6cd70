//! Scale measurement: encode, decode and load a checkpoint of one million extents.
//! Ignored by default (timing, not correctness); run with
//! `cargo test --release -p lsvd-core --test checkpoint_scale -- --ignored --nocapture`.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::time::Instant;

use lsvd_core::format::checkpoint::{Counters, decode_checkpoint, encode_checkpoint};
use lsvd_core::format::object::{ObjectExtent, ObjectKind, header_without_data};
use lsvd_core::store_state::StoreState;

#[test]
#[ignore = "timing measurement"]
fn one_million_extent_checkpoint() {
    let extents_wanted = 1_000_000u64;
    let per_object = 2048u64;
    let mut s = StoreState::new(64 << 30);
    let mut seq = 1;
    let t = Instant::now();
    // Every other sector, so no two extents merge.
    let mut lba = 0u64;
    while s.map().extent_count() < extents_wanted as usize {
        let extents: Vec<ObjectExtent> = (0..per_object)
            .map(|i| ObjectExtent {
                lba: lba + 2 * i,
                sectors: 1,
                source: None,
            })
            .collect();
        lba += 2 * per_object;
        s.apply(&header_without_data(
            ObjectKind::Data,
            seq,
            seq,
            extents,
            Vec::new(),
        ))
        .expect("apply");
        seq += 1;
    }
    let build = t.elapsed();
    let t = Instant::now();
    let bytes = encode_checkpoint(&s.to_checkpoint(true, Counters::default()));
    let encode = t.elapsed();
    let t = Instant::now();
    let ck = decode_checkpoint(&bytes).expect("decodes");
    let decode = t.elapsed();
    let t = Instant::now();
    let loaded = StoreState::from_checkpoint(seq, 0, &ck).expect("loads");
    let load = t.elapsed();
    assert_eq!(loaded.map().extent_count(), s.map().extent_count());
    println!(
        "{} extents in {} objects: checkpoint {} MB; build map {:?}, encode {:?}, decode+verify {:?}, load {:?}",
        s.map().extent_count(),
        s.objects().len(),
        bytes.len() / 1_000_000,
        build,
        encode,
        decode,
        load
    );
}
