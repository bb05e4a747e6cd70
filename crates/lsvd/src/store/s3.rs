//! S3-compatible object stores (AWS S3, MinIO, Ceph RGW, versitygw, Cloudflare R2…)
//! through the `object_store` crate.
//!
//! # URL
//!
//! `s3://BUCKET` or `s3://BUCKET/PREFIX`. Keys are stored as `PREFIX/KEY`; the prefix
//! lets several lsvd installations (or a test run) share one bucket.
//!
//! # Settings
//!
//! [`S3Settings`] says where the service is and how long to wait for it. Every field is
//! optional: unset fields come from the standard AWS environment variables, read by
//! `AmazonS3Builder::from_env()`:
//!
//! | variable | meaning |
//! |---|---|
//! | `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`) | the service, e.g. `http://127.0.0.1:7070`; unset = AWS |
//! | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | credentials |
//! | `AWS_REGION` (or `AWS_DEFAULT_REGION`) | region; default `us-east-1` |
//! | `AWS_VIRTUAL_HOSTED_STYLE_REQUEST` | `true` for `https://BUCKET.host/` URLs; default path style |
//!
//! Values given in [`S3Settings`] (for example from `lsvd.toml`) override the
//! environment.
//!
//! Credentials come from the `[s3]` keys or the `AWS_*` key variables; the cloud's
//! credential chain (web identity, container credentials, EC2 instance metadata) is
//! used only when [`S3Settings::credentials`] (`[s3] credentials = "instance"`, or
//! `LSVD_S3_CREDENTIALS=instance`) asks for it. Missing keys are a one-line error
//! from [`S3Store::open`], before any request: see [`super::s3_credentials`].
//!
//! | `[s3]` key | meaning |
//! |---|---|
//! | `endpoint`, `region`, `virtual_hosted_style`, `allow_http` | as the variables above |
//! | `access_key_id`, `secret_access_key`, `session_token` | static keys (both or neither) |
//! | `credentials` | `"environment"` (default), `"static"` or `"instance"` |
//! | `connect_timeout_secs`, `request_timeout_secs`, `bulk_timeout_secs` | timeouts |
//! | `max_retries`, `retry_timeout_secs` | retries inside the S3 client |
//! | `multipart_threshold`, `multipart_part_size` | multipart upload of overwrites |
//!
//! An `http://` endpoint is allowed automatically (loopback test servers); `https://`
//! is used otherwise. Path-style requests (`http://host/BUCKET/KEY`) are the default
//! because MinIO, versitygw and Ceph RGW expect them and AWS still accepts them.
//!
//! # Semantics
//!
//! * `put(IfAbsent)` is a single `PUT` with `If-None-Match: *`. A `412 Precondition
//!   Failed` (or `304`) answer is `AlreadyExists`. A `409 Conflict` (S3's "a
//!   conflicting conditional operation is in progress") is retried here a few times
//!   and then reported as `Transient`, never as `AlreadyExists`: the competing write
//!   might still fail. Stores that ignore `If-None-Match` are caught by
//!   [`super::selftest`].
//! * `put(IfAbsent)` never uses multipart upload: `object_store` cannot attach
//!   `If-None-Match` to a multipart completion, so large put-if-absent objects go in
//!   one `PUT` (S3 allows up to 5 GiB; lsvd objects are at most the batch size, 1 GiB).
//!   `put(Overwrite)` of objects above [`S3Settings::multipart_threshold_bytes`] uses
//!   multipart upload with [`S3Settings::multipart_part_bytes`] parts, four in flight.
//! * `get_range` clamps a range past the end of the object to what exists, like the
//!   other stores; a range starting at or after the end returns no bytes (after a
//!   `HEAD` confirms that the object exists).
//! * `list` uses `ListObjectsV2` with a raw (not segment-wise) prefix, follows every
//!   continuation token, and sorts the keys.
//! * `delete` of a missing key succeeds.
//!
//! # Timeouts and retries
//!
//! Two HTTP clients share the settings but not the total-request timeout: PUTs and
//! whole-object GETs (megabytes) get [`S3Settings::bulk_timeout`], ranged GETs, HEADs,
//! LISTs and DELETEs get [`S3Settings::request_timeout`]. `object_store` retries 5xx,
//! 429, 408 and connection failures [`S3Settings::max_retries`] times (idempotent
//! requests only: a timed-out put-if-absent is not re-sent). Bounded retries of whole
//! operations, with jitter and per-attempt deadlines, are [`super::retry`]'s job;
//! [`super::open_store`] stacks it on top of this store.
//!
//! # Credentials
//!
//! The access key id, secret and session token never appear in [`S3Store::describe`]
//! or in error messages: every message is scrubbed of them before it leaves this
//! module, and an endpoint's `user:password@` part is dropped from descriptions.
//!
//! # GCS and Azure (not built)
//!
//! `object_store` also speaks Google Cloud Storage (`gs://BUCKET/PREFIX`, feature
//! `gcp`, credentials from `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`)
//! and Azure Blob Storage (`az://CONTAINER/PREFIX` or
//! `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX`, feature `azure`,
//! credentials from `AZURE_STORAGE_ACCOUNT_NAME` / `AZURE_STORAGE_ACCOUNT_KEY`). Both
//! implement put-if-absent (`PutMode::Create`: GCS `ifGenerationMatch=0`, Azure
//! `If-None-Match: *`) and the paginated raw-prefix list this module uses, so a
//! `GcsStore`/`AzureStore` would be this file with a different builder. They are not
//! enabled, to keep the build lean; `open_store` rejects those schemes with a message.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as OsPath;
use object_store::{
    ClientConfigKey, ObjectStore as _, ObjectStoreExt as _, PutMode as OsPutMode, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};

