//! NBD (Network Block Device) protocol support for lsvd.
//!
//! Two layers, kept apart so the protocol can be tested without sockets:
//! - `proto`: sans-I/O parsing and encoding of the handshake and transmission phases
//!   (fixed newstyle, structured replies, meta contexts).
//! - `server`: a tokio connection loop that drives `proto` and dispatches commands to a
//!   [`BlockDevice`], many requests in flight, replies out of order.
//! - `mem_device`: an in-memory [`BlockDevice`], the reference implementation of the trait,
//!   used by the tests and the `memserve` example.
//!
//! Meta contexts: the server answers `base:allocation` from [`BlockDevice::block_status`]
//! itself. A device may offer more contexts ([`BlockDevice::meta_contexts`],
//! [`BlockDevice::meta_context_status`]): lsvd offers `qemu:dirty-bitmap:SNAP`, the blocks
//! written since snapshot SNAP, as qemu-nbd does with `-B`, so backup tools that speak NBD
//! (`nbdinfo --map=qemu:dirty-bitmap:SNAP`, libnbd's block status, qemu) read only what
//! changed. The server keeps the protocol's rules (which queries list or select what,
//! context ids, one reply chunk per selected context, bounded replies); the device only
//! names its contexts and answers for one of them, so a device that offers none needs
//! nothing (the defaults).
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

use std::future::Future;
use std::io;

/// One extent of a BLOCK_STATUS answer: for `base:allocation`, or for any other meta
/// context (its flags then mean what that context defines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationExtent {
    pub length_bytes: u32,
    /// `base:allocation`: NBD_STATE_HOLE (1) and/or NBD_STATE_ZERO (2);
    /// `qemu:dirty-bitmap:*`: NBD_STATE_DIRTY (1).
    pub flags: u32,
}

/// Append `length_bytes` with `flags` to a BLOCK_STATUS answer, merged into the last
/// extent when its flags are the same (lengths saturate: the server cuts an answer to
/// the request's length anyway).
pub fn push_extent(extents: &mut Vec<AllocationExtent>, length_bytes: u32, flags: u32) {
    match extents.last_mut() {
        Some(last) if last.flags == flags => {
            last.length_bytes = last.length_bytes.saturating_add(length_bytes);
        }
        _ => extents.push(AllocationExtent {
            length_bytes,
            flags,
        }),
    }
}

pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;
/// `qemu:dirty-bitmap:*`: the extent changed since the bitmap's start (bit 0).
pub const STATE_DIRTY: u32 = 1;

/// Prefix of the qemu dirty-bitmap meta contexts (`qemu:dirty-bitmap:NAME`).
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";

/// A WRITE_ZEROES request: the range to zero and the client's flags for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroRequest {
    pub offset: u64,
    pub length: u32,
    /// The zeros must be durable before the reply (NBD_CMD_FLAG_FUA).
    pub fua: bool,
    /// The client asked that the range stay allocated (NBD_CMD_FLAG_NO_HOLE).
    pub no_hole: bool,
}

/// Block size constraints advertised with NBD_INFO_BLOCK_SIZE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum_bytes: u32,
    pub preferred_bytes: u32,
    pub maximum_bytes: u32,
}

