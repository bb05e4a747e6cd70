//! Fuzz checks for the metadata decoders: checkpoints, the write-log index, the cache
//! and volume superblocks and the volume metadata object. Same modes as the parent
//! module's targets. Snapshot records, clone links, replica status records and chain
//! drive records share the `format_supers` target.

use lsvd_core::compression::Compression;
use lsvd_core::format::cache_super::{CacheSuper, decode_cache_super, encode_cache_super};
use lsvd_core::format::chain_drive::{
    DriveRecord, Layout, MAX_DRIVES, decode_drive_record, encode_drive_record,
};
use lsvd_core::format::checkpoint::{
    Checkpoint, CheckpointExtent, CheckpointHeat, CheckpointObject, Counters, decode_checkpoint,
    encode_checkpoint,
};
use lsvd_core::format::clone_link::{CloneLink, decode_clone_link, encode_clone_link};
use lsvd_core::format::log_index::{
    IndexedRecord, LOG_INDEX_FIXED_BYTES, LogIndex, decode_log_index, encode_log_index,
    log_index_len,
};
use lsvd_core::format::record::{
    ExtentKind, RecordExtent, decode_record_header, encode_header_prefix, encode_record,
};
use lsvd_core::format::replica_status::{
    PassInProgress, ReplicaStatus, cut_peer, decode_replica_status, encode_replica_status,
};
use lsvd_core::format::sealed::{
    decode_sealed_header, encode_sealed_header, plain_len, sealed_len, segments_for, split_segments,
};
use lsvd_core::format::snapshot::{SnapshotRecord, decode_snapshot, encode_snapshot};
use lsvd_core::format::volume_keys::{
    CIPHER_AES256_GCM, VolumeKeys, decode_volume_keys, encode_volume_keys,
};
use lsvd_core::format::volume_meta::{VolumeMeta, decode_volume_meta, encode_volume_meta};
use lsvd_core::format::volume_settings::{
    VolumeSettings, decode_volume_settings, encode_volume_settings,
};
use lsvd_core::format::volume_super::{
    NO_CHECKPOINT, VolumeSuper, decode_volume_super, encode_volume_super,
};

use super::{
    assert_last_seq_refused, assert_reencodes, assert_round_trip_then_corruption_refused, corrupt,
    fix, format_target, split_mode, volume,
};
use crate::bytes::Bytes;

// checkpoints

fn check_checkpoint_bytes(buf: &[u8]) {
    assert_reencodes(buf, "checkpoint", decode_checkpoint, |c| {
        Ok(encode_checkpoint(c))
    });
}

fn generate_checkpoint(b: &mut Bytes<'_>) {
    // Fields are drawn from `b` in the order written (the layout's order).
    let c = Checkpoint {
        clean: b.bool(),
        counters: Counters {
            client_write_bytes: b.u64(),
            store_write_bytes: b.u64(),
            gc_passes: b.u64(),
            gc_moved_bytes: b.u64(),
            gc_hot_moved_bytes: b.u64(),
            gc_cold_moved_bytes: b.u64(),
        },
        volume_size_bytes: b.u64(),
        next_object_seq: b.u64(),
        last_record_seq: b.u64(),
        objects: (0..b.below(8))
            .map(|_| CheckpointObject {
                seq: b.u64(),
                kind: b.u16(),
                header_bytes: b.u32(),
                total_bytes: b.u64(),
                live_bytes: b.u64(),
                epoch: b.u64(),
            })
            .collect(),
        extents: (0..b.below(8))
            .map(|_| CheckpointExtent {
                lba: b.u64(),
                sectors: b.u64(),
                object_seq: b.u64(),
                object_offset: b.u64(),
            })
            .collect(),
        heat: b.bool().then(|| CheckpointHeat {
            since_decay_bytes: b.u64(),
            decays: b.u64(),
            // Region sizes 2^9..=2^62 bytes, as the format allows.
            region_shift: 9 + b.below(54) as u8,
            // Half of them zero: runs of never-written regions.
            counts: (0..b.below(16))
                .map(|_| if b.bool() { 0 } else { b.u32() })
                .collect(),
        }),
    };
    let mut buf = encode_checkpoint(&c);
    assert_round_trip_then_corruption_refused(b, &mut buf, &c, "checkpoint", decode_checkpoint);
}

