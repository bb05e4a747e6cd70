//! Objects: the immutable units of the volume's log in the object store.
//!
//! An object is a header followed by a data section. The header is self-contained and
//! small, so recovery reads it with one ranged GET of its first bytes. The data section
//! is checksummed per 4 KiB chunk, so a ranged read of a few blocks can be verified
//! without fetching the whole object. No padding: an object is exactly as long as its
//! header plus its data.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDOBJ\0"
//!      8    2 version: 4 (written since epochs); 1, 2 and 3 are still read
//!     10    2 kind: 1 data, 2 gc (relocated data), 3 checkpoint
//!     12    4 header_bytes (data starts here)
//!     16   16 volume id
//!     32    8 sequence number (also in the object's name)
//!     40    8 last write-log record sequence number contained (or carried over)
//!     48    4 extent count
//!     52    4 trim count
//!     56    8 data bytes
//!     64    4 chunk bytes (4096)
//!     68    4 chunk count
//!     72    4 header crc32c (this field zero)
//!     76    4 parts_after: the data objects after this one that hold the rest of
//!               its batch (0 unless the batch was split by heat)
//!     80    8 the volume's size in bytes from this object on (0: unchanged)
//!     88    8 epoch: the claim of the volume under which the object was written
//!               (also in the object's name)
//!     96    8 first write-log record sequence number whose data it holds
//!               (last + 1 when it holds no record's data: gc, checkpoint, resize)
//!    104    8 reserved (0); in version 5: codec u8 (0 none, 1 lz4, 2 zstd),
//!               then 7 reserved bytes (0)
//!    112    . extents, each: lba u64, sectors u32, reserved u32
//!               (gc objects add: source object seq u64, source byte offset u64)
//!      .    . trims, each: lba u64, sectors u64
//!      .    . chunk crc32c, u32 each; in version 5 each chunk has two u32s:
//!               stored length (bit 31 set: compressed with the codec), crc32c of
//!               the stored bytes
//! ```
//!
//! Version 5 is written when the volume compresses: its chunks are `chunk bytes`
//! (64 KiB) of the data section each, stored one after the other, each raw or
//! compressed (only when that saves space). Extents, the map and every reader speak
//! of the uncompressed data section; [`ObjectHeader::stored_range`] and
//! [`ObjectHeader::open_data`] translate a range of it into the stored bytes and back.
//!
//! Versions 1 to 3 (written before epochs) have an 80-byte fixed part (88 for
//! version 2, which adds the size at 80; version 3 uses 76 for `parts_after`); they
//! decode with epoch 0 and no first record sequence number.

use super::{FormatError, Reader, SECTOR_BYTES, VolumeId, Writer, expect_magic_version, invalid};
use crate::compression::{Codec, Compression, compress_chunk, decompress_chunk};

pub const OBJECT_MAGIC: &[u8; 8] = b"LSVDOBJ\0";
/// The version written: every field at a fixed place, the epoch and the first record
/// included. Versions 1 to 3 are read.
pub const OBJECT_VERSION_EPOCHS: u16 = 4;
/// The first version: neither a size, parts, an epoch nor a first record.
pub const OBJECT_VERSION: u16 = 1;
/// The version of an object that also sets the volume's size (`lsvd resize`): the
/// fixed part grows by that one field. Every other object stays version 1.
pub const OBJECT_VERSION_RESIZE: u16 = 2;
/// The version of a data object that holds part of a batch split by heat (hylog)
/// and is not its last part: the version 1 layout with `parts_after` (at 76, reserved
/// in versions 1 and 2) saying how many objects after it complete the batch. The
/// last part, and every object of a batch that was not split, stays version 1.
pub const OBJECT_VERSION_PART: u16 = 3;
/// The version of an object whose chunks may be compressed: version 4's fields, the
/// codec at 104, chunks of `chunk bytes` and a stored length per chunk.
pub const OBJECT_VERSION_CHUNKED: u16 = 5;
/// The chunk size of versions 1 to 4 (every chunk raw).
pub const CHUNK_BYTES: u64 = 4096;
/// The chunk size version 5 is written with: what one read-cache fill fetches, so a
/// read decompresses whole chunks it would have fetched anyway.
pub const COMPRESSED_CHUNK_BYTES: u64 = 64 << 10;
/// Chunk sizes a version 5 header may give: powers of two in this range (a chunk
/// never spans two read-cache chunks, which are 64 KiB).
const CHUNK_BYTES_RANGE: std::ops::RangeInclusive<u64> = 4096..=COMPRESSED_CHUNK_BYTES;
/// Bit 31 of a version 5 chunk entry's stored length: the chunk is compressed.
const STORED_COMPRESSED: u32 = 1 << 31;
const FIXED_BYTES: usize = 80;
/// The fixed part of a version 2 header: version 1's and the volume size.
const FIXED_BYTES_RESIZE: usize = 88;
/// The fixed part of a version 4 header.
const FIXED_BYTES_V4: usize = 112;
const HEADER_CRC_AT: usize = 72;
/// Enough to hold the header of a typical object in one ranged GET.
pub const HEADER_PROBE_BYTES: u64 = 64 * 1024;
/// Refuse headers larger than this (corrupt counts must not allocate gigabytes).
pub const MAX_HEADER_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Data,
    Gc,
    Checkpoint,
}

