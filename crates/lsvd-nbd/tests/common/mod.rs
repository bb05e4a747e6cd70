//! Shared helpers for the server tests: a minimal NBD client built on the crate's own
//! `proto` encoders/parsers, and a test device wrapping `MemDevice` that can delay reads
//! or fail on demand.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lsvd_nbd::mem_device::MemDevice;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::*;
use lsvd_nbd::proto::transmission::*;
use lsvd_nbd::{AllocationExtent, BlockDevice, BlockSizes, Export, Server, ZeroRequest};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const SIZE: usize = 1 << 20;

/// `MemDevice` plus knobs: a slow read at one offset, and an error kind to fail with.
pub struct TestDevice {
    pub inner: MemDevice,
    pub slow_read: Option<(u64, Duration)>,
    pub fail_with: Mutex<Option<io::ErrorKind>>,
    pub global_flush: bool,
    /// Notified (one permit per read) when a read reaches the device: tests wait on
    /// it to know a request is in flight instead of sleeping.
    pub read_started: Arc<tokio::sync::Notify>,
    /// Reads that reached the device on a connection thread
    /// (`Server::with_connection_threads`).
    pub reads_on_connection_threads: AtomicUsize,
}

impl TestDevice {
    pub fn new(size: usize) -> Self {
        TestDevice {
            inner: MemDevice::new(size),
            slow_read: None,
            fail_with: Mutex::new(None),
            global_flush: true,
            read_started: Arc::new(tokio::sync::Notify::new()),
            reads_on_connection_threads: AtomicUsize::new(0),
        }
    }

    fn check(&self) -> io::Result<()> {
        match *self.fail_with.lock().expect("lock") {
            Some(kind) => Err(io::Error::new(kind, "injected failure")),
            None => Ok(()),
        }
    }
}

impl BlockDevice for TestDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }
    fn flush_is_global(&self) -> bool {
        self.global_flush
    }
    async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.read_started.notify_one();
        if lsvd_nbd::server::on_connection_thread() {
            self.reads_on_connection_threads
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Some((at, delay)) = self.slow_read
            && at == offset
        {
            real_sleep(delay).await;
        }
        self.check()?;
        self.inner.read(offset, length).await
    }
    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.check()?;
        self.inner.write(offset, data, fua).await
    }
    async fn flush(&self) -> io::Result<()> {
        self.check()?;
        self.inner.flush().await
    }
    async fn trim(&self, offset: u64, length: u32, fua: bool) -> io::Result<()> {
        self.check()?;
        self.inner.trim(offset, length, fua).await
    }
    async fn write_zeroes(&self, request: ZeroRequest) -> io::Result<()> {
        self.check()?;
        self.inner.write_zeroes(request).await
    }
    async fn block_status(&self, offset: u64, length: u32) -> io::Result<Vec<AllocationExtent>> {
        self.check()?;
        self.inner.block_status(offset, length).await
    }
    async fn cache(&self, offset: u64, length: u32) -> io::Result<()> {
        self.check()?;
        self.inner.cache(offset, length).await
    }
    async fn meta_contexts(&self, prefix: &str) -> io::Result<Vec<String>> {
        self.check()?;
        self.inner.meta_contexts(prefix).await
    }
    async fn meta_context_status(
        &self,
        name: &str,
        offset: u64,
        length: u32,
    ) -> io::Result<Vec<AllocationExtent>> {
        self.check()?;
        self.inner.meta_context_status(name, offset, length).await
    }
}

pub fn export(name: &str, device: TestDevice) -> Export<TestDevice> {
    Export {
        name: name.to_string(),
        description: format!("{name} disk"),
        device: Arc::new(device),
    }
}

/// A server with exports "disk" (default) and "second", both `SIZE` bytes.
pub fn two_export_server() -> Arc<Server<TestDevice>> {
    Arc::new(Server::new(vec![
        export("disk", TestDevice::new(SIZE)),
        export("second", TestDevice::new(SIZE)),
    ]))
}

/// A running connection: the client end, the server task and its shutdown switch.
pub struct Conn {
    pub client: Client<DuplexStream>,
    pub server: JoinHandle<io::Result<()>>,
    pub stop: watch::Sender<bool>,
}

