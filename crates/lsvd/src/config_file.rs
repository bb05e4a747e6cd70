//! `lsvd.toml`: where the store and the data directory are, and how to reach S3.
//!
//! Loaded only when asked for, with `--config PATH` (or `LSVD_CONFIG=PATH`). Every key
//! is optional; unknown keys are an error (a typo must not silently fall back to a
//! default). Precedence, highest first:
//!
//! 1. command-line flags (`--store`, `--data`) and their variables (`LSVD_STORE`,
//!    `LSVD_DATA`);
//! 2. this file;
//! 3. for S3 settings, the `AWS_*` environment variables (a key set in `[s3]` wins over
//!    its variable; leave it out to use the environment);
//! 4. built-in defaults.
//!
//! Relative paths (`data`, and `store` when it is a path or `file://` URL) are taken
//! relative to the directory holding the file.
//!
//! # Keys
//!
//! ```toml
//! # Where volumes live: s3://BUCKET/PREFIX, file:///path, or a path.
//! # Default: file://<data>/store
//! store = "s3://lsvd-volumes/prod"
//! # Local state: write logs and the lock. Disposable. Default: ./lsvd-data
//! data = "/var/lib/lsvd"
//!
//! [s3]
//! # Service URL. Default: AWS_ENDPOINT_URL, else AWS S3 itself.
//! endpoint = "http://127.0.0.1:7070"
//! # Default: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1.
//! region = "us-east-1"
//! # Credentials. Prefer AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and
//! # AWS_SESSION_TOKEN) in the environment; if you put them here, make the file
//! # readable only by its owner (lsvd warns otherwise). Give both or neither.
//! access_key_id = "..."
//! secret_access_key = "..."
//! session_token = "..."
//! # Where credentials come from. Default "environment" (the keys above, else the
//! # AWS_* key variables; missing keys are an error at startup). "static": the keys
//! # above only. "instance": the cloud's chain (web identity, container credentials,
//! # EC2 instance metadata), never used unless chosen here or with
//! # LSVD_S3_CREDENTIALS=instance.
//! credentials = "environment"
//! # true: https://BUCKET.host/KEY requests. Default: path style (host/BUCKET/KEY),
//! # which MinIO, versitygw and Ceph RGW expect and AWS accepts.
//! virtual_hosted_style = false
//! # Allow http:// endpoints. Default: yes when the endpoint is http://.
//! allow_http = true
//! # Sign requests without hashing their bodies (UNSIGNED-PAYLOAD). Default: yes over
//! # https (TLS protects the body), no over http (the signature is all it has).
//! # unsigned_payload = true
//! connect_timeout_secs = 5      # TCP/TLS connect
//! request_timeout_secs = 30     # ranged GET, HEAD, LIST, DELETE
//! bulk_timeout_secs = 300       # PUT and whole-object GET
//! max_retries = 3               # per request, inside the S3 client (5xx, 429, resets)
//! retry_timeout_secs = 30       # the S3 client stops retrying a request after this
//! multipart_threshold = "64M"   # overwrites above this use multipart upload
//! multipart_part_size = "16M"   # at least 5M
//!
//! [retry]
//! # Whole-operation retries of every store (store/retry.rs; on top of the S3
//! # client's own), for get, ranged get, list and delete. Only transient errors are
//! # retried: a full store or refused credentials are reported at once. Uploads
//! # (put-if-absent) are retried by the engine itself.
//! attempts = 4                  # tries per operation, including the first
//! put_attempts = 1              # tries per overwrite PUT (put-if-absent: always 1)
//! initial_backoff_ms = 200      # doubled per failure, with jitter
//! max_backoff_ms = 5000
//! attempt_timeout_secs = 120    # timeout of one try
//! deadline_secs = 300           # the longest one operation takes, retries included
//!
//! [selftest]
//! # Check the store at `lsvd serve` startup (put-if-absent honoured, ranged reads,
//! # listing, delete) and refuse to start if it fails. Default: true.
//! on_start = true
//! # Concurrent put-if-absent writers in the race check (0 skips it). Default: 8.
//! race_writers = 8
//!
//! [tuning]
//! # Settings `lsvd probe` decides. Each key set here wins over the probe profiles
//! # (<data>/probe-profile, <data>/store-profiles/) and loses to its `lsvd serve`
//! # flag; unset keys come from a profile, else the default. `lsvd info` shows
//! # what is in force and where it came from.
//! log_writes_in_flight = 1      # 1..64; device profile
//! group_commit_max = "4M"       # 64K..4M; device profile
//! batch_size = "8M"             # 4K..1G; store profile
//! uploads = 4                   # 1..256; store profile
//! read_fetch = "64K"            # whole 64K chunks, 64K..16M; store profile
//!
//! [volumes.disk0]
//! # QoS limits of one volume `lsvd serve` serves (docs/SEMANTICS.md, "QoS limits"):
//! # each key set here wins over its `lsvd serve --limit-*` flag for this volume;
//! # 0 is no limit. Requests over a limit wait, never fail. SIGHUP to the server
//! # reloads these tables (and nothing else in the file). A snapshot export VOL@SNAP
//! # takes [volumes."VOL@SNAP"], else [volumes.VOL].
//! limit_iops = 500              # reads + writes per second (TRIM, WRITE_ZEROES: 1 each)
//! limit_read_iops = 400
//! limit_write_iops = 200
//! limit_bps = "100M"            # bytes read + written per second (a size or a number)
//! limit_read_bps = "80M"
//! limit_write_bps = 52428800
//! limit_burst = "1s"            # what an idle volume may spend at once, as a time at
//!                               # each rate (seconds, "500ms"; 0: none). Default 1s.
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::retry::RetryPolicy;
use lsvd_store::s3::{S3Settings, Secret};
use lsvd_store::s3_credentials::CredentialSource;
use lsvd_store::{DynStore, OpenMode, open_store_mode};

