//! Offline repair of the mirrored positions of a chain or stripe (`lsvd chain
//! rebuild`): every key missing from one copy, or bad in one copy and good in the
//! other, is copied from the good copy.
//!
//! It exists because the store repairs copies only on the way: a read that finds a copy
//! missing writes it back, an engine read whose bytes fail their checksums has the bad
//! copy rewritten, and an open rebuilds a blank directory (or a copy that was away)
//! from its sibling. A copy nothing reads stays bad. This pass visits every key of
//! every mirrored position once, with the server stopped.
//!
//! The store does not know the engine's formats, so which copy is good is asked of a
//! verifier the caller gives (the CLI checks object CRCs and the CRCs of the metadata
//! records). A key present in one copy only is copied to the other (never deleted:
//! whether the other copy missed a put or a delete cannot be told here, and keeping
//! an extra key costs space, never data; the engine deletes what it no longer needs).

use std::collections::BTreeSet;
use std::path::Path;

use super::drives::DriveSpec;
use super::meta::{DRIVE_RECORD_NAME, Layout, write_atomically};
use super::open::open_drives;
use super::position::Drive;
use crate::OpenMode;
use crate::fs::FsStore;
use lsvd_core::error::{Error, Result};

/// What a verifier says of one copy's bytes of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// They pass the checks of the key's format.
    Good,
    /// They fail them (why).
    Bad(String),
    /// The key has no checks the verifier knows.
    Unknown,
}

/// What a rebuild did and could not do.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// Mirrored positions visited.
    pub positions: usize,
    /// Keys compared (over all positions).
    pub keys: usize,
    /// One line per repair (a copy rebuilt at open, a key copied).
    pub repaired: Vec<String>,
    /// One line per key or copy left as it was: no good copy, copies that differ
    /// with no way to tell which is right, a copy that cannot be opened.
    pub unresolved: Vec<String>,
}

/// Open the set `spec` names (checking its drive records, rebuilding a blank copy
/// from its sibling as every open does) and bring the two copies of each mirrored
/// position in step, key by key, with `verify` deciding which copy is good.
pub fn rebuild(
    spec: &DriveSpec,
    layout: Layout,
    verify: &dyn Fn(&str, &[u8]) -> Verdict,
) -> Result<RebuildReport> {
    let opened = open_drives(&spec.dirs, layout, OpenMode::ReadWrite)?;
    let mut report = RebuildReport {
        repaired: opened.rebuilt,
        ..RebuildReport::default()
    };
    for drive in opened.drives.iter().filter(|d| d.copies.len() > 1) {
        report.positions += 1;
        if drive.degraded() {
            let out: Vec<String> = drive
                .copies
                .iter()
                .filter(|c| !c.is_live())
                .map(|c| c.dir.display().to_string())
                .collect();
            report.unresolved.push(format!(
                "drive {}: copy {} cannot be opened (see the warning above): make the directory usable, or replace it with an empty one, and run again",
                drive.index,
                out.join(", ")
            ));
            continue;
        }
        resync_position(drive, verify, &mut report)?;
        // In step now: the same keys, of the same sizes (the bytes were compared above).
        let listings = [
            list_copy(&drive.copies[0].dir)?,
            list_copy(&drive.copies[1].dir)?,
        ];
        if listings[0] != listings[1] {
            report.unresolved.push(format!(
                "drive {}: the copies {} and {} still hold different keys after the rebuild (written to meanwhile? stop every server using the chain and run again)",
                drive.index,
                drive.copies[0].dir.display(),
                drive.copies[1].dir.display()
            ));
        }
    }
    Ok(report)
}

/// Every key of the copy at `dir` but the drive record, with its size.
fn list_copy(dir: &Path) -> Result<Vec<(String, u64)>> {
    let mut keys: Vec<(String, u64)> = FsStore::open(dir)?
        .list_sync("")?
        .into_iter()
        .filter(|e| e.key != DRIVE_RECORD_NAME)
        .map(|e| (e.key, e.size_bytes))
        .collect();
    keys.sort();
    Ok(keys)
}

