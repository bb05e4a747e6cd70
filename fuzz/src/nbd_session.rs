//! A whole NBD server session driven from fuzz bytes.
//!
//! The bytes are a script for a client that talks to [`lsvd_nbd::Server`] over an
//! in-memory duplex stream, on a single-threaded tokio runtime, with two
//! [`MemDevice`] exports behind a guard that panics if the server ever calls the device
//! outside the export. The client sends options (well-formed, malformed, oversized,
//! unknown) and then requests (in and out of range, misaligned, with any flags), and
//! checks every byte the server sends back as a strict client would:
//! - every option reply has the right magic, echoes the option, has a known type that
//!   fits the option, and a payload that parses; `NBD_OPT_EXPORT_NAME`'s reply carries
//!   the export size;
//! - every transmission reply has the right magic and cookie, a known error value,
//!   structured chunks that parse, lie inside the request and end with a DONE chunk;
//! - a request that reaches past the export's end never succeeds;
//! - data read back equals a shadow copy of what was written, trimmed and zeroed;
//! - the server answers every well-formed request and closes only when it must.
//!
//! A script may end with raw bytes; then the client shuts its side and the server must
//! close the connection (a hang is reported by AFL as a timeout).

use std::io;
use std::sync::Arc;

use lsvd_nbd::mem_device::MemDevice;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::{
    ClientOption, GREETING_LEN, Info, InfoRequest, MetaContextRequest, OPTION_REPLY_HEADER_LEN,
    encode_option, parse_greeting, parse_info, parse_meta_context, parse_option,
    parse_option_reply_header,
};
use lsvd_nbd::{AllocationExtent, BlockDevice, BlockSizes, Export, Server, ZeroRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::bytes::Bytes;

/// Export names the script picks from ("" is the default export, the first).
const NAMES: [&str; 4] = ["", "disk", "other", "nope"];

/// A device that checks the server kept its side of the [`BlockDevice`] contract.
pub(crate) struct Guarded<D> {
    pub(crate) inner: D,
    pub(crate) size: u64,
}

impl<D> Guarded<D> {
    fn check(&self, op: &str, offset: u64, length: u64) {
        let end = offset.checked_add(length);
        assert!(
            end.is_some_and(|e| e <= self.size),
            "server called {op}({offset}, {length}) outside an export of {} bytes",
            self.size
        );
    }
}

impl<D: BlockDevice> BlockDevice for Guarded<D> {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }
    fn flush_is_global(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.check("read", offset, u64::from(length));
        self.inner.read(offset, length).await
    }
    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.check("write", offset, data.len() as u64);
        self.inner.write(offset, data, fua).await
    }
    async fn flush(&self) -> io::Result<()> {
        self.inner.flush().await
    }
    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.check("trim", offset, u64::from(length));
        self.inner.trim(offset, length, fua).await
    }
    async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
        self.check("write_zeroes", request.offset, u64::from(request.length));
        self.inner.write_zeroes(request).await
    }
    async fn block_status(&self, offset: u64, length: u32) -> io::Result<Vec<AllocationExtent>> {
        self.check("block_status", offset, u64::from(length));
        self.inner.block_status(offset, length).await
    }
    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        self.check("cache", offset, u64::from(length));
        self.inner.cache(offset, length).await
    }
}

/// What the client knows about the negotiation so far.
#[derive(Default)]
struct Client {
    structured: bool,
    /// The export a SET_META_CONTEXT selected `base:allocation` for, and its id.
    allocation: Option<(usize, u32)>,
    no_zeroes: bool,
}

/// The client's view of one export during transmission.
pub(crate) struct Attached {
    pub(crate) size: u64,
    /// What the export holds, as far as the client's answered requests say.
    pub(crate) shadow: Vec<u8>,
    structured: bool,
    allocation_id: Option<u32>,
    /// Raw bytes went out: requests the shadow knows nothing of may have run.
    pub(crate) raw_sent: bool,
}

fn export_index(name: &str) -> Option<usize> {
    match name {
        "" | "disk" => Some(0),
        "other" => Some(1),
        _ => None,
    }
}

fn pick_name(b: &mut Bytes<'_>) -> String {
    let i = b.below(5) as usize;
    match NAMES.get(i) {
        Some(n) => (*n).to_owned(),
        None => String::from_utf8_lossy(&b.vec(12)).into_owned(),
    }
}