/// Target `format_checkpoint`.
pub fn checkpoint(data: &[u8]) {
    let refit = |fixed: &mut Vec<u8>| {
        let len = fixed.len();
        fix::crc_at(fixed, 12, len);
    };
    let check = |buf: &[u8], _| check_checkpoint_bytes(buf);
    format_target(data, generate_checkpoint, check, refit);
}

// write-log index

fn reencode_index(ix: &LogIndex) -> Vec<u8> {
    let headers: Vec<(u64, Vec<u8>)> = ix
        .records
        .iter()
        .map(|r| (r.offset, encode_header_prefix(&r.header)))
        .collect();
    encode_log_index(
        ix.volume,
        ix.generation,
        ix.epoch,
        headers.iter().map(|(o, h)| (*o, h.as_slice())),
    )
}

fn check_log_index_bytes(buf: &[u8]) {
    let Ok(ix) = decode_log_index(buf) else {
        return;
    };
    let len = log_index_len(&buf[..LOG_INDEX_FIXED_BYTES]).expect("fixed part of a valid index");
    assert!(len <= buf.len() as u64, "index length past its buffer");
    let again = decode_log_index(&reencode_index(&ix));
    assert_eq!(again.as_ref(), Ok(&ix), "index re-encodes differently");
}

fn generate_log_index(b: &mut Bytes<'_>) {
    let vol = volume(b);
    let (generation, epoch) = (b.u64(), b.u64());
    let mut seq = b.u64();
    let mut prev_crc = b.u32();
    let mut records = Vec::new();
    for _ in 0..b.below(6) {
        let extents: Vec<RecordExtent> = (0..b.below(4))
            .map(|_| RecordExtent {
                lba: b.u64(),
                sectors: 1 + b.below(4),
                kind: ExtentKind::Zero,
            })
            .collect();
        let rec = encode_record(vol, seq, prev_crc, &extents, &[]);
        if seq == u64::MAX {
            // No index can list it (the chain ends before it).
            assert_last_seq_refused(&rec);
            break;
        }
        let header = decode_record_header(&rec).expect("encoded record decodes");
        prev_crc = header.crc;
        records.push(IndexedRecord {
            offset: b.u64(),
            header,
        });
        seq = seq.wrapping_add(1);
    }
    // After u64::MAX the "next" sequence number would wrap to 0: that is not a chain
    // (and u64::MAX itself no longer decodes, so the generator stops before it).
    let wrapped = records.windows(2).any(|w| w[0].header.seq == u64::MAX);
    let ix = LogIndex {
        volume: vol,
        generation,
        epoch,
        records,
    };
    let mut buf = reencode_index(&ix);
    if wrapped {
        assert!(
            decode_log_index(&buf).is_err(),
            "sequence wrap accepted as a chain"
        );
        return;
    }
    assert_round_trip_then_corruption_refused(b, &mut buf, &ix, "log index", decode_log_index);
}

/// Target `format_log_index`.
pub fn log_index(data: &[u8]) {
    let refit = |fixed: &mut Vec<u8>| {
        let end = fix::le_u64(fixed, 48)
            .and_then(|entries| usize::try_from(entries).ok())
            .and_then(|e| e.checked_add(LOG_INDEX_FIXED_BYTES));
        if let Some(end) = end {
            fix::crc_at(fixed, 12, end);
        }
    };
    let check = |buf: &[u8], _| check_log_index_bytes(buf);
    format_target(data, generate_log_index, check, refit);
}

// superblocks and volume metadata

