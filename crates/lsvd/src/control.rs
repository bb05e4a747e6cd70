//! The control socket: how `lsvd` commands reach the server that holds a volume.
//!
//! Why: some operations need the process that serves a volume (only it knows what is
//! in its write log and can close its open batch): `lsvd sync` today, snapshots of a
//! served volume later. `lsvd serve` listens on `<data>/control.sock` (mode 0600: the
//! data directory's owner only) for as long as it serves; a command finds the server
//! through the data directory it shares with it.
//!
//! Protocol: one JSON request line, one JSON reply line, then the server closes.
//! Requests are at most [`MAX_REQUEST_BYTES`]; a reply is `{"ok":true,...}` or
//! `{"ok":false,"error":"..."}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_engine::Volume;

/// Longest request line accepted.
pub const MAX_REQUEST_BYTES: u64 = 4096;

/// The control socket of a data directory.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Make every write acknowledged so far durable in the store.
    Sync { volume: String },
    /// Take a snapshot of a served volume.
    SnapshotCreate { volume: String, snapshot: String },
    /// Delete a snapshot of a served volume (and the objects only it kept).
    SnapshotDelete { volume: String, snapshot: String },
    /// Resize a served volume (`allow_shrink` to make it smaller).
    Resize {
        volume: String,
        size_bytes: u64,
        allow_shrink: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Sync: the newest write-log record now in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_through: Option<u64>,
    /// Snapshot create: the snapshot holds the objects below this sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_seq: Option<u64>,
    /// Snapshot delete: objects deleted with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects_deleted: Option<u64>,
    /// Resize: the size before, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_size_bytes: Option<u64>,
    /// The error's kind (`ErrorKind`'s name), so the command exits as it would have
    /// without a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Reply {
    fn failed(e: impl std::fmt::Display) -> Reply {
        Reply {
            ok: false,
            error: Some(e.to_string()),
            ..Reply::ok()
        }
    }

    fn of_error(e: &Error) -> Reply {
        Reply {
            kind: Some(format!("{:?}", e.kind)),
            ..Reply::failed(e)
        }
    }

    fn ok() -> Reply {
        Reply {
            ok: true,
            error: None,
            records_through: None,
            through_seq: None,
            objects_deleted: None,
            old_size_bytes: None,
            kind: None,
        }
    }

    /// The error a failed reply stands for (`Conflict` when its kind is unknown).
    pub fn into_error(self) -> Error {
        let kind = self
            .kind
            .as_deref()
            .and_then(ErrorKind::from_name)
            .unwrap_or(ErrorKind::Conflict);
        Error::new(
            kind,
            self.error
                .unwrap_or_else(|| "the server refused without saying why".to_string()),
        )
    }
}

/// Listen on `data_dir`'s control socket (the caller holds the data directory's lock,
/// so a socket file there is a dead server's) and answer for `volumes` until
/// `shutdown`. Returns the socket's path, to remove at the end.
pub fn start(
    data_dir: &Path,
    volumes: Vec<Arc<Volume>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(data_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::local_io(
                format!("cannot remove {}", path.display()),
                e,
            ));
        }
    }
    let listener = UnixListener::bind(&path)
        .map_err(|e| Error::local_io(format!("cannot listen on {}", path.display()), e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::local_io(format!("cannot restrict {}", path.display()), e))?;
    let volumes = Arc::new(volumes);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    tokio::spawn(answer(stream, volumes.clone()));
                }
            }
        }
    });
    Ok(path)
}

async fn answer(stream: UnixStream, volumes: Arc<Vec<Arc<Volume>>>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
    let reply = match reader.read_line(&mut line).await {
        Err(e) => Reply::failed(format!("cannot read the request: {e}")),
        Ok(_) if !line.ends_with('\n') => Reply::failed(format!(
            "a request is one line of at most {MAX_REQUEST_BYTES} bytes"
        )),
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::failed(format!("bad request: {e}")),
            Ok(request) => handle(request, &volumes).await,
        },
    };
    let mut out = serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    // The client may have gone (Ctrl-C): nothing to do about it.
    let _ = write.write_all(&out).await;
}