impl ObjectKind {
    fn code(self) -> u16 {
        match self {
            ObjectKind::Data => 1,
            ObjectKind::Gc => 2,
            ObjectKind::Checkpoint => 3,
        }
    }
    fn from_code(c: u16) -> Option<Self> {
        match c {
            1 => Some(ObjectKind::Data),
            2 => Some(ObjectKind::Gc),
            3 => Some(ObjectKind::Checkpoint),
            _ => None,
        }
    }
}

/// Where a relocated extent came from (gc objects only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentSource {
    pub object_seq: u64,
    /// Byte offset of the extent's first sector inside the source object.
    pub object_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectExtent {
    pub lba: u64,
    pub sectors: u32,
    pub source: Option<ExtentSource>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHeader {
    pub kind: ObjectKind,
    pub volume: VolumeId,
    pub seq: u64,
    pub last_record_seq: u64,
    pub extents: Vec<ObjectExtent>,
    /// Ranges (lba, sectors) that read as zeros once this object applies. Applied
    /// before the extents.
    pub trims: Vec<(u64, u64)>,
    pub header_bytes: u32,
    /// Bytes of the data section as extents see it (uncompressed).
    pub data_bytes: u64,
    /// The data section's checksum unit: 4096 before version 5.
    pub chunk_bytes: u64,
    /// CRC32C of each chunk as stored (compressed or not).
    pub chunk_crcs: Vec<u32>,
    /// The codec of the compressed chunks (`None` before version 5).
    pub codec: Codec,
    /// Version 5: each chunk's stored length, bit 31 set when it is compressed; empty
    /// before version 5 (every chunk raw, stored where the data section says).
    pub stored_chunks: Vec<u32>,
    /// The volume's size in bytes from this object on, if this object resizes it
    /// (a version 2 header); `None` leaves the size as it was.
    pub volume_size_bytes: Option<u64>,
    /// How many data objects after this one hold the rest of its batch (a version 3
    /// header; 0 for every other object). Recovery applies a batch's parts all or
    /// none: a run of objects that ends inside a batch ends before its first part.
    pub parts_after: u32,
    /// The claim of the volume this object was written under (0: before epochs). Its
    /// name carries it too, so no two claims ever write the same name.
    pub epoch: u64,
    /// The first write-log record whose data the object holds (`last_record_seq + 1`
    /// when it holds none); `None` in headers written before version 4. Recovery checks
    /// that records continue from object to object.
    pub first_record_seq: Option<u64>,
}

impl ObjectHeader {
    /// The object's size in the store: the header and the stored chunks.
    pub fn total_bytes(&self) -> u64 {
        self.header_bytes as u64 + self.stored_data_bytes()
    }

    /// The header and the data section as extents see it (uncompressed): the range
    /// map offsets into the object fall in, and what GC weighs live bytes against.
    /// The same as [`total_bytes`](Self::total_bytes) unless chunks are compressed.
    pub fn span_bytes(&self) -> u64 {
        self.header_bytes as u64 + self.data_bytes
    }

    /// Bytes the data section takes in the store (less than `data_bytes` when some
    /// chunks are compressed).
    pub fn stored_data_bytes(&self) -> u64 {
        if self.stored_chunks.is_empty() {
            return self.data_bytes;
        }
        self.stored_chunks
            .iter()
            .map(|&e| (e & !STORED_COMPRESSED) as u64)
            .sum()
    }

    /// Where chunk `c` is stored, relative to the data section's start: (offset,
    /// length, compressed). Chunks past the end give an empty range at the end.
    fn stored_chunk(&self, c: u64) -> (u64, u64, bool) {
        if self.stored_chunks.is_empty() {
            let s = (c * self.chunk_bytes).min(self.data_bytes);
            return (s, (s + self.chunk_bytes).min(self.data_bytes) - s, false);
        }
        let c = (c as usize).min(self.stored_chunks.len());
        let len_of = |e: u32| (e & !STORED_COMPRESSED) as u64;
        let at = self.stored_chunks[..c].iter().map(|&e| len_of(e)).sum();
        match self.stored_chunks.get(c) {
            Some(&e) => (at, len_of(e), e & STORED_COMPRESSED != 0),
            None => (at, 0, false),
        }
    }

    /// The object's stored bytes holding data-section chunks `[start, end)` (object
    /// offsets aligned as [`verifiable_range`](Self::verifiable_range) gives them):
    /// what to GET. The same range unless chunks are compressed.
    pub fn stored_range(&self, start: u64, end: u64) -> (u64, u64) {
        if self.stored_chunks.is_empty() {
            return (start, end);
        }
        let data_start = self.header_bytes as u64;
        let first = start.saturating_sub(data_start) / self.chunk_bytes;
        let chunks = end.saturating_sub(start).div_ceil(self.chunk_bytes);
        let (s, _, _) = self.stored_chunk(first);
        let (last_s, last_len, _) = self.stored_chunk(first + chunks.max(1) - 1);
        let e = if chunks == 0 { s } else { last_s + last_len };
        (data_start + s, data_start + e)
    }

    /// Verify the stored bytes of the chunks starting at data-section offset `start`
    /// (an object offset aligned as [`verifiable_range`](Self::verifiable_range)
    /// gives it; `stored` as [`stored_range`](Self::stored_range) fetched them) and
    /// return those chunks' data as extents see it.
    pub fn open_data(&self, start: u64, stored: Vec<u8>) -> Result<Vec<u8>, FormatError> {
        const WHAT: &str = "object data";
        if self.stored_chunks.is_empty() {
            self.verify_data(start, &stored)?;
            return Ok(stored);
        }
        let rel = start
            .checked_sub(self.header_bytes as u64)
            .filter(|r| r % self.chunk_bytes == 0 && *r <= self.data_bytes)
            .ok_or_else(|| invalid(WHAT, "range not chunk aligned"))?;
        let mut c = rel / self.chunk_bytes;
        let mut data = Vec::with_capacity(stored.len());
        let mut at = 0usize;
        // `stored` begins at chunk c: walk the table from there (looking each chunk up
        // from the start, `stored_chunk`, would be quadratic for a whole checkpoint).
        while at < stored.len() {
            let (entry, crc) = self
                .stored_chunks
                .get(c as usize)
                .zip(self.chunk_crcs.get(c as usize))
                .ok_or_else(|| invalid(WHAT, "range past end of object"))?;
            let (len, compressed) = (entry & !STORED_COMPRESSED, entry & STORED_COMPRESSED != 0);
            let crc = *crc;
            let bytes = stored
                .get(at..at + len as usize)
                .ok_or_else(|| invalid(WHAT, "range does not end on a chunk boundary"))?;
            check_chunk(bytes, crc)?;
            let plain = (self.data_bytes - c * self.chunk_bytes).min(self.chunk_bytes) as usize;
            if compressed {
                let from = data.len();
                data.resize(from + plain, 0);
                decompress_chunk(self.codec, bytes, &mut data[from..])
                    .map_err(|why| invalid(WHAT, why))?;
            } else {
                data.extend_from_slice(bytes);
            }
            at += len as usize;
            c += 1;
        }
        Ok(data)
    }

    /// The data section of `object` (this header's whole object), verified and
    /// decompressed: what reading a checkpoint's payload, or checking an object, needs.
    pub fn open_whole(&self, object: &[u8]) -> Result<Vec<u8>, FormatError> {
        if object.len() as u64 != self.total_bytes() {
            return Err(wrong_length("object", object.len(), self.total_bytes()));
        }
        let data_start = self.header_bytes as usize;
        self.open_data(data_start as u64, object[data_start..].to_vec())
    }

    /// Verify every stored chunk of a whole data section (`payload`: the object's bytes
    /// after its header), without decompressing: what copying an object needs.
    pub fn verify_stored_data(&self, payload: &[u8]) -> Result<(), FormatError> {
        if self.stored_chunks.is_empty() {
            return verify_chunks(0, self.data_bytes, &self.chunk_crcs, 0, payload);
        }
        if payload.len() as u64 != self.stored_data_bytes() {
            let want = self.stored_data_bytes();
            return Err(wrong_length("object data", payload.len(), want));
        }
        let mut at = 0usize;
        for (&e, &crc) in self.stored_chunks.iter().zip(&self.chunk_crcs) {
            let len = (e & !STORED_COMPRESSED) as usize;
            check_chunk(&payload[at..at + len], crc)?;
            at += len;
        }
        Ok(())
    }

    /// Byte offset inside the object of each extent's data, in extent order.
    pub fn extent_offsets(&self) -> impl Iterator<Item = (ObjectExtent, u64)> + '_ {
        let mut off = self.header_bytes as u64;
        self.extents.iter().map(move |e| {
            let here = off;
            off += e.sectors as u64 * SECTOR_BYTES;
            (*e, here)
        })
    }

    /// The chunk-aligned byte range of the object that covers `[offset, offset+len)`,
    /// clamped to the data section: what to fetch so the read can be verified.
    /// Offsets outside the data section (a corrupt map) give a range clamped to it,
    /// never an overflow: `start <= end` always, and the verification that follows
    /// reports the short read.
    pub fn verifiable_range(&self, offset: u64, len: u64) -> (u64, u64) {
        let data_start = self.header_bytes as u64;
        let chunk = self.chunk_bytes;
        let rel_start = (offset.saturating_sub(data_start) / chunk * chunk).min(self.data_bytes);
        let rel_end = offset
            .saturating_add(len)
            .saturating_sub(data_start)
            .div_ceil(chunk)
            .saturating_mul(chunk)
            .clamp(rel_start, self.data_bytes);
        (data_start + rel_start, data_start + rel_end)
    }

    /// Verify `bytes`, the object's bytes `[start, start+bytes.len())` where `start` is
    /// chunk-aligned relative to the data section (as from [`verifiable_range`]), of an
    /// object before version 5 (whose chunks are stored raw, where extents say).
    fn verify_data(&self, start: u64, bytes: &[u8]) -> Result<(), FormatError> {
        verify_chunks(
            self.header_bytes as u64,
            self.data_bytes,
            &self.chunk_crcs,
            start,
            bytes,
        )
    }
}

