//! The cache superblock: where the write log on the cache device starts.
//!
//! Two copies live in the first two 4 KiB blocks of the cache file; each update
//! overwrites the older copy with a higher generation, so a torn superblock write
//! leaves the other copy valid. Readers take the valid copy with the higher generation.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDCSB\0"
//!      8    2 version (4; versions 1-3 are still read)
//!     10    2 flags: bit 0 = closed cleanly; bit 1 = everything after the two
//!             superblocks is encrypted (always set in version 3, never in 1-2)
//!     12    4 crc32c over bytes 0..112 (0..104 in version 2, 0..88 in version 1)
//!             with this field zero
//!     16   16 volume id
//!     32    8 generation
//!     40    8 cache file size in bytes
//!     48    8 log region start (byte offset)
//!     56    8 log region end (byte offset)
//!     64    8 tail offset: where the oldest record still needed starts
//!     72    8 tail sequence number: that record's sequence number
//!     80    8 index epoch: random per open; a write-log index counts only if it
//!             carries the same epoch (0 = none; older builds wrote 0 here)
//!     88    8 claimed epoch: the epoch of the last claim of the volume this log's
//!             session made that landed (version 2; 0 in version 1: unknown)
//!     96    8 claimed session: the session id of that claim (version 2; version 1:
//!             the index epoch, which was the session then)
//!    104    8 local key id (versions 3, 4): which key encrypts the log
//!             (docs/format/local-encryption.md); zero in a plain log
//! ```
//!
//! Version 4 is written for every log: the write log may hold records of version 5
//! (CRC32C over the header only), which builds before it cannot verify. They read
//! cache superblocks of versions up to 3 and refuse version 4, rather than take the
//! first version-5 record for a torn one and end the log there, dropping every
//! acknowledged write after it. Version 3 (encrypted logs) was introduced the same way.
//!
//! Why two sessions: an open writes this superblock with its new session (the index
//! epoch) before it claims the volume, and again once the claim has landed. A crash
//! in between leaves the store naming either the old claim or the new one; both are
//! this log's. Any other session in the store's newest superblock means another
//! process claimed the volume since, and the log's records after what the claimed
//! epoch uploaded were superseded.

use super::{FormatError, Reader, VolumeId, Writer, check_crc, expect_magic_version, invalid};

pub const CACHE_SUPER_MAGIC: &[u8; 8] = b"LSVDCSB\0";
pub const CACHE_SUPER_VERSION: u16 = 4;
/// Version 3: an encrypted log (version 4's layout, the flag always set) whose records
/// are of version 4 or older.
const CACHE_SUPER_VERSION_V3: u16 = 3;
pub const CACHE_SUPER_BYTES: usize = 4096;
/// Bytes checked in versions 3 and 4.
const ENCODED_BYTES_V3: usize = 112;
const ENCODED_BYTES: usize = 104;
const FLAG_CLEAN: u16 = 1;
const FLAG_ENCRYPTED: u16 = 2;
const ENCODED_BYTES_V1: usize = 88;
const CRC_AT: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSuper {
    pub clean: bool,
    pub volume: VolumeId,
    pub generation: u64,
    pub file_bytes: u64,
    pub log_start: u64,
    pub log_end: u64,
    pub tail_offset: u64,
    pub tail_seq: u64,
    /// Chosen at each open; write-log indexes written during that open carry it.
    pub index_epoch: u64,
    /// The epoch of this log's last claim of the volume that landed; 0: unknown
    /// (version 1). Its records were written under it.
    pub claimed_epoch: u64,
    /// The session id of that claim (the index epoch of the open that made it).
    pub claimed_session: u64,
    /// Some: everything after the superblocks is encrypted (`--encrypt-local`) with
    /// the local key of this id.
    pub local_key_id: Option<[u8; 8]>,
}

impl CacheSuper {
    /// Is `session` (the volume superblock's) this log's: the claim it made last, or
    /// the one its current open was making?
    pub fn is_own_session(&self, session: u64) -> bool {
        session != 0 && (session == self.index_epoch || session == self.claimed_session)
    }
}

