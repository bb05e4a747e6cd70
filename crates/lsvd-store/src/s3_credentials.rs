//! Which S3 credentials to use, decided before any request is made.
//!
//! Why: `object_store`'s AWS builder, given no access key, falls back to the cloud's
//! credential chain and asks the instance-metadata endpoint (169.254.169.254) for a
//! token. Off a cloud VM that is a confusing HTTP error at the first request, seconds
//! later, and on one it silently uses whatever role the machine has. So lsvd takes
//! credentials from that chain only when the configuration says so
//! (`[s3] credentials = "instance"` or `LSVD_S3_CREDENTIALS=instance`); otherwise
//! missing keys are a one-line error at startup naming the keys and the options.
//!
//! | `credentials` | keys from |
//! |---|---|
//! | `environment` (default) | `[s3] access_key_id` / `secret_access_key` / `session_token`, else `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN` |
//! | `static` | `[s3]` only; the `AWS_*` key variables are ignored |
//! | `instance` | the cloud's chain: web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`), container credentials (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` / `_FULL_URI`), then EC2 instance metadata; static keys are not used |
//!
//! [`resolve`] is the decision, over an environment lookup, so it is tested without
//! touching the process environment.

use lsvd_core::error::{Error, Result};

/// A credential or other secret: never printed, not even by `{:?}`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for handing to the client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The credential settings of `[s3]` (the fields of the same names in `ConfiguredKeys`).
#[derive(Debug, Clone, Default)]
pub struct ConfiguredKeys {
    pub access_key_id: Option<Secret>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
    pub credentials: Option<CredentialSource>,
}

/// Where the S3 credentials come from (`[s3] credentials`, `LSVD_S3_CREDENTIALS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialSource {
    /// `[s3]` keys, else the `AWS_*` key variables; nothing else.
    Environment,
    /// `[s3]` keys only.
    Static,
    /// The cloud's credential chain (web identity, container, instance metadata).
    Instance,
}

/// The environment variable that picks a [`CredentialSource`] when `[s3]` does not.
pub const CREDENTIALS_ENV: &str = "LSVD_S3_CREDENTIALS";

const OPTIONS: &str = "\"environment\", \"static\" or \"instance\"";

impl CredentialSource {
    /// Parse a setting's value; `what` names where it came from, for the message.
    pub fn parse(s: &str, what: &str) -> Result<CredentialSource> {
        match s {
            "environment" => Ok(CredentialSource::Environment),
            "static" => Ok(CredentialSource::Static),
            "instance" => Ok(CredentialSource::Instance),
            other => Err(Error::bad_input(format!(
                "{what}: unknown S3 credential source '{other}' (expected {OPTIONS})"
            ))),
        }
    }
}

/// What the S3 client is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Sign with these keys.
    Keys {
        access_key_id: Secret,
        secret_access_key: Secret,
        session_token: Option<Secret>,
    },
    /// Let `object_store` run the cloud's credential chain.
    Chain,
}