async fn handle(request: Request, volumes: &[Arc<Volume>]) -> Reply {
    let name = match &request {
        Request::Sync { volume }
        | Request::SnapshotCreate { volume, .. }
        | Request::SnapshotDelete { volume, .. }
        | Request::Resize { volume, .. } => volume.clone(),
    };
    // Snapshot exports share their volume's name: requests go to the volume itself.
    let Some(v) = volumes
        .iter()
        .find(|v| v.meta().name == name && v.snapshot_name().is_none())
    else {
        let served: Vec<String> = volumes.iter().map(|v| v.export_name()).collect();
        return Reply::failed(format!(
            "volume '{name}' is not served here (this server serves {})",
            served.join(", ")
        ));
    };
    let result = match request {
        Request::Sync { .. } => v.sync_to_store().await.map(|through| Reply {
            records_through: Some(through),
            ..Reply::ok()
        }),
        Request::SnapshotCreate { snapshot, .. } => {
            v.create_snapshot(&snapshot).await.map(|r| Reply {
                records_through: Some(r.last_record_seq),
                through_seq: Some(r.through_seq),
                ..Reply::ok()
            })
        }
        Request::SnapshotDelete { snapshot, .. }
            if volumes
                .iter()
                .any(|s| s.meta().name == name && s.snapshot_name() == Some(snapshot.as_str())) =>
        {
            Err(Error::new(
                ErrorKind::Conflict,
                format!("snapshot {name}@{snapshot} is being served here: stop serving it first"),
            ))
        }
        Request::SnapshotDelete { snapshot, .. } => {
            v.delete_snapshot(&snapshot).await.map(|n| Reply {
                objects_deleted: Some(n),
                ..Reply::ok()
            })
        }
        Request::Resize {
            size_bytes,
            allow_shrink,
            ..
        } => v.resize(size_bytes, allow_shrink).await.map(|r| Reply {
            old_size_bytes: Some(r.old_size_bytes),
            ..Reply::ok()
        }),
    };
    // As the NBD server does before each batch of answers: a success decided under
    // the lease is not sent once another host took the volume over (a pause between
    // the work and this answer; found by the crash oracle's takeover_sigstop).
    let result = match result {
        Ok(reply) => v.answerable().await.map(|()| reply),
        Err(e) => Err(e),
    };
    result.unwrap_or_else(|e| Reply::of_error(&e))
}

/// Send `request` to the server on `data_dir`. None if no server listens there.
pub async fn request(data_dir: &Path, request: &Request) -> Result<Option<Reply>> {
    let path = socket_path(data_dir);
    let mut stream = match UnixStream::connect(&path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(Error::local_io(
                format!("cannot reach the server on {}", path.display()),
                e,
            ));
        }
    };
    let mut line = serde_json::to_vec(request).map_err(|e| {
        Error::with_source(ErrorKind::Unsupported, "cannot encode a control request", e)
    })?;
    line.push(b'\n');
    let io = |e| Error::local_io(format!("talking to the server on {}", path.display()), e);
    stream.write_all(&line).await.map_err(io)?;
    let mut reply = String::new();
    BufReader::new(stream.take(1 << 20))
        .read_line(&mut reply)
        .await
        .map_err(io)?;
    let reply: Reply = serde_json::from_str(&reply).map_err(|e| {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "the server on {} answered something else: {e}",
                path.display()
            ),
        )
    })?;
    Ok(Some(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn raw(path: &Path, bytes: &[u8]) -> Reply {
        let mut s = UnixStream::connect(path).await.expect("connect");
        // The server may answer (and close) before reading all of an oversized line.
        let _ = s.write_all(bytes).await;
        let mut line = String::new();
        BufReader::new(s)
            .read_line(&mut line)
            .await
            .expect("read reply");
        serde_json::from_str(&line).expect("a JSON reply")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_requests_get_an_error_reply_and_the_server_goes_on() {
        let dir = lsvd_store::testutil::TempDir::new("control");
        let (tx, rx) = tokio::sync::watch::channel(false);
        // A dead server's socket file is replaced.
        std::fs::write(socket_path(dir.path()), b"stale").expect("stale file");
        let path = start(dir.path(), Vec::new(), rx).expect("start");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let r = raw(&path, b"not json\n").await;
        assert!(
            !r.ok
                && r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("bad request"))
        );
        let r = raw(&path, &vec![b'x'; 2 * MAX_REQUEST_BYTES as usize]).await;
        assert!(!r.ok && r.error.as_deref().is_some_and(|e| e.contains("one line")));
        let r = raw(&path, b"{\"op\":\"sync\",\"volume\":\"v\"}\n").await;
        assert!(
            !r.ok
                && r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("not served here"))
        );
        let r = request(dir.path(), &Request::Sync { volume: "v".into() })
            .await
            .expect("request")
            .expect("a server answers");
        assert!(!r.ok);

        tx.send(true).expect("shutdown");
        std::fs::remove_file(&path).expect("remove");
        let none = request(dir.path(), &Request::Sync { volume: "v".into() })
            .await
            .expect("no server is not an error");
        assert!(none.is_none());
    }
}