/// Encode into a full 4 KiB block.
pub fn encode_cache_super(s: &CacheSuper) -> Vec<u8> {
    let mut w = Writer::with_capacity(CACHE_SUPER_BYTES);
    let clean = if s.clean { FLAG_CLEAN } else { 0 };
    let flags = match s.local_key_id {
        Some(_) => clean | FLAG_ENCRYPTED,
        None => clean,
    };
    w.head(CACHE_SUPER_MAGIC, CACHE_SUPER_VERSION, flags);
    w.bytes(&s.volume.0);
    w.u64s(&[
        s.generation,
        s.file_bytes,
        s.log_start,
        s.log_end,
        s.tail_offset,
        s.tail_seq,
        s.index_epoch,
        s.claimed_epoch,
        s.claimed_session,
    ]);
    w.bytes(&s.local_key_id.unwrap_or_default());
    let crc = crc32c::crc32c(&w.buf);
    w.put_u32_at(CRC_AT, crc);
    w.zeros(CACHE_SUPER_BYTES - w.buf.len());
    w.buf
}

pub fn decode_cache_super(buf: &[u8]) -> Result<CacheSuper, FormatError> {
    const WHAT: &str = "cache superblock";
    if buf.len() < ENCODED_BYTES {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: ENCODED_BYTES,
            have: buf.len(),
        });
    }
    let version = match expect_magic_version(
        &mut Reader::new(buf, WHAT),
        CACHE_SUPER_MAGIC,
        CACHE_SUPER_VERSION,
        WHAT,
    ) {
        Ok(()) => CACHE_SUPER_VERSION,
        Err(FormatError::UnsupportedVersion {
            version: v @ (1..=3),
            ..
        }) => v,
        Err(e) => return Err(e),
    };
    let used = match version {
        1 => ENCODED_BYTES_V1,
        2 => ENCODED_BYTES,
        _ => ENCODED_BYTES_V3,
    };
    if buf.len() < used {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: used,
            have: buf.len(),
        });
    }
    let body = &buf[..used];
    let mut r = Reader::new(body, WHAT);
    r.take(10)?;
    let flags = r.u16()?;
    let stored = r.u32()?;
    check_crc(WHAT, body, CRC_AT, stored)?;
    let encrypted = flags & FLAG_ENCRYPTED != 0;
    let flag_allowed = match version {
        1 | 2 => !encrypted,
        CACHE_SUPER_VERSION_V3 => encrypted,
        _ => true,
    };
    if !flag_allowed {
        return Err(invalid(WHAT, "version and encryption flag disagree"));
    }
    let mut s = CacheSuper {
        clean: flags & FLAG_CLEAN != 0,
        volume: VolumeId(r.array()?),
        generation: r.u64()?,
        file_bytes: r.u64()?,
        log_start: r.u64()?,
        log_end: r.u64()?,
        tail_offset: r.u64()?,
        tail_seq: r.u64()?,
        index_epoch: r.u64()?,
        claimed_epoch: 0,
        claimed_session: 0,
        local_key_id: None,
    };
    if version == 1 {
        s.claimed_session = s.index_epoch;
    } else {
        s.claimed_epoch = r.u64()?;
        s.claimed_session = r.u64()?;
    }
    if version >= CACHE_SUPER_VERSION_V3 {
        let id: [u8; 8] = r.array()?;
        if encrypted {
            s.local_key_id = Some(id);
        } else if id != [0; 8] {
            return Err(invalid(WHAT, "a plain log with a local key id"));
        }
    }
    if !(s.log_start <= s.tail_offset && s.tail_offset < s.log_end && s.log_end <= s.file_bytes) {
        return Err(invalid(WHAT, "log region or tail out of bounds"));
    }
    Ok(s)
}

