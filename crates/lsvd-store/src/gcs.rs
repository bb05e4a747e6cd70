//! Google Cloud Storage (`gs://BUCKET/PREFIX`) through `object_store`'s GCS client.
//!
//! Why a module of its own: only the builder differs from S3. Semantics, timeouts and
//! error mapping are [`super::cloud`]'s; put-if-absent is a write with
//! `x-goog-if-generation-match: 0`, and GCS answers `412 Precondition Failed` when the
//! key is taken (`AlreadyExists`).
//!
//! # Environment
//!
//! Everything comes from the variables `object_store` reads
//! (`GoogleCloudStorageBuilder::from_env`):
//!
//! | variable | meaning |
//! |---|---|
//! | `GOOGLE_SERVICE_ACCOUNT` (or `GOOGLE_SERVICE_ACCOUNT_PATH`) | path of a service-account JSON key file |
//! | `GOOGLE_SERVICE_ACCOUNT_KEY` | the service-account JSON key itself |
//! | `GOOGLE_APPLICATION_CREDENTIALS` | path of an application-default-credentials file |
//! | `GOOGLE_BASE_URL` | the service, e.g. `http://127.0.0.1:4443` for an emulator; default `https://storage.googleapis.com` |
//!
//! A service-account key may also carry `"gcs_base_url"` and `"disable_oauth": true`
//! (no token: what an emulator such as fake-gcs-server wants). The gcloud CLI's
//! `~/.config/gcloud/application_default_credentials.json` is used when present.
//! A plain-`http://` base URL is allowed automatically (loopback emulators).
//!
//! Without any of these, `object_store` would ask the GCE metadata server for a token.
//! As for S3 ([`super::s3_credentials`]), lsvd does that only when asked:
//! `LSVD_GCS_CREDENTIALS=instance`; otherwise missing credentials are a one-line error
//! when the store is opened, before any request.

use std::sync::Arc;

use object_store::ClientConfigKey;
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder, GoogleConfigKey};

use super::DynStore;
use super::cloud::{
    ClientSettings, CloudStore, CloudUrl, Service, duration_str, env_nonempty, is_plain_http,
};
use super::cloud_errors::strip_userinfo;
use super::retry::{RetryPolicy, RetryStore};
use lsvd_core::error::{Error, Result};

/// An object store in a GCS bucket.
pub type GcsStore = CloudStore<GoogleCloudStorage>;

/// The variable that lets `object_store` use the GCE metadata server for credentials.
pub const INSTANCE_CREDENTIALS_VAR: &str = "LSVD_GCS_CREDENTIALS";

/// Parse `gs://BUCKET/PREFIX`; a malformed URL is `BadInput`.
pub fn parse_url(url: &str) -> Result<CloudUrl> {
    CloudUrl::parse(
        url,
        Service::Gcs,
        "use GOOGLE_SERVICE_ACCOUNT, GOOGLE_APPLICATION_CREDENTIALS or other GOOGLE_* variables",
    )
}

/// Open `gs://BUCKET/PREFIX` with `settings`, wrapped in [`RetryStore`] with `policy`:
/// what [`super::open_store`] does with default settings.
pub fn open_with_retry(
    url: &str,
    settings: &ClientSettings,
    policy: &RetryPolicy,
) -> Result<DynStore> {
    let inner: DynStore = Arc::new(GcsStore::open(url, settings)?);
    Ok(Arc::new(RetryStore::new(inner, policy.clone())))
}

/// The `gcs_base_url` of a service-account key (JSON text), if it has one.
fn base_url_in_key(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("gcs_base_url")?.as_str().map(str::to_string)
}

/// Is there anything `object_store` would take credentials from, short of the
/// metadata server? `home` is `$HOME` (for the gcloud CLI's file).
fn has_credentials(b: &GoogleCloudStorageBuilder, home: Option<&str>) -> bool {
    let set = |k: GoogleConfigKey| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    set(GoogleConfigKey::ServiceAccount)
        || set(GoogleConfigKey::ServiceAccountKey)
        || set(GoogleConfigKey::ApplicationCredentials)
        || set(GoogleConfigKey::BearerToken)
        || b.get_config_value(&GoogleConfigKey::SkipSignature)
            .is_some_and(|v| v == "true")
        || home.is_some_and(|h| {
            std::path::Path::new(h)
                .join(".config/gcloud/application_default_credentials.json")
                .exists()
        })
}

