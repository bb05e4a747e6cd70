//! Checks the object-store tests run against every real store (S3 in `s3_store.rs`,
//! Azure and GCS emulators in `cloud_stores.rs`): the same behaviour is asked of each,
//! so it is written once.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use lsvd_core::error::ErrorKind;
use lsvd_store::{DynStore, ListEntry, ObjectStore, PutMode};

/// A fresh `SCHEME://CONTAINER/PREFIX` URL for one test (`CONTAINER`: the bucket).
pub fn unique_store_url(scheme: &str, container: &str, test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{scheme}://{container}/t-{test}-{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The keys of a listing.
pub fn keys(entries: &[ListEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.key.as_str()).collect()
}

/// With `n` objects `vol/obj/{i:016x}.d` of `size_of(i)` bytes in `s`: puts
/// `vol/meta`, checks that listing `vol/obj/` gives exactly those objects in order with
/// their sizes and listing everything gives one more; returns the `vol/obj/` listing.
pub async fn check_object_listing(
    s: &dyn ObjectStore,
    n: usize,
    size_of: impl Fn(usize) -> usize,
) -> Vec<ListEntry> {
    s.put("vol/meta", Bytes::from_static(&[0]), PutMode::IfAbsent)
        .await
        .expect("put");
    let listed = s.list("vol/obj/").await.expect("list");
    assert_eq!(listed.len(), n);
    for (i, e) in listed.iter().enumerate() {
        assert_eq!(e.key, format!("vol/obj/{i:016x}.d"));
        assert_eq!(e.size_bytes, size_of(i) as u64);
    }
    assert_eq!(s.list("").await.expect("list all").len(), n + 1);
    listed
}

/// Five rounds of 16 writers racing to put one key `IfAbsent`: exactly one wins each
/// round (the others get `AlreadyExists`) and the key holds the winner's bytes.
pub async fn put_if_absent_race_has_one_winner(s: &DynStore) {
    for round in 0..5 {
        let key = format!("race/{round}");
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..16u32 {
            let s = s.clone();
            let key = key.clone();
            tasks.spawn(async move {
                let data = Bytes::from(format!("writer {i} of round {round}"));
                let r = s.put(&key, data.clone(), PutMode::IfAbsent).await;
                (data, r)
            });
        }
        let mut winners = Vec::new();
        while let Some(r) = tasks.join_next().await {
            let (data, r) = r.expect("task");
            match r {
                Ok(()) => winners.push(data),
                Err(e) => assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one writer wins");
        assert_eq!(s.get(&key).await.expect("get"), winners[0]);
        s.delete(&key).await.expect("delete");
    }
}