/// Reads exactly `n` bytes, or `None` at EOF (a closed connection).
async fn read_n(s: &mut DuplexStream, n: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; n];
    match s.read_exact(&mut buf).await {
        Ok(_) => Some(buf),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
        Err(e) => panic!("duplex read failed: {e}"),
    }
}

async fn send(s: &mut DuplexStream, bytes: &[u8]) -> bool {
    s.write_all(bytes).await.is_ok() && s.flush().await.is_ok()
}

/// Expect the server to close the connection without sending anything more.
async fn expect_eof(s: &mut DuplexStream, why: &str) {
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(
        rest.is_empty(),
        "{why}: server sent {} more bytes",
        rest.len()
    );
}

fn is_error_value(e: u32) -> bool {
    [
        EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN,
    ]
    .contains(&e)
}

enum OptionEnd {
    /// The final reply was an ACK (true) or an error (false).
    Final(bool),
    Closed,
}

/// Reads and checks the replies to option `option` up to its final one. Returns
/// whether `base:allocation` was announced (with its id).
async fn option_replies(
    s: &mut DuplexStream,
    option: u32,
    sizes: &[u64; 2],
    meta: &mut Option<u32>,
) -> OptionEnd {
    loop {
        let Some(hdr) = read_n(s, OPTION_REPLY_HEADER_LEN).await else {
            return OptionEnd::Closed;
        };
        let hdr: [u8; OPTION_REPLY_HEADER_LEN] = hdr.try_into().expect("20 bytes");
        let h = parse_option_reply_header(&hdr).expect("option reply with a bad magic");
        assert_eq!(h.option, option, "reply names another option");
        assert!(h.length <= 64 << 10, "option reply of {} bytes", h.length);
        let data = read_n(s, h.length as usize)
            .await
            .expect("connection closed inside an option reply");
        match h.reply_type {
            REP_ACK => {
                assert!(data.is_empty(), "ACK with a payload");
                return OptionEnd::Final(true);
            }
            t if t & REP_FLAG_ERROR != 0 => {
                let known = [
                    REP_ERR_UNSUP,
                    REP_ERR_POLICY,
                    REP_ERR_INVALID,
                    REP_ERR_PLATFORM,
                    REP_ERR_TLS_REQD,
                    REP_ERR_UNKNOWN,
                    REP_ERR_SHUTDOWN,
                    REP_ERR_BLOCK_SIZE_REQD,
                    REP_ERR_TOO_BIG,
                ];
                assert!(known.contains(&t), "unknown option error {t:#x}");
                assert!(std::str::from_utf8(&data).is_ok(), "error text not UTF-8");
                return OptionEnd::Final(false);
            }
            REP_SERVER => {
                assert_eq!(option, OPT_LIST, "REP_SERVER for option {option}");
                let n = data
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                let n = n.expect("REP_SERVER without a name length") as usize;
                assert!(4 + n <= data.len(), "REP_SERVER name past its payload");
            }
            REP_INFO => {
                assert!(
                    option == OPT_INFO || option == OPT_GO,
                    "REP_INFO for {option}"
                );
                match parse_info(&data).expect("REP_INFO that does not parse") {
                    Info::Export {
                        size,
                        transmission_flags,
                    } => {
                        assert!(sizes.contains(&size), "export size {size}");
                        assert!(transmission_flags & FLAG_HAS_FLAGS != 0);
                    }
                    Info::BlockSize(bs) => {
                        assert!(bs.minimum_bytes.is_power_of_two());
                        assert!(bs.minimum_bytes <= bs.preferred_bytes);
                        assert!(bs.preferred_bytes <= bs.maximum_bytes);
                        assert_eq!(bs.maximum_bytes % bs.minimum_bytes, 0);
                    }
                    Info::Name(_) | Info::Description(_) => {}
                    Info::Unknown(t) => panic!("server sent unknown info {t}"),
                }
            }
            REP_META_CONTEXT => {
                assert!(
                    option == OPT_LIST_META_CONTEXT || option == OPT_SET_META_CONTEXT,
                    "REP_META_CONTEXT for {option}"
                );
                let (id, name) = parse_meta_context(&data).expect("meta context parses");
                assert_eq!(name, META_CONTEXT_BASE_ALLOCATION);
                *meta = Some(id);
            }
            t => panic!("unknown option reply type {t:#x}"),
        }
    }
}

