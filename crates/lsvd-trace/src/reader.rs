//! [`TraceReader`]: a streaming iterator of [`Request`]s over any supported
//! trace, with parse statistics and an optional strict mode.
//!
//! Traces are large (the full MSR and Tencent sets are many GiB) and the
//! simulator wants over a million requests per second on one core, so the
//! reader streams: one reused line buffer, fields parsed in place, volume
//! ids cached. Malformed lines are counted and skipped by default, because
//! real traces contain some; strict mode turns the first one into an error
//! for when a silent miscount would mislead.

use std::io::{BufRead, Cursor, Read};
use std::path::{Path, PathBuf};

use crate::formats::vscsi::{self, MAX_RECORD};
use crate::formats::{self, Line, LineParser, Record};
use crate::input::{self, Input};
use crate::volumes::Volumes;
use crate::{Error, Format, Request, Result, SECTOR_BYTES, Units};

/// How many bad lines [`ParseStats::first_bad`] keeps.
pub const MAX_BAD_LINES_KEPT: usize = 10;

/// Counters of what a [`TraceReader`] has seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseStats {
    /// Lines read (records, for binary formats), including headers, blank
    /// lines, skipped and bad ones.
    pub lines: u64,
    /// Requests returned.
    pub requests: u64,
    /// Well-formed records that are not data requests (zero length, or a
    /// non-READ/WRITE SCSI command) and were dropped.
    pub skipped: u64,
    /// Malformed lines dropped (in strict mode the first one is an error).
    pub bad_lines: u64,
    /// The first [`MAX_BAD_LINES_KEPT`] bad lines: 1-based line number and
    /// why.
    pub first_bad: Vec<(u64, String)>,
    /// Requests whose timestamp is earlier than the previous request's
    /// (their order is kept; see [`crate::formats`] for their times).
    pub unordered: u64,
    /// Requests whose offset or length (in bytes) is not a multiple of 512,
    /// including every request shorter than a sector. Nearly all of them
    /// means a sector-unit trace read as bytes ([`crate::units_warning`]).
    pub misaligned: u64,
    /// Requests whose length (in bytes) is a multiple of 256 KiB (512
    /// sectors). Nearly all of them, read in sectors, means a byte-unit
    /// trace read as sectors.
    pub multiple_of_256k: u64,
}

/// Where the bytes come from and how they are cut into records.
enum Source {
    Text {
        input: Input,
        buf: Vec<u8>,
        parse: LineParser,
    },
    Vscsi {
        input: Input,
        version: vscsi::Version,
        rec: [u8; MAX_RECORD],
    },
}

/// A streaming reader of one trace file. Iterating yields [`Request`]s; an
/// I/O error or (in strict mode) a bad line ends the iteration and is kept
/// in [`TraceReader::error`]. Use [`TraceReader::next_request`] to get
/// errors directly instead.
pub struct TraceReader {
    format: Format,
    /// The units of offsets and sizes, for formats that take a choice.
    units: Option<Units>,
    path: Option<PathBuf>,
    source: Source,
    strict: bool,
    volumes: Volumes,
    stats: ParseStats,
    /// Absolute time of the first request.
    base_ns: Option<u64>,
    /// Absolute time of the previous request.
    last_ns: u64,
    error: Option<Error>,
    done: bool,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("format", &self.format)
            .field("path", &self.path)
            .field("strict", &self.strict)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TraceReader {
    /// Opens the trace at `path` in `format`, decompressing `.gz`/`.bz2`
    /// content transparently. Bad lines are counted and skipped.
    pub fn open(path: impl AsRef<Path>, format: Format) -> Result<Self> {
        let path = path.as_ref();
        let input = input::open(path)?;
        let mut reader = Self::with_input(input, format).map_err(|e| with_path(e, path))?;
        reader.path = Some(path.to_path_buf());
        Ok(reader)
    }

    /// Like [`TraceReader::open`], but the first bad line is an
    /// [`Error::BadLine`].
    pub fn open_strict(path: impl AsRef<Path>, format: Format) -> Result<Self> {
        Ok(Self::open(path, format)?.strict(true))
    }

    /// Reads a trace from any buffered reader (decompressing gzip/bzip2
    /// content, recognized by its magic bytes).
    pub fn from_reader<R: BufRead + Send + 'static>(reader: R, format: Format) -> Result<Self> {
        Self::with_input(input::decompress(reader)?, format)
    }

