//! Names of a volume's objects in the store.
//!
//! ```text
//! <volume>/meta                     volume metadata (put-if-absent, written once)
//! <volume>/settings                 volume settings (overwritten by `lsvd config`)
//! <volume>/keys                     an encrypted volume's wrapped data key
//! <volume>/obj/<seq:016x>.<epoch:016x>.d   data object
//! <volume>/obj/<seq:016x>.<epoch:016x>.g   GC output object
//! <volume>/obj/<seq:016x>.<epoch:016x>.c   checkpoint object
//! <volume>/obj/<seq:016x>.d|g|c     the same, written before epochs (epoch 0)
//! <volume>/super/<generation:016x>  volume superblock (put-if-absent, one per generation)
//! <volume>/snap/<name>              snapshot record (put-if-absent, never changed)
//! <volume>/parent                   clone link of a clone (put-if-absent)
//! <volume>/clones/<clone>           clone link, one per clone (put-if-absent)
//! <volume>/replicas/<target id>     replica status, one per replica (overwritten)
//! <volume>/replica-of               in a replica: its status (overwritten)
//! ```
//! Fixed-width hexadecimal sequence numbers make lexicographic order numeric order.
//! The epoch (the claim of the volume that wrote the object) makes every name unique:
//! two processes that both think they own the volume never write the same key, and
//! a number used by an object stranded past a gap is never read as another object.

use lsvd_core::format::object::ObjectKind;

use lsvd_core::error::{Error, Result};

pub fn meta_key(volume: &str) -> String {
    format!("{volume}/meta")
}

pub fn objects_prefix(volume: &str) -> String {
    format!("{volume}/obj/")
}

/// The key of object `seq` written under `epoch` (epoch 0: the name objects had
/// before epochs).
pub fn object_key(volume: &str, seq: u64, epoch: u64, kind: ObjectKind) -> String {
    let suffix = match kind {
        ObjectKind::Data => 'd',
        ObjectKind::Gc => 'g',
        ObjectKind::Checkpoint => 'c',
    };
    if epoch == 0 {
        format!("{volume}/obj/{seq:016x}.{suffix}")
    } else {
        format!("{volume}/obj/{seq:016x}.{epoch:016x}.{suffix}")
    }
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

pub fn keys_key(volume: &str) -> String {
    format!("{volume}/keys")
}

pub fn settings_key(volume: &str) -> String {
    format!("{volume}/settings")
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

/// What an object's name says: its sequence number, epoch and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectName {
    pub seq: u64,
    pub epoch: u64,
    pub kind: ObjectKind,
}

/// Parse the last path component of an object key.
pub fn parse_object_name(key: &str) -> Option<ObjectName> {
    let name = key.rsplit('/').next()?;
    let (hex, rest) = name.split_once('.')?;
    let hex16 = |h: &str| {
        (h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(h, 16).ok())
            .flatten()
    };
    let seq = hex16(hex)?;
    let (epoch, suffix) = match rest.split_once('.') {
        Some((e, suffix)) => {
            let epoch = hex16(e)?;
            if epoch == 0 {
                return None; // epoch 0 is written without it
            }
            (epoch, suffix)
        }
        None => (0, rest),
    };
    let kind = match suffix {
        "d" => ObjectKind::Data,
        "g" => ObjectKind::Gc,
        "c" => ObjectKind::Checkpoint,
        _ => return None,
    };
    Some(ObjectName { seq, epoch, kind })
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
        let k = object_key("disk0", 0x2a, 0, ObjectKind::Checkpoint);
        assert_eq!(k, "disk0/obj/000000000000002a.c");
        let name = |seq, epoch, kind| Some(ObjectName { seq, epoch, kind });
        assert_eq!(parse_object_name(&k), name(0x2a, 0, ObjectKind::Checkpoint));
        let k = object_key("disk0", 0x2a, 3, ObjectKind::Gc);
        assert_eq!(k, "disk0/obj/000000000000002a.0000000000000003.g");
        assert_eq!(parse_object_name(&k), name(0x2a, 3, ObjectKind::Gc));
        assert_eq!(parse_object_name("disk0/obj/2a.d"), None);
        assert_eq!(
            parse_object_name("disk0/obj/000000000000002a.0000000000000000.d"),
            None,
            "epoch 0 has one name"
        );
        assert_eq!(
            parse_object_name("disk0/obj/000000000000002a.00000003.d"),
            None
        );
        assert_eq!(parse_object_name("disk0/obj/000000000000002a.x.d"), None);
        assert_eq!(super_key("disk0", 3), "disk0/super/0000000000000003");
        assert_eq!(parse_super_name(&super_key("disk0", 3)), Some(3));
        assert_eq!(parse_super_name("disk0/super/3"), None);
        assert!(validate_volume_name("disk0").is_ok());
        assert!(validate_volume_name("../x").is_err());
        assert!(validate_volume_name("").is_err());
    }
}
