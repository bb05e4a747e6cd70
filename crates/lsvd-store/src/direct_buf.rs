//! Buffers for objects built in memory and then put, aligned for `O_DIRECT` and
//! filled without being zeroed first.
//!
//! An object is megabytes: zeroing its buffer before overwriting every byte of it was
//! a measurable share of the server's CPU under small random writes (8% of a 4 KiB
//! write's instructions once; then 4% of all samples, in GC's objects and in uploads
//! whose records are read back from the write log). The two ways to build one without
//! that: append its bytes in order ([`DirectBuf::filled`], GC's objects), or place whole
//! pieces in any order where the pieces tile the object ([`Assembly`], uploads, which
//! take their pieces record by record).

use bytes::Bytes;

/// Alignment of `O_DIRECT` buffers, offsets and lengths: a multiple of any logical
/// block size (512 or 4096 bytes).
pub const DIRECT_ALIGN: usize = 4096;

/// A buffer whose first byte is aligned for `O_DIRECT`: the local store writes its
/// whole blocks straight from it, with no copy through a bounce buffer (an 8 MiB copy
/// per object was 7% of the server's CPU under 4 KiB random writes).
pub struct DirectBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

/// Where in `vec`'s allocation (of at least `DIRECT_ALIGN` spare bytes) the first
/// aligned byte is; 0 if the allocator cannot say.
fn aligned_start(vec: &[u8]) -> usize {
    match vec.as_ptr().align_offset(DIRECT_ALIGN) {
        s if s <= DIRECT_ALIGN => s,
        _ => 0,
    }
}

impl DirectBuf {
    /// `len` zeroed bytes. If the allocator cannot say where alignment starts, the
    /// buffer is unaligned and the store copies it through an aligned one.
    #[cfg(test)]
    pub fn zeroed(len: usize) -> DirectBuf {
        let vec = vec![0u8; len + DIRECT_ALIGN];
        let start = aligned_start(&vec);
        DirectBuf { vec, start, len }
    }

    /// `len` bytes appended in order by `fill` to an empty vector. `fill` must append
    /// exactly `len` (checked in debug builds); otherwise the rest is zeros, or the
    /// bytes past `len` are cut.
    pub fn filled(len: usize, fill: impl FnOnce(&mut Vec<u8>)) -> DirectBuf {
        let mut vec: Vec<u8> = Vec::with_capacity(len + DIRECT_ALIGN);
        let start = aligned_start(&vec);
        vec.resize(start, 0);
        fill(&mut vec);
        debug_assert_eq!(vec.len(), start + len, "filled as many bytes as announced");
        vec.resize(start + len, 0);
        DirectBuf { vec, start, len }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }

    /// The bytes, sharing the allocation (so its alignment) with no copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.vec).slice(self.start..self.start + self.len)
    }
}

/// A [`DirectBuf`] of `len` bytes being assembled from pieces placed in any order:
/// zeros up to `data_start`, then pieces of known lengths, back to back, that tile the
/// rest exactly. Each piece is written once, whole, by [`put`](Self::put), and the
/// buffer is only handed out ([`finish`](Self::finish)) once every piece is in, so no
/// byte of it is ever read before it is written, and none is zeroed first.
pub struct Assembly {
    /// `start + data_start` initialized bytes (alignment padding and the zeros);
    /// capacity for `start + len`.
    vec: Vec<u8>,
    start: usize,
    data_start: usize,
    len: usize,
    /// Where piece `i` starts in the object; it ends where piece `i + 1` starts (the
    /// last at `len`).
    starts: Vec<usize>,
    placed: Vec<bool>,
    missing: usize,
}

impl Assembly {
    /// `None` if the pieces do not end exactly at `len` (or `data_start > len`).
    pub fn new(
        len: usize,
        data_start: usize,
        piece_lens: impl ExactSizeIterator<Item = usize>,
    ) -> Option<Assembly> {
        let mut starts = Vec::with_capacity(piece_lens.len());
        let mut at = data_start;
        for n in piece_lens {
            starts.push(at);
            at = at.checked_add(n)?;
        }
        if at != len {
            return None;
        }
        let mut vec: Vec<u8> = Vec::with_capacity(len + DIRECT_ALIGN);
        let start = aligned_start(&vec);
        vec.resize(start + data_start, 0);
        let pieces = starts.len();
        Some(Assembly {
            vec,
            start,
            data_start,
            len,
            starts,
            placed: vec![false; pieces],
            missing: pieces,
        })
    }

