//! `lsvd export` and `lsvd import`: a volume (or snapshot) to a raw image and back.
//!
//! Why here and this way: a raw image is what every other tool reads (qemu-img, dd,
//! another lsvd), so it is the way out of lsvd and the way in. Both stream a chunk at
//! a time (memory stays at one chunk whatever the size), and both keep holes holes:
//! export asks the volume's map which ranges were ever written and reads only those
//! (a file gets a hole for the rest; a pipe gets zeros), import writes only the 4 KiB
//! blocks that are not all zero, into a volume that was never written.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::size::format_size;
use lsvd_engine::{EngineConfig, Volume};

use super::Common;
use super::progress::Progress;

/// Bytes read or written at a time.
const CHUNK_BYTES: u64 = 1 << 20;
const BLOCK_BYTES: usize = 4096;

/// Where an export goes.
enum Sink {
    /// A file or block device: holes are skipped (the file is made sparse).
    File(File),
    /// Standard output: every byte is written, zeros included.
    Stdout(std::io::Stdout),
}

impl Sink {
    /// Refuse an existing regular file (before anything is opened).
    fn check(out: &str) -> Result<()> {
        if out != "-" && std::fs::metadata(out).is_ok_and(|m| m.is_file()) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{out} exists: remove it first, or export to another name"),
            ));
        }
        Ok(())
    }

    fn open(out: &str) -> Result<Sink> {
        Sink::check(out)?;
        if out == "-" {
            return Ok(Sink::Stdout(std::io::stdout()));
        }
        let path = Path::new(out);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::local_io(format!("cannot create {out}"), e))?;
        Ok(Sink::File(file))
    }

    fn write(&mut self, data: &[u8], offset: u64) -> Result<()> {
        match self {
            Sink::File(f) => f.write_all_at(data, offset),
            Sink::Stdout(s) => s.lock().write_all(data),
        }
        .map_err(|e| Error::local_io("cannot write the image", e))
    }

    /// `len` bytes of zeros at `offset`: nothing for a file (a hole, or the device's
    /// own bytes past what is written: see `finish`), zeros for a pipe.
    fn zeros(&mut self, len: u64, offset: u64) -> Result<()> {
        match self {
            Sink::File(_) => Ok(()),
            Sink::Stdout(_) => self.write(&vec![0u8; len as usize], offset),
        }
    }

    /// A regular file gets its full size (the holes at its end); a device keeps its.
    fn finish(&mut self, size_bytes: u64) -> Result<()> {
        let done = match self {
            Sink::File(f) => {
                let meta = f.metadata();
                if meta.as_ref().is_ok_and(|m| m.is_file()) {
                    f.set_len(size_bytes).and_then(|()| f.sync_all())
                } else {
                    f.sync_all()
                }
            }
            Sink::Stdout(s) => s.lock().flush(),
        };
        done.map_err(|e| Error::local_io("cannot finish the image", e))
    }
}

/// The scratch directory a snapshot export opens its snapshot in: `data/.export-PID-WHAT`,
/// removed when it ends. One left by an export that was killed (its process gone) is
/// removed first.
pub(super) fn scratch_dir(data: &Path, what: &str) -> std::path::PathBuf {
    remove_stale_scratch(data);
    data.join(format!(".export-{}-{what}", std::process::id()))
}

/// Remove `.export-PID-*` directories under `data` whose process no longer runs.
fn remove_stale_scratch(data: &Path) {
    let Ok(entries) = std::fs::read_dir(data) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(".export-")) else {
            continue;
        };
        let Some(pid) = rest
            .split_once('-')
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        // SAFETY: kill with signal 0 sends nothing; it only asks whether `pid` exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Refuse to write over an existing regular file `out`.
pub(super) fn refuse_existing(out: &str) -> Result<()> {
    Sink::check(out)
}

/// `lsvd export VOL[@SNAP] OUT`.
pub async fn export(common: &Common, source: &str, out: &str, quiet: bool) -> Result<()> {
    let (volume, snapshot) = lsvd_engine::split_export_name(source);
    lsvd_engine::keys::validate_volume_name(volume)?;
    Sink::check(out)?;
    match snapshot {
        // A snapshot never changes: it is read beside a server that serves the volume,
        // from a data directory of its own (removed afterwards).
        Some(snap) => {
            with_snapshot(common, volume, snap, source, async |vol| {
                copy_out(vol, out, source, quiet).await
            })
            .await
        }
        None => {
            super::snapshot::with_volume(common, volume, async |vol| {
                copy_out(vol, out, source, quiet).await
            })
            .await
        }
    }
}

