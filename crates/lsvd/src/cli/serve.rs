//! `lsvd serve`: open volumes, serve them over NBD, shut down cleanly on a signal.
//!
//! Who may connect is settled before anything is opened (docs/SEMANTICS.md, "Who may
//! connect"): plain-text listeners (NBD without TLS or with `--tls optional`, and the
//! HTTP metrics endpoint, which names every volume and has no access control) on a
//! non-loopback address need `--insecure`, and say so with a warning; TLS without
//! `--tls-client-ca` warns on any address, loopback included, that any client
//! completing the handshake gets every export (encryption is not access control,
//! and a listener set up with TLS is usually on its way to being exposed).

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use lsvd_nbd::server::{Export, Server};
use lsvd_nbd::{Limits, Tls, TlsMode};

use super::duration::{parse_duration, parse_positive_duration};
use super::tuning::{ProfileUse, resolve_tuning};
use super::{Common, ServeArgs};
use crate::nbd_device::NbdVolume;
use crate::probe::settings::Tuning;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::size::format_size;
use lsvd_engine::Volume;

const DEFAULT_VOLUME: &str = "disk0";
const DEFAULT_SIZE_BYTES: u64 = 16 << 30;
const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// Hold an exclusive lock on the data directory for the life of the process. Held
/// by another process: `Conflict`.
pub(super) fn lock_data_dir(dir: &Path) -> Result<File> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::local_io(format!("cannot create data directory {}", dir.display()), e)
    })?;
    let path = dir.join("lock");
    let f = File::create(&path)
        .map_err(|e| Error::local_io(format!("cannot open {}", path.display()), e))?;
    // SAFETY: flock on a valid descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "data directory {} is in use by another lsvd process",
                dir.display()
            ),
        ));
    }
    Ok(f)
}

/// The data directory's lock for an offline command (`what` it would do, for the
/// message), held while the command runs; None if the directory does not exist (no
/// server can be using it). A server holding it: `Conflict`, saying to stop it first.
pub(super) fn lock_for_offline(common: &super::Common, what: &str) -> Result<Option<File>> {
    if !common.data.is_dir() {
        return Ok(None);
    }
    lock_data_dir(&common.data).map(Some).map_err(|e| {
        e.context(format!(
            "cannot {what} while a server uses this data directory (stop it first)"
        ))
    })
}

/// Bind a Unix socket, replacing a stale socket file left by a crashed server. A
/// socket a live server answers on is a `Conflict`.
fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener> {
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!("socket {} is in use by a running server", path.display()),
                ));
            }
            Err(_) => std::fs::remove_file(path).map_err(|e| {
                Error::local_io(format!("cannot remove stale socket {}", path.display()), e)
            })?,
        }
    }
    tokio::net::UnixListener::bind(path)
        .map_err(|e| Error::local_io(format!("cannot listen on {}", path.display()), e))
}

/// A listener that cannot be bound: `BadInput` for an address that is not one,
/// `LocalIo` otherwise (in use, not allowed).
fn listen_error(what: String, e: std::io::Error) -> Error {
    let kind = match e.kind() {
        std::io::ErrorKind::InvalidInput => ErrorKind::BadInput,
        _ => ErrorKind::LocalIo,
    };
    Error::with_source(kind, what, e)
}

/// True if every address `--listen` resolved to is a loopback one: only then may plain
/// NBD go without `--insecure`.
fn all_loopback(addrs: &[SocketAddr]) -> bool {
    !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
}