/// `have` bytes where the header says `want`.
fn wrong_length(what: &'static str, have: usize, want: u64) -> FormatError {
    invalid(what, format!("{have} bytes, the header says {want}"))
}

/// Check one chunk's bytes as stored against its CRC32C.
fn check_chunk(bytes: &[u8], stored: u32) -> Result<(), FormatError> {
    let computed = crc32c::crc32c(bytes);
    if computed != stored {
        return Err(FormatError::BadChecksum {
            what: "object data",
            stored,
            computed,
        });
    }
    Ok(())
}

/// Verify chunk checksums of a slice of a data section; shared with callers that keep
/// only the chunk table of an object.
pub fn verify_chunks(
    header_bytes: u64,
    data_bytes: u64,
    chunk_crcs: &[u32],
    start: u64,
    bytes: &[u8],
) -> Result<(), FormatError> {
    const WHAT: &str = "object data";
    let rel = start
        .checked_sub(header_bytes)
        .filter(|r| r % CHUNK_BYTES == 0)
        .ok_or_else(|| invalid(WHAT, "range not chunk aligned"))?;
    if rel + bytes.len() as u64 > data_bytes {
        return Err(invalid(WHAT, "range past end of object"));
    }
    let first_chunk = (rel / CHUNK_BYTES) as usize;
    let chunks = bytes.len().div_ceil(CHUNK_BYTES as usize);
    let ends_short = !(bytes.len() as u64).is_multiple_of(CHUNK_BYTES);
    if ends_short && rel + bytes.len() as u64 != data_bytes {
        return Err(invalid(WHAT, "range does not end on a chunk boundary"));
    }
    let stored = chunk_crcs
        .get(first_chunk..first_chunk + chunks)
        .ok_or_else(|| invalid(WHAT, "chunk index out of range"))?;
    // All chunks' CRCs in one pass, three chunks at a time; the first mismatch fails.
    let mut expected = stored.iter();
    let mut mismatch = None;
    super::chunk_crc::for_each_chunk_crc(bytes, CHUNK_BYTES as usize, |computed| {
        if let Some(&stored) = expected.next()
            && stored != computed
            && mismatch.is_none()
        {
            mismatch = Some((stored, computed));
        }
    });
    match mismatch {
        Some((stored, computed)) => Err(FormatError::BadChecksum {
            what: WHAT,
            stored,
            computed,
        }),
        None => Ok(()),
    }
}

