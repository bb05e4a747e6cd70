//! Sequential-stream detection for read-ahead (no I/O here: the read path asks, then
//! fetches).
//!
//! The engine does not see connections, only reads: a stream is recognised by LBA
//! continuity. A few recent streams are remembered (the least recently used is
//! replaced); a read continues a stream when it starts near where the stream got to
//! (reads of a queue-depth-8 sequential reader arrive slightly out of order). Once a
//! stream has [`MIN_READS`] reads, it gets a read-ahead window twice as long as what it
//! has read so far, at most the configured read-ahead, refilled when half of it is
//! used. Nothing is fetched for a stream that stops: only a read advances it.

use lsvd_core::format::SECTOR_BYTES;

/// Streams remembered at once (bounded state).
const STREAMS: usize = 8;
/// Reads a stream must have before anything is fetched ahead of it.
pub(crate) const MIN_READS: u32 = 3;
/// Smallest read-ahead window.
const MIN_WINDOW_SECTORS: u64 = (128 << 10) / SECTOR_BYTES;

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    live: bool,
    /// Where the stream started.
    start: u64,
    /// Just past the furthest sector read.
    next: u64,
    /// Just past the furthest sector fetched ahead.
    ahead: u64,
    reads: u32,
    /// When it was last continued (for replacement).
    used: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Streams {
    streams: [Stream; STREAMS],
    tick: u64,
}

impl Streams {
    /// A client read of sectors `[lba, lba + sectors)`. Returns the sectors to fetch
    /// ahead `(lba, sectors)`, if any: at most `max_ahead` past the read, at most
    /// `room` long (what the in-flight bound allows), never past `end` (the volume's
    /// size). A window it returns is taken as fetched.
    pub(crate) fn observe(
        &mut self,
        lba: u64,
        sectors: u64,
        max_ahead: u64,
        room: u64,
        end: u64,
    ) -> Option<(u64, u64)> {
        self.tick += 1;
        let read_end = lba.saturating_add(sectors);
        let gap = (4 * sectors).max(MIN_WINDOW_SECTORS);
        let found = self
            .streams
            .iter()
            .position(|s| s.live && lba.abs_diff(s.next) <= gap);
        let Some(i) = found else {
            let victim = self
                .streams
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| (s.live, s.used))
                .map_or(0, |(i, _)| i);
            self.streams[victim] = Stream {
                live: true,
                start: lba,
                next: read_end,
                ahead: read_end,
                reads: 1,
                used: self.tick,
            };
            return None;
        };
        let s = &mut self.streams[i];
        s.used = self.tick;
        s.reads = s.reads.saturating_add(1);
        s.start = s.start.min(lba);
        s.next = s.next.max(read_end);
        s.ahead = s.ahead.max(s.next);
        if s.reads < MIN_READS || max_ahead == 0 {
            return None;
        }
        let window = (2 * (s.next - s.start))
            .max(MIN_WINDOW_SECTORS)
            .min(max_ahead);
        if s.ahead - s.next >= window / 2 {
            return None;
        }
        let from = s.ahead;
        let to = (s.next + window).min(from.saturating_add(room)).min(end);
        if to <= from {
            return None;
        }
        s.ahead = to;
        Some((from, to - from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = (1 << 20) / SECTOR_BYTES;
    const END: u64 = u64::MAX;

    #[test]
    fn a_sequential_reader_gets_a_growing_bounded_window() {
        let mut s = Streams::default();
        let req = 256; // 128 KiB
        let mut fetched = Vec::new();
        for i in 0..64 {
            if let Some(w) = s.observe(i * req, req, 4 * MIB, u64::MAX, END) {
                fetched.push(w);
            }
        }
        assert_eq!(
            fetched[0].0,
            3 * req,
            "starts after MIN_READS reads, at the read"
        );
        // Contiguous windows, never more than 4 MiB past the read.
        for w in fetched.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0);
        }
        let (last_from, last_len) = fetched[fetched.len() - 1];
        assert!(last_from + last_len <= 64 * req + 4 * MIB);
        // Everything the reader read after warming up was fetched ahead of it.
        assert!(last_from + last_len >= 64 * req);
    }

    #[test]
    fn random_reads_fetch_nothing_and_room_and_end_bound_the_window() {
        let mut s = Streams::default();
        let mut x = 12345u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let lba = (x >> 20) % (1 << 30) / 8 * 8;
            assert_eq!(s.observe(lba, 8, 4 * MIB, u64::MAX, END), None);
        }
        let mut s = Streams::default();
        for i in 0..3 {
            let got = s.observe(i * MIB, MIB, 4 * MIB, MIB / 2, END);
            assert_eq!(got, (i == 2).then_some((3 * MIB, MIB / 2)), "read {i}");
        }
        // No room: nothing, and the window is not taken (asked again next read).
        assert_eq!(s.observe(3 * MIB, 64, 4 * MIB, 0, END), None);
        assert!(s.observe(3 * MIB + 64, 64, 4 * MIB, MIB, END).is_some());
        let mut s = Streams::default();
        for i in 0..3 {
            s.observe(i * MIB, MIB, 4 * MIB, u64::MAX, 3 * MIB + 10);
        }
        assert_eq!(s.observe(3 * MIB, 1, 4 * MIB, u64::MAX, 3 * MIB + 10), None);
    }

    #[test]
    fn interleaved_streams_and_slightly_reordered_reads_are_followed() {
        let mut s = Streams::default();
        let (a, b) = (0u64, 1 << 30);
        let mut got = (0, 0);
        for i in 0..8u64 {
            // Pairs arrive swapped, as at queue depth 2.
            let j = i ^ 1;
            if s.observe(a + j * 128, 128, 4 * MIB, u64::MAX, END)
                .is_some()
            {
                got.0 += 1;
            }
            if s.observe(b + j * 128, 128, 4 * MIB, u64::MAX, END)
                .is_some()
            {
                got.1 += 1;
            }
        }
        assert!(got.0 > 0 && got.1 > 0, "{got:?}");
    }
}
