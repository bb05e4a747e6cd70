//! Write-log records continue from object to object.
//!
//! Why: sequence numbers say which objects form the history, but not that each one
//! continues the one before it. A replica that skipped an object, or an object of a
//! superseded writer under a name recovery took for the history's, would still leave
//! consecutive numbers. What the objects must also agree on is the write log: every
//! data object holds the records right after those the history held before it
//! (`first_record_seq` is one past the previous `last_record_seq`), so a missing or
//! foreign object shows as a gap or an overlap in the records.
//!
//! Objects written before epochs do not say where their records start; for them only
//! the order is checked (records never go back). Objects that hold no record (GC
//! output, checkpoints, resizes) carry the count they saw and are not checked: GC
//! output is numbered before client objects ahead of it are applied.

use crate::format::object::{ObjectHeader, ObjectKind};

/// The records the history holds so far; [`check`](Self::check) each object in
/// sequence order.
#[derive(Debug, Clone)]
pub struct RecordContinuity {
    /// Every record through this one is in the history.
    through: u64,
    /// The open split batch's record range, while its parts are being checked.
    batch: Option<(u64, u64)>,
}

impl RecordContinuity {
    /// Starting after `records_through` (the base checkpoint's `last_record_seq`, 0
    /// for an empty volume).
    pub fn new(records_through: u64) -> RecordContinuity {
        RecordContinuity {
            through: records_through,
            batch: None,
        }
    }

    /// The newest record the history holds so far.
    pub fn through(&self) -> u64 {
        self.through
    }

    /// Does `h`, the history's next object, continue the records? An error says
    /// where they break.
    pub fn check(&mut self, h: &ObjectHeader) -> Result<(), String> {
        if h.kind != ObjectKind::Data {
            return Ok(());
        }
        let last = h.last_record_seq;
        let Some(first) = h.first_record_seq else {
            if last < self.through {
                return Err(format!(
                    "object {:016x} holds records through {last}, before the {} the history already holds",
                    h.seq, self.through
                ));
            }
            self.through = last;
            return Ok(());
        };
        if first > last {
            return Ok(()); // holds no record (a resize)
        }
        if let Some(batch) = self.batch {
            if (first, last) != batch {
                return Err(format!(
                    "object {:016x} holds records {first}..={last}, but the batch it continues holds {}..={}",
                    h.seq, batch.0, batch.1
                ));
            }
        } else if first != self.through.saturating_add(1) {
            return Err(format!(
                "object {:016x} holds records {first}..={last}, but the history before it ends at record {}",
                h.seq, self.through
            ));
        }
        self.batch = (h.parts_after > 0).then_some((first, last));
        self.through = last;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::object::header_without_data;

    fn data(seq: u64, first: Option<u64>, last: u64, parts_after: u32) -> ObjectHeader {
        let mut h = header_without_data(ObjectKind::Data, seq, last, Vec::new(), Vec::new());
        h.first_record_seq = first;
        h.parts_after = parts_after;
        h
    }

    #[test]
    fn records_must_continue_exactly() {
        let mut c = RecordContinuity::new(10);
        c.check(&data(1, Some(11), 20, 0)).expect("continues");
        c.check(&header_without_data(
            ObjectKind::Gc,
            2,
            5,
            Vec::new(),
            Vec::new(),
        ))
        .expect("gc output is not checked");
        c.check(&data(3, Some(21), 21, 0)).expect("one record");
        let gap = c
            .check(&data(4, Some(23), 30, 0))
            .expect_err("record 22 missing");
        assert!(gap.contains("ends at record 21"), "{gap}");
        let mut c = RecordContinuity::new(10);
        assert!(c.check(&data(1, Some(5), 20, 0)).is_err(), "overlap");
        c.check(&data(1, Some(21), 20, 0))
            .expect("a resize holds no record");
        assert_eq!(c.through(), 10);
    }

    #[test]
    fn parts_of_a_split_batch_share_its_records() {
        let mut c = RecordContinuity::new(0);
        c.check(&data(1, Some(1), 9, 2)).expect("first part");
        c.check(&data(2, Some(1), 9, 1)).expect("second part");
        c.check(&data(3, Some(1), 9, 0)).expect("last part");
        c.check(&data(4, Some(10), 12, 0)).expect("the next batch");
        let mut c = RecordContinuity::new(0);
        c.check(&data(1, Some(1), 9, 1)).expect("first part");
        assert!(c.check(&data(2, Some(10), 12, 0)).is_err());
    }

    #[test]
    fn objects_before_epochs_are_held_to_order_only() {
        let mut c = RecordContinuity::new(10);
        c.check(&data(1, None, 15, 0)).expect("forward");
        c.check(&data(2, None, 15, 0)).expect("same");
        assert!(c.check(&data(3, None, 14, 0)).is_err());
        c.check(&data(3, Some(16), 17, 0)).expect("then exactly");
    }
}
