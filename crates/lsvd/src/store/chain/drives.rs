//! Opening a set of drives for the chained and striped stores: parsing the URL,
//! checking that the directories are one set (their drive records agree), creating the
//! records of a new set, and listing what each drive holds.
//!
//! Shared by both layouts so they refuse the same mistakes the same way: no
//! directories, a directory given twice, a drive of another set, a drive at another
//! position, a blank directory where a drive with objects should be.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::meta::{
    DRIVE_RECORD_NAME, DriveRecord, Layout, MAX_DRIVES, read_drive_record, write_drive_record,
};
use crate::error::{Error, ErrorKind, Result};
use crate::store::ListEntry;
use crate::store::fs::FsStore;

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
    pub dirs: Vec<PathBuf>,
    /// Bytes each drive may hold (chain); None: the free space of its filesystem.
    pub drive_size_bytes: Option<u64>,
    pub gc: GcPlacement,
}

const USAGE: &str = "DIR0,DIR1[,...][?drive_size=SIZE&gc=compact-in-body|move-to-tail]";

/// Parse `DIR0,DIR1[,...][?drive_size=SIZE&gc=compact-in-body|move-to-tail]`. Options
/// apply to `chain:` only. Every mistake is `BadInput` naming the URL form.
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
    for d in list.split(',') {
        if d.is_empty() {
            return Err(bad("an empty directory name".into()));
        }
        dirs.push(PathBuf::from(d));
    }
    if dirs.len() > MAX_DRIVES {
        return Err(bad(format!(
            "{} directories, at most {MAX_DRIVES}",
            dirs.len()
        )));
    }
    let mut seen = HashSet::new();
    for d in &dirs {
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
                let n = crate::size::parse_size(value)?;
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

/// One drive: its directory and the local store over it.
pub struct Drive {
    pub dir: PathBuf,
    pub store: FsStore,
}

/// An opened set: the drives in order, the current record (highest generation) and
/// what each drive held at open.
pub struct OpenedDrives {
    pub drives: Vec<Drive>,
    pub current: DriveRecord,
    pub listings: Vec<Vec<ListEntry>>,
}

/// 16 random bytes for a new set's id (from /dev/urandom; the clock and the pid if
/// that cannot be read).
fn random_chain_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut id).is_ok() {
            return id;
        }
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes()
}

fn chain_id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// What drive `i` holds (its listing without the drive record).
pub fn list_drive(drive: &Drive, prefix: &str) -> Result<Vec<ListEntry>> {
    let mut entries = drive.store.list_sync(prefix)?;
    entries.retain(|e| e.key != DRIVE_RECORD_NAME);
    Ok(entries)
}