/// The default data directory (matches the CLI's `--data` default).
pub const DEFAULT_DATA_DIR: &str = "./lsvd-data";

/// A complete example, with every key (the module documentation explains each).
pub const EXAMPLE: &str = r#"# lsvd.toml: load with `lsvd --config lsvd.toml ...`
store = "s3://lsvd-volumes/prod"
data = "/var/lib/lsvd"

[s3]
endpoint = "http://127.0.0.1:7070"
region = "us-east-1"
# Prefer AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment.
# access_key_id = "..."
# secret_access_key = "..."
# session_token = "..."
# "environment" (default): the keys above, else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
# "static": the keys above only. "instance": the cloud's credential chain (web
# identity, container credentials, EC2 instance metadata), used only when chosen.
credentials = "environment"
virtual_hosted_style = false
# allow_http = true
# unsigned_payload = true   # default: yes over https, no over http
connect_timeout_secs = 5
request_timeout_secs = 30
bulk_timeout_secs = 300
max_retries = 3
retry_timeout_secs = 30
multipart_threshold = "64M"
multipart_part_size = "16M"

[retry]
attempts = 4
put_attempts = 1
initial_backoff_ms = 200
max_backoff_ms = 5000
attempt_timeout_secs = 120
deadline_secs = 300

[selftest]
on_start = true
race_writers = 8

# Leave these out to use the probe profiles (lsvd probe); `lsvd info` shows the result.
[tuning]
# log_writes_in_flight = 1
# group_commit_max = "4M"
# batch_size = "8M"
# uploads = 4
# read_fetch = "64K"

# QoS limits of volume disk0 (0: none); SIGHUP reloads them.
[volumes.disk0]
# limit_iops = 500
# limit_read_iops = 400
# limit_write_iops = 200
# limit_bps = "100M"
# limit_read_bps = "80M"
# limit_write_bps = "50M"
# limit_burst = "1s"
"#;

