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
//! | `AWS_UNSIGNED_PAYLOAD` | `true`: sign without hashing bodies; default `true` over HTTPS only |
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
//! | `unsigned_payload` | as `AWS_UNSIGNED_PAYLOAD`; default yes over HTTPS, no over HTTP |
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
//! # Semantics, timeouts, secrets
//!
//! Shared with GCS and Azure: see [`super::cloud`]. Specific to S3: `put(IfAbsent)` is
//! a `PUT` with `If-None-Match: *` (`412` means taken; `409` means "a conflicting
//! conditional write is in progress", retried and then `Transient`), and
//! `put(Overwrite)` of objects above [`S3Settings::multipart_threshold_bytes`] uses
//! multipart upload with [`S3Settings::multipart_part_bytes`] parts. The access key
//! id, secret and session token never appear in descriptions or error messages.
//!
//! # GCS and Azure
//!
//! Google Cloud Storage (`gs://BUCKET/PREFIX`, [`super::gcs`]) and Azure Blob Storage
//! (`az://CONTAINER/PREFIX`, [`super::azure`]) are the same store
//! ([`super::cloud::CloudStore`]) with a different `object_store` builder; their
//! settings come from their standard environment variables only (no `lsvd.toml`
//! section yet).

use std::sync::Arc;
use std::time::Duration;

use object_store::ClientConfigKey;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};

use super::DynStore;
use super::cloud::{
    ClientSettings, CloudStore, CloudUrl, Multipart, Service, duration_str, env_nonempty,
    is_plain_http,
};
use super::cloud_errors::{scrub, strip_userinfo};
use super::retry::{RetryPolicy, RetryStore};
pub use super::s3_credentials::Secret;
use super::s3_credentials::{ConfiguredKeys, CredentialSource, Credentials, is_key_variable};
use lsvd_core::error::{Error, Result};

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
    /// Sign requests without hashing their bodies (`UNSIGNED-PAYLOAD`). `None`:
    /// `AWS_UNSIGNED_PAYLOAD`, else yes over HTTPS and no over plain HTTP; see
    /// [`unsigned_payload`].
    pub unsigned_payload: Option<bool>,
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
            unsigned_payload: None,
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

/// Parse `s3://BUCKET/PREFIX`; a malformed URL is `BadInput`.
pub fn parse_url(url: &str) -> Result<CloudUrl> {
    CloudUrl::parse(
        url,
        Service::S3,
        "use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, other AWS_* variables or lsvd.toml",
    )
}

impl S3Settings {
    fn client(&self) -> ClientSettings {
        ClientSettings {
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            bulk_timeout: self.bulk_timeout,
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }
}

/// Whether requests carry `UNSIGNED-PAYLOAD` instead of the SHA-256 of their body, from
/// the setting, else the value `AWS_UNSIGNED_PAYLOAD` gave (`from_env`, left as it is:
/// `None` here), else the scheme. Over HTTPS, TLS already protects the body in transit,
/// and hashing it costs a pass over every byte uploaded (about 6% of all CPU time while
/// uploading to a loopback versitygw); the AWS SDKs skip it there too. Over plain HTTP
/// the signed hash is the body's only protection in transit, so it stays.
fn unsigned_payload(setting: Option<bool>, from_env: Option<&str>, is_http: bool) -> Option<bool> {
    match (setting, from_env) {
        (Some(v), _) => Some(v),
        (None, Some(_)) => None,
        (None, None) => Some(!is_http),
    }
}

/// Open `s3://BUCKET/PREFIX` with `settings`, wrapped in [`RetryStore`] with `policy`:
/// what [`super::open_store`] does with default settings.
pub fn open_with_retry(url: &str, settings: &S3Settings, policy: &RetryPolicy) -> Result<DynStore> {
    let inner: DynStore = Arc::new(S3Store::open(url, settings)?);
    Ok(Arc::new(RetryStore::new(inner, policy.clone())))
}

/// An object store in an S3 bucket.
pub type S3Store = CloudStore<AmazonS3>;

impl S3Store {
    /// Open `s3://BUCKET/PREFIX` with `settings` over the environment. Does no I/O:
    /// run [`super::selftest::run`] to check the service is reachable and correct.
    /// Settings that cannot work are `BadInput`.
    pub fn open(url: &str, settings: &S3Settings) -> Result<Self> {
        let parsed = parse_url(url)?;
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
        let is_http = is_plain_http(endpoint.as_deref());
        match settings.allow_http {
            Some(v) => b = b.with_allow_http(v),
            None if is_http => b = b.with_allow_http(true),
            None => {}
        }
        // The builder took AWS_UNSIGNED_PAYLOAD above, if set (its own value for the
        // key is never unset: it reads back as "false" by default).
        let from_env = env_nonempty("AWS_UNSIGNED_PAYLOAD");
        if let Some(v) = unsigned_payload(settings.unsigned_payload, from_env.as_deref(), is_http) {
            b = b.with_unsigned_payload(v);
        }
        b = b
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                duration_str(settings.connect_timeout),
            )
            .with_retry(settings.client().retry_config());

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
        let build = |timeout: Duration| -> Result<AmazonS3> {
            b.clone()
                .with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    duration_str(timeout),
                )
                .build()
                .map_err(|e| {
                    Error::bad_input(scrub(
                        &format!("cannot configure S3 store for {url}: {e}"),
                        &describe_secrets,
                    ))
                })
        };
        let bulk = build(settings.bulk_timeout)?;
        let small = build(settings.request_timeout)?;

