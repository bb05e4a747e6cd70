//! The volume superblock: a small object in the store, one per generation, that
//! names the newest checkpoints and fences out a second writer.
//!
//! The store offers put-if-absent but no compare-and-swap, so the superblock is never
//! overwritten: generation `g` lives at its own key (`<volume>/super/<g:016x>`) and is
//! written with put-if-absent. Whoever writes generation `g + 1` first owns the volume;
//! a process that finds its next generation already taken has been superseded and must
//! stop writing. The newest generation that exists is the current one.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDVSB\0"
//!      8    2 version (1)
//!     10    2 flags: bit 0 = written at clean shutdown, bit 1 = written by `lsvd delete`
//!     12    4 crc32c over bytes 0..96 (this field zero)
//!     16   16 volume id
//!     32    8 generation
//!     40    8 session id (random per open of the volume)
//!     48    8 newest checkpoint's sequence number (NONE = u64::MAX)
//!     56    8 previous checkpoint's sequence number (NONE = u64::MAX)
//!     64    8 durable_through: every object with a smaller sequence number that
//!             recovery needs was durable in the store when this was written
//!     72    8 newest write-log record sequence number held by the store
//!     80    8 written at, milliseconds since the Unix epoch
//!     88    8 reserved (0)
//! ```

use super::{FormatError, VolumeId, Writer, open_fixed_record};

pub const VOLUME_SUPER_MAGIC: &[u8; 8] = b"LSVDVSB\0";
pub const VOLUME_SUPER_VERSION: u16 = 1;
pub const VOLUME_SUPER_BYTES: usize = 96;
/// "No checkpoint" in the checkpoint fields.
pub const NO_CHECKPOINT: u64 = u64::MAX;
const CRC_AT: usize = 12;
const FLAG_CLEAN: u16 = 1;
const FLAG_DELETING: u16 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSuper {
    pub volume: VolumeId,
    pub generation: u64,
    pub session: u64,
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
}

pub fn encode_volume_super(s: &VolumeSuper) -> Vec<u8> {
    let mut w = Writer::with_capacity(VOLUME_SUPER_BYTES);
    w.bytes(VOLUME_SUPER_MAGIC);
    w.u16(VOLUME_SUPER_VERSION);
    let flags = if s.clean { FLAG_CLEAN } else { 0 } | if s.deleting { FLAG_DELETING } else { 0 };
    w.u16(flags);
    w.u32(0);
    w.bytes(&s.volume.0);
    w.u64(s.generation);
    w.u64(s.session);
    w.u64(s.newest_checkpoint.unwrap_or(NO_CHECKPOINT));
    w.u64(s.previous_checkpoint.unwrap_or(NO_CHECKPOINT));
    w.u64(s.durable_through);
    w.u64(s.last_record_seq);
    w.u64(s.written_unix_ms);
    w.u64(0);
    let crc = crc32c::crc32c(&w.buf);
    w.put_u32_at(CRC_AT, crc);
    w.buf
}

pub fn decode_volume_super(buf: &[u8]) -> Result<VolumeSuper, FormatError> {
    const WHAT: &str = "volume superblock";
    let (mut r, flags) = open_fixed_record(
        buf,
        WHAT,
        VOLUME_SUPER_BYTES,
        VOLUME_SUPER_MAGIC,
        VOLUME_SUPER_VERSION,
        FLAG_CLEAN | FLAG_DELETING,
    )?;
    let volume = VolumeId(r.array()?);
    let generation = r.u64()?;
    let session = r.u64()?;
    let opt = |v: u64| (v != NO_CHECKPOINT).then_some(v);
    let newest_checkpoint = opt(r.u64()?);
    let previous_checkpoint = opt(r.u64()?);
    Ok(VolumeSuper {
        volume,
        generation,
        session,
        clean: flags & FLAG_CLEAN != 0,
        deleting: flags & FLAG_DELETING != 0,
        newest_checkpoint,
        previous_checkpoint,
        durable_through: r.u64()?,
        last_record_seq: r.u64()?,
        written_unix_ms: r.u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_volume_super(&sample());
        assert_eq!(buf.len(), VOLUME_SUPER_BYTES);
        assert_eq!(&buf[..8], VOLUME_SUPER_MAGIC);
        assert_eq!(&buf[8..12], &[1, 0, 1, 0]);
        assert_eq!(&buf[32..40], &5u64.to_le_bytes());
        assert_eq!(&buf[48..56], &0x40u64.to_le_bytes());
        assert_eq!(&buf[56..64], &u64::MAX.to_le_bytes());
        assert_eq!(
            u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
            GOLDEN_CRC
        );
        assert_eq!(decode_volume_super(&buf).expect("decodes"), sample());
        for pos in 0..buf.len() {
            let mut bad = buf.clone();
            bad[pos] ^= 0x04;
            assert!(decode_volume_super(&bad).is_err(), "flip at {pos}");
        }
        assert!(decode_volume_super(&buf[..95]).is_err());
    }
    const GOLDEN_CRC: u32 = 0x324d_5541;

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
}
