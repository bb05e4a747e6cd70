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
//!      8    2 version (3; versions 1 and 2 are still read)
//!     10    2 flags: bit 0 = volume closed cleanly
//!     12    4 payload crc32c (this field zero)
//!     16    8 volume size in bytes
//!     24    8 next object sequence number (= this checkpoint's own seq)
//!     32    8 last write-log record sequence number covered
//!     40    8 object count
//!     48    8 extent count
//!     56   32 lifetime counters: client bytes written, store bytes written,
//!               GC passes, GC bytes moved (u64 each)
//!     88   16 (version 2) lifetime counters: GC bytes moved as hot, as cold
//!    104    8 (version 2) heat section length in bytes (0: none)
//!    112 40*n objects: seq u64, kind u16, reserved u16, header_bytes u32,
//!                      total_bytes u64, live_bytes u64, epoch u64 (version 3;
//!                      versions 1 and 2: 32 bytes, without the epoch)
//!      . 32*m extents: lba u64, sectors u64, object seq u64, byte offset u64
//!      . heat section (version 2, when its length is not 0):
//!           0  8 bytes written since the last decay
//!           8  8 decays so far
//!          16  1 log2 of the region size in bytes (9..=62)
//!          17  3 reserved (0)
//!          20  4 region count r
//!          24  . r counters in tokens: a counter c > 0 as unsigned LEB128
//!                (1-5 bytes, c < 2^32); a run of n zero counters (regions never
//!                written) as a 0 byte then n in LEB128 (1-4 bytes, n >= 1)
//! ```
//!
//! Version 1 is the same without the fields marked version 2 (its header is 88
//! bytes); it decodes with those counters zero and no heat section. Versions 1 and 2
//! list objects without their epoch (32 bytes each): they decode with epoch 0, the
//! epoch of every object written before epochs.
//!
//! The heat section carries the `hylog` GC policy's write-frequency tracker
//! ([`crate::heat`]) so a restart does not forget which data is hot. Counters are
//! small after decay, so LEB128 keeps a 4 GiB volume's 2^20 counters near 1 MiB
//! instead of 4 MiB, and runs of never-written regions take 2-5 bytes each: the
//! section's size follows the data written, not the volume's size.

use super::{FormatError, Reader, Writer, check_crc, invalid};

pub const CHECKPOINT_MAGIC: &[u8; 8] = b"LSVDCKP\0";
pub const CHECKPOINT_VERSION: u16 = 3;
const CRC_AT: usize = 12;
const HEADER_BYTES_V1: usize = 88;
const HEADER_BYTES: usize = 112;
/// The heat section's fixed part, before the counters.
const HEAT_HEAD_BYTES: usize = 24;
/// Region sizes a heat section may name: a sector up to 2^62 bytes.
const HEAT_REGION_SHIFTS: std::ops::RangeInclusive<u8> = 9..=62;
/// Most regions a heat section may describe (64 MiB of counters decoded; the tracker
/// itself keeps at most 2^20 by default).
pub const MAX_HEAT_REGIONS: usize = 1 << 24;
pub const FLAG_CLEAN: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointObject {
    pub seq: u64,
    /// 1 data, 2 gc (same codes as object kinds).
    pub kind: u16,
    pub header_bytes: u32,
    pub total_bytes: u64,
    pub live_bytes: u64,
    /// The claim the object was written under (its name carries it; 0 before epochs).
    pub epoch: u64,
}

/// Bytes of one object entry in version 3; 32 in versions 1 and 2.
const OBJECT_ENTRY_BYTES: u64 = 40;

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
    /// Of `gc_moved_bytes`, what the `hylog` policy moved as hot, and as cold
    /// (version 2; other policies leave both 0).
    pub gc_hot_moved_bytes: u64,
    pub gc_cold_moved_bytes: u64,
}