/// Open snapshot `snap` of `volume` read-only and run `f` on it. A snapshot never
/// changes, so it is read beside a server that serves the volume, from a scratch data
/// directory of its own (`what` names it), removed afterwards.
pub(super) async fn with_snapshot<T>(
    common: &Common,
    volume: &str,
    snap: &str,
    what: &str,
    f: impl AsyncFnOnce(&Volume) -> Result<T>,
) -> Result<T> {
    let store = super::admin::store(common)?;
    let unlocked = super::admin::unlocked(common, &store, volume).await?;
    let scratch = scratch_dir(&common.data, what);
    let config = EngineConfig {
        log_size_bytes: lsvd_engine::MIN_LOG_SIZE_BYTES,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    };
    let opened = lsvd_engine::open_snapshot(unlocked, volume, snap, &scratch, config).await;
    let result = match opened {
        Ok((vol, _)) => {
            let done = f(&vol).await;
            let _ = vol.shutdown().await;
            done
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Write `vol` to `out` (made only now that the volume is open).
async fn copy_out(vol: &Volume, out: &str, what: &str, quiet: bool) -> Result<()> {
    let mut sink = Sink::open(out)?;
    let sink = &mut sink;
    let size = vol.size_bytes();
    let mut progress = Progress::new(format!("export {what}"), size, quiet);
    let mut data_bytes = 0u64;
    let mut at = 0u64;
    while at < size {
        let len = CHUNK_BYTES.min(size - at);
        let written = vol.allocation(at, len)?.iter().any(|&(_, a)| a);
        if !written {
            sink.zeros(len, at)?;
        } else {
            let data = vol.read(at, len).await?;
            // Blocks written but zero (or zeroed) stay holes in a file too.
            for (i, block) in data.chunks(BLOCK_BYTES).enumerate() {
                let offset = at + (i * BLOCK_BYTES) as u64;
                if block.iter().all(|&b| b == 0) {
                    sink.zeros(block.len() as u64, offset)?;
                } else {
                    sink.write(block, offset)?;
                    data_bytes += block.len() as u64;
                }
            }
        }
        at += len;
        progress.update(at);
    }
    sink.finish(size)?;
    progress.finish(
        size,
        &format!(
            "{} exported, {} of it data (the rest reads as zeros)",
            format_size(size),
            format_size(data_bytes)
        ),
    );
    Ok(())
}

/// `lsvd import IN NAME`: a new volume `name` holding the raw image `input` (a file,
/// or `-` for standard input, which needs `size`).
pub async fn import(
    common: &Common,
    input: &str,
    name: &str,
    size: Option<&str>,
    compression: Option<lsvd_core::compression::Compression>,
    encrypt: bool,
    quiet: bool,
) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(name)?;
    let (mut source, input_bytes) = if input == "-" {
        (Source::Stream(Box::new(std::io::stdin()), 0), None)
    } else {
        let f =
            File::open(input).map_err(|e| Error::local_io(format!("cannot open {input}"), e))?;
        let len = f
            .metadata()
            .map_err(|e| Error::local_io(format!("cannot stat {input}"), e))?
            .len();
        (
            Source::File {
                file: f,
                len,
                at: 0,
                data_end: 0,
            },
            Some(len),
        )
    };
    let size_bytes = match (size, input_bytes) {
        (Some(s), _) => lsvd_core::size::parse_size(s)?,
        (None, Some(len)) => len.div_ceil(BLOCK_BYTES as u64) * BLOCK_BYTES as u64,
        (None, None) => {
            return Err(Error::bad_input(
                "importing from standard input needs --size (the volume's size)",
            ));
        }
    };
    if let Some(len) = input_bytes
        && len > size_bytes
    {
        return Err(Error::bad_input(format!(
            "{input} is {} but --size is {}: give a size at least as large",
            format_size(len),
            format_size(size_bytes)
        )));
    }
    super::admin::create(common, name, &size_bytes.to_string(), compression, encrypt).await?;
    let what = format!("import {name}");
    let copied = super::snapshot::with_volume(common, name, async |vol| {
        copy_in(vol, &mut source, size_bytes, &what, quiet).await
    })
    .await;
    copied.map_err(|e| {
        Error::new(
            e.kind,
            format!(
                "{}; volume '{name}' was created and holds part of the image: delete it \
                 (lsvd delete {name} --yes) and import again",
                e.message
            ),
        )
    })
}

async fn copy_in(
    vol: &Volume,
    source: &mut Source,
    size_bytes: u64,
    what: &str,
    quiet: bool,
) -> Result<()> {
    let mut progress = Progress::new(what, size_bytes, quiet);
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let (mut end, mut data_bytes) = (0u64, 0u64);
    while let Some((at, n)) = source.next_chunk(&mut buf)? {
        if at + n as u64 > size_bytes {
            return Err(Error::bad_input(format!(
                "the input is longer than --size {}",
                format_size(size_bytes)
            )));
        }
        // A short last block is padded with zeros (the volume is whole blocks).
        let padded = n.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        buf[n..padded].fill(0);
        // Runs of blocks that are not all zero, written as one request each.
        let mut i = 0;
        while i < padded {
            let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
            if zero(&buf[i..i + BLOCK_BYTES]) {
                i += BLOCK_BYTES;
                continue;
            }
            let start = i;
            while i < padded && !zero(&buf[i..i + BLOCK_BYTES]) {
                i += BLOCK_BYTES;
            }
            wait_for_log_room(vol).await;
            vol.write(at + start as u64, buf[start..i].to_vec(), false)
                .await?;
            data_bytes += (i - start) as u64;
        }
        end = at + n as u64;
        progress.update(end);
    }
    let read = source.len().unwrap_or(end);
    vol.flush().await?;
    progress.finish(
        read,
        &format!(
            "{} read, {} of it data written (zero blocks and holes skipped)",
            format_size(read),
            format_size(data_bytes)
        ),
    );
    Ok(())
}

/// Where an import reads from.
enum Source {
    /// Standard input: read front to back; the offset reached.
    Stream(Box<dyn Read + Send>, u64),
    /// A file: only its data is read, its holes skipped (`SEEK_DATA`/`SEEK_HOLE`;
    /// where the file system cannot say, all of it is data).
    File {
        file: File,
        len: u64,
        /// The next byte to read.
        at: u64,
        /// Where the data run being read ends (a hole or the end of the file).
        data_end: u64,
    },
}

impl Source {
    fn len(&self) -> Option<u64> {
        match self {
            Source::Stream(..) => None,
            Source::File { len, .. } => Some(*len),
        }
    }

    /// The next chunk of the input: its offset and how many bytes of `buf` it filled
    /// (whole 4 KiB blocks, except at the end of the input); `None` at the end.
    fn next_chunk(&mut self, buf: &mut [u8]) -> Result<Option<(u64, usize)>> {
        match self {
            Source::Stream(reader, at) => {
                let n = read_full(reader.as_mut(), buf)?;
                let chunk = (n > 0).then_some((*at, n));
                *at += n as u64;
                Ok(chunk)
            }
            Source::File {
                file,
                len,
                at,
                data_end,
            } => {
                if *at >= *data_end {
                    let Some((start, end)) = next_data(file, *at, *len) else {
                        return Ok(None);
                    };
                    (*at, *data_end) = (start, end);
                }
                let n = (buf.len() as u64).min(*data_end - *at) as usize;
                file.read_exact_at(&mut buf[..n], *at)
                    .map_err(|e| Error::local_io("cannot read the image", e))?;
                let chunk = (*at, n);
                *at += n as u64;
                Ok(Some(chunk))
            }
        }
    }
}

/// The next run of data in `file` at or after `from` (4 KiB aligned, `from` is),
/// as (start, end): the file system's data runs widened to whole blocks, the whole
/// rest of the file where it cannot say. `None` past the last data.
fn next_data(file: &File, from: u64, len: u64) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    if from >= len {
        return None;
    }
    let fd = file.as_raw_fd();
    let block = BLOCK_BYTES as u64;
    // SAFETY: lseek on a descriptor this function borrows; no memory is passed.
    let data = unsafe { libc::lseek(fd, from as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            // No data at or after `from`.
            Some(libc::ENXIO) => None,
            // SEEK_DATA not supported here: read everything.
            _ => Some((from, len)),
        };
    }
    let start = (data as u64 / block * block).max(from);
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    let end = if hole < 0 {
        len
    } else {
        (hole as u64).div_ceil(block).saturating_mul(block).min(len)
    };
    Some(if end > start {
        (start, end)
    } else {
        (start, len)
    })
}

/// Keep room for two more chunks in the write log: an import writes faster than
/// objects upload, and a write that found the log full would wait and warn, as a
/// client of a busy server does (the bulk copy paces itself instead).
pub(super) async fn wait_for_log_room(vol: &Volume) {
    use lsvd_store::clock::Clock;
    let clock = lsvd_store::clock::SystemClock::new();
    loop {
        let s = vol.status();
        if s.log_used_bytes + 2 * CHUNK_BYTES <= s.log_capacity_bytes || s.failure.is_some() {
            return;
        }
        clock.sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Fill `buf` from `reader` (short only at the end of the input).
fn read_full(reader: &mut (dyn Read + Send), buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::local_io("cannot read the image", e)),
        }
    }
    Ok(n)
}
