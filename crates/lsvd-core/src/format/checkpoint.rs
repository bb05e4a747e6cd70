//! Checkpoints: the volume's object map and object table at one point of its log.
//!
//! A checkpoint is stored as the data section of a checkpoint object (kind 3), so it
//! lives in the same sequence space as data and is protected by that object's chunk
//! checksums; the payload carries its own magic, version and CRC32C as well, so it can
//! be validated on its own. A checkpoint with sequence number `C` describes the state
//! after applying every object below `C`.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDCKP\0"
//!      8    2 version (1)
//!     10    2 flags: bit 0 = volume closed cleanly
//!     12    4 payload crc32c (this field zero)
//!     16    8 volume size in bytes
//!     24    8 next object sequence number (= this checkpoint's own seq)
//!     32    8 last write-log record sequence number covered
//!     40    8 object count
//!     48    8 extent count
//!     56   32 lifetime counters: client bytes written, store bytes written,
//!               GC passes, GC bytes moved (u64 each)
//!     88 32*n objects: seq u64, kind u16, reserved u16, header_bytes u32,
//!                      total_bytes u64, live_bytes u64
//!      . 32*m extents: lba u64, sectors u64, object seq u64, byte offset u64
//! ```

use super::{FormatError, Reader, Writer, crc_with_hole, expect_magic_version, invalid};

pub const CHECKPOINT_MAGIC: &[u8; 8] = b"LSVDCKP\0";
pub const CHECKPOINT_VERSION: u16 = 1;
const CRC_AT: usize = 12;
const HEADER_BYTES: usize = 88;
pub const FLAG_CLEAN: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointObject {
    pub seq: u64,
    /// 1 data, 2 gc (same codes as object kinds).
    pub kind: u16,
    pub header_bytes: u32,
    pub total_bytes: u64,
    pub live_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointExtent {
    pub lba: u64,
    pub sectors: u64,
    pub object_seq: u64,
    pub object_offset: u64,
}

/// Lifetime counters of a volume, carried from checkpoint to checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub client_write_bytes: u64,
    pub store_write_bytes: u64,
    pub gc_passes: u64,
    pub gc_moved_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub clean: bool,
    pub counters: Counters,
    pub volume_size_bytes: u64,
    pub next_object_seq: u64,
    pub last_record_seq: u64,
    pub objects: Vec<CheckpointObject>,
    pub extents: Vec<CheckpointExtent>,
}

pub fn encode_checkpoint(c: &Checkpoint) -> Vec<u8> {
    let mut w = Writer::with_capacity(HEADER_BYTES + 32 * (c.objects.len() + c.extents.len()));
    w.bytes(CHECKPOINT_MAGIC);
    w.u16(CHECKPOINT_VERSION);
    w.u16(if c.clean { FLAG_CLEAN } else { 0 });
    w.u32(0);
    w.u64(c.volume_size_bytes);
    w.u64(c.next_object_seq);
    w.u64(c.last_record_seq);
    w.u64(c.objects.len() as u64);
    w.u64(c.extents.len() as u64);
    w.u64(c.counters.client_write_bytes);
    w.u64(c.counters.store_write_bytes);
    w.u64(c.counters.gc_passes);
    w.u64(c.counters.gc_moved_bytes);
    for o in &c.objects {
        w.u64(o.seq);
        w.u16(o.kind);
        w.u16(0);
        w.u32(o.header_bytes);
        w.u64(o.total_bytes);
        w.u64(o.live_bytes);
    }
    for e in &c.extents {
        w.u64(e.lba);
        w.u64(e.sectors);
        w.u64(e.object_seq);
        w.u64(e.object_offset);
    }
    let crc = crc32c::crc32c(&w.buf);
    w.put_u32_at(CRC_AT, crc);
    w.buf
}

pub fn decode_checkpoint(buf: &[u8]) -> Result<Checkpoint, FormatError> {
    const WHAT: &str = "checkpoint";
    let mut r = Reader::new(buf, WHAT);
    expect_magic_version(&mut r, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, WHAT)?;
    let flags = r.u16()?;
    let stored = r.u32()?;
    let volume_size_bytes = r.u64()?;
    let next_object_seq = r.u64()?;
    let last_record_seq = r.u64()?;
    let object_count = r.u64()?;
    let extent_count = r.u64()?;
    let expected_len = object_count
        .checked_add(extent_count)
        .and_then(|n| n.checked_mul(32))
        .and_then(|n| n.checked_add(HEADER_BYTES as u64))
        .ok_or_else(|| invalid(WHAT, "counts overflow"))?;
    if expected_len != buf.len() as u64 {
        return Err(invalid(
            WHAT,
            format!(
                "length {} does not match counts ({expected_len})",
                buf.len()
            ),
        ));
    }
    let computed = crc_with_hole(buf, CRC_AT);
    if computed != stored {
        return Err(FormatError::BadChecksum {
            what: WHAT,
            stored,
            computed,
        });
    }
    let counters = Counters {
        client_write_bytes: r.u64()?,
        store_write_bytes: r.u64()?,
        gc_passes: r.u64()?,
        gc_moved_bytes: r.u64()?,
    };
    let mut objects = Vec::with_capacity(object_count as usize);
    for _ in 0..object_count {
        let seq = r.u64()?;
        let kind = r.u16()?;
        r.u16()?;
        let header_bytes = r.u32()?;
        let total_bytes = r.u64()?;
        let live_bytes = r.u64()?;
        objects.push(CheckpointObject {
            seq,
            kind,
            header_bytes,
            total_bytes,
            live_bytes,
        });
    }
    let mut extents = Vec::with_capacity(extent_count as usize);
    for _ in 0..extent_count {
        extents.push(CheckpointExtent {
            lba: r.u64()?,
            sectors: r.u64()?,
            object_seq: r.u64()?,
            object_offset: r.u64()?,
        });
    }
    Ok(Checkpoint {
        clean: flags & FLAG_CLEAN != 0,
        counters,
        volume_size_bytes,
        next_object_seq,
        last_record_seq,
        objects,
        extents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            clean: true,
            counters: Counters {
                client_write_bytes: 1,
                store_write_bytes: 2,
                gc_passes: 3,
                gc_moved_bytes: 4,
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
            }],
            extents: vec![CheckpointExtent {
                lba: 8,
                sectors: 8,
                object_seq: 3,
                object_offset: 200,
            }],
        }
    }

    #[test]
    fn round_trip_and_golden_prefix() {
        let buf = encode_checkpoint(&sample());
        assert_eq!(buf.len(), 88 + 64);
        assert_eq!(&buf[..12], b"LSVDCKP\0\x01\x00\x01\x00");
        assert_eq!(decode_checkpoint(&buf).expect("decodes"), sample());
    }

    #[test]
    fn every_flip_detected() {
        let buf = encode_checkpoint(&sample());
        for pos in 0..buf.len() {
            let mut bad = buf.clone();
            bad[pos] ^= 4;
            assert!(decode_checkpoint(&bad).is_err(), "flip at {pos}");
        }
        assert!(decode_checkpoint(&buf[..buf.len() - 1]).is_err());
    }
}
