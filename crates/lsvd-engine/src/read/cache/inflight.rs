//! Chunks being fetched from the store right now, so that concurrent misses on the
//! same chunk share one GET: the first reader *claims* a run of chunks and fetches
//! them; a second reader that needs one of them waits for the claim to end and then
//! finds the chunk in the cache (or, if the fetch failed or could not be cached,
//! claims it itself).
//!
//! A claim is a guard: dropping it (the fetch finished, failed, or its reader was
//! cancelled) removes its chunks from the table and wakes everyone waiting on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{CacheObject, Key};

/// The table: for every chunk being fetched, a receiver that closes when its fetch
/// ends. Bounded by the fetches in flight (each holds its chunks' entries).
#[derive(Default)]
pub(crate) struct InFlight {
    map: Mutex<HashMap<Key, watch::Receiver<()>>>,
}

/// Chunks `[first, last]` of object `obj`, claimed for fetching by one reader.
pub(crate) struct Claim {
    table: Arc<InFlight>,
    obj: CacheObject,
    pub first: u64,
    pub last: u64,
    done: watch::Sender<()>,
}

/// What [`InFlight::claim`] found at the first chunk.
pub(crate) enum ClaimResult {
    /// The caller fetches these chunks.
    Claimed(Claim),
    /// Someone else is fetching the first chunk: wait with [`wait`], then look again.
    Busy(watch::Receiver<()>),
}

/// Wait for the fetch behind `rx` to end (successfully or not).
pub(crate) async fn wait(mut rx: watch::Receiver<()>) {
    // Err: the sender is gone, which is exactly "the fetch ended".
    while rx.changed().await.is_ok() {}
}

impl InFlight {
    /// Claim chunks of `obj` from `first` on, up to `last`, stopping before the first
    /// chunk that is in flight or for which `skip` says so (cached). `first` itself is
    /// claimed unless it is in flight.
    pub(crate) fn claim(
        self: &Arc<Self>,
        obj: CacheObject,
        first: u64,
        last: u64,
        skip: impl Fn(u64) -> bool,
    ) -> ClaimResult {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = map.get(&(obj, first)) {
            return ClaimResult::Busy(rx.clone());
        }
        let mut end = first;
        while end < last && !map.contains_key(&(obj, end + 1)) && !skip(end + 1) {
            end += 1;
        }
        let (done, rx) = watch::channel(());
        for c in first..=end {
            map.insert((obj, c), rx.clone());
        }
        ClaimResult::Claimed(Claim {
            table: self.clone(),
            obj,
            first,
            last: end,
            done,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut map = self.table.map.lock().unwrap_or_else(|p| p.into_inner());
        for c in self.first..=self.last {
            if map
                .get(&(self.obj, c))
                .is_some_and(|rx| rx.same_channel(&self.done.subscribe()))
            {
                map.remove(&(self.obj, c));
            }
        }
        // `done` drops after this, closing every waiter's receiver.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(seq: u64) -> CacheObject {
        CacheObject::new(lsvd_core::VolumeId([1; 16]), seq, 0)
    }

    #[tokio::test]
    async fn a_claim_blocks_others_until_dropped() {
        let t = Arc::new(InFlight::default());
        let ClaimResult::Claimed(a) = t.claim(obj(1), 2, 9, |c| c == 6) else {
            panic!("first claim");
        };
        assert_eq!((a.first, a.last), (2, 5), "stops before the cached chunk 6");
        // Another object, or chunks past the claim, are free.
        assert!(matches!(
            t.claim(obj(2), 2, 2, |_| false),
            ClaimResult::Claimed(_)
        ));
        let ClaimResult::Claimed(b) = t.claim(obj(1), 0, 9, |_| false) else {
            panic!("chunk 0 is free");
        };
        assert_eq!(
            (b.first, b.last),
            (0, 1),
            "stops before the chunks in flight"
        );
        let ClaimResult::Busy(rx) = t.claim(obj(1), 3, 3, |_| false) else {
            panic!("chunk 3 is in flight");
        };
        let waiter = tokio::spawn(wait(rx));
        drop(a);
        waiter.await.expect("woken when the claim ends");
        assert!(matches!(
            t.claim(obj(1), 3, 3, |_| false),
            ClaimResult::Claimed(_)
        ));
        drop(b);
        assert_eq!(t.len(), 0);
    }
}