/// Pick the newest valid copy of two superblock blocks.
pub fn newest_cache_super(a: &[u8], b: &[u8]) -> Result<CacheSuper, FormatError> {
    match (decode_cache_super(a), decode_cache_super(b)) {
        (Ok(x), Ok(y)) => Ok(if y.generation > x.generation { y } else { x }),
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
        (Err(e), Err(_)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::assert_each_flip_refused;

    use crate::format::examples::cache_super as sample;

    #[test]
    fn newest_valid_copy_wins() {
        let a = encode_cache_super(&sample(4));
        let b = encode_cache_super(&sample(5));
        assert_eq!(newest_cache_super(&a, &b).expect("valid").generation, 5);
        let mut torn = b.clone();
        torn[40] ^= 1;
        assert_eq!(newest_cache_super(&a, &torn).expect("valid").generation, 4);
        assert!(newest_cache_super(&torn, &torn).is_err());
        // Version 4, whether or not the log is encrypted: builds that cannot verify
        // version-5 records refuse it.
        assert_eq!(&a[..10], b"LSVDCSB\0\x04\x00");
        assert_eq!(&a[88..96], &3u64.to_le_bytes());
        assert_eq!(&a[96..104], &8u64.to_le_bytes());
        assert!(a[104..].iter().all(|&b| b == 0), "no key id, no flag");
        assert_each_flip_refused(&a, 0..112, 0x10, decode_cache_super);
    }

    /// `buf` relabelled `version` with its CRC refitted over the first `checked` bytes.
    fn relabel(buf: &[u8], version: u16, checked: usize) -> Vec<u8> {
        let mut b = buf.to_vec();
        b[8..10].copy_from_slice(&version.to_le_bytes());
        b[checked..].fill(0);
        b[CRC_AT..CRC_AT + 4].fill(0);
        let crc = crc32c::crc32c(&b[..checked]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// An encrypted log's superblock carries the flag and its key id.
    #[test]
    fn an_encrypted_log_carries_the_flag_and_its_key_id() {
        let sb = CacheSuper {
            local_key_id: Some(*b"keyid-01"),
            ..sample(6)
        };
        let a = encode_cache_super(&sb);
        assert_eq!(&a[..12], b"LSVDCSB\0\x04\x00\x02\x00");
        assert_eq!(&a[104..112], b"keyid-01");
        assert!(a[112..].iter().all(|&b| b == 0));
        assert_eq!(decode_cache_super(&a).expect("decodes"), sb);
        assert_each_flip_refused(&a, 0..112, 0x10, decode_cache_super);
        // A plain log naming a key is refused.
        let mut plain = encode_cache_super(&sample(6));
        plain[104] = 1;
        assert!(decode_cache_super(&relabel(&plain, 4, 112)).is_err());
    }

    /// Superblocks of versions 2 (plain) and 3 (encrypted), as the builds before
    /// version 4 wrote them, still read; the flag must agree with those versions.
    #[test]
    fn versions_2_and_3_still_read() {
        let plain = encode_cache_super(&sample(6));
        let v2 = relabel(&plain, 2, 104);
        assert_eq!(decode_cache_super(&v2).expect("v2 decodes"), sample(6));
        let sb = CacheSuper {
            local_key_id: Some(*b"keyid-02"),
            ..sample(6)
        };
        let v3 = relabel(&encode_cache_super(&sb), 3, 112);
        assert_eq!(decode_cache_super(&v3).expect("v3 decodes"), sb);
        // The flag in version 2, or version 3 without it, is refused.
        let mut flagged = v2.clone();
        flagged[10] |= 2;
        assert!(decode_cache_super(&relabel(&flagged, 2, 104)).is_err());
        assert!(decode_cache_super(&relabel(&plain, 3, 112)).is_err());
        // A version this build does not know is refused.
        assert!(matches!(
            decode_cache_super(&relabel(&plain, 5, 112)),
            Err(FormatError::UnsupportedVersion { version: 5, .. })
        ));
    }

    /// A version 1 superblock (88 bytes checked) as builds before epochs wrote it.
    #[test]
    fn version_1_still_reads_with_an_unknown_epoch() {
        let v1 = relabel(&encode_cache_super(&sample(7)), 1, 88);
        let sb = decode_cache_super(&v1).expect("decodes");
        assert_eq!(
            sb,
            CacheSuper {
                claimed_epoch: 0,
                claimed_session: 9,
                ..sample(7)
            }
        );
        assert!(sb.is_own_session(9) && !sb.is_own_session(8) && !sb.is_own_session(0));
    }
}
