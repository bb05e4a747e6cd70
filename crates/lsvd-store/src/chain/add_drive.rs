//! Growing a chain by one drive at the end (`lsvd chain add-drive`), offline.
//!
//! The drive list is not only in the URL: every drive record carries the drive
//! count, and open refuses a count other than the directories given. So adding a
//! drive rewrites the records, the way a tail move does: one generation more, the new
//! drive first (records of the set at generation g+1 saying n+1 drives), then every
//! old drive. The highest generation speaks for the set, so after a crash at any
//! point:
//!
//! * only the new drive written: the old URL still opens the old chain (the new
//!   directory is not given, the old records agree); the new URL opens the grown
//!   chain and finishes the add; running `add-drive` again finishes it too;
//! * some old drives written: the old URL is refused (a record says n+1 drives), the
//!   new URL opens and rewrites the records still saying n (`open.rs`).
//!
//! Only a chain: a stripe places every key by a hash of the drive count, so a new
//! drive would move every key.

use std::path::{Path, PathBuf};

use super::drives::DriveSpec;
use super::meta::{
    DRIVE_RECORD_NAME, DriveRecord, Layout, MAX_DRIVES, read_drive_record, write_drive_record,
};
use super::open::open_drives;
use crate::OpenMode;
use crate::fs::FsStore;
use lsvd_core::error::{Error, ErrorKind, Result};

/// What [`add_drive`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedDrive {
    /// The new drive's position (the old drive count).
    pub position: usize,
    /// The record the set now has (generation, drive count).
    pub record: DriveRecord,
    /// True if the new directory already held this set's record from an add that
    /// was interrupted.
    pub resumed: bool,
}

/// Append the drive `new_copies` (one directory, or two mirrored ones as the set's
/// drives are) to the chain `spec` names: checks the set as an open does, refuses a
/// degraded position (rebuild first) and a directory that holds anything but an
/// interrupted add of this very drive, then writes the records.
pub fn add_drive(spec: &DriveSpec, new_copies: &[PathBuf]) -> Result<AddedDrive> {
    let opened = open_drives(&spec.dirs, Layout::Chain, OpenMode::ReadWrite)?;
    let current = opened.current;
    let position = opened.drives.len();
    if let Some(d) = opened.drives.iter().find(|d| d.degraded()) {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "chain: drive {} ({}) has a copy out of service; run `lsvd chain rebuild` before adding a drive",
                d.index,
                d.describe()
            ),
        ));
    }
    if position + 1 > MAX_DRIVES {
        return Err(Error::bad_input(format!(
            "chain: it has {position} drives already, at most {MAX_DRIVES}"
        )));
    }
    if new_copies.len() != usize::from(current.copies) {
        return Err(Error::bad_input(if current.copies > 1 {
            "chain: its drives are mirrored: give the new one as DIR+MIRROR".to_string()
        } else {
            "chain: its drives are not mirrored: give the new one as one DIR".to_string()
        }));
    }
    let old: Vec<PathBuf> = spec
        .dirs
        .iter()
        .flatten()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .collect();
    let mut resumed = false;
    let mut seen = Vec::new();
    for dir in new_copies {
        FsStore::open(dir)?;
        let real = std::fs::canonicalize(dir)
            .map_err(|e| Error::local_io(format!("resolve {}", dir.display()), e))?;
        if old.contains(&real) || seen.contains(&real) {
            return Err(Error::bad_input(format!(
                "chain: {} is a drive of the chain already",
                dir.display()
            )));
        }
        seen.push(real);
        resumed |= check_blank(dir, &current, position)?;
    }
    let record = DriveRecord {
        generation: current.generation + 1,
        drive_count: (position + 1) as u16,
        mirror_stale: false,
        ..current
    };
    // The new drive first: until an old drive says n+1, the old URL still opens.
    for dir in new_copies {
        write_drive_record(
            dir,
            &DriveRecord {
                drive_index: position as u16,
                ..record
            },
        )?;
    }
    for d in &opened.drives {
        for c in &d.copies {
            write_drive_record(
                &c.dir,
                &DriveRecord {
                    drive_index: d.index as u16,
                    ..record
                },
            )?;
        }
    }
    crate::log::info(&format!(
        "chain: drive {position} ({}) added, {} drives, generation {}",
        new_copies
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join("+"),
        position + 1,
        record.generation
    ));
    Ok(AddedDrive {
        position,
        record,
        resumed,
    })
}

/// Refuse a new directory that holds keys, or a record other than this set's for
/// `position` from an interrupted add (true then: resuming).
fn check_blank(dir: &Path, current: &DriveRecord, position: usize) -> Result<bool> {
    let holds_keys = FsStore::open(dir)?
        .list_sync("")?
        .iter()
        .any(|e| e.key != DRIVE_RECORD_NAME);
    if holds_keys {
        return Err(Error::bad_input(format!(
            "chain: {} is not empty; give an empty directory for the new drive",
            dir.display()
        )));
    }
    match read_drive_record(dir)? {
        None => Ok(false),
        Some(r)
            if r.chain_id == current.chain_id
                && r.layout == Layout::Chain
                && usize::from(r.drive_index) == position
                && usize::from(r.drive_count) == position + 1 =>
        {
            Ok(true)
        }
        Some(_) => Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "chain: {} is a drive of another chain (it has a {DRIVE_RECORD_NAME}); give an empty directory",
                dir.display()
            ),
        )),
    }
}
