//! The volume superblock: a small object in the store, one per generation, that
//! names the newest checkpoints, says who holds the volume, and fences out a second
//! writer.
//!
//! The store offers put-if-absent but no compare-and-swap, so the superblock is never
//! overwritten: generation `g` lives at its own key (`<volume>/super/<g:016x>`) and is
//! written with put-if-absent. Whoever writes generation `g + 1` first owns the volume;
//! a process that finds its next generation already taken has been superseded and must
//! stop writing. The newest generation that exists is the current one. The holder
//! writes a new generation at least every third of its lease timeout: that is its
//! lease, renewed (docs/format/volume-superblock.md).
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDVSB\0"
//!      8    2 version (2; version 1, 96 bytes, is still read)
//!     10    2 flags: bit 0 = written at clean shutdown (the holder let go),
//!                    bit 1 = written by `lsvd delete`
//!     12    4 crc32c over the whole record (this field zero)
//!     16   16 volume id
//!     32    8 generation
//!     40    8 session id (random per open of the volume)
//!     48    8 newest checkpoint's sequence number (NONE = u64::MAX)
//!     56    8 previous checkpoint's sequence number (NONE = u64::MAX)
//!     64    8 durable_through: every object with a smaller sequence number that
//!             recovery needs was durable in the store when this was written
//!     72    8 newest write-log record sequence number held by the store
//!     80    8 written at, milliseconds since the Unix epoch
//!  version 2:
//!     88    8 epoch: the claim this generation belongs to (its objects' names carry it)
//!     96    4 lease timeout in milliseconds (0: the holder keeps no lease)
//!    100    2 holder description length h (at most 256)
//!    102    2 history segment count n
//!    104    8 history from_seq (numbers below it are described by the checkpoint)
//!    112 24*n history segments: first_seq u64, epoch u64, after_seq u64
//!      .    h holder description, UTF-8 (host, process, address; for messages)
//! ```
//!
//! Version 1 (88 bytes as above and 8 reserved) decodes with epoch 0, no lease, no
//! holder and no segments: a volume written before epochs.

use super::{FormatError, VolumeId, Writer, invalid, open_two_version_record};
use crate::history::{History, MAX_SEGMENTS, Segment};

pub const VOLUME_SUPER_MAGIC: &[u8; 8] = b"LSVDVSB\0";
pub const VOLUME_SUPER_VERSION: u16 = 2;
/// Size of a version 1 superblock (every one is this size).
pub const VOLUME_SUPER_BYTES_V1: usize = 96;
/// Size of a version 2 superblock without segments or holder description.
pub const VOLUME_SUPER_FIXED_BYTES: usize = 112;
/// Longest holder description.
pub const MAX_HOLDER_BYTES: usize = 256;
/// "No checkpoint" in the checkpoint fields.
pub const NO_CHECKPOINT: u64 = u64::MAX;
const CRC_AT: usize = 12;
const FLAG_CLEAN: u16 = 1;
const FLAG_DELETING: u16 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeSuper {
    pub volume: VolumeId,
    pub generation: u64,
    pub session: u64,
    /// Written by a clean shutdown: the holder has let the volume go.
    pub clean: bool,
    /// Written by `lsvd delete` before it deletes anything: the volume is going away,
    /// and no process may open it (an interrupted delete is finished by running it
    /// again).
    pub deleting: bool,
    pub newest_checkpoint: Option<u64>,
    pub previous_checkpoint: Option<u64>,
    pub durable_through: u64,
    pub last_record_seq: u64,
    pub written_unix_ms: u64,
    /// The claim this generation belongs to (0: written before epochs).
    pub epoch: u64,
    /// How long the holder may go without writing a generation before another
    /// process may take the volume over (0: it keeps no lease).
    pub lease_timeout_ms: u32,
    /// Who holds the volume, for messages (host, process, listen address).
    pub holder: String,
    /// Which epoch wrote which part of the object history, from the previous
    /// checkpoint on.
    pub history: History,
}

impl VolumeSuper {
    /// Bytes the encoded record takes.
    pub fn encoded_bytes(&self) -> usize {
        VOLUME_SUPER_FIXED_BYTES + 24 * self.history.segments.len() + self.holder_bytes().len()
    }

    fn holder_bytes(&self) -> &[u8] {
        let b = self.holder.as_bytes();
        let mut n = b.len().min(MAX_HOLDER_BYTES);
        while !self.holder.is_char_boundary(n) {
            n -= 1;
        }
        &b[..n]
    }
}

