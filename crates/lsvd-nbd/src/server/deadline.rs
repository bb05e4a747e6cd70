//! The idle timeout as both halves of a connection apply it: a socket read or write
//! that waits longer than the limit for the client ends the connection. Its own module
//! because the reader loop (session.rs) and the reply writer (reply_writer.rs) both
//! use it and neither should import the other for it.

use std::future::Future;
use std::io;
use std::task::Poll;
use std::time::Duration;

/// `work`, failing with `TimedOut` (saying `what`) if it takes longer than `limit`.
/// Work that is done at once never touches a timer (the common case for a reply
/// written into the writer's buffer).
pub(super) async fn within<T>(
    limit: Option<Duration>,
    work: impl Future<Output = io::Result<T>>,
    what: impl FnOnce() -> String,
) -> io::Result<T> {
    let mut work = std::pin::pin!(work);
    let Some(limit) = limit else {
        return work.await;
    };
    if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
        return r;
    }
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, what())))
}