/// Everything needed to encode an object, except the derived fields.
pub struct ObjectSpec<'a> {
    pub kind: ObjectKind,
    pub volume: VolumeId,
    pub seq: u64,
    pub last_record_seq: u64,
    pub extents: &'a [ObjectExtent],
    pub trims: &'a [(u64, u64)],
    /// Set the volume's size to this many bytes from this object on (a version 2
    /// header; only data objects made by `lsvd resize` carry one).
    pub volume_size_bytes: Option<u64>,
    /// Data objects after this one that hold the rest of its batch (not 0 only for
    /// data objects, never with a resize).
    pub parts_after: u32,
    /// The claim (lease epoch) it is written under.
    pub epoch: u64,
    /// The first write-log record whose data it holds; `last_record_seq + 1` for an
    /// object that holds no record's data.
    pub first_record_seq: u64,
}

impl ObjectSpec<'_> {
    /// A checkpoint object's spec: no extents, trims or resize, and none of the
    /// write-log records' data (its records end at `last_record_seq`).
    pub fn checkpoint(
        volume: VolumeId,
        seq: u64,
        last_record_seq: u64,
        epoch: u64,
    ) -> ObjectSpec<'static> {
        ObjectSpec {
            kind: ObjectKind::Checkpoint,
            volume,
            seq,
            last_record_seq,
            extents: &[],
            trims: &[],
            volume_size_bytes: None,
            parts_after: 0,
            epoch,
            first_record_seq: last_record_seq + 1,
        }
    }
}

