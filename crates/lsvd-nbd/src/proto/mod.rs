//! Sans-I/O NBD wire format: pure functions that turn bytes into typed messages and back.
//!
//! Keeping the codec free of sockets and async lets every encoding be checked against
//! golden bytes and every parser be hammered with random input in plain unit tests; the
//! [`crate::server`] module only moves bytes between a stream and these functions.
//!
//! Parsers take exactly-sized header arrays (the caller reads a fixed number of bytes) or a
//! bounded payload slice and never panic. Encoders append to a caller-owned `Vec<u8>`.
//! Both the server side and the client side of each message are provided, so tests (and
//! any future client) can speak the protocol with the same code.

pub mod consts;
pub mod handshake;
pub mod transmission;

use std::fmt;

/// Why a message could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtoError {
    /// A magic number did not match; the stream is out of sync.
    BadMagic,
    /// The message is structurally invalid (lengths disagree, bad UTF-8, unknown flag bits,
    /// string too long, ...). The text says what.
    Malformed(&'static str),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::BadMagic => f.write_str("bad NBD magic"),
            ProtoError::Malformed(why) => write!(f, "malformed NBD message: {why}"),
        }
    }
}

impl std::error::Error for ProtoError {}

impl From<ProtoError> for std::io::Error {
    fn from(e: ProtoError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// Bounds-checked big-endian reader over a payload slice.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf }
    }

    /// A cursor just past the magic number a message starts with, or
    /// [`ProtoError::BadMagic`] if the message starts with anything else.
    pub(crate) fn after_magic<const N: usize>(
        buf: &'a [u8],
        magic: [u8; N],
    ) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf);
        c.magic(magic)?;
        Ok(c)
    }

    /// Reads a magic number (its big-endian bytes); anything but `expected` is
    /// [`ProtoError::BadMagic`].
    pub(crate) fn magic<const N: usize>(&mut self, expected: [u8; N]) -> Result<(), ProtoError> {
        if self.array::<N>("magic")? != expected {
            return Err(ProtoError::BadMagic);
        }
        Ok(())
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if n > self.buf.len() {
            return Err(ProtoError::Malformed(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let bytes = self.bytes(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        self.array(what).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        self.array(what).map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        self.array(what).map(u64::from_be_bytes)
    }

    /// A string of `n` bytes: valid UTF-8, no NUL, at most [`consts::MAX_STRING_LEN`].
    pub(crate) fn string(&mut self, n: usize, what: &'static str) -> Result<String, ProtoError> {
        if n > consts::MAX_STRING_LEN {
            return Err(ProtoError::Malformed("string longer than 4096 bytes"));
        }
        let bytes = self.bytes(n, what)?;
        let s =
            std::str::from_utf8(bytes).map_err(|_| ProtoError::Malformed("string is not UTF-8"))?;
        if s.contains('\0') {
            return Err(ProtoError::Malformed("string contains NUL"));
        }
        Ok(s.to_owned())
    }
}

/// Length of a string or payload as the u32 the wire wants; callers bound their inputs,
/// this saturates rather than panics if they did not.
pub(crate) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Appends `bytes` after their length as a big-endian u32: how NBD frames option data
/// and the strings inside it.
pub(crate) fn put_sized(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len_u32(bytes.len()).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Shortens `s` to at most `max` bytes on a char boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Deterministic xorshift generator for the parser robustness tests (no `rand` dependency).
#[cfg(test)]
pub(crate) struct XorShift(pub u64);

#[cfg(test)]
impl XorShift {
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// `N` random bytes, as a fixed-size header buffer.
    pub(crate) fn array<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.next_u64() as u8)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
