//! A Prometheus endpoint (`lsvd serve --metrics HOST:PORT`): the counters of every
//! served volume in the text exposition format, on any HTTP GET.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::engine::Volume;

/// Render the metrics of `volumes`.
pub fn render(volumes: &[Arc<Volume>]) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &dyn Fn(&Volume) -> f64| {
        let _ = writeln!(out, "# HELP lsvd_{name} {help}");
        let _ = writeln!(out, "# TYPE lsvd_{name} {kind}");
        for v in volumes {
            let _ = writeln!(
                out,
                "lsvd_{name}{{volume=\"{}\"}} {}",
                v.meta().name,
                values(v)
            );
        }
    };
    metric("size_bytes", "gauge", "Volume size.", &|v| {
        v.size_bytes() as f64
    });
    metric(
        "live_bytes",
        "gauge",
        "Bytes of live data in the store.",
        &|v| v.status().live_bytes as f64,
    );
    metric(
        "store_bytes",
        "gauge",
        "Bytes of data and GC objects in the store.",
        &|v| v.status().store_bytes as f64,
    );
    metric(
        "utilization",
        "gauge",
        "Live bytes over stored bytes.",
        &|v| v.status().utilization,
    );
    metric(
        "objects",
        "gauge",
        "Data and GC objects in the store.",
        &|v| v.status().objects as f64,
    );
    metric(
        "log_used_bytes",
        "gauge",
        "Write-log bytes holding data not yet in the store.",
        &|v| v.status().log_used_bytes as f64,
    );
    metric(
        "uploads_pending",
        "gauge",
        "Objects queued, uploading, or waiting to apply.",
        &|v| v.status().uploads_pending as f64,
    );
    metric(
        "uploads_held",
        "gauge",
        "Client objects held back until GC brings the store under live/gc-start.",
        &|v| v.status().uploads_held as f64,
    );
    metric(
        "client_write_bytes_total",
        "counter",
        "Bytes written by clients (volume lifetime).",
        &|v| v.status().lifetime_client_write_bytes as f64,
    );
    metric(
        "store_write_bytes_total",
        "counter",
        "Bytes written to the store (volume lifetime).",
        &|v| v.status().lifetime_store_write_bytes as f64,
    );
    metric(
        "write_amplification",
        "gauge",
        "Store bytes written per client byte (volume lifetime).",
        &|v| {
            let s = v.status();
            if s.lifetime_client_write_bytes == 0 {
                0.0
            } else {
                s.lifetime_store_write_bytes as f64 / s.lifetime_client_write_bytes as f64
            }
        },
    );
    metric(
        "gc_passes_total",
        "counter",
        "Garbage-collection passes (volume lifetime).",
        &|v| v.status().gc_passes as f64,
    );
    metric(
        "gc_moved_bytes_total",
        "counter",
        "Bytes relocated by GC (volume lifetime).",
        &|v| v.status().gc_moved_bytes as f64,
    );
    metric(
        "gc_pass_in_flight",
        "gauge",
        "1 while a GC pass is relocating data or waiting for its checkpoint.",
        &|v| f64::from(u8::from(v.status().gc_pass_in_flight)),
    );
    metric(
        "gc_superseded_bytes_total",
        "counter",
        "Bytes GC copied that clients overwrote before the copy applied (this process).",
        &|v| v.status().gc_superseded_bytes as f64,
    );
    metric(
        "gc_read_cache_bytes_total",
        "counter",
        "Bytes of live data GC read from the read cache instead of the store (this process).",
        &|v| v.status().gc_cache_read_bytes as f64,
    );
    metric(
        "read_cache_hits_total",
        "counter",
        "Read-cache chunk hits.",
        &|v| v.status().read_cache_hits as f64,
    );
    metric(
        "read_cache_misses_total",
        "counter",
        "Read-cache chunk misses.",
        &|v| v.status().read_cache_misses as f64,
    );
    metric(
        "client_read_bytes_total",
        "counter",
        "Bytes read by clients.",
        &|v| v.stats().client_read_bytes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_syncs_total",
        "counter",
        "fdatasync calls on the write log.",
        &|v| v.stats().log_syncs.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_records_total",
        "counter",
        "Write-log records (group commits).",
        &|v| v.stats().log_records.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_puts_total",
        "counter",
        "Object PUT attempts.",
        &|v| v.stats().store_puts.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_put_retries_total",
        "counter",
        "Failed object PUTs that were retried.",
        &|v| v.stats().store_put_retries.load(Ordering::Relaxed) as f64,
    );
    metric("store_gets_total", "counter", "Ranged GETs issued.", &|v| {
        v.stats().store_gets.load(Ordering::Relaxed) as f64
    });
    out
}

/// Answer every HTTP request on `listener` with the metrics, until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    volumes: Vec<Arc<Volume>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let volumes = Arc::new(volumes);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let volumes = volumes.clone();
        tokio::spawn(async move {
            // Read the request head (bounded), ignore it, answer.
            let mut buf = vec![0u8; 8192];
            let mut got = 0;
            while got < buf.len() {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    stream.read(&mut buf[got..]),
                )
                .await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => {
                        got += n;
                        if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
            let body = render(&volumes);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
