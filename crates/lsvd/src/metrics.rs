//! A Prometheus endpoint (`lsvd serve --metrics HOST:PORT`): the counters of every
//! served volume in the text exposition format, on any HTTP GET.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_nbd::server::request_stats::{LATENCY_BUCKETS_SECS, RequestStats};
use lsvd_nbd::{ConnectionStats, RefusalReason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use lsvd_engine::{Volume, VolumeStatus};

/// Render the metrics of `volumes`.
pub fn render(volumes: &[Arc<Volume>]) -> String {
    // One status per volume (one hold of its state lock), shared by every metric.
    let volumes: Vec<(&Volume, VolumeStatus)> =
        volumes.iter().map(|v| (v.as_ref(), v.status())).collect();
    let mut out = String::new();
    let mut metric =
        |name: &str, kind: &str, help: &str, values: &dyn Fn(&Volume, &VolumeStatus) -> f64| {
            let _ = writeln!(out, "# HELP lsvd_{name} {help}");
            let _ = writeln!(out, "# TYPE lsvd_{name} {kind}");
            for (v, status) in &volumes {
                let _ = writeln!(
                    out,
                    "lsvd_{name}{{volume=\"{}\"}} {}",
                    v.export_name(),
                    values(v, status)
                );
            }
        };
    metric("size_bytes", "gauge", "Volume size.", &|v, _| {
        v.size_bytes() as f64
    });
    metric(
        "live_bytes",
        "gauge",
        "Bytes of live data in the store.",
        &|_, s| s.live_bytes as f64,
    );
    metric(
        "store_bytes",
        "gauge",
        "Bytes of data and GC objects in the store.",
        &|_, s| s.store_bytes as f64,
    );
    metric(
        "utilization",
        "gauge",
        "Live bytes over stored bytes.",
        &|_, s| s.utilization,
    );
    metric(
        "objects",
        "gauge",
        "Data and GC objects in the store.",
        &|_, s| s.objects as f64,
    );
    metric(
        "log_used_bytes",
        "gauge",
        "Write-log bytes holding data not yet in the store.",
        &|_, s| s.log_used_bytes as f64,
    );
    metric(
        "log_retained_bytes",
        "gauge",
        "Write-log bytes of uploaded records kept to serve reads locally, freed as \
         the log needs the space.",
        &|_, s| s.log_retained_bytes as f64,
    );
    metric(
        "uploads_pending",
        "gauge",
        "Objects queued, uploading, or waiting to apply.",
        &|_, s| s.uploads_pending as f64,
    );
    metric(
        "uploads_held",
        "gauge",
        "Client objects held back until GC brings the store under live/gc-start.",
        &|_, s| s.uploads_held as f64,
    );
    metric(
        "client_write_bytes_total",
        "counter",
        "Bytes written by clients (volume lifetime).",
        &|_, s| s.lifetime_client_write_bytes as f64,
    );
    metric(
        "store_write_bytes_total",
        "counter",
        "Bytes written to the store (volume lifetime).",
        &|_, s| s.lifetime_store_write_bytes as f64,
    );
    metric(
        "write_amplification",
        "gauge",
        "Store bytes written per client byte (volume lifetime).",
        &|_, s| {
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
        &|_, s| s.gc_passes as f64,
    );
    metric(
        "gc_passes_failed_total",
        "counter",
        "Garbage-collection passes given up (a victim could not be read from the \
         store, say) and tried again later.",
        &|v, _| v.stats().gc_passes_failed.load(Ordering::Relaxed) as f64,
    );
    metric(
        "gc_moved_bytes_total",
        "counter",
        "Bytes relocated by GC (volume lifetime).",
        &|_, s| s.gc_moved_bytes as f64,
    );
    metric(
        "gc_hot_fraction",
        "gauge",
        "hylog: the share of the data the latest GC pass treated as hot (0: no \
         separation, or another policy).",
        &|v, _| v.stats().gc_hot_fraction_ppm.load(Ordering::Relaxed) as f64 / 1e6,
    );
    metric(
        "gc_hot_moved_bytes_total",
        "counter",
        "hylog: bytes GC relocated into hot GC objects (lifetime, carried in checkpoints).",
        &|_, s| s.gc_hot_moved_bytes as f64,
    );
    metric(
        "gc_cold_moved_bytes_total",
        "counter",
        "hylog: bytes GC relocated into cold GC objects (lifetime, carried in checkpoints).",
        &|_, s| s.gc_cold_moved_bytes as f64,
    );
    metric(
        "batches_split_total",
        "counter",
        "hylog: client batches written as several data objects, one per heat class \
         (this process).",
        &|_, s| s.batches_split as f64,
    );
    metric(
        "gc_pass_in_flight",
        "gauge",
        "1 while a GC pass is relocating data or waiting for its checkpoint.",
        &|_, s| f64::from(u8::from(s.gc_pass_in_flight)),
    );
    metric(
        "gc_superseded_bytes_total",
        "counter",
        "Bytes GC copied that clients overwrote before the copy applied (this process).",
        &|_, s| s.gc_superseded_bytes as f64,
    );
    metric(
        "gc_read_cache_bytes_total",
        "counter",
        "Bytes of live data GC read from the read cache instead of the store (this process).",
        &|_, s| s.gc_cache_read_bytes as f64,
    );
    metric(
        "gc_defrag_bytes_total",
        "counter",
        "Bytes defragmenting GC (--gc-defrag-hole) planned to move to plug gaps between the extents it moves (this process).",
        &|_, s| s.gc_defrag_bytes as f64,
    );
    metric(
        "read_cache_hits_total",
        "counter",
        "Read-cache chunk hits.",
        &|_, s| s.read_cache_hits as f64,
    );
    metric(
        "read_cache_misses_total",
        "counter",
        "Read-cache chunk misses.",
        &|_, s| s.read_cache_misses as f64,
    );
    metric(
        "read_cache_chunks",
        "gauge",
        "Read-cache chunks (64 KiB) charged to this volume: what its reads, uploads and \
         read-ahead cached, of the cache the server's volumes share.",
        &|_, s| s.read_cache_entries as f64,
    );
    metric(
        "read_cache_admitted_chunks_total",
        "counter",
        "Chunks of uploaded objects copied into the read cache.",
        &|_, s| s.read_cache_admitted_chunks as f64,
    );
    metric(
        "read_prefetch_bytes_total",
        "counter",
        "Bytes cached before a client asked for them: the rest of a read miss's fetch \
         (--read-fetch) and read-ahead.",
        &|_, s| s.read_prefetch_bytes as f64,
    );
    metric(
        "read_prefetch_hit_bytes_total",
        "counter",
        "Bytes of prefetched chunks a client then read (each chunk counted once).",
        &|_, s| s.read_prefetch_hit_bytes as f64,
    );
    metric(
        "read_ahead_bytes_total",
        "counter",
        "Bytes fetched ahead of sequential readers (--read-ahead): by LBA, and by place in an object (temporal).",
        &|_, s| s.read_ahead_bytes as f64,
    );
    metric(
        "read_ahead_temporal_bytes_total",
        "counter",
        "Of read_ahead_bytes_total, bytes fetched ahead of readers walking an object's data in the order it was written.",
        &|_, s| s.read_ahead_temporal_bytes as f64,
    );
    metric(
        "client_read_bytes_total",
        "counter",
        "Bytes read by clients.",
        &|v, _| v.stats().client_read_bytes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_syncs_total",
        "counter",
        "fdatasync calls on the write log.",
        &|v, _| v.stats().log_syncs.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_records_total",
        "counter",
        "Write-log records (group commits).",
        &|v, _| v.stats().log_records.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_handoffs_total",
        "counter",
        "Times the writes started by a thread were left to the log writer thread, \
         instead of appended by that thread: --log-writes-in-flight above 1, or a FLUSH \
         or FUA write (fdatasync) or a full write log on a thread that may not block \
         (the NBD server's runtime workers block for those themselves).",
        &|v, _| v.stats().log_handoffs.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_write_bytes_total",
        "counter",
        "Bytes written to the write log (record headers and padding included): over \
         client_write_bytes_total, the log's write amplification.",
        &|v, _| v.stats().log_write_bytes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_records_corrupt_total",
        "counter",
        "Write-log records that failed their CRC32C or data hash when read back for \
         upload: the cache device changed acknowledged data. Each fails the volume.",
        &|v, _| v.stats().log_records_corrupt.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_records_read_back_total",
        "counter",
        "Write-log records an upload read back from the log (and verified) because \
         they were not held in memory: replayed at open, or dropped to stay within \
         the upload memory bound.",
        &|v, _| v.stats().log_records_read_back.load(Ordering::Relaxed) as f64,
    );
    metric(
        "upload_memory_bytes",
        "gauge",
        "Bytes of write-log records held in memory for the upload.",
        &|_, s| s.upload_memory_bytes as f64,
    );
    metric(
        "read_cache_admissions_skipped_total",
        "counter",
        "Uploaded objects not copied into the read cache because too many copies were \
         already pending.",
        &|v, _| v.stats().admissions_skipped.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_puts_total",
        "counter",
        "Object PUT attempts.",
        &|v, _| v.stats().store_puts.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_put_retries_total",
        "counter",
        "Failed store requests of an upload (the ownership check or the PUT), all \
         retried: it grows while the store is unreachable.",
        &|v, _| v.stats().store_put_retries.load(Ordering::Relaxed) as f64,
    );
    metric(
        "objects_deleted_total",
        "counter",
        "Dead objects deleted from the store (each after the checkpoint that follows the \
         one that left it out).",
        &|v, _| v.stats().objects_deleted.load(Ordering::Relaxed) as f64,
    );
    metric(
        "object_deletes_failed_total",
        "counter",
        "Deletes of dead objects that failed (the store away, or refusing DELETE): \
         tried again after the next checkpoint; the next open removes what is left.",
        &|v, _| v.stats().object_deletes_failed.load(Ordering::Relaxed) as f64,
    );
    metric(
        "replica_held_deletes_total",
        "counter",
        "Deletes after a checkpoint put off because a replication pass under way (lsvd \
         replicate) still copies the object: tried again after the next checkpoint, \
         for at most --replica-hold after the pass began.",
        &|v, _| v.stats().replica_held_deletes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_get_failures_total",
        "counter",
        "Ranged GETs that failed after the store client's retries: each one a client \
         read answered with an error or a GC pass given up and tried later. It grows \
         while the store is unreachable.",
        &|v, _| v.stats().store_get_failures.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_copy_fallbacks_total",
        "counter",
        "Reads (client or GC) whose bytes failed their checksums on one copy of a \
         mirrored store and were answered from another copy; each also starts a \
         rewrite of the bad copy.",
        &|v, _| v.stats().copy_fallbacks.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_copies_repaired_total",
        "counter",
        "Bad copies of objects rewritten from a verified good copy after a fallback.",
        &|v, _| {
            v.stats()
                .copy_repairs
                .copies_rewritten
                .load(Ordering::Relaxed) as f64
        },
    );
    metric(
        "log_full_waits_total",
        "counter",
        "Times client writes found the write log full and waited for uploads to free \
         space (one per episode).",
        &|v, _| v.stats().log_full_waits.load(Ordering::Relaxed) as f64,
    );
    metric(
        "log_full",
        "gauge",
        "1 while client writes wait for space in a full write log.",
        &|v, _| f64::from(u8::from(v.stats().log_full.load(Ordering::Relaxed))),
    );
    metric(
        "log_stalled",
        "gauge",
        "1 from a write that found the write log full past --stall-timeout until \
         landed uploads free room: writes that do not fit fail at once meanwhile.",
        &|v, _| f64::from(u8::from(v.stats().log_stalled.load(Ordering::Relaxed))),
    );
    metric(
        "log_full_failures_total",
        "counter",
        "Writes failed (ENOSPC for a full store, EIO otherwise) because the write log \
         stayed full past --stall-timeout.",
        &|v, _| v.stats().log_full_failures.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_gets_total",
        "counter",
        "Ranged GETs issued.",
        &|v, _| v.stats().store_gets.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_get_bytes_total",
        "counter",
        "Bytes returned by those GETs (object data and headers).",
        &|v, _| v.stats().store_get_bytes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_full",
        "gauge",
        "1 while the store refuses uploads for lack of room (ENOSPC, a quota, HTTP \
         507): writes go on into the write log and fail with ENOSPC once it is full.",
        &|v, _| f64::from(u8::from(v.stats().store_full.load(Ordering::Relaxed))),
    );
    metric(
        "store_denied",
        "gauge",
        "1 while the store refuses uploads with these credentials (HTTP 401/403).",
        &|v, _| f64::from(u8::from(v.stats().store_denied.load(Ordering::Relaxed))),
    );
    metric(
        "store_full_episodes_total",
        "counter",
        "Episodes in which the store refused uploads for lack of room.",
        &|v, _| v.stats().store_full_episodes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "store_denied_episodes_total",
        "counter",
        "Episodes in which the store refused uploads' credentials.",
        &|v, _| v.stats().store_denied_episodes.load(Ordering::Relaxed) as f64,
    );
    metric(
        "lease_held",
        "gauge",
        "1 while this server holds the volume's lease and may answer requests; 0 \
         while answers wait for a renewal, after a takeover, or with no lease.",
        &|v, _| f64::from(u8::from(v.lease_status().held)),
    );
    metric(
        "lease_fenced",
        "gauge",
        "1 once another process took the volume over: every request fails.",
        &|v, _| f64::from(u8::from(v.lease_status().fenced)),
    );
    metric(
        "lease_took_over",
        "gauge",
        "1 if this server took the volume over from a holder whose lease lapsed.",
        &|v, _| f64::from(u8::from(v.lease_status().took_over)),
    );
    metric(
        "lease_epoch",
        "gauge",
        "The epoch of this server's claim of the volume (its objects carry it).",
        &|v, _| v.lease_status().epoch as f64,
    );
    metric(
        "lease_renewals_total",
        "counter",
        "Volume superblock generations written (renewals and checkpoints).",
        &|v, _| v.lease_status().renewals as f64,
    );
    metric(
        "lease_renewal_failures_total",
        "counter",
        "Lease renewals the store did not take.",
        &|v, _| v.lease_status().renewal_failures as f64,
    );
    metric(
        "lease_expiries_total",
        "counter",
        "Episodes in which answers waited because the lease was not renewed in time.",
        &|v, _| v.lease_status().expiries as f64,
    );
    out
}

/// The NBD server's connection counters (not per volume: a connection that breaks
/// before or during the handshake has no volume), and the requests it refused itself,
/// by reason.
pub fn render_connections(stats: &ConnectionStats) -> String {
    let mut out = String::new();
    for (name, help, value) in [
        (
            "nbd_connections_total",
            "NBD connections accepted.",
            stats.accepted.load(Ordering::Relaxed),
        ),
        (
            "nbd_connections_aborted_total",
            "NBD connections that ended with an error: a client that hung up mid-request \
             or with requests unanswered, broke the protocol, stopped reading replies, or \
             was closed by the handshake or idle timeout.",
            stats.ended_with_error.load(Ordering::Relaxed),
        ),
        (
            "nbd_connections_turned_away_total",
            "NBD clients closed as soon as they connected because every connection slot \
             or every handshake slot was taken (not in nbd_connections_total).",
            stats.turned_away.load(Ordering::Relaxed),
        ),
        (
            "nbd_handshake_timeouts_total",
            "NBD connections closed because their handshake outlived --handshake-timeout.",
            stats.handshake_timeouts.load(Ordering::Relaxed),
        ),
        (
            "nbd_idle_timeouts_total",
            "NBD connections closed by --idle-timeout: no request, or no reply taken, \
             for that long.",
            stats.idle_timeouts.load(Ordering::Relaxed),
        ),
    ] {
        let _ = writeln!(out, "# HELP lsvd_{name} {help}");
        let _ = writeln!(out, "# TYPE lsvd_{name} counter");
        let _ = writeln!(out, "lsvd_{name} {value}");
    }
    let _ = writeln!(
        out,
        "# HELP lsvd_nbd_requests_refused_total NBD requests the server refused itself, \
         before the volume saw them: too_large (over the advertised maximum), \
         out_of_range, misaligned, read_only, invalid (unknown command, flag or context)."
    );
    let _ = writeln!(out, "# TYPE lsvd_nbd_requests_refused_total counter");
    for reason in RefusalReason::ALL {
        let _ = writeln!(
            out,
            "lsvd_nbd_requests_refused_total{{reason=\"{}\"}} {}",
            reason.label(),
            stats.requests_refused(reason)
        );
    }
    out
}

/// Each export's NBD requests by op: a histogram of the time from a request's header
/// read to its reply queued for the client (its `_count` is the request count).
pub fn render_requests(exports: &[(String, Arc<RequestStats>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP lsvd_nbd_request_seconds NBD requests answered, by export and op, and the \
         time from each request's arrival to its reply (this process)."
    );
    let _ = writeln!(out, "# TYPE lsvd_nbd_request_seconds histogram");
    for (name, stats) in exports {
        let volume = name.replace('\\', "\\\\").replace('"', "\\\"");
        for k in stats.kinds() {
            let labels = format!("volume=\"{volume}\",op=\"{}\"", k.kind);
            for (bound, n) in LATENCY_BUCKETS_SECS.iter().zip(k.cumulative) {
                let _ = writeln!(
                    out,
                    "lsvd_nbd_request_seconds_bucket{{{labels},le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "lsvd_nbd_request_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                k.count
            );
            let _ = writeln!(
                out,
                "lsvd_nbd_request_seconds_sum{{{labels}}} {}",
                k.sum_secs
            );
            let _ = writeln!(
                out,
                "lsvd_nbd_request_seconds_count{{{labels}}} {}",
                k.count
            );
        }
    }
    out
}

/// The store's own metrics (`ObjectStore::metrics`: the chain's tail reads and
/// degraded mirrors), as `lsvd_store_*` labelled with the store's description.
pub fn render_store(store: &dyn lsvd_store::ObjectStore) -> String {
    let mut out = String::new();
    let label = store.describe().replace('\\', "\\\\").replace('"', "\\\"");
    for m in store.metrics() {
        let _ = writeln!(out, "# HELP lsvd_store_{} {}", m.name, m.help);
        let _ = writeln!(out, "# TYPE lsvd_store_{} {}", m.name, m.kind);
        let _ = writeln!(
            out,
            "lsvd_store_{}{{store=\"{label}\"}} {}",
            m.name, m.value
        );
    }
    out
}

/// Answer every HTTP request on `listener` with the metrics, until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    volumes: Vec<Arc<Volume>>,
    connections: Arc<ConnectionStats>,
    store: lsvd_store::DynStore,
    throttles: Vec<Arc<crate::qos::Throttle>>,
    requests: Vec<(String, Arc<RequestStats>)>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let render = move || {
        let mut body = render(&volumes);
        body.push_str(&crate::qos::throttle::render(&throttles));
        body.push_str(&render_requests(&requests));
        body.push_str(&render_connections(&connections));
        body.push_str(&render_store(store.as_ref()));
        body
    };
    serve_text(listener, Arc::new(render), shutdown).await;
}

/// Answer every HTTP request on `listener` with what `render` returns (Prometheus
/// text), until `shutdown`.
pub async fn serve_text(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let render = render.clone();
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
            let body = render();
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

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_engine::{EngineConfig, create_volume, open_volume};
    use lsvd_store::DynStore;
    use lsvd_store::mem::MemStore;
    use lsvd_store::testutil::TempDir;

    /// The value of `lsvd_{name}` for `volume` in a rendering.
    fn value(text: &str, name: &str, volume: &str) -> f64 {
        let prefix = format!("lsvd_{name}{{volume=\"{volume}\"}} ");
        let line = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
        line[prefix.len()..].parse().expect("a number")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_volume_gets_its_own_counters() {
        let store: DynStore = Arc::new(MemStore::new());
        let dir = TempDir::new("metrics");
        let config = EngineConfig {
            batch_size_bytes: 64 << 10,
            batch_timeout_ms: 20,
            log_size_bytes: 4 << 20,
            ..EngineConfig::default()
        };
        let mut volumes = Vec::new();
        for (name, bytes) in [("a", 3 * 4096u64), ("b", 64 << 10)] {
            create_volume(&store, name, 1 << 20).await.expect("create");
            let (v, _) = open_volume(store.clone(), name, &dir.path().join(name), config.clone())
                .await
                .expect("open");
            v.write(0, vec![7u8; bytes as usize], false)
                .await
                .expect("write");
            v.flush().await.expect("flush");
            volumes.push(v);
        }
        // Once uploaded (the open batch closes after its timeout), live bytes are what
        // each client wrote and the write logs are empty.
        let settled = |v: &Arc<Volume>, bytes: u64| {
            let s = v.status();
            s.uploads_pending == 0 && s.log_used_bytes == 0 && s.live_bytes == bytes
        };
        let all_settled = || {
            volumes
                .iter()
                .zip([3 * 4096u64, 64 << 10])
                .all(|(v, b)| settled(v, b))
        };
        // The uploads run on the other worker meanwhile; the asserts below say what
        // did not settle.
        let limit = std::time::Duration::from_secs(30);
        tokio::task::block_in_place(|| lsvd_store::clock::wait_real_time(limit, all_settled));
        let text = render(&volumes);
        for (v, bytes) in volumes.iter().zip([3 * 4096u64, 64 << 10]) {
            let name = &v.meta().name;
            let s = v.status();
            assert_eq!(s.uploads_pending, 0, "{name} uploaded");
            assert_eq!(value(&text, "size_bytes", name), (1 << 20) as f64);
            assert_eq!(value(&text, "live_bytes", name), bytes as f64);
            assert_eq!(value(&text, "client_write_bytes_total", name), bytes as f64);
            // One record: its header packed into one 512-byte sector, then the data.
            assert_eq!(
                value(&text, "log_write_bytes_total", name),
                (bytes + 512) as f64
            );
            assert_eq!(value(&text, "store_bytes", name), s.store_bytes as f64);
            assert_eq!(value(&text, "objects", name), s.objects as f64);
            assert_eq!(value(&text, "uploads_pending", name), 0.0);
        }
        for v in &volumes {
            v.shutdown().await.expect("shutdown");
        }
    }

    /// Every metric contrib/grafana/lsvd.json names is one lsvd exports: a renamed
    /// metric fails here rather than leaving an empty panel.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_dashboard_names_only_exported_metrics() {
        let store: DynStore = Arc::new(MemStore::new());
        let dir = TempDir::new("metrics-dashboard");
        create_volume(&store, "v", 1 << 20).await.expect("create");
        let config = EngineConfig {
            log_size_bytes: 4 << 20,
            ..EngineConfig::default()
        };
        let (v, _) = open_volume(store.clone(), "v", dir.path(), config)
            .await
            .expect("open");
        let throttle = crate::qos::Throttle::new(
            "v",
            &Default::default(),
            Arc::new(lsvd_store::clock::SystemClock::new()),
        );
        let text = render(std::slice::from_ref(&v))
            + &crate::qos::throttle::render(&[throttle])
            + &render_requests(&[("v".to_string(), Arc::default())])
            + &render_connections(&ConnectionStats::default())
            + &render_store(&*store);
        v.shutdown().await.expect("shutdown");
        // A histogram is queried by its series: NAME_bucket, NAME_sum, NAME_count.
        let exported: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .flat_map(|l| {
                let mut words = l.split_whitespace();
                let name = words.next().unwrap_or_default().to_string();
                match words.next() {
                    Some("histogram") => ["_bucket", "_sum", "_count"]
                        .iter()
                        .map(|s| format!("{name}{s}"))
                        .collect(),
                    _ => vec![name],
                }
            })
            .collect();
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../contrib/grafana/lsvd.json"))
                .expect("the dashboard is JSON");
        let mut queries = vec![
            dashboard["templating"]["list"][1]["query"]
                .as_str()
                .expect("the volume variable's query")
                .to_string(),
        ];
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                queries.push(target["expr"].as_str().expect("an expression").to_string());
            }
        }
        let mut named = std::collections::BTreeSet::new();
        for q in &queries {
            for (at, _) in q.match_indices("lsvd_") {
                let name: String = q[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                named.insert(name);
            }
        }
        assert!(named.len() >= 20, "the dashboard names {named:?}");
        let missing: Vec<_> = named
            .iter()
            .filter(|n| !exported.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "not exported: {missing:?}");
    }
}