/// Size of the header written (version 4) for these counts.
pub fn header_bytes_for(
    kind: ObjectKind,
    extent_count: usize,
    trim_count: usize,
    data_bytes: u64,
) -> u64 {
    fixed_and_lists_bytes(kind, extent_count, trim_count) as u64
        + 4 * data_bytes.div_ceil(CHUNK_BYTES)
}

/// A version 4 or 5 header's bytes before its chunk table.
fn fixed_and_lists_bytes(kind: ObjectKind, extent_count: usize, trim_count: usize) -> usize {
    let extent_bytes = if kind == ObjectKind::Gc { 32 } else { 16 };
    FIXED_BYTES_V4 + extent_bytes * extent_count + 16 * trim_count
}

/// Size of the header of `spec` with `data_bytes` of data.
fn spec_header_bytes(spec: &ObjectSpec<'_>, data_bytes: u64) -> u64 {
    header_bytes_for(spec.kind, spec.extents.len(), spec.trims.len(), data_bytes)
}

/// The header an object with these extents would have, without its data or chunk
/// checksums (which are zero): for the simulator, which tracks sizes and maps only.
pub fn header_without_data(
    kind: ObjectKind,
    seq: u64,
    last_record_seq: u64,
    extents: Vec<ObjectExtent>,
    trims: Vec<(u64, u64)>,
) -> ObjectHeader {
    let data_bytes: u64 = extents
        .iter()
        .map(|e| e.sectors as u64 * SECTOR_BYTES)
        .sum();
    let header_bytes = header_bytes_for(kind, extents.len(), trims.len(), data_bytes) as u32;
    ObjectHeader {
        kind,
        volume: VolumeId::default(),
        seq,
        last_record_seq,
        extents,
        trims,
        header_bytes,
        data_bytes,
        chunk_bytes: CHUNK_BYTES,
        chunk_crcs: vec![0; data_bytes.div_ceil(CHUNK_BYTES) as usize],
        codec: Codec::None,
        stored_chunks: Vec::new(),
        volume_size_bytes: None,
        parts_after: 0,
        epoch: 0,
        first_record_seq: None,
    }
}

/// Encode the header for `spec` whose data section is `data` (version 4: every 4 KiB
/// chunk raw).
pub fn encode_object_header(spec: &ObjectSpec<'_>, data: &[u8]) -> Vec<u8> {
    let crcs = super::chunk_crc::chunk_crcs(data, CHUNK_BYTES as usize);
    encode_header(spec, data.len() as u64, &ChunkTable::Raw(&crcs))
}

/// The chunk table a header ends with.
enum ChunkTable<'a> {
    /// Version 4: a CRC per 4 KiB chunk.
    Raw(&'a [u32]),
    /// Version 5: chunks of `chunk_bytes`, each (stored length with the compressed
    /// bit, CRC of the stored bytes).
    Stored {
        chunk_bytes: u64,
        codec: Codec,
        entries: &'a [(u32, u32)],
    },
}