/// The TLS settings of the TCP listener, with the files read and checked now (so a bad
/// file fails the start, not the first connection), and the `--insecure` rule applied:
/// plain NBD on a non-loopback address needs it, and gets a warning. TLS without a
/// client CA is served on any address, with a warning that anyone may connect. The
/// warnings are returned, to be printed once every rule passed (a refused start stays
/// one line).
async fn tcp_security(
    args: &ServeArgs,
    listen: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Option<Tls>> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let files = crate::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            };
            let mode = match args.tls.as_deref() {
                Some("optional") => TlsMode::Optional,
                _ => TlsMode::Required,
            };
            Some(Tls {
                mode,
                acceptor: Arc::new(files.load()?),
            })
        }
        _ => None,
    };
    let Some(addr) = listen else {
        return Ok(tls);
    };
    if tls.is_some() && args.tls_client_ca.is_none() {
        warnings.push(format!(
            "serving {addr} over TLS without --tls-client-ca: traffic is encrypted, but any client that completes a TLS handshake can read and write every export (give --tls-client-ca CA.pem to require client certificates)"
        ));
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| listen_error(format!("cannot listen on {addr}"), e))?
        .collect();
    if all_loopback(&addrs) {
        return Ok(tls);
    }
    let plain_served = tls.as_ref().is_none_or(|t| t.mode == TlsMode::Optional);
    if !plain_served {
        return Ok(tls);
    }
    if !args.insecure {
        let how = if tls.is_some() {
            "use --tls required (the default with --tls-cert)"
        } else {
            "give --tls-cert FILE --tls-key FILE (see README \"Serving over the network\")"
        };
        return Err(Error::bad_input(format!(
            "refusing to serve plain-text NBD on {addr}, which is not a loopback address: \
             {how}, listen on 127.0.0.1, or add --insecure if every host that can reach the port may read and write the disks"
        )));
    }
    warnings.push(format!(
        "serving plain-text NBD on {addr} (--insecure): anyone who can reach it can read and write every export"
    ));
    Ok(tls)
}

/// The `--insecure` rule for `--metrics ADDR`: the endpoint is plain HTTP with no
/// access control, and what it serves (every volume's name, size, traffic and store
/// activity) is for the host's operator, so a non-loopback address needs
/// `--insecure`, and gets a warning (returned, as by [`tcp_security`]).
async fn metrics_security(args: &ServeArgs, warnings: &mut Vec<String>) -> Result<()> {
    let Some(addr) = &args.metrics else {
        return Ok(());
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr.as_str())
        .await
        .map_err(|e| listen_error(format!("cannot listen for metrics on {addr}"), e))?
        .collect();
    if all_loopback(&addrs) {
        return Ok(());
    }
    if !args.insecure {
        return Err(Error::bad_input(format!(
            "refusing to serve metrics on {addr}, which is not a loopback address: the \
             endpoint is plain HTTP without access control and names every volume; give \
             --metrics 127.0.0.1:PORT (scrape it through a proxy or tunnel), or add \
             --insecure if every host that can reach the port may read it"
        )));
    }
    warnings.push(format!(
        "serving metrics on {addr} (--insecure): plain HTTP, anyone who can reach it can read every volume's metrics"
    ));
    Ok(())
}

/// One line naming each tuned setting, its value and its origin.
fn settings_line(t: &Tuning) -> String {
    let parts: Vec<String> = t
        .rows()
        .into_iter()
        .map(|(name, value, origin)| format!("{name} {value} ({origin})"))
        .collect();
    format!("lsvd: settings: {}", parts.join(", "))
}

/// The NBD server's bounds: the library's defaults (lsvd_nbd's `Limits`) with the
/// handshake and idle timeouts of the command line.
fn nbd_limits(args: &ServeArgs) -> Result<Limits> {
    Ok(Limits {
        handshake_timeout: parse_positive_duration("--handshake-timeout", &args.handshake_timeout)?,
        idle_timeout: parse_duration("--idle-timeout", &args.idle_timeout)?,
        ..Limits::default()
    })
}