/// Open the directories as drives of one set of `layout`, creating the set if every
/// directory is blank. Refuses (`BadInput`, `Corrupt` or `Conflict`) anything that is
/// not the same set in the same order.
pub fn open_drives(dirs: &[PathBuf], layout: Layout) -> Result<OpenedDrives> {
    let mut drives = Vec::with_capacity(dirs.len());
    let mut canonical = HashSet::new();
    for dir in dirs {
        let store = FsStore::open(dir)?;
        let real = std::fs::canonicalize(dir)
            .map_err(|e| Error::local_io(format!("resolve {}", dir.display()), e))?;
        if !canonical.insert(real.clone()) {
            return Err(Error::bad_input(format!(
                "{}: directory {} given twice (as {})",
                layout.name(),
                real.display(),
                dir.display()
            )));
        }
        drives.push(Drive {
            dir: dir.clone(),
            store,
        });
    }
    let mut records = Vec::with_capacity(drives.len());
    for d in &drives {
        records.push(read_drive_record(&d.dir)?);
    }
    let mut listings = Vec::with_capacity(drives.len());
    for d in &drives {
        listings.push(list_drive(d, "")?);
    }
    let holds_keys: Vec<bool> = listings.iter().map(|l| !l.is_empty()).collect();
    // The newest record (the first drive's among equals) speaks for the set.
    let newest = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|r| (i, r)))
        .max_by_key(|&(i, r)| (r.generation, std::cmp::Reverse(i)));
    let Some((_, current)) = newest else {
        // A new set, unless a directory already holds objects.
        if let Some(i) = holds_keys.iter().position(|&k| k) {
            return Err(Error::bad_input(format!(
                "{}: directory {} holds objects but no drive record ({DRIVE_RECORD_NAME}): \
                 not a drive of a chain or stripe (a plain store directory?); refusing to use it",
                layout.name(),
                drives[i].dir.display()
            )));
        }
        let current = DriveRecord {
            chain_id: random_chain_id(),
            generation: 0,
            layout,
            drive_count: drives.len() as u16,
            drive_index: 0,
            tail_index: 0,
        };
        for (i, d) in drives.iter().enumerate() {
            write_drive_record(
                &d.dir,
                &DriveRecord {
                    drive_index: i as u16,
                    ..current
                },
            )?;
        }
        return Ok(OpenedDrives {
            drives,
            current,
            listings,
        });
    };
    let id = chain_id_hex(&current.chain_id);
    for (i, (d, r)) in drives.iter().zip(&records).enumerate() {
        let Some(r) = r else { continue };
        if r.chain_id != current.chain_id {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "{}: {} is a drive of another set (id {}), not of {id}; refusing",
                    layout.name(),
                    d.dir.display(),
                    chain_id_hex(&r.chain_id)
                ),
            ));
        }
        if r.layout != layout {
            return Err(Error::bad_input(format!(
                "{}: {} is a drive of a {} (id {id}), opened as a {}",
                layout.name(),
                d.dir.display(),
                r.layout.name(),
                layout.name()
            )));
        }
        if usize::from(r.drive_count) != drives.len() {
            return Err(Error::bad_input(format!(
                "{}: set {id} has {} drives, {} given",
                layout.name(),
                r.drive_count,
                drives.len()
            )));
        }
        if usize::from(r.drive_index) != i {
            return Err(Error::bad_input(format!(
                "{}: {} is drive {} of set {id}, given at position {i}: keep the order",
                layout.name(),
                d.dir.display(),
                r.drive_index
            )));
        }
    }
    let missing: Vec<usize> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.is_none().then_some(i))
        .collect();
    if !missing.is_empty() {
        // Only a creation stopped halfway leaves drives without a record: then nothing
        // has moved the tail and no drive holds anything. Anything else is a blank or
        // foreign directory in place of a drive, and serving would lose its objects.
        let interrupted_creation = current.generation == 0 && !holds_keys.iter().any(|&k| k);
        if !interrupted_creation {
            let i = missing[0];
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "{}: {} has no drive record: it is not drive {i} of set {id} \
                     (a missing or replaced drive?); refusing to serve without it",
                    layout.name(),
                    drives[i].dir.display()
                ),
            ));
        }
        for i in missing {
            write_drive_record(
                &drives[i].dir,
                &DriveRecord {
                    drive_index: i as u16,
                    ..current
                },
            )?;
        }
    }
    Ok(OpenedDrives {
        drives,
        current,
        listings,
    })
}

/// Record the tail at `tail` with `generation` on every drive: the new tail first, so
/// the highest generation anywhere always names a drive that was made the tail.
pub fn persist_tail(
    drives: &[Drive],
    base: &DriveRecord,
    tail: usize,
    generation: u64,
) -> Result<()> {
    let order = std::iter::once(tail).chain((0..drives.len()).filter(|&i| i != tail));
    for i in order {
        write_drive_record(
            &drives[i].dir,
            &DriveRecord {
                drive_index: i as u16,
                tail_index: tail as u16,
                generation,
                ..*base
            },
        )?;
    }
    Ok(())
}

/// Where `dir` is, for `describe`.
pub fn describe(scheme: &str, drives: &[Drive]) -> String {
    let dirs: Vec<String> = drives.iter().map(|d| d.dir.display().to_string()).collect();
    format!("{scheme}:{}", dirs.join(","))
}

/// Bytes free for unprivileged writers on the filesystem holding `dir` (0 if it
/// cannot be asked).
pub fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}