fn encode_header(spec: &ObjectSpec<'_>, data_bytes: u64, table: &ChunkTable<'_>) -> Vec<u8> {
    let with_source = spec.kind == ObjectKind::Gc;
    let (version, chunk_bytes, chunk_count, codec) = match table {
        ChunkTable::Raw(crcs) => (OBJECT_VERSION_EPOCHS, CHUNK_BYTES, crcs.len(), Codec::None),
        ChunkTable::Stored {
            chunk_bytes,
            codec,
            entries,
        } => (OBJECT_VERSION_CHUNKED, *chunk_bytes, entries.len(), *codec),
    };
    let entry_bytes = if version == OBJECT_VERSION_CHUNKED {
        8
    } else {
        4
    };
    let header_bytes = fixed_and_lists_bytes(spec.kind, spec.extents.len(), spec.trims.len())
        + entry_bytes * chunk_count;
    let mut w = Writer::with_capacity(header_bytes);
    w.bytes(OBJECT_MAGIC);
    debug_assert!(
        spec.parts_after == 0
            || (spec.kind == ObjectKind::Data && spec.volume_size_bytes.is_none()),
        "only a data object that does not resize is part of a split batch"
    );
    w.u16(version);
    w.u16(spec.kind.code());
    w.u32(header_bytes as u32);
    w.bytes(&spec.volume.0);
    w.u64(spec.seq);
    w.u64(spec.last_record_seq);
    w.u32(spec.extents.len() as u32);
    w.u32(spec.trims.len() as u32);
    w.u64(data_bytes);
    w.u32(chunk_bytes as u32);
    w.u32(chunk_count as u32);
    w.u32(0);
    w.u32(spec.parts_after);
    w.u64s(&[
        spec.volume_size_bytes.unwrap_or(0),
        spec.epoch,
        spec.first_record_seq,
    ]);
    // Reserved in version 4; the codec and 7 reserved bytes in version 5.
    w.u64(codec.code() as u64);
    for e in spec.extents {
        w.u64(e.lba);
        w.u32(e.sectors);
        w.u32(0);
        if with_source {
            let s = e.source.unwrap_or(ExtentSource {
                object_seq: 0,
                object_offset: 0,
            });
            w.u64(s.object_seq);
            w.u64(s.object_offset);
        }
    }
    for &(lba, sectors) in spec.trims {
        w.u64(lba);
        w.u64(sectors);
    }
    match table {
        ChunkTable::Raw(crcs) => crcs.iter().for_each(|&crc| w.u32(crc)),
        ChunkTable::Stored { entries, .. } => {
            for &(stored, crc) in entries.iter() {
                w.u32(stored);
                w.u32(crc);
            }
        }
    }
    debug_assert_eq!(w.buf.len(), header_bytes);
    w.seal(HEADER_CRC_AT)
}

/// Encode a whole object whose data section is `data`, compressed with
/// `compression`: version 5 with chunks of [`COMPRESSED_CHUNK_BYTES`], each stored
/// compressed where that saves space. With no compression, the version 4 object of
/// [`encode_object`].
pub fn encode_compressed_object(
    spec: &ObjectSpec<'_>,
    data: &[u8],
    compression: Compression,
) -> Vec<u8> {
    if compression.is_none() {
        return encode_object(spec, data);
    }
    let mut stored = Vec::with_capacity(data.len());
    let mut entries = Vec::with_capacity(data.len().div_ceil(COMPRESSED_CHUNK_BYTES as usize));
    let mut scratch = Vec::new();
    for chunk in data.chunks(COMPRESSED_CHUNK_BYTES as usize) {
        let (bytes, flag) = if compress_chunk(compression, chunk, &mut scratch) {
            (scratch.as_slice(), STORED_COMPRESSED)
        } else {
            (chunk, 0)
        };
        entries.push((bytes.len() as u32 | flag, crc32c::crc32c(bytes)));
        stored.extend_from_slice(bytes);
    }
    let table = ChunkTable::Stored {
        chunk_bytes: COMPRESSED_CHUNK_BYTES,
        codec: compression.codec(),
        entries: &entries,
    };
    let mut out = encode_header(spec, data.len() as u64, &table);
    out.extend_from_slice(&stored);
    out
}

/// Encode a whole object: header then data.
pub fn encode_object(spec: &ObjectSpec<'_>, data: &[u8]) -> Vec<u8> {
    let header_len = object_header_len(spec, data.len() as u64);
    let mut out = vec![0u8; header_len + data.len()];
    out[header_len..].copy_from_slice(data);
    finish_object_in_place(spec, &mut out, header_len);
    out
}

/// Bytes the header of `spec` takes in front of `data_bytes` of data: where the data
/// section of an object built in place ([`finish_object_in_place`]) starts.
pub fn object_header_len(spec: &ObjectSpec<'_>, data_bytes: u64) -> usize {
    spec_header_bytes(spec, data_bytes) as usize
}

