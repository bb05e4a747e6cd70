//! Checks the object-store tests run against every real store (S3 in `s3_store.rs`,
//! Azure and GCS emulators in `cloud_stores.rs`): the same behaviour is asked of each,
//! so it is written once.

use std::ops::Range;
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

/// `open_store(url)` (`what` names the open when it fails): a store that describes
/// itself by its URL.
pub fn open_described(url: &str, what: &str) -> DynStore {
    let s = lsvd_store::open_store(url).expect(what);
    assert!(s.describe().starts_with(url), "{}", s.describe());
    s
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

/// `v/meta` put twice with `Overwrite`: the second body replaces the first.
pub async fn check_overwrite(s: &dyn ObjectStore) {
    s.put("v/meta", Bytes::from_static(b"one"), PutMode::Overwrite)
        .await
        .expect("put");
    s.put("v/meta", Bytes::from_static(b"two"), PutMode::Overwrite)
        .await
        .expect("overwrite");
    assert_eq!(s.get("v/meta").await.expect("get"), b"two");
}

/// With `v/meta` and the 10,000-byte `v/obj/0001.d` in `s`: puts an empty `w/meta`
/// (read back) and a 3-byte `v/obj/0002.c`, then checks listings (all, by raw prefix,
/// unused prefix: sorted, with sizes), then deletes (twice, the second a no-op) until
/// the store is empty.
pub async fn check_list_and_delete(s: &dyn ObjectStore) {
    s.put("w/meta", Bytes::new(), PutMode::IfAbsent)
        .await
        .expect("empty object");
    assert_eq!(s.get("w/meta").await.expect("get"), b"");
    s.put("v/obj/0002.c", Bytes::from(vec![7; 3]), PutMode::IfAbsent)
        .await
        .expect("put");

    let all = s.list("").await.expect("list");
    assert_eq!(
        keys(&all),
        ["v/meta", "v/obj/0001.d", "v/obj/0002.c", "w/meta"]
    );
    assert_eq!((all[1].size_bytes, all[3].size_bytes), (10_000, 0));
    assert_eq!(
        keys(&s.list("v/").await.expect("list")),
        ["v/meta", "v/obj/0001.d", "v/obj/0002.c"]
    );
    assert_eq!(
        keys(&s.list("v/obj/0001").await.expect("list")),
        ["v/obj/0001.d"]
    );
    assert_eq!(keys(&s.list("v/o").await.expect("list")).len(), 2);
    assert!(s.list("x/").await.expect("list").is_empty());

    // The second delete finds nothing: still Ok.
    for attempt in ["delete", "delete missing is ok"] {
        s.delete("v/obj/0001.d").await.expect(attempt);
    }
    let gone = s.get("v/obj/0001.d").await.expect_err("gone");
    assert!(gone.is_not_found(), "{gone}");
    for k in ["v/meta", "v/obj/0002.c", "w/meta"] {
        s.delete(k).await.expect("delete");
    }
    assert!(s.list("").await.expect("list").is_empty());
}

/// Puts the 10,000-byte [`sample`] as `key` (`IfAbsent`); returns it.
pub async fn put_sample(s: &dyn ObjectStore, key: &str) -> Bytes {
    let data = sample(10_000);
    s.put(key, data.clone(), PutMode::IfAbsent)
        .await
        .expect("put");
    data
}

/// `len` bytes of a fixed pattern.
pub fn sample(len: u32) -> Bytes {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// Ranged reads of a 10,000-byte object `key` holding [`sample`]: inside, clamped at
/// the end, past the end, empty; and a missing key is `NotFound` for every range.
pub async fn check_ranges(s: &dyn ObjectStore, key: &str, missing: &str) {
    let data = sample(10_000);
    let cases: [(Range<u64>, &[u8]); 5] = [
        (0..1, &data[0..1]),
        (100..4196, &data[100..4196]),
        (9_990..20_000, &data[9_990..]),
        (10_000..10_100, &[]),
        (50..50, &[]),
    ];
    for (r, want) in cases {
        assert_eq!(
            s.get_range(key, r.clone()).await.expect("range"),
            want,
            "range {r:?}"
        );
    }
    for r in [0..10, 20_000..20_010, 5..5] {
        let e = s.get_range(missing, r).await.expect_err("missing");
        assert!(e.is_not_found(), "{e}");
    }
    assert!(s.get(missing).await.expect_err("missing").is_not_found());
}

/// The store self-test at `url`: through `open_store` (the retrying decorator, whose
/// report is printed and returned) and on `bare`, the store alone, with 16 racers for
/// the put-if-absent race; either way its probes are removed.
pub async fn selftest_passes(
    url: &str,
    bare: &dyn ObjectStore,
) -> lsvd_store::selftest::SelfTestReport {
    let s = lsvd_store::open_store(url).expect("open");
    let report = lsvd_store::selftest::run(&*s)
        .await
        .expect("self-test passes");
    eprintln!("{report}");
    let racing = lsvd_store::selftest::run_with(bare, 16).await;
    racing.expect("self-test with 16 racers passes");
    assert!(s.list("").await.expect("list").is_empty(), "probes removed");
    report
}