fn check_supers_bytes(which: u8, buf: &[u8]) {
    match which % 10 {
        0 => assert_reencodes(buf, "cache superblock", decode_cache_super, |s| {
            Ok(encode_cache_super(s))
        }),
        1 => assert_reencodes(buf, "volume superblock", decode_volume_super, |s| {
            Ok(encode_volume_super(s))
        }),
        2 => assert_reencodes(buf, "volume metadata", decode_volume_meta, |m| {
            Ok(encode_volume_meta(m))
        }),
        5 => assert_reencodes(
            buf,
            "replica status",
            decode_replica_status,
            encode_replica_status,
        ),
        6 => {
            if let Ok(r) = decode_drive_record(buf) {
                let bytes = encode_drive_record(&r);
                assert_eq!(bytes, buf, "chain drive record re-encodes differently");
                assert_eq!(
                    decode_drive_record(&bytes),
                    Ok(r),
                    "chain drive record re-decodes differently"
                );
            }
        }
        4 => assert_reencodes(buf, "clone link", decode_clone_link, encode_clone_link),
        7 => assert_reencodes(buf, "volume settings", decode_volume_settings, |s| {
            Ok(encode_volume_settings(s))
        }),
        8 => assert_reencodes(buf, "volume key record", decode_volume_keys, |k| {
            Ok(encode_volume_keys(k))
        }),
        9 => check_sealed_layout(buf),
        _ => assert_reencodes(buf, "snapshot record", decode_snapshot, encode_snapshot),
    }
}

/// The sealed-object envelope: its header re-encodes, and the layout arithmetic on
/// any stored size and range neither panics nor disagrees with itself.
fn check_sealed_layout(buf: &[u8]) {
    if decode_sealed_header(buf).is_ok() {
        assert_eq!(
            buf[..16],
            encode_sealed_header()[..],
            "sealed header re-encodes differently"
        );
    }
    let stored = buf.len() as u64 * 1000 + u64::from(buf.first().copied().unwrap_or(0));
    if let Some(plain) = plain_len(stored) {
        assert_eq!(sealed_len(plain), stored, "sealed lengths do not invert");
    }
    let _ = split_segments(buf);
    if let [a, b, ..] = buf {
        let start = u64::from(*a) * 977;
        let range = start..start + u64::from(*b) * 131;
        let (first, fetch) = segments_for(&range);
        assert!(
            first * 4096 <= range.start && fetch.start < fetch.end,
            "{range:?}"
        );
    }
}

fn fix_supers(which: u8, buf: &mut [u8]) {
    let len = buf.len();
    match which % 10 {
        // The cache superblock's CRC covers 88 bytes in version 1, 104 in 2, 112 after.
        0 => {
            let checked = match buf.get(8..10) {
                Some([1, 0]) => 88,
                Some([2, 0]) => 104,
                _ => 112,
            };
            fix::crc_at(buf, 12, checked)
        }
        9 => fix::crc_at(buf, 12, len.min(16)),
        // The others, the chain drive record included: CRC at 12 over the whole record.
        _ => fix::crc_at(buf, 12, len),
    }
}

