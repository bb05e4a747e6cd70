//! The changed-block stream `lsvd export-diff` writes and `lsvd import-diff` reads:
//! what differs between two snapshots of a volume (or between the empty volume and a
//! snapshot), as data runs and zeroed runs.
//!
//! Why a stream of records: a diff goes through pipes (`export-diff … - | ssh … lsvd
//! import-diff - …`), so it is written front to back with no seeking and read with
//! memory bounded by one record. Each record carries its own CRC32C, so damage is
//! found at the record it hits; the end record counts the records and data bytes
//! before it, so a stream cut off between records is refused instead of applied in
//! part as if it were whole. Records are in ascending offset order and never overlap.
//!
//! ```text
//! header (200 bytes)
//! offset size field
//!      0    8 magic "LSVDDIF\0"
//!      8    2 version (1)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over the header (this field zero)
//!     16   16 source volume id
//!     32    8 volume size in bytes (a multiple of 512)
//!     40    8 created at, milliseconds since the Unix epoch
//!     48    8 base snapshot's through_seq (0 without a base)
//!     56    8 target snapshot's through_seq
//!     64    2 base snapshot name length (0: the diff starts from the empty volume)
//!     66    2 target snapshot name length (1..=64)
//!     68    4 reserved (0)
//!     72   64 base snapshot name (zero-padded)
//!    136   64 target snapshot name (zero-padded)
//!
//! record (24 bytes, then the payload)
//!      0    1 kind: 1 data, 2 zeros, 3 end
//!      1    3 reserved (0)
//!      4    4 crc32c over the record head (this field zero) and its payload
//!      8    8 offset in bytes   (end: the number of records before it)
//!     16    8 length in bytes   (end: the data bytes in the records before it)
//!     24    … payload: `length` bytes for a data record, nothing otherwise
//! ```
//!
//! Data and zero records have offset and length multiples of 512, a length of at least
//! 512 (data: at most [`MAX_DATA_RECORD_BYTES`]), an offset at or after the previous
//! record's end, and end within the volume. Nothing may follow the end record.

use std::io::Read;

use super::{FormatError, VolumeId, Writer, check_crc, invalid, open_fixed_record, padded_text};

pub const DIFF_MAGIC: &[u8; 8] = b"LSVDDIF\0";
pub const DIFF_VERSION: u16 = 1;
pub const DIFF_HEADER_BYTES: usize = 200;
pub const DIFF_RECORD_HEAD_BYTES: usize = 24;
/// The largest data record (the exporter writes 1 MiB ones).
pub const MAX_DATA_RECORD_BYTES: u64 = 4 << 20;
const MAX_NAME_BYTES: usize = 64;
const HEADER_CRC_AT: usize = 12;
const RECORD_CRC_AT: usize = 4;
const UNIT_BYTES: u64 = 512;
const WHAT: &str = "diff header";
const RECORD: &str = "diff record";

const KIND_DATA: u8 = 1;
const KIND_ZEROS: u8 = 2;
const KIND_END: u8 = 3;

/// What a diff goes from and to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffHeader {
    pub volume: VolumeId,
    pub size_bytes: u64,
    pub created_unix_ms: u64,
    /// The snapshot the diff applies on top of (`None`: the empty volume).
    pub from_snapshot: Option<String>,
    pub from_through_seq: u64,
    /// The snapshot the diff brings a volume to.
    pub to_snapshot: String,
    pub to_through_seq: u64,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffRecord {
    Data { offset: u64, data: Vec<u8> },
    Zeros { offset: u64, length: u64 },
}

pub fn encode_diff_header(h: &DiffHeader) -> Result<Vec<u8>, FormatError> {
    let from = h.from_snapshot.as_deref().unwrap_or("").as_bytes();
    let to = h.to_snapshot.as_bytes();
    if from.len() > MAX_NAME_BYTES || to.is_empty() || to.len() > MAX_NAME_BYTES {
        return Err(invalid(WHAT, "a snapshot name of 0 or over 64 bytes"));
    }
    if !h.size_bytes.is_multiple_of(UNIT_BYTES) || h.from_snapshot.as_deref() == Some("") {
        return Err(invalid(
            WHAT,
            "a size not a multiple of 512, or an empty base name",
        ));
    }
    let mut w = Writer::with_capacity(DIFF_HEADER_BYTES);
    w.head(DIFF_MAGIC, DIFF_VERSION, 0);
    w.bytes(&h.volume.0);
    w.u64s(&[
        h.size_bytes,
        h.created_unix_ms,
        h.from_through_seq,
        h.to_through_seq,
    ]);
    w.u16(from.len() as u16);
    w.u16(to.len() as u16);
    w.zeros(4);
    for name in [from, to] {
        w.bytes(name);
        w.zeros(MAX_NAME_BYTES - name.len());
    }
    Ok(w.seal(HEADER_CRC_AT))
}

