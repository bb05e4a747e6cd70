//! Opening a set of drives for the chained and striped stores: checking that the
//! directories are one set (their drive records agree), creating the records of a new
//! set, rebuilding a blank mirror copy from its sibling, recording tail moves.
//!
//! Refused: a drive of another set, of the other layout, a different drive count or
//! number of copies, a drive at another position, a blank directory where a drive of
//! a set that finished creation should be (with no mirror to rebuild it from), a
//! directory that holds objects but no record.
//!
//! Opened read-only ([`OpenMode::ReadOnly`], the read-only commands, which take no
//! lock and may run beside a live server) the same checks refuse the same sets, but
//! nothing is written: no directory or record created, no creation finished, no
//! interrupted `add-drive` record rewritten, no copy brought in step, no record
//! flagged. A mirror copy that a read-write open would bring in step (blank, missing,
//! or behind a sibling flagged `mirror_stale`) is left out of reads instead
//! ([`Copy::set_behind`]), with a warning saying what brings it in step; a set whose
//! directories are all blank reads as an empty store. Issue 40: `lsvd info`, `check`
//! and `inspect` resynced, and could delete, mirror keys under a live server.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::meta::{
    DRIVE_RECORD_NAME, DriveRecord, Layout, read_drive_record, write_atomically, write_drive_record,
};
use super::position::{Copy, Drive};
use crate::fs::FsStore;
use crate::{ListEntry, OpenMode};
use lsvd_core::error::{Error, ErrorKind, Result};

/// An opened set: the drives in order, the current record (highest generation) and
/// what each drive held at open.
pub struct OpenedDrives {
    pub drives: Vec<Drive>,
    pub current: DriveRecord,
    pub listings: Vec<Vec<ListEntry>>,
    /// One line per copy brought in step with its sibling at this open (a blank
    /// directory in place of a lost copy, a copy that was away), for `lsvd chain
    /// rebuild` to print.
    pub rebuilt: Vec<String>,
}

