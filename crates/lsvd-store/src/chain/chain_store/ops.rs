//! The chain's puts, reads and deletes: each sent to the drive the in-memory index
//! (key -> drive, size) names, or found by looking on every drive, with the index,
//! the bytes per drive and the counters kept current.

use super::*;

impl ChainStore {
    /// The drive holding `key` on disk, looked for on every drive (and remembered).
    fn find(&self, key: &str) -> StoreResult<Option<usize>> {
        valid_key(key)?;
        for (d, drive) in self.inner.drives.iter().enumerate() {
            if let Some(size_bytes) = drive.stat(key) {
                let mut st = self.lock();
                if let Entry::Vacant(v) = st.index.entry(key.to_string()) {
                    v.insert(Located {
                        drive: d,
                        size_bytes,
                    });
                    st.used_bytes[d] += size_bytes;
                }
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    pub(super) async fn put_inner(
        &self,
        key: String,
        data: Bytes,
        mode: PutMode,
        placement: Placement,
    ) -> StoreResult<()> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        valid_key(&key)?;
        self.refuse_if_read_only("put", &key)?;
        let size_bytes = data.len() as u64;
        // A log object whose drive turns out full goes to the next drive with room:
        // each try marks one drive full, so after one try per drive the placement
        // itself answers `Full` (and clears the marks for the next put).
        for _ in 0..=self.inner.drives.len() {
            let (result, drive, placed) = self
                .put_once(&key, data.clone(), mode, &placement, size_bytes)
                .await;
            match result {
                Err(e) if e.kind == ErrorKind::Full && placed => {
                    self.lock().full[drive] = true;
                    crate::log::warn(&format!(
                        "{}: drive {drive} ({}) is full before its share was used ({e}); \
                         placing {key} on another drive",
                        self.inner.describe,
                        self.inner.drives[drive].describe()
                    ));
                }
                r => return r,
            }
        }
        Err(Error::new(
            ErrorKind::Full,
            format!(
                "{}: every drive is full (putting {key})",
                self.inner.describe
            ),
        ))
    }

    /// One try of a put: the drive chosen, the put there, the index and counters kept.
    /// Returns the result, the drive, and whether the drive was chosen by room (a log
    /// object new to the index, which another drive may take instead).
    async fn put_once(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
        size_bytes: u64,
    ) -> (StoreResult<()>, usize, bool) {
        let chosen = {
            let mut st = self.lock();
            let known = st.index.contains_key(key) || st.in_flight.contains_key(key);
            self.choose(&mut st, key, size_bytes, placement)
                .map(|(d, moved)| {
                    st.reserved_bytes[d] += size_bytes;
                    st.in_flight.entry(key.to_string()).or_insert((d, 0)).1 += 1;
                    (d, known, moved, d == st.tail)
                })
        };
        let (drive, known, moved, to_tail) = match chosen {
            Ok(c) => c,
            Err(e) => return (Err(e), 0, false),
        };
        let placed = !known && is_log_object(key);
        let result = async {
            if moved {
                self.record_tail().await;
            }
            // Written by another process on another drive since open: taken.
            if mode == PutMode::IfAbsent && !known {
                for (d, other) in self.inner.drives.iter().enumerate() {
                    if d != drive && other.stat(key).is_some() {
                        return Err(Error::new(
                            ErrorKind::AlreadyExists,
                            format!("{key} exists on drive {d} ({})", other.describe()),
                        ));
                    }
                }
            }
            self.inner.drives[drive].put(key, data, mode).await
        }
        .await;
        let mut st = self.lock();
        st.reserved_bytes[drive] -= size_bytes;
        if let Entry::Occupied(mut e) = st.in_flight.entry(key.to_string()) {
            e.get_mut().1 -= 1;
            if e.get().1 == 0 {
                e.remove();
            }
        }
        match &result {
            Ok(()) => {
                let old = st
                    .index
                    .insert(key.to_string(), Located { drive, size_bytes });
                if let Some(old) = old {
                    st.used_bytes[old.drive] -= old.size_bytes.min(st.used_bytes[old.drive]);
                }
                st.used_bytes[drive] += size_bytes;
                let gc = matches!(placement, Placement::Gc { .. });
                let client_object = !gc && is_log_object(key);
                let c = &mut st.counters[drive];
                c.puts += 1;
                c.put_bytes += size_bytes;
                c.gc_puts += u64::from(gc);
                c.client_object_puts += u64::from(client_object);
                st.gc_puts_to_tail += u64::from(gc && to_tail);
            }
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                drop(st);
                // Known now, wherever it is.
                let _ = self.find(key);
            }
            Err(_) => {}
        }
        (result, drive, placed)
    }

    pub(super) async fn read(&self, key: String, read: Read) -> StoreResult<Vec<u8>> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        let known = self.lock().index.get(&key).map(|l| l.drive);
        if let Some(d) = known {
            self.count_read(d);
            match self.inner.drives[d].read(&key, &read).await {
                Err(e) if e.is_not_found() => {
                    // Gone from there (deleted by another process): forget it.
                    self.forget(&key, d);
                }
                r => return r,
            }
        }
        match self.find(&key)? {
            Some(d) => {
                self.count_read(d);
                self.inner.drives[d].read(&key, &read).await
            }
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    /// `ReadOnly` when the chain was opened read-only.
    fn refuse_if_read_only(&self, what: &str, key: &str) -> StoreResult<()> {
        if self.inner.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{what} {key}: {} is open read-only", self.inner.describe),
            ));
        }
        Ok(())
    }

    fn count_read(&self, drive: usize) {
        let mut st = self.lock();
        st.reads += 1;
        if drive == st.tail {
            st.tail_reads += 1;
        }
    }

    /// Object reads so far, and those that reached the drive that was the tail then.
    pub fn read_counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.reads, st.tail_reads)
    }

    fn forget(&self, key: &str, drive: usize) {
        let mut st = self.lock();
        if let Entry::Occupied(e) = st.index.entry(key.to_string())
            && e.get().drive == drive
        {
            let gone = e.remove();
            st.used_bytes[drive] -= gone.size_bytes.min(st.used_bytes[drive]);
        }
    }

    /// The drive holding `key`: the index's, else looked for on every drive.
    fn locate(&self, key: &str) -> StoreResult<Option<usize>> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(key));
        }
        let known = self.lock().index.get(key).map(|l| l.drive);
        match known {
            Some(d) => Ok(Some(d)),
            None => self.find(key),
        }
    }

    pub(super) async fn read_copies(
        &self,
        key: String,
        range: Range<u64>,
    ) -> StoreResult<Vec<CopyBytes>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].read_copies(&key, range).await,
            None => Ok(Vec::new()),
        }
    }

    pub(super) async fn repair_copies_inner(
        &self,
        key: String,
        good: Bytes,
    ) -> StoreResult<Vec<String>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].rewrite_differing(&key, good).await,
            None => Ok(Vec::new()),
        }
    }

    pub(super) async fn copies_of_inner(&self, key: String) -> StoreResult<Vec<String>> {
        match self.locate(&key)? {
            Some(d) => Ok(self.inner.drives[d].copy_names()),
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    pub(super) async fn get_copy_inner(&self, key: String, copy: usize) -> StoreResult<Vec<u8>> {
        match self.locate(&key)? {
            Some(d) => self.inner.drives[d].read_one_copy(&key, copy).await,
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("{key} is on no drive of {}", self.inner.describe),
            )),
        }
    }

    pub(super) async fn delete_inner(&self, key: String) -> StoreResult<()> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(&key));
        }
        self.refuse_if_read_only("delete", &key)?;
        let known = self.lock().index.get(&key).map(|l| l.drive);
        let drive = match known {
            Some(d) => Some(d),
            None => self.find(&key)?,
        };
        if let Some(d) = drive {
            self.inner.drives[d].delete(&key).await?;
            self.forget(&key, d);
            // Room made there: the drive takes puts again.
            self.lock().full[d] = false;
        }
        Ok(())
    }
}
