//! Tests of the error tables: every status and error document each service sends
//! for the cases lsvd tells apart.

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
        assert_eq!(k(s3, e), ErrorKind::Denied);
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
            ErrorKind::Denied,
        ),
        (
            "status code: 404 Not Found: <Error><Code>SomethingElse</Code></Error>",
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

/// An error as `object_store` reports a status it does not retry (403 ->
/// `PermissionDenied`, 401 -> `Unauthenticated`, others `Generic`), with `body`.
fn status(code: u16, body: &'static str) -> E {
    let text: &'static str = Box::leak(
        format!("Server returned non-2xx status code: {code} X: {body}").into_boxed_str(),
    );
    match code {
        403 => E::PermissionDenied {
            path: p(),
            source: src(text),
        },
        401 => E::Unauthenticated {
            path: p(),
            source: src(text),
        },
        _ => generic(text),
    }
}

/// Out of room is `Full` and refused credentials are `Denied`, on every service and
/// whatever status they come with; throttling and server errors stay `Transient`. The
/// bodies are what the servers send: versitygw answers `ENOSPC` with
/// `507 InsufficientStorage` and `EDQUOT` with `403 QuotaExceeded` (its
/// s3err/s3err.go), Ceph RGW a quota with `403 QuotaExceeded`, MinIO a full disk with
/// `507 XMinioStorageFull`. A `403` was `Permanent` and a `507` `Transient` before:
/// neither told the engine that retrying was pointless.
#[test]
fn maps_full_and_denied_answers() {
    let xml = |code: &str| -> &'static str {
        Box::leak(
            format!(
                "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>"
            )
            .into_boxed_str(),
        )
    };
    for service in [Service::S3, Service::Gcs, Service::Azure] {
        for (code, body, want) in [
            (507, xml("InsufficientStorage"), ErrorKind::Full),
            (507, xml("XMinioStorageFull"), ErrorKind::Full),
            (507, "", ErrorKind::Full),
            (403, xml("QuotaExceeded"), ErrorKind::Full),
            (400, xml("XMinioAdminBucketQuotaExceeded"), ErrorKind::Full),
            (403, xml("AccessDenied"), ErrorKind::Denied),
            (403, xml("SignatureDoesNotMatch"), ErrorKind::Denied),
            (403, xml("InvalidAccessKeyId"), ErrorKind::Denied),
            (403, xml("RequestTimeTooSkewed"), ErrorKind::Denied),
            (403, "", ErrorKind::Denied),
            (401, "", ErrorKind::Denied),
            (400, xml("ExpiredToken"), ErrorKind::Denied),
            (400, xml("InvalidToken"), ErrorKind::Denied),
            (403, xml("AuthenticationFailed"), ErrorKind::Denied),
            (
                403,
                xml("AuthorizationPermissionMismatch"),
                ErrorKind::Denied,
            ),
            (400, xml("EntityTooLarge"), ErrorKind::Permanent),
            (400, xml("InvalidArgument"), ErrorKind::Permanent),
            (503, xml("SlowDown"), ErrorKind::Transient),
            (500, xml("InternalError"), ErrorKind::Transient),
            (429, "", ErrorKind::Transient),
            (408, "", ErrorKind::Transient),
        ] {
            assert_eq!(
                k(service, status(code, body)),
                want,
                "{service:?} {code} {body}"
            );
        }
        // The hint says what to do.
        let (_, hint) = classify(service, &status(507, xml("InsufficientStorage")));
        assert_eq!(hint, Some(FULL_HINT));
        let (_, hint) = classify(service, &status(403, xml("SignatureDoesNotMatch")));
        assert_eq!(hint, Some(service.credentials_hint()));
    }
    // GCS sends JSON: a storage quota is a 403 with the reason quotaExceeded; a rate
    // limit is a 429 (or a 403 rateLimitExceeded), which passes.
    let gcs = Service::Gcs;
    let quota = r#"{"error":{"code":403,"message":"Quota exceeded","errors":[{"reason":"quotaExceeded"}]}}"#;
    assert_eq!(k(gcs, status(403, quota)), ErrorKind::Full);
    let forbidden =
        r#"{"error":{"code":403,"message":"x does not have storage.objects.create access"}}"#;
    assert_eq!(k(gcs, status(403, forbidden)), ErrorKind::Denied);
    let rate =
        r#"{"error":{"code":429,"message":"rate","errors":[{"reason":"rateLimitExceeded"}]}}"#;
    assert_eq!(k(gcs, status(429, rate)), ErrorKind::Transient);
    // A missing object is never read as out of room or refused.
    assert_eq!(
        k(
            Service::S3,
            nf("status code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>")
        ),
        ErrorKind::NotFound
    );
}
