//! The cache device: a local file (or block device) holding the write log.
//!
//! A narrow trait so tests can substitute a device that loses unsynced writes on a
//! simulated power failure. Positional I/O only; `sync` is `fdatasync`, and
//! `write_durable_at` makes one small write durable without the rest of the file.

pub mod encrypted;
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
    /// Write `buf` at `offset` and make that write durable, and not necessarily any
    /// other: the cache superblock and the log index, whose own bytes must be durable
    /// before the engine acts on them, while the log records around them need not be
    /// (a client's FLUSH syncs those). [`sync`](Self::sync) would also write back
    /// every dirty page of the log.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.sync()
    }
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
    /// `pwritev2` with `RWF_DSYNC`: the kernel writes back this range only and flushes
    /// the device's cache, where `fdatasync` would first write back every dirty page
    /// of the write log (hundreds of megabytes under sustained writes: bench/README.md,
    /// "Superblock writes sync only themselves"). Where the kernel or filesystem does
    /// not take the flag, a plain write and `fdatasync`.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: one iovec naming `buf`, which outlives the call; the kernel only
        // reads from it. The descriptor is owned by `self.file`.
        let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
        if usize::try_from(n).is_ok_and(|n| n == buf.len()) {
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            // Interrupted by a signal before writing anything: the long way retries.
            let long_way = matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL | libc::EINTR)
            );
            if !long_way {
                return Err(e);
            }
        }
        // Not supported, interrupted, or a short write: all of it again, the long way.
        self.file.write_all_at(buf, offset)?;
        self.file.sync_data()
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `write_durable_at` writes what a read then returns, at the offset asked, next
    /// to buffered writes, in a real file (this machine's filesystem takes
    /// `RWF_DSYNC`; elsewhere the fallback runs).
    #[test]
    fn a_durable_write_lands_where_asked_among_buffered_ones() {
        let dir = lsvd_store::testutil::TempDir::new("durable-write");
        let (c, created) =
            FileCache::open_or_create(&dir.path().join("log"), 1 << 20).expect("open");
        assert!(created);
        c.write_at(&[7u8; 8192], 0).expect("buffered write");
        c.write_durable_at(&[9u8; 512], 1024)
            .expect("durable write");
        c.write_durable_at(b"tail", (1 << 20) - 4)
            .expect("durable write at the end");
        let mut buf = vec![0u8; 8192];
        c.read_at(&mut buf, 0).expect("read");
        assert!(buf[..1024].iter().all(|&b| b == 7));
        assert!(buf[1024..1536].iter().all(|&b| b == 9));
        assert!(buf[1536..].iter().all(|&b| b == 7));
        let mut end = [0u8; 4];
        c.read_at(&mut end, (1 << 20) - 4).expect("read end");
        assert_eq!(&end, b"tail");
    }
}
