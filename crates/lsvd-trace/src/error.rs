//! The crate's single error type, so callers (CLI, simulator) can report any
//! failure—I/O, an unusable trace, a bad line in strict mode, a bad
//! argument—with one `?`.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong while reading traces or building workloads.
#[derive(Debug, Clone)]
pub enum Error {
    /// Reading the trace failed. `path` is set when the file is known.
    Io {
        /// The file being read, if any.
        path: Option<PathBuf>,
        /// The underlying error (shared so the error can be cloned).
        source: Arc<io::Error>,
    },
    /// The input is not in a usable trace format (detection failed, an
    /// unknown format name, a malformed binary header).
    Format(String),
    /// Strict mode: the first malformed record. `line` is 1-based (the
    /// record number for binary formats).
    BadLine {
        /// 1-based line (or record) number.
        line: u64,
        /// Why the line was rejected.
        why: String,
    },
    /// A caller-supplied argument is invalid (pattern string, synthetic spec).
    InvalidArgument(String),
}

impl Error {
    pub(crate) fn io(path: Option<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path,
            source: Arc::new(source),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                path: Some(p),
                source,
            } => write!(f, "{}: {source}", p.display()),
            Error::Io { path: None, source } => write!(f, "{source}"),
            Error::Format(msg) => write!(f, "trace format: {msg}"),
            Error::BadLine { line, why } => write!(f, "line {line}: {why}"),
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::io(None, e)
    }
}