fn generate_supers(which: u8, b: &mut Bytes<'_>) {
    let mut buf = match which % 10 {
        0 => {
            let s = CacheSuper {
                clean: b.bool(),
                volume: volume(b),
                generation: b.u64(),
                file_bytes: b.u64(),
                log_start: b.u64(),
                log_end: b.u64(),
                tail_offset: b.u64(),
                tail_seq: b.u64(),
                index_epoch: b.u64(),
                claimed_epoch: b.u64(),
                claimed_session: b.u64(),
                local_key_id: b.bool().then(|| b.u64().to_le_bytes()),
            };
            let buf = encode_cache_super(&s);
            let in_bounds = s.log_start <= s.tail_offset
                && s.tail_offset < s.log_end
                && s.log_end <= s.file_bytes;
            let got = decode_cache_super(&buf);
            if in_bounds {
                assert_eq!(got, Ok(s), "cache superblock round trip");
            } else {
                assert!(got.is_err(), "out-of-bounds cache superblock accepted");
                return;
            }
            buf
        }
        1 => {
            // NO_CHECKPOINT (u64::MAX) is how "none" is stored, so it is no checkpoint.
            let checkpoint = |b: &mut Bytes<'_>| {
                let v = b.u64();
                (b.bool() && v != NO_CHECKPOINT).then_some(v)
            };
            let s = VolumeSuper {
                volume: volume(b),
                generation: b.u64(),
                session: b.u64(),
                clean: b.bool(),
                deleting: b.bool(),
                newest_checkpoint: checkpoint(b),
                previous_checkpoint: checkpoint(b),
                durable_through: b.u64(),
                last_record_seq: b.u64(),
                written_unix_ms: b.u64(),
                lease_timeout_ms: b.u32(),
                holder: (0..b.below(40))
                    .map(|_| char::from(b"host-a pid 42()"[b.below(15) as usize]))
                    .collect(),
                history: history(b),
                epoch: 0,
            };
            let s = VolumeSuper {
                epoch: s.history.newest_epoch() + b.u64() % 4,
                ..s
            };
            let buf = encode_volume_super(&s);
            assert_eq!(
                decode_volume_super(&buf),
                Ok(s),
                "volume superblock round trip"
            );
            buf
        }
        4 => {
            let name = |b: &mut Bytes<'_>| -> String {
                let len = 1 + b.below(64) as usize;
                (0..len)
                    .map(|_| char::from(b"abcXYZ019._-"[b.below(12) as usize]))
                    .collect()
            };
            let l = CloneLink {
                parent: name(b),
                parent_volume: volume(b),
                snapshot: name(b),
                clone: name(b),
                clone_volume: volume(b),
                through_seq: b.u64(),
                created_unix_ms: b.u64(),
            };
            let buf = encode_clone_link(&l).expect("valid names encode");
            assert_eq!(decode_clone_link(&buf), Ok(l), "clone link round trip");
            buf
        }
        5 => {
            let raw = b.vec(300);
            let text = String::from_utf8_lossy(&raw);
            let target = match cut_peer(&text) {
                t if t.is_empty() => "x".to_string(),
                t => t,
            };
            let updated_unix_ms = b.u64();
            let r = ReplicaStatus {
                volume: volume(b),
                updated_unix_ms,
                current_as_of_unix_ms: b.u64().min(updated_unix_ms),
                lag_objects: b.u64(),
                replica_next_seq: b.u64(),
                source_next_seq: b.u64(),
                bytes_copied: b.u64(),
                generation: {
                    let g = b.u64();
                    (b.bool() && g != u64::MAX).then_some(g)
                },
                peer: target,
                pass: b.bool().then(|| PassInProgress {
                    started_unix_ms: b.u64().max(1),
                    checkpoint: b.bool().then(|| (b.u64().min(u64::MAX - 1), b.u64())),
                    through_seq: b.u64(),
                }),
            };
            let buf = encode_replica_status(&r).expect("a cut target encodes");
            assert_eq!(
                decode_replica_status(&buf),
                Ok(r),
                "replica status round trip"
            );
            buf
        }
        6 => {
            // Any valid record: 1..=64 drives, position and tail below the count.
            let drive_count = 1 + b.below(MAX_DRIVES as u32) as u16;
            let r = DriveRecord {
                chain_id: volume(b).0,
                generation: b.u64(),
                layout: if b.bool() {
                    Layout::Chain
                } else {
                    Layout::Stripe
                },
                drive_count,
                drive_index: b.below(u32::from(drive_count)) as u16,
                tail_index: b.below(u32::from(drive_count)) as u16,
                copies: 1 + u8::from(b.bool()),
                mirror_stale: b.bool(),
            };
            let buf = encode_drive_record(&r);
            assert_eq!(
                decode_drive_record(&buf),
                Ok(r),
                "chain drive record round trip"
            );
            buf
        }
        3 => {
            let len = 1 + b.below(64) as usize;
            let name: String = (0..len)
                .map(|_| char::from(b"abcXYZ019._-"[b.below(12) as usize]))
                .collect();
            let through_seq = b.u64();
            let base = b.u64();
            let r = SnapshotRecord {
                volume: volume(b),
                name,
                base_checkpoint: (b.bool() && base < through_seq).then_some(base),
                through_seq,
                last_record_seq: b.u64(),
                created_unix_ms: b.u64(),
                history: history(b),
            };
            let buf = encode_snapshot(&r).expect("a valid name encodes");
            assert_eq!(decode_snapshot(&buf), Ok(r), "snapshot record round trip");
            buf
        }
        8 => {
            let k = VolumeKeys {
                cipher: CIPHER_AES256_GCM,
                key_id: b.array(),
                nonce: b.array(),
                wrapped_key: b.array(),
            };
            let buf = encode_volume_keys(&k);
            assert_eq!(
                decode_volume_keys(&buf),
                Ok(k),
                "volume key record round trip"
            );
            buf
        }
        9 => encode_sealed_header(),
        7 => {
            let compression = match b.below(3) {
                0 => Compression::None,
                1 => Compression::Lz4,
                _ => Compression::Zstd(1 + b.below(19) as i32),
            };
            let settings = VolumeSettings {
                volume: volume(b),
                compression,
                changed_unix_ms: b.u64(),
            };
            let buf = encode_volume_settings(&settings);
            assert_eq!(
                decode_volume_settings(&buf),
                Ok(settings),
                "volume settings round trip"
            );
            buf
        }
        _ => {
            let raw = b.vec(300);
            let name = String::from_utf8_lossy(&raw);
            let mut end = name.len().min(255);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            let m = VolumeMeta {
                volume: volume(b),
                size_bytes: b.u64(),
                created_unix_secs: b.u64(),
                name: name[..end].to_owned(),
                encrypted: b.u8() & 1 == 1,
            };
            let buf = encode_volume_meta(&m);
            assert_eq!(
                decode_volume_meta(&buf).as_ref(),
                Ok(&m),
                "volume metadata round trip"
            );
            buf
        }
    };
    let within = if which.is_multiple_of(10) {
        88
    } else {
        buf.len()
    };
    if let Some(at) = corrupt(b, &mut buf, within) {
        let rejected = match which % 10 {
            0 => decode_cache_super(&buf).is_err(),
            1 => decode_volume_super(&buf).is_err(),
            2 => decode_volume_meta(&buf).is_err(),
            4 => decode_clone_link(&buf).is_err(),
            5 => decode_replica_status(&buf).is_err(),
            6 => decode_drive_record(&buf).is_err(),
            7 => decode_volume_settings(&buf).is_err(),
            8 => decode_volume_keys(&buf).is_err(),
            9 => decode_sealed_header(&buf).is_err(),
            _ => decode_snapshot(&buf).is_err(),
        };
        assert!(rejected, "corrupt byte {at} unnoticed");
    }
}

