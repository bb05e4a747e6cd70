//! Space accounting for the circular write log.
//!
//! Records are appended at the head and freed from the tail, in sequence order, once
//! the object store holds their data. A record never straddles the end of the region:
//! if it does not fit, the head wraps to the start (recovery knows to look there).

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecordSpan {
    pub seq: u64,
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct LogSpace {
    start: u64,
    end: u64,
    head: u64,
    records: VecDeque<LogRecordSpan>,
    used_bytes: u64,
}

impl LogSpace {
    pub fn new(start: u64, end: u64, head: u64) -> Self {
        assert!(start <= head && head < end, "head inside the log region");
        LogSpace {
            start,
            end,
            head,
            records: VecDeque::new(),
            used_bytes: 0,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.end - self.start
    }

    /// Largest record that can ever be placed.
    pub fn max_record_bytes(&self) -> u64 {
        self.capacity_bytes() / 2
    }

    /// Bytes held by records not yet freed (wasted wrap space not counted).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    /// Oldest live record, if any.
    pub fn tail(&self) -> Option<LogRecordSpan> {
        self.records.front().copied()
    }

    pub fn newest(&self) -> Option<LogRecordSpan> {
        self.records.back().copied()
    }

    /// Where a record of `bytes` would go, if it fits now.
    pub fn place(&self, bytes: u64) -> Option<u64> {
        let Some(tail) = self.records.front() else {
            return if self.head + bytes <= self.end {
                Some(self.head)
            } else if self.start + bytes <= self.end {
                Some(self.start)
            } else {
                None
            };
        };
        let tail = tail.offset;
        if self.head > tail || (self.head == tail && self.records.is_empty()) {
            // Free space is [head, end) and [start, tail).
            if self.head + bytes <= self.end {
                Some(self.head)
            } else if self.start + bytes <= tail {
                Some(self.start)
            } else {
                None
            }
        } else if self.head + bytes <= tail {
            Some(self.head)
        } else {
            None
        }
    }

    /// Record that `seq` was written at `offset` (from [`place`](Self::place)).
    pub fn push(&mut self, seq: u64, offset: u64, bytes: u64) {
        debug_assert!(self.records.back().is_none_or(|r| r.seq < seq));
        self.records.push_back(LogRecordSpan { seq, offset, bytes });
        self.used_bytes += bytes;
        self.head = offset + bytes;
        if self.head == self.end {
            self.head = self.start;
        }
    }

    /// Free every record with sequence number up to `seq`.
    pub fn free_through(&mut self, seq: u64) {
        while let Some(r) = self.records.front() {
            if r.seq > seq {
                break;
            }
            self.used_bytes -= r.bytes;
            self.records.pop_front();
        }
    }

    /// The newest record to free so that at least `free_target_bytes` of the log are
    /// free, freeing nothing after record `freeable`; None if nothing needs freeing
    /// (or nothing may be freed). Space lost at the wrap is not counted: the writer
    /// frees more when a record does not fit (`engine::writer`).
    pub fn free_through_for(&self, free_target_bytes: u64, freeable: u64) -> Option<u64> {
        let mut free = self.capacity_bytes().saturating_sub(self.used_bytes);
        let mut through = None;
        for r in &self.records {
            if free >= free_target_bytes || r.seq > freeable {
                break;
            }
            free += r.bytes;
            through = Some(r.seq);
        }
        through
    }

    /// Bytes held by records up to `seq`.
    pub fn bytes_through(&self, seq: u64) -> u64 {
        self.records
            .iter()
            .take_while(|r| r.seq <= seq)
            .map(|r| r.bytes)
            .sum()
    }

    /// Is record `seq` still held (not freed)? A range check, which `read_local`
    /// relies on: true for every seq between two that are held.
    pub fn holds(&self, seq: u64) -> bool {
        self.records.front().is_some_and(|r| r.seq <= seq)
            && self.records.back().is_some_and(|r| r.seq >= seq)
    }

    /// The offset and sequence number of the first record after `seq`: where the
    /// tail will be once everything through `seq` is freed. With none, the head and
    /// `next_record_seq`, the number the next record appended there will carry (a
    /// recovery that scans from this tail then finds only records appended later,
    /// never an older record that happens to sit at the start of the log).
    pub fn tail_after(&self, seq: u64, next_record_seq: u64) -> (u64, u64) {
        match self.records.iter().find(|r| r.seq > seq) {
            Some(r) => (r.offset, r.seq),
            None => (self.head, next_record_seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_respects_tail() {
        let mut s = LogSpace::new(100, 1100, 100);
        let a = s.place(400).expect("fits");
        s.push(1, a, 400);
        let b = s.place(400).expect("fits");
        s.push(2, b, 400);
        assert_eq!((a, b), (100, 500));
        assert_eq!(s.place(400), None, "only 200 left before end, tail at 100");
        s.free_through(1);
        let c = s.place(300).expect("wraps to start");
        assert_eq!(c, 100);
        s.push(3, c, 300);
        assert_eq!(
            s.place(200),
            None,
            "[400,500) is 100 bytes; end has 200 but tail blocks wrap"
        );
        assert_eq!(s.place(100), Some(400));
        assert!(s.holds(2) && s.holds(3) && !s.holds(1));
        assert_eq!(s.tail_after(2, 4), (100, 3));
        assert_eq!(
            s.tail_after(3, 4),
            (400, 4),
            "none left: the head and the next number"
        );
        s.free_through(3);
        assert_eq!(s.used_bytes(), 0);
        assert_eq!(s.place(1000), Some(100));
    }

    #[test]
    fn frees_only_enough_for_the_target_and_nothing_not_freeable() {
        let mut s = LogSpace::new(0, 1000, 0);
        for seq in 1..=4 {
            let at = s.place(200).expect("fits");
            s.push(seq, at, 200);
        }
        // 200 free now.
        assert_eq!(s.free_through_for(200, 4), None, "target met already");
        assert_eq!(
            s.free_through_for(500, 4),
            Some(2),
            "two records make 600 free"
        );
        assert_eq!(
            s.free_through_for(500, 1),
            Some(1),
            "record 2 is not freeable"
        );
        assert_eq!(s.free_through_for(500, 0), None, "nothing freeable");
        assert_eq!(
            s.free_through_for(u64::MAX, 3),
            Some(3),
            "no retention: all freeable"
        );
        assert_eq!(s.bytes_through(2), 400);
        assert_eq!(s.bytes_through(0), 0);
        assert_eq!(s.bytes_through(9), 800);
    }
}