/// Complete an object whose data section is already in place: `object` holds
/// `header_len` bytes of room (from [`object_header_len`]), then the data; the header
/// is written into the room. The same bytes as [`encode_object`], without a second
/// copy of the data (the uploader fills one buffer straight from its write log).
pub fn finish_object_in_place(spec: &ObjectSpec<'_>, object: &mut [u8], header_len: usize) {
    let (head, data) = object.split_at_mut(header_len);
    assert_eq!(
        header_len,
        object_header_len(spec, data.len() as u64),
        "room for the header was sized for another data length"
    );
    head.copy_from_slice(&encode_object_header(spec, data));
}

/// How many bytes the header occupies, from at least the first 16 bytes.
pub fn peek_header_bytes(buf: &[u8]) -> Result<u64, FormatError> {
    Ok(peek_header(buf)?.0)
}

/// The header's size, its fixed part's size (by version) and its version, from its
/// first 16 bytes.
fn peek_header(buf: &[u8]) -> Result<(u64, usize, u16), FormatError> {
    const WHAT: &str = "object header";
    let mut r = Reader::new(buf, WHAT);
    let (fixed, version) =
        match expect_magic_version(&mut r, OBJECT_MAGIC, OBJECT_VERSION_EPOCHS, WHAT) {
            Ok(()) => (FIXED_BYTES_V4, OBJECT_VERSION_EPOCHS),
            Err(FormatError::UnsupportedVersion { version, .. })
                if version == OBJECT_VERSION_CHUNKED =>
            {
                (FIXED_BYTES_V4, version)
            }
            Err(FormatError::UnsupportedVersion { version, .. })
                if version == OBJECT_VERSION_RESIZE =>
            {
                (FIXED_BYTES_RESIZE, version)
            }
            Err(FormatError::UnsupportedVersion { version, .. })
                if version == OBJECT_VERSION || version == OBJECT_VERSION_PART =>
            {
                (FIXED_BYTES, version)
            }
            Err(e) => return Err(e),
        };
    r.u16()?;
    let n = r.u32()? as u64;
    if !(fixed as u64..=MAX_HEADER_BYTES).contains(&n) {
        return Err(invalid(WHAT, format!("header size {n} out of range")));
    }
    Ok((n, fixed, version))
}