/// The handshake. Returns the export entered, or `None` if the session ended.
async fn handshake(
    s: &mut DuplexStream,
    b: &mut Bytes<'_>,
    sizes: &[u64; 2],
) -> Option<(usize, Client)> {
    let greeting = read_n(s, GREETING_LEN).await.expect("no greeting");
    let greeting: [u8; GREETING_LEN] = greeting.try_into().expect("18 bytes");
    let flags = parse_greeting(&greeting).expect("bad greeting");
    assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    let client_flags = match b.below(4) {
        0 => b.u32(),
        1 => FLAG_C_FIXED_NEWSTYLE,
        _ => FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES,
    };
    send(s, &client_flags.to_be_bytes()).await;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        expect_eof(s, "unknown client flags").await;
        return None;
    }
    let mut c = Client {
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        ..Client::default()
    };
    while !b.is_empty() {
        let mut msg = Vec::new();
        let op = b.below(13);
        let option = match op {
            0 => OPT_EXPORT_NAME,
            1 => OPT_ABORT,
            2 => OPT_LIST,
            3 => OPT_STARTTLS,
            4 | 5 => OPT_INFO,
            6 | 7 => OPT_GO,
            8 => OPT_STRUCTURED_REPLY,
            9 => OPT_LIST_META_CONTEXT,
            10 => OPT_SET_META_CONTEXT,
            11 => b.u32(),
            _ => {
                // Raw bytes: the rest of the script goes out as it is.
                send(s, b.rest()).await;
                return None;
            }
        };
        let raw_data = b.below(8) == 0;
        let mut name = String::new();
        let mut data = Vec::new();
        if raw_data {
            data = b.vec(64);
        } else {
            match option {
                OPT_EXPORT_NAME => {
                    name = pick_name(b);
                    data = name.clone().into_bytes();
                }
                OPT_INFO | OPT_GO => {
                    name = pick_name(b);
                    let requests = (0..b.below(4)).map(|_| b.u16() % 5).collect();
                    InfoRequest {
                        name: name.clone(),
                        requests,
                    }
                    .encode(&mut data);
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    name = pick_name(b);
                    let queries = (0..b.below(3))
                        .map(|_| match b.below(4) {
                            0 => META_CONTEXT_BASE_ALLOCATION.to_owned(),
                            1 => "base:".to_owned(),
                            2 => "qemu:dirty-bitmap:x".to_owned(),
                            _ => String::from_utf8_lossy(&b.vec(16)).into_owned(),
                        })
                        .collect();
                    MetaContextRequest {
                        export_name: name.clone(),
                        queries,
                    }
                    .encode(&mut data);
                }
                _ => {}
            }
        }
        if raw_data {
            // What the server will make of raw data: the name it parses, if any.
            name = match parse_option(option, &data) {
                Ok(ClientOption::ExportName(n)) => n,
                Ok(ClientOption::Info(r) | ClientOption::Go(r)) => r.name,
                Ok(ClientOption::ListMetaContext(r) | ClientOption::SetMetaContext(r)) => {
                    r.export_name
                }
                _ => "\u{1}unparsed".to_owned(),
            };
        }
        let oversize = b.below(16) == 0 && option != OPT_EXPORT_NAME;
        if oversize {
            let len = MAX_OPTION_BYTES_PLUS_ONE + b.below(4096);
            msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
            msg.extend_from_slice(&option.to_be_bytes());
            msg.extend_from_slice(&len.to_be_bytes());
            msg.resize(msg.len() + len as usize, 0);
        } else {
            encode_option(&mut msg, option, &data);
        }
        if !send(s, &msg).await {
            return None;
        }
        if oversize {
            let mut meta = None;
            match option_replies(s, option, sizes, &mut meta).await {
                OptionEnd::Final(false) => continue,
                _ => panic!("oversized option not refused"),
            }
        }
        if option == OPT_EXPORT_NAME {
            let Some(index) = export_index(&name) else {
                expect_eof(s, "EXPORT_NAME of an unknown export").await;
                return None;
            };
            let n = if c.no_zeroes { 10 } else { 134 };
            let reply = read_n(s, n).await.expect("EXPORT_NAME not answered");
            let mut size = [0u8; 8];
            size.copy_from_slice(&reply[..8]);
            assert_eq!(u64::from_be_bytes(size), sizes[index], "EXPORT_NAME size");
            assert!(reply[10..].iter().all(|&z| z == 0), "padding not zero");
            return Some((index, c));
        }
        let mut meta = None;
        let end = option_replies(s, option, sizes, &mut meta).await;
        match (option, end) {
            (OPT_ABORT, OptionEnd::Final(true)) => {
                expect_eof(s, "after ABORT").await;
                return None;
            }
            (_, OptionEnd::Closed) => panic!("server hung up on option {option}"),
            (OPT_ABORT, _) => panic!("ABORT not acknowledged"),
            (OPT_STRUCTURED_REPLY, OptionEnd::Final(ok)) => {
                assert_eq!(ok, !raw_data || data.is_empty());
                c.structured |= ok;
            }
            (OPT_SET_META_CONTEXT, OptionEnd::Final(ok)) => {
                c.allocation = None;
                if ok {
                    c.allocation = meta.zip(export_index(&name)).map(|(id, i)| (i, id));
                }
                if ok && meta.is_some() {
                    assert!(c.structured, "meta context without structured replies");
                }
            }
            (OPT_GO, OptionEnd::Final(true)) => {
                let index = export_index(&name).expect("GO acknowledged for an unknown export");
                return Some((index, c));
            }
            _ => {}
        }
    }
    None
}

