//! One object store over any cloud service `object_store` speaks: S3 ([`super::s3`]),
//! Google Cloud Storage ([`super::gcs`]) and Azure Blob Storage ([`super::azure`]).
//!
//! Why one: the semantics lsvd needs are the same on every service, and so is the code
//! that gets them out of `object_store`. Each service module only builds two clients
//! (its builder, settings, credentials and description) and hands them to
//! [`CloudStore::new`]; everything below is shared.
//!
//! # URL
//!
//! `SCHEME://BUCKET` or `SCHEME://BUCKET/PREFIX` (`s3`, `gs`; `az://CONTAINER/PREFIX`).
//! Keys are stored as `PREFIX/KEY`; the prefix lets several lsvd installations (or a
//! test run) share one bucket. Credentials in the URL, query strings and fragments are
//! refused: settings come from the environment (or `lsvd.toml` for S3).
//!
//! # Semantics
//!
//! * `put(IfAbsent)` is one conditional write (`PutMode::Create`: S3 `If-None-Match: *`,
//!   GCS `ifGenerationMatch=0`, Azure `If-None-Match: *`). The service's "taken"
//!   answer is `AlreadyExists`; see [`super::cloud_errors`] for which status that is
//!   on each. A `409 Conflict` that means "a conflicting conditional write is in
//!   progress" (S3) is retried here a few times and then reported as `Transient`, never
//!   as `AlreadyExists`: the competing write might still fail. Services that ignore
//!   the condition are caught by [`super::selftest`].
//! * `put(IfAbsent)` never uses multipart upload: `object_store` cannot attach the
//!   condition to a multipart completion, so large put-if-absent objects go in one
//!   request (lsvd objects are at most the batch size, 1 GiB). `put(Overwrite)` above
//!   the service's multipart threshold (S3 only; GCS and Azure take one request) uses
//!   multipart upload, four parts in flight.
//! * `get_range` clamps a range past the end of the object to what exists, like the
//!   other stores; a range starting at or after the end returns no bytes (after a
//!   `HEAD` confirms that the object exists).
//! * `list` uses the service's paginated listing with a raw (not segment-wise) prefix,
//!   follows every continuation token, and sorts the keys.
//! * `delete` of a missing key succeeds.
//!
//! # Timeouts and retries
//!
//! Two HTTP clients share the settings but not the total-request timeout: PUTs and
//! whole-object GETs (megabytes) get [`ClientSettings::bulk_timeout`], ranged GETs,
//! HEADs, LISTs and DELETEs get [`ClientSettings::request_timeout`]. `object_store`
//! retries 5xx, 429, 408 and connection failures [`ClientSettings::max_retries`] times
//! (idempotent requests only: a timed-out put-if-absent is not re-sent). Bounded
//! retries of whole operations, with jitter and per-attempt deadlines, are
//! [`super::retry`]'s job; [`super::open_store`] stacks it on top of these stores.
//!
//! # Credentials
//!
//! Secrets (keys, tokens, service-account keys) never appear in
//! [`ObjectStore::describe`] or in error messages: every message is scrubbed of them
//! before it leaves this module, and an endpoint's `user:password@` part is dropped
//! from descriptions.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as OsPath;
use object_store::{
    ObjectStore as OsObjectStore, ObjectStoreExt as _, PutMode as OsPutMode, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};

pub use super::cloud_errors::Service;
use super::cloud_errors::{
    chain_text, classify, is_conflict, is_range_not_satisfiable, json_message, scrub, status_in,
    truncate, xml_error,
};
use super::{BoxFuture, ListEntry, ObjectStore, PutMode, StoreResult};
use lsvd_core::error::{Error, ErrorKind, Result};

/// How long to wait for a service, and how often `object_store` retries a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// TCP/TLS connect timeout. Default 5 s.
    pub connect_timeout: Duration,
    /// Whole-request timeout for ranged GETs, HEADs, LISTs, DELETEs. Default 30 s.
    pub request_timeout: Duration,
    /// Whole-request timeout for PUTs and whole-object GETs. Default 300 s (a 32 MiB
    /// object needs about 1 MB/s to finish in time).
    pub bulk_timeout: Duration,
    /// Retries inside `object_store` (5xx, 429, connection errors). Default 3.
    pub max_retries: usize,
    /// `object_store` stops retrying a request after this long. Default 30 s.
    pub retry_timeout: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            bulk_timeout: Duration::from_secs(300),
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        }
    }
}

