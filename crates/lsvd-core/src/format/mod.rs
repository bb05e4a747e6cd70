//! Every byte layout lsvd persists, encoded and decoded in one place.
//!
//! Each structure starts with an 8-byte magic and a 16-bit version, and carries a
//! CRC32C that is verified on every decode. Decoding never panics: any input yields
//! either a value or a [`FormatError`] saying what was wrong. The prose specification
//! of each layout is in `docs/format/`.

pub mod cache_super;
pub mod chain_drive;
pub mod checkpoint;
pub mod chunk_crc;
pub mod clone_link;
pub mod diff;
pub mod examples;
pub mod keyed_hash;
pub mod log_index;
pub mod object;
pub mod record;
pub mod replica_status;
pub mod sealed;
pub mod snapshot;
pub mod volume_keys;
pub mod volume_meta;
pub mod volume_settings;
pub mod volume_super;
pub mod xxh3_avx2;

#[cfg(test)]
pub(crate) mod test_support;

use std::fmt;

/// Size of a sector: the unit of every LBA and extent length.
pub const SECTOR_BYTES: u64 = 512;

/// Why a persisted structure was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    BadMagic {
        what: &'static str,
    },
    UnsupportedVersion {
        what: &'static str,
        version: u16,
    },
    BadChecksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    Invalid {
        what: &'static str,
        why: String,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Truncated { what, need, have } => {
                write!(f, "{what}: truncated (need {need} bytes, have {have})")
            }
            FormatError::BadMagic { what } => write!(f, "{what}: bad magic"),
            FormatError::UnsupportedVersion { what, version } => {
                write!(f, "{what}: unsupported format version {version}")
            }
            FormatError::BadChecksum {
                what,
                stored,
                computed,
            } => {
                write!(
                    f,
                    "{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )
            }
            FormatError::Invalid { what, why } => write!(f, "{what}: {why}"),
        }
    }
}

impl std::error::Error for FormatError {}

/// A 128-bit volume identity, random at creation. Records and objects carry it so
/// that data from another volume is never mistaken for ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct VolumeId(pub [u8; 16]);

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Little-endian writer over a growable buffer.
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn zeros(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + n, 0);
    }
    pub fn u64s(&mut self, values: &[u64]) {
        for &v in values {
            self.u64(v);
        }
    }
    pub fn put_u32_at(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// The head every structure starts with: magic (8), version (2), a 16-bit field
    /// (flags or reserved) and the CRC32C slot (4, zero until [`Writer::seal`]).
    pub fn head(&mut self, magic: &[u8; 8], version: u16, flags: u16) {
        self.bytes(magic);
        self.u16(version);
        self.u16(flags);
        self.u32(0);
    }
    /// Store the CRC32C of the whole buffer (its slot still zero) at `crc_at` and
    /// return the encoded bytes.
    pub fn seal(mut self, crc_at: usize) -> Vec<u8> {
        let crc = crc32c::crc32c(&self.buf);
        self.put_u32_at(crc_at, crc);
        self.buf
    }
}

/// Little-endian reader that reports truncation instead of panicking.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(FormatError::Truncated {
                what: self.what,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// `N` consecutive u64 fields.
    pub fn u64s<const N: usize>(&mut self) -> Result<[u64; N], FormatError> {
        let mut values = [0u64; N];
        for v in &mut values {
            *v = self.u64()?;
        }
        Ok(values)
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// The 8-byte magic, refused unless it is `magic`; returns the version after it,
    /// for the caller to judge.
    pub fn magic(&mut self, magic: &[u8; 8]) -> Result<u16, FormatError> {
        if &self.array::<8>()? != magic {
            return Err(FormatError::BadMagic { what: self.what });
        }
        self.u16()
    }
    /// The head [`Writer::head`] writes, for a structure with one version: magic and
    /// version are checked; returns the 16-bit field after them (flags or reserved)
    /// and the stored CRC32C.
    pub fn head(&mut self, magic: &[u8; 8], version: u16) -> Result<(u16, u32), FormatError> {
        expect_magic_version(self, magic, version, self.what)?;
        Ok((self.u16()?, self.u32()?))
    }
}

/// Check magic and version at the start of `r`.
pub(crate) fn expect_magic_version(
    r: &mut Reader<'_>,
    magic: &[u8; 8],
    version: u16,
    what: &'static str,
) -> Result<(), FormatError> {
    let v = r.magic(magic)?;
    if v != version {
        return Err(FormatError::UnsupportedVersion { what, version: v });
    }
    Ok(())
}

