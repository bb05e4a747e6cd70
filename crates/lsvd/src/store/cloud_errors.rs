//! What an `object_store` error from a cloud service means for lsvd, and how to say it.
//!
//! The cloud stores ([`super::cloud`]) turn every `object_store` error into one of our
//! kinds (`NotFound`, `AlreadyExists`, `Transient`, `Permanent`) with a one-line
//! message for the operator. The services disagree in the details, so the mapping
//! takes the [`Service`]:
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

use crate::error::ErrorKind;

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
            (ErrorKind::Permanent, Some(service.credentials_hint()))
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
                    403 | 401 => (ErrorKind::Permanent, Some(service.credentials_hint())),
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
mod tests {
    use super::*;
    use object_store::Error as E;

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
    fn p() -> String {
        "k".to_string()
    }
    fn k(service: Service, e: E) -> ErrorKind {
        classify(service, &e).0
    }
    fn generic(m: &'static str) -> E {
        E::Generic {
            store: "S3",
            source: src(m),
        }
    }
    fn nf(body: &'static str) -> E {
        E::NotFound {
            path: p(),
            source: src(body),
        }
    }

    #[test]
    fn maps_s3_errors() {
        let s3 = Service::S3;
        assert_eq!(k(s3, nf("x")), ErrorKind::NotFound);
        assert_eq!(
            k(
                s3,
                E::Precondition {
                    path: p(),
                    source: src("Server returned non-2xx status code: 412 Precondition Failed: ")
                }
            ),
            ErrorKind::AlreadyExists
        );
        let exists = |m: &'static str| E::AlreadyExists {
            path: p(),
            source: src(m),
        };
        assert_eq!(k(s3, exists("x")), ErrorKind::AlreadyExists);
        let busy = "Server returned non-2xx status code: 409 Conflict: busy";
        assert_eq!(k(s3, exists(busy)), ErrorKind::Transient);
        assert_eq!(k(Service::Gcs, exists(busy)), ErrorKind::Transient);
        for e in [
            E::PermissionDenied {
                path: p(),
                source: src("x"),
            },
            E::Unauthenticated {
                path: p(),
                source: src("x"),
            },
        ] {
            assert_eq!(k(s3, e), ErrorKind::Permanent);
        }
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
            (
                "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>",
                ErrorKind::Permanent,
            ),
        ] {
            assert_eq!(k(s3, generic(m)), want, "{m}");
        }
        let conn = E::Generic {
            store: "S3",
            source: Box::new(HttpError::new(HttpErrorKind::Connect, Msg("refused"))),
        };
        assert_eq!(k(s3, conn), ErrorKind::Transient);
        let timeout = E::Generic {
            store: "S3",
            source: Box::new(HttpError::new(HttpErrorKind::Timeout, Msg("slow"))),
        };
        assert_eq!(k(s3, timeout), ErrorKind::Transient);
        assert!(is_range_not_satisfiable(&generic(
            "Server returned non-2xx status code: 416 Range Not Satisfiable: "
        )));
        assert!(is_range_not_satisfiable(&generic(
            "Wanted range starting at 10000, but object was only 10000 bytes long"
        )));
        assert!(!is_range_not_satisfiable(&generic("503 slow down")));
        let conflict = generic("Server returned non-2xx status code: 409 Conflict: ");
        assert!(is_conflict(s3, &conflict));
        assert!(is_conflict(Service::Gcs, &conflict));
        assert!(!is_conflict(Service::Azure, &conflict));
        assert_eq!(status_in("status code: 5"), None);
        for (body, want) in [
            (
                "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>",
                ErrorKind::NotFound,
            ),
            (
                "Server returned non-2xx status code: 404 Not Found: ",
                ErrorKind::NotFound,
            ),
            (
                "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>",
                ErrorKind::Permanent,
            ),
            (
                "status code: 404 Not Found: <Error><Code>XAdminUserNotFound</Code><Message>No user</Message></Error>",
                ErrorKind::Permanent,
            ),
        ] {
            assert_eq!(k(s3, nf(body)), want, "{body}");
        }
        assert_eq!(
            xml_error(
                "x <Error><Code>SignatureDoesNotMatch</Code><Message> bad sig </Message><StringToSign>..."
            ),
            Some(("SignatureDoesNotMatch", "bad sig"))
        );
        assert_eq!(xml_error("plain text"), None);
    }

    /// Azure (and Azurite) answer a taken key with 409 BlobAlreadyExists; object_store
    /// reports it as `AlreadyExists`, and it is final, not "in progress".
    #[test]
    fn maps_azure_errors() {
        let az = Service::Azure;
        let exists = |m: &'static str| E::AlreadyExists {
            path: p(),
            source: src(m),
        };
        assert_eq!(
            k(
                az,
                exists(
                    "Server returned non-2xx status code: 409 Conflict: <?xml version=\"1.0\"?>\
                     <Error><Code>BlobAlreadyExists</Code><Message>The specified blob already exists.</Message></Error>"
                )
            ),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            k(
                az,
                exists("Server returned non-2xx status code: 409 Conflict: ")
            ),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            k(
                az,
                exists(
                    "Server returned non-2xx status code: 412 Precondition Failed: <Error><Code>ConditionNotMet</Code></Error>"
                )
            ),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            k(
                az,
                exists(
                    "Server returned non-2xx status code: 409 Conflict: <Error><Code>LeaseIdMissing</Code></Error>"
                )
            ),
            ErrorKind::Permanent
        );
        assert_eq!(
            k(
                az,
                nf("status code: 404 Not Found: <Error><Code>BlobNotFound</Code></Error>")
            ),
            ErrorKind::NotFound
        );
        let (kind, hint) = classify(
            az,
            &nf("status code: 404 Not Found: <Error><Code>ContainerNotFound</Code></Error>"),
        );
        assert_eq!(
            (kind, hint),
            (ErrorKind::Permanent, Some("the container does not exist"))
        );
    }

    #[test]
    fn maps_gcs_errors() {
        let gcs = Service::Gcs;
        assert_eq!(
            k(
                gcs,
                nf(
                    r#"status code: 404 Not Found: {"error":{"code":404,"message":"No such object: b/k"}}"#
                )
            ),
            ErrorKind::NotFound
        );
        assert_eq!(
            k(
                gcs,
                nf(
                    r#"status code: 404 Not Found: {"error":{"code":404,"message":"The specified bucket does not exist."}}"#
                )
            ),
            ErrorKind::Permanent
        );
        assert_eq!(
            json_message(r#"{"error":{"code":412,"message" : "Precondition \"x\" failed"}}"#),
            Some(r#"Precondition \"x\" failed"#)
        );
        assert_eq!(json_message("no json"), None);
    }

    #[test]
    fn scrubs_and_shortens_messages() {
        let s = scrub(
            "auth AKIAEXAMPLE sig with s3cr3tvalue and s3cr3tvalue",
            &["AKIAEXAMPLE".into(), "s3cr3tvalue".into()],
        );
        assert_eq!(s, "auth [redacted] sig with [redacted] and [redacted]");
        assert!(truncate(&"é".repeat(10), 5).starts_with("éé"));
        assert_eq!(truncate("short", 10), "short");
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
}