/// Decode and verify an object header from a buffer holding at least the header.
pub fn decode_object_header(buf: &[u8]) -> Result<ObjectHeader, FormatError> {
    const WHAT: &str = "object header";
    let (header_bytes, fixed_bytes, version) = peek_header(buf)?;
    if (buf.len() as u64) < header_bytes {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: header_bytes as usize,
            have: buf.len(),
        });
    }
    let hbuf = &buf[..header_bytes as usize];
    let mut r = Reader::new(hbuf, WHAT);
    r.take(10)?;
    let kind_code = r.u16()?;
    let kind = ObjectKind::from_code(kind_code)
        .ok_or_else(|| invalid(WHAT, format!("unknown kind {kind_code}")))?;
    r.u32()?;
    let volume = VolumeId(r.array()?);
    let seq = r.u64()?;
    let last_record_seq = r.u64()?;
    let extent_count = r.u32()? as u64;
    let trim_count = r.u32()? as u64;
    let data_bytes = r.u64()?;
    let chunk_bytes = r.u32()? as u64;
    let chunk_count = r.u32()? as u64;
    let stored_crc = r.u32()?;
    let parts_after = r.u32()?;
    let mut codec = Codec::None;
    let (volume_size_bytes, epoch, first_record_seq) = match version {
        OBJECT_VERSION_RESIZE => (Some(r.u64()?), 0, None),
        OBJECT_VERSION_EPOCHS | OBJECT_VERSION_CHUNKED => {
            let [size, epoch, first] = r.u64s()?;
            let at_104 = r.u64()?;
            if version == OBJECT_VERSION_CHUNKED && at_104 >> 8 == 0 {
                codec = Codec::from_code(at_104 as u8)
                    .ok_or_else(|| invalid(WHAT, format!("unknown codec {}", at_104 as u8)))?;
            } else if at_104 != 0 {
                return Err(invalid(WHAT, "reserved field at 104 is not zero"));
            }
            ((size != 0).then_some(size), epoch, Some(first))
        }
        _ => (None, 0, None),
    };
    let computed = super::crc_with_hole(hbuf, HEADER_CRC_AT);
    if computed != stored_crc {
        return Err(FormatError::BadChecksum {
            what: WHAT,
            stored: stored_crc,
            computed,
        });
    }
    if let Some(size) = volume_size_bytes
        && (kind != ObjectKind::Data || size == 0 || size % 4096 != 0)
    {
        return Err(invalid(
            WHAT,
            format!("a {kind:?} object resizing the volume to {size} bytes"),
        ));
    }
    let parts_allowed = matches!(
        version,
        OBJECT_VERSION_PART | OBJECT_VERSION_EPOCHS | OBJECT_VERSION_CHUNKED
    );
    if version == OBJECT_VERSION_PART && parts_after == 0 {
        return Err(invalid(
            WHAT,
            format!("a {kind:?} object as part of a batch with {parts_after} parts after it"),
        ));
    }
    if parts_after != 0 {
        if !parts_allowed {
            return Err(invalid(WHAT, "reserved field at 76 is not zero"));
        }
        if kind != ObjectKind::Data || volume_size_bytes.is_some() {
            return Err(invalid(
                WHAT,
                format!("a {kind:?} object as part of a batch with {parts_after} parts after it"),
            ));
        }
    }
    if let Some(first) = first_record_seq
        && first > last_record_seq.saturating_add(1)
    {
        return Err(invalid(
            WHAT,
            format!("first record {first} is past its last record {last_record_seq} + 1"),
        ));
    }
    let chunked = version == OBJECT_VERSION_CHUNKED;
    let chunk_size_ok = if chunked {
        chunk_bytes.is_power_of_two() && CHUNK_BYTES_RANGE.contains(&chunk_bytes)
    } else {
        chunk_bytes == CHUNK_BYTES
    };
    if !chunk_size_ok {
        return Err(invalid(
            WHAT,
            format!("chunk size {chunk_bytes} unsupported"),
        ));
    }
    if chunk_count != data_bytes.div_ceil(chunk_bytes) {
        return Err(invalid(WHAT, "chunk count does not match data size"));
    }
    let with_source = kind == ObjectKind::Gc;
    let extent_bytes = if with_source { 32 } else { 16 };
    let entry_bytes = if chunked { 8 } else { 4 };
    let expected = (fixed_bytes as u64)
        .saturating_add(extent_bytes * extent_count)
        .saturating_add(16 * trim_count)
        .saturating_add(entry_bytes * chunk_count);
    if expected != header_bytes {
        return Err(invalid(
            WHAT,
            format!("header size {header_bytes} does not match its counts ({expected})"),
        ));
    }
    let mut extents = Vec::with_capacity(extent_count as usize);
    let mut sum = 0u64;
    for _ in 0..extent_count {
        let lba = r.u64()?;
        let sectors = r.u32()?;
        r.u32()?;
        let source = if with_source {
            Some(ExtentSource {
                object_seq: r.u64()?,
                object_offset: r.u64()?,
            })
        } else {
            None
        };
        if sectors == 0 {
            return Err(invalid(WHAT, "zero-length extent"));
        }
        sum += sectors as u64 * SECTOR_BYTES;
        extents.push(ObjectExtent {
            lba,
            sectors,
            source,
        });
    }
    if kind != ObjectKind::Checkpoint && sum != data_bytes {
        return Err(invalid(
            WHAT,
            format!("extents cover {sum} bytes, data section is {data_bytes}"),
        ));
    }
    let mut trims = Vec::with_capacity(trim_count as usize);
    for _ in 0..trim_count {
        let lba = r.u64()?;
        let sectors = r.u64()?;
        trims.push((lba, sectors));
    }
    let mut chunk_crcs = Vec::with_capacity(chunk_count as usize);
    let mut stored_chunks = Vec::new();
    for c in 0..chunk_count {
        if chunked {
            let stored = r.u32()?;
            let plain = (data_bytes - c * chunk_bytes).min(chunk_bytes);
            let len = (stored & !STORED_COMPRESSED) as u64;
            let fits = if stored & STORED_COMPRESSED != 0 {
                codec != Codec::None && len > 0 && len < plain
            } else {
                len == plain
            };
            if !fits {
                return Err(invalid(
                    WHAT,
                    format!(
                        "chunk {c} stored as {stored:#010x} (of {plain} bytes, codec {codec:?})"
                    ),
                ));
            }
            stored_chunks.push(stored);
        }
        chunk_crcs.push(r.u32()?);
    }
    debug_assert_eq!(r.pos() as u64, header_bytes);
    Ok(ObjectHeader {
        kind,
        volume,
        seq,
        last_record_seq,
        extents,
        trims,
        header_bytes: header_bytes as u32,
        data_bytes,
        chunk_bytes,
        chunk_crcs,
        codec,
        stored_chunks,
        volume_size_bytes,
        parts_after,
        epoch,
        first_record_seq,
    })
}

#[cfg(test)]
#[path = "object_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "object_chunked_tests.rs"]
mod chunked_tests;