impl GcsStore {
    /// Open `gs://BUCKET/PREFIX` with `settings` over the environment. Does no I/O:
    /// run [`super::selftest::run`] to check the service is reachable and correct.
    pub fn open(url: &str, settings: &ClientSettings) -> Result<Self> {
        let parsed = parse_url(url)?;
        let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(&parsed.bucket);
        let instance = env_nonempty(INSTANCE_CREDENTIALS_VAR).as_deref() == Some("instance");
        if !instance && !has_credentials(&b, env_nonempty("HOME").as_deref()) {
            return Err(Error::bad_input(format!(
                "GCS store {url}: no credentials: set GOOGLE_SERVICE_ACCOUNT (a key file), \
                 GOOGLE_SERVICE_ACCOUNT_KEY or GOOGLE_APPLICATION_CREDENTIALS, or \
                 {INSTANCE_CREDENTIALS_VAR}=instance to use the GCE metadata server"
            )));
        }
        let key_json = b
            .get_config_value(&GoogleConfigKey::ServiceAccountKey)
            .or_else(|| {
                let path = b.get_config_value(&GoogleConfigKey::ServiceAccount)?;
                std::fs::read_to_string(path).ok()
            });
        let base_url = b
            .get_config_value(&GoogleConfigKey::BaseUrl)
            .or_else(|| key_json.as_deref().and_then(base_url_in_key));
        if is_plain_http(base_url.as_deref()) {
            b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
        b = b
            .with_config(
                GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                duration_str(settings.connect_timeout),
            )
            .with_retry(settings.retry_config());

        let mut secrets: Vec<String> = [
            GoogleConfigKey::ServiceAccountKey,
            GoogleConfigKey::BearerToken,
        ]
        .iter()
        .filter_map(|key| b.get_config_value(key))
        .collect();
        if let Some(v) = key_json
            .as_deref()
            .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
            && let Some(pk) = v.get("private_key").and_then(|p| p.as_str())
        {
            secrets.push(pk.to_string());
        }
        let clients = settings.build_clients(("GCS", url), &secrets, |timeout| {
            let timeout_key = GoogleConfigKey::Client(ClientConfigKey::Timeout);
            b.clone().with_config(timeout_key, timeout).build()
        })?;
        let location = parsed.location(Service::Gcs);
        let description = match &base_url {
            Some(u) => format!("{location} (endpoint {})", strip_userinfo(u)),
            None => location,
        };
        let store = CloudStore::single_part(Service::Gcs, clients, parsed, &description, secrets);
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectStore as _;

    #[test]
    fn finds_the_base_url_in_a_key() {
        let key = r#"{"private_key":"","private_key_id":"","client_email":"","disable_oauth":true,"gcs_base_url":"http://127.0.0.1:1"}"#;
        assert_eq!(base_url_in_key(key).as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(base_url_in_key("{}"), None);
        assert_eq!(base_url_in_key("not json"), None);
    }

    #[test]
    fn credentials_are_looked_for_without_io() {
        let bare = GoogleCloudStorageBuilder::new();
        assert!(!has_credentials(&bare, None));
        assert!(!has_credentials(&bare, Some("/nonexistent-home")));
        let key = bare
            .clone()
            .with_config(GoogleConfigKey::ServiceAccountKey, "{}");
        assert!(has_credentials(&key, None));
        let skip = bare.with_config(GoogleConfigKey::SkipSignature, "true");
        assert!(has_credentials(&skip, None));
    }

    /// Opening reads the environment only when the process has these variables; the
    /// store itself is built from explicit values here, so the test is parallel-safe.
    #[test]
    fn a_store_over_an_emulator_key_describes_itself_without_secrets() {
        let b = GoogleCloudStorageBuilder::new()
            .with_bucket_name("bkt")
            .with_config(
                GoogleConfigKey::ServiceAccountKey,
                r#"{"private_key":"pk-very-secret","private_key_id":"","client_email":"","disable_oauth":true}"#,
            )
            .with_config(GoogleConfigKey::BaseUrl, "http://127.0.0.1:1")
            .with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        let s = CloudStore::single_part(
            Service::Gcs,
            (b.clone().build().expect("build"), b.build().expect("build")),
            parse_url("gs://bkt/p").expect("url"),
            "gs://bkt/p (endpoint http://127.0.0.1:1) pk-very-secret",
            vec!["pk-very-secret".into()],
        );
        assert_eq!(
            s.describe(),
            "gs://bkt/p (endpoint http://127.0.0.1:1) [redacted]"
        );
        assert_eq!((s.bucket(), s.prefix()), ("bkt", "p/"));
    }
}
