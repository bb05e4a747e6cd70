//! Where a put goes: client objects to the tail drive (moving the tail on to the next
//! drive with room when it is full, and recording the move in every drive's record),
//! GC output to the body (compact-in-body) or the tail (move-to-tail), other keys to
//! their home drive.

use super::*;

impl ChainStore {
    /// Bytes drive `d` can still take (none once its filesystem said it is full).
    fn room(&self, st: &State, d: usize) -> u64 {
        if st.full[d] {
            return 0;
        }
        match self.inner.drive_size_bytes {
            Some(cap) => cap.saturating_sub(st.used_bytes[d] + st.reserved_bytes[d]),
            None => self.inner.drives[d]
                .free_bytes()
                .saturating_sub(st.reserved_bytes[d] + FREE_SPACE_MARGIN_BYTES),
        }
    }

    /// The drive `key` goes to, and whether the tail moved to it.
    pub(super) fn choose(
        &self,
        st: &mut State,
        key: &str,
        size_bytes: u64,
        placement: &Placement,
    ) -> StoreResult<(usize, bool)> {
        if let Some(l) = st.index.get(key) {
            return Ok((l.drive, false));
        }
        if let Some(&(d, _)) = st.in_flight.get(key) {
            return Ok((d, false));
        }
        if !is_log_object(key) {
            return Ok((home_drive(key, self.inner.drives.len()), false));
        }
        if let Placement::Gc { victim_keys } = placement
            && self.inner.gc == GcPlacement::CompactInBody
            && let Some(d) = self.body_drive(st, victim_keys, size_bytes)
        {
            return Ok((d, false));
        }
        self.tail_drive(st, size_bytes)
    }

    /// The tail if it has room, else the next drive in chain order that has (which
    /// becomes the tail).
    fn tail_drive(&self, st: &mut State, size_bytes: u64) -> StoreResult<(usize, bool)> {
        let n = self.inner.drives.len();
        if self.room(st, st.tail) >= size_bytes {
            return Ok((st.tail, false));
        }
        for step in 1..n {
            let d = (st.tail + step) % n;
            if self.room(st, d) >= size_bytes {
                st.tail = d;
                st.generation += 1;
                return Ok((d, true));
            }
        }
        // Out of room: the drives a filesystem called full are tried again by the next
        // put (room may have been made meanwhile, by GC or the operator).
        st.full.iter_mut().for_each(|f| *f = false);
        Err(Error::new(
            ErrorKind::Full,
            format!(
                "{}: no drive has room for {size_bytes} more bytes (GC may free some)",
                self.inner.describe
            ),
        ))
    }

    /// A drive of the body for GC output: the one holding most of the victims' bytes
    /// if it has room, else the body drive with the most room; None if no body drive
    /// has room (or there is no body).
    fn body_drive(&self, st: &State, victim_keys: &[String], size_bytes: u64) -> Option<usize> {
        let n = self.inner.drives.len();
        let mut victim_bytes = vec![0u64; n];
        for k in victim_keys {
            if let Some(l) = st.index.get(k) {
                victim_bytes[l.drive] += l.size_bytes.max(1);
            }
        }
        let mut body: Vec<(usize, u64)> = (0..n)
            .filter(|&d| d != st.tail)
            .map(|d| (d, self.room(st, d)))
            .collect();
        body.sort_by_key(|&(d, room)| {
            (
                std::cmp::Reverse(victim_bytes[d]),
                std::cmp::Reverse(room),
                d,
            )
        });
        body.into_iter()
            .find(|&(_, room)| room >= size_bytes)
            .map(|(d, _)| d)
    }

    /// Record the current tail on every drive (after a move). A failure is only
    /// reported: objects are found by listing, the record only says where the tail is.
    pub(super) async fn record_tail(&self) {
        let this = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _order = this
                .inner
                .record_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (tail, generation) = {
                let st = this.lock();
                (st.tail, st.generation)
            };
            persist_tail(&this.inner.drives, &this.inner.base, tail, generation)
                .map(|()| (tail, generation))
        })
        .await;
        match result {
            Ok(Ok((tail, generation))) => crate::log::info(&format!(
                "{}: tail moved to drive {tail} ({}), generation {generation}",
                self.inner.describe,
                self.inner.drives[tail].describe()
            )),
            Ok(Err(e)) => crate::log::warn(&format!(
                "{}: tail moved but not recorded: {e}",
                self.inner.describe
            )),
            Err(e) => crate::log::warn(&format!(
                "{}: recording the tail failed: {e}",
                self.inner.describe
            )),
        }
    }
}
