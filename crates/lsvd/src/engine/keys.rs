//! Names of a volume's objects in the store.
//!
//! ```text
//! <volume>/meta                     volume metadata (put-if-absent, written once)
//! <volume>/obj/<seq:016x>.d         data object
//! <volume>/obj/<seq:016x>.g         GC output object
//! <volume>/obj/<seq:016x>.c         checkpoint object
//! <volume>/super/<generation:016x>  volume superblock (put-if-absent, one per generation)
//! <volume>/snap/<name>              snapshot record (put-if-absent, never changed)
//! <volume>/parent                   clone link of a clone (put-if-absent)
//! <volume>/clones/<clone>           clone link, one per clone (put-if-absent)
//! <volume>/replicas/<target id>     replica status, one per replica (overwritten)
//! <volume>/replica-of               in a replica: its status (overwritten)
//! ```
//! Fixed-width hexadecimal sequence numbers make lexicographic order numeric order.

use lsvd_core::format::object::ObjectKind;

use crate::error::{Error, Result};

pub fn meta_key(volume: &str) -> String {
    format!("{volume}/meta")
}

pub fn objects_prefix(volume: &str) -> String {
    format!("{volume}/obj/")
}

pub fn object_key(volume: &str, seq: u64, kind: ObjectKind) -> String {
    let suffix = match kind {
        ObjectKind::Data => 'd',
        ObjectKind::Gc => 'g',
        ObjectKind::Checkpoint => 'c',
    };
    format!("{volume}/obj/{seq:016x}.{suffix}")
}

pub fn super_prefix(volume: &str) -> String {
    format!("{volume}/super/")
}

pub fn super_key(volume: &str, generation: u64) -> String {
    format!("{volume}/super/{generation:016x}")
}

pub fn snapshots_prefix(volume: &str) -> String {
    format!("{volume}/snap/")
}

pub fn snapshot_key(volume: &str, snapshot: &str) -> String {
    format!("{volume}/snap/{snapshot}")
}

pub fn replica_of_key(volume: &str) -> String {
    format!("{volume}/replica-of")
}

pub fn replicas_prefix(volume: &str) -> String {
    format!("{volume}/replicas/")
}

/// Where `lsvd replicate` records its progress towards the replica store described as
/// `target`: 16 hex digits from two CRC32C of the description.
pub fn replica_status_key(volume: &str, target: &str) -> String {
    let a = crc32c::crc32c(target.as_bytes());
    let b = crc32c::crc32c_append(0x6c73_7664, target.as_bytes());
    format!("{volume}/replicas/{a:08x}{b:08x}")
}

/// The generation named by a superblock key.
pub fn parse_super_name(key: &str) -> Option<u64> {
    let (_, hex) = key.rsplit_once("/super/")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Parse the last path component of an object key.
pub fn parse_object_name(key: &str) -> Option<(u64, ObjectKind)> {
    let name = key.rsplit('/').next()?;
    let (hex, suffix) = name.split_once('.')?;
    if hex.len() != 16 {
        return None;
    }
    let seq = u64::from_str_radix(hex, 16).ok()?;
    let kind = match suffix {
        "d" => ObjectKind::Data,
        "g" => ObjectKind::Gc,
        "c" => ObjectKind::Checkpoint,
        _ => return None,
    };
    Some((seq, kind))
}

/// Volume names: 1 to 64 characters of `[A-Za-z0-9._-]`, not starting with a dot.
/// Anything else is `BadInput`.
pub fn validate_volume_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::bad_input(format!(
            "invalid volume name '{name}': use 1-64 characters from A-Z a-z 0-9 . _ - (not starting with '.')"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let k = object_key("disk0", 0x2a, ObjectKind::Checkpoint);
        assert_eq!(k, "disk0/obj/000000000000002a.c");
        assert_eq!(parse_object_name(&k), Some((0x2a, ObjectKind::Checkpoint)));
        assert_eq!(parse_object_name("disk0/obj/2a.d"), None);
        assert_eq!(super_key("disk0", 3), "disk0/super/0000000000000003");
        assert_eq!(parse_super_name(&super_key("disk0", 3)), Some(3));
        assert_eq!(parse_super_name("disk0/super/3"), None);
        assert!(validate_volume_name("disk0").is_ok());
        assert!(validate_volume_name("../x").is_err());
        assert!(validate_volume_name("").is_err());
    }
}