/// Decide the credentials from `settings` and the environment (`env` returns a
/// variable's value, `None` if unset or empty). Missing keys are one `BadInput` line
/// naming them and the options.
pub fn resolve(
    settings: &ConfiguredKeys,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Credentials> {
    let source = match settings.credentials {
        Some(s) => s,
        None => match env(CREDENTIALS_ENV) {
            Some(v) => CredentialSource::parse(&v, CREDENTIALS_ENV)?,
            None => CredentialSource::Environment,
        },
    };
    let from_config = settings.access_key_id.is_some() || settings.secret_access_key.is_some();
    if settings.access_key_id.is_some() != settings.secret_access_key.is_some() {
        return Err(Error::bad_input(
            "S3 settings: give both access_key_id and secret_access_key, or neither \
             (to use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
        ));
    }
    match source {
        CredentialSource::Instance => {
            if from_config {
                return Err(Error::bad_input(
                    "S3 credentials: credentials = \"instance\" takes them from the cloud, \
                     but [s3] access_key_id / secret_access_key are set too; remove one",
                ));
            }
            Ok(Credentials::Chain)
        }
        CredentialSource::Static => match (&settings.access_key_id, &settings.secret_access_key) {
            (Some(id), Some(secret)) => Ok(Credentials::Keys {
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
                session_token: settings.session_token.clone(),
            }),
            _ => Err(Error::bad_input(format!(
                "no S3 credentials: credentials = \"static\" but [s3] {} not set in lsvd.toml; \
                 set them, or choose credentials = {OPTIONS}",
                missing_names(
                    settings.access_key_id.is_none(),
                    settings.secret_access_key.is_none(),
                    "access_key_id",
                    "secret_access_key"
                )
            ))),
        },
        CredentialSource::Environment => {
            let id = settings
                .access_key_id
                .clone()
                .or_else(|| env("AWS_ACCESS_KEY_ID").map(Secret::new));
            let secret = settings
                .secret_access_key
                .clone()
                .or_else(|| env("AWS_SECRET_ACCESS_KEY").map(Secret::new));
            match (id, secret) {
                (Some(access_key_id), Some(secret_access_key)) => Ok(Credentials::Keys {
                    access_key_id,
                    secret_access_key,
                    session_token: settings.session_token.clone().or_else(|| {
                        if from_config {
                            None // keys from the file: a token from the environment is not theirs
                        } else {
                            env("AWS_SESSION_TOKEN").map(Secret::new)
                        }
                    }),
                }),
                (id, secret) => Err(Error::bad_input(format!(
                    "no S3 credentials: {} not set (nor [s3] access_key_id / secret_access_key \
                     in lsvd.toml); set them, or set [s3] credentials = \"instance\" (or \
                     {CREDENTIALS_ENV}=instance) to use the cloud's credential chain (web identity, \
                     container credentials, instance metadata)",
                    missing_names(
                        id.is_none(),
                        secret.is_none(),
                        "AWS_ACCESS_KEY_ID",
                        "AWS_SECRET_ACCESS_KEY"
                    )
                ))),
            }
        }
    }
}

/// "A and B are", "A is" or "B is".
fn missing_names(a_missing: bool, b_missing: bool, a: &str, b: &str) -> String {
    match (a_missing, b_missing) {
        (true, true) => format!("{a} and {b} are"),
        (true, false) => format!("{a} is"),
        _ => format!("{b} is"),
    }
}

/// Is `name` one of the variables that carry static keys (left out of the builder
/// when the credential chain is asked for, and set explicitly otherwise)?
pub fn is_key_variable(name: &str) -> bool {
    matches!(
        name,
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" | "AWS_SESSION_TOKEN" | "AWS_TOKEN"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name: &str| {
            vars.iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.clone())
        }
    }

    fn keys(id: &str, secret: &str, token: Option<&str>) -> Credentials {
        Credentials::Keys {
            access_key_id: Secret::new(id),
            secret_access_key: Secret::new(secret),
            session_token: token.map(Secret::new),
        }
    }

    fn with_file_keys(source: Option<CredentialSource>) -> ConfiguredKeys {
        ConfiguredKeys {
            access_key_id: Some(Secret::new("file-id")),
            secret_access_key: Some(Secret::new("file-secret")),
            credentials: source,
            ..ConfiguredKeys::default()
        }
    }

    #[test]
    fn environment_is_the_default_and_never_the_chain() {
        let none = ConfiguredKeys::default();
        let e = resolve(&none, &env_of(&[])).expect_err("no keys anywhere");
        let msg = e.to_string();
        assert!(
            msg.contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"),
            "{msg}"
        );
        assert!(msg.contains("credentials = \"instance\""), "{msg}");
        assert!(msg.contains("LSVD_S3_CREDENTIALS=instance"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        // One of two missing: only that one is named.
        let e = resolve(&none, &env_of(&[("AWS_ACCESS_KEY_ID", "id")])).expect_err("half");
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY is not set"),
            "{e}"
        );
        // Empty counts as unset.
        assert!(
            resolve(
                &none,
                &env_of(&[("AWS_ACCESS_KEY_ID", ""), ("AWS_SECRET_ACCESS_KEY", "")])
            )
            .is_err()
        );
        // Container or web-identity variables do not switch to the chain.
        assert!(
            resolve(
                &none,
                &env_of(&[("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds")])
            )
            .is_err()
        );
        assert_eq!(
            resolve(
                &none,
                &env_of(&[
                    ("AWS_ACCESS_KEY_ID", "id"),
                    ("AWS_SECRET_ACCESS_KEY", "secret"),
                    ("AWS_SESSION_TOKEN", "tok"),
                ])
            )
            .expect("keys"),
            keys("id", "secret", Some("tok"))
        );
    }

    #[test]
    fn file_keys_win_over_the_environment() {
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "env-id"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_SESSION_TOKEN", "env-token"),
        ]);
        assert_eq!(
            resolve(&with_file_keys(None), &env).expect("keys"),
            keys("file-id", "file-secret", None),
            "the environment's token does not go with the file's keys"
        );
        assert_eq!(
            resolve(
                &with_file_keys(Some(CredentialSource::Static)),
                &env_of(&[])
            )
            .expect("keys"),
            keys("file-id", "file-secret", None)
        );
    }

    #[test]
    fn static_takes_the_file_only() {
        let s = ConfiguredKeys {
            credentials: Some(CredentialSource::Static),
            ..ConfiguredKeys::default()
        };
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "env-id"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
        ]);
        let e = resolve(&s, &env).expect_err("static ignores AWS_*");
        assert!(
            e.to_string()
                .contains("[s3] access_key_id and secret_access_key are not set"),
            "{e}"
        );
    }

    #[test]
    fn instance_is_the_chain_only_when_asked_for() {
        let s = ConfiguredKeys {
            credentials: Some(CredentialSource::Instance),
            ..ConfiguredKeys::default()
        };
        assert_eq!(
            resolve(&s, &env_of(&[])).expect("chain"),
            Credentials::Chain
        );
        assert_eq!(
            resolve(
                &ConfiguredKeys::default(),
                &env_of(&[("LSVD_S3_CREDENTIALS", "instance")])
            )
            .expect("chain"),
            Credentials::Chain
        );
        // The file's choice wins over the variable.
        assert_eq!(
            resolve(
                &with_file_keys(Some(CredentialSource::Static)),
                &env_of(&[("LSVD_S3_CREDENTIALS", "instance")])
            )
            .expect("keys"),
            keys("file-id", "file-secret", None)
        );
        let e = resolve(
            &with_file_keys(Some(CredentialSource::Instance)),
            &env_of(&[]),
        )
        .expect_err("both");
        assert!(e.to_string().contains("remove one"), "{e}");
        let e = resolve(
            &ConfiguredKeys::default(),
            &env_of(&[("LSVD_S3_CREDENTIALS", "imds")]),
        )
        .expect_err("unknown");
        assert!(
            e.to_string()
                .contains("unknown S3 credential source 'imds' (expected \"environment\", \"static\" or \"instance\")"),
            "{e}"
        );
    }
}