/// The common head of the small fixed-size store records (volume superblock, snapshot
/// record, clone link): exactly `len` bytes, then magic (8), version (2), flags (2)
/// and a CRC32C (4, at offset 12) over the whole record with that field zero. Returns
/// a reader positioned after the CRC, and the flags, which are refused if any bit
/// outside `known_flags` is set.
pub(crate) fn open_fixed_record<'a>(
    buf: &'a [u8],
    what: &'static str,
    len: usize,
    magic: &[u8; 8],
    version: u16,
    known_flags: u16,
) -> Result<(Reader<'a>, u16), FormatError> {
    const CRC_AT: usize = 12;
    if buf.len() != len {
        return Err(invalid(
            what,
            format!("{} bytes, expected {len}", buf.len()),
        ));
    }
    let mut r = Reader::new(buf, what);
    let (flags, stored) = r.head(magic, version)?;
    check_crc(what, buf, CRC_AT, stored)?;
    if flags & !known_flags != 0 {
        return Err(invalid(what, format!("unknown flags {flags:#06x}")));
    }
    Ok((r, flags))
}

/// The head of the records still read in version 1 beside the `current` version
/// (volume superblock, snapshot record): as in [`open_fixed_record`], but a version 1
/// record must be exactly `v1_len` bytes and a current one at least `min_len`.
/// Returns the reader positioned after the CRC, the version and the flags.
pub(crate) fn open_two_version_record<'a>(
    buf: &'a [u8],
    what: &'static str,
    magic: &[u8; 8],
    current: u16,
    (v1_len, min_len): (usize, usize),
    known_flags: u16,
) -> Result<(Reader<'a>, u16, u16), FormatError> {
    const CRC_AT: usize = 12;
    let mut r = Reader::new(buf, what);
    let version = match expect_magic_version(&mut r, magic, current, what) {
        Ok(()) => current,
        Err(FormatError::UnsupportedVersion { version: 1, .. }) => 1,
        Err(e) => return Err(e),
    };
    let flags = r.u16()?;
    let stored = r.u32()?;
    let min_len = if version == 1 { v1_len } else { min_len };
    if buf.len() < min_len || (version == 1 && buf.len() != min_len) {
        return Err(invalid(
            what,
            format!("{} bytes, expected {min_len}", buf.len()),
        ));
    }
    check_crc(what, buf, CRC_AT, stored)?;
    if flags & !known_flags != 0 {
        return Err(invalid(what, format!("unknown flags {flags:#06x}")));
    }
    Ok((r, version, flags))
}

/// A text field of the fixed-size records: `len` bytes (1..=`field.len()`) of UTF-8,
/// the rest of `field` zero. `label` names it in errors ("name", "peer").
pub(crate) fn padded_text(
    what: &'static str,
    label: &str,
    len: usize,
    field: &[u8],
) -> Result<String, FormatError> {
    if len == 0 || len > field.len() {
        return Err(invalid(what, format!("a {label} length of {len}")));
    }
    if field[len..].iter().any(|&b| b != 0) {
        return Err(invalid(
            what,
            format!("bytes after the {label} are not zero"),
        ));
    }
    std::str::from_utf8(&field[..len])
        .map(str::to_string)
        .map_err(|_| invalid(what, format!("the {label} is not UTF-8")))
}

/// CRC32C of `buf` computed as if the 4 bytes at `crc_at` were zero.
pub(crate) fn crc_with_hole(buf: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&buf[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &buf[crc_at + 4..])
}

/// Refuse `buf` unless `stored` is its CRC32C computed with the 4 bytes at `crc_at`
/// taken as zero.
pub(crate) fn check_crc(
    what: &'static str,
    buf: &[u8],
    crc_at: usize,
    stored: u32,
) -> Result<(), FormatError> {
    let computed = crc_with_hole(buf, crc_at);
    if computed != stored {
        return Err(FormatError::BadChecksum {
            what,
            stored,
            computed,
        });
    }
    Ok(())
}

pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what,
        why: why.into(),
    }
}

/// Round `n` up to a multiple of `align` (a power of two).
pub const fn align_up(n: u64, align: u64) -> u64 {
    (n + align - 1) & !(align - 1)
}