const MAX_OPTION_BYTES_PLUS_ONE: u32 = lsvd_nbd::server::MAX_OPTION_BYTES + 1;

mod transmission;

/// Target `nbd_session`.
pub fn session(data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(data));
}

async fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    let size0 = u64::from(b.below(64 << 10) + 1);
    let size1 = u64::from(b.below(8 << 10));
    let sizes = block_sizes(&mut b);
    let device = |size: u64| {
        Arc::new(Guarded {
            inner: MemDevice::with_block_sizes(size as usize, sizes),
            size,
        })
    };
    let exports = vec![
        Export {
            name: "disk".into(),
            description: "fuzzed".into(),
            device: device(size0),
        },
        Export {
            name: "other".into(),
            description: String::new(),
            device: device(size1),
        },
    ];
    drive(exports, [size0, size1], &mut b).await;
}

/// The block sizes a script asks the exports for (the lsvd target reads and ignores
/// them, so both targets' scripts start alike).
pub(crate) fn block_sizes(b: &mut Bytes<'_>) -> BlockSizes {
    let min = match b.below(4) {
        0 => 1,
        1 => 512,
        2 => 4096,
        _ => b.u32() % 8192,
    };
    let max = match b.below(3) {
        0 => 32 << 20,
        1 => 4096,
        _ => b.u32(),
    };
    BlockSizes {
        minimum_bytes: min,
        preferred_bytes: 4096,
        maximum_bytes: max,
    }
}

/// Runs the rest of the script as a client of a server with `exports` (sizes
/// `export_sizes`, named "disk" and "other") over an in-memory stream. Returns what
/// the client knows of the export it attached to, if it did, once the session is over.
pub(crate) async fn drive<D: BlockDevice>(
    exports: Vec<Export<Guarded<D>>>,
    export_sizes: [u64; 2],
    b: &mut Bytes<'_>,
) -> Option<Attached> {
    let server = Arc::new(Server::new(exports));
    let (mut client, server_end) = tokio::io::duplex(64 << 10);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(Arc::clone(&server).handle_connection(server_end, stop_rx));

    let mut attached = None;
    if let Some((index, c)) = handshake(&mut client, b, &export_sizes).await {
        let size = export_sizes[index];
        let mut att = Attached {
            size,
            shadow: vec![0; size as usize],
            structured: c.structured,
            allocation_id: c
                .allocation
                .filter(|&(i, _)| c.structured && i == index)
                .map(|(_, id)| id),
            raw_sent: false,
        };
        transmission::requests(&mut client, b, &mut att).await;
        attached = Some(att);
    }
    // Whatever state the script left, a client that hangs up must end the session.
    let _ = client.shutdown().await;
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest).await;
    let _ = task.await;
    attached
}
