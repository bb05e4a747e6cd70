//! What an `object_store` error from a cloud service means for lsvd, and how to say it.
//!
//! The cloud stores ([`super::cloud`]) turn every `object_store` error into one of our
//! kinds (`NotFound`, `AlreadyExists`, `Transient`, `Full`, `Denied`, `Permanent`)
//! with a one-line message for the operator. The services disagree in the details, so
//! the mapping takes the [`Service`]:
//!
//! * Out of room (`Full`): HTTP `507 Insufficient Storage` (versitygw's answer to
//!   `ENOSPC`, MinIO's `XMinioStorageFull`), and the quota codes whatever their status
//!   (`QuotaExceeded`: versitygw's `EDQUOT` and Ceph RGW, a `403`; MinIO's
//!   `XMinioAdminBucketQuotaExceeded`; GCS's `quotaExceeded` reason).
//! * Refused (`Denied`): `401` and `403` (other than a quota), and the credential codes
//!   some services send with another status (S3 `ExpiredToken` and `InvalidToken` are
//!   `400`s).
//! * `EntityTooLarge` (`400`) is `Permanent`: a limit on one object's size, which no
//!   amount of freed space changes.
//!
//! * A failed put-if-absent is `412 Precondition Failed` on S3 and GCS, and
//!   `409 Conflict` (`BlobAlreadyExists`) on Azure and Azurite (`412` on Azure too when
//!   the condition is checked late). On S3 (and GCS, which does not send it for this)
//!   a `409` means "a conflicting conditional write is in progress": not yet proof the
//!   key exists, so `Transient`.
//! * A `404` is "no such object" only when the service says so (or says nothing, as
//!   for `HEAD`): a missing bucket or container, or an unknown access key, must not
//!   read as "no volume here".
//!
//! It lives apart from the store so the tables can be read (and tested) in one place.
//! The helpers that scrub secrets out of messages live here too: every message built
//! from an `object_store` error passes through [`scrub`].

use object_store::client::{HttpError, HttpErrorKind};

use lsvd_core::error::ErrorKind;

/// Which cloud service a store talks to: decides error details and message wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// S3 and S3-compatible servers (`s3://`).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`az://`).
    Azure,
}

impl Service {
    /// The short name messages start with.
    pub fn name(self) -> &'static str {
        match self {
            Service::S3 => "S3",
            Service::Gcs => "GCS",
            Service::Azure => "Azure",
        }
    }

    /// The URL scheme, without `://`.
    pub fn scheme(self) -> &'static str {
        match self {
            Service::S3 => "s3",
            Service::Gcs => "gs",
            Service::Azure => "az",
        }
    }

    /// What the first URL component names.
    pub fn container_word(self) -> &'static str {
        match self {
            Service::S3 | Service::Gcs => "bucket",
            Service::Azure => "container",
        }
    }

    fn credentials_hint(self) -> &'static str {
        match self {
            Service::S3 => "check the access key, secret and bucket permissions",
            Service::Gcs => "check the service account and bucket permissions",
            Service::Azure => "check the account name, key and container permissions",
        }
    }

    /// `Full` or `Denied` from what the service said (its error code, its status), if
    /// either: checked before everything else, since a quota comes as a `403` and an
    /// expired token as a `400`.
    fn full_or_denied(self, text: &str, status: Option<u16>) -> Option<(ErrorKind, &'static str)> {
        let code = xml_error(text).map(|(code, _)| code);
        let gcs_quota = self == Service::Gcs && text.contains("\"quotaExceeded\"");
        if status == Some(507) || gcs_quota || code.is_some_and(|c| FULL_CODES.contains(&c)) {
            return Some((ErrorKind::Full, FULL_HINT));
        }
        if code.is_some_and(|c| DENIED_CODES.contains(&c)) {
            return Some((ErrorKind::Denied, self.credentials_hint()));
        }
        None
    }

    fn missing_container_hint(self) -> &'static str {
        match self {
            Service::S3 | Service::Gcs => "the bucket does not exist",
            Service::Azure => "the container does not exist",
        }
    }

    /// Does a `409 Conflict` on put-if-absent mean "retry: another conditional write
    /// is in flight" (S3, GCS) rather than "the key exists" (Azure)?
    pub fn conflict_is_in_progress(self) -> bool {
        !matches!(self, Service::Azure)
    }
}

/// Error codes saying the object is missing (S3 `NoSuchKey`, Azure `BlobNotFound`).
const MISSING_OBJECT_CODES: [&str; 2] = ["NoSuchKey", "BlobNotFound"];
/// Error codes saying the bucket or container is missing.
const MISSING_CONTAINER_CODES: [&str; 2] = ["NoSuchBucket", "ContainerNotFound"];

/// Error codes saying the service is out of room or over a quota: [`ErrorKind::Full`].
const FULL_CODES: [&str; 4] = [
    "QuotaExceeded",
    "InsufficientStorage",
    "XMinioStorageFull",
    "XMinioAdminBucketQuotaExceeded",
];
/// Error codes saying the credentials or the request's authorization are refused,
/// whatever the status they come with: [`ErrorKind::Denied`].
const DENIED_CODES: [&str; 23] = [
    // S3 and S3-compatible servers (versitygw answers an unknown key id with a 404
    // XAdminUserNotFound).
    "AccessDenied",
    "AccountProblem",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidSecurity",
    "InvalidToken",
    "RequestTimeTooSkewed",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
    "XAdminUserNotFound",
    "XMinioInvalidIAMCredentials",
    // Azure.
    "AccountIsDisabled",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "AuthorizationProtocolMismatch",
    "AuthorizationResourceTypeMismatch",
    "AuthorizationServiceMismatch",
    "AuthorizationSourceIPMismatch",
    "InsufficientAccountPermissions",
    "InvalidAuthenticationInfo",
    "NoAuthenticationInformation",
];

