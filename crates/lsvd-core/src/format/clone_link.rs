//! The clone link: a small object in the store that ties a writable clone to the
//! snapshot it was made from.
//!
//! A clone made from snapshot `P@S` starts as that snapshot's state and shares its
//! objects: every object below the snapshot's `through_seq` is read from the parent's
//! keys (and, for a clone of a clone, from the grandparent's below the parent's own
//! start), while the clone's own objects, numbered from `through_seq` on, carry the
//! clone's name. The same record is written twice: at `<clone>/parent` (how the clone
//! finds its parent) and at `<parent>/clones/<clone>` (how the parent learns it must
//! not delete the snapshot or itself while the clone exists). Both are written with
//! put-if-absent and never changed.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDCLN\0"
//!      8    2 version (1)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over bytes 0..264 (this field zero)
//!     16   16 parent volume id
//!     32   16 clone volume id
//!     48    8 through_seq: the clone's objects start here; below it, the parent's
//!     56    8 created at, milliseconds since the Unix epoch
//!     64    1 parent name length (1..=64)
//!     65    1 snapshot name length (1..=64)
//!     66    1 clone name length (1..=64)
//!     67    5 reserved (0)
//!     72   64 parent volume name (zero-padded)
//!    136   64 snapshot name (zero-padded)
//!    200   64 clone volume name (zero-padded)
//! ```

use super::{FormatError, VolumeId, Writer, invalid, open_fixed_record, padded_text};

pub const CLONE_LINK_MAGIC: &[u8; 8] = b"LSVDCLN\0";
pub const CLONE_LINK_VERSION: u16 = 1;
/// 72 bytes of fixed fields, then three 64-byte name fields.
pub const CLONE_LINK_BYTES: usize = 72 + 3 * NAME_FIELD_BYTES;
const NAME_FIELD_BYTES: usize = 64;
const CRC_AT: usize = 12;
const WHAT: &str = "clone link";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneLink {
    pub parent: String,
    pub parent_volume: VolumeId,
    pub snapshot: String,
    pub clone: String,
    pub clone_volume: VolumeId,
    /// The clone's own objects start at this sequence number; below it, the parent's.
    pub through_seq: u64,
    pub created_unix_ms: u64,
}

fn name_ok(n: &str) -> bool {
    !n.is_empty() && n.len() <= NAME_FIELD_BYTES
}

pub fn encode_clone_link(l: &CloneLink) -> Result<Vec<u8>, FormatError> {
    if !(name_ok(&l.parent) && name_ok(&l.snapshot) && name_ok(&l.clone)) {
        return Err(invalid(WHAT, "a name of 0 or more than 64 bytes"));
    }
    let mut w = Writer::with_capacity(CLONE_LINK_BYTES);
    w.head(CLONE_LINK_MAGIC, CLONE_LINK_VERSION, 0);
    w.bytes(&l.parent_volume.0);
    w.bytes(&l.clone_volume.0);
    w.u64(l.through_seq);
    w.u64(l.created_unix_ms);
    for n in [&l.parent, &l.snapshot, &l.clone] {
        w.bytes(&[n.len() as u8]);
    }
    w.zeros(5);
    for n in [&l.parent, &l.snapshot, &l.clone] {
        w.bytes(n.as_bytes());
        w.zeros(NAME_FIELD_BYTES - n.len());
    }
    Ok(w.seal(CRC_AT))
}

pub fn decode_clone_link(buf: &[u8]) -> Result<CloneLink, FormatError> {
    let (mut r, _flags) = open_fixed_record(
        buf,
        WHAT,
        CLONE_LINK_BYTES,
        CLONE_LINK_MAGIC,
        CLONE_LINK_VERSION,
        0,
    )?;
    let parent_volume = VolumeId(r.array()?);
    let clone_volume = VolumeId(r.array()?);
    let through_seq = r.u64()?;
    let created_unix_ms = r.u64()?;
    let lens: [u8; 3] = r.array()?;
    let reserved: [u8; 5] = r.array()?;
    if reserved != [0; 5] {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let mut names = Vec::with_capacity(3);
    for len in lens {
        let field: [u8; NAME_FIELD_BYTES] = r.array()?;
        let name = padded_text(WHAT, "name", len as usize, &field)?;
        names.push(name);
    }
    let clone = names.pop().unwrap_or_default();
    let snapshot = names.pop().unwrap_or_default();
    let parent = names.pop().unwrap_or_default();
    Ok(CloneLink {
        parent,
        parent_volume,
        snapshot,
        clone,
        clone_volume,
        through_seq,
        created_unix_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_each_flip_refused, stored_crc};

    use crate::format::examples::clone_link as sample;

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_clone_link(&sample()).expect("encodes");
        assert_eq!(buf.len(), CLONE_LINK_BYTES);
        assert_eq!(CLONE_LINK_BYTES, 264);
        assert_eq!(&buf[..8], CLONE_LINK_MAGIC);
        assert_eq!(&buf[48..56], &0x99u64.to_le_bytes());
        assert_eq!(&buf[64..67], &[6, 2, 5]);
        assert_eq!(&buf[72..78], b"golden");
        assert_eq!(&buf[136..138], b"v1");
        assert_eq!(&buf[200..205], b"vm-17");
        assert_eq!(stored_crc(&buf, CRC_AT), GOLDEN_CRC);
        assert_eq!(decode_clone_link(&buf).expect("decodes"), sample());
        assert_each_flip_refused(&buf, 0..buf.len(), 0x20, decode_clone_link);
        assert!(decode_clone_link(&buf[..CLONE_LINK_BYTES - 1]).is_err());
        let long = CloneLink {
            clone: "x".repeat(65),
            ..sample()
        };
        assert!(encode_clone_link(&long).is_err());
    }
    const GOLDEN_CRC: u32 = 0x0775_a203;
}