impl ClientSettings {
    pub(crate) fn retry_config(&self) -> RetryConfig {
        RetryConfig {
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
            ..RetryConfig::default()
        }
    }
}

impl ClientSettings {
    /// A store's two clients (see [`CloudStore::new`]): `build` given the bulk timeout,
    /// then the request timeout, as configuration strings. A client that does not
    /// build is an error naming the `store` service and its `url`, scrubbed of
    /// `secrets`.
    pub(crate) fn build_clients<C>(
        &self,
        (store, url): (&str, &str),
        secrets: &[String],
        build: impl Fn(String) -> object_store::Result<C>,
    ) -> Result<(C, C)> {
        let client = |timeout| {
            build(duration_str(timeout)).map_err(|e| {
                let message = format!("cannot configure {store} store for {url}: {e}");
                Error::bad_input(scrub(&message, secrets))
            })
        };
        Ok((client(self.bulk_timeout)?, client(self.request_timeout)?))
    }
}

/// True for an `http://` endpoint (a local emulator), which the client must be told
/// to allow.
pub(crate) fn is_plain_http(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|u| u.to_ascii_lowercase().starts_with("http://"))
}

/// A duration as `object_store`'s configuration strings want it.
pub(crate) fn duration_str(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

pub(crate) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A parsed `SCHEME://BUCKET/PREFIX` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudUrl {
    /// The bucket (S3, GCS) or container (Azure).
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
}

impl CloudUrl {
    /// Parse `url` for `service`; a malformed one is `BadInput`. `settings_hint` says
    /// where settings go instead of a query string.
    pub fn parse(url: &str, service: Service, settings_hint: &str) -> Result<Self> {
        let scheme = service.scheme();
        let word = service.container_word().to_ascii_uppercase();
        let rest = url
            .strip_prefix(scheme)
            .and_then(|r| r.strip_prefix("://"))
            .ok_or_else(|| {
                Error::bad_input(format!(
                    "not a {scheme}:// URL (expected {scheme}://{word}/PREFIX)"
                ))
            })?;
        if rest.split('/').next().is_some_and(|b| b.contains('@')) {
            // Checked first, and the URL is not echoed: it holds a secret.
            return Err(Error::bad_input(format!(
                "store URL: credentials in {scheme}:// URLs are not supported (they would \
                 end up in logs); {settings_hint}"
            )));
        }
        if rest.contains(['?', '#']) {
            return Err(Error::bad_input(format!(
                "store URL '{url}': query strings and fragments are not supported; \
                 {settings_hint}"
            )));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (1..=255).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
        if !bucket_ok {
            return Err(Error::bad_input(format!(
                "store URL '{url}': invalid {} name '{bucket}' (expected {scheme}://{word}/PREFIX)",
                service.container_word()
            )));
        }
        let prefix = prefix.trim_end_matches('/');
        let mut out = String::new();
        if !prefix.is_empty() {
            for seg in prefix.split('/') {
                if seg.is_empty() || seg == "." || seg == ".." {
                    return Err(Error::bad_input(format!(
                        "store URL '{url}': invalid prefix '{prefix}' (empty, '.' or '..' component)"
                    )));
                }
            }
            out = format!("{prefix}/");
        }
        Ok(CloudUrl {
            bucket: bucket.to_string(),
            prefix: out,
        })
    }

    /// `SCHEME://BUCKET[/PREFIX]`, for descriptions.
    pub fn location(&self, service: Service) -> String {
        let shown_prefix = self.prefix.trim_end_matches('/');
        if shown_prefix.is_empty() {
            format!("{}://{}", service.scheme(), self.bucket)
        } else {
            format!("{}://{}/{shown_prefix}", service.scheme(), self.bucket)
        }
    }
}

/// Multipart upload of large overwrites (S3).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Multipart {
    pub threshold_bytes: u64,
    pub part_bytes: usize,
}

/// An object store in a cloud bucket or container, over the `object_store` client `C`.
pub struct CloudStore<C> {
    service: Service,
    /// PUTs and whole-object GETs (long timeout).
    bulk: Arc<C>,
    /// Ranged GETs, HEADs, LISTs, DELETEs (short timeout).
    small: Arc<C>,
    url: CloudUrl,
    description: String,
    /// Strings that must never appear in a message.
    secrets: Vec<String>,
    multipart: Option<Multipart>,
    /// Keys asked for per list page; `None`: the service's default (1000 on S3 and
    /// GCS, 5000 on Azure).
    list_page_keys: Option<usize>,
    /// Sleeps between put-if-absent attempts answered "conflict in progress".
    clock: crate::clock::SharedClock,
}

/// How many times a put-if-absent answered "conflict in progress" is tried.
const CONFLICT_ATTEMPTS: u32 = 6;

impl<C: OsObjectStore + PaginatedListStore> CloudStore<C> {
    /// A store over `bulk` and `small` (the same service with the bulk and the request
    /// timeout). `description` is scrubbed of `secrets` here.
    /// [`new`](Self::new) for a service without multipart uploads (Azure, GCS).
    pub(crate) fn single_part(
        service: Service,
        clients: (C, C),
        url: CloudUrl,
        description: &str,
        secrets: Vec<String>,
    ) -> Self {
        Self::new(service, clients, url, description, secrets, None)
    }

    pub(crate) fn new(
        service: Service,
        clients: (C, C),
        url: CloudUrl,
        description: &str,
        secrets: Vec<String>,
        multipart: Option<Multipart>,
    ) -> Self {
        // Very short values would scrub innocent text; real secrets are long.
        let secrets: Vec<String> = secrets.into_iter().filter(|s| s.len() >= 4).collect();
        CloudStore {
            service,
            bulk: Arc::new(clients.0),
            small: Arc::new(clients.1),
            description: scrub(description, &secrets),
            url,
            secrets,
            multipart,
            list_page_keys: None,
            clock: crate::clock::SharedClock::default(),
        }
    }

    /// Ask for at most `keys` keys per list page (tests use small pages to follow
    /// continuation tokens without creating thousands of objects).
    pub fn with_list_page_keys(mut self, keys: usize) -> Self {
        self.list_page_keys = Some(keys.max(1));
        self
    }

    /// The bucket (or container).
    pub fn bucket(&self) -> &str {
        &self.url.bucket
    }

    /// The key prefix inside the bucket: empty, or ends with `/`.
    pub fn prefix(&self) -> &str {
        &self.url.prefix
    }

    fn path(&self, key: &str) -> StoreResult<OsPath> {
        let full = format!("{}{key}", self.url.prefix);
        OsPath::parse(&full).map_err(|e| {
            Error::new(
                ErrorKind::Permanent,
                format!("invalid object key '{key}': {e}"),
            )
        })
    }

    /// Our error for `op` on `key`. The store's description is left to the caller
    /// (the engine adds it where it matters), so messages do not say it twice. The
    /// `object_store` error is not kept as the source: its text may hold a secret, and
    /// the scrubbed message says what matters.
    fn err(&self, op: &str, key: &str, e: object_store::Error) -> Error {
        let (kind, hint) = classify(self.service, &e);
        let full = chain_text(&e);
        let name = self.service.name();
        // An error document is long (string to sign, canonical request, byte dumps);
        // its code and message say it all.
        let mut text = match (xml_error(&full), json_message(&full), status_in(&full)) {
            (Some((code, message)), _, Some(status)) => {
                format!("{name} {op} {key}: HTTP {status} {code}: {message}")
            }
            (Some((code, message)), _, None) => format!("{name} {op} {key}: {code}: {message}"),
            (None, Some(message), Some(status)) => {
                format!("{name} {op} {key}: HTTP {status}: {message}")
            }
            _ => format!("{name} {op} {key}: {e}"),
        };
        if let Some(h) = hint {
            text.push_str(" (");
            text.push_str(h);
            text.push(')');
        }
        Error::new(kind, scrub(&truncate(&text, 2000), &self.secrets))
    }

    async fn put_impl(&self, key: &str, data: Bytes, mode: PutMode) -> StoreResult<()> {
        let path = self.path(key)?;
        match (mode, self.multipart) {
            (PutMode::Overwrite, Some(m)) if data.len() as u64 > m.threshold_bytes => {
                self.put_multipart(key, &path, data, m.part_bytes).await
            }
            (PutMode::Overwrite, _) => {
                let opts = PutOptions {
                    mode: OsPutMode::Overwrite,
                    ..Default::default()
                };
                self.bulk
                    .put_opts(&path, PutPayload::from(data), opts)
                    .await
                    .map(|_| ())
                    .map_err(|e| self.err("put", key, e))
            }
            (PutMode::IfAbsent, _) => {
                let payload = PutPayload::from(data);
                // The retry module's jittered backoff, from 20 ms.
                let mut backoff = crate::retry::Backoff::with_bounds(
                    Duration::from_millis(20),
                    Duration::from_secs(1),
                    crate::retry::random_seed(),
                );
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let opts = PutOptions {
                        mode: OsPutMode::Create,
                        ..Default::default()
                    };
                    match self.bulk.put_opts(&path, payload.clone(), opts).await {
                        Ok(_) => return Ok(()),
                        Err(e) if is_conflict(self.service, &e) && attempt < CONFLICT_ATTEMPTS => {
                            self.clock.sleep(backoff.next_delay()).await;
                        }
                        Err(e) => return Err(self.err("put-if-absent", key, e)),
                    }
                }
            }
        }
    }

    async fn put_multipart(
        &self,
        key: &str,
        path: &OsPath,
        data: Bytes,
        part_bytes: usize,
    ) -> StoreResult<()> {
        let upload = self
            .bulk
            .put_multipart(path)
            .await
            .map_err(|e| self.err("start multipart upload", key, e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, part_bytes);
        // Parts are slices of `data` (`put`, not `write`): no copy.
        for start in (0..data.len()).step_by(part_bytes.max(1)) {
            let end = data.len().min(start + part_bytes);
            if let Err(e) = w.wait_for_capacity(4).await {
                // Dropping the writer aborts the in-flight parts; abort the upload too so
                // the parts do not linger (and cost) in the bucket.
                let err = self.err("multipart upload part", key, e);
                let _ = w.abort().await;
                return Err(err);
            }
            w.put(data.slice(start..end));
        }
        // `finish` aborts the upload itself if a part fails.
        w.finish()
            .await
            .map(|_| ())
            .map_err(|e| self.err("complete multipart upload", key, e))
    }

    async fn get_impl(&self, key: &str) -> StoreResult<Vec<u8>> {
        let path = self.path(key)?;
        let r = self
            .bulk
            .get(&path)
            .await
            .map_err(|e| self.err("get", key, e))?;
        let bytes = r.bytes().await.map_err(|e| self.err("get", key, e))?;
        Ok(Vec::from(bytes))
    }

    /// Size of `key`, or `NotFound`.
    pub async fn head(&self, key: &str) -> StoreResult<u64> {
        let path = self.path(key)?;
        self.small
            .head(&path)
            .await
            .map(|m| m.size)
            .map_err(|e| self.err("head", key, e))
    }

    async fn get_range_impl(&self, key: &str, range: Range<u64>) -> StoreResult<Vec<u8>> {
        let path = self.path(key)?;
        if range.start >= range.end {
            // Nothing to read; still say NotFound for a missing object.
            self.head(key).await?;
            return Ok(Vec::new());
        }
        match self.small.get_range(&path, range.clone()).await {
            Ok(b) => Ok(Vec::from(b)),
            Err(e) if is_range_not_satisfiable(&e) => {
                // The range starts at or after the end of the object.
                let size = self.head(key).await?;
                if size <= range.start {
                    Ok(Vec::new())
                } else {
                    Err(self.err("get range", key, e))
                }
            }
            Err(e) => Err(self.err(&format!("get range {range:?}"), key, e)),
        }
    }

    async fn list_impl(&self, prefix: &str) -> StoreResult<Vec<ListEntry>> {
        let full = format!("{}{prefix}", self.url.prefix);
        let mut out = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let opts = PaginatedListOptions {
                page_token: page_token.take(),
                max_keys: self.list_page_keys,
                ..Default::default()
            };
            let page = self
                .small
                .list_paginated((!full.is_empty()).then_some(full.as_str()), opts)
                .await
                .map_err(|e| self.err("list", &format!("'{prefix}'"), e))?;
            for meta in page.result.objects {
                let k: &str = meta.location.as_ref();
                if let Some(key) = k.strip_prefix(self.url.prefix.as_str())
                    && key.starts_with(prefix)
                {
                    out.push(ListEntry {
                        key: key.to_string(),
                        size_bytes: meta.size,
                    });
                }
            }
            match page.page_token {
                Some(t) if !t.is_empty() => page_token = Some(t),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.dedup_by(|a, b| a.key == b.key);
        Ok(out)
    }

    async fn delete_impl(&self, key: &str) -> StoreResult<()> {
        let path = self.path(key)?;
        match self.small.delete(&path).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", key, e)),
        }
    }
}

impl<C: OsObjectStore + PaginatedListStore> ObjectStore for CloudStore<C> {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        Box::pin(async move { self.put_impl(&key, data, mode).await })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move { self.get_impl(&key).await })
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move { self.get_range_impl(&key, range).await })
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let prefix = prefix.to_string();
        Box::pin(async move { self.list_impl(&prefix).await })
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        Box::pin(async move { self.delete_impl(&key).await })
    }
    fn describe(&self) -> String {
        self.description.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each service's URLs: the bucket and prefix read, the malformed ones refused
    /// (a failure names the URL).
    #[test]
    fn parses_azure_and_gcs_urls() {
        type Case = (
            fn(&str) -> Result<CloudUrl>,
            &'static str,
            (&'static str, &'static str),
            [&'static str; 4],
        );
        let cases: [Case; 2] = [
            (
                crate::azure::parse_url,
                "az://vols/a/b",
                ("vols", "a/b/"),
                ["az://", "az://c?x=1", "az://k@c/x", "gs://c"],
            ),
            (
                crate::gcs::parse_url,
                "gs://bkt/vols/",
                ("bkt", "vols/"),
                ["gs://", "gs://b?x=1", "gs://k@b/x", "s3://b"],
            ),
        ];
        for (parse, url, want, bad) in cases {
            let u = parse(url).expect(url);
            assert_eq!((u.bucket.as_str(), u.prefix.as_str()), want, "{url}");
            for bad in bad {
                assert!(parse(bad).is_err(), "{bad}");
            }
        }
    }

    #[test]
    fn parses_urls() {
        let s3 = |u: &str| CloudUrl::parse(u, Service::S3, "use lsvd.toml");
        let url = |b: &str, p: &str| CloudUrl {
            bucket: b.into(),
            prefix: p.into(),
        };
        assert_eq!(s3("s3://bkt").expect("bucket only"), url("bkt", ""));
        assert_eq!(s3("s3://bkt/").expect("trailing slash"), url("bkt", ""));
        assert_eq!(
            s3("s3://my-bucket.x/a/b/").expect("prefix"),
            url("my-bucket.x", "a/b/")
        );
        for bad in [
            "s3://",
            "s3:///x",
            "s3://bk t/x",
            "s3://b/a//c",
            "s3://b/../x",
            "s3://key:secret@bucket/x",
            "s3://b/x?region=eu",
            "s3://k:s@b/x?y",
            "s3:/b",
            "gs://b/x",
            "file:///x",
        ] {
            assert!(s3(bad).is_err(), "{bad} should be rejected");
        }
        let e = s3("s3://AKIA:topsecret@bucket/x").expect_err("creds in URL");
        assert!(!e.to_string().contains("topsecret"), "{e}");

        let gs = CloudUrl::parse("gs://b-1/vols/x", Service::Gcs, "").expect("gs");
        assert_eq!(gs, url("b-1", "vols/x/"));
        assert_eq!(gs.location(Service::Gcs), "gs://b-1/vols/x");
        let az = CloudUrl::parse("az://c1", Service::Azure, "").expect("az");
        assert_eq!(az.location(Service::Azure), "az://c1");
        let e = CloudUrl::parse("az://", Service::Azure, "").expect_err("no container");
        assert!(e.to_string().contains("container"), "{e}");
    }
}
