//! The S3 store against a real S3 server.
//!
//! Run with a throwaway versitygw on loopback:
//!
//! ```text
//! scripts/with-versitygw.sh cargo test -p lsvd --test s3_store
//! ```
//!
//! The tests need `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
//! `LSVD_TEST_S3_BUCKET` (`with-versitygw.sh` sets them). Without them each test prints
//! a loud SKIPPED message and passes (so a plain `cargo test` works without a server),
//! unless an S3 server is required: `LSVD_TEST_STORE=s3` (the S3 pass of
//! `scripts/test.sh`), `LSVD_REQUIRE_S3=1` or `LSVD_TEST_S3=require` make a missing
//! server a failure, so CI cannot skip these tests silently. Every test works under
//! its own random prefix, so tests run in parallel and a bucket can be reused.
//!
//! The test that the self-test rejects a store ignoring put-if-absent needs no server
//! and always runs.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::store_checks::{
    check_list_and_delete, check_object_listing, check_overwrite, check_ranges, open_described,
    put_if_absent_race_has_one_winner, put_sample, selftest_passes, unique_store_url,
};
use common::{TempDir, env_nonempty, missing_s3_env, s3_required, skip_loudly};
use lsvd_core::error::ErrorKind;
use lsvd_engine::{EngineConfig, create_volume, open_volume};
use lsvd_store::retry::RetryPolicy;
use lsvd_store::s3::{S3Settings, S3Store, Secret};
use lsvd_store::{DynStore, PutMode, open_store, selftest};

/// The test bucket, or `None` (after a loud message) when no server is configured.
fn s3_bucket(test: &str) -> Option<String> {
    let missing = missing_s3_env();
    if missing.is_empty() {
        return env_nonempty("LSVD_TEST_S3_BUCKET");
    }
    let msg = format!(
        "{test}: needs an S3 server ({} unset). Run: \
         scripts/with-versitygw.sh cargo test -p lsvd --test s3_store",
        missing.join(", ")
    );
    let required = s3_required().map(|why| format!("{why}, so an S3 server is required."));
    skip_loudly(&msg, required);
    None
}

/// A fresh `s3://BUCKET/PREFIX` URL for one test.
fn unique_url(bucket: &str, test: &str) -> String {
    unique_store_url("s3", bucket, test)
}

