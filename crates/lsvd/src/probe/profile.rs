//! The saved probe profile: `<data>/probe-profile`.
//!
//! Why: the probe takes seconds and wears the device a little; its result should be
//! measured once and read by whoever chooses the write-log layout (a later `lsvd
//! serve`). Like every persisted structure in lsvd it carries a magic, a version and a
//! CRC32C that are verified before anything in it is used.
//!
//! ```text
//! offset   size field
//!      0      8 magic "LSVDPRB1"
//!      8      4 version = 1 (u32 LE)
//!     12      4 payload length N in bytes (u32 LE), at most MAX_PAYLOAD_BYTES
//!     16      N payload: the profile as UTF-8 JSON (the object `lsvd probe --json` prints)
//!   16+N      4 crc32c over bytes [0, 16+N) (u32 LE)
//! ```
//!
//! The exact bytes are specified in `docs/format/probe-profile.md`.

use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Decisions;
use super::measure::Measurements;
use lsvd_core::error::{Error, ErrorKind, Result};

pub const PROFILE_MAGIC: &[u8; 8] = b"LSVDPRB1";
pub const PROFILE_VERSION: u32 = 1;
/// Name of the profile in the data directory.
pub const PROFILE_FILE_NAME: &str = "probe-profile";
/// Largest payload accepted (a real one is a few KiB).
pub const MAX_PAYLOAD_BYTES: u32 = 1 << 20;
const HEADER_BYTES: usize = 16;
const TRAILER_BYTES: usize = 4;

/// What `lsvd probe` found and decided: printed by `--json`, saved to the data
/// directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeProfile {
    /// Version of lsvd that measured.
    pub lsvd_version: String,
    /// When, in seconds since the Unix epoch.
    pub created_unix_secs: u64,
    /// The directory probed.
    pub path: String,
    /// Whether the measurements used `O_DIRECT` (false: the filesystem refused it and
    /// they went through the page cache).
    pub direct: bool,
    /// Size of the scratch file.
    pub file_size_bytes: u64,
    /// Duration of each timed test.
    pub seconds_per_test: f64,
    pub measurements: Measurements,
    pub decisions: Decisions,
}

/// Why bytes are not a valid profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileDecodeError {
    /// Fewer bytes than header and trailer.
    Truncated { len_bytes: usize },
    /// The first 8 bytes are not `LSVDPRB1`.
    BadMagic,
    /// A version this build does not read.
    UnsupportedVersion(u32),
    /// The length field does not match the bytes present, or exceeds the limit.
    BadLength {
        declared_bytes: u64,
        present_bytes: u64,
    },
    /// The CRC32C does not match.
    BadChecksum { stored: u32, computed: u32 },
    /// The payload is not a profile (JSON error).
    BadPayload(String),
}

impl fmt::Display for ProfileDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileDecodeError::Truncated { len_bytes } => {
                write!(f, "probe profile truncated ({len_bytes} bytes)")
            }
            ProfileDecodeError::BadMagic => write!(f, "not a probe profile (bad magic)"),
            ProfileDecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "probe profile version {v} is not supported (this build reads 1)"
                )
            }
            ProfileDecodeError::BadLength {
                declared_bytes,
                present_bytes,
            } => write!(
                f,
                "probe profile payload length {declared_bytes} does not match the {present_bytes} bytes present"
            ),
            ProfileDecodeError::BadChecksum { stored, computed } => write!(
                f,
                "probe profile checksum mismatch (stored {stored:08x}, computed {computed:08x})"
            ),
            ProfileDecodeError::BadPayload(e) => write!(f, "probe profile payload: {e}"),
        }
    }
}

impl std::error::Error for ProfileDecodeError {}

/// The bytes of `profile` in the envelope above.
pub fn encode(profile: &ProbeProfile) -> Result<Vec<u8>> {
    let payload = serde_json::to_vec(profile).map_err(|e| {
        Error::with_source(ErrorKind::Unsupported, "cannot encode probe profile", e)
    })?;
    Ok(encode_payload(PROFILE_VERSION, &payload))
}

/// The envelope around `payload` with a given version (tests write foreign versions).
fn encode_payload(version: u32, payload: &[u8]) -> Vec<u8> {
    envelope(PROFILE_MAGIC, version, payload)
}

/// `magic`, `version`, length, `payload`, CRC32C: the envelope of every probe profile
/// (the store profile uses it with its own magic).
pub(super) fn envelope(magic: &[u8; 8], version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len() + TRAILER_BYTES);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    let len = u32::try_from(payload.len()).expect("a profile payload is a few KiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Verify magic, version, length and CRC32C, then parse the payload.
pub fn decode(bytes: &[u8]) -> Result<ProbeProfile, ProfileDecodeError> {
    let payload = open_envelope(PROFILE_MAGIC, PROFILE_VERSION, bytes)?;
    serde_json::from_slice(payload).map_err(|e| ProfileDecodeError::BadPayload(e.to_string()))
}

/// The payload of an [`envelope`] after checking magic, version, length and CRC32C.
pub(super) fn open_envelope<'a>(
    magic: &[u8; 8],
    expected_version: u32,
    bytes: &'a [u8],
) -> Result<&'a [u8], ProfileDecodeError> {
    if bytes.len() < HEADER_BYTES + TRAILER_BYTES {
        return Err(ProfileDecodeError::Truncated {
            len_bytes: bytes.len(),
        });
    }
    if &bytes[..8] != magic {
        return Err(ProfileDecodeError::BadMagic);
    }
    let version = u32_at(bytes, 8);
    if version != expected_version {
        return Err(ProfileDecodeError::UnsupportedVersion(version));
    }
    let declared = u32_at(bytes, 12);
    let present = (bytes.len() - HEADER_BYTES - TRAILER_BYTES) as u64;
    if declared > MAX_PAYLOAD_BYTES || u64::from(declared) != present {
        return Err(ProfileDecodeError::BadLength {
            declared_bytes: u64::from(declared),
            present_bytes: present,
        });
    }
    let body_end = bytes.len() - TRAILER_BYTES;
    let stored = u32_at(bytes, body_end);
    let computed = crc32c::crc32c(&bytes[..body_end]);
    if stored != computed {
        return Err(ProfileDecodeError::BadChecksum { stored, computed });
    }
    Ok(&bytes[HEADER_BYTES..body_end])
}

