//! A small cursor that turns fuzz bytes into structured values.
//!
//! Generators (build a value from bytes, encode it, decode it) need integers, lengths
//! and choices; running out of input yields zeros, so every byte string is a valid
//! script and the fuzzer never wastes executions on rejected inputs.

pub struct Bytes<'a> {
    buf: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Bytes { buf }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.buf.split_first() {
            Some((&b, rest)) => {
                self.buf = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u32) -> u32 {
        if n == 0 { 0 } else { self.u32() % n }
    }

    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        for b in &mut a {
            *b = self.u8();
        }
        a
    }

    /// Up to `max` bytes, the count taken from the input.
    pub fn vec(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(u32::try_from(max).unwrap_or(u32::MAX).saturating_add(1)) as usize;
        self.take(n).to_vec()
    }

    /// Exactly `n` bytes (short input is padded with zeros).
    pub fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.take(n).to_vec();
        v.resize(n, 0);
        v
    }

    /// Up to `n` bytes, fewer if the input is shorter.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.buf.len());
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.buf.len())
    }
}
