//! The one error type of the engine, the object stores and the command line.
//!
//! Why: callers must be able to tell failures apart without reading messages. The NBD
//! server answers a misaligned request with EINVAL but a failed store with EIO; the
//! command line exits 2 for bad input and 1 for everything else; `lsvd serve` creates
//! its default volume only when the volume is *missing*, not when its metadata is
//! unreadable. A `String` or an `io::Error::other` could not say which is which, and
//! they dropped the error that caused them.
//!
//! # Shape
//!
//! An [`Error`] is three things:
//!
//! * a [`kind`](Error::kind) that callers branch on (a small, closed set: see
//!   [`ErrorKind`]);
//! * a [`message`](Error::message): the one line users read, with the context added by
//!   each layer it passed through, outermost first ([`Error::context`]);
//! * an optional [`source`](std::error::Error::source): the error that caused it (an
//!   `io::Error`, a format error), kept whole so nothing is lost.
//!
//! It displays as `message: source` (or just one of them if the other is empty), so a
//! site that used to write `format!("reading {key}: {e}")` keeps its text exactly.
//! It is `Clone` (the source is shared), so one failure can answer many waiting
//! requests.
//!
//! # Which kind
//!
//! * What the caller asked for does not exist: [`NotFound`](ErrorKind::NotFound); it
//!   exists already: [`AlreadyExists`](ErrorKind::AlreadyExists).
//! * The caller's input is wrong (a range, an alignment, a name, a size, an option,
//!   a URL): [`BadInput`](ErrorKind::BadInput).
//! * Bytes lsvd wrote earlier fail their checks: [`Corrupt`](ErrorKind::Corrupt). Bytes
//!   that are sound but belong to someone else (another process owns the volume):
//!   [`Conflict`](ErrorKind::Conflict).
//! * Recovery would have to drop data the store acknowledged, and strict mode refuses:
//!   [`DataLoss`](ErrorKind::DataLoss).
//! * The object store failed: pass its kind on ([`Transient`](ErrorKind::Transient),
//!   [`Permanent`](ErrorKind::Permanent), `NotFound`, ...) with
//!   [`context`](Error::context); never rewrap a store error as something else. The
//!   local disk failed: [`LocalIo`](ErrorKind::LocalIo), with the `io::Error` as source.
//! * The volume cannot take requests any more: [`VolumeFailed`](ErrorKind::VolumeFailed)
//!   after an earlier failure, [`ShuttingDown`](ErrorKind::ShuttingDown) while it
//!   closes.
//!
//! Callers outside this crate that speak `io::Error` (the NBD server) convert with
//! `io::Error::from(e)`: the kind maps to an `io::ErrorKind` and the `Error` stays
//! inside, recoverable with `get_ref().downcast_ref::<Error>()`.

use std::fmt;
use std::io;
use std::sync::Arc;

/// What went wrong, as far as a caller needs to know to decide what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A volume, object or key that does not exist.
    NotFound,
    /// Creating something that exists already; a put-if-absent key that is taken.
    AlreadyExists,
    /// Persisted bytes fail their magic, version, checksum or decoding, or do not match
    /// their name.
    Corrupt,
    /// Another lsvd process owns or writes the volume: a superseded superblock
    /// generation, an object key holding foreign contents, a write log of another
    /// volume.
    Conflict,
    /// Recovery refuses to continue: the store lost data it had acknowledged (strict
    /// recovery mode).
    DataLoss,
    /// The object store is failing for now: a retry may help.
    Transient,
    /// The object store refuses for good: a bad request, a permanent I/O error.
    Permanent,
    /// There is no room: the store's filesystem is full (ENOSPC), a quota is used up
    /// (EDQUOT, S3 `QuotaExceeded`, HTTP 507), every drive of a chain is full. Not
    /// retried in a loop: reported at once; it ends when someone makes room. NBD
    /// clients see ENOSPC.
    Full,
    /// The store refuses these credentials or this request (HTTP 401/403, EACCES,
    /// EPERM on the store's files). Not retried in a loop: reported at once.
    Denied,
    /// The cache device or the local filesystem failed.
    LocalIo,
    /// The volume stopped taking requests after an earlier failure.
    VolumeFailed,
    /// The volume is shutting down.
    ShuttingDown,
    /// User input or a request that is invalid: a range, an alignment, a name, a size,
    /// an option.
    BadInput,
    /// Writing to something that is read-only.
    ReadOnly,
    /// Something this build or this store does not support.
    Unsupported,
}