use super::retry::{RetryPolicy, RetryStore};
pub use super::s3_credentials::Secret;
use super::s3_credentials::{ConfiguredKeys, CredentialSource, Credentials, is_key_variable};
use super::{BoxFuture, DynStore, ListEntry, ObjectStore, PutMode, StoreResult};
use crate::error::{Error, ErrorKind, Result};

/// How to reach an S3-compatible service. `None` fields come from the environment.
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// Service URL, e.g. `http://127.0.0.1:7070`. `None`: `AWS_ENDPOINT_URL`, else AWS.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// `None`: `AWS_ACCESS_KEY_ID`. The id is treated as a secret too (scrubbed).
    pub access_key_id: Option<Secret>,
    /// `None`: `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: Option<Secret>,
    /// `None`: `AWS_SESSION_TOKEN` (temporary credentials only).
    pub session_token: Option<Secret>,
    /// Where the credentials come from. `None`: `LSVD_S3_CREDENTIALS`, else
    /// [`CredentialSource::Environment`] (never the cloud's chain unless asked).
    pub credentials: Option<CredentialSource>,
    /// `Some(true)`: `https://BUCKET.host/KEY`. `None`: the environment, else path style.
    pub virtual_hosted_style: Option<bool>,
    /// Allow plain-HTTP endpoints. `None`: allowed when the endpoint is `http://`.
    pub allow_http: Option<bool>,
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
    /// `put(Overwrite)` above this many bytes uses multipart upload. Default 64 MiB.
    pub multipart_threshold_bytes: u64,
    /// Part size for multipart upload (S3: at least 5 MiB). Default 16 MiB.
    pub multipart_part_bytes: u64,
}

impl Default for S3Settings {
    fn default() -> Self {
        S3Settings {
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            credentials: None,
            virtual_hosted_style: None,
            allow_http: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            bulk_timeout: Duration::from_secs(300),
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
            multipart_threshold_bytes: 64 << 20,
            multipart_part_bytes: 16 << 20,
        }
    }
}

/// A parsed `s3://BUCKET/PREFIX` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
}

