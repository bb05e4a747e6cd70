//! Opens trace files and undoes their compression.
//!
//! Published traces ship as `.gz` (SYSTOR) or `.bz2` (Tencent). Compression
//! is recognized by magic bytes rather than the file name, so a renamed or
//! in-memory input decodes the same way.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use bzip2::read::MultiBzDecoder;
use flate2::read::MultiGzDecoder;

use crate::{Error, Result};

/// Buffer size for file and decoder input: large enough that read syscalls
/// are negligible next to parsing.
const BUF_BYTES: usize = 256 * 1024;

/// A boxed, sendable line source.
pub(crate) type Input = Box<dyn BufRead + Send>;

/// Opens `path`, decompressing gzip or bzip2 transparently.
pub(crate) fn open(path: &Path) -> Result<Input> {
    let file = File::open(path).map_err(|e| Error::io(Some(path.to_path_buf()), e))?;
    decompress(BufReader::with_capacity(BUF_BYTES, file))
        .map_err(|e| Error::io(Some(path.to_path_buf()), e))
}

/// Wraps `input` in a decoder if it starts with a gzip or bzip2 magic.
pub(crate) fn decompress<R: BufRead + Send + 'static>(mut input: R) -> io::Result<Input> {
    let head = input.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            BUF_BYTES,
            MultiGzDecoder::new(input),
        )))
    } else if head.starts_with(b"BZh") {
        Ok(Box::new(BufReader::with_capacity(
            BUF_BYTES,
            MultiBzDecoder::new(input),
        )))
    } else {
        Ok(Box::new(input))
    }
}

/// The first `max` decompressed bytes of `path` (fewer if it is shorter).
pub(crate) fn read_prefix(path: &Path, max: usize) -> Result<Vec<u8>> {
    let input = open(path)?;
    let mut prefix = Vec::with_capacity(max);
    input
        .take(max as u64)
        .read_to_end(&mut prefix)
        .map_err(|e| Error::io(Some(path.to_path_buf()), e))?;
    Ok(prefix)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
pub(crate) fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
