//! Which mode a volume's local files (write log, read cache) are opened in under
//! `--encrypt-local`, and what to tell the operator about it.
//!
//! Why a decision at all: the mode is a property of the files, not of the flag. A
//! write log that holds records the store lacks must be read the way it was written,
//! whatever this start was given; a log closed cleanly holds nothing the store lacks
//! and is simply made anew in the mode asked for. The write log's superblocks (plain)
//! say which mode it is in and with which key (format/cache_super.rs, version 3).

use std::path::Path;
use std::sync::Arc;

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, CacheSuper};
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_store::xts::LocalKeys;

use crate::cache_dev::CacheDevice;
use crate::cache_dev::encrypted::EncryptedDevice;
use crate::config::EngineConfig;

/// What [`plan`] decided for one open.
pub(crate) struct LocalPlan {
    /// The keys the files are read and written with; None: in the clear.
    pub keys: Option<Arc<LocalKeys>>,
    /// The existing write log (and read cache) are removed and made anew first.
    pub remake: bool,
}

impl LocalPlan {
    /// The write log's superblock field.
    pub fn key_id(&self) -> Option<[u8; 8]> {
        self.keys.as_ref().map(|k| k.id)
    }

    /// `dev` (the write log file) as the engine uses it.
    pub fn write_log(&self, dev: Arc<dyn CacheDevice>) -> Arc<dyn CacheDevice> {
        match &self.keys {
            Some(k) => encrypted_write_log(dev, k),
            None => dev,
        }
    }
}

/// The write log `dev` read and written through `keys`, its superblocks plain.
fn encrypted_write_log(dev: Arc<dyn CacheDevice>, keys: &LocalKeys) -> Arc<dyn CacheDevice> {
    Arc::new(EncryptedDevice::new(
        dev,
        keys.write_log.clone(),
        2 * CACHE_SUPER_BYTES as u64,
    ))
}

