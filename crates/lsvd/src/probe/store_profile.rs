//! The saved store profile: `<data>/store-profiles/<key>`, one per store URL.
//!
//! Why: `lsvd probe --store URL` takes tens of seconds and writes to the store; its
//! decisions (read fetch size, batch size, uploads in flight) are read by every later
//! `lsvd serve` of that store from this data directory. The file name is derived from
//! the URL (a 64-bit FNV-1a hash in hex) and the payload holds the URL itself, which
//! is compared on load, so a profile is only ever used for the store it measured.
//!
//! Same envelope as the device profile ([`super::profile`]), with its own magic:
//!
//! ```text
//! offset   size field
//!      0      8 magic "LSVDSPR1"
//!      8      4 version = 1 (u32 LE)
//!     12      4 payload length N in bytes (u32 LE), at most 1 MiB
//!     16      N payload: the profile as UTF-8 JSON (what `lsvd probe --store --json` prints)
//!   16+N      4 crc32c over bytes [0, 16+N) (u32 LE)
//! ```
//!
//! Spec: `docs/format/probe-profile.md`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::profile::{ProfileDecodeError, envelope, open_envelope, read_bounded, write_atomically};
use super::store::{StoreDecisions, StoreMeasurements};
use lsvd_core::error::{Error, ErrorKind, Result};

pub const STORE_PROFILE_MAGIC: &[u8; 8] = b"LSVDSPR1";
pub const STORE_PROFILE_VERSION: u32 = 1;
/// Directory of the store profiles in the data directory.
pub const STORE_PROFILE_DIR: &str = "store-profiles";

/// What `lsvd probe --store` found and decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreProfile {
    pub lsvd_version: String,
    pub created_unix_secs: u64,
    /// The store URL measured (the key of the profile).
    pub store_url: String,
    /// Whether this was a `--quick` run (fewer samples, smaller objects).
    pub quick: bool,
    pub measurements: StoreMeasurements,
    pub decisions: StoreDecisions,
}

/// 64-bit FNV-1a of `s`: a stable file name for a URL (not a checksum: the URL inside
/// the profile is what is checked).
fn fnv1a64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where the profile of `store_url` lives in `data_dir`.
pub fn store_profile_path(data_dir: &Path, store_url: &str) -> PathBuf {
    data_dir
        .join(STORE_PROFILE_DIR)
        .join(format!("{:016x}", fnv1a64(store_url)))
}

pub fn encode(profile: &StoreProfile) -> Result<Vec<u8>> {
    let payload = serde_json::to_vec(profile).map_err(|e| {
        Error::with_source(ErrorKind::Unsupported, "cannot encode store profile", e)
    })?;
    Ok(envelope(
        STORE_PROFILE_MAGIC,
        STORE_PROFILE_VERSION,
        &payload,
    ))
}

pub fn decode(bytes: &[u8]) -> Result<StoreProfile, ProfileDecodeError> {
    let payload = open_envelope(STORE_PROFILE_MAGIC, STORE_PROFILE_VERSION, bytes)?;
    serde_json::from_slice(payload).map_err(|e| ProfileDecodeError::BadPayload(e.to_string()))
}

/// Save atomically; returns the path.
pub fn save_store_profile(data_dir: &Path, profile: &StoreProfile) -> Result<PathBuf> {
    let path = store_profile_path(data_dir, &profile.store_url);
    write_atomically(&path, &encode(profile)?)?;
    Ok(path)
}

/// The profile of `store_url`, if one was saved. Corrupt (or saved for another URL
/// under the same name): `Corrupt`.
pub fn load_store_profile(data_dir: &Path, store_url: &str) -> Result<Option<StoreProfile>> {
    let path = store_profile_path(data_dir, store_url);
    let Some(bytes) = read_bounded(&path)? else {
        return Ok(None);
    };
    let unusable = |e: ProfileDecodeError| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("store profile {} is unusable", path.display()),
            e,
        )
    };
    let p = decode(&bytes).map_err(unusable)?;
    if p.store_url != store_url {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "store profile {} is for {}, not {store_url}",
                path.display(),
                p.store_url
            ),
        ));
    }
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::super::store::tests::sample_store_profile;
    use super::*;

    #[test]
    fn roundtrip_and_every_flipped_bit_rejected() {
        let p = sample_store_profile("s3://bucket/prefix");
        let bytes = encode(&p).expect("encode");
        assert_eq!(&bytes[..8], b"LSVDSPR1");
        assert_eq!(decode(&bytes), Ok(p));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at byte {i} accepted");
        }
        // A device profile's envelope is not a store profile.
        let dev =
            super::super::profile::encode(&super::super::tests::sample_profile()).expect("encode");
        assert_eq!(decode(&dev), Err(ProfileDecodeError::BadMagic));
    }

    #[test]
    fn keyed_by_url() {
        let tmp = lsvd_store::testutil::TempDir::new("store-profile");
        let dir = tmp.path();
        let a = "file:///tmp/a";
        let b = "s3://bucket/b";
        assert_ne!(store_profile_path(dir, a), store_profile_path(dir, b));
        assert_eq!(load_store_profile(dir, a).expect("none"), None);
        let p = sample_store_profile(a);
        save_store_profile(dir, &p).expect("save");
        assert_eq!(load_store_profile(dir, a).expect("load"), Some(p.clone()));
        assert_eq!(load_store_profile(dir, b).expect("other url"), None);
        // A profile of another URL under this URL's name is refused.
        std::fs::copy(store_profile_path(dir, a), store_profile_path(dir, b)).expect("copy");
        let e = load_store_profile(dir, b).expect_err("wrong url");
        assert_eq!(e.kind, ErrorKind::Corrupt);
    }
}
