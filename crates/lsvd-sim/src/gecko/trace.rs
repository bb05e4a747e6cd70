//! Trace-driven clients for the chained-log simulator: several block traces
//! interleaved request by request (round robin over the files), each file in an
//! address range of its own, replayed closed-loop (as fast as the drives allow; the
//! traces' timestamps are ignored), as Gecko mixes MSR traces on one array.
//!
//! Each file's blocks (every volume of it) are renumbered densely in order of first
//! touch, so the address space is the data the traces touch, not their sparse
//! offsets; the renumbering keeps the blocks of one request together. Requests are
//! split into pieces of at most `max_blocks` blocks; trims are skipped.

use std::collections::HashMap;
use std::path::PathBuf;

use lsvd_trace::{FormatChoice, Op, TraceReader};

use super::layout::BLOCK_BYTES;
use lsvd_core::error::{Error, Result};

/// The most distinct blocks a mix may touch (1 TiB).
const MAX_BLOCKS: u64 = 1 << 28;

/// One piece of a request, in the mix's dense block numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixRequest {
    pub write: bool,
    pub blocks: Vec<u64>,
}

/// The interleaved requests of all files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceMix {
    pub files: Vec<String>,
    pub requests: Vec<MixRequest>,
    /// Distinct blocks touched (the address space).
    pub logical_blocks: u64,
    pub skipped_trims: u64,
}

/// Reads `paths` (format `format`, as `lsvd sim` takes it) into one mix.
pub fn load(paths: &[PathBuf], format: &str, max_blocks: u64) -> Result<TraceMix> {
    let choice: FormatChoice = format.parse()?;
    let max_blocks = max_blocks.max(1);
    let mut mix = TraceMix::default();
    let mut per_file: Vec<Vec<MixRequest>> = Vec::new();
    for path in paths {
        let in_trace = |e: lsvd_trace::Error| Error::from(e).context(path.display());
        let format = choice.resolve(path).map_err(in_trace)?;
        let mut reader = TraceReader::open(path, format).map_err(in_trace)?;
        let mut dense: HashMap<(u32, u64), u64> = HashMap::new();
        let mut out = Vec::new();
        while let Some(r) = reader.next_request().map_err(in_trace)? {
            let write = match r.op {
                Op::Read => false,
                Op::Write => true,
                Op::Trim => {
                    mix.skipped_trims += 1;
                    continue;
                }
            };
            let first = r.offset_bytes / BLOCK_BYTES;
            let last = r.offset_bytes.saturating_add(r.length_bytes.max(1) - 1) / BLOCK_BYTES;
            let mut blocks = Vec::new();
            for b in first..=last.min(first + (1 << 20)) {
                let next = mix.logical_blocks;
                let id = *dense.entry((r.volume, b)).or_insert(next);
                if id == next {
                    mix.logical_blocks += 1;
                }
                blocks.push(id);
            }
            if mix.logical_blocks > MAX_BLOCKS {
                return Err(Error::bad_input(format!(
                    "{}: the traces touch more than {} GiB: too big to simulate",
                    path.display(),
                    (MAX_BLOCKS * BLOCK_BYTES) >> 30
                )));
            }
            for piece in blocks.chunks(max_blocks as usize) {
                out.push(MixRequest {
                    write,
                    blocks: piece.to_vec(),
                });
            }
        }
        mix.files.push(path.display().to_string());
        per_file.push(out);
    }
    let longest = per_file.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for f in &per_file {
            if let Some(r) = f.get(i) {
                mix.requests.push(r.clone());
            }
        }
    }
    if mix.requests.is_empty() {
        return Err(Error::bad_input("the traces hold no reads or writes"));
    }
    Ok(mix)
}