fn chain_id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Open every copy of every position. A mirrored copy that cannot be opened is left
/// out (degraded); a position with none is an error. Read-only, a missing directory
/// is not created: it opens as a blank one.
fn open_copies(positions: &[Vec<PathBuf>], layout: Layout, mode: OpenMode) -> Result<Vec<Drive>> {
    let read_only = mode == OpenMode::ReadOnly;
    let mut drives = Vec::with_capacity(positions.len());
    let mut canonical = HashSet::new();
    for (index, dirs) in positions.iter().enumerate() {
        let mut copies = Vec::with_capacity(dirs.len());
        let mut last_err = None;
        for dir in dirs {
            let opened = match mode {
                OpenMode::ReadWrite => FsStore::open(dir),
                OpenMode::ReadOnly => FsStore::open_read_only(dir),
            }
            .and_then(|s| match std::fs::canonicalize(dir) {
                Ok(real) => Ok((s, real)),
                // Not there (read-only: not created); `..` in it cannot be resolved.
                Err(e) if read_only && e.kind() == std::io::ErrorKind::NotFound => {
                    Ok((s, std::path::absolute(dir).unwrap_or_else(|_| dir.clone())))
                }
                Err(e) => Err(Error::local_io(format!("resolve {}", dir.display()), e)),
            });
            match opened {
                Ok((store, real)) => {
                    if !canonical.insert(real.clone()) {
                        return Err(Error::bad_input(format!(
                            "{}: directory {} given twice (as {})",
                            layout.name(),
                            real.display(),
                            dir.display()
                        )));
                    }
                    copies.push(Copy::new(dir.clone(), Some(store)));
                }
                Err(e) if dirs.len() > 1 => {
                    crate::log::warn(&format!(
                        "{}: copy {} of drive {index} cannot be opened ({e}); serving from its mirror (degraded)",
                        layout.name(),
                        dir.display()
                    ));
                    copies.push(Copy::new(dir.clone(), None));
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        if !copies.iter().any(Copy::is_live) {
            return Err(last_err.unwrap_or_else(|| Error::bad_input("a drive without directories")));
        }
        drives.push(Drive {
            index,
            copies,
            read_only,
        });
    }
    Ok(drives)
}

/// Open the directories as drives of one set of `layout`, creating the set if every
/// directory is blank and rebuilding a blank mirror copy from its sibling (read-write:
/// the commands that hold the data directory's lock, and `serve`). Read-only, the
/// same checks and nothing written (see the module documentation).
pub fn open_drives(
    positions: &[Vec<PathBuf>],
    layout: Layout,
    mode: OpenMode,
) -> Result<OpenedDrives> {
    let read_only = mode == OpenMode::ReadOnly;
    let drives = open_copies(positions, layout, mode)?;
    // Each live copy's record.
    let mut copy_records: Vec<Vec<(PathBuf, Option<DriveRecord>)>> = Vec::new();
    for d in &drives {
        let mut rs = Vec::new();
        for c in d.copies.iter().filter(|c| c.is_live()) {
            rs.push((c.dir.clone(), read_drive_record(&c.dir)?));
        }
        copy_records.push(rs);
    }
    let mut listings = Vec::with_capacity(drives.len());
    for d in &drives {
        listings.push(d.list_sync("")?);
    }
    let holds_keys: Vec<bool> = listings.iter().map(|l| !l.is_empty()).collect();
    let copies = positions.iter().map(Vec::len).max().unwrap_or(1) as u8;
    // The newest record (the first drive's among equals) speaks for the set.
    let newest = copy_records
        .iter()
        .enumerate()
        .flat_map(|(i, rs)| rs.iter().filter_map(move |(_, r)| r.map(|r| (i, r))))
        .max_by_key(|&(i, r)| (r.generation, std::cmp::Reverse(i)));
    let Some((_, current)) = newest else {
        // A new set, unless a directory already holds objects.
        if let Some(i) = holds_keys.iter().position(|&k| k) {
            return Err(Error::bad_input(format!(
                "{}: drive {} holds objects but no drive record ({DRIVE_RECORD_NAME}): \
                 not a drive of a chain or stripe (a plain store directory?); refusing to use it",
                layout.name(),
                drives[i].describe()
            )));
        }
        let creating = DriveRecord {
            chain_id: crate::clock::random_id_bytes(),
            generation: 0,
            layout,
            drive_count: drives.len() as u16,
            drive_index: 0,
            tail_index: 0,
            copies,
            mirror_stale: false,
        };
        // Read-only: an empty store, of a set that does not exist yet.
        let current = if read_only {
            creating
        } else {
            persist_records(&drives, &creating, None)?;
            finish_creation(&drives, &creating)?
        };
        return Ok(OpenedDrives {
            drives,
            current,
            listings,
            rebuilt: Vec::new(),
        });
    };
    // The set's record as written from here on (a copy's own flag stays its own).
    let current = DriveRecord {
        mirror_stale: false,
        ..current
    };
    let id = chain_id_hex(&current.chain_id);
    let name = layout.name();
    // Records an interrupted `add-drive` left behind: the set's, older, saying fewer
    // drives than the newest (which the directories given match). Rewritten below.
    let mut grown: Vec<(PathBuf, usize, bool, u16)> = Vec::new();
    for (i, rs) in copy_records.iter().enumerate() {
        for (dir, r) in rs {
            let Some(r) = r else { continue };
            if r.chain_id == current.chain_id
                && r.layout == layout
                && r.generation < current.generation
                && r.drive_count < current.drive_count
                && usize::from(current.drive_count) == drives.len()
                && r.copies == copies
                && usize::from(r.drive_index) == i
            {
                grown.push((dir.clone(), i, r.mirror_stale, r.drive_count));
                continue;
            }
            let dir = dir.display();
            if r.chain_id != current.chain_id {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{name}: {dir} is a drive of another set (id {}), not of {id}; refusing",
                        chain_id_hex(&r.chain_id)
                    ),
                ));
            }
            let problem = if r.layout != layout {
                Some(format!(
                    "{dir} is a drive of a {} (id {id}), opened as a {name}",
                    r.layout.name()
                ))
            } else if usize::from(r.drive_count) != drives.len() {
                Some(format!(
                    "set {id} has {} drives, {} given{}",
                    r.drive_count,
                    drives.len(),
                    if usize::from(r.drive_count) > drives.len() {
                        " (a drive was added with `lsvd chain add-drive`? give every drive, \
                         in order, as the --store it printed)"
                    } else {
                        ""
                    }
                ))
            } else if r.copies != copies {
                Some(format!(
                    "set {id} has {} copies per drive, {copies} given",
                    r.copies
                ))
            } else if usize::from(r.drive_index) != i {
                Some(format!(
                    "{dir} is drive {} of set {id}, given at position {i}: keep the order",
                    r.drive_index
                ))
            } else {
                None
            };
            if let Some(p) = problem {
                return Err(Error::bad_input(format!("{name}: {p}")));
            }
        }
    }
    for (dir, i, mirror_stale, was) in grown {
        if read_only {
            crate::log::warn(&format!(
                "{name}: {} still says {was} drives (an interrupted add-drive); opened \
                 read-only, so left as it is: `lsvd chain add-drive` or the next `lsvd serve` \
                 finishes it",
                dir.display()
            ));
            continue;
        }
        crate::log::warn(&format!(
            "{name}: {} still said {was} drives (an interrupted add-drive); now {}",
            dir.display(),
            current.drive_count
        ));
        write_drive_record(
            &dir,
            &DriveRecord {
                drive_index: i as u16,
                mirror_stale,
                ..current
            },
        )?;
    }
    // Generation 0 is a creation that has not finished: nothing was ever stored.
    let interrupted_creation = current.generation == 0 && !holds_keys.iter().any(|&k| k);
    let mut rebuilt = Vec::new();
    for (i, rs) in copy_records.iter().enumerate() {
        let flagged = |r: &Option<DriveRecord>| r.is_some_and(|r| r.mirror_stale);
        if rs.iter().filter(|(_, r)| flagged(r)).count() > 1 {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "{name}: both copies of drive {i} were written while the other was away; \
                     keep the one to trust (remove the other directory) and open again"
                ),
            ));
        }
        // The copy to copy from: the one that served alone, else any with a record.
        let source = rs
            .iter()
            .find(|(_, r)| flagged(r))
            .or_else(|| rs.iter().find(|(_, r)| r.is_some()))
            .map(|(d, _)| d.clone());
        let stale_mirror = rs.iter().any(|(_, r)| flagged(r));
        let mut synced = false;
        for (dir, r) in rs {
            let behind = r.is_none() || (stale_mirror && source.as_ref() != Some(dir));
            if !behind {
                continue;
            }
            if read_only {
                match (&source, interrupted_creation) {
                    (_, true) => {}
                    (Some(from), false) => {
                        crate::log::warn(&format!(
                            "{name}: copy {} of drive {i} is behind its mirror {} (blank, or \
                             it missed writes while away); opened read-only, so reading \
                             from {} alone: `lsvd chain rebuild` (servers stopped) or the \
                             next `lsvd serve` brings it in step",
                            dir.display(),
                            from.display(),
                            from.display()
                        ));
                        if let Some(c) = drives[i].copies.iter().find(|c| &c.dir == dir) {
                            c.set_behind();
                        }
                    }
                    (None, false) => {
                        return Err(Error::new(
                            ErrorKind::Conflict,
                            format!(
                                "{name}: {} has no drive record: it is not drive {i} of set \
                                 {id} (a missing or replaced drive?); refusing to read without it",
                                dir.display()
                            ),
                        ));
                    }
                }
                continue;
            }
            match (&source, interrupted_creation) {
                // A creation stopped halfway: nothing to copy, just the record.
                (_, true) => {}
                (Some(from), false) => match rebuild_copy(i, from, dir) {
                    Ok(line) => {
                        rebuilt.push(line);
                        synced = true;
                    }
                    // Still no room on the copy (it was dropped for that while
                    // serving): serve from the sibling, flagged, until room is made.
                    Err(e) if out_of_room(&e) && source.as_ref() != Some(dir) => {
                        crate::log::warn(&format!(
                            "{name}: copy {} of drive {i} cannot be brought in step ({e}); \
                             serving from {} (degraded) until it has room",
                            dir.display(),
                            source
                                .as_ref()
                                .map_or(String::new(), |s| s.display().to_string())
                        ));
                        if let Some(c) = drives[i].copies.iter().find(|c| &c.dir == dir) {
                            c.take_out();
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                (None, false) => {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "{name}: {} has no drive record: it is not drive {i} of set {id} \
                             (a missing or replaced drive?); refusing to serve without it",
                            dir.display()
                        ),
                    ));
                }
            }
            write_drive_record(
                dir,
                &DriveRecord {
                    drive_index: i as u16,
                    ..current
                },
            )?;
        }
        // In step again: the source's flag is cleared.
        if let (true, Some(from)) = (synced, &source) {
            write_drive_record(
                from,
                &DriveRecord {
                    drive_index: i as u16,
                    ..current
                },
            )?;
        }
    }
    // Served with a copy away from here on: what is written now, that copy misses.
    // (Read-only nothing is written, and nothing is marked.)
    for d in drives.iter().filter(|d| d.degraded()) {
        d.mark_mirror_stale();
    }
    let current = if current.generation == 0 && !read_only {
        finish_creation(&drives, &current)?
    } else {
        current
    };
    // Read-only, a copy left out of reads: its keys (deleted elsewhere since) are not
    // the position's.
    let listings = if read_only && drives.iter().any(Drive::degraded) {
        drives
            .iter()
            .map(|d| d.list_sync(""))
            .collect::<Result<Vec<_>>>()?
    } else {
        listings
    };
    Ok(OpenedDrives {
        drives,
        current,
        listings,
        rebuilt,
    })
}