impl S3Url {
    /// Parse `url`; a malformed one is `BadInput`.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| Error::bad_input("not an s3:// URL (expected s3://BUCKET/PREFIX)"))?;
        if rest.split('/').next().is_some_and(|b| b.contains('@')) {
            // Checked first, and the URL is not echoed: it holds a secret.
            return Err(Error::bad_input(
                "store URL: credentials in s3:// URLs are not supported (they would \
                        end up in logs); use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or lsvd.toml",
            ));
        }
        if rest.contains(['?', '#']) {
            return Err(Error::bad_input(format!(
                "store URL '{url}': query strings and fragments are not supported; \
                 put S3 settings in lsvd.toml or AWS_* environment variables"
            )));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (1..=255).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
        if !bucket_ok {
            return Err(Error::bad_input(format!(
                "store URL '{url}': invalid bucket name '{bucket}' (expected s3://BUCKET/PREFIX)"
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
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: out,
        })
    }
}

/// Open `s3://BUCKET/PREFIX` with `settings`, wrapped in [`RetryStore`] with `policy`:
/// what [`super::open_store`] does with default settings.
pub fn open_with_retry(url: &str, settings: &S3Settings, policy: &RetryPolicy) -> Result<DynStore> {
    let inner: DynStore = Arc::new(S3Store::open(url, settings)?);
    Ok(Arc::new(RetryStore::new(inner, policy.clone())))
}

/// An object store in an S3 bucket.
pub struct S3Store {
    /// PUTs and whole-object GETs (long timeout).
    bulk: Arc<AmazonS3>,
    /// Ranged GETs, HEADs, LISTs, DELETEs (short timeout).
    small: Arc<AmazonS3>,
    url: S3Url,
    description: String,
    /// Strings that must never appear in a message.
    secrets: Vec<String>,
    multipart_threshold_bytes: u64,
    multipart_part_bytes: usize,
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `scheme://user:pass@host:port/path` → `scheme://host:port/path`.
fn strip_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

fn duration_str(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// How many times a put-if-absent answered `409 Conflict` is tried before giving up.
const CONFLICT_ATTEMPTS: u32 = 6;

impl S3Store {
    /// Open `s3://BUCKET/PREFIX` with `settings` over the environment. Does no I/O:
    /// run [`super::selftest::run`] to check the service is reachable and correct.
    /// Settings that cannot work are `BadInput`.
    pub fn open(url: &str, settings: &S3Settings) -> Result<Self> {
        let parsed = S3Url::parse(url)?;
        if settings.multipart_part_bytes < 5 << 20 {
            return Err(Error::bad_input(
                "S3 multipart part size must be at least 5 MiB",
            ));
        }
        // Decided before anything else, so missing keys are the first (and only)
        // complaint, and no request is made to find some.
        let keys = ConfiguredKeys {
            access_key_id: settings.access_key_id.clone(),
            secret_access_key: settings.secret_access_key.clone(),
            session_token: settings.session_token.clone(),
            credentials: settings.credentials,
        };
        let credentials = super::s3_credentials::resolve(&keys, &env_nonempty)?;
        // `AmazonS3Builder::from_env`, minus the key variables: the keys are set
        // below from `credentials`, or left out so the chain runs.
        let mut b = AmazonS3Builder::new();
        for (key, value) in std::env::vars_os() {
            if let (Some(key), Some(value)) = (key.to_str(), value.to_str())
                && key.starts_with("AWS_")
                && !is_key_variable(key)
                && let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
            {
                b = b.with_config(config_key, value);
            }
        }
        b = b.with_bucket_name(&parsed.bucket);
        if let Some(ep) = &settings.endpoint {
            b = b.with_endpoint(ep);
        }
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
        if let Some(r) = &settings.region {
            b = b.with_region(r);
        }
        let region = b
            .get_config_value(&AmazonS3ConfigKey::Region)
            .or_else(|| env_nonempty("AWS_REGION"))
            .or_else(|| env_nonempty("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
        b = b.with_region(&region);
        if let Credentials::Keys {
            access_key_id,
            secret_access_key,
            session_token,
        } = &credentials
        {
            b = b
                .with_access_key_id(access_key_id.expose())
                .with_secret_access_key(secret_access_key.expose());
            if let Some(t) = session_token {
                b = b.with_token(t.expose());
            }
        }
        match settings.virtual_hosted_style {
            Some(v) => b = b.with_virtual_hosted_style_request(v),
            None if env_nonempty("AWS_VIRTUAL_HOSTED_STYLE_REQUEST").is_none() => {
                b = b.with_virtual_hosted_style_request(false)
            }
            None => {}
        }
        let is_http = endpoint
            .as_deref()
            .is_some_and(|e| e.to_ascii_lowercase().starts_with("http://"));
        match settings.allow_http {
            Some(v) => b = b.with_allow_http(v),
            None if is_http => b = b.with_allow_http(true),
            None => {}
        }
        b = b
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                duration_str(settings.connect_timeout),
            )
            .with_retry(RetryConfig {
                max_retries: settings.max_retries,
                retry_timeout: settings.retry_timeout,
                ..RetryConfig::default()
            });

        let mut secrets: Vec<String> = Vec::new();
        for key in [
            AmazonS3ConfigKey::AccessKeyId,
            AmazonS3ConfigKey::SecretAccessKey,
            AmazonS3ConfigKey::Token,
        ] {
            if let Some(v) = b.get_config_value(&key) {
                // Very short values would scrub innocent text; real keys are long.
                if v.len() >= 4 {
                    secrets.push(v);
                }
            }
        }
        let describe_secrets = secrets.clone();
        // The builder's error may quote a secret: the scrubbed text only, no source.
        let build = |timeout: Duration| -> Result<Arc<AmazonS3>> {
            b.clone()
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    duration_str(timeout),
                )
                .build()
                .map(Arc::new)
                .map_err(|e| {
                    Error::bad_input(scrub(
                        &format!("cannot configure S3 store for {url}: {e}"),
                        &describe_secrets,
                    ))
                })
        };
        let bulk = build(settings.bulk_timeout)?;
        let small = build(settings.request_timeout)?;

        let shown_prefix = parsed.prefix.trim_end_matches('/');
        let location = if shown_prefix.is_empty() {
            format!("s3://{}", parsed.bucket)
        } else {
            format!("s3://{}/{shown_prefix}", parsed.bucket)
        };
        let description = match &endpoint {
            Some(ep) => format!("{location} (endpoint {})", strip_userinfo(ep)),
            None => format!("{location} (AWS region {region})"),
        };
        Ok(S3Store {
            bulk,
            small,
            description: scrub(&description, &secrets),
            url: parsed,
            secrets,
            multipart_threshold_bytes: settings.multipart_threshold_bytes,
            multipart_part_bytes: usize::try_from(settings.multipart_part_bytes)
                .unwrap_or(usize::MAX),
        })
    }

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
        let (kind, hint) = classify(&e);
        let full = chain_text(&e);
        // An S3 error document is long (string to sign, canonical request, byte dumps);
        // its code and message say it all.
        let mut text = match (s3_error(&full), status_in(&full)) {
            (Some((code, message)), Some(status)) => {
                format!("S3 {op} {key}: HTTP {status} {code}: {message}")
            }
            (Some((code, message)), None) => format!("S3 {op} {key}: {code}: {message}"),
            _ => format!("S3 {op} {key}: {e}"),
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
        match mode {
            PutMode::Overwrite if data.len() as u64 > self.multipart_threshold_bytes => {
                self.put_multipart(key, &path, data).await
            }
            PutMode::Overwrite => {
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
            PutMode::IfAbsent => {
                let payload = PutPayload::from(data);
                let mut backoff = Duration::from_millis(20);
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let opts = PutOptions {
                        mode: OsPutMode::Create,
                        ..Default::default()
                    };
                    match self.bulk.put_opts(&path, payload.clone(), opts).await {
                        Ok(_) => return Ok(()),
                        Err(e) if is_conflict(&e) && attempt < CONFLICT_ATTEMPTS => {
                            tokio::time::sleep(backoff).await;
                            backoff *= 2;
                        }
                        Err(e) => return Err(self.err("put-if-absent", key, e)),
                    }
                }
            }
        }
    }

    async fn put_multipart(&self, key: &str, path: &OsPath, data: Bytes) -> StoreResult<()> {
        let upload = self
            .bulk
            .put_multipart(path)
            .await
            .map_err(|e| self.err("start multipart upload", key, e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, self.multipart_part_bytes);
        // Parts are slices of `data` (`put`, not `write`): no copy.
        for start in (0..data.len()).step_by(self.multipart_part_bytes) {
            let end = data.len().min(start + self.multipart_part_bytes);
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

impl ObjectStore for S3Store {
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

/// Replace every secret in `text` with `[redacted]`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "[redacted]");
        }
    }
    out
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// The whole chain of error messages, outermost first.
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(" | ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

fn find_http_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a HttpError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            return Some(h);
        }
        cur = c.source();
    }
    None
}

/// The HTTP status in an `object_store` error's text ("… status code: 503 …"). The
/// crate does not export its retry error type, so the text is all there is.
fn status_in(text: &str) -> Option<u16> {
    let i = text.find("status code: ")? + "status code: ".len();
    text.get(i..i + 3)?.parse().ok()
}

/// `(Code, Message)` of an S3 XML error document in `text`.
fn s3_error(text: &str) -> Option<(&str, &str)> {
    let between = |open: &str, close: &str| -> Option<&str> {
        let i = text.find(open)? + open.len();
        let j = text[i..].find(close)? + i;
        Some(text[i..j].trim())
    };
    let code = between("<Code>", "</Code>")?;
    Some((code, between("<Message>", "</Message>").unwrap_or("")))
}

fn is_conflict(e: &object_store::Error) -> bool {
    status_in(&chain_text(e)) == Some(409)
}

fn is_range_not_satisfiable(e: &object_store::Error) -> bool {
    let text = chain_text(e);
    status_in(&text) == Some(416) || text.contains("InvalidRange")
}

/// Map an `object_store` error to our kinds, with a hint for the operator.
pub(crate) fn classify(e: &object_store::Error) -> (ErrorKind, Option<&'static str>) {
    use object_store::Error as E;
    let text = chain_text(e);
    let status = status_in(&text);
    match e {
        // A 404 is only "no such object" when the server says so (or says nothing, as
        // for HEAD). A missing bucket, or an unknown access key (versitygw answers
        // XAdminUserNotFound with 404), must not read as "no volume here".
        E::NotFound { .. } => match s3_error(&text).map(|(code, _)| code) {
            None | Some("NoSuchKey") => (ErrorKind::NotFound, None),
            Some("NoSuchBucket") => (ErrorKind::Permanent, Some("the bucket does not exist")),
            Some(_) => (
                ErrorKind::Permanent,
                Some("not a missing object: check the access key, secret and endpoint"),
            ),
        },
        // 409: a concurrent conditional write is still in progress; it may fail, so
        // this is not (yet) proof the key exists.
        E::AlreadyExists { .. } if status == Some(409) => (
            ErrorKind::Transient,
            Some("a conflicting conditional write is in progress"),
        ),
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            (ErrorKind::AlreadyExists, None)
        }
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (
            ErrorKind::Permanent,
            Some("check the access key, secret and bucket permissions"),
        ),
        E::NotImplemented { .. } | E::NotSupported { .. } => (
            ErrorKind::Permanent,
            Some("this store lacks an operation lsvd needs"),
        ),
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => (ErrorKind::Permanent, None),
        _ => {
            if let Some(s) = status {
                return match s {
                    408 | 429 | 500..=599 => (ErrorKind::Transient, None),
                    400 if text.contains("RequestTimeout") => (ErrorKind::Transient, None),
                    403 | 401 => (
                        ErrorKind::Permanent,
                        Some("check the access key, secret and bucket permissions"),
                    ),
                    404 if text.contains("NoSuchBucket") => {
                        (ErrorKind::Permanent, Some("the bucket does not exist"))
                    }
                    _ => (ErrorKind::Permanent, None),
                };
            }
            if text.contains("without LOCATION") {
                return (
                    ErrorKind::Permanent,
                    Some("a redirect without location usually means the wrong region"),
                );
            }
            if let Some(h) = find_http_error(e) {
                return match h.kind() {
                    HttpErrorKind::Connect => (
                        ErrorKind::Transient,
                        Some("cannot connect: is the endpoint right and the service up?"),
                    ),
                    HttpErrorKind::Timeout => (ErrorKind::Transient, Some("timed out")),
                    _ => (ErrorKind::Transient, None),
                };
            }
            // A 200 answer with an error body, a broken XML listing, a task failure:
            // nothing says retrying is pointless.
            (ErrorKind::Transient, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Msg(&'static str);
    impl std::fmt::Display for Msg {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Msg {}

    fn src(m: &'static str) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(Msg(m))
    }

    #[test]
    fn parses_urls() {
        assert_eq!(
            S3Url::parse("s3://bkt").expect("bucket only"),
            S3Url {
                bucket: "bkt".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            S3Url::parse("s3://bkt/").expect("trailing slash"),
            S3Url {
                bucket: "bkt".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            S3Url::parse("s3://my-bucket.x/a/b/").expect("prefix"),
            S3Url {
                bucket: "my-bucket.x".into(),
                prefix: "a/b/".into()
            }
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
            "file:///x",
        ] {
            assert!(S3Url::parse(bad).is_err(), "{bad} should be rejected");
        }
        let e = S3Url::parse("s3://AKIA:topsecret@bucket/x").expect_err("creds in URL");
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }

    #[test]
    fn strips_userinfo_from_endpoints() {
        assert_eq!(
            strip_userinfo("http://u:p@127.0.0.1:9000/x"),
            "http://127.0.0.1:9000/x"
        );
        assert_eq!(
            strip_userinfo("https://s3.example.com"),
            "https://s3.example.com"
        );
        assert_eq!(strip_userinfo("weird"), "weird");
    }

    #[test]
    fn maps_errors() {
        use object_store::Error as E;
        let p = || "k".to_string();
        let k = |e: E| classify(&e).0;
        assert_eq!(
            k(E::NotFound {
                path: p(),
                source: src("x")
            }),
            ErrorKind::NotFound
        );
        assert_eq!(
            k(E::Precondition {
                path: p(),
                source: src("Server returned non-2xx status code: 412 Precondition Failed: ")
            }),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            k(E::AlreadyExists {
                path: p(),
                source: src("x")
            }),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            k(E::AlreadyExists {
                path: p(),
                source: src("Server returned non-2xx status code: 409 Conflict: busy")
            }),
            ErrorKind::Transient
        );
        assert_eq!(
            k(E::PermissionDenied {
                path: p(),
                source: src("x")
            }),
            ErrorKind::Permanent
        );
        assert_eq!(
            k(E::Unauthenticated {
                path: p(),
                source: src("x")
            }),
            ErrorKind::Permanent
        );
        let generic = |m: &'static str| E::Generic {
            store: "S3",
            source: src(m),
        };
        for (m, want) in [
            (
                "Server returned non-2xx status code: 503 Service Unavailable: slow down",
                ErrorKind::Transient,
            ),
            (
                "Server returned non-2xx status code: 500 Internal Server Error: ",
                ErrorKind::Transient,
            ),
            (
                "Server returned non-2xx status code: 429 Too Many Requests: ",
                ErrorKind::Transient,
            ),
            (
                "Server returned non-2xx status code: 400 Bad Request: InvalidArgument",
                ErrorKind::Permanent,
            ),
            (
                "Server returned non-2xx status code: 400 Bad Request: <Code>RequestTimeout</Code>",
                ErrorKind::Transient,
            ),
            (
                "Server returned error response: <Error><Code>InternalError</Code></Error>",
                ErrorKind::Transient,
            ),
            (
                "Received redirect without LOCATION, this normally indicates an incorrectly configured region",
                ErrorKind::Permanent,
            ),
        ] {
            assert_eq!(k(generic(m)), want, "{m}");
        }
        let conn = E::Generic {
            store: "S3",
            source: Box::new(HttpError::new(HttpErrorKind::Connect, Msg("refused"))),
        };
        assert_eq!(classify(&conn).0, ErrorKind::Transient);
        let timeout = E::Generic {
            store: "S3",
            source: Box::new(HttpError::new(HttpErrorKind::Timeout, Msg("slow"))),
        };
        assert_eq!(classify(&timeout).0, ErrorKind::Transient);
        assert!(is_range_not_satisfiable(&generic(
            "Server returned non-2xx status code: 416 Range Not Satisfiable: "
        )));
        assert!(is_conflict(&generic(
            "Server returned non-2xx status code: 409 Conflict: "
        )));
        assert_eq!(status_in("status code: 5"), None);
        let nf = |body: &'static str| E::NotFound {
            path: p(),
            source: src(body),
        };
        assert_eq!(
            k(nf(
                "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>"
            )),
            ErrorKind::NotFound
        );
        assert_eq!(
            k(nf("Server returned non-2xx status code: 404 Not Found: ")),
            ErrorKind::NotFound
        );
        assert_eq!(
            k(nf(
                "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>"
            )),
            ErrorKind::Permanent
        );
        assert_eq!(
            k(nf(
                "status code: 404 Not Found: <Error><Code>XAdminUserNotFound</Code><Message>No user</Message></Error>"
            )),
            ErrorKind::Permanent
        );
        assert_eq!(
            s3_error(
                "x <Error><Code>SignatureDoesNotMatch</Code><Message> bad sig </Message><StringToSign>..."
            ),
            Some(("SignatureDoesNotMatch", "bad sig"))
        );
        assert_eq!(s3_error("plain text"), None);
    }

    #[test]
    fn scrubs_secrets() {
        let s = scrub(
            "auth AKIAEXAMPLE sig with s3cr3tvalue and s3cr3tvalue",
            &["AKIAEXAMPLE".into(), "s3cr3tvalue".into()],
        );
        assert_eq!(s, "auth [redacted] sig with [redacted] and [redacted]");
        assert!(format!("{:?}", Secret::new("hunter2")).contains("***"));
        assert!(!format!("{:?}", Secret::new("hunter2")).contains("hunter2"));
        assert!(truncate(&"é".repeat(10), 5).starts_with("éé"));
    }

    #[test]
    fn open_does_no_io_and_hides_credentials() {
        let settings = S3Settings {
            endpoint: Some("http://user:pw@127.0.0.1:1".into()),
            region: Some("eu-west-1".into()),
            access_key_id: Some(Secret::new("AKIAOPENTESTKEY")),
            secret_access_key: Some(Secret::new("open-test-secret-value")),
            ..S3Settings::default()
        };
        let s = S3Store::open("s3://bkt/some/prefix/", &settings).expect("open");
        assert_eq!(s.bucket(), "bkt");
        assert_eq!(s.prefix(), "some/prefix/");
        let d = s.describe();
        assert_eq!(d, "s3://bkt/some/prefix (endpoint http://127.0.0.1:1)");
        assert!(!d.contains("AKIAOPENTESTKEY") && !d.contains("open-test-secret-value"));
        let half = S3Settings {
            access_key_id: Some(Secret::new("AKIAONLY")),
            ..S3Settings::default()
        };
        assert!(S3Store::open("s3://bkt", &half).is_err());
        let small_parts = S3Settings {
            multipart_part_bytes: 1 << 20,
            ..settings
        };
        assert!(S3Store::open("s3://bkt", &small_parts).is_err());
    }
}
