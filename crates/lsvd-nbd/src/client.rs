//! A small NBD client: fixed-newstyle handshake with `NBD_OPT_EXPORT_NAME`, simple
//! replies, many requests in flight on one connection (replies matched by cookie).
//!
//! Used by `lsvd replay` to drive traces through a running server, and by tests.
//! Connects to `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::proto::consts::{
    CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES,
};
use crate::proto::handshake::{GREETING_LEN, encode_export_name_opening, parse_greeting};
use crate::proto::transmission::{
    Command, RequestHeader, SIMPLE_REPLY_HEADER_LEN, parse_simple_reply,
};

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { addr: String, export: String },
    Unix { path: String, export: String },
}

impl Target {
    /// Parse an NBD URI (`nbd://host:port/export`, `nbd+unix:///export?socket=path`).
    pub fn parse(uri: &str) -> Result<Target, String> {
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path_part, query) = rest
                .split_once('?')
                .ok_or_else(|| format!("{uri}: missing ?socket=PATH"))?;
            let export = path_part.trim_start_matches('/').to_string();
            let path = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| format!("{uri}: missing socket= parameter"))?;
            return Ok(Target::Unix {
                path: path.to_string(),
                export,
            });
        }
        if let Some(rest) = uri.strip_prefix("nbd://") {
            let (hostport, export) = rest.split_once('/').unwrap_or((rest, ""));
            if hostport.is_empty() {
                return Err(format!("{uri}: missing host"));
            }
            let addr = if hostport.contains(':') {
                hostport.to_string()
            } else {
                format!("{hostport}:10809")
            };
            return Ok(Target::Tcp {
                addr,
                export: export.to_string(),
            });
        }
        Err(format!(
            "{uri}: not an NBD URI (nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH)"
        ))
    }
}

type Reply = io::Result<Vec<u8>>;
type PendingMap = Arc<Mutex<Option<HashMap<u64, (usize, oneshot::Sender<Reply>)>>>>;

pub struct Client {
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    pending: PendingMap,
    next_cookie: AtomicU64,
    size_bytes: u64,
    reader: tokio::task::JoinHandle<()>,
}

fn broken(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, why.to_string())
}

impl Client {
    pub async fn connect(target: &Target) -> io::Result<Client> {
        match target {
            Target::Tcp { addr, export } => {
                let s = tokio::net::TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                Self::handshake(Box::new(r), Box::new(w), export).await
            }
            Target::Unix { path, export } => {
                let s = tokio::net::UnixStream::connect(path).await?;
                let (r, w) = s.into_split();
                Self::handshake(Box::new(r), Box::new(w), export).await
            }
        }
    }