/// A fresh URL (`tag` in its prefix) in the test bucket, or `None` as [`s3_bucket`].
fn s3_url(test: &str, tag: &str) -> Option<String> {
    s3_bucket(test).map(|bucket| unique_url(&bucket, tag))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_range_list_delete_round_trip() {
    let Some(url) = s3_url("put_get_range_list_delete_round_trip", "roundtrip") else {
        return;
    };
    let s = open_described(&url, "open");

    let data = put_sample(&*s, "v/obj/0001.d").await;
    assert_eq!(s.get("v/obj/0001.d").await.expect("get"), data);

    // Ranged reads: inside, clamped at the end, past the end, empty.
    check_ranges(&*s, "v/obj/0001.d", "v/missing").await;

    // Overwrite replaces; put-if-absent refuses.
    check_overwrite(&*s).await;
    let e = s
        .put("v/meta", Bytes::from_static(b"three"), PutMode::IfAbsent)
        .await
        .expect_err("exists");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(s.get("v/meta").await.expect("get"), b"two");
    // Listing (all, by directory, by raw prefix, unused prefix) and deletes.
    check_list_and_delete(&*s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_pagination() {
    let Some(bucket) = s3_bucket("list_follows_pagination") else {
        return;
    };
    let s = open_store(&unique_url(&bucket, "pages")).expect("open");
    // More than one ListObjectsV2 page (1000 keys).
    const N: usize = 1_205;
    let mut tasks = tokio::task::JoinSet::new();
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    for i in 0..N {
        let s = s.clone();
        let sem = sem.clone();
        tasks.spawn(async move {
            let _permit = sem.acquire().await.expect("semaphore");
            s.put(
                &format!("vol/obj/{i:016x}.d"),
                Bytes::from(vec![1; i % 7]),
                PutMode::IfAbsent,
            )
            .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task").expect("put");
    }
    let listed = check_object_listing(&*s, N, |i| i % 7).await;
    // Clean up (bounded concurrency).
    let mut tasks = tokio::task::JoinSet::new();
    for e in listed {
        let s = s.clone();
        let sem = sem.clone();
        tasks.spawn(async move {
            let _permit = sem.acquire().await.expect("semaphore");
            s.delete(&e.key).await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task").expect("delete");
    }
    s.delete("vol/meta").await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_if_absent_race_has_exactly_one_winner() {
    let Some(bucket) = s3_bucket("put_if_absent_race_has_exactly_one_winner") else {
        return;
    };
    let s = open_store(&unique_url(&bucket, "race")).expect("open");
    put_if_absent_race_has_one_winner(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selftest_passes_on_the_server() {
    let Some(url) = s3_url("selftest_passes_on_the_server", "selftest") else {
        return;
    };
    let bare = S3Store::open(&url, &S3Settings::default()).expect("open");
    let report = selftest_passes(&url, &bare).await;
    assert_eq!(report.checks.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_errors() {
    let Some(url) = s3_url("credentials_never_appear_in_errors", "creds") else {
        return;
    };
    let real_key = env_nonempty("AWS_ACCESS_KEY_ID").expect("checked");
    let real_secret = env_nonempty("AWS_SECRET_ACCESS_KEY").expect("checked");
    let wrong_secret = "WRONG-secret-canary-7f3a9c1e2b".to_string();
    let wrong_key = "AKIACANARYKEY12345".to_string();
    let fast = RetryPolicy {
        attempts: 2,
        initial_backoff: std::time::Duration::from_millis(10),
        ..RetryPolicy::default()
    };

    let cases = [
        // Right key id, wrong secret: SignatureDoesNotMatch (the server may echo the
        // key id and the string to sign).
        (
            "wrong secret",
            S3Settings {
                access_key_id: Some(Secret::new(&real_key)),
                secret_access_key: Some(Secret::new(&wrong_secret)),
                ..S3Settings::default()
            },
        ),
        // Unknown key id.
        (
            "unknown key",
            S3Settings {
                access_key_id: Some(Secret::new(&wrong_key)),
                secret_access_key: Some(Secret::new(&wrong_secret)),
                ..S3Settings::default()
            },
        ),
        // Nothing listening: a connection error.
        (
            "connection refused",
            S3Settings {
                endpoint: Some("http://127.0.0.1:1".into()),
                access_key_id: Some(Secret::new(&wrong_key)),
                secret_access_key: Some(Secret::new(&wrong_secret)),
                max_retries: 0,
                ..S3Settings::default()
            },
        ),
    ];
    for (what, settings) in cases {
        let store: DynStore =
            lsvd_store::s3::open_with_retry(&url, &settings, &fast).expect("open (no I/O)");
        let mut messages = vec![store.describe()];
        let e = store.get("some/key").await.expect_err(what);
        let want = if what == "connection refused" {
            ErrorKind::Transient
        } else {
            ErrorKind::Denied
        };
        assert_eq!(e.kind, want, "{what}: {e}");
        messages.push(e.to_string());
        messages.push(format!("{e:?}"));
        let e = store
            .put("some/key", Bytes::from_static(b"x"), PutMode::IfAbsent)
            .await
            .expect_err(what);
        messages.push(e.to_string());
        let e = store.list("").await.expect_err(what);
        messages.push(e.to_string());
        let e = selftest::run(&*store).await.expect_err(what);
        messages.push(e.to_string());
        for m in &messages {
            for secret in [&real_secret, &wrong_secret, &real_key, &wrong_key] {
                assert!(
                    !m.contains(secret.as_str()),
                    "{what}: a credential leaked into: {m}"
                );
            }
        }
        eprintln!("{what}: {}", messages[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_is_not_a_missing_object() {
    let Some(bucket) = s3_bucket("missing_bucket_is_not_a_missing_object") else {
        return;
    };
    // A typo in the bucket name must not look like "no volume here" (which would make
    // `lsvd serve` try to create one).
    let url = unique_url(&format!("{bucket}-absent"), "nobucket");
    let s = open_store(&url).expect("open");
    let e = s.get("disk0/meta").await.expect_err("no bucket");
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(e.message.contains("NoSuchBucket"), "{e}");
    let e = s.list("").await.expect_err("no bucket");
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    let e = selftest::run(&*s).await.expect_err("self-test refuses");
    eprintln!("{e}");
}

/// Requests signed without hashing their bodies (the default over HTTPS; forced here,
/// since the test server is plain HTTP) are accepted, single and multipart, and read
/// back intact; a wrong secret is still refused, since the headers are still signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_payload_uploads_read_back_and_still_need_the_key() {
    let Some(bucket) = s3_bucket("unsigned_payload_uploads_read_back_and_still_need_the_key")
    else {
        return;
    };
    let url = unique_url(&bucket, "unsigned");
    let settings = S3Settings {
        unsigned_payload: Some(true),
        multipart_threshold_bytes: 6 << 20,
        multipart_part_bytes: 5 << 20,
        ..S3Settings::default()
    };
    let s =
        lsvd_store::s3::open_with_retry(&url, &settings, &RetryPolicy::default()).expect("open");
    selftest::run(&*s)
        .await
        .expect("self-test with unsigned payloads");
    let data: Bytes = (0..(12u32 << 20) + 777)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    s.put("small", data.slice(..4096), PutMode::IfAbsent)
        .await
        .expect("single put");
    assert_eq!(s.get("small").await.expect("get"), &data[..4096]);
    s.put("big", data.clone(), PutMode::Overwrite)
        .await
        .expect("multipart put");
    assert_eq!(s.get("big").await.expect("get"), data);

    let wrong = S3Settings {
        unsigned_payload: Some(true),
        access_key_id: env_nonempty("AWS_ACCESS_KEY_ID").map(|k| Secret::new(&k)),
        secret_access_key: Some(Secret::new("WRONG-secret-unsigned-3b9d")),
        max_retries: 0,
        ..S3Settings::default()
    };
    let fast = RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    };
    let w = lsvd_store::s3::open_with_retry(&url, &wrong, &fast).expect("open (no I/O)");
    let e = w
        .put("other", data.slice(..4096), PutMode::IfAbsent)
        .await
        .expect_err("a wrong secret is refused");
    assert_eq!(e.kind, ErrorKind::Denied, "{e}");
    assert!(
        w.get("small").await.is_err(),
        "a wrong secret reads nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_overwrite_uses_multipart() {
    let Some(url) = s3_url("large_overwrite_uses_multipart", "multipart") else {
        return;
    };
    let settings = S3Settings {
        multipart_threshold_bytes: 6 << 20,
        multipart_part_bytes: 5 << 20,
        ..S3Settings::default()
    };
    let s =
        lsvd_store::s3::open_with_retry(&url, &settings, &RetryPolicy::default()).expect("open");
    let data: Bytes = (0..(12u32 << 20) + 12_345)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    s.put("big", data.clone(), PutMode::Overwrite)
        .await
        .expect("multipart put");
    assert_eq!(s.get("big").await.expect("get"), data);
    let mid = (5u64 << 20) - 10..(5u64 << 20) + 10;
    assert_eq!(
        s.get_range("big", mid.clone()).await.expect("range"),
        &data[mid.start as usize..mid.end as usize]
    );
    assert_eq!(
        s.list("big").await.expect("list")[0].size_bytes,
        data.len() as u64
    );
    // Put-if-absent of a large object is a single PUT (and still conditional).
    s.put("big2", data.clone(), PutMode::IfAbsent)
        .await
        .expect("single put");
    let e = s
        .put("big2", Bytes::from_static(&[1]), PutMode::IfAbsent)
        .await
        .expect_err("exists");
    assert_eq!(e.kind, ErrorKind::AlreadyExists);
    s.delete("big").await.expect("delete");
    s.delete("big2").await.expect("delete");
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_round_trips_through_s3_alone() {
    let Some(url) = s3_url("volume_round_trips_through_s3_alone", "volume") else {
        return;
    };
    let store = open_store(&url).expect("open");
    selftest::run(&*store).await.expect("self-test");
    let config = EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 4,
        ..EngineConfig::default()
    };
    create_volume(&store, "disk0", 64 << 20)
        .await
        .expect("create");
    let again = create_volume(&store, "disk0", 64 << 20).await;
    assert!(again.is_err(), "second create must fail (put-if-absent)");

    // Writes across several objects, some overwritten.
    let writes: Vec<(u64, Vec<u8>)> = (0..40u64)
        .map(|i| {
            let offset = (i * 7 % 50) * 128 * 1024;
            (offset, pattern(i + 1, 64 * 1024))
        })
        .collect();
    let mut expect = vec![0u8; 8 << 20];
    let first_dir = TempDir::new("vol-a");
    {
        let (vol, _report) = open_volume(store.clone(), "disk0", first_dir.path(), config.clone())
            .await
            .expect("open volume");
        for (offset, data) in &writes {
            vol.write(*offset, data.clone(), false)
                .await
                .expect("write");
            expect[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
        vol.flush().await.expect("flush");
        assert_eq!(
            vol.read(0, expect.len() as u64).await.expect("read"),
            expect,
            "read back before shutdown"
        );
        vol.shutdown()
            .await
            .expect("shutdown uploads and checkpoints");
    }
    let objects = store.list("disk0/obj/").await.expect("list");
    assert!(
        objects.len() >= 2,
        "several objects in the bucket: {objects:?}"
    );

    // A fresh data directory: everything must come from the bucket.
    let second_dir = TempDir::new("vol-b");
    let store2 = open_store(&url).expect("reopen store");
    let (vol, report) = open_volume(store2, "disk0", second_dir.path(), config)
        .await
        .expect("reopen volume");
    assert!(report.cache_created, "{report:?}");
    assert_eq!(report.log_records_replayed, 0, "{report:?}");
    let got = vol.read(0, expect.len() as u64).await.expect("read");
    assert!(got == expect, "data read from S3 alone differs");
    assert_eq!(
        vol.read(60 << 20, 4096).await.expect("read unwritten"),
        vec![0u8; 4096]
    );
    vol.shutdown().await.expect("shutdown");
}
