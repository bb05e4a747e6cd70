//! The cache device: a local file (or block device) holding the write log.
//!
//! A narrow trait so tests can substitute a device that loses unsynced writes on a
//! simulated power failure. Positional I/O only; `sync` is `fdatasync`.

pub mod faulty;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub trait CacheDevice: Send + Sync + 'static {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    fn size_bytes(&self) -> u64;
}

pub struct FileCache {
    file: File,
    size_bytes: u64,
}

impl FileCache {
    /// Open `path`, creating and preallocating it to `size_bytes` if it does not exist.
    /// An existing file keeps its size.
    ///
    /// Preallocation is what makes a full filesystem harmless to a running volume: every
    /// block of the file is allocated before it serves. If the filesystem has no room
    /// (ENOSPC) the new file is removed and the error returned; only a filesystem that
    /// cannot preallocate at all gets a sparse file.
    pub fn open_or_create(path: &Path, size_bytes: u64) -> io::Result<(Self, bool)> {
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if created {
            // SAFETY: plain syscall on a valid, owned file descriptor.
            let rc =
                unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size_bytes as libc::off_t) };
            if rc == libc::EOPNOTSUPP || rc == libc::EINVAL {
                // Filesystems without fallocate still get a file of the right size.
                file.set_len(size_bytes)?;
            } else if rc != 0 {
                // A sparse file here would fail its writes later, while serving.
                drop(file);
                let _ = std::fs::remove_file(path);
                return Err(io::Error::from_raw_os_error(rc));
            }
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        let size_bytes = file.metadata()?.len();
        Ok((FileCache { file, size_bytes }, created))
    }
}

impl FileCache {
    /// [`open_or_create`](Self::open_or_create), but a new file is written with zeros
    /// rather than preallocated (then synced, file and directory). For the write log:
    /// on ext4 and XFS a preallocated extent is *unwritten*, and the first `fdatasync`
    /// after writing into one also commits the metadata that marks it written, which
    /// made a 4 KiB write + flush about 1.6 times slower on this machine's disk until
    /// the log had wrapped once. Writing the zeros once, when the log is made, costs a
    /// second or two per GiB.
    pub fn open_or_create_written(path: &Path, size_bytes: u64) -> io::Result<(Self, bool)> {
        if path.exists() {
            return Self::open_or_create(path, size_bytes);
        }
        // Build it under a temporary name: a crash halfway leaves no short log behind.
        let tmp = path.with_extension("creating");
        let built = Self::write_zeroed(&tmp, size_bytes);
        if built.is_err() {
            // Out of space, most likely: do not leave the partial file taking it up.
            let _ = std::fs::remove_file(&tmp);
        }
        built?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let (cache, _) = Self::open_or_create(path, size_bytes)?;
        Ok((cache, true))
    }

    /// Create `tmp` holding `size_bytes` of written zeros, synced.
    fn write_zeroed(tmp: &Path, size_bytes: u64) -> io::Result<()> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < size_bytes {
            let n = (size_bytes - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()
    }
}

impl CacheDevice for FileCache {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}
