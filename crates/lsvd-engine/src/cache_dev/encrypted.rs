//! A cache device whose bytes past a plain prefix are encrypted (`--encrypt-local`).
//!
//! Why a device decorator: the write log, its index and the read cache are read and
//! written through [`CacheDevice`] only. Encrypting where bytes cross into the file
//! leaves every format and code path above unchanged, as `SealedStore` does for
//! objects. XTS works on 16-byte blocks: records start on 4 KiB, read-cache slots on
//! 64 KiB, slot-table entries are 160 bytes after a 4 KiB header; a write-log index
//! ends where its entries do, so a write that does not cover whole blocks is widened
//! to them, the bytes around it read back first (found by the crash oracle). The prefix stays
//! plain for what must be read before a key is chosen: the write log's two
//! superblocks, which say whether it is encrypted and with which key
//! (docs/format/local-encryption.md).

use std::io;
use std::sync::Arc;

use lsvd_store::xts::XtsKey;

use super::CacheDevice;

pub struct EncryptedDevice {
    inner: Arc<dyn CacheDevice>,
    key: Arc<XtsKey>,
    plain_prefix_bytes: u64,
}

impl EncryptedDevice {
    /// `inner` with every byte at or past `plain_prefix_bytes` encrypted under `key`.
    pub fn new(inner: Arc<dyn CacheDevice>, key: Arc<XtsKey>, plain_prefix_bytes: u64) -> Self {
        EncryptedDevice {
            inner,
            key,
            plain_prefix_bytes,
        }
    }

    /// Where the encrypted part of `len` bytes at `offset` starts in the buffer.
    fn split(&self, offset: u64, len: usize) -> usize {
        (self.plain_prefix_bytes.saturating_sub(offset)).min(len as u64) as usize
    }

    /// Read and decrypt whole 16-byte blocks.
    fn read_blocks(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)?;
        let at = self.split(offset, buf.len());
        self.key
            .decrypt(&mut buf[at..], offset + at as u64)
            .map_err(io::Error::from)
    }

    /// `buf`, to be written at `offset`, encrypted, and the offset to write it at:
    /// widened to whole 16-byte blocks with the bytes around it read back first (a
    /// write-log index is as long as its entries make it). Only for regions one
    /// writer owns at a time, as every region of these files is.
    fn encrypted_copy(&self, buf: &[u8], offset: u64) -> io::Result<(Vec<u8>, u64)> {
        let start = offset / BLOCK * BLOCK;
        let end = (offset + buf.len() as u64).div_ceil(BLOCK) * BLOCK;
        let mut out = vec![0u8; (end - start) as usize];
        if start != offset {
            self.read_blocks(&mut out[..BLOCK as usize], start)?;
        }
        if end != offset + buf.len() as u64 {
            let last = out.len() - BLOCK as usize;
            self.read_blocks(&mut out[last..], end - BLOCK)?;
        }
        let from = (offset - start) as usize;
        out[from..from + buf.len()].copy_from_slice(buf);
        let at = self.split(start, out.len());
        self.key
            .encrypt(&mut out[at..], start + at as u64)
            .map_err(io::Error::from)?;
        Ok((out, start))
    }
}

/// What XTS works on.
const BLOCK: u64 = lsvd_store::xts::XTS_BLOCK_BYTES;

impl CacheDevice for EncryptedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        if offset.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK) {
            return self.read_blocks(buf, offset);
        }
        let start = offset / BLOCK * BLOCK;
        let mut whole = vec![0u8; (end.div_ceil(BLOCK) * BLOCK - start) as usize];
        self.read_blocks(&mut whole, start)?;
        let from = (offset - start) as usize;
        buf.copy_from_slice(&whole[from..from + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (bytes, at) = self.encrypted_copy(buf, offset)?;
        self.inner.write_at(&bytes, at)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (bytes, at) = self.encrypted_copy(buf, offset)?;
        self.inner.write_durable_at(&bytes, at)
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_dev::FileCache;
    use lsvd_store::testutil::TempDir;

    #[test]
    fn bytes_past_the_prefix_are_stored_encrypted_and_read_back_plain() {
        let dir = TempDir::new("encrypted-dev");
        let path = dir.path().join("f");
        let (file, _) = FileCache::open_or_create(&path, 64 << 10).expect("open");
        let mut k = [3u8; 64];
        k[33] = 9;
        let key = Arc::new(XtsKey::new(&k).expect("key"));
        let dev = EncryptedDevice::new(Arc::new(file), key, 8192);
        let marker = b"MARKER-0123456789abcdef-MARKER!!".repeat(64);
        // Across the prefix's end, and wholly past it.
        dev.write_at(&marker, 8192 - 1024).expect("write");
        dev.write_durable_at(&marker, 32768).expect("write");
        let raw = std::fs::read(&path).expect("read file");
        assert_eq!(
            &raw[8192 - 1024..8192],
            &marker[..1024],
            "the prefix is plain"
        );
        assert!(
            raw[8192..].windows(16).all(|w| w != b"0123456789abcdef"),
            "past the prefix, the marker is not stored in the clear"
        );
        for (at, len) in [(8192 - 1024, marker.len()), (32768 + 16, 512), (33280, 64)] {
            let mut back = vec![0u8; len];
            dev.read_at(&mut back, at as u64).expect("read");
            let from = if at >= 32768 {
                at - 32768
            } else {
                at - (8192 - 1024)
            };
            assert_eq!(back, marker[from..from + len], "{at}+{len}");
        }
        // Not whole 16-byte blocks (a write-log index): the bytes around it are kept.
        dev.write_at(&[1u8; 10], 32768 + 3)
            .expect("unaligned write");
        let mut back = vec![0u8; 32];
        dev.read_at(&mut back, 32768).expect("read");
        assert_eq!(&back[..3], &marker[..3]);
        assert_eq!(&back[3..13], &[1u8; 10]);
        assert_eq!(&back[13..], &marker[13..32]);
        let mut part = vec![0u8; 7];
        dev.read_at(&mut part, 32768 + 11).expect("unaligned read");
        assert_eq!(part, back[11..18]);
    }
}