pub fn encode_volume_super(s: &VolumeSuper) -> Vec<u8> {
    let segments = &s.history.segments[..s.history.segments.len().min(MAX_SEGMENTS)];
    let holder = s.holder_bytes();
    let mut w = Writer::with_capacity(s.encoded_bytes());
    let flags = if s.clean { FLAG_CLEAN } else { 0 } | if s.deleting { FLAG_DELETING } else { 0 };
    w.head(VOLUME_SUPER_MAGIC, VOLUME_SUPER_VERSION, flags);
    w.bytes(&s.volume.0);
    w.u64s(&[
        s.generation,
        s.session,
        s.newest_checkpoint.unwrap_or(NO_CHECKPOINT),
        s.previous_checkpoint.unwrap_or(NO_CHECKPOINT),
        s.durable_through,
        s.last_record_seq,
        s.written_unix_ms,
        s.epoch,
    ]);
    w.u32(s.lease_timeout_ms);
    w.u16(holder.len() as u16);
    w.u16(segments.len() as u16);
    w.u64(s.history.from_seq);
    for seg in segments {
        w.u64s(&[seg.first_seq, seg.epoch, seg.after_seq]);
    }
    w.bytes(holder);
    w.seal(CRC_AT)
}

pub fn decode_volume_super(buf: &[u8]) -> Result<VolumeSuper, FormatError> {
    const WHAT: &str = "volume superblock";
    let (mut r, version, flags) = open_two_version_record(
        buf,
        WHAT,
        VOLUME_SUPER_MAGIC,
        VOLUME_SUPER_VERSION,
        (VOLUME_SUPER_BYTES_V1, VOLUME_SUPER_FIXED_BYTES),
        FLAG_CLEAN | FLAG_DELETING,
    )?;
    let volume = VolumeId(r.array()?);
    let generation = r.u64()?;
    let session = r.u64()?;
    let opt = |v: u64| (v != NO_CHECKPOINT).then_some(v);
    let newest_checkpoint = opt(r.u64()?);
    let previous_checkpoint = opt(r.u64()?);
    let [durable_through, last_record_seq, written_unix_ms] = r.u64s()?;
    let mut sb = VolumeSuper {
        volume,
        generation,
        session,
        clean: flags & FLAG_CLEAN != 0,
        deleting: flags & FLAG_DELETING != 0,
        newest_checkpoint,
        previous_checkpoint,
        durable_through,
        last_record_seq,
        written_unix_ms,
        ..Default::default()
    };
    if version == 1 {
        if r.u64()? != 0 {
            return Err(invalid(WHAT, "reserved field at 88 is not zero"));
        }
        return Ok(sb);
    }
    sb.epoch = r.u64()?;
    sb.lease_timeout_ms = r.u32()?;
    let holder_len = r.u16()? as usize;
    let segment_count = r.u16()? as usize;
    sb.history.from_seq = r.u64()?;
    if holder_len > MAX_HOLDER_BYTES || segment_count > MAX_SEGMENTS {
        return Err(invalid(
            WHAT,
            format!("{segment_count} segments and a holder of {holder_len} bytes"),
        ));
    }
    let expected = VOLUME_SUPER_FIXED_BYTES + 24 * segment_count + holder_len;
    if buf.len() != expected {
        return Err(invalid(
            WHAT,
            format!("{} bytes, its counts say {expected}", buf.len()),
        ));
    }
    for _ in 0..segment_count {
        sb.history.segments.push(Segment {
            first_seq: r.u64()?,
            epoch: r.u64()?,
            after_seq: r.u64()?,
        });
    }
    sb.history
        .validate()
        .map_err(|e| invalid(WHAT, format!("history: {e}")))?;
    if sb.history.newest_epoch() > sb.epoch {
        return Err(invalid(
            WHAT,
            format!(
                "its history names epoch {} past its own epoch {}",
                sb.history.newest_epoch(),
                sb.epoch
            ),
        ));
    }
    sb.holder = std::str::from_utf8(r.take(holder_len)?)
        .map_err(|_| invalid(WHAT, "the holder description is not UTF-8"))?
        .to_string();
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{
        assert_corruption_refused, assert_each_flip_refused, refit_crc, stored_crc,
    };

    fn sample() -> VolumeSuper {
        VolumeSuper {
            volume: VolumeId([3; 16]),
            generation: 5,
            session: 0x1122_3344_5566_7788,
            clean: true,
            deleting: false,
            newest_checkpoint: Some(0x40),
            previous_checkpoint: None,
            durable_through: 0x41,
            last_record_seq: 900,
            written_unix_ms: 1_800_000_000_000,
            epoch: 3,
            lease_timeout_ms: 10_000,
            holder: "host-a pid 42".to_string(),
            history: History {
                from_seq: 0x30,
                segments: vec![
                    Segment {
                        first_seq: 0x20,
                        epoch: 2,
                        after_seq: 0x1f,
                    },
                    Segment {
                        first_seq: 0x3a,
                        epoch: 3,
                        after_seq: 0x38,
                    },
                ],
            },
        }
    }

    /// The version 1 record earlier builds wrote (96 bytes, no epoch).
    fn version_1(s: &VolumeSuper) -> Vec<u8> {
        let mut buf = encode_volume_super(s)[..VOLUME_SUPER_BYTES_V1].to_vec();
        buf[8] = 1;
        buf[88..96].fill(0);
        refit_crc(&mut buf, CRC_AT);
        buf
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_volume_super(&sample());
        assert_eq!(buf.len(), 112 + 48 + 13);
        assert_eq!(buf.len(), sample().encoded_bytes());
        assert_eq!(&buf[..8], VOLUME_SUPER_MAGIC);
        assert_eq!(&buf[8..12], &[2, 0, 1, 0]);
        assert_eq!(&buf[32..40], &5u64.to_le_bytes());
        assert_eq!(&buf[48..56], &0x40u64.to_le_bytes());
        assert_eq!(&buf[56..64], &u64::MAX.to_le_bytes());
        assert_eq!(&buf[88..96], &3u64.to_le_bytes());
        assert_eq!(&buf[96..100], &10_000u32.to_le_bytes());
        assert_eq!(&buf[100..104], &[13, 0, 2, 0]);
        assert_eq!(&buf[104..112], &0x30u64.to_le_bytes());
        assert_eq!(&buf[136..144], &0x3au64.to_le_bytes());
        assert_eq!(&buf[160..], b"host-a pid 42");
        assert_eq!(stored_crc(&buf, CRC_AT), GOLDEN_CRC);
        assert_eq!(decode_volume_super(&buf).expect("decodes"), sample());
        assert_corruption_refused(&buf, 0x04, decode_volume_super);
        assert!(decode_volume_super(&buf[..95]).is_err());
    }
    const GOLDEN_CRC: u32 = 0x0035_6eee;

    #[test]
    fn version_1_still_reads_as_a_volume_before_epochs() {
        let v1 = version_1(&sample());
        assert_eq!(v1.len(), 96);
        let sb = decode_volume_super(&v1).expect("decodes");
        assert_eq!(
            sb,
            VolumeSuper {
                epoch: 0,
                lease_timeout_ms: 0,
                holder: String::new(),
                history: History::legacy(),
                ..sample()
            }
        );
        assert_each_flip_refused(&v1, 0..v1.len(), 0x04, decode_volume_super);
        let mut longer = v1.clone();
        longer.push(0);
        assert!(decode_volume_super(&longer).is_err());
    }

    #[test]
    fn the_deleting_flag_round_trips_and_other_flags_are_refused() {
        let s = VolumeSuper {
            clean: false,
            deleting: true,
            ..sample()
        };
        let buf = encode_volume_super(&s);
        assert_eq!(&buf[10..12], &[2, 0]);
        assert_eq!(decode_volume_super(&buf).expect("decodes"), s);
        let mut unknown = buf.clone();
        unknown[10] = 4;
        let crc = crate::format::crc_with_hole(&unknown, CRC_AT);
        unknown[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        let e = decode_volume_super(&unknown).expect_err("unknown flag bit 2");
        assert!(e.to_string().contains("unknown flags"), "{e}");
    }

    #[test]
    fn a_history_past_its_own_epoch_or_out_of_order_is_refused() {
        for history in [
            History {
                from_seq: 0,
                segments: vec![Segment {
                    first_seq: 5,
                    epoch: 4,
                    after_seq: 4,
                }],
            },
            History {
                from_seq: 0,
                segments: vec![
                    Segment {
                        first_seq: 5,
                        epoch: 2,
                        after_seq: 4,
                    },
                    Segment {
                        first_seq: 4,
                        epoch: 3,
                        after_seq: 3,
                    },
                ],
            },
        ] {
            let buf = encode_volume_super(&VolumeSuper {
                history,
                ..sample()
            });
            assert!(decode_volume_super(&buf).is_err());
        }
    }

    #[test]
    fn a_long_holder_is_cut_at_a_character_boundary() {
        let s = VolumeSuper {
            holder: "é".repeat(200),
            ..sample()
        };
        let back = decode_volume_super(&encode_volume_super(&s)).expect("decodes");
        assert_eq!(back.holder, "é".repeat(128));
    }
}