/// Every key of either copy of `drive` (two live copies) compared and, where one
/// copy is missing or bad and the other good, repaired.
fn resync_position(
    drive: &Drive,
    verify: &dyn Fn(&str, &[u8]) -> Verdict,
    report: &mut RebuildReport,
) -> Result<()> {
    let dirs = [drive.copies[0].dir.as_path(), drive.copies[1].dir.as_path()];
    let mut keys = BTreeSet::new();
    for dir in dirs {
        keys.extend(list_copy(dir)?.into_iter().map(|(key, _)| key));
    }
    let position = drive.index;
    for key in keys {
        report.keys += 1;
        let bytes = [read_key(dirs[0], &key)?, read_key(dirs[1], &key)?];
        match (&bytes[0], &bytes[1]) {
            (None, None) => {} // deleted while listing: nothing to do
            (Some(a), Some(b)) if a == b => {
                if let Verdict::Bad(why) = verify(&key, a) {
                    report.unresolved.push(format!(
                        "drive {position}: {key}: both copies fail their checks ({why}); no good copy to rebuild from"
                    ));
                }
            }
            (Some(_), None) | (None, Some(_)) => {
                let from = usize::from(bytes[0].is_none());
                let data = bytes[from].as_deref().unwrap_or_default();
                if let Verdict::Bad(why) = verify(&key, data) {
                    report.unresolved.push(format!(
                        "drive {position}: {key}: missing from {} and bad in {} ({why}); no good copy to rebuild from",
                        dirs[1 - from].display(),
                        dirs[from].display()
                    ));
                    continue;
                }
                copy_key(dirs[1 - from], &key, data)?;
                report.repaired.push(format!(
                    "drive {position}: {key}: missing from {}, copied from {}",
                    dirs[1 - from].display(),
                    dirs[from].display()
                ));
            }
            (Some(a), Some(b)) => {
                let verdicts = [verify(&key, a), verify(&key, b)];
                let good = match &verdicts {
                    [Verdict::Bad(_), Verdict::Good] => Some(1),
                    [Verdict::Good, Verdict::Bad(_)] => Some(0),
                    _ => None,
                };
                let Some(good) = good else {
                    let why = match &verdicts {
                        [Verdict::Bad(x), Verdict::Bad(y)] => {
                            format!("both fail their checks ({x}; {y})")
                        }
                        [Verdict::Good, Verdict::Good] => "both pass their checks".to_string(),
                        _ => "lsvd knows no checks for this key".to_string(),
                    };
                    report.unresolved.push(format!(
                        "drive {position}: {key}: the copies in {} and {} differ and {why}; cannot tell which to keep (remove the wrong file and run again)",
                        dirs[0].display(),
                        dirs[1].display()
                    ));
                    continue;
                };
                let bad = 1 - good;
                copy_key(dirs[bad], &key, bytes[good].as_deref().unwrap_or_default())?;
                let why = match &verdicts[bad] {
                    Verdict::Bad(why) => why.clone(),
                    _ => String::new(),
                };
                report.repaired.push(format!(
                    "drive {position}: {key}: bad in {} ({why}), rewritten from {}",
                    dirs[bad].display(),
                    dirs[good].display()
                ));
            }
        }
    }
    Ok(())
}

/// The bytes of `key` in the copy at `dir`; None if it lacks it.
fn read_key(dir: &Path, key: &str) -> Result<Option<Vec<u8>>> {
    let path = dir.join(key);
    match std::fs::read(&path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::local_io(format!("read {}", path.display()), e)),
    }
}

/// Put `bytes` as `key` in the copy at `dir`, replacing what is there atomically.
fn copy_key(dir: &Path, key: &str, bytes: &[u8]) -> Result<()> {
    let target = dir.join(key);
    let parent = target.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::local_io(format!("create {}", parent.display()), e))?;
    write_atomically(parent, &target, bytes)
}