pub fn decode_diff_header(buf: &[u8]) -> Result<DiffHeader, FormatError> {
    let (mut r, _flags) =
        open_fixed_record(buf, WHAT, DIFF_HEADER_BYTES, DIFF_MAGIC, DIFF_VERSION, 0)?;
    let volume = VolumeId(r.array()?);
    let [
        size_bytes,
        created_unix_ms,
        from_through_seq,
        to_through_seq,
    ] = r.u64s()?;
    let from_len = r.u16()? as usize;
    let to_len = r.u16()? as usize;
    if r.u32()? != 0 {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let from_field: [u8; MAX_NAME_BYTES] = r.array()?;
    let to_field: [u8; MAX_NAME_BYTES] = r.array()?;
    let from_snapshot = if from_len == 0 {
        if from_field.iter().any(|&b| b != 0) || from_through_seq != 0 {
            return Err(invalid(WHAT, "a base without a name"));
        }
        None
    } else {
        Some(padded_text(WHAT, "base name", from_len, &from_field)?)
    };
    let to_snapshot = padded_text(WHAT, "target name", to_len, &to_field)?;
    if !size_bytes.is_multiple_of(UNIT_BYTES) {
        return Err(invalid(
            WHAT,
            format!("a volume size of {size_bytes} bytes"),
        ));
    }
    if from_through_seq > to_through_seq {
        return Err(invalid(WHAT, "the base is newer than the target"));
    }
    Ok(DiffHeader {
        volume,
        size_bytes,
        created_unix_ms,
        from_snapshot,
        from_through_seq,
        to_snapshot,
        to_through_seq,
    })
}

fn record_head(kind: u8, offset: u64, length: u64, payload: &[u8]) -> [u8; DIFF_RECORD_HEAD_BYTES] {
    let mut head = [0u8; DIFF_RECORD_HEAD_BYTES];
    head[0] = kind;
    head[8..16].copy_from_slice(&offset.to_le_bytes());
    head[16..24].copy_from_slice(&length.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), payload);
    head[RECORD_CRC_AT..RECORD_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    head
}

/// Writes records in order, checking what it is given as the reader will, and keeps
/// the counts the end record needs.
#[derive(Debug)]
pub struct DiffEncoder {
    size_bytes: u64,
    next_offset: u64,
    records: u64,
    data_bytes: u64,
}

impl DiffEncoder {
    pub fn new(size_bytes: u64) -> Self {
        DiffEncoder {
            size_bytes,
            next_offset: 0,
            records: 0,
            data_bytes: 0,
        }
    }

    /// The head of a data record for `data` at `offset` (the data follows it).
    pub fn data(
        &mut self,
        offset: u64,
        data: &[u8],
    ) -> Result<[u8; DIFF_RECORD_HEAD_BYTES], FormatError> {
        let length = data.len() as u64;
        self.place(offset, length, MAX_DATA_RECORD_BYTES)?;
        self.data_bytes += length;
        Ok(record_head(KIND_DATA, offset, length, data))
    }

    /// A zero record for `[offset, offset + length)`.
    pub fn zeros(
        &mut self,
        offset: u64,
        length: u64,
    ) -> Result<[u8; DIFF_RECORD_HEAD_BYTES], FormatError> {
        self.place(offset, length, u64::MAX)?;
        Ok(record_head(KIND_ZEROS, offset, length, &[]))
    }

    /// The end record.
    pub fn end(&self) -> [u8; DIFF_RECORD_HEAD_BYTES] {
        record_head(KIND_END, self.records, self.data_bytes, &[])
    }

    /// Records and data bytes so far.
    pub fn totals(&self) -> (u64, u64) {
        (self.records, self.data_bytes)
    }

    fn place(&mut self, offset: u64, length: u64, max: u64) -> Result<(), FormatError> {
        check_place(self.size_bytes, self.next_offset, offset, length, max)?;
        self.next_offset = offset + length;
        self.records += 1;
        Ok(())
    }
}

fn check_place(
    size_bytes: u64,
    next_offset: u64,
    offset: u64,
    length: u64,
    max: u64,
) -> Result<(), FormatError> {
    if !offset.is_multiple_of(UNIT_BYTES)
        || !length.is_multiple_of(UNIT_BYTES)
        || length == 0
        || length > max
    {
        return Err(invalid(
            RECORD,
            format!("{length} bytes at {offset}: not whole 512-byte units, empty or too long"),
        ));
    }
    if offset < next_offset {
        return Err(invalid(
            RECORD,
            format!("offset {offset} is before the previous record's end {next_offset}"),
        ));
    }
    if offset
        .checked_add(length)
        .is_none_or(|end| end > size_bytes)
    {
        return Err(invalid(
            RECORD,
            format!("{length} bytes at {offset} run past the volume's {size_bytes} bytes"),
        ));
    }
    Ok(())
}

/// Reads a diff stream: the header, then records until the end record, each checked
/// before it is returned. Memory: one record.
pub struct DiffDecoder<R> {
    input: R,
    header: DiffHeader,
    next_offset: u64,
    records: u64,
    data_bytes: u64,
    done: bool,
}

impl<R: Read> DiffDecoder<R> {
    /// Read and check the header.
    pub fn new(mut input: R) -> Result<Self, FormatError> {
        let mut buf = [0u8; DIFF_HEADER_BYTES];
        read_full(&mut input, &mut buf, WHAT)?;
        let header = decode_diff_header(&buf)?;
        Ok(DiffDecoder {
            input,
            header,
            next_offset: 0,
            records: 0,
            data_bytes: 0,
            done: false,
        })
    }

    pub fn header(&self) -> &DiffHeader {
        &self.header
    }

    /// The next record, or `None` after a valid end record (and nothing after it).
    pub fn next_record(&mut self) -> Result<Option<DiffRecord>, FormatError> {
        if self.done {
            return Ok(None);
        }
        let mut head = [0u8; DIFF_RECORD_HEAD_BYTES];
        read_full(&mut self.input, &mut head, RECORD)?;
        let kind = head[0];
        let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let field = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let (offset, length) = (field(8), field(16));
        if head[1..4] != [0, 0, 0] {
            return Err(invalid(RECORD, "reserved bytes are not zero"));
        }
        match kind {
            KIND_END => {
                check_crc(RECORD, &head, RECORD_CRC_AT, stored)?;
                if (offset, length) != (self.records, self.data_bytes) {
                    return Err(invalid(
                        RECORD,
                        format!(
                            "the end record counts {offset} records and {length} data bytes, the stream had {} and {}",
                            self.records, self.data_bytes
                        ),
                    ));
                }
                let mut extra = [0u8; 1];
                match self.input.read(&mut extra) {
                    Ok(0) => {}
                    Ok(_) => return Err(invalid(RECORD, "bytes after the end record")),
                    Err(e) => return Err(invalid(RECORD, format!("cannot read: {e}"))),
                }
                self.done = true;
                Ok(None)
            }
            KIND_ZEROS => {
                check_crc(RECORD, &head, RECORD_CRC_AT, stored)?;
                check_place(
                    self.header.size_bytes,
                    self.next_offset,
                    offset,
                    length,
                    u64::MAX,
                )?;
                self.placed(offset, length);
                Ok(Some(DiffRecord::Zeros { offset, length }))
            }
            KIND_DATA => {
                check_place(
                    self.header.size_bytes,
                    self.next_offset,
                    offset,
                    length,
                    MAX_DATA_RECORD_BYTES,
                )?;
                let mut data = vec![0u8; length as usize];
                read_full(&mut self.input, &mut data, RECORD)?;
                let mut hole = head;
                hole[RECORD_CRC_AT..RECORD_CRC_AT + 4].fill(0);
                let computed = crc32c::crc32c_append(crc32c::crc32c(&hole), &data);
                if computed != stored {
                    return Err(FormatError::BadChecksum {
                        what: RECORD,
                        stored,
                        computed,
                    });
                }
                self.placed(offset, length);
                self.data_bytes += length;
                Ok(Some(DiffRecord::Data { offset, data }))
            }
            other => Err(invalid(RECORD, format!("unknown record kind {other}"))),
        }
    }

    fn placed(&mut self, offset: u64, length: u64) {
        self.next_offset = offset + length;
        self.records += 1;
    }
}

/// Fill `buf`, refusing a stream that ends first.
fn read_full(input: &mut impl Read, buf: &mut [u8], what: &'static str) -> Result<(), FormatError> {
    let mut have = 0;
    while have < buf.len() {
        match input.read(&mut buf[have..]) {
            Ok(0) => {
                return Err(FormatError::Truncated {
                    what,
                    need: buf.len(),
                    have,
                });
            }
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(invalid(what, format!("cannot read: {e}"))),
        }
    }
    Ok(())
}

/// A whole diff in memory (tests, fuzzing, golden files).
pub fn encode_diff(h: &DiffHeader, records: &[DiffRecord]) -> Result<Vec<u8>, FormatError> {
    let mut out = encode_diff_header(h)?;
    let mut enc = DiffEncoder::new(h.size_bytes);
    for r in records {
        match r {
            DiffRecord::Data { offset, data } => {
                out.extend_from_slice(&enc.data(*offset, data)?);
                out.extend_from_slice(data);
            }
            DiffRecord::Zeros { offset, length } => {
                out.extend_from_slice(&enc.zeros(*offset, *length)?)
            }
        }
    }
    out.extend_from_slice(&enc.end());
    Ok(out)
}

/// Decode a whole diff held in memory.
pub fn decode_diff(buf: &[u8]) -> Result<(DiffHeader, Vec<DiffRecord>), FormatError> {
    let mut d = DiffDecoder::new(buf)?;
    let mut records = Vec::new();
    while let Some(r) = d.next_record()? {
        records.push(r);
    }
    Ok((d.header, records))
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
