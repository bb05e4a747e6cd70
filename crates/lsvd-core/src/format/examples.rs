//! Example values of the persisted structures, the ones the format tests pin to golden
//! bytes. They are public so that the fuzz seed maker (fuzz/examples/make_seeds.rs)
//! encodes the very same structures as seeds instead of spelling out look-alikes.

use super::VolumeId;
use super::cache_super::CacheSuper;
use super::chain_drive::{DriveRecord, Layout};
use super::checkpoint::{Checkpoint, CheckpointExtent, CheckpointHeat, CheckpointObject, Counters};
use super::clone_link::CloneLink;
use super::object::ObjectExtent;
use super::record::{ExtentKind, RecordExtent, encode_record};

/// A data extent and a zero extent of a write-log record (the data is 8 sectors).
pub const RECORD_EXTENTS: [RecordExtent; 2] = [
    RecordExtent {
        lba: 8,
        sectors: 8,
        kind: ExtentKind::Data,
    },
    RecordExtent {
        lba: 100,
        sectors: 16,
        kind: ExtentKind::Zero,
    },
];

/// Two extents of a data object, 17 sectors of data in all.
pub const OBJECT_EXTENTS: [ObjectExtent; 2] = [
    ObjectExtent {
        lba: 0,
        sectors: 8,
        source: None,
    },
    ObjectExtent {
        lba: 64,
        sectors: 9,
        source: None,
    },
];

/// Two consecutive write-log records of volume `[5; 16]` (seq 10 at offset 8192, one
/// data extent; seq 11 at 16384, two), as (log offset, header bytes): what a log
/// index lists.
pub fn log_index_records() -> Vec<(u64, Vec<u8>)> {
    let v = VolumeId([5; 16]);
    let e = |lba| RecordExtent {
        lba,
        sectors: 8,
        kind: ExtentKind::Data,
    };
    let a = encode_record(v, 10, 0, &[e(0)], &[1; 4096]);
    let crc_a = u32::from_le_bytes([a[48], a[49], a[50], a[51]]);
    let b = encode_record(v, 11, crc_a, &[e(8), e(64)], &[2; 8192]);
    vec![(8192, a[..80].to_vec()), (8192 + 8192, b[..96].to_vec())]
}

/// A clean checkpoint of one object holding one extent, without heat.
pub fn checkpoint() -> Checkpoint {
    Checkpoint {
        clean: true,
        counters: Counters {
            client_write_bytes: 1,
            store_write_bytes: 2,
            gc_passes: 3,
            gc_moved_bytes: 4,
            gc_hot_moved_bytes: 5,
            gc_cold_moved_bytes: 6,
        },
        volume_size_bytes: 1 << 30,
        next_object_seq: 12,
        last_record_seq: 99,
        objects: vec![CheckpointObject {
            seq: 3,
            kind: 1,
            header_bytes: 200,
            total_bytes: 8392,
            live_bytes: 4096,
            epoch: 4,
        }],
        extents: vec![CheckpointExtent {
            lba: 8,
            sectors: 8,
            object_seq: 3,
            object_offset: 200,
        }],
        heat: None,
    }
}

/// [`checkpoint`] with a heat section (HyLog's write counts).
pub fn checkpoint_with_heat() -> Checkpoint {
    Checkpoint {
        heat: Some(CheckpointHeat {
            since_decay_bytes: 7,
            decays: 2,
            region_shift: 12,
            counts: vec![0, 1, 127, 128, 300, u32::MAX],
        }),
        ..checkpoint()
    }
}

/// A cache superblock of a 1 GiB cache file, not clean, at `generation`.
pub fn cache_super(generation: u64) -> CacheSuper {
    CacheSuper {
        clean: false,
        volume: VolumeId([3; 16]),
        generation,
        file_bytes: 1 << 30,
        log_start: 8192,
        log_end: 1 << 30,
        tail_offset: 8192,
        tail_seq: 1,
        index_epoch: 9,
        claimed_epoch: 3,
        claimed_session: 8,
        local_key_id: None,
    }
}

/// The link of clone "vm-17" to snapshot "v1" of "golden".
pub fn clone_link() -> CloneLink {
    CloneLink {
        parent: "golden".into(),
        parent_volume: VolumeId([1; 16]),
        snapshot: "v1".into(),
        clone: "vm-17".into(),
        clone_volume: VolumeId([2; 16]),
        through_seq: 0x99,
        created_unix_ms: 1_800_000_000_000,
    }
}

/// Drive 1 of a three-drive chain, two copies.
pub fn drive_record() -> DriveRecord {
    DriveRecord {
        chain_id: [0xc5; 16],
        generation: 0x0102_0304_0506_0708,
        layout: Layout::Chain,
        drive_count: 3,
        drive_index: 1,
        tail_index: 2,
        copies: 2,
        mirror_stale: false,
    }
}