/// The second step of creating a set: every drive has its generation-0 record; now
/// generation 1 marks the set complete. From then on a drive without a record is a
/// lost or replaced drive, never a creation stopped halfway.
fn finish_creation(drives: &[Drive], creating: &DriveRecord) -> Result<DriveRecord> {
    persist_records(
        drives,
        creating,
        Some((usize::from(creating.tail_index), 1)),
    )?;
    Ok(DriveRecord {
        generation: 1,
        ..*creating
    })
}

/// True if `e` says a filesystem has no room (`ENOSPC`, `EDQUOT`), whatever kind it
/// was given on the way.
fn out_of_room(e: &Error) -> bool {
    use std::error::Error as _;
    e.kind == ErrorKind::Full
        || e.source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| crate::fs::io_error_kind(io) == ErrorKind::Full)
}

/// Make the copy at `to` an exact copy of the copy at `from`: every key `from` lacks
/// deleted (first, so a copy that was full has its room back), then every key `to`
/// lacks (or holds with another size) copied. For a blank directory put in place of a
/// lost copy, and for a copy that was away (or full) while its mirror served alone:
/// it missed writes and deletes.
fn rebuild_copy(index: usize, from: &Path, to: &Path) -> Result<String> {
    let keys = FsStore::open(from)?.list_sync("")?;
    let wanted: HashSet<&str> = keys.iter().map(|e| e.key.as_str()).collect();
    let mut deleted = 0usize;
    for e in FsStore::open(to)?.list_sync("")? {
        if e.key != DRIVE_RECORD_NAME && !wanted.contains(e.key.as_str()) {
            let path = to.join(&e.key);
            match std::fs::remove_file(&path) {
                Ok(()) => deleted += 1,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(Error::local_io(format!("delete {}", path.display()), err));
                }
            }
        }
    }
    let mut copied = 0usize;
    for e in keys.iter().filter(|e| e.key != DRIVE_RECORD_NAME) {
        let target = to.join(&e.key);
        if std::fs::metadata(&target).is_ok_and(|m| m.len() == e.size_bytes) {
            continue;
        }
        let bytes = std::fs::read(from.join(&e.key))
            .map_err(|err| Error::local_io(format!("read {}", from.join(&e.key).display()), err))?;
        let dir = target.parent().unwrap_or(to);
        std::fs::create_dir_all(dir)
            .map_err(|err| Error::local_io(format!("create {}", dir.display()), err))?;
        write_atomically(dir, &target, &bytes)?;
        copied += 1;
    }
    let line = format!(
        "drive {index}: copy {} brought in step with {} ({copied} keys copied, {deleted} deleted)",
        to.display(),
        from.display()
    );
    crate::log::warn(&line);
    Ok(line)
}

/// Write `base` (with each copy's position, and `tail`/`generation` if given) to every
/// live copy; with a tail, the new tail drive first, so the highest generation
/// anywhere always names a drive that was made the tail.
fn persist_records(drives: &[Drive], base: &DriveRecord, tail: Option<(usize, u64)>) -> Result<()> {
    let first = tail.map_or(0, |(t, _)| t);
    let order = std::iter::once(first).chain((0..drives.len()).filter(|&i| i != first));
    for i in order {
        let mut r = DriveRecord {
            drive_index: i as u16,
            ..*base
        };
        if let Some((t, generation)) = tail {
            r.tail_index = t as u16;
            r.generation = generation;
        }
        r.mirror_stale = drives[i].degraded();
        for c in drives[i].copies.iter().filter(|c| c.is_live()) {
            write_drive_record(&c.dir, &r)?;
        }
    }
    Ok(())
}

/// Record the tail at `tail` with `generation` on every drive.
pub fn persist_tail(
    drives: &[Drive],
    base: &DriveRecord,
    tail: usize,
    generation: u64,
) -> Result<()> {
    persist_records(drives, base, Some((tail, generation)))
}
