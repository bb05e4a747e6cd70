//! The `gs://` and `az://` stores against their emulators on loopback.
//!
//! ```text
//! scripts/with-azurite.sh cargo test -p lsvd --test cloud_stores az_
//! scripts/with-fake-gcs.sh cargo test -p lsvd --test cloud_stores gs_
//! ```
//!
//! (`scripts/test-cloud.sh` runs both.) Azure: Azurite honours `If-None-Match: *`, so
//! the store passes everything the S3 store does, and a volume served by the real
//! `lsvd serve` survives a SIGKILL and the loss of its data directory.
//!
//! GCS: fake-gcs-server (the emulator that installs from the Go module proxy) honours
//! `ifGenerationMatch=0` on its JSON upload API, but has no XML-API object upload,
//! which is how `object_store` writes (`PUT /BUCKET/KEY` answers `400 invalid
//! uploadType`; fake-gcs-server issue 331). So the `gs_` tests check that the
//! self-test refuses the emulator (lsvd must never serve from a store it cannot
//! write), and test the read side (get, ranged get, list, delete) on objects seeded
//! through the JSON API with `curl`. fake-gcs-server's XML listing ignores `max-keys`
//! and answers in one page, so continuation tokens are exercised on Azurite only.
//!
//! Each test skips, with a loud message, when its emulator's variables are unset,
//! unless `LSVD_REQUIRE_CLOUD` names its scheme (`gs`, `az`, or `gs,az`):
//! `scripts/test-cloud.sh` sets it, so the pass cannot skip silently. Every test works
//! under its own random prefix.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use bytes::Bytes;
use common::store_checks::{
    check_list_and_delete, check_object_listing, check_overwrite, check_ranges, keys,
    open_described, put_if_absent_race_has_one_winner, put_sample, sample, selftest_passes,
    unique_store_url,
};
use common::{
    Lsvd, TempDir, assert_files_equal, env_nonempty, nbdcopy, require_tools, skip_loudly,
    write_random_image,
};
use lsvd_core::error::ErrorKind;
use lsvd_store::azure::AzureStore;
use lsvd_store::cloud::ClientSettings;
use lsvd_store::gcs::GcsStore;
use lsvd_store::{DynStore, ObjectStore, PutMode, open_store, selftest};

/// The bucket (`gs`) or container (`az`) of the running emulator, or `None` (after a
/// loud message) when there is none and none is required.
fn container(scheme: &str, test: &str) -> Option<String> {
    let (var, script) = match scheme {
        "gs" => ("LSVD_TEST_GS_BUCKET", "scripts/with-fake-gcs.sh"),
        _ => ("LSVD_TEST_AZ_CONTAINER", "scripts/with-azurite.sh"),
    };
    if let Some(c) = env_nonempty(var) {
        return Some(c);
    }
    let msg = format!(
        "{test}: needs the {scheme}:// emulator ({var} unset). Run: \
         {script} cargo test -p lsvd --test cloud_stores {scheme}_"
    );
    let required = env_nonempty("LSVD_REQUIRE_CLOUD")
        .is_some_and(|v| v.split(',').any(|s| s.trim() == scheme))
        .then(|| format!("LSVD_REQUIRE_CLOUD names {scheme}."));
    skip_loudly(&msg, required);
    None
}

fn unique_url(scheme: &str, container: &str, test: &str) -> String {
    unique_store_url(scheme, container, test)
}

/// A fresh URL (`tag` in its prefix) in the `scheme` emulator's container, or `None`
/// as [`container`].
fn emulator_url(scheme: &str, test: &str, tag: &str) -> Option<String> {
    container(scheme, test).map(|c| unique_url(scheme, &c, tag))
}

// ---------------------------------------------------------------------------------
// Without an emulator: what the binary says about URLs and credentials
// ---------------------------------------------------------------------------------