pub fn connect<D: BlockDevice>(server: &Arc<Server<D>>) -> Conn {
    let (stop, shutdown) = watch::channel(false);
    let (client, server_end) = tokio::io::duplex(4 << 20);
    let server = tokio::spawn(Arc::clone(server).handle_connection(server_end, shutdown));
    Conn {
        client: Client::new(client),
        server,
        stop,
    }
}

/// Connects and sends the client's half of the handshake greeting.
pub async fn connect_handshaken<D: BlockDevice>(server: &Arc<Server<D>>) -> Conn {
    let mut conn = connect(server);
    conn.client.handshake().await;
    conn
}

impl Conn {
    /// Asserts that the server closes the connection; returns how its session ended.
    pub async fn closed(mut self) -> io::Result<()> {
        assert!(
            self.client.is_closed().await,
            "the server closes the connection"
        );
        self.server.await.expect("no panic")
    }
}

/// Writes `bytes` (garbage, mostly) and hangs up, reading whatever the server answers
/// meanwhile; asserts the server's session ends within 5 s without a panic.
pub async fn send_and_hang_up(conn: Conn, bytes: &[u8]) {
    let (mut rd, mut wr) = tokio::io::split(conn.client.stream);
    let drain = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = rd.read_to_end(&mut sink).await;
    });
    let _ = wr.write_all(bytes).await;
    let _ = wr.shutdown().await;
    drop(wr);
    let joined = tokio::time::timeout(Duration::from_secs(5), conn.server)
        .await
        .expect("server ended");
    assert!(
        !joined.is_err_and(|e| e.is_panic()),
        "server panicked on {bytes:02x?}"
    );
    drain.abort();
}

/// A Unix socket path in a fresh temporary directory (removed by the caller).
pub fn temp_socket(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "lsvd-nbd-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sock = dir.join("nbd.sock");
    (dir, sock)
}

/// A xorshift64 generator from `seed`: reproducible random bytes for the tests that
/// throw garbage at the server.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// An NBD_OPT_{LIST,SET}_META_CONTEXT payload asking `export` for `queries`.
pub fn meta_context_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::new();
    MetaContextRequest {
        export_name: export.into(),
        queries: queries.iter().map(|q| q.to_string()).collect(),
    }
    .encode(&mut data);
    data
}

/// Connects and negotiates structured replies, `base:allocation` and GO on export "".
pub async fn connect_go<D: BlockDevice>(server: &Arc<Server<D>>, structured: bool) -> Conn {
    let mut conn = connect(server);
    conn.client.handshake().await;
    if structured {
        conn.client.structured_and_meta("").await;
    }
    conn.client.go("", &[]).await;
    conn
}

/// A client over `stream` that has greeted the server and gone to its default export,
/// with simple replies.
pub async fn client_on_default_export<S: AsyncRead + AsyncWrite + Unpin>(stream: S) -> Client<S> {
    let mut client = Client::new(stream);
    client.handshake().await;
    client.go("", &[]).await;
    client
}

/// One complete reply to a request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
    /// The `base:allocation` chunk's extents (context id 1).
    pub extents: Vec<AllocationExtent>,
    /// Every BLOCK_STATUS chunk, in the order received: (context id, extents).
    pub contexts: Vec<(u32, Vec<AllocationExtent>)>,
    pub message: String,
    pub structured: bool,
}

pub struct Client<S> {
    pub stream: S,
    /// cookie -> READ length with simple replies (the only case needing context).
    pending_reads: HashMap<u64, u32>,
    partial: HashMap<u64, Reply>,
    next_cookie: u64,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    pub fn new(stream: S) -> Self {
        Client {
            stream,
            pending_reads: HashMap::new(),
            partial: HashMap::new(),
            next_cookie: 1,
        }
    }