    /// Copy `bytes` to piece `i`'s place. False, and nothing written, if there is no
    /// piece `i`, it is in already, or `bytes` is not exactly its length.
    pub fn put(&mut self, i: usize, bytes: &[u8]) -> bool {
        let (Some(&at), Some(false)) = (self.starts.get(i), self.placed.get(i).copied()) else {
            return false;
        };
        let end = self.starts.get(i + 1).copied().unwrap_or(self.len);
        if bytes.len() != end - at {
            return false;
        }
        // The spare capacity starts at object byte `data_start`.
        let from = at - self.data_start;
        self.vec.spare_capacity_mut()[from..from + bytes.len()].write_copy_of_slice(bytes);
        self.placed[i] = true;
        self.missing -= 1;
        true
    }

    /// The object, once every piece is in; `None` (the buffer dropped) otherwise.
    pub fn finish(mut self) -> Option<DirectBuf> {
        if self.missing != 0 {
            return None;
        }
        let full = self.start + self.len;
        debug_assert!(self.vec.capacity() >= full);
        // SAFETY: capacity is at least `full` (reserved in `new`). The first
        // `start + data_start` bytes were initialized by `resize`. The pieces' places
        // tile `[data_start, len)` of the object back to back (`new` built them as
        // running sums ending at `len`), `put` wrote each one whole (its length
        // checked) and marks it, and no piece is missing: every byte up to `full` is
        // initialized.
        unsafe { self.vec.set_len(full) };
        Some(DirectBuf {
            vec: self.vec,
            start: self.start,
            len: self.len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(buf: DirectBuf) -> Vec<u8> {
        let b = buf.into_bytes();
        assert_eq!(b.as_ptr().align_offset(DIRECT_ALIGN), 0, "aligned");
        b.to_vec()
    }

    #[test]
    fn pieces_put_in_any_order_make_the_object() {
        let lens = [3usize, 0, 5, 2];
        let mut a = Assembly::new(4 + 10, 4, lens.iter().copied()).expect("tiles");
        assert!(a.put(2, b"ccccc"));
        assert!(a.put(0, b"aaa"));
        assert!(a.put(1, b""));
        assert!(a.put(3, b"dd"));
        let got = bytes_of(a.finish().expect("complete"));
        assert_eq!(got, b"\0\0\0\0aaacccccdd");
    }

    #[test]
    fn a_wrong_piece_is_refused_and_an_incomplete_object_not_handed_out() {
        let mut a = Assembly::new(6, 0, [2usize, 4].into_iter()).expect("tiles");
        assert!(!a.put(0, b"x"), "short");
        assert!(!a.put(0, b"xyz"), "long");
        assert!(!a.put(2, b""), "no such piece");
        assert!(a.put(0, b"ab"));
        assert!(!a.put(0, b"ab"), "twice");
        assert!(a.finish().is_none(), "piece 1 missing");

        assert!(
            Assembly::new(6, 0, [2usize, 3].into_iter()).is_none(),
            "short of len"
        );
        assert!(
            Assembly::new(6, 2, [2usize, 3].into_iter()).is_none(),
            "past len"
        );
        assert!(
            Assembly::new(1, 2, std::iter::empty()).is_none(),
            "start past len"
        );
        let empty = Assembly::new(2, 2, std::iter::empty()).expect("only zeros");
        assert_eq!(bytes_of(empty.finish().expect("nothing to put")), b"\0\0");
    }

    #[test]
    fn filled_holds_what_was_appended() {
        let filled = DirectBuf::filled(5, |v| v.extend_from_slice(b"abcde"));
        assert_eq!(bytes_of(filled), b"abcde");
    }
}
