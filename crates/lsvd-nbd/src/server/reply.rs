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
    pub(crate) header: Header,
    pub(crate) data: Vec<u8>,
    /// Payload budget held until the data has been written.
    pub(crate) budget: Option<Budget>,
}

/// A reply's header. The replies of successful writes and reads, nearly every reply,
/// are kept as the few numbers they are made of and encoded by the writer straight
/// into its batch: a header `Vec` per reply was one heap allocation per request.
/// Errors and BLOCK_STATUS chunks, whose size varies, come encoded.
pub(crate) enum Header {
    /// A simple reply without error: success of a request without reply data, and of
    /// a READ on a session without structured replies (the data follows).
    Done { cookie: u64 },
    /// The one `NBD_REPLY_TYPE_OFFSET_DATA` chunk (flag DONE) of a READ of
    /// `data_len` bytes at `offset`, `data_len` between 1 and `u32::MAX - 8`.
    OffsetData { cookie: u64, offset: u64 },
    /// Encoded already.
    Encoded(Vec<u8>),
}

impl Header {
    /// The request's cookie. An encoded header has it at bytes 8..16, in a simple
    /// reply and a structured chunk alike.
    pub(crate) fn cookie(&self) -> u64 {
        match self {
            Header::Done { cookie } | Header::OffsetData { cookie, .. } => *cookie,
            Header::Encoded(bytes) => bytes
                .get(8..16)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_be_bytes),
        }
    }

    /// Append the header of a reply carrying `data_len` bytes of data to `out`.
    pub(crate) fn encode(&self, data_len: usize, out: &mut Vec<u8>) {
        match self {
            // A simple reply is allowed for payload-less success even with structured
            // replies.
            Header::Done { cookie } => encode_simple_reply(out, 0, *cookie),
            Header::OffsetData { cookie, offset } => {
                // `read_reply` checked the length.
                let encoded = encode_offset_data_header(out, *cookie, *offset, data_len, true);
                debug_assert!(encoded.is_ok(), "read_reply checks the length");
            }
            Header::Encoded(bytes) => out.extend_from_slice(bytes),
        }
    }
}

/// `reply` turned into the error `e` (its errno, EIO for most): the same cookie, no
/// data.
pub(crate) fn refused(reply: &Reply, structured: bool, e: &io::Error) -> Reply {
    error_reply(
        reply.header.cookie(),
        structured,
        error_code(e),
        &e.to_string(),
    )
}

/// The reply to a request without payload that succeeded.
pub(crate) fn done_reply(cookie: u64) -> Reply {
    Reply {
        header: Header::Done { cookie },
        data: Vec::new(),
        budget: None,
    }
}

pub(crate) fn read_reply(cookie: u64, structured: bool, offset: u64, data: Vec<u8>) -> Reply {
    let header = if !structured {
        Header::Done { cookie }
    } else if data.is_empty() {
        // OFFSET_DATA must carry at least one byte.
        let mut header = Vec::with_capacity(CHUNK_HEADER_LEN);
        encode_none_chunk(&mut header, cookie);
        Header::Encoded(header)
    } else if u32::try_from(data.len()).is_ok_and(|n| n.checked_add(8).is_some()) {
        Header::OffsetData { cookie, offset }
    } else {
        return error_reply(cookie, structured, EOVERFLOW, "read too large");
    };
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
        header: Header::Encoded(header),
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