/// Decide the mode of the local files of volume `meta`, given the write log's
/// superblock `existing` (None: no log yet) at `log_path`.
pub(crate) fn plan(
    log_path: &Path,
    meta: &VolumeMeta,
    existing: Option<&CacheSuper>,
    config: &EngineConfig,
) -> Result<LocalPlan> {
    let keys = config.local_keys.clone();
    let asked = config.encrypt_local;
    if asked == Some(true) && keys.is_none() {
        return Err(Error::bad_input(format!(
            "--encrypt-local: volume '{}' is not encrypted (its store holds its data in the \
             clear, so its local files would hide nothing); make an encrypted volume with \
             `lsvd create --encrypt`",
            meta.name
        )));
    }
    let Some(sb) = existing else {
        return Ok(LocalPlan {
            keys: keys.filter(|_| asked == Some(true)),
            remake: false,
        });
    };
    if let Some(id) = sb.local_key_id {
        match &keys {
            None => {
                return Err(Error::new(
                    ErrorKind::Denied,
                    format!(
                        "write log {} of volume '{}' is encrypted: give the volume's key file \
                         with --key-file",
                        log_path.display(),
                        meta.name
                    ),
                ));
            }
            Some(k) if k.id != id => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "write log {} of volume '{}' is encrypted with another key than this \
                         volume's; move it away to start from the store",
                        log_path.display(),
                        meta.name
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let encrypted = sb.local_key_id.is_some();
    if asked.is_none_or(|a| a == encrypted) {
        return Ok(LocalPlan {
            keys: keys.filter(|_| encrypted),
            remake: false,
        });
    }
    let now = if encrypted {
        "encrypted"
    } else {
        "in the clear"
    };
    let asked = if asked == Some(true) {
        "encrypted (--encrypt-local)"
    } else {
        "in the clear (no --encrypt-local)"
    };
    if sb.clean {
        lsvd_store::log::info(&format!(
            "write log {} was {now} and is made anew {asked}; it was closed cleanly, so the \
             store holds everything it held",
            log_path.display()
        ));
        return Ok(LocalPlan {
            keys: keys.filter(|_| !encrypted),
            remake: true,
        });
    }
    lsvd_store::log::warn(&format!(
        "write log {} stays {now} for now, not {asked}: it may hold writes the store lacks; \
         it is made anew as asked at the first start after a clean stop",
        log_path.display()
    ));
    Ok(LocalPlan {
        keys: keys.filter(|_| encrypted),
        remake: false,
    })
}

/// The write log `file` whose superblock is `sb`, as its records read in the clear:
/// for `lsvd check` and `lsvd inspect log`. An encrypted log needs the volume's
/// `keys` (`Denied` without them, `Corrupt` with another volume's).
pub fn readable_write_log(
    file: Arc<dyn CacheDevice>,
    sb: &CacheSuper,
    keys: Option<&LocalKeys>,
    path: &Path,
) -> Result<Arc<dyn CacheDevice>> {
    let Some(id) = sb.local_key_id else {
        return Ok(file);
    };
    match keys {
        None => Err(Error::new(
            ErrorKind::Denied,
            format!(
                "write log {} is encrypted (--encrypt-local): give the volume's key file with \
                 --key-file to read it",
                path.display()
            ),
        )),
        Some(k) if k.id != id => Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "write log {} is encrypted with another key than this volume's",
                path.display()
            ),
        )),
        Some(k) => Ok(encrypted_write_log(file, k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_core::format::examples::cache_super;
    use lsvd_core::format::volume_meta::VolumeMeta;

    fn meta() -> VolumeMeta {
        VolumeMeta {
            volume: lsvd_core::VolumeId([3; 16]),
            size_bytes: 1 << 30,
            created_unix_secs: 0,
            name: "v".into(),
            encrypted: true,
        }
    }

    fn config(asked: Option<bool>, keys: Option<Arc<LocalKeys>>) -> EngineConfig {
        EngineConfig {
            encrypt_local: asked,
            local_keys: keys,
            ..EngineConfig::default()
        }
    }

    /// Every branch of the mode decision: what a log left in either mode, clean or
    /// not, becomes under each flag, and the refusals (no keys, another key).
    #[test]
    fn the_files_mode_wins_until_a_clean_stop_and_wrong_keys_are_refused() {
        let data_key = lsvd_store::sealed::DataKey::random().expect("key");
        let keys = Arc::new(data_key.local_keys(&[3; 16]).expect("keys"));
        let other = Arc::new(data_key.local_keys(&[4; 16]).expect("keys"));
        let path = Path::new("v.wlog");
        let plain = cache_super(1);
        let encrypted = CacheSuper {
            local_key_id: Some(keys.id),
            ..cache_super(1)
        };
        let clean = |sb: &CacheSuper| CacheSuper { clean: true, ..*sb };
        let decide = |sb: Option<&CacheSuper>, asked, k: &Option<Arc<LocalKeys>>| {
            plan(path, &meta(), sb, &config(asked, k.clone()))
                .map(|p| (p.key_id().is_some(), p.remake))
        };
        let k = Some(keys.clone());
        // New files: as asked; other commands (None) make them plain.
        assert_eq!(decide(None, Some(true), &k).expect("new"), (true, false));
        assert_eq!(decide(None, None, &k).expect("new"), (false, false));
        // Left by a crash: the file's mode, whatever is asked.
        assert_eq!(
            decide(Some(&plain), Some(true), &k).expect("crash"),
            (false, false)
        );
        assert_eq!(
            decide(Some(&encrypted), Some(false), &k).expect("crash"),
            (true, false)
        );
        assert_eq!(
            decide(Some(&encrypted), None, &k).expect("keep"),
            (true, false)
        );
        // Closed cleanly: made anew as asked.
        assert_eq!(
            decide(Some(&clean(&plain)), Some(true), &k).expect("clean"),
            (true, true)
        );
        assert_eq!(
            decide(Some(&clean(&encrypted)), Some(false), &k).expect("clean"),
            (false, true)
        );
        // Refusals: the flag on a plain volume, an encrypted log without keys or
        // with another volume's.
        let e = decide(None, Some(true), &None).expect_err("no keys");
        assert_eq!(e.kind, ErrorKind::BadInput);
        let e = decide(Some(&encrypted), None, &None).expect_err("no keys");
        assert_eq!(e.kind, ErrorKind::Denied);
        let e = decide(Some(&encrypted), Some(true), &Some(other)).expect_err("other key");
        assert_eq!(e.kind, ErrorKind::Corrupt);
    }
}
