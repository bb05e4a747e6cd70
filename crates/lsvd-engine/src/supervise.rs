//! A volume's tasks and threads fail the volume when they panic.
//!
//! Why: a detached task that panics just ends. The volume would go on half-alive
//! (uploads stopped, writes piling into the write log until it is full, a GC that no
//! longer runs) and a shutdown could still mark it clean. Every task and thread of a
//! volume runs through here instead: a panic fails the volume (`Shared::fail`: every
//! request gets EIO, the log names the task and the panic's message), so shutdown
//! refuses to mark it clean and `lsvd serve` exits non-zero once every volume failed.
//! The state lock does the same when it finds itself poisoned (`Shared::lock`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::shared::Shared;

/// Spawn `fut` as `shared`'s task `task` (named in the failure): a panic in it fails
/// the volume. Aborting the handle aborts the task.
pub(crate) fn spawn<F>(
    shared: &Arc<Shared>,
    task: &'static str,
    fut: F,
) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Err(panic) = (CatchUnwind {
            inner: Box::pin(fut),
        })
        .await
        {
            failed_by_panic(&shared, task, panic.as_ref());
        }
    })
}

/// Run `f` (a thread's body) for `shared`: a panic in it fails the volume.
pub(crate) fn run_thread(shared: &Shared, thread: &'static str, f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(f)) {
        failed_by_panic(shared, thread, panic.as_ref());
    }
}

fn failed_by_panic(shared: &Shared, task: &str, panic: &(dyn std::any::Any + Send)) {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    shared.fail_by_panic(&format!("its {task} panicked: {message}"));
}

/// A future whose panics are caught: `Err(panic payload)`.
struct CatchUnwind<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.get_mut().inner.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Test hooks: a panic injected at a named point of one volume's tasks.
#[cfg(test)]
impl Shared {
    /// Panic at the next [`Shared::panic_point`] named `point`.
    pub(crate) fn inject_panic(&self, point: &'static str) {
        *self
            .injected_panic
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(point);
    }
}

impl Shared {
    /// Where a test may inject a panic ([`Shared::inject_panic`]); nothing outside
    /// tests.
    #[inline]
    pub(crate) fn panic_point(&self, point: &'static str) {
        #[cfg(test)]
        {
            let armed = {
                let mut injected = self
                    .injected_panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if *injected == Some(point) {
                    injected.take()
                } else {
                    None
                }
            };
            if armed.is_some() {
                panic!("injected panic at {point}");
            }
        }
        #[cfg(not(test))]
        let _ = point;
    }
}
