//! Azure Blob Storage (`az://CONTAINER/PREFIX`) through `object_store`'s Azure client.
//!
//! Why a module of its own: only the builder differs from S3. Semantics, timeouts and
//! error mapping are [`super::cloud`]'s; put-if-absent is a Put Blob with
//! `If-None-Match: *`, which Azure and Azurite answer with `409 Conflict`
//! (`BlobAlreadyExists`) when the blob exists (or `412`): both are `AlreadyExists`.
//! Unlike S3, a `409` here is final, so it is not retried.
//!
//! # Environment
//!
//! Everything comes from the variables `object_store` reads
//! (`MicrosoftAzureBuilder::from_env`), among them:
//!
//! | variable | meaning |
//! |---|---|
//! | `AZURE_STORAGE_ACCOUNT_NAME` | the storage account |
//! | `AZURE_STORAGE_ACCOUNT_KEY` | its shared key |
//! | `AZURE_STORAGE_SAS_KEY`, `AZURE_STORAGE_TOKEN` | a SAS token or a bearer token instead |
//! | `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`, `AZURE_TENANT_ID` | a service principal instead |
//! | `AZURE_FEDERATED_TOKEN_FILE` (with client and tenant id) | workload identity |
//! | `AZURE_STORAGE_ENDPOINT` | the blob service URL; default `https://ACCOUNT.blob.core.windows.net` |
//! | `AZURE_STORAGE_USE_EMULATOR=true` | talk to Azurite: its well-known account and key unless set, at `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`) |
//!
//! A plain-`http://` endpoint is allowed automatically (loopback emulators).
//!
//! With no key, token or principal, `object_store` would ask the instance-metadata
//! endpoint for a managed-identity token. As for S3 ([`super::s3_credentials`]), lsvd
//! does that only when asked: `LSVD_AZURE_CREDENTIALS=instance`; otherwise missing
//! credentials are a one-line error when the store is opened, before any request.

use std::sync::Arc;

use object_store::ClientConfigKey;
use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};

use super::DynStore;
use super::cloud::{
    ClientSettings, CloudStore, CloudUrl, Service, duration_str, env_nonempty, is_plain_http,
};
use super::cloud_errors::strip_userinfo;
use super::retry::{RetryPolicy, RetryStore};
use lsvd_core::error::{Error, Result};

/// An object store in an Azure Blob Storage container.
pub type AzureStore = CloudStore<MicrosoftAzure>;

/// The variable that lets `object_store` use a managed identity for credentials.
pub const INSTANCE_CREDENTIALS_VAR: &str = "LSVD_AZURE_CREDENTIALS";

/// Azurite's default blob endpoint (what `object_store` uses with the emulator).
const EMULATOR_URL: &str = "http://127.0.0.1:10000";

/// Parse `az://CONTAINER/PREFIX`; a malformed URL is `BadInput`.
pub fn parse_url(url: &str) -> Result<CloudUrl> {
    CloudUrl::parse(
        url,
        Service::Azure,
        "use AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY or other AZURE_* variables",
    )
}

/// Open `az://CONTAINER/PREFIX` with `settings`, wrapped in [`RetryStore`] with
/// `policy`: what [`super::open_store`] does with default settings.
pub fn open_with_retry(
    url: &str,
    settings: &ClientSettings,
    policy: &RetryPolicy,
) -> Result<DynStore> {
    let inner: DynStore = Arc::new(AzureStore::open(url, settings)?);
    Ok(Arc::new(RetryStore::new(inner, policy.clone())))
}

/// `object_store`'s reading of a boolean setting.
fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "1" | "true" | "on" | "yes" | "y"
        )
    })
}

/// Is there anything `object_store` would take credentials from, short of the
/// managed-identity endpoint?
fn has_credentials(b: &MicrosoftAzureBuilder) -> bool {
    let set = |k: AzureConfigKey| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    set(AzureConfigKey::AccessKey)
        || set(AzureConfigKey::SasKey)
        || set(AzureConfigKey::Token)
        || (set(AzureConfigKey::ClientId)
            && set(AzureConfigKey::AuthorityId)
            && (set(AzureConfigKey::ClientSecret) || set(AzureConfigKey::FederatedTokenFile)))
        || truthy(b.get_config_value(&AzureConfigKey::UseAzureCli))
        || truthy(b.get_config_value(&AzureConfigKey::SkipSignature))
        || set(AzureConfigKey::CredentialType)
}

impl AzureStore {
    /// Open `az://CONTAINER/PREFIX` with `settings` over the environment. Does no I/O:
    /// run [`super::selftest::run`] to check the service is reachable and correct.
    pub fn open(url: &str, settings: &ClientSettings) -> Result<Self> {
        Self::open_with(url, settings, MicrosoftAzureBuilder::from_env())
    }

