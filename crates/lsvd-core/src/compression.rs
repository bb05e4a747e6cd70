//! Chunk compression: which codec a volume writes its objects with, and the two
//! operations on one chunk (compress when it saves space, decompress to an exact
//! length).
//!
//! Objects of format version 5 store each chunk of their data section either raw or
//! compressed with the object's codec (docs/format/object.md); the codec's number is
//! persisted there, so [`Codec`] codes never change meaning. A compression level is a
//! writer's choice only: a reader needs the codec, never the level.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

thread_local! {
    /// Each thread's zstd compression context and the level it is set to: making one
    /// per chunk cost more than compressing the chunk.
    static ZSTD_COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    /// Each thread's zstd decompression context.
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Compress `src` into `out` (room for one byte less than `src`) with this thread's
/// zstd context at `level`; the compressed length, or None if it did not fit.
fn zstd_compress(level: i32, src: &[u8], out: &mut [u8]) -> Option<usize> {
    ZSTD_COMPRESSOR.with_borrow_mut(|slot| {
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, c) = slot.as_mut()?;
        c.compress_to_buffer(src, out).ok()
    })
}

/// Decompress `src` into `dst` with this thread's zstd context; the length written.
fn zstd_decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, String> {
    ZSTD_DECOMPRESSOR.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        let d = slot.as_mut().ok_or("no zstd context")?;
        d.decompress_to_buffer(src, dst).map_err(|e| e.to_string())
    })
}

/// A codec as object headers name it (the level is not persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// Every chunk raw.
    #[default]
    None,
    /// LZ4 block format (`lz4_flex`), no frame: fast, modest ratio.
    Lz4,
    /// Zstandard, one frame per chunk: slower, better ratio.
    Zstd,
}

impl Codec {
    /// The code persisted in object headers.
    pub fn code(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// The zstd level `zstd` alone means: zstd's own default, a good ratio at a few
/// hundred MB/s per core.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// How a volume compresses what it writes: `none`, `lz4` or `zstd[:LEVEL]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    /// Zstandard at this level (1 to 19).
    Zstd(i32),
}

impl Compression {
    pub fn codec(self) -> Codec {
        match self {
            Compression::None => Codec::None,
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd(_) => Codec::Zstd,
        }
    }

    pub fn is_none(self) -> bool {
        self == Compression::None
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("compression {s:?}: expected none, lz4, zstd or zstd:LEVEL (1-19)");
        match s.split_once(':') {
            None if s == "none" => Ok(Compression::None),
            None if s == "lz4" => Ok(Compression::Lz4),
            None if s == "zstd" => Ok(Compression::Zstd(ZSTD_DEFAULT_LEVEL)),
            Some(("zstd", level)) => match level.parse::<i32>() {
                Ok(l) if (1..=19).contains(&l) => Ok(Compression::Zstd(l)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// Compress `src` with `compression` into `out` (cleared first). Returns false, and
/// leaves `out` unspecified, when the compressed form would not be smaller than `src`:
/// the chunk is then stored raw.
pub fn compress_chunk(compression: Compression, src: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    match compression {
        Compression::None => false,
        Compression::Lz4 => {
            out.resize(lz4_flex::block::get_maximum_output_size(src.len()), 0);
            match lz4_flex::block::compress_into(src, out) {
                Ok(n) if n < src.len() => {
                    out.truncate(n);
                    true
                }
                _ => false,
            }
        }
        Compression::Zstd(level) => {
            // Room for one byte less than the input: zstd fails (and we store the
            // chunk raw) when its output would not fit.
            out.resize(src.len().saturating_sub(1), 0);
            match zstd_compress(level, src, out) {
                Some(n) => {
                    out.truncate(n);
                    true
                }
                None => false,
            }
        }
    }
}

/// Decompress `src`, a chunk compressed with `codec`, into exactly `dst.len()` bytes;
/// anything else (a short or long result, a malformed stream) is an error saying why.
pub fn decompress_chunk(codec: Codec, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let n = match codec {
        Codec::None => return Err("a chunk marked compressed in an object without a codec".into()),
        Codec::Lz4 => lz4_flex::block::decompress_into(src, dst).map_err(|e| e.to_string())?,
        Codec::Zstd => zstd_decompress(src, dst)?,
    };
    if n != dst.len() {
        return Err(format!(
            "a chunk decompressed to {n} bytes, expected {}",
            dst.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Vec<u8> {
        b"the quick brown fox jumps over the lazy dog. "
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect()
    }

    fn noise(len: usize) -> Vec<u8> {
        let mut next = crate::test_rng::xorshift64(7);
        (0..len).map(|_| next() as u8).collect()
    }

    #[test]
    fn parses_and_prints_every_setting() {
        for (text, want) in [
            ("none", Compression::None),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd(ZSTD_DEFAULT_LEVEL)),
            ("zstd:1", Compression::Zstd(1)),
            ("zstd:19", Compression::Zstd(19)),
        ] {
            assert_eq!(text.parse::<Compression>(), Ok(want), "{text}");
            let printed = want.to_string();
            assert_eq!(printed.parse::<Compression>(), Ok(want), "{printed}");
        }
        for bad in ["", "zlib", "zstd:0", "zstd:20", "zstd:x", "lz4:1", "none:1"] {
            let e = bad.parse::<Compression>().expect_err(bad);
            assert!(e.contains("expected none, lz4"), "{bad}: {e}");
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for c in [Codec::None, Codec::Lz4, Codec::Zstd] {
            assert_eq!(Codec::from_code(c.code()), Some(c));
        }
        assert_eq!(Codec::from_code(3), None);
    }

    #[test]
    fn compressible_chunks_round_trip_smaller() {
        let src = text(64 << 10);
        for c in [Compression::Lz4, Compression::Zstd(1), Compression::Zstd(3)] {
            let mut out = Vec::new();
            assert!(compress_chunk(c, &src, &mut out), "{c}");
            assert!(out.len() < src.len() / 4, "{c}: {} bytes", out.len());
            let mut back = vec![0u8; src.len()];
            decompress_chunk(c.codec(), &out, &mut back).expect("decompresses");
            assert_eq!(back, src, "{c}");
        }
    }

    #[test]
    fn incompressible_chunks_are_not_compressed() {
        let src = noise(64 << 10);
        for c in [Compression::None, Compression::Lz4, Compression::Zstd(3)] {
            let mut out = Vec::new();
            assert!(!compress_chunk(c, &src, &mut out), "{c}");
        }
    }

    #[test]
    fn wrong_lengths_and_garbage_are_errors_not_panics() {
        let src = text(4096);
        for c in [Compression::Lz4, Compression::Zstd(3)] {
            let mut out = Vec::new();
            assert!(compress_chunk(c, &src, &mut out));
            let mut short = vec![0u8; 4000];
            assert!(
                decompress_chunk(c.codec(), &out, &mut short).is_err(),
                "{c} short"
            );
            let mut long = vec![0u8; 5000];
            assert!(
                decompress_chunk(c.codec(), &out, &mut long).is_err(),
                "{c} long"
            );
            let mut dst = vec![0u8; 4096];
            for cut in [0, 1, out.len() / 2] {
                assert!(
                    decompress_chunk(c.codec(), &out[..cut], &mut dst).is_err(),
                    "{c} cut at {cut}"
                );
            }
            assert!(
                decompress_chunk(c.codec(), &noise(300), &mut dst).is_err(),
                "{c} noise"
            );
        }
        let mut dst = vec![0u8; 16];
        assert!(decompress_chunk(Codec::None, b"abc", &mut dst).is_err());
    }
}