        let location = parsed.location(Service::S3);
        let description = match &endpoint {
            Some(ep) => format!("{location} (endpoint {})", strip_userinfo(ep)),
            None => format!("{location} (AWS region {region})"),
        };
        Ok(CloudStore::new(
            Service::S3,
            (bulk, small),
            parsed,
            &description,
            secrets,
            Some(Multipart {
                threshold_bytes: settings.multipart_threshold_bytes,
                part_bytes: usize::try_from(settings.multipart_part_bytes).unwrap_or(usize::MAX),
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectStore as _;

    #[test]
    fn parses_s3_urls() {
        let u = parse_url("s3://my-bucket.x/a/b/").expect("prefix");
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("my-bucket.x", "a/b/")
        );
        assert!(parse_url("gs://b").is_err());
        let e = parse_url("s3://AKIA:topsecret@bucket/x").expect_err("creds in URL");
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }

    #[test]
    fn bodies_are_hashed_over_http_only_unless_told() {
        // The default follows the scheme.
        assert_eq!(unsigned_payload(None, None, false), Some(true));
        assert_eq!(unsigned_payload(None, None, true), Some(false));
        // AWS_UNSIGNED_PAYLOAD stands as the builder read it.
        assert_eq!(unsigned_payload(None, Some("false"), false), None);
        assert_eq!(unsigned_payload(None, Some("true"), true), None);
        // The setting (lsvd.toml) wins over both.
        assert_eq!(
            unsigned_payload(Some(true), Some("false"), true),
            Some(true)
        );
        assert_eq!(unsigned_payload(Some(false), None, false), Some(false));
    }

    /// The `x-amz-content-sha256` header of one PUT of `body` through a store opened
    /// with `unsigned` against a listener that answers every request 200.
    async fn content_sha256_of_a_put(unsigned: Option<bool>, body: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                conn.read_exact(&mut byte).await.expect("request head");
                head.push(byte[0]);
            }
            let head = String::from_utf8(head)
                .expect("ascii head")
                .to_ascii_lowercase();
            let value = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
            };
            let len: usize = value("content-length:").map_or(0, |v| v.parse().expect("length"));
            let mut rest = vec![0u8; len];
            conn.read_exact(&mut rest).await.expect("request body");
            conn.write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n")
                .await
                .expect("answer");
            value("x-amz-content-sha256:").expect("a signed request names its payload hash")
        });
        let settings = S3Settings {
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            access_key_id: Some(Secret::new("AKIAPAYLOADTEST")),
            secret_access_key: Some(Secret::new("payload-test-secret")),
            unsigned_payload: unsigned,
            max_retries: 0,
            ..S3Settings::default()
        };
        let store = S3Store::open("s3://bkt/p", &settings).expect("open");
        store
            .put(
                "k",
                bytes::Bytes::from_static(body),
                crate::PutMode::Overwrite,
            )
            .await
            .expect("put");
        server.await.expect("listener task")
    }

    #[tokio::test]
    async fn the_setting_reaches_the_requests() {
        // Plain HTTP, nothing set: the body's SHA-256 is signed.
        assert_eq!(
            content_sha256_of_a_put(None, b"abc").await,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            content_sha256_of_a_put(Some(true), b"abc").await,
            "unsigned-payload"
        );
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        assert!(format!("{:?}", Secret::new("hunter2")).contains("***"));
        assert!(!format!("{:?}", Secret::new("hunter2")).contains("hunter2"));
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