/// The `hylog` write-frequency tracker's state ([`crate::heat::HeatTracker`]), as
/// persisted; the tracker validates it against the volume when restoring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointHeat {
    pub since_decay_bytes: u64,
    pub decays: u64,
    /// log2 of the region size in bytes.
    pub region_shift: u8,
    /// Decayed count per region, region 0 first.
    pub counts: Vec<u32>,
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
    /// The write-frequency tracker, when the volume's GC policy keeps one.
    pub heat: Option<CheckpointHeat>,
}

fn leb128_bytes(v: u64) -> u64 {
    u64::from((64 - v.leading_zeros()).max(1).div_ceil(7))
}

fn put_leb128(w: &mut Writer, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            w.bytes(&[byte]);
            return;
        }
        w.bytes(&[byte | 0x80]);
    }
}

/// One LEB128 number of at most `max_bytes` bytes; `what` names it in errors.
fn get_leb128(r: &mut Reader<'_>, max_bytes: u32, what: &str) -> Result<u64, FormatError> {
    let mut v: u64 = 0;
    for i in 0..max_bytes {
        let [byte] = r.array::<1>()?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(invalid(
        "checkpoint heat section",
        format!("{what} is longer than {max_bytes} bytes"),
    ))
}

/// The counters as tokens: a run of zeros (regions never written) is one token.
fn heat_tokens(counts: &[u32]) -> impl Iterator<Item = HeatToken> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let &c = counts.get(i)?;
        if c != 0 {
            i += 1;
            return Some(HeatToken::Count(c));
        }
        let run = counts[i..].iter().take_while(|&&c| c == 0).count();
        i += run;
        Some(HeatToken::Zeros(run as u64))
    })
}

enum HeatToken {
    Count(u32),
    Zeros(u64),
}

/// Bytes of a heat section holding `counts` (what `encode_checkpoint` adds for it).
pub fn heat_section_bytes(counts: &[u32]) -> u64 {
    HEAT_HEAD_BYTES as u64
        + heat_tokens(counts)
            .map(|t| match t {
                HeatToken::Count(c) => leb128_bytes(u64::from(c)),
                HeatToken::Zeros(n) => 1 + leb128_bytes(n),
            })
            .sum::<u64>()
}

fn encode_heat(h: &CheckpointHeat) -> Vec<u8> {
    let counts = &h.counts[..h.counts.len().min(MAX_HEAT_REGIONS)];
    let mut w = Writer::with_capacity(heat_section_bytes(counts) as usize);
    w.u64(h.since_decay_bytes);
    w.u64(h.decays);
    w.bytes(&[h.region_shift, 0, 0, 0]);
    w.u32(counts.len() as u32);
    for t in heat_tokens(counts) {
        match t {
            HeatToken::Count(c) => put_leb128(&mut w, u64::from(c)),
            HeatToken::Zeros(n) => {
                w.bytes(&[0]);
                put_leb128(&mut w, n);
            }
        }
    }
    w.buf
}

fn decode_heat(buf: &[u8]) -> Result<CheckpointHeat, FormatError> {
    const WHAT: &str = "checkpoint heat section";
    let mut r = Reader::new(buf, WHAT);
    let since_decay_bytes = r.u64()?;
    let decays = r.u64()?;
    let [region_shift, _, _, _] = r.array::<4>()?;
    if !HEAT_REGION_SHIFTS.contains(&region_shift) {
        return Err(invalid(
            WHAT,
            format!("region size 2^{region_shift} bytes is outside 2^9..2^62"),
        ));
    }
    let count = r.u32()? as usize;
    if count > MAX_HEAT_REGIONS {
        return Err(invalid(
            WHAT,
            format!("{count} regions, more than the {MAX_HEAT_REGIONS} a section may hold"),
        ));
    }
    let mut counts = Vec::with_capacity(count);
    while counts.len() < count {
        let i = counts.len();
        let v = get_leb128(&mut r, 5, &format!("counter {i}"))?;
        if v == 0 {
            let run = get_leb128(&mut r, 4, &format!("the zero run at region {i}"))?;
            if run == 0 || run > (count - i) as u64 {
                return Err(invalid(
                    WHAT,
                    format!("a run of {run} zeros at region {i} of {count} is empty or too long"),
                ));
            }
            counts.resize(i + run as usize, 0);
            continue;
        }
        let v = u32::try_from(v)
            .map_err(|_| invalid(WHAT, format!("counter {i} ({v}) exceeds 2^32 - 1")))?;
        counts.push(v);
    }
    if r.pos() != buf.len() {
        return Err(invalid(
            WHAT,
            format!("{} bytes after the last counter", buf.len() - r.pos()),
        ));
    }
    Ok(CheckpointHeat {
        since_decay_bytes,
        decays,
        region_shift,
        counts,
    })
}

