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
