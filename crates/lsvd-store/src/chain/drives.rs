//! The URL of a chained or striped store, and small helpers both share.
//!
//! Parsing refuses the same mistakes for both layouts: no directories, an empty name,
//! a directory given twice, more than two copies of a position, unknown options.

use std::collections::HashSet;
use std::path::PathBuf;

use super::meta::MAX_DRIVES;
use super::position::Drive;
use lsvd_core::error::{Error, Result};

/// Where GC output goes in a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcPlacement {
    /// To the body: the drive its victims are on, else another drive that is not the
    /// tail, so the tail drive sees client writes only (Gecko's compact-in-body).
    CompactInBody,
    /// To the tail, like client data (Gecko's move-to-tail).
    MoveToTail,
}

/// What a `chain:` or `stripe:` URL says (after the scheme).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveSpec {
    /// Per position, its directory, or its two mirrored directories.
    pub dirs: Vec<Vec<PathBuf>>,
    /// Bytes each drive may hold (chain); None: the free space of its filesystem.
    pub drive_size_bytes: Option<u64>,
    pub gc: GcPlacement,
}

const USAGE: &str =
    "DIR0[+MIRROR0],DIR1[+MIRROR1][,...][?drive_size=SIZE&gc=compact-in-body|move-to-tail]";

/// Parse `DIR0[+MIRROR0],DIR1[+MIRROR1][,...][?drive_size=SIZE&gc=...]`. Options apply
/// to `chain:` only. Every mistake is `BadInput` naming the URL form.
pub fn parse_spec(scheme: &str, spec: &str) -> Result<DriveSpec> {
    let bad =
        |why: String| Error::bad_input(format!("{scheme}:{spec}: {why} (use {scheme}:{USAGE})"));
    let (list, options) = match spec.split_once('?') {
        Some((l, o)) => (l, Some(o)),
        None => (spec, None),
    };
    if list.trim().is_empty() {
        return Err(bad("no directories".into()));
    }
    let mut dirs = Vec::new();
    for position in list.split(',') {
        let copies: Vec<PathBuf> = position.split('+').map(PathBuf::from).collect();
        if copies.iter().any(|c| c.as_os_str().is_empty()) {
            return Err(bad("an empty directory name".into()));
        }
        if copies.len() > 2 {
            return Err(bad(format!("{position}: at most two copies of a drive")));
        }
        dirs.push(copies);
    }
    if dirs.iter().any(|c| c.len() != dirs[0].len()) {
        return Err(bad("mirror every drive or none".into()));
    }
    if dirs.len() > MAX_DRIVES {
        return Err(bad(format!("{} drives, at most {MAX_DRIVES}", dirs.len())));
    }
    let mut seen = HashSet::new();
    for d in dirs.iter().flatten() {
        if !seen.insert(d.clone()) {
            return Err(bad(format!("directory {} given twice", d.display())));
        }
    }
    let mut out = DriveSpec {
        dirs,
        drive_size_bytes: None,
        gc: GcPlacement::CompactInBody,
    };
    for opt in options.into_iter().flat_map(|o| o.split('&')) {
        let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
        match (scheme, name) {
            ("chain", "drive_size") => {
                let n = lsvd_core::size::parse_size(value)?;
                if n == 0 {
                    return Err(bad("drive_size must be more than 0".into()));
                }
                out.drive_size_bytes = Some(n);
            }
            ("chain", "gc") => {
                out.gc = match value {
                    "compact-in-body" => GcPlacement::CompactInBody,
                    "move-to-tail" => GcPlacement::MoveToTail,
                    _ => return Err(bad(format!("unknown gc placement '{value}'"))),
                }
            }
            _ => return Err(bad(format!("unknown option '{opt}'"))),
        }
    }
    Ok(out)
}

/// The set as a URL without options, for `describe`.
pub fn describe(scheme: &str, drives: &[Drive]) -> String {
    let dirs: Vec<String> = drives.iter().map(Drive::describe).collect();
    format!("{scheme}:{}", dirs.join(","))
}