/// What the server needs from a disk. All offsets and lengths are in bytes and have
/// already been checked by the server against `size_bytes()` and `block_sizes()`.
///
/// Errors are `io::Error`; the server maps `InvalidInput` to EINVAL, `StorageFull`
/// to ENOSPC, `Unsupported` to ENOTSUP, `PermissionDenied` to EPERM, `BrokenPipe`
/// (the device is shutting down) to ESHUTDOWN, everything else to EIO.
pub trait BlockDevice: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn block_sizes(&self) -> BlockSizes;
    /// True if FLUSH on one connection makes writes completed on every connection
    /// durable (then the server advertises NBD_FLAG_CAN_MULTI_CONN).
    fn flush_is_global(&self) -> bool;
    /// True if the export takes no writes: the server advertises NBD_FLAG_READ_ONLY
    /// and answers WRITE, TRIM and WRITE_ZEROES with EPERM without calling the device.
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, length: u32) -> impl Future<Output = io::Result<Vec<u8>>> + Send;
    /// A READ answered right away, without a task: `Some` with what
    /// [`BlockDevice::read`] would have returned if the device can answer now
    /// without waiting (data in memory or in a local file), `None` to have the server
    /// run `read` on a task instead (the default). The server calls it on the thread
    /// that reads requests, so it must not wait for anything slower than a local
    /// file read; it saves the task spawn, a wake-up and a heap allocation per READ.
    fn read_now(&self, offset: u64, length: u32) -> Option<io::Result<Vec<u8>>> {
        let _ = (offset, length);
        None
    }
    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn trim(
        &self,
        offset: u64,
        length: u32,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;
    fn write_zeroes(&self, request: ZeroRequest) -> impl Future<Output = io::Result<()>> + Send;
    /// Allocation status of `[offset, offset+length)`; extents must cover a non-empty
    /// prefix of the range, in order.
    fn block_status(
        &self,
        offset: u64,
        length: u32,
    ) -> impl Future<Output = io::Result<Vec<AllocationExtent>>> + Send;
    /// Meta contexts the device offers besides `base:allocation` (which the server
    /// answers from [`BlockDevice::block_status`]) whose names start with `prefix`:
    /// every one for `""`; a device may answer a `prefix` that is a full name with
    /// that name alone (lsvd does, without listing every snapshot). Full names (`qemu:dirty-bitmap:SNAP`), each at most 4096
    /// bytes; the server lists at most [`server::MAX_LISTED_CONTEXTS`] of them and keeps
    /// only exact matches when the client asked for a name rather than a namespace.
    /// Called during the handshake, for `NBD_OPT_LIST_META_CONTEXT` and for
    /// `NBD_OPT_SET_META_CONTEXT` (a name the device does not return is not selected;
    /// a device may get ready to answer for a name it returns, e.g. load what it
    /// compares against). The default offers none.
    fn meta_contexts(&self, prefix: &str) -> impl Future<Output = io::Result<Vec<String>>> + Send {
        let _ = prefix;
        std::future::ready(Ok(Vec::new()))
    }
    /// Status of `[offset, offset+length)` in the meta context `name` (one that
    /// [`BlockDevice::meta_contexts`] returned and the client selected), with that
    /// context's flags (for `qemu:dirty-bitmap:*`, [`STATE_DIRTY`]). As for
    /// `block_status`: extents must cover a non-empty prefix of the range, in order;
    /// the server cuts the answer to the range and to a reply's worth of extents.
    fn meta_context_status(
        &self,
        name: &str,
        offset: u64,
        length: u32,
    ) -> impl Future<Output = io::Result<Vec<AllocationExtent>>> + Send {
        let _ = (name, offset, length);
        std::future::ready(Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the device offers no such meta context",
        )))
    }
    /// NBD_CMD_CACHE: a hint to prefetch; may do nothing.
    fn cache(&self, offset: u64, length: u32) -> impl Future<Output = io::Result<()>> + Send;
    /// Take a WRITE, FLUSH, TRIM or WRITE_ZEROES without a task of its own: the device
    /// answers through `done` ([`Completion::complete`], from any thread) when it is
    /// done, with the result its async method would have returned. A device with a
    /// queue of its own avoids a task spawn and a wake-up per request this way. One
    /// that cannot take `op` now hands both back, and the server calls the async
    /// method on a task instead (the default: every request goes that way). Must not
    /// block.
    ///
    /// A device may queue what it was started and run it at the next [`unplug`]: the
    /// server starts every request it has read before it waits for anything, so one
    /// `unplug` covers a burst of requests (a group commit's worth).
    ///
    /// [`unplug`]: BlockDevice::unplug
    #[expect(
        clippy::result_large_err,
        reason = "a declined request goes back by value: moving its ~150 bytes costs less than boxing it on every request"
    )]
    fn start(&self, op: StartOp, done: Completion) -> Result<(), (StartOp, Completion)> {
        Err((op, done))
    }
    /// The server has started every request it has for now and is about to wait (for
    /// the socket, a permit, room for a reply, or the end of the connection): a device
    /// that queues started requests must run them, or see that they will run, before
    /// it returns. Called only after a successful [`BlockDevice::start`]; may block
    /// briefly on a runtime thread (local writes, not network round trips). On a
    /// connection thread ([`server::on_connection_thread`]) it may block for as long as
    /// the work takes (an `fdatasync`): nothing else runs there meanwhile.
    fn unplug(&self) {}
    /// May the server send answers now? Checked right before each reply goes to the
    /// socket (not when the work finished): a device that may lose the right to
    /// answer (lsvd's lease on a volume other hosts can take over) waits here while
    /// it cannot be sure, and fails once it knows it may not. A reply whose check
    /// fails is sent as that error instead (EIO unless the error says otherwise).
    /// The default always allows.
    fn answerable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::ready(Ok(()))
    }
    /// [`BlockDevice::answerable`] without waiting: true only when it would answer Ok
    /// at once. Asked right before every write to the socket while a reply is being
    /// sent (a reply larger than the socket's buffer takes several, with waits for the
    /// client between them); false makes the server wait for `answerable`, and end
    /// the connection if that fails, since half a reply cannot be taken back. The
    /// default always allows.
    fn may_answer_now(&self) -> bool {
        true
    }
}

pub mod client;
pub mod mem_device;
pub mod proto;
pub mod server;

pub use server::reply::{Completion, StartOp};
pub use server::tls::{Tls, TlsAcceptor, TlsMode};
pub use server::{
    ConnectionErrorHook, ConnectionStats, Export, Limits, Listener, Notices, RefusalReason, Server,
};
