//! The chain behind the `ObjectStore` trait: each call handed to its `ops` method,
//! plus the store's metrics (reads, reads that reached the tail, the tail's position,
//! degraded positions, mirror copies dropped).

use super::*;

impl ObjectStore for ChainStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.put_placed(key, data, mode, &Placement::Client)
    }
    fn put_placed(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        let placement = placement.clone();
        Box::pin(self.put_inner(key, data, mode, placement))
    }
    crate::chain::reads_through_read!();
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let (this, prefix) = (self.clone(), prefix.to_string());
        Box::pin(blocking(move || {
            merge_listings(&this.inner.drives, &prefix)
        }))
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(self.delete_inner(key.to_string()))
    }
    fn describe(&self) -> String {
        self.inner.describe.clone()
    }
    fn is_local(&self) -> bool {
        true
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        Box::pin(self.read_copies(key.to_string(), range))
    }
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        Box::pin(self.repair_copies_inner(key.to_string(), good))
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        Box::pin(self.copies_of_inner(key.to_string()))
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        Box::pin(self.get_copy_inner(key.to_string(), copy))
    }
    /// The tail cache: what is uploaded goes into the read cache too, so reads of
    /// fresh data stay off the drive taking the writes.
    fn admit_uploads_to_cache(&self) -> bool {
        true
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        let (reads, tail_reads) = self.read_counts();
        let tail = self.lock().tail;
        let mut metrics = vec![
            StoreMetric {
                name: "reads_total",
                kind: "counter",
                help: "Object reads (whole or ranged) the store served.",
                value: reads as f64,
            },
            StoreMetric {
                name: "tail_reads_total",
                kind: "counter",
                help: "Of those, reads that reached the drive taking new writes (the tail): what the read cache did not absorb.",
                value: tail_reads as f64,
            },
            StoreMetric {
                name: "tail_drive",
                kind: "gauge",
                help: "Position of the drive taking new writes.",
                value: tail as f64,
            },
        ];
        metrics.extend(super::super::position::mirror_metrics(&self.inner.drives));
        metrics
    }
}
