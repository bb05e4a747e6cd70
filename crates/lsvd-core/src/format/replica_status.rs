//! The replica status record: what `lsvd replicate` last did for one replica of a
//! volume, and what its running pass needs. Two copies are kept: in the *source*
//! store at `<volume>/replicas/<id>` (the id is 16 hex digits derived from the replica
//! store's description), so `lsvd info VOL` says how far behind each replica is
//! without reaching the replica's store, and so the serving engine keeps what a pass
//! in progress still has to copy; and in the *replica* at `<volume>/replica-of`,
//! where the next pass finds the superblock generation it put there last (a newer one
//! means the replica was served). Both are overwritten by every pass; recovery never
//! reads them.
//!
//! Why the pass fields (version 2): a pass copies the source as its newest volume
//! superblock described it when the pass began, from that superblock's checkpoint up
//! to the newest object listed then. GC deletes what that checkpoint lists once two
//! newer checkpoints are named; a long pass under heavy GC used to find objects gone
//! and start again, possibly forever. With the pass's checkpoint, the end of its
//! listing and its start time in the source's record, the engine keeps what the pass
//! needs for a bounded time (`engine::replica_hold`).
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDRPL\0"
//!      8    2 version (2; version 1, 336 bytes without the pass fields, is read)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over the whole record (this field zero)
//!     16   16 volume id (of the source volume)
//!     32    8 updated at: when the latest pass finished, ms since the Unix epoch
//!             (0: no pass has finished yet)
//!     40    8 current as of: when the latest finished pass started (the replica holds
//!             everything the source held then), ms since the Unix epoch
//!     48    8 lag objects: objects the latest pass found missing and copied
//!     56    8 replica next seq: the replica recovers every object below it
//!     64    8 source next seq: the source's newest object, plus one, at that pass
//!     72    8 bytes copied by the latest pass
//!     80    8 generation: the source superblock generation the pass put in the replica
//!             (NONE = u64::MAX: the source had none)
//!     88    2 peer description length in bytes (1..=240)
//!     90    6 reserved (0)
//!     96  240 peer description: the other store's (UTF-8, zero-padded; never
//!             credentials): the replica's in the source, the source's in the replica
//!    336    8 pass started: when the pass running now began, ms since the Unix epoch
//!             (0: no pass is running; the fields below are then NONE, 0 and 0)
//!    344    8 pass checkpoint seq: the source checkpoint that pass copies from
//!             (NONE = u64::MAX: the source had no checkpoint)
//!    352    8 pass checkpoint epoch (0 with NONE)
//!    360    8 pass through seq: the source's newest listed object plus one when the
//!             pass listed it (the pass copies nothing numbered from there on)
//! ```

use super::{FormatError, VolumeId, Writer, invalid, open_fixed_record, padded_text};

pub const REPLICA_STATUS_MAGIC: &[u8; 8] = b"LSVDRPL\0";
/// The version written: with the pass in progress.
pub const REPLICA_STATUS_VERSION: u16 = 2;
pub const REPLICA_STATUS_BYTES: usize = 368;
/// The first version (still read): no pass fields.
pub const REPLICA_STATUS_VERSION_1: u16 = 1;
pub const REPLICA_STATUS_BYTES_V1: usize = 336;
const NONE: u64 = u64::MAX;
/// Longest peer description kept, in bytes (longer ones are cut by the writer).
pub const MAX_PEER_BYTES: usize = 240;
const CRC_AT: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub volume: VolumeId,
    pub updated_unix_ms: u64,
    pub current_as_of_unix_ms: u64,
    pub lag_objects: u64,
    pub replica_next_seq: u64,
    pub source_next_seq: u64,
    pub bytes_copied: u64,
    /// The source superblock generation the replica carries after the pass.
    pub generation: Option<u64>,
    /// The other store: the replica's description in the source, the source's in the
    /// replica.
    pub peer: String,
    /// The pass running now, if any (always None in a version 1 record).
    pub pass: Option<PassInProgress>,
}

/// A pass of `lsvd replicate` under way: what the source must keep for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassInProgress {
    /// When the pass began, ms since the Unix epoch (never 0).
    pub started_unix_ms: u64,
    /// The source checkpoint the pass copies from, as (sequence number, epoch); None
    /// when the source had none (the pass copies every object from the first).
    pub checkpoint: Option<(u64, u64)>,
    /// The source's newest listed object plus one when the pass listed it: the pass
    /// copies nothing numbered from here on.
    pub through_seq: u64,
}

/// `peer` cut to at most [`MAX_PEER_BYTES`] on a character boundary.
pub fn cut_peer(peer: &str) -> String {
    let mut end = peer.len().min(MAX_PEER_BYTES);
    while !peer.is_char_boundary(end) {
        end -= 1;
    }
    peer[..end].to_string()
}