    /// [`open`](Self::open) over a builder already holding the environment's settings.
    fn open_with(url: &str, settings: &ClientSettings, b: MicrosoftAzureBuilder) -> Result<Self> {
        let parsed = parse_url(url)?;
        let mut b = b.with_container_name(&parsed.bucket);
        let emulator = truthy(b.get_config_value(&AzureConfigKey::UseEmulator));
        let account = b.get_config_value(&AzureConfigKey::AccountName);
        if !emulator {
            if account.as_deref().is_none_or(str::is_empty) {
                return Err(Error::bad_input(format!(
                    "Azure store {url}: no storage account: set AZURE_STORAGE_ACCOUNT_NAME \
                     (or AZURE_STORAGE_USE_EMULATOR=true for Azurite)"
                )));
            }
            let instance = env_nonempty(INSTANCE_CREDENTIALS_VAR).as_deref() == Some("instance");
            if !instance && !has_credentials(&b) {
                return Err(Error::bad_input(format!(
                    "Azure store {url}: no credentials: set AZURE_STORAGE_ACCOUNT_KEY, \
                     AZURE_STORAGE_SAS_KEY, AZURE_STORAGE_TOKEN or AZURE_CLIENT_ID/\
                     AZURE_CLIENT_SECRET/AZURE_TENANT_ID, or {INSTANCE_CREDENTIALS_VAR}=instance \
                     to use a managed identity"
                )));
            }
        }
        let endpoint = if emulator {
            Some(env_nonempty("AZURITE_BLOB_STORAGE_URL").unwrap_or_else(|| EMULATOR_URL.into()))
        } else {
            b.get_config_value(&AzureConfigKey::Endpoint)
        };
        if is_plain_http(endpoint.as_deref()) {
            b = b.with_config(AzureConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
        b = b
            .with_config(
                AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                duration_str(settings.connect_timeout),
            )
            .with_retry(settings.retry_config());

        let secrets: Vec<String> = [
            AzureConfigKey::AccessKey,
            AzureConfigKey::SasKey,
            AzureConfigKey::Token,
            AzureConfigKey::ClientSecret,
        ]
        .iter()
        .filter_map(|key| b.get_config_value(key))
        .collect();
        let clients = settings.build_clients(("Azure", url), &secrets, |timeout| {
            let timeout_key = AzureConfigKey::Client(ClientConfigKey::Timeout);
            b.clone().with_config(timeout_key, timeout).build()
        })?;
        let location = parsed.location(Service::Azure);
        let description = match (emulator, &endpoint, &account) {
            (true, Some(ep), _) => format!("{location} (Azurite {})", strip_userinfo(ep)),
            (_, Some(ep), _) => format!("{location} (endpoint {})", strip_userinfo(ep)),
            (_, None, Some(a)) => format!("{location} (account {a})"),
            _ => location,
        };
        let store = CloudStore::single_part(Service::Azure, clients, parsed, &description, secrets);
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectStore as _;

    #[test]
    fn credentials_are_required_unless_asked_for_the_chain() {
        let s = ClientSettings::default();
        let no_account = AzureStore::open_with("az://c/p", &s, MicrosoftAzureBuilder::new());
        let e = no_account.err().expect("no account");
        assert!(e.to_string().contains("AZURE_STORAGE_ACCOUNT_NAME"), "{e}");
        let no_key = MicrosoftAzureBuilder::new().with_account("acct");
        assert!(!has_credentials(&no_key));
        let with_key = no_key.with_access_key("a2V5LWJ5dGVzLWZvci10ZXN0aW5nLW9ubHk=");
        assert!(has_credentials(&with_key));
        assert!(truthy(Some("True".into())) && !truthy(Some("0".into())) && !truthy(None));
    }

    #[test]
    fn opening_does_no_io_and_hides_the_key() {
        let key = "c2VjcmV0LWtleS1ieXRlcy1mb3ItYS10ZXN0";
        let b = MicrosoftAzureBuilder::new()
            .with_account("acct")
            .with_access_key(key)
            .with_endpoint("http://u:pw@127.0.0.1:1/acct".into());
        let s = AzureStore::open_with("az://c/vols/", &ClientSettings::default(), b)
            .expect("open (no I/O)");
        assert_eq!(
            s.describe(),
            "az://c/vols (endpoint http://127.0.0.1:1/acct)"
        );
        assert!(!s.describe().contains(key));
        assert_eq!((s.bucket(), s.prefix()), ("c", "vols/"));
        let emu = MicrosoftAzureBuilder::new().with_use_emulator(true);
        let s = AzureStore::open_with("az://c", &ClientSettings::default(), emu).expect("emulator");
        assert!(
            s.describe().starts_with("az://c (Azurite http://"),
            "{}",
            s.describe()
        );
    }
}
