//! A minimal NBD client over a Unix socket: fixed-newstyle handshake with
//! `NBD_OPT_EXPORT_NAME`, simple replies, many requests in flight per connection
//! (replies are matched to requests by cookie).

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lsvd_nbd::proto::consts::{
    CMD_DISC, CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES,
    OPT_EXPORT_NAME,
};
use lsvd_nbd::proto::handshake::{ClientFlags, GREETING_LEN, encode_option, parse_greeting};
use lsvd_nbd::proto::transmission::{
    Command, RequestHeader, SIMPLE_REPLY_HEADER_LEN, parse_simple_reply,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::oneshot;

type Reply = io::Result<Vec<u8>>;

struct Pending {
    read_len: usize,
    done: oneshot::Sender<Reply>,
}

pub struct NbdConn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Arc<Mutex<Option<HashMap<u64, Pending>>>>,
    next_cookie: AtomicU64,
    pub size_bytes: u64,
    reader: tokio::task::JoinHandle<()>,
}

fn broken(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, why.to_string())
}

impl NbdConn {
    pub async fn connect(socket: &Path, export: &str) -> io::Result<NbdConn> {
        let mut s = UnixStream::connect(socket).await?;
        let mut greeting = [0u8; GREETING_LEN];
        s.read_exact(&mut greeting).await?;
        parse_greeting(&greeting)?;
        let flags = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        };
        let mut out = flags.encode().to_vec();
        encode_option(&mut out, OPT_EXPORT_NAME, export.as_bytes());
        s.write_all(&out).await?;
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).await?;
        let mut size = [0u8; 8];
        size.copy_from_slice(&reply[..8]);
        let size_bytes = u64::from_be_bytes(size);
        let (mut rd, wr) = s.into_split();
        let pending: Arc<Mutex<Option<HashMap<u64, Pending>>>> =
            Arc::new(Mutex::new(Some(HashMap::new())));
        let p2 = pending.clone();
        let reader = tokio::spawn(async move {
            let r: io::Result<()> = async {
                loop {
                    let mut hdr = [0u8; SIMPLE_REPLY_HEADER_LEN];
                    rd.read_exact(&mut hdr).await?;
                    let (error, cookie) = parse_simple_reply(&hdr)?;
                    let entry = p2
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_mut()
                        .and_then(|m| m.remove(&cookie))
                        .ok_or_else(|| {
                            io::Error::new(io::ErrorKind::InvalidData, "reply to unknown cookie")
                        })?;
                    let result = if error != 0 {
                        Err(io::Error::other(format!("NBD error {error}")))
                    } else {
                        let mut data = vec![0u8; entry.read_len];
                        rd.read_exact(&mut data).await?;
                        Ok(data)
                    };
                    let _ = entry.done.send(result);
                }
            }
            .await;
            let _ = r;
            // Fail everything still waiting, and refuse new requests.
            let left = p2.lock().unwrap_or_else(|p| p.into_inner()).take();
            for (_, p) in left.into_iter().flatten() {
                let _ = p.done.send(Err(broken("connection closed")));
            }
        });
        Ok(NbdConn {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next_cookie: AtomicU64::new(1),
            size_bytes,
            reader,
        })
    }

    async fn request(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<Vec<u8>> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let read_len = if cmd == CMD_READ { length as usize } else { 0 };
        {
            let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let map = g.as_mut().ok_or_else(|| broken("connection closed"))?;
            map.insert(cookie, Pending { read_len, done: tx });
        }
        let hdr = RequestHeader {
            flags,
            command: Command::from_u16(cmd),
            cookie,
            offset,
            length,
        }
        .encode();
        {
            let mut w = self.writer.lock().await;
            let sent: io::Result<()> = async {
                w.write_all(&hdr).await?;
                if !payload.is_empty() {
                    w.write_all(payload).await?;
                }
                Ok(())
            }
            .await;
            if let Err(e) = sent {
                if let Some(m) = self
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    m.remove(&cookie);
                }
                return Err(e);
            }
        }
        rx.await.map_err(|_| broken("connection closed"))?
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, offset, data.len() as u32, data)
            .await
            .map(drop)
    }

    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_TRIM, flags, offset, len as u32, &[])
            .await
            .map(drop)
    }

    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE_ZEROES, flags, offset, len as u32, &[])
            .await
            .map(drop)
    }

    pub async fn flush(&self) -> io::Result<()> {
        self.request(CMD_FLUSH, 0, 0, 0, &[]).await.map(drop)
    }

    pub async fn read(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.request(CMD_READ, 0, offset, len as u32, &[]).await
    }

    /// Say goodbye (best effort) and stop the reader.
    pub async fn disconnect(&self) {
        let hdr = RequestHeader {
            flags: 0,
            command: Command::from_u16(CMD_DISC),
            cookie: 0,
            offset: 0,
            length: 0,
        }
        .encode();
        let _ = self.writer.lock().await.write_all(&hdr).await;
        self.reader.abort();
    }
}

impl Drop for NbdConn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
