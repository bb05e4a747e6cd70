//! Serves an in-memory disk over NBD on a Unix socket, for trying the server with real
//! clients (nbdinfo, nbdsh, nbdcopy, qemu-img):
//!
//! ```text
//! cargo run -p lsvd-nbd --example memserve -- /tmp/mem.sock 67108864
//! nbdinfo 'nbd+unix:///?socket=/tmp/mem.sock'
//! ```
//!
//! The export is named `mem` and is also the default export. Ctrl-C shuts down cleanly.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

use lsvd_nbd::mem_device::MemDevice;
use lsvd_nbd::{Export, Server};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(size)) = (args.next(), args.next()) else {
        eprintln!("usage: memserve SOCKET_PATH SIZE_BYTES");
        std::process::exit(2);
    };
    let size: usize = size
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;

    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    let server = Arc::new(Server::new(vec![Export {
        name: "mem".to_string(),
        description: format!("in-memory disk of {size} bytes"),
        device: Arc::new(MemDevice::new(size)),
    }]));

    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop.send(true);
        }
    });
    eprintln!("serving {size} bytes on {path}");
    let result = server.serve(listener, shutdown).await;
    let _ = std::fs::remove_file(&path);
    result
}
