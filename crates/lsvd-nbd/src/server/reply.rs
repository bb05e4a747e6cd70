//! Replies, and answering a request from outside the server's tasks.
//!
//! Every reply of a connection goes through one bounded queue to its writer task
//! (`session::write_replies`). Most requests are executed on a task of their own, which
//! queues the reply when the device's future completes. A device that keeps a queue of
//! its own (lsvd's log writer) can instead take a request with a [`Completion`] and
//! answer it from wherever the work finishes: no task is spawned for the request, and
//! no task has to be woken to answer it, which at 4 KiB and a deep queue is much of what
//! a write costs ([`crate::BlockDevice::start`]).

use std::io;

use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::proto::consts::*;
use crate::proto::transmission::*;

/// Payload bytes a request holds, on its connection and on the server, until its
/// reply is written (`Limits::max_in_flight_bytes`, `Limits::max_server_in_flight_bytes`).
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) _connection: OwnedSemaphorePermit,
    pub(crate) _server: OwnedSemaphorePermit,
}

/// One reply, ready for the writer: `header` then `data` go out back to back.
pub(crate) struct Reply {
    pub(crate) header: Vec<u8>,
    pub(crate) data: Vec<u8>,
    /// Payload budget held until the data has been written.
    pub(crate) budget: Option<Budget>,
}

/// `reply` turned into the error `e` (its errno, EIO for most): the same cookie, no
/// data. Replies are encoded already; the cookie sits at bytes 8..16 of a simple reply
/// and of a structured chunk alike.
pub(crate) fn refused(reply: &Reply, structured: bool, e: &io::Error) -> Reply {
    let cookie = reply
        .header
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes);
    error_reply(cookie, structured, error_code(e), &e.to_string())
}

/// The reply to a request without payload that succeeded.
pub(crate) fn done_reply(cookie: u64) -> Reply {
    let mut header = Vec::with_capacity(SIMPLE_REPLY_HEADER_LEN);
    // A simple reply is allowed for payload-less success even with structured replies.
    encode_simple_reply(&mut header, 0, cookie);
    Reply {
        header,
        data: Vec::new(),
        budget: None,
    }
}

pub(crate) fn read_reply(cookie: u64, structured: bool, offset: u64, data: Vec<u8>) -> Reply {
    let mut header = Vec::with_capacity(CHUNK_HEADER_LEN + 8);
    if !structured {
        encode_simple_reply(&mut header, 0, cookie);
    } else if data.is_empty() {
        // OFFSET_DATA must carry at least one byte.
        encode_none_chunk(&mut header, cookie);
    } else if encode_offset_data_header(&mut header, cookie, offset, data.len(), true).is_err() {
        return error_reply(cookie, structured, EOVERFLOW, "read too large");
    }
    Reply {
        header,
        data,
        budget: None,
    }
}

pub(crate) fn error_reply(cookie: u64, structured: bool, error: u32, message: &str) -> Reply {
    let mut header = Vec::new();
    // Error value 0 would read as success; never send it for a failure.
    let error = if error == 0 { EIO } else { error };
    if structured {
        encode_error_chunk(&mut header, cookie, error, message, true);
    } else {
        encode_simple_reply(&mut header, error, cookie);
    }
    Reply {
        header,
        data: Vec::new(),
        budget: None,
    }
}

/// The reply of the request `(cookie, structured)` for `result`.
pub(crate) fn result_reply(cookie: u64, structured: bool, result: &io::Result<()>) -> Reply {
    match result {
        Ok(()) => done_reply(cookie),
        Err(e) => error_reply(cookie, structured, error_code(e), &e.to_string()),
    }
}

/// When a request came in, to count it in its export's numbers once answered.
pub(crate) struct Timing {
    pub(crate) stats: std::sync::Arc<super::request_stats::RequestStats>,
    pub(crate) kind: usize,
    pub(crate) received: std::time::Instant,
}

impl Timing {
    /// The request is answered now.
    pub(crate) fn done(&self) {
        self.stats.record(self.kind, self.received.elapsed());
    }
}

/// A request a device may take with [`crate::BlockDevice::start`]: the commands that
/// carry no reply data. Lengths are non-zero; the server answers empty ones itself.
#[derive(Debug)]
pub enum StartOp {
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes(crate::ZeroRequest),
}

/// The answer to one request a device took with [`crate::BlockDevice::start`]: call
/// [`Completion::complete`] once, from any thread, when the request is done.
///
/// It holds the connection's bounds for the request (its place among the requests in
/// flight, its payload budget) until then. Dropped without an answer (the device lost
/// the request, say its worker ended), it answers EIO, so a client is never left
/// waiting for a reply that will not come.
pub struct Completion {
    cookie: u64,
    /// Counted in the export's request numbers when answered.
    timing: Option<Timing>,
    structured: bool,
    replies: mpsc::Sender<Reply>,
    budget: Option<Budget>,
    in_flight: Option<OwnedSemaphorePermit>,
    answered: bool,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("cookie", &self.cookie)
            .finish_non_exhaustive()
    }
}

impl Completion {
    pub(crate) fn new(
        cookie: u64,
        structured: bool,
        replies: mpsc::Sender<Reply>,
        (budget, in_flight): (Option<Budget>, OwnedSemaphorePermit),
        timing: Option<Timing>,
    ) -> Self {
        Completion {
            cookie,
            timing,
            structured,
            replies,
            budget,
            in_flight: Some(in_flight),
            answered: false,
        }
    }

    /// A request the device declined: the server runs it on a task, under the same
    /// bounds.
    pub(crate) fn into_permits(mut self) -> (Option<Budget>, OwnedSemaphorePermit, Option<Timing>) {
        self.answered = true;
        let in_flight = self
            .in_flight
            .take()
            .expect("a completion holds its in-flight permit until it answers");
        (self.budget.take(), in_flight, self.timing.take())
    }

    /// Answer the request with `result`.
    pub fn complete(mut self, result: io::Result<()>) {
        self.answer(&result);
    }

    fn answer(&mut self, result: &io::Result<()>) {
        self.answered = true;
        if let Some(t) = self.timing.take() {
            t.done();
        }
        let mut reply = result_reply(self.cookie, self.structured, result);
        reply.budget = self.budget.take();
        let in_flight = self.in_flight.take();
        match self.replies.try_send(reply) {
            // Queued, or the connection is gone (and the client with it).
            Ok(()) | Err(TrySendError::Closed(_)) => drop(in_flight),
            // The queue holds more replies than requests may be in flight only when
            // error replies to refused requests crowd it: wait for room off this thread.
            Err(TrySendError::Full(reply)) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let replies = self.replies.clone();
                    runtime.spawn(async move {
                        let _ = replies.send(reply).await;
                        drop(in_flight);
                    });
                }
                Err(_) => {
                    let _ = self.replies.blocking_send(reply);
                    drop(in_flight);
                }
            },
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.answered {
            self.answer(&Err(io::Error::other(
                "the device dropped the request without answering it",
            )));
        }
    }
}