impl ErrorKind {
    /// Every kind, for exhaustive tests.
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::Corrupt,
        ErrorKind::Conflict,
        ErrorKind::DataLoss,
        ErrorKind::Transient,
        ErrorKind::Permanent,
        ErrorKind::Full,
        ErrorKind::Denied,
        ErrorKind::LocalIo,
        ErrorKind::VolumeFailed,
        ErrorKind::ShuttingDown,
        ErrorKind::BadInput,
        ErrorKind::ReadOnly,
        ErrorKind::Unsupported,
    ];

    /// The kind whose `Debug` name is `name` (how the control socket carries kinds).
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|k| format!("{k:?}") == name)
    }

    /// The `io::ErrorKind` an `Error` of this kind becomes in an `io::Error`, which the
    /// NBD server turns into an errno: `EINVAL`, `EPERM`, `ENOTSUP`, `ESHUTDOWN`,
    /// `ENOSPC` (`Full`), and `EIO` for everything else.
    pub fn io_kind(self) -> io::ErrorKind {
        match self {
            ErrorKind::BadInput => io::ErrorKind::InvalidInput,
            ErrorKind::NotFound => io::ErrorKind::NotFound,
            ErrorKind::AlreadyExists => io::ErrorKind::AlreadyExists,
            ErrorKind::ReadOnly => io::ErrorKind::PermissionDenied,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            ErrorKind::ShuttingDown => io::ErrorKind::BrokenPipe,
            ErrorKind::Full => io::ErrorKind::StorageFull,
            ErrorKind::Denied
            | ErrorKind::Corrupt
            | ErrorKind::Conflict
            | ErrorKind::DataLoss
            | ErrorKind::Transient
            | ErrorKind::Permanent
            | ErrorKind::LocalIo
            | ErrorKind::VolumeFailed => io::ErrorKind::Other,
        }
    }
}

/// The shared cause of an [`Error`].
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// An lsvd error: a kind to branch on, a message for people, and the error that caused
/// it (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct Error {
    /// What kind of failure this is.
    pub kind: ErrorKind,
    /// What happened, with the context of each layer outermost first. The source, if
    /// any, is not part of it (`Display` adds it).
    pub message: String,
    source: Option<Source>,
}

/// The result of anything in this crate that can fail.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error of `kind` saying `message`, caused by `source` (displayed after it).
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error {
            kind,
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// A failure of the cache device or the local filesystem: `what` (e.g. "cannot open
    /// write log PATH") caused by `e`.
    pub fn local_io(what: impl Into<String>, e: io::Error) -> Self {
        Error::with_source(ErrorKind::LocalIo, what, e)
    }

    /// A [`BadInput`](ErrorKind::BadInput) error.
    pub fn bad_input(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::BadInput, message)
    }

    /// The same error with `context` in front: `"{context}: {message}"`. The kind and
    /// the source stay.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = if self.message.is_empty() {
            context.to_string()
        } else {
            format!("{context}: {}", self.message)
        };
        self
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.source, self.message.is_empty()) {
            (Some(s), true) => write!(f, "{s}"),
            (Some(s), false) => write!(f, "{}: {s}", self.message),
            (None, _) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// For callers that speak `io::Error` (the NBD server): the kind becomes
/// [`ErrorKind::io_kind`], the text is unchanged and the `Error` itself is the
/// `io::Error`'s inner error.
impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::new(e.kind.io_kind(), e)
    }
}

/// A trace (`lsvd replay`, `lsvd sim`) is the user's input: one that is unusable (its
/// format, a bad line in strict mode, a bad argument) is `BadInput`, one that cannot be
/// read `LocalIo`. The trace error is the source; the text is unchanged.
#[cfg(feature = "trace")]
impl From<lsvd_trace::Error> for Error {
    fn from(e: lsvd_trace::Error) -> Self {
        let kind = match e {
            lsvd_trace::Error::Io { .. } => ErrorKind::LocalIo,
            _ => ErrorKind::BadInput,
        };
        Error::with_source(kind, "", e)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn displays_message_then_source() {
        let e = Error::new(ErrorKind::Corrupt, "checkpoint k is corrupt");
        assert_eq!(e.to_string(), "checkpoint k is corrupt");
        assert!(e.source().is_none());
        let e = Error::local_io("open /x", io::Error::new(io::ErrorKind::NotFound, "gone"));
        assert_eq!(e.to_string(), "open /x: gone");
        let inner = e.source().expect("a source");
        assert_eq!(inner.to_string(), "gone");
        assert!(inner.downcast_ref::<io::Error>().is_some());
        let bare = Error::with_source(ErrorKind::LocalIo, "", io::Error::other("eio"));
        assert_eq!(bare.to_string(), "eio");
    }

    #[test]
    fn context_prefixes_and_keeps_kind_and_source() {
        let e = Error::with_source(ErrorKind::Transient, "get k", io::Error::other("reset"))
            .context("reading checkpoint k")
            .context("volume v");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert_eq!(e.message, "volume v: reading checkpoint k: get k");
        assert_eq!(
            e.to_string(),
            "volume v: reading checkpoint k: get k: reset"
        );
        assert!(e.source().is_some());
        let e = Error::with_source(ErrorKind::LocalIo, "", io::Error::other("eio"))
            .context("write-log write failed");
        assert_eq!(e.to_string(), "write-log write failed: eio");
        let copy = e.clone();
        assert_eq!(copy.to_string(), e.to_string());
        assert!(copy.source().is_some());
        assert!(Error::new(ErrorKind::NotFound, "x").is_not_found());
        assert!(!Error::new(ErrorKind::Corrupt, "x").is_not_found());
    }

    #[test]
    fn converts_to_io_error_keeping_itself_inside() {
        let e = Error::new(ErrorKind::BadInput, "request not aligned to 512 bytes");
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(io.to_string(), "request not aligned to 512 bytes");
        let inner = io
            .get_ref()
            .and_then(|i| i.downcast_ref::<Error>())
            .expect("the lsvd error is inside");
        assert_eq!(inner.kind, ErrorKind::BadInput);
    }
}