/// Where the profile of data directory `data_dir` lives.
pub fn profile_path(data_dir: &Path) -> PathBuf {
    data_dir.join(PROFILE_FILE_NAME)
}

/// Write `profile` to `<data_dir>/probe-profile` atomically: a temporary file, fsync,
/// rename over the old one, fsync the directory. Creates `data_dir` if needed.
pub fn save_profile(data_dir: &Path, profile: &ProbeProfile) -> Result<PathBuf> {
    let bytes = encode(profile)?;
    let path = profile_path(data_dir);
    write_atomically(&path, &bytes)?;
    Ok(path)
}

/// Write `bytes` to `path` atomically (temporary file, fsync, rename, fsync the
/// directory), creating the directory if needed.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)
        .map_err(|e| Error::local_io(format!("cannot create directory {}", dir.display()), e))?;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)
            .map_err(|e| Error::local_io(format!("cannot create {}", tmp.display()), e))?;
        f.write_all(bytes)
            .map_err(|e| Error::local_io(format!("cannot write {}", tmp.display()), e))?;
        f.sync_all()
            .map_err(|e| Error::local_io(format!("cannot fsync {}", tmp.display()), e))?;
        fs::rename(&tmp, path)
            .map_err(|e| Error::local_io(format!("cannot rename to {}", path.display()), e))?;
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::local_io(format!("cannot fsync directory {}", dir.display()), e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The profile saved in `data_dir` by `lsvd probe`, if there is one. A file that fails
/// its checks is `Corrupt` (the decode error is the source); one that cannot be read
/// is `LocalIo`.
pub fn load_profile(data_dir: &Path) -> Result<Option<ProbeProfile>> {
    let path = profile_path(data_dir);
    let Some(bytes) = read_bounded(&path)? else {
        return Ok(None);
    };
    decode(&bytes).map(Some).map_err(|e| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("probe profile {} is unusable", path.display()),
            e,
        )
    })
}

/// The bytes of `path` (None if it does not exist), never more than the largest valid
/// profile plus one byte.
pub(super) fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::local_io(
                format!("cannot open {}", path.display()),
                e,
            ));
        }
    };
    let limit = (HEADER_BYTES + MAX_PAYLOAD_BYTES as usize + TRAILER_BYTES + 1) as u64;
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::local_io(format!("cannot read {}", path.display()), e))?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample_profile;
    use super::*;

    #[test]
    fn roundtrip() {
        let p = sample_profile();
        let bytes = encode(&p).expect("encode");
        assert_eq!(&bytes[..8], b"LSVDPRB1");
        assert_eq!(u32_at(&bytes, 8), 1);
        assert_eq!(u32_at(&bytes, 12) as usize, bytes.len() - 20);
        assert_eq!(decode(&bytes), Ok(p));
    }

    #[test]
    fn every_corrupted_byte_is_rejected() {
        let bytes = encode(&sample_profile()).expect("encode");
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                assert!(decode(&b).is_err(), "flip {flip:#x} at byte {i} accepted");
            }
        }
    }

    #[test]
    fn wrong_magic_version_length_and_truncation_are_rejected() {
        let p = sample_profile();
        let payload = serde_json::to_vec(&p).expect("json");

        let mut b = encode_payload(1, &payload);
        b[..8].copy_from_slice(b"LSVDPRB2");
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&b), Err(ProfileDecodeError::BadMagic));

        // A valid envelope of another version: rejected by version, not by checksum.
        let b = encode_payload(2, &payload);
        assert_eq!(decode(&b), Err(ProfileDecodeError::UnsupportedVersion(2)));

        let good = encode_payload(1, &payload);
        for cut in [0, 1, 8, 15, 19, 20, good.len() / 2, good.len() - 1] {
            assert!(decode(&good[..cut]).is_err(), "truncated to {cut} accepted");
        }
        assert!(matches!(
            decode(&good[..10]),
            Err(ProfileDecodeError::Truncated { len_bytes: 10 })
        ));
        assert!(matches!(
            decode(&good[..good.len() - 1]),
            Err(ProfileDecodeError::BadLength { .. })
        ));

        // A sound envelope around something that is not a profile.
        let b = encode_payload(1, b"{\"x\":1}");
        assert!(matches!(decode(&b), Err(ProfileDecodeError::BadPayload(_))));
    }

    #[test]
    fn save_then_load() {
        let tmp = lsvd_store::testutil::TempDir::new("probe-profile");
        let dir = tmp.path();
        assert_eq!(load_profile(dir).expect("missing is fine"), None);
        let p = sample_profile();
        let path = save_profile(dir, &p).expect("save");
        assert_eq!(path, dir.join("probe-profile"));
        assert_eq!(load_profile(dir).expect("load"), Some(p));
        let mut bytes = fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).expect("write");
        let e = load_profile(dir).expect_err("corrupt");
        assert_eq!(e.kind, ErrorKind::Corrupt);
        let left: Vec<_> = fs::read_dir(dir).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
    }
}
