//! Detection for temporal read-ahead (no I/O here: the read path asks, then fetches).
//!
//! Data written together lands in one object (a batch, laid out by LBA inside it), so
//! a reader going back over what was written together (a database rereading rows it
//! appended to scattered pages, a VM booting in the order it was installed) reads one
//! object after another, at LBAs that form no stream. That reader is recognised by
//! consecutive reads landing in the same object, each away from where the one before
//! it ended (a sequential reader, which the LBA streams follow, never makes a run):
//! after [`MIN_RUN`] of them, the
//! object's chunks are fetched ahead of it, from the chunk it read, onwards and then
//! round from the object's start, a window at a time, until the whole object has been
//! asked for or reads go elsewhere. Random reads over a volume of many objects seldom
//! land in one object several times in a row, so they fetch nothing.

/// Consecutive reads in one object before anything is fetched ahead.
pub(crate) const MIN_RUN: u32 = 4;

/// A read starting at most this many chunks past the previous read's end (1 MiB: a
/// sequential reader at queue depth 8 of 128 KiB reads) is near it.
const NEAR_CHUNKS: u64 = 16;

/// The object the latest reads landed in.
#[derive(Debug, Default)]
pub(crate) struct ObjectWalk {
    /// (object sequence number, epoch): `None` before the first read.
    object: Option<(u64, u64)>,
    /// Reads in a row that landed in it, away from the read before.
    run: u32,
    /// The chunks the latest read in it covered.
    last: (u64, u64),
    /// The chunk the walk's fetches start from, and how many chunks from there (going
    /// round the object) have been asked for.
    start: u64,
    asked: u64,
}

impl ObjectWalk {
    /// A client read of chunks `read` (first, last) of object `(seq, epoch)`, which
    /// has `chunks` chunks. A read that starts within [`NEAR_CHUNKS`] of where the
    /// previous one ended, or ends just before it started, continues a sequential
    /// walk, not a temporal one, and does not count. Returns the chunks to fetch ahead `(first, last)`, at most
    /// `max_chunks` of them, contiguous (a window that would go round the object's end
    /// stops there; the next read continues from the start). A window it returns is
    /// taken as fetched.
    pub(crate) fn observe(
        &mut self,
        seq: u64,
        epoch: u64,
        read: (u64, u64),
        chunks: u64,
        max_chunks: u64,
    ) -> Option<(u64, u64)> {
        if self.object != Some((seq, epoch)) {
            *self = ObjectWalk {
                object: Some((seq, epoch)),
                run: 1,
                last: read,
                start: read.0.min(chunks.saturating_sub(1)),
                asked: 0,
            };
            return None;
        }
        let (prev_first, prev_last) = self.last;
        self.last = read;
        let near = read.0 <= prev_last.saturating_add(NEAR_CHUNKS) && read.1 + 1 >= prev_first;
        if near {
            return None;
        }
        self.run = self.run.saturating_add(1);
        if self.run < MIN_RUN || self.asked >= chunks || max_chunks == 0 {
            return None;
        }
        let first = (self.start + self.asked) % chunks;
        let n = max_chunks.min(chunks - self.asked).min(chunks - first);
        self.asked += n;
        Some((first, first + n - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_reads_in_one_object_fetches_all_of_it_from_where_it_started() {
        let mut w = ObjectWalk::default();
        let mut got = Vec::new();
        // 100 chunks; reads land in chunk 60, then far from the read before each time.
        for (i, chunk) in [60, 20, 90, 0, 50, 10, 80, 30, 70].into_iter().enumerate() {
            if let Some(win) = w.observe(7, 1, (chunk, chunk), 100, 30) {
                got.push((i, win));
            }
        }
        // Nothing for the first MIN_RUN - 1 reads; then 60-89, 90-99 (the end), 0-29,
        // 30-59; then nothing: the object has been asked for whole.
        assert_eq!(
            got,
            vec![(3, (60, 89)), (4, (90, 99)), (5, (0, 29)), (6, (30, 59))]
        );
    }

    #[test]
    fn reads_in_another_object_restart_the_run() {
        let mut w = ObjectWalk::default();
        for round in 0..100u64 {
            // Alternating objects (two readers, or random reads): never a run.
            assert_eq!(w.observe(round % 2, 0, (round, round), 128, 16), None);
        }
        // A new epoch of the same number is another object.
        for c in [40, 20, 0] {
            assert_eq!(w.observe(5, 0, (c, c), 128, 16), None);
        }
        assert_eq!(w.observe(5, 1, (100, 100), 128, 16), None);
        // No room (max 0): nothing taken, asked for on a later read.
        let mut w = ObjectWalk::default();
        for c in [90, 50, 10, 70] {
            assert_eq!(w.observe(9, 0, (c, c), 100, 0), None);
        }
        assert_eq!(w.observe(9, 0, (30, 30), 100, 8), Some((90, 97)));
    }

    #[test]
    fn a_sequential_reader_never_makes_a_run() {
        let mut w = ObjectWalk::default();
        // 128 KiB reads (two chunks each) in order, then reordered as at queue depth 8.
        for c in (0..64).step_by(2) {
            assert_eq!(w.observe(3, 0, (c, c + 1), 128, 16), None, "chunk {c}");
        }
        for c in [66, 70, 68, 74, 72, 80, 76, 78] {
            assert_eq!(w.observe(3, 0, (c, c + 1), 128, 16), None, "chunk {c}");
        }
    }
}