/// Target `format_supers`: cache superblock, volume superblock, volume metadata,
/// snapshot record, clone link, replica status, chain drive record, volume settings,
/// volume key record, sealed-object envelope. The second byte picks which (modulo 10,
/// in that order).
pub fn supers(data: &[u8]) {
    let (generate, rest) = split_mode(data);
    let (which, rest) = match rest.split_first() {
        Some((&w, rest)) => (w, rest),
        None => return,
    };
    if generate {
        return generate_supers(which, &mut Bytes::new(rest));
    }
    check_supers_bytes(which, rest);
    let mut fixed = rest.to_vec();
    fix_supers(which, &mut fixed);
    check_supers_bytes(which, &fixed);
}

/// A valid history table (`lsvd_core::history`): a few claims, each past the last.
fn history(b: &mut Bytes<'_>) -> lsvd_core::history::History {
    let mut h = lsvd_core::history::History::legacy();
    let mut first = 1 + b.u64() % 1000;
    let mut epoch = 0;
    for _ in 0..b.below(5) {
        epoch += 1 + b.u64() % 3;
        let after = first + b.u64() % 50;
        first = after + 1 + b.u64() % 10;
        h.claim(epoch, after, first);
    }
    if b.bool() {
        let from = b.u64() % (first + 1);
        h.prune(from);
    }
    h
}