/// Encode `s` (version 2). An empty or too long peer description is the caller's bug
/// ([`cut_peer`]); so is a pass that started at 0 or names checkpoint `u64::MAX`.
pub fn encode_replica_status(s: &ReplicaStatus) -> Result<Vec<u8>, FormatError> {
    let peer = s.peer.as_bytes();
    if peer.is_empty() || peer.len() > MAX_PEER_BYTES {
        return Err(invalid(
            "replica status",
            format!("a peer description of {} bytes", peer.len()),
        ));
    }
    if let Some(p) = &s.pass
        && (p.started_unix_ms == 0 || p.checkpoint.is_some_and(|c| c.0 == NONE))
    {
        return Err(invalid(
            "replica status",
            format!("an impossible pass {p:?}"),
        ));
    }
    let mut w = Writer::with_capacity(REPLICA_STATUS_BYTES);
    w.head(REPLICA_STATUS_MAGIC, REPLICA_STATUS_VERSION, 0);
    w.bytes(&s.volume.0);
    w.u64s(&[
        s.updated_unix_ms,
        s.current_as_of_unix_ms,
        s.lag_objects,
        s.replica_next_seq,
        s.source_next_seq,
        s.bytes_copied,
        s.generation.unwrap_or(NONE),
    ]);
    w.u16(peer.len() as u16);
    w.zeros(6);
    w.bytes(peer);
    w.zeros(MAX_PEER_BYTES - peer.len());
    let (started, checkpoint, through) = match &s.pass {
        Some(p) => (
            p.started_unix_ms,
            p.checkpoint.unwrap_or((NONE, 0)),
            p.through_seq,
        ),
        None => (0, (NONE, 0), 0),
    };
    w.u64s(&[started, checkpoint.0, checkpoint.1, through]);
    Ok(w.seal(CRC_AT))
}