pub fn encode_checkpoint(c: &Checkpoint) -> Vec<u8> {
    let heat = c.heat.as_ref().map(encode_heat).unwrap_or_default();
    let mut w = Writer::with_capacity(
        HEADER_BYTES + 40 * c.objects.len() + 32 * c.extents.len() + heat.len(),
    );
    w.head(
        CHECKPOINT_MAGIC,
        CHECKPOINT_VERSION,
        if c.clean { FLAG_CLEAN } else { 0 },
    );
    w.u64s(&[
        c.volume_size_bytes,
        c.next_object_seq,
        c.last_record_seq,
        c.objects.len() as u64,
        c.extents.len() as u64,
        c.counters.client_write_bytes,
        c.counters.store_write_bytes,
        c.counters.gc_passes,
        c.counters.gc_moved_bytes,
        c.counters.gc_hot_moved_bytes,
        c.counters.gc_cold_moved_bytes,
        heat.len() as u64,
    ]);
    for o in &c.objects {
        w.u64(o.seq);
        w.u16(o.kind);
        w.u16(0);
        w.u32(o.header_bytes);
        w.u64s(&[o.total_bytes, o.live_bytes, o.epoch]);
    }
    for e in &c.extents {
        w.u64s(&[e.lba, e.sectors, e.object_seq, e.object_offset]);
    }
    w.bytes(&heat);
    w.seal(CRC_AT)
}