pub async fn serve(common: &Common, args: ServeArgs) -> Result<()> {
    // Flags are checked before anything is measured or locked.
    args.engine.to_config()?;
    let limits = nbd_limits(&args)?;
    let qos_defaults = args.limits.limits();
    let listen = match (&args.listen, &args.socket) {
        (Some(l), _) => Some(l.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_LISTEN.to_string()),
    };
    if listen.is_none() && args.tls_cert.is_some() {
        return Err(Error::bad_input(
            "--tls-cert applies to --listen (TCP); Unix sockets are always plain",
        ));
    }
    let mut warnings = Vec::new();
    let tls = tcp_security(&args, listen.as_deref(), &mut warnings).await?;
    metrics_security(&args, &mut warnings).await?;
    for w in &warnings {
        lsvd_store::log::warn(w);
    }
    let _lock = lock_data_dir(&common.data)?;
    let store = super::admin::store(common)?;
    if common.file.selftest_on_start() {
        // Refuse to serve from a store that would break the design's assumptions
        // (above all: put-if-absent must be atomic).
        let report =
            lsvd_store::selftest::run_with(&*store, common.file.selftest_race_writers()).await?;
        lsvd_store::log::debug(&report.to_string());
    }
    // Under the lock (two servers never probe one directory at once) and after the
    // store is known to work (a bad store fails the start before anything is measured).
    let use_ = if args.no_probe {
        ProfileUse::Ignore
    } else {
        ProfileUse::ProbeIfMissing
    };
    let resolved =
        tokio::task::block_in_place(|| resolve_tuning(common, &args.engine.tuning, use_))?;
    let mut config = args.engine.to_config_tuned(&resolved.tuning)?;
    config.discard_superseded_log = args.discard_superseded_log || args.standby;
    // One read cache for every volume served (a clone hits its base's chunks), unless
    // local files are encrypted: then each volume keeps its own, under its own keys.
    if config.encrypt_local != Some(true) {
        config.host_read_cache = tokio::task::block_in_place(|| {
            lsvd_engine::HostReadCache::open_files(&common.data, config.read_cache_bytes)
        })?;
    }
    config.lease.holder =
        lsvd_engine::fencing::lease::describe_this_process(&match (&listen, &args.socket) {
            (Some(l), _) => format!("lsvd serve on {l}"),
            (None, Some(s)) => format!("lsvd serve on {}", s.display()),
            (None, None) => "lsvd serve".to_string(),
        });
    if args.standby {
        config.lease.takeover = lsvd_engine::fencing::lease::Takeover::Wait;
        if args.names.len() != 1 || lsvd_engine::split_export_name(&args.names[0]).1.is_some() {
            return Err(Error::bad_input(
                "--standby takes exactly one volume to stand by for (not a snapshot): lsvd serve VOL --standby",
            ));
        }
    }
    let mut signals = StopSignals::catch();
    // Caught from here on too (SIGHUP would otherwise stop the process).
    let hangup = crate::qos::reload::catch_sighup();
    let mut names = args.names.clone();
    if names.is_empty() {
        names.push(DEFAULT_VOLUME.to_string());
        match lsvd_engine::read_meta(&store, DEFAULT_VOLUME).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                lsvd_engine::create_volume(&store, DEFAULT_VOLUME, DEFAULT_SIZE_BYTES).await?;
                eprintln!(
                    "lsvd: created volume {DEFAULT_VOLUME} ({}) in {}",
                    format_size(DEFAULT_SIZE_BYTES),
                    store.describe()
                );
            }
            Err(e) => return Err(e),
        }
    }
    let mut seen = std::collections::HashSet::new();
    for n in &names {
        if !seen.insert(n) {
            return Err(Error::bad_input(format!("volume {n} named twice")));
        }
    }

    // QoS limits (crate::qos): settled before anything is opened.
    let qos_clock = lsvd_store::clock::SharedClock::default();
    let throttles = names
        .iter()
        .map(|name| {
            let qos = crate::qos::limits::for_export(&qos_defaults, &common.file.volumes, name)?;
            Ok(crate::qos::Throttle::new(name, &qos, qos_clock.0.clone()))
        })
        .collect::<Result<Vec<_>>>()?;

    let mut volumes: Vec<Arc<Volume>> = Vec::new();
    let mut exports = Vec::new();
    for (name, throttle) in names.iter().zip(&throttles) {
        // Each volume's own store: an encrypted one's is unlocked with the key file
        // (refused here, before anything is written, without it).
        let unlocked = match super::admin::unlocked(common, &store, name).await {
            Ok(s) => super::admin::local_keys(common, &store, name)
                .await
                .map(|keys| (s, keys)),
            Err(e) => Err(e),
        };
        let (unlocked, config) = match unlocked {
            Ok((s, keys)) => {
                let mut config = config.clone();
                config.local_keys = keys;
                (Ok(s), config)
            }
            Err(e) => (Err(e), config.clone()),
        };
        let opened = match (unlocked, lsvd_engine::split_export_name(name)) {
            (Err(e), _) => Err(e),
            (Ok(store), (volume, Some(snapshot))) => {
                lsvd_engine::open_snapshot(
                    store.clone(),
                    volume,
                    snapshot,
                    &common.data,
                    config.clone(),
                )
                .await
            }
            (Ok(store), (volume, None)) if args.standby => {
                eprintln!(
                    "lsvd: standing by for {volume}: it is served here once its server stops or its lease lapses"
                );
                let stand_by = async {
                    loop {
                        match lsvd_engine::open_volume(
                            store.clone(),
                            volume,
                            &common.data,
                            config.clone(),
                        )
                        .await
                        {
                            // Another process claimed it first, or the holder renewed
                            // just as this one took over: stand by again.
                            Err(e)
                                if e.kind == ErrorKind::Conflict
                                    && e.message
                                        .contains(lsvd_engine::fencing::lease::CLAIM_RACE) =>
                            {
                                lsvd_store::log::info(&format!("{e}; standing by again"));
                            }
                            other => return other,
                        }
                    }
                };
                tokio::select! {
                    r = stand_by => r,
                    () = signals.wait() => {
                        eprintln!("lsvd: stopped while standing by (nothing was changed)");
                        return Ok(());
                    }
                }
            }
            (Ok(store), (volume, None)) => {
                lsvd_engine::open_volume(store, volume, &common.data, config.clone()).await
            }
        };
        let (volume, report) = match opened {
            Ok(v) => v,
            Err(e) => {
                for v in &volumes {
                    let _ = v.shutdown().await;
                }
                return Err(e);
            }
        };
        if report.log_records_replayed > 0
            || report.objects_replayed > 0
            || !report.stranded_deleted.is_empty()
        {
            eprintln!(
                "lsvd: recovered {name}: {} objects replayed, {} write-log records ({}) replayed, {} stranded objects removed",
                report.objects_replayed,
                report.log_records_replayed,
                format_size(report.log_bytes_replayed),
                report.stranded_deleted.len()
            );
        }
        if let Some(from) = &report.took_over_from {
            eprintln!(
                "lsvd: took {name} over from {from} (epoch {}): it serves what the store held",
                report.epoch
            );
        }
        if report.log_records_discarded > 0 {
            eprintln!(
                "lsvd: {name}: discarded {} write-log records a superseded session acknowledged",
                report.log_records_discarded
            );
        }
        if report.log_records_kept > 0 {
            eprintln!(
                "lsvd: {name}: the write log still holds {} records the store has; reads of them stay local",
                report.log_records_kept
            );
        }
        let log_capacity = volume.status().log_capacity_bytes;
        let device = NbdVolume::new(volume.clone(), log_capacity).with_throttle(throttle.clone());
        exports.push(Export {
            name: name.clone(),
            description: format!("lsvd volume {name}"),
            device: Arc::new(device),
        });
        volumes.push(volume);
    }

    let notices: lsvd_nbd::Notices = Arc::new(|line: &str| lsvd_store::log::warn(line));
    // A client that vanishes mid-request, or that a timeout closed, gets one line here
    // and a count in lsvd_nbd_connections_aborted_total (timeouts also in their own
    // counters). Refused requests and clients turned away go to the notices, at most
    // a line a second per connection (lsvd_nbd_requests_refused_total).
    // Each client on a thread of its own: see lsvd_nbd's `threads` and nbd_device.rs.
    let server = Arc::new(
        Server::with_limits(exports, limits)
            .with_connection_threads(true)
            .with_busy_poll(std::time::Duration::from_micros(args.busy_poll_us))
            .with_notices(notices)
            .on_connection_error(Box::new(|e| {
                lsvd_store::log::warn(&format!("nbd: connection ended abnormally: {e}"));
            })),
    );
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    // `lsvd sync`, snapshots, resize... reach this process here. Opened before the NBD
    // listeners: a script that waits for the NBD socket and then runs a command must
    // find the server's control socket too, or the command takes the server for
    // absent and fails on the data directory's lock (a CI run did). Without it the
    // volumes are still served: say why and go on.
    let control = match crate::control::start(&common.data, volumes.clone(), shutdown_rx.clone()) {
        Ok(path) => Some(path),
        Err(e) => {
            lsvd_store::log::warn(&format!(
                "no control socket (lsvd sync will not reach this server): {e}"
            ));
            None
        }
    };
    let mut tasks = Vec::new();
    if let Some(addr) = &listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| listen_error(format!("cannot listen on {addr}"), e))?;
        let local = listener.local_addr().map_err(|e| Error::local_io("", e))?;
        let s = server.clone();
        let rx = shutdown_rx.clone();
        match tls.clone() {
            Some(tls) => {
                let mode = tls.mode;
                tasks.push(tokio::spawn(
                    async move { s.serve_tls(listener, tls, rx).await },
                ));
                print_tls_hints(&names, local, mode, args.tls_client_ca.is_some());
            }
            None => {
                tasks.push(tokio::spawn(async move { s.serve(listener, rx).await }));
                print_plain_hints(&names, local);
            }
        }
    }
    if let Some(path) = &args.socket {
        let listener = bind_unix(path)?;
        let s = server.clone();
        let rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move { s.serve(listener, rx).await }));
        eprintln!(
            "lsvd: serving {} on unix socket {}",
            names.join(", "),
            path.display()
        );
        eprintln!(
            "  nbdinfo:    nbdinfo 'nbd+unix:///{}?socket={}'",
            names[0],
            path.display()
        );
        eprintln!(
            "  qemu:       -drive file=nbd+unix:///{}?socket={},format=raw",
            names[0],
            path.display()
        );
    }
    if let Some(addr) = &args.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| listen_error(format!("cannot listen for metrics on {addr}"), e))?;
        let local = listener.local_addr().map_err(|e| Error::local_io("", e))?;
        tokio::spawn(crate::metrics::serve(
            listener,
            volumes.clone(),
            server.connection_stats(),
            store.clone(),
            throttles.clone(),
            server.request_stats(),
            shutdown_rx.clone(),
        ));
        eprintln!("lsvd: metrics on http://{local}/metrics");
    }
    // Said once serving, as the settings below.
    for t in throttles.iter().filter(|t| t.is_limited()) {
        eprintln!("lsvd: {}: QoS {}", t.export(), t.limits().describe());
    }
    for table in crate::qos::limits::unmatched(&common.file.volumes, &names) {
        lsvd_store::log::info(&format!(
            "config file: [volumes.{table}] names no volume this server serves (ignored)"
        ));
    }
    tokio::spawn(crate::qos::reload::on_sighup(
        hangup,
        common.file_path.clone(),
        qos_defaults,
        throttles,
        shutdown_rx.clone(),
    ));
    // Said once serving, so that a failed start stays one error line.
    eprintln!("{}", settings_line(&resolved.tuning));
    if let Some(host) = &config.host_read_cache {
        eprintln!(
            "lsvd: read cache {} ({}), shared by {} export{}; {} chunks warm",
            common
                .data
                .join(format!("{}.rcache", lsvd_engine::HOST_CACHE_STEM))
                .display(),
            format_size(host.slot_count() as u64 * lsvd_engine::READ_CACHE_CHUNK_BYTES),
            volumes.len(),
            if volumes.len() == 1 { "" } else { "s" },
            host.entries()
        );
    }
    eprintln!("lsvd: press Ctrl-C to stop (writes are drained and uploaded first)");

    let all_failed = tokio::select! {
        () = signals.wait() => false,
        () = all_volumes_failed(&volumes) => true,
    };
    eprintln!("lsvd: shutting down: draining connections");
    let _ = shutdown_tx.send(true);
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("lsvd: listener ended with error: {e}"),
            Err(e) => eprintln!("lsvd: listener task failed: {e}"),
        }
    }
    let mut result = Ok(());
    for v in &volumes {
        eprintln!("lsvd: uploading and checkpointing {}", v.meta().name);
        if let Err(e) = v.shutdown().await {
            result = Err(e.context(format!(
                "volume {} did not shut down cleanly",
                v.meta().name
            )));
        }
    }
    for path in args.socket.iter().chain(control.iter()) {
        let _ = std::fs::remove_file(path);
    }
    if all_failed && result.is_ok() {
        result = Err(Error::new(
            ErrorKind::VolumeFailed,
            "every volume this server served failed (see the lines above); it stopped",
        ));
    }
    if result.is_ok() {
        eprintln!("lsvd: stopped cleanly");
    }
    result
}

