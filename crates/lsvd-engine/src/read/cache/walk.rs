//! Detection for temporal read-ahead (no I/O here: the read path asks, then fetches).
//!
//! Data written together lands in one object (a batch, laid out by LBA inside it), so
//! a reader going back over what was written together (a database rereading rows it
//! appended to scattered pages, a VM booting in the order it was installed) reads one
//! object after another, at LBAs that form no stream. That reader is recognised by
//! consecutive reads landing in the same object: after [`MIN_RUN`] of them, the
//! object's chunks are fetched ahead of it, from the chunk it read, onwards and then
//! round from the object's start, a window at a time, until the whole object has been
//! asked for or reads go elsewhere. Random reads over a volume of many objects seldom
//! land in one object several times in a row, so they fetch nothing.

/// Consecutive reads in one object before anything is fetched ahead.
pub(crate) const MIN_RUN: u32 = 4;

/// The object the latest reads landed in.
#[derive(Debug, Default)]
pub(crate) struct ObjectWalk {
    /// (object sequence number, epoch): `None` before the first read.
    object: Option<(u64, u64)>,
    /// Reads in a row that landed in it.
    run: u32,
    /// The chunk the walk's fetches start from, and how many chunks from there (going
    /// round the object) have been asked for.
    start: u64,
    asked: u64,
}

impl ObjectWalk {
    /// A client read that landed in chunk `chunk` of object `(seq, epoch)`, which has
    /// `chunks` chunks. Returns the chunks to fetch ahead `(first, last)`, at most
    /// `max_chunks` of them, contiguous (a window that would go round the object's end
    /// stops there; the next read continues from the start). A window it returns is
    /// taken as fetched.
    pub(crate) fn observe(
        &mut self,
        seq: u64,
        epoch: u64,
        chunk: u64,
        chunks: u64,
        max_chunks: u64,
    ) -> Option<(u64, u64)> {
        if self.object != Some((seq, epoch)) {
            *self = ObjectWalk {
                object: Some((seq, epoch)),
                run: 1,
                start: chunk.min(chunks.saturating_sub(1)),
                asked: 0,
            };
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
        // Ten chunks; reads land in chunk 6, then anywhere in the same object.
        for (i, chunk) in [6, 2, 9, 0, 5, 1, 7, 3, 8, 4, 6, 6].into_iter().enumerate() {
            if let Some(win) = w.observe(7, 1, chunk, 10, 3) {
                got.push((i, win));
            }
        }
        // Nothing for the first MIN_RUN - 1 reads; then 6-8, 9 (the end), 0-2, 3-5;
        // then nothing: the object has been asked for whole.
        assert_eq!(
            got,
            vec![(3, (6, 8)), (4, (9, 9)), (5, (0, 2)), (6, (3, 5))]
        );
    }

    #[test]
    fn reads_in_another_object_restart_the_run() {
        let mut w = ObjectWalk::default();
        for round in 0..100u64 {
            // Alternating objects (two readers, or random reads): never a run.
            assert_eq!(w.observe(round % 2, 0, 0, 128, 16), None);
        }
        // A new epoch of the same number is another object.
        for _ in 0..MIN_RUN - 1 {
            assert_eq!(w.observe(5, 0, 0, 128, 16), None);
        }
        assert_eq!(w.observe(5, 1, 0, 128, 16), None);
        // No room (max 0): nothing taken, asked for on a later read.
        let mut w = ObjectWalk::default();
        for _ in 0..MIN_RUN {
            assert_eq!(w.observe(9, 0, 3, 4, 0), None);
        }
        assert_eq!(w.observe(9, 0, 3, 4, 8), Some((3, 3)));
        assert_eq!(w.observe(9, 0, 3, 4, 8), Some((0, 2)));
        assert_eq!(w.observe(9, 0, 3, 4, 8), None);
    }
}