    /// Reads offsets and sizes in `units` instead of the format's default,
    /// for the formats that circulate in both ([`Units::default_for`]:
    /// msr-cut, in bytes by default, and disksim, in sectors). Call before
    /// reading. Another format is an [`Error::InvalidArgument`].
    pub fn units(mut self, units: Units) -> Result<Self> {
        let parser = formats::line_parser_in(self.format, units).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "--units applies to {} traces only; {} traces fix their own units",
                Units::FORMATS.map(Format::name).join(" and "),
                self.format
            ))
        })?;
        if let Source::Text { parse, .. } = &mut self.source {
            *parse = parser;
        }
        self.units = Some(units);
        Ok(self)
    }

    /// The units offsets and sizes are read in, for formats that take a
    /// choice (`None` for the others).
    pub fn units_in_use(&self) -> Option<Units> {
        self.units
    }

    /// One warning line if the requests read so far look like the trace is
    /// in the other unit ([`crate::units_warning`]); `None` otherwise.
    pub fn units_warning(&self) -> Option<String> {
        crate::units_warning(self.format, self.units?, &self.stats)
    }

    /// Sets strict mode: the first bad line ends reading with an error.
    #[must_use]
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    fn with_input(mut input: Input, format: Format) -> Result<Self> {
        let source = match formats::line_parser(format) {
            Some(parse) => Source::Text {
                input,
                buf: Vec::with_capacity(256),
                parse,
            },
            None => {
                // Peek at the first two records to learn the layout, then
                // put them back in front of the rest.
                let mut head = vec![0u8; 2 * MAX_RECORD];
                let n = input::read_full(&mut input, &mut head)?;
                head.truncate(n);
                let version = if n == 0 {
                    vscsi::Version::V1
                } else {
                    vscsi::detect_version(&head).ok_or_else(|| {
                        Error::Format("not a vscsi trace (unknown record version)".into())
                    })?
                };
                Source::Vscsi {
                    input: Box::new(Cursor::new(head).chain(input)),
                    version,
                    rec: [0u8; MAX_RECORD],
                }
            }
        };
        Ok(TraceReader {
            format,
            units: Units::default_for(format),
            path: None,
            source,
            strict: false,
            volumes: Volumes::new(formats::volume_prefix(format)),
            stats: ParseStats::default(),
            base_ns: None,
            last_ns: 0,
            error: None,
            done: false,
        })
    }

    /// The format being read.
    pub fn format(&self) -> Format {
        self.format
    }

    /// What has been read so far.
    pub fn stats(&self) -> &ParseStats {
        &self.stats
    }

    /// The name of volume `id` (e.g. `hm_0`, `asu3`, `vol1058`), or `"?"`
    /// for an id not seen yet.
    pub fn volume_name(&self, id: u32) -> &str {
        self.volumes
            .names()
            .get(id as usize)
            .map_or("?", String::as_str)
    }

    /// Names of the volumes seen so far, indexed by id.
    pub fn volumes(&self) -> &[String] {
        self.volumes.names()
    }

    /// The error that ended iteration, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// Consumes the reader: its stats, or the error that ended iteration.
    pub fn finish(self) -> Result<ParseStats> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.stats),
        }
    }

    /// The next request, `Ok(None)` at the end, or an I/O error (or bad
    /// line, in strict mode).
    pub fn next_request(&mut self) -> Result<Option<Request>> {
        let TraceReader {
            source,
            strict,
            volumes,
            stats,
            base_ns,
            last_ns,
            path,
            ..
        } = self;
        loop {
            stats.lines += 1;
            let line_no = stats.lines;
            let parsed = match source {
                Source::Text { input, buf, parse } => {
                    buf.clear();
                    let n = input
                        .read_until(b'\n', buf)
                        .map_err(|e| Error::io(path.clone(), e))?;
                    if n == 0 {
                        stats.lines -= 1;
                        return Ok(None);
                    }
                    let line = buf.trim_ascii();
                    if line.is_empty() || line[0] == b'#' {
                        continue;
                    }
                    parse(line)
                }
                Source::Vscsi {
                    input,
                    version,
                    rec,
                } => {
                    let size = version.record_size();
                    let n = input::read_full(input, &mut rec[..size])
                        .map_err(|e| Error::io(path.clone(), e))?;
                    if n == 0 {
                        stats.lines -= 1;
                        return Ok(None);
                    }
                    if n < size {
                        Err(format!("truncated record: {n} of {size} bytes"))
                    } else {
                        vscsi::decode(*version, &rec[..size])
                    }
                }
            };
            let record: Record<'_> = match parsed {
                Ok(Line::Record(r)) if r.length > 0 => r,
                Ok(Line::Record(_) | Line::Skipped) => {
                    stats.skipped += 1;
                    continue;
                }
                Ok(Line::Header) => continue,
                Err(why) => {
                    stats.bad_lines += 1;
                    if stats.first_bad.len() < MAX_BAD_LINES_KEPT {
                        stats.first_bad.push((line_no, why.clone()));
                    }
                    if *strict {
                        return Err(Error::BadLine { line: line_no, why });
                    }
                    continue;
                }
            };
            let base = *base_ns.get_or_insert(record.time_ns);
            if record.time_ns < *last_ns {
                stats.unordered += 1;
            }
            *last_ns = record.time_ns;
            stats.requests += 1;
            if !(record.offset | record.length).is_multiple_of(SECTOR_BYTES) {
                stats.misaligned += 1;
            }
            if record.length.is_multiple_of(SECTOR_BYTES * SECTOR_BYTES) {
                stats.multiple_of_256k += 1;
            }
            return Ok(Some(Request {
                time_ns: record.time_ns.saturating_sub(base),
                volume: volumes.id(record.volume),
                op: record.op,
                offset_bytes: record.offset,
                length_bytes: record.length,
            }));
        }
    }
}

fn with_path(e: Error, path: &Path) -> Error {
    match e {
        Error::Io { path: None, source } => Error::Io {
            path: Some(path.to_path_buf()),
            source,
        },
        Error::Format(msg) => Error::Format(format!("{}: {msg}", path.display())),
        other => other,
    }
}

impl Iterator for TraceReader {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.done {
            return None;
        }
        match self.next_request() {
            Ok(Some(r)) => Some(r),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                self.error = Some(e);
                None
            }
        }
    }
}

impl std::iter::FusedIterator for TraceReader {}
