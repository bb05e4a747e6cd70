//! A batch's pieces grouped by the write-log record that holds them, without sorting.
//!
//! Why: the uploader builds each object record by record (a record not in memory is
//! read back once), so it needs the distinct records a batch takes data from, in log
//! order, and the pieces of each. Sorting the ~2,000 pieces of an 8 MiB batch by
//! record, twice, cost about 570 instructions per 4 KiB client write (callgrind). A
//! batch's records are consecutive sequence numbers, so a counting sort over that
//! range does the same in linear time; a sparse range (never made by the batcher, but
//! not trusted) falls back to a sort.

/// Pieces grouped by record: `seqs` are the distinct record sequence numbers,
/// ascending; `order` lists piece indexes record by record (in `seqs` order), and
/// within one record in the order the pieces were given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ByRecord {
    pub seqs: Vec<u64>,
    pub order: Vec<usize>,
}

/// Above this many record numbers per piece, the range is too sparse for a count per
/// number: sort instead.
const MAX_SPREAD_PER_PIECE: u64 = 4;

/// Group pieces by their record sequence numbers (`record_seq_of_piece[i]` is piece
/// `i`'s).
pub(crate) fn group_by_record(record_seq_of_piece: &[u64]) -> ByRecord {
    let (Some(&min), Some(&max)) = (
        record_seq_of_piece.iter().min(),
        record_seq_of_piece.iter().max(),
    ) else {
        return ByRecord {
            seqs: Vec::new(),
            order: Vec::new(),
        };
    };
    let n = record_seq_of_piece.len();
    let spread = max - min;
    if spread / MAX_SPREAD_PER_PIECE > n as u64 {
        return by_sorting(record_seq_of_piece);
    }
    // Counting sort: pieces per record number, then each number's first slot.
    let slots = (spread + 1) as usize;
    let mut start = vec![0usize; slots + 1];
    for &s in record_seq_of_piece {
        start[(s - min) as usize + 1] += 1;
    }
    let mut seqs = Vec::new();
    for i in 0..slots {
        if start[i + 1] > 0 {
            seqs.push(min + i as u64);
        }
        start[i + 1] += start[i];
    }
    let mut order = vec![0usize; n];
    for (piece, &s) in record_seq_of_piece.iter().enumerate() {
        let slot = &mut start[(s - min) as usize];
        order[*slot] = piece;
        *slot += 1;
    }
    ByRecord { seqs, order }
}

/// The same grouping by a stable sort: for sparse record numbers, and the reference
/// the tests hold the counting sort to.
fn by_sorting(record_seq_of_piece: &[u64]) -> ByRecord {
    let mut order: Vec<usize> = (0..record_seq_of_piece.len()).collect();
    order.sort_by_key(|&i| record_seq_of_piece[i]);
    let mut seqs: Vec<u64> = order.iter().map(|&i| record_seq_of_piece[i]).collect();
    seqs.dedup();
    ByRecord { seqs, order }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_stable_sort_on_dense_and_sparse_record_numbers() {
        // Seeded xorshift64: the same cases on every run.
        let mut state = 0x5eed_b1e5_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..500 {
            let n = (next() % 64) as usize;
            let base = next() >> 1;
            // Dense ranges (what the batcher makes), and now and then a sparse one.
            let spread = if case % 5 == 0 { 1 << 40 } else { 1 + n as u64 };
            let seqs: Vec<u64> = (0..n).map(|_| base + next() % spread).collect();
            assert_eq!(
                group_by_record(&seqs),
                by_sorting(&seqs),
                "case {case}: {seqs:?}"
            );
        }
    }

    #[test]
    fn groups_record_by_record_keeping_the_pieces_order() {
        let g = group_by_record(&[7, 5, 7, 6, 5]);
        assert_eq!(g.seqs, [5, 6, 7]);
        assert_eq!(g.order, [1, 4, 3, 0, 2]);
        assert_eq!(group_by_record(&[]).seqs, Vec::<u64>::new());
        // The largest numbers do not overflow the range arithmetic.
        let g = group_by_record(&[u64::MAX, u64::MAX - 1, 0]);
        assert_eq!(g.seqs, [0, u64::MAX - 1, u64::MAX]);
        assert_eq!(g.order, [2, 1, 0]);
    }
}
