//! Batches split into several objects are recovered all or none.
//!
//! Under hylog a client batch may be written as up to four consecutive data objects,
//! one per heat class ([`crate::batcher::Batch::split_by_class`]); every part but the
//! last says how many follow (`parts_after`, object version 3). Applying some parts
//! without the others would make the volume hold some of the batch's writes and not
//! earlier ones, which breaks the prefix rule when the store is all there is. So
//! recovery holds parts back until the batch's last part is read, and a run of objects
//! that ends inside a batch ends before its first part: those parts are stranded, like
//! objects past a gap. (With the cache intact nothing is lost: a part never lets the
//! write log free the batch's records, so they are replayed.)

use crate::format::object::{ObjectHeader, ObjectKind};

/// The parts of a split batch read so far, in sequence order.
#[derive(Debug, Default)]
pub struct PartGroup {
    pending: Vec<ObjectHeader>,
}

impl PartGroup {
    /// The next object of the run, in sequence order. Returns the headers to apply now,
    /// in order: none while a batch is incomplete, all of its parts once its last part
    /// arrives, or the object itself when it is not a part. An object that does not
    /// continue an open batch as its next part is an error (a corrupt store).
    pub fn push(&mut self, header: ObjectHeader) -> Result<Vec<ObjectHeader>, String> {
        if let Some(prev) = self.pending.last() {
            let continues = header.kind == ObjectKind::Data
                && Some(header.seq) == prev.seq.checked_add(1)
                && header.parts_after.checked_add(1) == Some(prev.parts_after);
            if !continues {
                return Err(format!(
                    "object {:016x} ({:?}, {} parts after it) does not continue the batch whose part {:016x} has {} parts after it",
                    header.seq, header.kind, header.parts_after, prev.seq, prev.parts_after
                ));
            }
        }
        if header.parts_after == 0 {
            self.pending.push(header);
            return Ok(std::mem::take(&mut self.pending));
        }
        self.pending.push(header);
        Ok(Vec::new())
    }

    /// Is a batch open (parts read, its last part not yet)?
    pub fn is_open(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The open batch's parts, when the run ends: they are not applied (stranded).
    pub fn into_unfinished(self) -> Vec<u64> {
        self.pending.iter().map(|h| h.seq).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::object::header_without_data;

    fn part(seq: u64, parts_after: u32) -> ObjectHeader {
        let mut h = header_without_data(ObjectKind::Data, seq, 10, Vec::new(), Vec::new());
        h.parts_after = parts_after;
        h
    }

    fn seqs(v: &[ObjectHeader]) -> Vec<u64> {
        v.iter().map(|h| h.seq).collect()
    }

    /// Push `(seq, parts_after, applied, open)` objects in turn into a new group: each
    /// continues the batch, applies the objects `applied` names and leaves a batch
    /// `open` or not. Returns the parts left unfinished at the end.
    fn push_all(steps: &[(u64, u32, &[u64], bool)]) -> Vec<u64> {
        let mut g = PartGroup::default();
        for &(seq, parts_after, applied, open) in steps {
            let got = g.push(part(seq, parts_after)).expect("continues the batch");
            assert_eq!(seqs(&got), applied, "applied after object {seq}");
            assert_eq!(g.is_open(), open, "a batch open after object {seq}");
        }
        g.into_unfinished()
    }

    #[test]
    fn whole_objects_apply_at_once_and_parts_when_their_batch_is_complete() {
        let unfinished = push_all(&[
            (1, 0, &[1], false),
            (2, 2, &[], true),
            (3, 1, &[], true),
            (4, 0, &[2, 3, 4], false),
            (5, 0, &[5], false),
        ]);
        assert!(unfinished.is_empty());
    }

    #[test]
    fn a_run_that_ends_inside_a_batch_strands_its_parts() {
        let unfinished = push_all(&[(7, 0, &[7], false), (8, 2, &[], true), (9, 1, &[], true)]);
        assert_eq!(unfinished, vec![8, 9]);
    }

    #[test]
    fn an_object_that_does_not_continue_the_batch_is_refused() {
        // Wrong countdown, a gc object, a checkpoint, a skipped number.
        for next in [
            part(3, 0),
            {
                let mut h = part(2, 0);
                h.kind = ObjectKind::Gc;
                h
            },
            {
                let mut h = part(2, 0);
                h.kind = ObjectKind::Checkpoint;
                h
            },
            part(2, 2),
        ] {
            let mut g = PartGroup::default();
            assert!(g.push(part(1, 2)).expect("ok").is_empty());
            let err = g.push(next.clone()).expect_err("refused");
            assert!(err.contains("does not continue"), "{next:?}: {err}");
        }
    }
}