    pub async fn handshake(&mut self) {
        self.handshake_with(ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        })
        .await;
    }

    pub async fn handshake_with(&mut self, flags: ClientFlags) {
        let mut g = [0u8; GREETING_LEN];
        self.stream.read_exact(&mut g).await.expect("greeting");
        assert_eq!(parse_greeting(&g), Ok(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES));
        self.stream
            .write_all(&flags.encode())
            .await
            .expect("send flags");
    }

    pub async fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut out = Vec::new();
        encode_option(&mut out, option, data);
        self.stream.write_all(&out).await.expect("send option");
    }

    pub async fn read_option_reply(&mut self) -> io::Result<(OptionReplyHeader, Vec<u8>)> {
        let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
        self.stream.read_exact(&mut h).await?;
        let hdr = parse_option_reply_header(&h)?;
        let mut data = vec![0u8; hdr.length as usize];
        self.stream.read_exact(&mut data).await?;
        Ok((hdr, data))
    }

    /// Sends an option and collects replies up to the final ACK or error.
    pub async fn option(&mut self, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        self.send_option(option, data).await;
        let mut replies = Vec::new();
        loop {
            let (hdr, data) = self.read_option_reply().await.expect("option reply");
            assert_eq!(hdr.option, option);
            let last = hdr.reply_type == REP_ACK || hdr.reply_type & REP_FLAG_ERROR != 0;
            replies.push((hdr.reply_type, data));
            if last {
                return replies;
            }
        }
    }

    /// Sends an option and asserts that its only reply is a bare ACK.
    pub async fn option_acked(&mut self, option: u32, data: &[u8]) {
        let replies = self.option(option, data).await;
        assert_eq!(replies, vec![(REP_ACK, vec![])], "option {option}");
    }

    pub async fn structured_and_meta(&mut self, export: &str) {
        self.option_acked(OPT_STRUCTURED_REPLY, &[]).await;
        let data = meta_context_request(export, &["base:allocation"]);
        let r = self.option(OPT_SET_META_CONTEXT, &data).await;
        assert_eq!(r.len(), 2);
        assert_eq!(
            parse_meta_context(&r[0].1),
            Ok((1, "base:allocation".to_string()))
        );
    }

    /// `NBD_OPT_GO` (or INFO); returns the infos, panics unless it ends in ACK.
    pub async fn go(&mut self, name: &str, requests: &[u16]) -> Vec<Info> {
        self.info_or_go(OPT_GO, name, requests)
            .await
            .expect("GO accepted")
    }

    pub async fn info_or_go(
        &mut self,
        option: u32,
        name: &str,
        requests: &[u16],
    ) -> Result<Vec<Info>, u32> {
        let mut data = Vec::new();
        InfoRequest {
            name: name.into(),
            requests: requests.to_vec(),
        }
        .encode(&mut data);
        let replies = self.option(option, &data).await;
        let mut infos = Vec::new();
        for (ty, data) in replies {
            match ty {
                REP_INFO => infos.push(parse_info(&data).expect("valid info")),
                REP_ACK => return Ok(infos),
                err => return Err(err),
            }
        }
        unreachable!("option() stops at ACK or error")
    }

    pub async fn send(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.send_raw(
            RequestHeader {
                flags,
                command,
                cookie,
                offset,
                length,
            },
            payload,
        )
        .await;
        cookie
    }

    pub async fn send_raw(&mut self, hdr: RequestHeader, payload: &[u8]) {
        if hdr.command == Command::Read {
            self.pending_reads.insert(hdr.cookie, hdr.length);
        }
        let mut out = hdr.encode().to_vec();
        out.extend_from_slice(payload);
        self.stream.write_all(&out).await.expect("send request");
    }

    /// Reads until some request's reply is complete and returns it.
    pub async fn reply(&mut self) -> io::Result<Reply> {
        loop {
            let mut magic = [0u8; 4];
            self.stream.read_exact(&mut magic).await?;
            let magic_value = u32::from_be_bytes(magic);
            if magic_value == SIMPLE_REPLY_MAGIC {
                let mut h = [0u8; SIMPLE_REPLY_HEADER_LEN];
                h[..4].copy_from_slice(&magic);
                self.stream.read_exact(&mut h[4..]).await?;
                let (error, cookie) = parse_simple_reply(&h)?;
                let len = self.pending_reads.remove(&cookie).unwrap_or(0);
                let mut data = Vec::new();
                if error == 0 {
                    data = vec![0u8; len as usize];
                    self.stream.read_exact(&mut data).await?;
                }
                return Ok(Reply {
                    cookie,
                    error,
                    data,
                    ..Reply::default()
                });
            }
            let mut h = [0u8; CHUNK_HEADER_LEN];
            h[..4].copy_from_slice(&magic);
            self.stream.read_exact(&mut h[4..]).await?;
            let chunk = parse_chunk_header(&h)?;
            let mut payload = vec![0u8; chunk.length as usize];
            self.stream.read_exact(&mut payload).await?;
            let entry = self.partial.entry(chunk.cookie).or_insert_with(|| Reply {
                cookie: chunk.cookie,
                structured: true,
                ..Reply::default()
            });
            match chunk.reply_type {
                REPLY_TYPE_NONE => assert!(payload.is_empty()),
                REPLY_TYPE_OFFSET_DATA => entry.data.extend_from_slice(&payload[8..]),
                REPLY_TYPE_BLOCK_STATUS => {
                    let (id, extents) = parse_block_status(&payload)?;
                    if id == 1 {
                        entry.extents = extents.clone();
                    }
                    entry.contexts.push((id, extents));
                }
                REPLY_TYPE_ERROR => {
                    let (error, message) = parse_error_chunk(&payload)?;
                    entry.error = error;
                    entry.message = message;
                }
                other => panic!("unexpected chunk type {other}"),
            }
            if chunk.flags & REPLY_FLAG_DONE != 0 {
                self.pending_reads.remove(&chunk.cookie);
                return Ok(self.partial.remove(&chunk.cookie).expect("just inserted"));
            }
        }
    }

    /// Sends one request and waits for its reply (nothing else in flight).
    pub async fn call(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = self.send(command, flags, offset, length, payload).await;
        let reply = self.reply().await.expect("reply");
        assert_eq!(reply.cookie, cookie);
        reply
    }

    /// A plain WRITE of `payload` at `offset`, waited for.
    pub async fn write_at(&mut self, offset: u64, payload: &[u8]) -> Reply {
        let length = u32::try_from(payload.len()).expect("payload fits a request");
        self.call(Command::Write, 0, offset, length, payload).await
    }

    /// Reads the next `N` bytes the server sends, outside the request/reply framing
    /// (the old-style export reply, a TLS hello).
    pub async fn read_exactly<const N: usize>(&mut self, what: &str) -> [u8; N] {
        let mut bytes = [0u8; N];
        self.stream.read_exact(&mut bytes).await.expect(what);
        bytes
    }

    /// Sends NBD_CMD_DISC: the server answers what is in flight, then closes.
    pub async fn send_disc(&mut self) {
        self.send(Command::Disc, 0, 0, 0, &[]).await;
    }

    /// Sends NBD_CMD_DISC behind the one request in flight and returns that request's
    /// reply, which the server must send before it closes.
    pub async fn disc_behind_one_in_flight(&mut self) -> Reply {
        self.send_disc().await;
        self.reply()
            .await
            .expect("the in-flight request's reply before the close")
    }

    /// True once the server has closed its end (reads EOF).
    pub async fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut byte)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// The one real wait of these tests: a slow device's delay and the polling below.
async fn real_sleep(span: Duration) {
    tokio::time::sleep(span).await;
}

/// Waits until `cond` holds, looking again every 10 ms; panics naming `what` if it
/// does not hold within `limit` (keep it generous: CI machines are loaded).
pub async fn wait_until(limit: Duration, what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up after {limit:?} waiting for {what}"
        );
        real_sleep(Duration::from_millis(10)).await;
    }
}

/// Checks that `cond` holds all through the next `span`: a "nothing happens" check,
/// which has to wait that long.
pub async fn holds_for(span: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + span;
    let limit = span + Duration::from_secs(60);
    wait_until(limit, what, async || {
        assert!(cond(), "{what}: no longer so");
        std::time::Instant::now() >= end
    })
    .await;
}