/// Decode a version 2 record, or a version 1 record (no pass).
pub fn decode_replica_status(buf: &[u8]) -> Result<ReplicaStatus, FormatError> {
    const WHAT: &str = "replica status";
    let version = buf.get(8..10).map(|v| u16::from_le_bytes([v[0], v[1]]));
    let (len, version) = match version {
        Some(REPLICA_STATUS_VERSION_1) => (REPLICA_STATUS_BYTES_V1, REPLICA_STATUS_VERSION_1),
        _ => (REPLICA_STATUS_BYTES, REPLICA_STATUS_VERSION),
    };
    let (mut r, _flags) = open_fixed_record(buf, WHAT, len, REPLICA_STATUS_MAGIC, version, 0)?;
    let volume = VolumeId(r.array()?);
    let updated_unix_ms = r.u64()?;
    let current_as_of_unix_ms = r.u64()?;
    let lag_objects = r.u64()?;
    let replica_next_seq = r.u64()?;
    let source_next_seq = r.u64()?;
    let bytes_copied = r.u64()?;
    let generation = r.u64()?;
    let len = r.u16()? as usize;
    let reserved: [u8; 6] = r.array()?;
    let field: [u8; MAX_PEER_BYTES] = r.array()?;
    if reserved != [0; 6] {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let peer = padded_text(WHAT, "peer", len, &field)?;
    if current_as_of_unix_ms > updated_unix_ms {
        return Err(invalid(
            WHAT,
            "the pass's state is newer than the pass's end",
        ));
    }
    let pass = if version == REPLICA_STATUS_VERSION_1 {
        None
    } else {
        let [started_unix_ms, seq, epoch, through_seq] = r.u64s()?;
        match (started_unix_ms, seq) {
            (0, NONE) if epoch == 0 && through_seq == 0 => None,
            (0, _) => return Err(invalid(WHAT, "pass fields for no pass")),
            (_, NONE) if epoch != 0 => {
                return Err(invalid(WHAT, "an epoch for no checkpoint"));
            }
            (started_unix_ms, seq) => Some(PassInProgress {
                started_unix_ms,
                checkpoint: (seq != NONE).then_some((seq, epoch)),
                through_seq,
            }),
        }
    };
    Ok(ReplicaStatus {
        volume,
        updated_unix_ms,
        current_as_of_unix_ms,
        lag_objects,
        replica_next_seq,
        source_next_seq,
        bytes_copied,
        generation: (generation != NONE).then_some(generation),
        peer,
        pass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_each_flip_refused, refit_crc, stored_crc};

    fn sample() -> ReplicaStatus {
        ReplicaStatus {
            volume: VolumeId([9; 16]),
            updated_unix_ms: 1_800_000_005_000,
            current_as_of_unix_ms: 1_800_000_000_000,
            lag_objects: 12,
            replica_next_seq: 0x80,
            source_next_seq: 0x81,
            bytes_copied: 3 << 20,
            generation: Some(7),
            peer: "s3://bucket/replica (endpoint http://127.0.0.1:7070)".into(),
            pass: Some(PassInProgress {
                started_unix_ms: 1_800_000_006_000,
                checkpoint: Some((0x7c, 3)),
                through_seq: 0x90,
            }),
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_replica_status(&sample()).expect("encodes");
        assert_eq!(buf.len(), REPLICA_STATUS_BYTES);
        assert_eq!(&buf[..8], REPLICA_STATUS_MAGIC);
        assert_eq!(&buf[8..12], &[2, 0, 0, 0]);
        assert_eq!(&buf[48..56], &12u64.to_le_bytes());
        assert_eq!(&buf[56..64], &0x80u64.to_le_bytes());
        assert_eq!(&buf[80..88], &7u64.to_le_bytes());
        assert_eq!(&buf[88..90], &52u16.to_le_bytes());
        assert_eq!(&buf[96..101], b"s3://");
        assert_eq!(&buf[336..344], &1_800_000_006_000u64.to_le_bytes());
        assert_eq!(&buf[344..352], &0x7cu64.to_le_bytes());
        assert_eq!(&buf[352..360], &3u64.to_le_bytes());
        assert_eq!(&buf[360..368], &0x90u64.to_le_bytes());
        assert_eq!(stored_crc(&buf, 12), GOLDEN_CRC);
        assert_eq!(decode_replica_status(&buf).expect("decodes"), sample());
        assert_each_flip_refused(&buf, 0..buf.len(), 0x10, decode_replica_status);
        assert!(decode_replica_status(&buf[..REPLICA_STATUS_BYTES - 1]).is_err());
        assert!(decode_replica_status(&buf[..REPLICA_STATUS_BYTES_V1]).is_err());
    }
    const GOLDEN_CRC: u32 = 0xb9a1_5091;

    /// A version 1 record (336 bytes, written before the pass fields) still decodes,
    /// with no pass: these are the bytes the version 1 golden test pinned.
    #[test]
    fn version_1_records_are_read() {
        let s = ReplicaStatus {
            pass: None,
            ..sample()
        };
        let mut v1 =
            encode_replica_status(&s).expect("encodes")[..REPLICA_STATUS_BYTES_V1].to_vec();
        v1[8] = 1;
        refit_crc(&mut v1, 12);
        assert_eq!(
            stored_crc(&v1, 12),
            GOLDEN_CRC_V1,
            "the version 1 golden record"
        );
        assert_eq!(decode_replica_status(&v1).expect("decodes"), s);
        assert_each_flip_refused(&v1, 0..v1.len(), 0x10, decode_replica_status);
        // A version 1 header on 368 bytes, or version 2 on 336, is refused.
        let mut long = v1.clone();
        long.extend_from_slice(&[0; 32]);
        assert!(decode_replica_status(&long).is_err());
    }
    const GOLDEN_CRC_V1: u32 = 0x7f2f_7600;

    #[test]
    fn passes_without_a_checkpoint_and_no_pass_round_trip() {
        for pass in [
            None,
            Some(PassInProgress {
                started_unix_ms: 5,
                checkpoint: None,
                through_seq: 1,
            }),
            Some(PassInProgress {
                started_unix_ms: 5,
                checkpoint: Some((0, 0)),
                through_seq: 0,
            }),
        ] {
            let s = ReplicaStatus { pass, ..sample() };
            let buf = encode_replica_status(&s).expect("encodes");
            assert_eq!(decode_replica_status(&buf).expect("decodes"), s, "{pass:?}");
        }
        let none = encode_replica_status(&ReplicaStatus {
            pass: None,
            ..sample()
        })
        .expect("encodes");
        assert_eq!(
            &none[336..368],
            &[&[0u8; 8][..], &[0xff; 8], &[0; 8], &[0; 8]].concat()[..]
        );
        for bad in [
            PassInProgress {
                started_unix_ms: 0,
                checkpoint: None,
                through_seq: 0,
            },
            PassInProgress {
                started_unix_ms: 5,
                checkpoint: Some((u64::MAX, 0)),
                through_seq: 0,
            },
        ] {
            let s = ReplicaStatus {
                pass: Some(bad),
                ..sample()
            };
            assert!(encode_replica_status(&s).is_err(), "{bad:?}");
        }
        // No pass but a checkpoint, an epoch or an end: refused.
        for (at, value) in [(344usize, 7u64), (352, 7), (360, 7)] {
            let mut buf = none.clone();
            buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
            refit_crc(&mut buf, 12);
            assert!(decode_replica_status(&buf).is_err(), "{at}");
        }
    }

    #[test]
    fn peers_are_cut_on_character_boundaries() {
        let long = "é".repeat(200);
        let cut = cut_peer(&long);
        assert_eq!(cut.len(), 240);
        let s = ReplicaStatus {
            peer: cut,
            ..sample()
        };
        let buf = encode_replica_status(&s).expect("encodes");
        assert_eq!(decode_replica_status(&buf).expect("decodes"), s);
        let odd = format!("x{}", "é".repeat(200));
        assert_eq!(cut_peer(&odd).len(), 239);
        let empty = ReplicaStatus {
            peer: String::new(),
            ..sample()
        };
        assert!(encode_replica_status(&empty).is_err());
        let none = ReplicaStatus {
            generation: None,
            ..sample()
        };
        let buf = encode_replica_status(&none).expect("encodes");
        assert_eq!(&buf[80..88], &u64::MAX.to_le_bytes());
        assert_eq!(decode_replica_status(&buf).expect("decodes"), none);
    }
}
