//! Fuzz check for the block-trace readers of `lsvd_trace` (every format, and the
//! gzip/bzip2 decompression they sniff by magic bytes).
//!
//! The first byte picks the format, the rest is the file. Reading must not panic and
//! every request it yields keeps the documented invariants: a non-zero length and a
//! volume id that names a volume. Reading stops after [`MAX_REQUESTS`] requests, so a
//! small compressed input cannot run for long.

use std::io::Cursor;

use lsvd_trace::{Format, TraceReader};

const MAX_REQUESTS: usize = 20_000;

/// Target `trace_parse`.
pub fn trace(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let format = Format::ALL[usize::from(which) % Format::ALL.len()];
    let Ok(mut reader) = TraceReader::from_reader(Cursor::new(rest.to_vec()), format) else {
        return;
    };
    for _ in 0..MAX_REQUESTS {
        match reader.next_request() {
            Ok(Some(r)) => {
                assert!(r.length_bytes > 0, "{format:?}: zero-length request");
                assert!(
                    (r.volume as usize) < reader.volumes().len(),
                    "{format:?}: volume id {} of {} volumes",
                    r.volume,
                    reader.volumes().len()
                );
                let _ = reader.volume_name(r.volume);
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = reader.stats();
}