    async fn handshake(
        mut r: Box<dyn AsyncRead + Send + Unpin>,
        mut w: Box<dyn AsyncWrite + Send + Unpin>,
        export: &str,
    ) -> io::Result<Client> {
        let mut greeting = [0u8; GREETING_LEN];
        r.read_exact(&mut greeting).await?;
        parse_greeting(&greeting)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))?;
        let out = encode_export_name_opening(export);
        w.write_all(&out).await?;
        let mut reply = [0u8; 10];
        r.read_exact(&mut reply).await?;
        let mut size = [0u8; 8];
        size.copy_from_slice(&reply[..8]);
        let pending: PendingMap = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_replies(r, pending.clone()));
        Ok(Client {
            writer: tokio::sync::Mutex::new(w),
            pending,
            next_cookie: AtomicU64::new(1),
            size_bytes: u64::from_be_bytes(size),
            reader,
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    async fn request(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        read_len: usize,
    ) -> Reply {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let map = p.as_mut().ok_or_else(|| broken("connection closed"))?;
            map.insert(cookie, (read_len, tx));
        }
        let header = RequestHeader {
            flags,
            command: Command::from_u16(command),
            cookie,
            offset,
            length,
        }
        .encode();
        {
            let mut w = self.writer.lock().await;
            w.write_all(&header).await?;
            if !payload.is_empty() {
                w.write_all(payload).await?;
            }
        }
        rx.await.map_err(|_| broken("connection closed"))?
    }

    pub async fn read(&self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.request(CMD_READ, 0, offset, length, &[], length as usize)
            .await
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, offset, data.len() as u32, data, 0)
            .await
            .map(|_| ())
    }

    pub async fn flush(&self) -> io::Result<()> {
        self.request(CMD_FLUSH, 0, 0, 0, &[], 0).await.map(|_| ())
    }

    pub async fn trim(&self, offset: u64, length: u32) -> io::Result<()> {
        self.request(CMD_TRIM, 0, offset, length, &[], 0)
            .await
            .map(|_| ())
    }

    pub async fn write_zeroes(&self, offset: u64, length: u32) -> io::Result<()> {
        self.request(CMD_WRITE_ZEROES, 0, offset, length, &[], 0)
            .await
            .map(|_| ())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_replies(mut r: Box<dyn AsyncRead + Send + Unpin>, pending: PendingMap) {
    let fail_all = |pending: &PendingMap, why: &str| {
        let map = pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        for (_, (_, tx)) in map.into_iter().flatten() {
            let _ = tx.send(Err(broken(why)));
        }
    };
    loop {
        let mut head = [0u8; SIMPLE_REPLY_HEADER_LEN];
        if r.read_exact(&mut head).await.is_err() {
            fail_all(&pending, "connection closed");
            return;
        }
        let Ok((error, cookie)) = parse_simple_reply(&head) else {
            fail_all(&pending, "bad reply from server");
            return;
        };
        let entry = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&cookie));
        let Some((read_len, tx)) = entry else {
            fail_all(&pending, "reply for an unknown request");
            return;
        };
        if error != 0 {
            let _ = tx.send(Err(io::Error::from_raw_os_error(error as i32)));
            continue;
        }
        let mut data = vec![0u8; read_len];
        if read_len > 0 && r.read_exact(&mut data).await.is_err() {
            let _ = tx.send(Err(broken("connection closed mid-reply")));
            fail_all(&pending, "connection closed");
            return;
        }
        let _ = tx.send(Ok(data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        assert_eq!(
            Target::parse("nbd+unix:///disk0?socket=/tmp/s").expect("ok"),
            Target::Unix {
                path: "/tmp/s".into(),
                export: "disk0".into()
            }
        );
        assert_eq!(
            Target::parse("nbd://127.0.0.1/d").expect("ok"),
            Target::Tcp {
                addr: "127.0.0.1:10809".into(),
                export: "d".into()
            }
        );
        assert!(Target::parse("http://x").is_err());
        assert!(Target::parse("nbd+unix:///d").is_err());
    }

    #[tokio::test]
    async fn talks_to_our_server() {
        use crate::mem_device::MemDevice;
        use crate::server::{Export, Server};
        let dir = std::env::temp_dir().join(format!("lsvd-nbd-client-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let server = Arc::new(Server::new(vec![Export {
            name: "m".into(),
            description: String::new(),
            device: Arc::new(MemDevice::new(1 << 20)),
        }]));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(server.serve(listener, rx));
        let target = Target::Unix {
            path: path.display().to_string(),
            export: "m".into(),
        };
        let c = Client::connect(&target).await.expect("connect");
        assert_eq!(c.size_bytes(), 1 << 20);
        c.write(4096, &[7u8; 4096], true).await.expect("write");
        assert_eq!(c.read(4096, 4096).await.expect("read"), vec![7u8; 4096]);
        c.trim(4096, 4096).await.expect("trim");
        c.flush().await.expect("flush");
        assert!(
            c.read(1 << 20, 4096).await.is_err(),
            "read past the end fails"
        );
        assert_eq!(c.read(0, 512).await.expect("still usable"), vec![0u8; 512]);
        drop(c);
        let _ = tx.send(true);
        let _ = task.await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