/// `lsvd --store URL list` with no GOOGLE_*/AZURE_* variables and an empty HOME (no
/// gcloud credentials file): exit status 2 and one `lsvd: error:` line, returned.
fn one_line_error_without_cloud_env(url: &str) -> String {
    let dir = TempDir::new("cloud-errors");
    let lsvd = Lsvd {
        data: dir.join("data"),
        store: Some(url.to_string()),
    };
    let mut cmd = lsvd.cmd(["list"]);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GOOGLE_") || k.starts_with("AZURE_") || k.starts_with("AZURITE_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("LSVD_GCS_CREDENTIALS")
        .env_remove("LSVD_AZURE_CREDENTIALS")
        .env("HOME", dir.path());
    let out = common::run_timeout(&mut cmd, common::SHORT);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}", common::show(url, &out));
    assert!(
        err.starts_with("lsvd: error: ") && err.trim_end().lines().count() == 1,
        "{}",
        common::show(url, &out)
    );
    err
}

#[test]
fn unknown_schemes_and_missing_credentials_are_one_line_errors() {
    for url in [
        "ftp://bkt/x",
        "abfss://c@acct.dfs.core.windows.net/x",
        "gcs://b/x",
    ] {
        let err = one_line_error_without_cloud_env(url);
        for known in [
            "file://PATH",
            "a plain path",
            "s3://BUCKET/PREFIX",
            "gs://BUCKET/PREFIX",
            "az://CONTAINER/PREFIX",
            "chain:",
            "stripe:",
        ] {
            assert!(err.contains(known), "{url}: {err}");
        }
    }
    // Known schemes, no credentials: said before any request (nothing listens here).
    let err = one_line_error_without_cloud_env("gs://bkt/vols");
    assert!(
        err.contains("no credentials") && err.contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "{err}"
    );
    let err = one_line_error_without_cloud_env("az://c/vols");
    assert!(err.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{err}");
    let err = one_line_error_without_cloud_env("az://user:secret@c/vols");
    assert!(!err.contains("secret"), "{err}");
}

// ---------------------------------------------------------------------------------
// Azure (Azurite)
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_put_if_absent_ranges_list_delete() {
    let Some(url) = emulator_url("az", "az_put_if_absent_ranges_list_delete", "roundtrip") else {
        return;
    };
    let s = open_described(&url, "open");

    let data = put_sample(&*s, "v/obj/0001.d").await;
    // The second put-if-absent is refused, and the first body stays.
    let e = s
        .put(
            "v/obj/0001.d",
            Bytes::from_static(b"other"),
            PutMode::IfAbsent,
        )
        .await
        .expect_err("taken");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(s.get("v/obj/0001.d").await.expect("get"), data);
    check_ranges(&*s, "v/obj/0001.d", "v/missing").await;

    check_overwrite(&*s).await;
    check_list_and_delete(&*s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_list_follows_pagination() {
    let Some(url) = emulator_url("az", "az_list_follows_pagination", "pages") else {
        return;
    };
    // Pages of 7 keys: 40 keys take six continuation tokens.
    let s = AzureStore::open(&url, &ClientSettings::default())
        .expect("open")
        .with_list_page_keys(7);
    const N: usize = 40;
    for i in (0..N).rev() {
        s.put(
            &format!("vol/obj/{i:016x}.d"),
            Bytes::from(vec![1; i % 5]),
            PutMode::IfAbsent,
        )
        .await
        .expect("put");
    }
    let listed = check_object_listing(&s, N, |i| i % 5).await;
    for e in listed {
        s.delete(&e.key).await.expect("delete");
    }
    s.delete("vol/meta").await.expect("delete");
    assert!(s.list("").await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_put_if_absent_race_has_exactly_one_winner() {
    let Some(c) = container("az", "az_put_if_absent_race_has_exactly_one_winner") else {
        return;
    };
    let s = open_store(&unique_url("az", &c, "race")).expect("open");
    put_if_absent_race_has_one_winner(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_selftest_passes() {
    let Some(url) = emulator_url("az", "az_selftest_passes", "selftest") else {
        return;
    };
    let bare = AzureStore::open(&url, &ClientSettings::default()).expect("open");
    selftest_passes(&url, &bare).await;
}

/// A missing container is a permanent error naming it, not "no such object".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_missing_container_is_not_a_missing_object() {
    let Some(_) = container("az", "az_missing_container_is_not_a_missing_object") else {
        return;
    };
    let s = AzureStore::open("az://no-such-container-lsvd/x", &ClientSettings::default())
        .expect("open");
    let e = s.get("k").await.expect_err("no container");
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(e.to_string().contains("container"), "{e}");
}

/// The real binary: `lsvd create` and `lsvd serve` with the volume in Azurite, data
/// written by nbdcopy, `lsvd sync`, SIGKILL, the whole data directory deleted, a new
/// server from the store alone, and every byte read back.
#[test]
fn az_volume_served_over_nbd_survives_kill9_and_a_lost_data_dir() {
    let Some(c) = container("az", "az_volume_served_over_nbd_survives_kill9") else {
        return;
    };
    require_tools(&["nbdcopy"]);
    let dir = TempDir::new("cloud-az-e2e");
    let lsvd = Lsvd {
        data: dir.join("data"),
        store: Some(unique_url("az", &c, "e2e")),
    };
    lsvd.create("vol", "32M");
    let image = dir.join("image");
    write_random_image(&image, 0xa2, 32 << 20, 5);
    let socket = dir.join("nbd.sock");
    let args = ["vol", "--batch-size", "4M"];
    let mut server = lsvd.serve(&socket, &args);
    nbdcopy(&image.display().to_string(), &server.uri("vol"));
    lsvd.run_ok(&["sync", "vol"]);
    server.kill9();
    std::fs::remove_dir_all(dir.join("data")).expect("remove the data dir");

    let mut server = lsvd.serve(&socket, &args);
    let back = dir.join("back");
    nbdcopy(&server.uri("vol"), &back.display().to_string());
    assert_files_equal(&image, &back);
    server.stop_clean();
}

// ---------------------------------------------------------------------------------
// GCS (fake-gcs-server)
// ---------------------------------------------------------------------------------

/// Upload `data` as `name` through fake-gcs-server's JSON API (the writes
/// `object_store` makes are the XML API's, which it lacks).
fn seed_gcs(bucket: &str, name: &str, data: &[u8]) {
    let base =
        env_nonempty("LSVD_TEST_GS_BASE_URL").expect("with-fake-gcs.sh sets LSVD_TEST_GS_BASE_URL");
    let file = tempfile_with(data);
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "20", "-X", "POST"])
        .args(["-H", "Content-Type: application/octet-stream"])
        .arg("--data-binary")
        .arg(format!("@{}", file.join("body").display()))
        .arg(format!(
            "{base}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
            name.replace('/', "%2F")
        ))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "{}", common::show("curl", &out));
}

fn tempfile_with(data: &[u8]) -> TempDir {
    let d = TempDir::new("cloud-gs-seed");
    std::fs::write(d.join("body"), data).expect("write body");
    d
}

/// The store's prefix part of a `gs://BUCKET/PREFIX` URL, with a trailing `/`.
fn prefix_of(url: &str) -> String {
    let rest = url.trim_start_matches("gs://");
    let (_, p) = rest.split_once('/').expect("url has a prefix");
    format!("{p}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gs_selftest_refuses_fake_gcs_server() {
    let Some(url) = emulator_url("gs", "gs_selftest_refuses_fake_gcs_server", "selftest") else {
        return;
    };
    let s = open_described(&url, "open (no I/O)");
    let e = selftest::run(&*s)
        .await
        .expect_err("fake-gcs-server cannot take writes");
    let msg = e.to_string();
    eprintln!("self-test on fake-gcs-server: {msg}");
    assert!(msg.contains(&url), "{msg}");
    assert!(msg.contains("invalid uploadType"), "{msg}");
    // The store's own put says the same, and it is not mistaken for a taken key.
    let e = s
        .put("k", Bytes::from_static(b"x"), PutMode::IfAbsent)
        .await
        .expect_err("no XML upload");
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(
        s.list("").await.expect("list").is_empty(),
        "nothing written"
    );
}

/// The real binary refuses to serve from fake-gcs-server: `lsvd serve` runs the
/// self-test first, and exits 1 with its one-line error.
#[test]
fn gs_serve_refuses_fake_gcs_server() {
    let Some(b) = container("gs", "gs_serve_refuses_fake_gcs_server") else {
        return;
    };
    let dir = TempDir::new("cloud-gs-serve");
    let url = unique_url("gs", &b, "serve");
    let lsvd = Lsvd {
        data: dir.join("data"),
        store: Some(url.clone()),
    };
    let mut server = lsvd.spawn_serve(&dir.join("nbd.sock"), &["vol"]);
    let status = server
        .ready_or_exit(std::time::Duration::from_secs(60))
        .expect_err("must not serve");
    assert_eq!(status.code(), Some(1), "{}", server.log());
    let log = server.log();
    assert!(log.contains("Refusing to start"), "{log}");
    assert!(log.contains(&url), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gs_reads_lists_and_deletes_seeded_objects() {
    let Some(b) = container("gs", "gs_reads_lists_and_deletes_seeded_objects") else {
        return;
    };
    let url = unique_url("gs", &b, "read");
    let prefix = prefix_of(&url);
    seed_gcs(&b, &format!("{prefix}v/obj/0001.d"), &sample(10_000));
    seed_gcs(&b, &format!("{prefix}v/meta"), b"two");
    seed_gcs(&b, &format!("{prefix}w/meta"), b"");
    const N: usize = 12;
    for i in 0..N {
        seed_gcs(&b, &format!("{prefix}p/{i:04}"), &vec![3; i]);
    }
    // A key just outside the prefix must not be listed.
    let outside = format!("{}x", prefix.trim_end_matches('/'));
    seed_gcs(&b, &format!("{outside}/v/meta"), b"no");

    let s = open_store(&url).expect("open");
    assert_eq!(s.get("v/meta").await.expect("get"), b"two");
    assert_eq!(s.get("v/obj/0001.d").await.expect("get"), sample(10_000));
    check_ranges(&*s, "v/obj/0001.d", "v/missing").await;

    let paged: DynStore = std::sync::Arc::new(
        GcsStore::open(&url, &ClientSettings::default())
            .expect("open")
            .with_list_page_keys(5),
    );
    for store in [&s, &paged] {
        let listed = store.list("p/").await.expect("list");
        assert_eq!(listed.len(), N, "{}", store.describe());
        for (i, e) in listed.iter().enumerate() {
            assert_eq!(
                (e.key.as_str(), e.size_bytes),
                (&*format!("p/{i:04}"), i as u64)
            );
        }
        let all = store.list("").await.expect("list");
        assert_eq!(all.len(), N + 3);
        assert_eq!(keys(&all)[..3], ["p/0000", "p/0001", "p/0002"]);
        assert_eq!(
            keys(&store.list("v/").await.expect("list")),
            ["v/meta", "v/obj/0001.d"]
        );
    }

    s.delete("v/meta").await.expect("delete");
    s.delete("v/meta").await.expect("delete missing is ok");
    assert!(s.get("v/meta").await.expect_err("gone").is_not_found());
    for e in s.list("").await.expect("list") {
        s.delete(&e.key).await.expect("delete");
    }
    assert!(s.list("").await.expect("list").is_empty());
    let out = open_store(&format!("gs://{b}/{outside}")).expect("open");
    out.delete("v/meta").await.expect("delete");
}