/// The hint for an error that says the service has no room for it.
const FULL_HINT: &str =
    "the service is out of space or over a quota: make room, or raise the quota";

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

/// At most `max` bytes of `text` (on a character boundary), saying how much was cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// `scheme://user:pass@host:port/path` → `scheme://host:port/path`.
pub(crate) fn strip_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The whole chain of error messages, outermost first.
pub(crate) fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
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
pub(crate) fn status_in(text: &str) -> Option<u16> {
    let i = text.find("status code: ")? + "status code: ".len();
    text.get(i..i + 3)?.parse().ok()
}

/// `(Code, Message)` of an XML error document (S3 and Azure both send
/// `<Error><Code>…</Code><Message>…</Message>…`) in `text`.
pub(crate) fn xml_error(text: &str) -> Option<(&str, &str)> {
    let between = |open: &str, close: &str| -> Option<&str> {
        let i = text.find(open)? + open.len();
        let j = text[i..].find(close)? + i;
        Some(text[i..j].trim())
    };
    let code = between("<Code>", "</Code>")?;
    Some((code, between("<Message>", "</Message>").unwrap_or("")))
}

/// The `"message"` of a JSON error document (GCS: `{"error":{"code":404,"message":"…"}}`).
pub(crate) fn json_message(text: &str) -> Option<&str> {
    let i = text.find("\"message\"")? + "\"message\"".len();
    let rest = text[i..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    // Up to the first unescaped quote; escapes stay as they are (a message, not data).
    let mut prev = ' ';
    for (j, c) in rest.char_indices() {
        if c == '"' && prev != '\\' {
            return Some(&rest[..j]);
        }
        prev = c;
    }
    None
}

/// A `409` that `service` means as "retry later" (see [`Service::conflict_is_in_progress`]).
pub(crate) fn is_conflict(service: Service, e: &object_store::Error) -> bool {
    service.conflict_is_in_progress() && status_in(&chain_text(e)) == Some(409)
}

/// A ranged GET that starts at or after the end of the object: a `416` (S3, GCS), or
/// `object_store`'s own check of a `206` with no bytes (Azurite answers so).
pub(crate) fn is_range_not_satisfiable(e: &object_store::Error) -> bool {
    let text = chain_text(e);
    status_in(&text) == Some(416)
        || text.contains("InvalidRange")
        || (text.contains("Wanted range starting at") && text.contains("but object was only"))
}

/// A 404 (an `object_store` `NotFound`, or a bare status): a missing object, or
/// something worse?
fn classify_not_found(service: Service, text: &str) -> (ErrorKind, Option<&'static str>) {
    match xml_error(text).map(|(code, _)| code) {
        Some(code) if MISSING_CONTAINER_CODES.contains(&code) => {
            (ErrorKind::Permanent, Some(service.missing_container_hint()))
        }
        None | Some(_)
            if text.contains("bucket does not exist")
                || text.contains("Bucket not found")
                || text.contains("bucket not found") =>
        {
            (ErrorKind::Permanent, Some(service.missing_container_hint()))
        }
        None => (ErrorKind::NotFound, None),
        Some(code) if MISSING_OBJECT_CODES.contains(&code) => (ErrorKind::NotFound, None),
        Some(code) if DENIED_CODES.contains(&code) => {
            (ErrorKind::Denied, Some(service.credentials_hint()))
        }
        Some(_) => (
            ErrorKind::Permanent,
            Some("not a missing object: check the credentials and the endpoint"),
        ),
    }
}

/// Map an `object_store` error from `service` to our kinds, with a hint for the
/// operator.
pub(crate) fn classify(
    service: Service,
    e: &object_store::Error,
) -> (ErrorKind, Option<&'static str>) {
    use object_store::Error as E;
    let text = chain_text(e);
    let status = status_in(&text);
    if !matches!(e, E::NotFound { .. })
        && let Some((kind, hint)) = service.full_or_denied(&text, status)
    {
        return (kind, Some(hint));
    }
    match e {
        E::NotFound { .. } => classify_not_found(service, &text),
        E::AlreadyExists { .. } if status == Some(409) => {
            if service.conflict_is_in_progress() {
                // A concurrent conditional write is still in progress; it may fail,
                // so this is not (yet) proof the key exists.
                (
                    ErrorKind::Transient,
                    Some("a conflicting conditional write is in progress"),
                )
            } else {
                match xml_error(&text).map(|(code, _)| code) {
                    None | Some("BlobAlreadyExists") => (ErrorKind::AlreadyExists, None),
                    Some(_) => (ErrorKind::Permanent, None),
                }
            }
        }
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            (ErrorKind::AlreadyExists, None)
        }
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            (ErrorKind::Denied, Some(service.credentials_hint()))
        }
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
                    403 | 401 => (ErrorKind::Denied, Some(service.credentials_hint())),
                    404 => match classify_not_found(service, &text) {
                        // A bare 404 outside `NotFound` is never a plain missing object.
                        (ErrorKind::NotFound, _) => (ErrorKind::Permanent, None),
                        other => other,
                    },
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
            // A 200 answer with an error body, a broken listing, a task failure:
            // nothing says retrying is pointless.
            (ErrorKind::Transient, None)
        }
    }
}

#[cfg(test)]
mod tests;