/// Returns once every writable volume has failed (fenced by a takeover, a failed
/// cache device, a panic), a few seconds after the last one failed, so that requests
/// in flight get their error answers first: a server with nothing left to serve
/// stops, and exits non-zero.
async fn all_volumes_failed(volumes: &[Arc<Volume>]) {
    let writable: Vec<&Arc<Volume>> = volumes
        .iter()
        .filter(|v| v.snapshot_name().is_none())
        .collect();
    if writable.is_empty() {
        return std::future::pending().await;
    }
    let clock = lsvd_store::clock::SharedClock::default();
    loop {
        clock.sleep(std::time::Duration::from_millis(250)).await;
        if writable.iter().all(|v| v.status().failure.is_some()) {
            lsvd_store::log::error("every volume of this server failed: stopping in 3 s");
            clock.sleep(std::time::Duration::from_secs(3)).await;
            return;
        }
    }
}

/// SIGINT and SIGTERM, caught from the moment this is made: a signal that arrives
/// while the listeners start (a test, or a quick Ctrl-C, as soon as the socket
/// appears) still drains and stops cleanly instead of killing the process.
struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn catch() -> StopSignals {
        use tokio::signal::unix::{SignalKind, signal};
        StopSignals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    async fn wait(&mut self) {
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            _ = recv(&mut self.interrupt) => {}
            _ = recv(&mut self.terminate) => {}
        }
    }
}

