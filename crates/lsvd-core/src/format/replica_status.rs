//! The replica status record: what `lsvd replicate` last did for one replica of a
//! volume. Two copies are kept: in the *source* store at `<volume>/replicas/<id>` (the
//! id is 16 hex digits derived from the replica store's description), so `lsvd info
//! VOL` says how far behind each replica is without reaching the replica's store; and
//! in the *replica* at `<volume>/replica-of`, where the next pass finds the superblock
//! generation it put there last (a newer one means the replica was served). Both are
//! overwritten by every pass; recovery and GC never read them.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDRPL\0"
//!      8    2 version (1)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over bytes 0..336 (this field zero)
//!     16   16 volume id (of the source volume)
//!     32    8 updated at: when the latest pass finished, ms since the Unix epoch
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
//! ```

use super::{FormatError, VolumeId, Writer, invalid, open_fixed_record, padded_text};

pub const REPLICA_STATUS_MAGIC: &[u8; 8] = b"LSVDRPL\0";
pub const REPLICA_STATUS_VERSION: u16 = 1;
pub const REPLICA_STATUS_BYTES: usize = 336;
const NO_GENERATION: u64 = u64::MAX;
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
}

/// `peer` cut to at most [`MAX_PEER_BYTES`] on a character boundary.
pub fn cut_peer(peer: &str) -> String {
    let mut end = peer.len().min(MAX_PEER_BYTES);
    while !peer.is_char_boundary(end) {
        end -= 1;
    }
    peer[..end].to_string()
}

/// Encode `s`. An empty or too long peer description is the caller's bug ([`cut_peer`]).
pub fn encode_replica_status(s: &ReplicaStatus) -> Result<Vec<u8>, FormatError> {
    let peer = s.peer.as_bytes();
    if peer.is_empty() || peer.len() > MAX_PEER_BYTES {
        return Err(invalid(
            "replica status",
            format!("a peer description of {} bytes", peer.len()),
        ));
    }
    let mut w = Writer::with_capacity(REPLICA_STATUS_BYTES);
    w.bytes(REPLICA_STATUS_MAGIC);
    w.u16(REPLICA_STATUS_VERSION);
    w.u16(0);
    w.u32(0);
    w.bytes(&s.volume.0);
    w.u64(s.updated_unix_ms);
    w.u64(s.current_as_of_unix_ms);
    w.u64(s.lag_objects);
    w.u64(s.replica_next_seq);
    w.u64(s.source_next_seq);
    w.u64(s.bytes_copied);
    w.u64(s.generation.unwrap_or(NO_GENERATION));
    w.u16(peer.len() as u16);
    w.zeros(6);
    w.bytes(peer);
    w.zeros(MAX_PEER_BYTES - peer.len());
    let crc = crc32c::crc32c(&w.buf);
    w.put_u32_at(CRC_AT, crc);
    Ok(w.buf)
}

pub fn decode_replica_status(buf: &[u8]) -> Result<ReplicaStatus, FormatError> {
    const WHAT: &str = "replica status";
    let (mut r, _flags) = open_fixed_record(
        buf,
        WHAT,
        REPLICA_STATUS_BYTES,
        REPLICA_STATUS_MAGIC,
        REPLICA_STATUS_VERSION,
        0,
    )?;
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
    Ok(ReplicaStatus {
        volume,
        updated_unix_ms,
        current_as_of_unix_ms,
        lag_objects,
        replica_next_seq,
        source_next_seq,
        bytes_copied,
        generation: (generation != NO_GENERATION).then_some(generation),
        peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_replica_status(&sample()).expect("encodes");
        assert_eq!(buf.len(), REPLICA_STATUS_BYTES);
        assert_eq!(&buf[..8], REPLICA_STATUS_MAGIC);
        assert_eq!(&buf[8..12], &[1, 0, 0, 0]);
        assert_eq!(&buf[48..56], &12u64.to_le_bytes());
        assert_eq!(&buf[56..64], &0x80u64.to_le_bytes());
        assert_eq!(&buf[80..88], &7u64.to_le_bytes());
        assert_eq!(&buf[88..90], &52u16.to_le_bytes());
        assert_eq!(&buf[96..101], b"s3://");
        assert_eq!(
            u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
            GOLDEN_CRC
        );
        assert_eq!(decode_replica_status(&buf).expect("decodes"), sample());
        for pos in 0..buf.len() {
            let mut bad = buf.clone();
            bad[pos] ^= 0x10;
            assert!(decode_replica_status(&bad).is_err(), "flip at {pos}");
        }
        assert!(decode_replica_status(&buf[..REPLICA_STATUS_BYTES - 1]).is_err());
    }
    const GOLDEN_CRC: u32 = 0x7f2f_7600;

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