pub fn decode_checkpoint(buf: &[u8]) -> Result<Checkpoint, FormatError> {
    const WHAT: &str = "checkpoint";
    let mut r = Reader::new(buf, WHAT);
    let version = r.magic(CHECKPOINT_MAGIC)?;
    let header_bytes = match version {
        1 => HEADER_BYTES_V1,
        2 | CHECKPOINT_VERSION => HEADER_BYTES,
        _ => {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                version,
            });
        }
    };
    let flags = r.u16()?;
    let stored = r.u32()?;
    let [
        volume_size_bytes,
        next_object_seq,
        last_record_seq,
        object_count,
        extent_count,
    ] = r.u64s()?;
    // The heat section's length sits after the counters (version 2).
    let heat_len = if version == 1 {
        0
    } else {
        let at = HEADER_BYTES - 8;
        buf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or(FormatError::Truncated {
                what: WHAT,
                need: HEADER_BYTES,
                have: buf.len(),
            })?
    };
    let object_bytes = if version == CHECKPOINT_VERSION {
        OBJECT_ENTRY_BYTES
    } else {
        32
    };
    let expected_len = object_count
        .checked_mul(object_bytes)
        .and_then(|o| extent_count.checked_mul(32).and_then(|e| o.checked_add(e)))
        .and_then(|n| n.checked_add(header_bytes as u64))
        .and_then(|n| n.checked_add(heat_len))
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
    check_crc(WHAT, buf, CRC_AT, stored)?;
    let counters = Counters {
        client_write_bytes: r.u64()?,
        store_write_bytes: r.u64()?,
        gc_passes: r.u64()?,
        gc_moved_bytes: r.u64()?,
        gc_hot_moved_bytes: if version == 1 { 0 } else { r.u64()? },
        gc_cold_moved_bytes: if version == 1 { 0 } else { r.u64()? },
    };
    if version != 1 {
        r.u64()?; // the heat section's length, read above
    }
    let mut objects = Vec::with_capacity(object_count as usize);
    for _ in 0..object_count {
        let seq = r.u64()?;
        let kind = r.u16()?;
        r.u16()?;
        let header_bytes = r.u32()?;
        let total_bytes = r.u64()?;
        let live_bytes = r.u64()?;
        let epoch = if version == CHECKPOINT_VERSION {
            r.u64()?
        } else {
            0
        };
        objects.push(CheckpointObject {
            seq,
            kind,
            header_bytes,
            total_bytes,
            live_bytes,
            epoch,
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
    let heat = if heat_len == 0 {
        None
    } else {
        let section = r.take(heat_len as usize)?;
        Some(decode_heat(section)?)
    };
    Ok(Checkpoint {
        clean: flags & FLAG_CLEAN != 0,
        counters,
        volume_size_bytes,
        next_object_seq,
        last_record_seq,
        objects,
        extents,
        heat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_corruption_refused, refit_crc};

    use crate::format::examples::{checkpoint as sample, checkpoint_with_heat as sample_with_heat};

    #[test]
    fn round_trip_and_golden_prefix() {
        let buf = encode_checkpoint(&sample());
        assert_eq!(buf.len(), 112 + 40 + 32);
        assert_eq!(&buf[..12], b"LSVDCKP\0\x03\x00\x01\x00");
        assert_eq!(&buf[144..152], &4u64.to_le_bytes(), "the object's epoch");
        assert_eq!(
            &buf[88..112],
            &[
                5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(decode_checkpoint(&buf).expect("decodes"), sample());
    }

    #[test]
    fn the_heat_section_round_trips_in_leb128() {
        let c = sample_with_heat();
        let buf = encode_checkpoint(&c);
        // A run of one zero takes two bytes, counters 1 and 127 a byte each, 128 and
        // 300 two, 2^32-1 five.
        let section = 24 + 2 + 2 + 2 + 2 + 5;
        let counts = &c.heat.as_ref().expect("has heat").counts;
        assert_eq!(heat_section_bytes(counts), section as u64);
        assert_eq!(buf.len(), 112 + 72 + section);
        assert_eq!(&buf[104..112], &(section as u64).to_le_bytes());
        assert_eq!(
            &buf[buf.len() - 13..],
            &[
                0, 1, 1, 0x7f, 0x80, 0x01, 0xac, 0x02, 0xff, 0xff, 0xff, 0xff, 0x0f
            ]
        );
        assert_eq!(decode_checkpoint(&buf).expect("decodes"), c);
    }

    #[test]
    fn never_written_regions_cost_a_few_bytes_per_run() {
        // A 4 GiB volume with two regions written, at both ends: 2^20 counters.
        let mut counts = vec![0u32; 1 << 20];
        counts[0] = 3;
        counts[(1 << 20) - 1] = 9;
        let c = Checkpoint {
            heat: Some(CheckpointHeat {
                since_decay_bytes: 0,
                decays: 0,
                region_shift: 12,
                counts,
            }),
            ..sample()
        };
        let buf = encode_checkpoint(&c);
        // 3, then 2^20 - 2 zeros (a 0 byte and 3 bytes of LEB128), then 9.
        assert_eq!(buf.len(), 112 + 72 + 24 + 1 + 4 + 1);
        assert_eq!(decode_checkpoint(&buf).expect("decodes"), c);
        let counts = &c.heat.as_ref().expect("heat").counts;
        assert_eq!(heat_section_bytes(counts), 24 + 1 + 4 + 1);
    }

    /// A version 2 payload (objects without epochs) as releases before epochs wrote
    /// it.
    fn version_2_bytes(c: &Checkpoint) -> Vec<u8> {
        let v3 = encode_checkpoint(c);
        let mut v2 = v3[..112].to_vec();
        v2[8] = 2;
        let objects_end = 112 + 40 * c.objects.len();
        for entry in v3[112..objects_end].chunks(40) {
            v2.extend_from_slice(&entry[..32]);
        }
        v2.extend_from_slice(&v3[objects_end..]);
        refit_crc(&mut v2, CRC_AT);
        v2
    }

    /// A version 1 payload (88-byte header, no heat) as earlier releases wrote it.
    fn version_1_bytes(c: &Checkpoint) -> Vec<u8> {
        let v2 = version_2_bytes(c);
        let mut v1 = v2[..88].to_vec();
        v1[8] = 1;
        v1.extend_from_slice(&v2[112..]);
        refit_crc(&mut v1, CRC_AT);
        v1
    }

    #[test]
    fn version_2_still_decodes_with_epoch_0() {
        for c in [sample(), sample_with_heat()] {
            let v2 = version_2_bytes(&c);
            let mut expected = c.clone();
            expected.objects[0].epoch = 0;
            assert_eq!(decode_checkpoint(&v2).expect("decodes"), expected);
        }
        assert_eq!(version_2_bytes(&sample()).len(), 112 + 64);
    }

    #[test]
    fn version_1_still_decodes_without_the_new_counters() {
        let v1 = version_1_bytes(&sample());
        assert_eq!(v1.len(), 88 + 64);
        let mut expected = sample();
        expected.counters.gc_hot_moved_bytes = 0;
        expected.counters.gc_cold_moved_bytes = 0;
        expected.objects[0].epoch = 0;
        assert_eq!(decode_checkpoint(&v1).expect("decodes"), expected);
        let mut v4 = encode_checkpoint(&sample());
        v4[8] = 4;
        assert!(matches!(
            decode_checkpoint(&v4),
            Err(FormatError::UnsupportedVersion { version: 4, .. })
        ));
    }

    #[test]
    fn every_flip_detected() {
        for c in [sample(), sample_with_heat()] {
            let buf = encode_checkpoint(&c);
            assert_corruption_refused(&buf, 4, decode_checkpoint);
        }
    }

    /// Re-encode `section` as the heat section of `sample()` with a valid CRC.
    fn with_heat_section(section: &[u8]) -> Vec<u8> {
        let mut buf = encode_checkpoint(&sample());
        buf[104..112].copy_from_slice(&(section.len() as u64).to_le_bytes());
        buf.extend_from_slice(section);
        refit_crc(&mut buf, CRC_AT);
        buf
    }

    #[test]
    fn malformed_heat_sections_are_rejected_with_a_reason() {
        let head = |shift: u8, count: u32| {
            let mut h = vec![0u8; 16];
            h.extend_from_slice(&[shift, 0, 0, 0]);
            h.extend_from_slice(&count.to_le_bytes());
            h
        };
        let good = [head(12, 1), vec![5]].concat();
        assert!(decode_checkpoint(&with_heat_section(&good)).is_ok());
        let cases: [(Vec<u8>, &str); 8] = [
            ([head(8, 1), vec![5]].concat(), "region size"),
            ([head(63, 1), vec![5]].concat(), "region size"),
            (
                [head(12, (1 << 24) + 1), vec![0, 0x80, 0x80, 0x80, 0x08]].concat(),
                "more than",
            ),
            (
                [head(12, 1), vec![0x80, 0x80, 0x80, 0x80, 0x80, 0]].concat(),
                "longer than 5",
            ),
            (
                [head(12, 1), vec![0xff, 0xff, 0xff, 0xff, 0x10]].concat(),
                "exceeds",
            ),
            ([head(12, 1), vec![5, 6]].concat(), "after the last"),
            ([head(12, 2), vec![0, 0]].concat(), "empty or too long"),
            ([head(12, 2), vec![0, 3]].concat(), "empty or too long"),
        ];
        for (section, why) in cases {
            let err = decode_checkpoint(&with_heat_section(&section)).expect_err(why);
            assert!(err.to_string().contains(why), "{err} should say {why}");
        }
        // Shorter than its fixed part; fewer counters than it says.
        assert!(decode_checkpoint(&with_heat_section(&[0u8; 10])).is_err());
        assert!(decode_checkpoint(&with_heat_section(&[head(12, 9), vec![5]].concat())).is_err());
        let ok = [head(12, 5), vec![0, 4, 7]].concat();
        let c = decode_checkpoint(&with_heat_section(&ok)).expect("a run then a counter");
        assert_eq!(c.heat.expect("heat").counts, vec![0, 0, 0, 0, 7]);
    }
}