/// How to connect to the plain TCP listener at `local`.
fn print_plain_hints(names: &[String], local: SocketAddr) {
    eprintln!("lsvd: serving {} on nbd://{local}", names.join(", "));
    eprintln!(
        "  qemu:       qemu-system-x86_64 -drive file=nbd://{local}/{},format=raw,cache=none ...",
        names[0]
    );
    eprintln!("  nbdinfo:    nbdinfo nbd://{local}/{}", names[0]);
    eprintln!(
        "  nbdfuse:    mkdir -p mnt && nbdfuse mnt/ nbd://{local}/{}   # then mnt/nbd is the disk",
        names[0]
    );
    eprintln!(
        "  nbd-client: nbd-client {} {} /dev/nbd0 -N {}",
        local.ip(),
        local.port(),
        names[0]
    );
}

/// How to connect to the TLS listener at `local`. DIR holds the client's ca-cert.pem,
/// client-cert.pem and client-key.pem (the layout libnbd and qemu both read).
fn print_tls_hints(names: &[String], local: SocketAddr, mode: TlsMode, client_certs: bool) {
    let mode = match mode {
        TlsMode::Required => "TLS required",
        TlsMode::Optional => "TLS optional, plain clients served too",
    };
    let who = if client_certs {
        "clients need a certificate signed by --tls-client-ca"
    } else {
        "any client may connect (no --tls-client-ca)"
    };
    eprintln!(
        "lsvd: serving {} on nbds://{local} ({mode}; {who})",
        names.join(", ")
    );
    eprintln!(
        "  nbdinfo:    nbdinfo 'nbds://{local}/{}?tls-certificates=DIR'   # DIR: ca-cert.pem client-cert.pem client-key.pem",
        names[0]
    );
    eprintln!(
        "  qemu:       -object tls-creds-x509,id=tls0,dir=DIR,endpoint=client \
         -drive driver=nbd,host={},port={},export={},tls-creds=tls0",
        local.ip(),
        local.port(),
        names[0]
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_may_serve_plain_text() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("address");
        assert!(all_loopback(&[a("127.0.0.1:10809")]));
        assert!(all_loopback(&[a("[::1]:10809"), a("127.0.0.2:1")]));
        assert!(!all_loopback(&[]));
        assert!(!all_loopback(&[a("0.0.0.0:10809")]));
        assert!(!all_loopback(&[a("[::]:10809")]));
        assert!(!all_loopback(&[a("192.0.2.7:10809")]));
        // localhost resolving to a loopback and a routable address: not loopback.
        assert!(!all_loopback(&[a("127.0.0.1:1"), a("10.0.0.1:1")]));
    }
}