/// A string that is never printed, even when deserialization fails on it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretString(pub Secret);

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de> Deserialize<'de> for SecretString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        fn not_string<E: serde::de::Error>() -> E {
            // Never echo the value: it may be a mistyped secret.
            E::custom("expected a quoted string")
        }
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = SecretString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quoted string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(SecretString(Secret::new(v)))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Err(not_string())
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Err(not_string())
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Err(not_string())
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Err(not_string())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                _: A,
            ) -> Result<Self::Value, A::Error> {
                Err(not_string())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                _: A,
            ) -> Result<Self::Value, A::Error> {
                Err(not_string())
            }
        }
        d.deserialize_any(V)
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LsvdConfig {
    /// Store URL: `s3://BUCKET/PREFIX`, `file:///path` or a path.
    pub store: Option<String>,
    /// Data directory (write logs, lock).
    pub data: Option<PathBuf>,
    #[serde(default)]
    pub s3: S3Section,
    #[serde(default)]
    pub retry: RetrySection,
    #[serde(default)]
    pub selftest: SelfTestSection,
    #[serde(default)]
    pub tuning: TuningSection,
    /// `[volumes.NAME]`: per-volume QoS limits (crate::qos).
    #[serde(default)]
    pub volumes: std::collections::BTreeMap<String, crate::qos::VolumeSection>,
    /// Things the operator should hear about (e.g. a secret in a world-readable file).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// `[tuning]`: the settings `lsvd probe` decides (see `probe::settings`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningSection {
    pub log_writes_in_flight: Option<usize>,
    pub group_commit_max: Option<String>,
    pub batch_size: Option<String>,
    pub uploads: Option<usize>,
    pub read_fetch: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Section {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<SecretString>,
    pub secret_access_key: Option<SecretString>,
    pub session_token: Option<SecretString>,
    /// `"environment"`, `"static"` or `"instance"` (see `store::s3_credentials`).
    pub credentials: Option<String>,
    pub virtual_hosted_style: Option<bool>,
    pub allow_http: Option<bool>,
    pub unsigned_payload: Option<bool>,
    pub connect_timeout_secs: Option<u64>,
    pub request_timeout_secs: Option<u64>,
    pub bulk_timeout_secs: Option<u64>,
    pub max_retries: Option<usize>,
    pub retry_timeout_secs: Option<u64>,
    /// A size like `64M`.
    pub multipart_threshold: Option<String>,
    /// A size like `16M`.
    pub multipart_part_size: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    pub attempts: Option<u32>,
    pub put_attempts: Option<u32>,
    pub initial_backoff_ms: Option<u64>,
    pub max_backoff_ms: Option<u64>,
    pub attempt_timeout_secs: Option<u64>,
    pub deadline_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfTestSection {
    pub on_start: Option<bool>,
    pub race_writers: Option<usize>,
}

fn positive_secs(name: &str, v: Option<u64>, default: Duration) -> Result<Duration> {
    match v {
        None => Ok(default),
        Some(0) => Err(Error::bad_input(format!(
            "lsvd.toml: {name} must be at least 1"
        ))),
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

/// Line and column (1-based) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

/// A relative path is taken relative to `base`.
fn rebase(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() || base.as_os_str().is_empty() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

impl LsvdConfig {
    /// Read and parse `path`. Every error is `BadInput`: the file is the user's input.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::with_source(
                ErrorKind::BadInput,
                format!("cannot read config file {}", path.display()),
                e,
            )
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        let mut cfg = Self::parse(&text, base)
            .map_err(|e| e.context(format!("config file {}", path.display())))?;
        if cfg.s3.secret_access_key.is_some() || cfg.s3.session_token.is_some() {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path)
                && meta.permissions().mode() & 0o077 != 0
            {
                cfg.warnings.push(format!(
                    "config file {} holds an S3 secret but is readable by other users; \
                     run: chmod 600 {} (or use AWS_SECRET_ACCESS_KEY instead)",
                    path.display(),
                    path.display()
                ));
            }
        }
        Ok(cfg)
    }

    /// Parse the text of a config file; relative paths are taken relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self> {
        let mut cfg: LsvdConfig = toml::from_str(text).map_err(|e| {
            // The message only, not toml's snippet of the line (nor toml's error as the
            // source): it may hold a secret.
            Error::bad_input(match e.span() {
                Some(span) => {
                    let (line, col) = line_col(text, span.start);
                    format!("line {line}, column {col}: {}", e.message())
                }
                None => e.message().to_string(),
            })
        })?;
        if let Some(d) = &cfg.data {
            cfg.data = Some(rebase(base, d));
        }
        if let Some(s) = &cfg.store {
            if s.is_empty() {
                return Err(Error::bad_input("store must not be empty"));
            }
            if let Some(p) = s.strip_prefix("file://") {
                cfg.store = Some(format!("file://{}", rebase(base, Path::new(p)).display()));
            } else if !s.contains("://") {
                cfg.store = Some(rebase(base, Path::new(s)).display().to_string());
            }
        }
        // Validate now, so a bad value is reported at startup with the file's name.
        cfg.s3_settings()?;
        cfg.retry_policy()?;
        cfg.tuning_layer()?;
        crate::qos::limits::validate(&cfg.volumes)?;
        Ok(cfg)
    }

    /// The `[s3]` section over the built-in defaults (unset keys: environment).
    pub fn s3_settings(&self) -> Result<S3Settings> {
        let s = &self.s3;
        let d = S3Settings::default();
        let size = |name: &str, v: &Option<String>, default: u64| -> Result<u64> {
            match v {
                None => Ok(default),
                Some(t) => {
                    lsvd_core::size::parse_size(t).map_err(|e| e.context(format!("[s3] {name}")))
                }
            }
        };
        let part = size(
            "multipart_part_size",
            &s.multipart_part_size,
            d.multipart_part_bytes,
        )?;
        if part < 5 << 20 {
            return Err(Error::bad_input(
                "[s3] multipart_part_size must be at least 5M",
            ));
        }
        if s.access_key_id.is_some() != s.secret_access_key.is_some() {
            return Err(Error::bad_input(
                "[s3] give both access_key_id and secret_access_key, or neither \
                 (to use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
            ));
        }
        if let Some(ep) = &s.endpoint {
            let lower = ep.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) {
                // Not echoed: a URL may carry user:password@.
                return Err(Error::bad_input(
                    "[s3] endpoint must start with http:// or https://",
                ));
            }
        }
        let credentials = s
            .credentials
            .as_deref()
            .map(|c| CredentialSource::parse(c, "[s3] credentials"))
            .transpose()?;
        if credentials == Some(CredentialSource::Instance) && s.access_key_id.is_some() {
            return Err(Error::bad_input(
                "[s3] credentials = \"instance\" takes credentials from the cloud; \
                 remove access_key_id / secret_access_key, or use credentials = \"static\"",
            ));
        }
        Ok(S3Settings {
            credentials,
            endpoint: s.endpoint.clone(),
            region: s.region.clone(),
            access_key_id: s.access_key_id.as_ref().map(|x| x.0.clone()),
            secret_access_key: s.secret_access_key.as_ref().map(|x| x.0.clone()),
            session_token: s.session_token.as_ref().map(|x| x.0.clone()),
            virtual_hosted_style: s.virtual_hosted_style,
            allow_http: s.allow_http,
            unsigned_payload: s.unsigned_payload,
            connect_timeout: positive_secs(
                "[s3] connect_timeout_secs",
                s.connect_timeout_secs,
                d.connect_timeout,
            )?,
            request_timeout: positive_secs(
                "[s3] request_timeout_secs",
                s.request_timeout_secs,
                d.request_timeout,
            )?,
            bulk_timeout: positive_secs(
                "[s3] bulk_timeout_secs",
                s.bulk_timeout_secs,
                d.bulk_timeout,
            )?,
            max_retries: s.max_retries.unwrap_or(d.max_retries),
            retry_timeout: s
                .retry_timeout_secs
                .map_or(d.retry_timeout, Duration::from_secs),
            multipart_threshold_bytes: size(
                "multipart_threshold",
                &s.multipart_threshold,
                d.multipart_threshold_bytes,
            )?,
            multipart_part_bytes: part,
        })
    }

    /// The `[retry]` section over the built-in defaults.
    pub fn retry_policy(&self) -> Result<RetryPolicy> {
        let r = &self.retry;
        let d = RetryPolicy::default();
        let policy = RetryPolicy {
            attempts: r.attempts.unwrap_or(d.attempts),
            put_attempts: r.put_attempts.unwrap_or(d.put_attempts),
            initial_backoff: r
                .initial_backoff_ms
                .map_or(d.initial_backoff, Duration::from_millis),
            max_backoff: r
                .max_backoff_ms
                .map_or(d.max_backoff, Duration::from_millis),
            attempt_timeout: positive_secs(
                "[retry] attempt_timeout_secs",
                r.attempt_timeout_secs,
                d.attempt_timeout,
            )?,
            deadline: positive_secs("[retry] deadline_secs", r.deadline_secs, d.deadline)?,
            jitter_seed: d.jitter_seed,
        };
        if policy.attempts == 0 || policy.put_attempts == 0 {
            return Err(Error::bad_input(
                "[retry] attempts and put_attempts must be at least 1",
            ));
        }
        if policy.attempts > 100 || policy.put_attempts > 100 {
            return Err(Error::bad_input(
                "[retry] attempts and put_attempts must be at most 100",
            ));
        }
        Ok(policy)
    }

    /// The `[tuning]` section as a settings layer; values outside the settings' limits
    /// are `BadInput`.
    pub fn tuning_layer(&self) -> Result<crate::probe::settings::Layer> {
        use crate::probe::settings::{CONFIG_NAMES, Layer, validate};
        let t = &self.tuning;
        let size = |v: &Option<String>, name: &str| -> Result<Option<u64>> {
            v.as_deref()
                .map(|s| {
                    lsvd_core::size::parse_size(s)
                        .map_err(|e| Error::bad_input(format!("{name}: {e}")))
                })
                .transpose()
        };
        let layer = Layer {
            log_writes_in_flight: t.log_writes_in_flight,
            group_commit_max_bytes: size(&t.group_commit_max, CONFIG_NAMES.group_commit_max)?,
            batch_size_bytes: size(&t.batch_size, CONFIG_NAMES.batch_size)?,
            uploads_in_flight: t.uploads,
            read_fetch_bytes: size(&t.read_fetch, CONFIG_NAMES.read_fetch)?,
        };
        validate(&layer, &CONFIG_NAMES)?;
        Ok(layer)
    }

    /// Run the store self-test at `lsvd serve` startup? Default: yes.
    pub fn selftest_on_start(&self) -> bool {
        self.selftest.on_start.unwrap_or(true)
    }

    /// Concurrent writers in the self-test's race check. Default 8.
    pub fn selftest_race_writers(&self) -> usize {
        self.selftest
            .race_writers
            .unwrap_or(lsvd_store::selftest::DEFAULT_RACE_WRITERS)
            .min(64)
    }

    /// The data directory: `flag` (from `--data`/`LSVD_DATA`), else this file's
    /// `data`, else [`DEFAULT_DATA_DIR`].
    pub fn data_dir(&self, flag: Option<&Path>) -> PathBuf {
        flag.map(Path::to_path_buf)
            .or_else(|| self.data.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// The store URL: `flag` (from `--store`/`LSVD_STORE`), else this file's `store`,
    /// else `file://<data_dir>/store`.
    pub fn store_url(&self, flag: Option<&str>, data_dir: &Path) -> String {
        flag.map(str::to_string)
            .or_else(|| self.store.clone())
            .unwrap_or_else(|| format!("file://{}", data_dir.join("store").display()))
    }

    /// Open the store at `url` with this file's retry settings (and, for `s3://`, its
    /// S3 settings; other schemes as [`open_store_mode`]).
    pub fn open_store(&self, url: &str) -> Result<DynStore> {
        self.open_store_mode(url, OpenMode::ReadWrite)
    }

    /// [`open_store`](Self::open_store) in `mode` (see [`OpenMode`]).
    pub fn open_store_mode(&self, url: &str, mode: OpenMode) -> Result<DynStore> {
        if url.starts_with("s3://") {
            let store =
                lsvd_store::s3::open_with_retry(url, &self.s3_settings()?, &self.retry_policy()?)?;
            Ok(match mode {
                OpenMode::ReadWrite => store,
                OpenMode::ReadOnly => {
                    std::sync::Arc::new(lsvd_store::read_only::ReadOnlyStore::new(store))
                }
            })
        } else {
            open_store_mode(url, &self.retry_policy()?, mode)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_section() {
        let cfg = LsvdConfig::parse(
            "[tuning]\nlog_writes_in_flight = 8\ngroup_commit_max = \"1M\"\nread_fetch = \"256K\"\n",
            Path::new(""),
        )
        .expect("parses");
        let l = cfg.tuning_layer().expect("valid");
        assert_eq!(l.log_writes_in_flight, Some(8));
        assert_eq!(l.group_commit_max_bytes, Some(1 << 20));
        assert_eq!(l.read_fetch_bytes, Some(256 << 10));
        assert_eq!((l.batch_size_bytes, l.uploads_in_flight), (None, None));
        for bad in [
            "[tuning]\nlog_writes_in_flight = 0\n",
            "[tuning]\nread_fetch = \"100K\"\n",
            "[tuning]\nbatch_size = \"lots\"\n",
            "[tuning]\nfetch = \"64K\"\n",
        ] {
            let e = LsvdConfig::parse(bad, Path::new("")).expect_err(bad);
            assert_eq!(e.kind, ErrorKind::BadInput, "{bad}");
        }
        let empty = LsvdConfig::parse(EXAMPLE, Path::new("")).expect("example");
        assert_eq!(
            empty.tuning_layer().expect("valid"),
            crate::probe::settings::Layer::default()
        );
    }

    #[test]
    fn example_parses_and_round_trips_defaults() {
        let cfg = LsvdConfig::parse(EXAMPLE, Path::new("/etc/lsvd")).expect("example parses");
        assert_eq!(cfg.store.as_deref(), Some("s3://lsvd-volumes/prod"));
        assert_eq!(cfg.data.as_deref(), Some(Path::new("/var/lib/lsvd")));
        let s3 = cfg.s3_settings().expect("s3");
        let d = S3Settings::default();
        assert_eq!(s3.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(s3.connect_timeout, d.connect_timeout);
        assert_eq!(s3.request_timeout, d.request_timeout);
        assert_eq!(s3.bulk_timeout, d.bulk_timeout);
        assert_eq!(s3.multipart_threshold_bytes, d.multipart_threshold_bytes);
        assert_eq!(s3.multipart_part_bytes, d.multipart_part_bytes);
        assert_eq!(cfg.retry_policy().expect("retry"), RetryPolicy::default());
        assert!(cfg.selftest_on_start());
        assert_eq!(cfg.selftest_race_writers(), 8);
        assert_eq!(
            s3.credentials,
            Some(lsvd_store::s3_credentials::CredentialSource::Environment)
        );
        let chain = LsvdConfig::parse("[s3]\ncredentials = \"instance\"\n", Path::new(""))
            .expect("instance");
        assert_eq!(
            chain.s3_settings().expect("s3").credentials,
            Some(lsvd_store::s3_credentials::CredentialSource::Instance)
        );
    }

    #[test]
    fn empty_file_means_defaults() {
        let cfg = LsvdConfig::parse("", Path::new("")).expect("empty");
        assert!(cfg.store.is_none() && cfg.data.is_none());
        assert_eq!(cfg.data_dir(None), PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(
            cfg.store_url(None, Path::new("/d")),
            "file:///d/store".to_string()
        );
        assert_eq!(cfg.retry_policy().expect("retry"), RetryPolicy::default());
        assert!(cfg.selftest_on_start());
    }

    #[test]
    fn flags_win_over_file() {
        let cfg = LsvdConfig::parse("store = \"s3://b/p\"\ndata = \"/x\"\n", Path::new("/"))
            .expect("parse");
        assert_eq!(cfg.data_dir(None), PathBuf::from("/x"));
        assert_eq!(cfg.data_dir(Some(Path::new("/y"))), PathBuf::from("/y"));
        assert_eq!(cfg.store_url(None, Path::new("/x")), "s3://b/p");
        assert_eq!(cfg.store_url(Some("/other"), Path::new("/x")), "/other");
    }

    #[test]
    fn relative_paths_follow_the_file() {
        let cfg = LsvdConfig::parse(
            "store = \"volumes\"\ndata = \"state\"\n",
            Path::new("/etc/lsvd"),
        )
        .expect("parse");
        assert_eq!(cfg.data.as_deref(), Some(Path::new("/etc/lsvd/state")));
        assert_eq!(cfg.store.as_deref(), Some("/etc/lsvd/volumes"));
        let cfg = LsvdConfig::parse("store = \"file://v\"\n", Path::new("/etc/lsvd")).expect("p");
        assert_eq!(cfg.store.as_deref(), Some("file:///etc/lsvd/v"));
        let cfg = LsvdConfig::parse("store = \"file:///abs\"\n", Path::new("/etc")).expect("p");
        assert_eq!(cfg.store.as_deref(), Some("file:///abs"));
    }

    #[test]
    fn rejects_typos_and_bad_values() {
        for (text, needle) in [
            ("stor = \"x\"", "unknown field"),
            ("[s3]\nendpont = \"http://x\"", "unknown field"),
            ("[s3]\nendpoint = \"127.0.0.1:9000\"", "http://"),
            ("[s3]\nmultipart_part_size = \"1M\"", "at least 5M"),
            (
                "[s3]\nmultipart_threshold = \"lots\"",
                "multipart_threshold",
            ),
            ("[s3]\nconnect_timeout_secs = 0", "at least 1"),
            ("[s3]\naccess_key_id = \"AKIA\"", "both"),
            ("[s3]\ncredentials = \"imds\"", "expected \"environment\""),
            (
                "[s3]\ncredentials = \"instance\"\naccess_key_id = \"AKIA\"\nsecret_access_key = \"s\"",
                "remove access_key_id",
            ),
            ("[retry]\nattempts = 0", "at least 1"),
            (
                "[retry]\ndeadline_secs = 0",
                "deadline_secs must be at least 1",
            ),
            ("[selftest]\non_start = \"yes\"", "line 2"),
            ("store = \"\"", "empty"),
            ("[volumes.v]\nlimit_iop = 5", "unknown field"),
            ("[volumes.v]\nlimit_bps = \"fast\"", "[volumes.v]"),
        ] {
            let e = LsvdConfig::parse(text, Path::new("")).expect_err(text);
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn secrets_never_echoed() {
        let cfg = LsvdConfig::parse(
            "[s3]\naccess_key_id = \"AKIAFILEKEY\"\nsecret_access_key = \"file-secret-xyz\"\n",
            Path::new(""),
        )
        .expect("parse");
        let s3 = cfg.s3_settings().expect("s3");
        assert_eq!(
            s3.secret_access_key.as_ref().map(Secret::expose),
            Some("file-secret-xyz")
        );
        let dbg = format!("{cfg:?} {s3:?}");
        assert!(!dbg.contains("file-secret-xyz"), "{dbg}");
        assert!(!dbg.contains("AKIAFILEKEY"), "{dbg}");
        // A mistyped (unquoted) secret is not echoed in the parse error.
        for text in [
            "[s3]\nsecret_access_key = 123456789\n",
            "[s3]\nsecret_access_key = abc123def\n",
            "[s3]\nsecret_access_key = [\"abc123def\"]\n",
        ] {
            let e = LsvdConfig::parse(text, Path::new("")).expect_err(text);
            let e = e.to_string();
            assert!(!e.contains("123456789") && !e.contains("abc123def"), "{e}");
            assert!(e.contains("line 2"), "{e}");
        }
    }

    #[test]
    fn load_warns_about_readable_secrets() {
        use std::os::unix::fs::PermissionsExt;
        let dir = lsvd_store::testutil::TempDir::new("config-file");
        let path = dir.path().join("lsvd.toml");
        std::fs::write(
            &path,
            "data = \"d\"\n[s3]\naccess_key_id = \"AKIAX\"\nsecret_access_key = \"sekrit-value\"\n",
        )
        .expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let cfg = LsvdConfig::load(&path).expect("load");
        assert_eq!(cfg.data.as_deref(), Some(dir.path().join("d").as_path()));
        assert_eq!(cfg.warnings.len(), 1, "{:?}", cfg.warnings);
        assert!(cfg.warnings[0].contains("chmod 600"));
        assert!(!cfg.warnings[0].contains("sekrit-value"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(LsvdConfig::load(&path).expect("load").warnings.is_empty());
        let missing = LsvdConfig::load(&dir.path().join("nope.toml")).expect_err("missing");
        assert!(missing.to_string().contains("nope.toml"), "{missing}");
    }

    #[test]
    fn opens_stores_by_scheme() {
        let dir = lsvd_store::testutil::TempDir::new("config-open");
        let cfg = LsvdConfig::default();
        let url = format!("file://{}", dir.path().display());
        assert!(
            cfg.open_store(&url)
                .expect("fs")
                .describe()
                .starts_with("file://")
        );
        let cfg = LsvdConfig::parse(
            "[s3]\nendpoint = \"http://127.0.0.1:1\"\naccess_key_id = \"AKIAOPEN\"\n\
             secret_access_key = \"open-secret\"\n",
            Path::new(""),
        )
        .expect("parse");
        let s = cfg.open_store("s3://bkt/pre").expect("s3 (no I/O)");
        assert_eq!(s.describe(), "s3://bkt/pre (endpoint http://127.0.0.1:1)");
        assert!(cfg.open_store("ftp://bkt").is_err());
    }

    /// `chain:a,b` once opened a relative directory named `chain:a,b` (now it is the
    /// chained-drive store): a scheme lsvd does not know is an error naming the ones
    /// it knows.
    #[test]
    fn an_unknown_scheme_is_an_error_not_a_directory() {
        let dir = lsvd_store::testutil::TempDir::new("config-scheme");
        let cfg = LsvdConfig::default();
        for url in [
            "raid5:/a,/b",
            "gecko:x",
            "gecko+local:y",
            "S3:bkt",
            "abfss://c@acct.dfs.core.windows.net/p",
        ] {
            let Err(e) = cfg.open_store(url) else {
                panic!("{url} opened as a store");
            };
            assert_eq!(e.kind, lsvd_core::error::ErrorKind::BadInput, "{url}: {e}");
            assert!(
                e.to_string().contains(lsvd_store::KNOWN_STORE_URLS),
                "{url}: {e}"
            );
        }
        assert!(!std::path::Path::new("gecko:x").exists());
        // A path with a colon past its first character stays a path.
        let colon = dir.path().join("a:b");
        let s = cfg
            .open_store(&colon.display().to_string())
            .expect("an absolute path with a colon");
        assert!(s.describe().contains("a:b"), "{}", s.describe());
    }
}

/// Global options with the config file applied: the data directory, the store URL and
/// the file itself (what `lsvd` commands and the probe share).
#[derive(Debug, Clone)]
pub struct Common {
    pub data: PathBuf,
    pub store: String,
    pub file: LsvdConfig,
    /// The key file that unlocks encrypted volumes (`--key-file`, `LSVD_KEY_FILE`).
    pub key_file: Option<PathBuf>,
    /// Where `file` was read from (`--config`), for a reload (SIGHUP).
    pub file_path: Option<PathBuf>,
}

impl Common {
    /// The user key from the key file, if one was given (read each time: it is never
    /// kept longer than the command that needs it).
    pub fn user_key(&self) -> Result<Option<lsvd_store::sealed::UserKey>> {
        self.key_file
            .as_deref()
            .map(lsvd_store::sealed::UserKey::from_file)
            .transpose()
    }

    pub fn store_url(&self) -> String {
        self.store.clone()
    }

    /// Open the store (S3 settings and retry policy from the config file).
    pub fn open_store(&self) -> Result<lsvd_store::DynStore> {
        self.file.open_store(&self.store)
    }

    /// Open the store for a read-only command: nothing in it changes
    /// ([`OpenMode::ReadOnly`]).
    pub fn open_store_read_only(&self) -> Result<lsvd_store::DynStore> {
        self.file.open_store_mode(&self.store, OpenMode::ReadOnly)
    }
}
