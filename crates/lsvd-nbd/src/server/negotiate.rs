//! Drives the fixed-newstyle handshake on a stream: greeting, client flags, then option
//! haggling until the client enters transmission (`NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME`)
//! or leaves.
//!
//! It owns the per-connection negotiation state (structured replies, selected metadata
//! contexts, whether TLS is up) and turns it into the [`ExportParams`] the transmission
//! phase runs with. With a TLS policy it also enforces the spec's FORCEDTLS rules and
//! upgrades the stream in place at `NBD_OPT_STARTTLS` (see `tls.rs`).

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::request::{ExportParams, MetaContexts, sanitize_block_sizes};
use super::tls::{TlsMode, Upgrade};
use super::{
    Export, MAX_LISTED_CONTEXTS, MAX_META_QUERIES, MAX_OPTION_BYTES, MAX_OPTION_DISCARD_BYTES,
    MAX_SELECTED_CONTEXTS, Notices, shutdown_requested,
};
use crate::BlockDevice;
use crate::proto::consts::*;
use crate::proto::handshake::*;

/// The result of a successful handshake.
pub(crate) struct Negotiated {
    pub export: usize,
    pub params: ExportParams,
}

/// Who is on the other end, and where to report what the server refused them.
pub(crate) struct Peer<'a> {
    /// e.g. `192.0.2.7:41234`, or `a local client` for a Unix socket.
    pub name: &'a str,
    pub notices: Option<&'a Notices>,
}

impl Peer<'_> {
    fn note(&self, message: &str) {
        if let Some(notices) = self.notices {
            notices(message);
        }
    }
}

/// Per-connection handshake state.
#[derive(Default)]
struct State {
    no_zeroes: bool,
    /// TLS is up (STARTTLS was acknowledged and the handshake succeeded).
    tls: bool,
    /// A refusal for lack of TLS was already reported for this connection.
    refusal_noted: bool,
    structured: bool,
    /// The export the last `NBD_OPT_SET_META_CONTEXT` named, and what it selected.
    selected: Option<(usize, Arc<MetaContexts>)>,
}

/// Transmission flags advertised for `device`.
pub(crate) fn transmission_flags<D: BlockDevice>(device: &D) -> u16 {
    let mut flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_CACHE;
    if device.flush_is_global() {
        flags |= FLAG_CAN_MULTI_CONN;
    }
    if device.read_only() {
        flags |= FLAG_READ_ONLY;
    }
    flags
}

fn find_export<D>(exports: &[Export<D>], name: &str) -> Option<usize> {
    if name.is_empty() && !exports.is_empty() {
        return Some(0);
    }
    exports.iter().position(|e| e.name == name)
}

/// Runs the handshake. `Ok(None)` means the client (or shutdown) ended the session
/// before transmission; errors are I/O failures or protocol violations that require
/// hanging up. With `tls`, STARTTLS replaces `stream` by its encrypted form.
pub(crate) async fn negotiate<D, S>(
    exports: &[Export<D>],
    stream: &mut S,
    tls: Option<&dyn Upgrade<S>>,
    peer: &Peer<'_>,
    shutdown: &mut watch::Receiver<bool>,
) -> io::Result<Option<Negotiated>>
where
    D: BlockDevice,
    S: AsyncRead + AsyncWrite + Unpin,
{
    // A client that hangs up before sending its flags only checked that we listen (a
    // port probe, a readiness check): not an error worth reporting.
    let probe = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset => Ok(None),
        _ => Err(e),
    };
    if let Err(e) = stream.write_all(&encode_greeting()).await {
        return probe(e);
    }
    if let Err(e) = stream.flush().await {
        return probe(e);
    }
    let mut flags = [0u8; 4];
    if let Err(e) = stream.read_exact(&mut flags).await {
        return probe(e);
    }
    let flags = parse_client_flags(flags)?;
    let mut state = State {
        no_zeroes: flags.no_zeroes,
        ..State::default()
    };

    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        tokio::select! {
            biased;
            // A server going away need not wait for a client that is still haggling.
            () = shutdown_requested(shutdown) => return Ok(None),
            read = stream.read_exact(&mut hdr) => { read?; }
        }
        let hdr = parse_option_header(&hdr)?;
        if hdr.length > MAX_OPTION_BYTES {
            if hdr.option == OPT_EXPORT_NAME || hdr.length > MAX_OPTION_DISCARD_BYTES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "NBD option too long",
                ));
            }
            let skipped = tokio::io::copy(
                &mut (&mut *stream).take(u64::from(hdr.length)),
                &mut tokio::io::sink(),
            )
            .await?;
            if skipped != u64::from(hdr.length) {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            send_option_error(stream, hdr.option, REP_ERR_TOO_BIG, "option data too long").await?;
            continue;
        }
        let mut data = vec![0u8; hdr.length as usize];
        stream.read_exact(&mut data).await?;

        if tls_required_first(tls, &state, hdr.option) {
            if !state.refusal_noted {
                state.refusal_noted = true;
                peer.note(&format!(
                    "refused a plain-text client ({}): TLS is required (it must send NBD_OPT_STARTTLS; \
                     with libnbd use nbds:// URIs, with qemu tls-creds)",
                    peer.name
                ));
            }
            if hdr.option == OPT_EXPORT_NAME {
                // This option cannot report errors: the spec says to hang up.
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "client asked for an export without TLS, which is required",
                ));
            }
            let message = "TLS is required: send NBD_OPT_STARTTLS first";
            send_option_error(stream, hdr.option, REP_ERR_TLS_REQD, message).await?;
            continue;
        }

        let option = match parse_option(hdr.option, &data) {
            Ok(option) => option,
            Err(e) if hdr.option == OPT_EXPORT_NAME => return Err(e.into()),
            Err(e) => {
                if hdr.option == OPT_SET_META_CONTEXT {
                    state.selected = None;
                }
                send_option_error(stream, hdr.option, REP_ERR_INVALID, &e.to_string()).await?;
                continue;
            }
        };
        let mut out = Vec::new();
        let opt = hdr.option;
        match option {
            ClientOption::ExportName(name) => {
                // This option cannot report errors: unknown export means hanging up.
                let Some(index) = find_export(exports, &name) else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "client asked for an unknown export",
                    ));
                };
                let device = &exports[index].device;
                encode_export_name_reply(
                    &mut out,
                    device.size_bytes(),
                    transmission_flags(&**device),
                    state.no_zeroes,
                );
                send(stream, &out).await?;
                return Ok(Some(enter(exports, index, &state)));
            }
            ClientOption::Abort => {
                encode_option_reply(&mut out, opt, REP_ACK, &[]);
                // The client may already have hung up; that is fine.
                let _ = send(stream, &out).await;
                let _ = stream.shutdown().await;
                return Ok(None);
            }
            ClientOption::List => {
                for e in exports {
                    encode_rep_server(&mut out, opt, &e.name, &e.description);
                }
                encode_option_reply(&mut out, opt, REP_ACK, &[]);
            }
            ClientOption::StartTls => match tls {
                None => encode_option_error(
                    &mut out,
                    opt,
                    REP_ERR_POLICY,
                    "TLS is not offered on this listener",
                ),
                Some(_) if state.tls => {
                    encode_option_error(&mut out, opt, REP_ERR_INVALID, "TLS is already up");
                }
                Some(upgrade) => {
                    encode_option_reply(&mut out, opt, REP_ACK, &[]);
                    send(stream, &out).await?;
                    if let Err(e) = upgrade.upgrade(stream).await {
                        peer.note(&format!("TLS handshake with {} failed: {e}", peer.name));
                        return Err(io::Error::new(
                            e.kind(),
                            format!("TLS handshake failed: {e}"),
                        ));
                    }
                    // Nothing said in plain text is trusted once TLS is up: the client
                    // negotiates its features again over the encrypted stream.
                    state = State {
                        no_zeroes: state.no_zeroes,
                        tls: true,
                        ..State::default()
                    };
                    continue;
                }
            },
            ClientOption::Info(req) | ClientOption::Go(req) => {
                match find_export(exports, &req.name) {
                    None => encode_option_error(&mut out, opt, REP_ERR_UNKNOWN, "unknown export"),
                    Some(index) => {
                        info_replies(&mut out, opt, &exports[index], &req);
                        encode_option_reply(&mut out, opt, REP_ACK, &[]);
                        if opt == OPT_GO {
                            send(stream, &out).await?;
                            return Ok(Some(enter(exports, index, &state)));
                        }
                    }
                }
            }
            ClientOption::StructuredReply => {
                state.structured = true;
                encode_option_reply(&mut out, opt, REP_ACK, &[]);
            }
            ClientOption::ListMetaContext(req) | ClientOption::SetMetaContext(req) => {
                let set = opt == OPT_SET_META_CONTEXT;
                if set {
                    // Setting replaces the previous selection even when it fails.
                    state.selected = None;
                }
                if !state.structured {
                    encode_option_error(
                        &mut out,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    );
                } else if let Some(index) = find_export(exports, &req.export_name) {
                    if req.queries.len() > MAX_META_QUERIES {
                        encode_option_error(
                            &mut out,
                            opt,
                            REP_ERR_TOO_BIG,
                            "too many meta context queries",
                        );
                    } else {
                        let device = &*exports[index].device;
                        let found = find_contexts(device, &req.queries, set, peer).await;
                        if set {
                            for (id, name) in found.ids() {
                                let name = name.unwrap_or(META_CONTEXT_BASE_ALLOCATION);
                                encode_meta_context(&mut out, opt, id, name);
                            }
                            state.selected = Some((index, Arc::new(found)));
                        } else {
                            // Listed contexts carry no id (the spec: zero).
                            if found.allocation {
                                encode_meta_context(&mut out, opt, 0, META_CONTEXT_BASE_ALLOCATION);
                            }
                            for name in &found.device {
                                encode_meta_context(&mut out, opt, 0, name);
                            }
                        }
                        encode_option_reply(&mut out, opt, REP_ACK, &[]);
                    }
                } else {
                    encode_option_error(&mut out, opt, REP_ERR_UNKNOWN, "unknown export");
                }
            }
            ClientOption::Unknown(_) => {
                encode_option_error(&mut out, opt, REP_ERR_UNSUP, "option not supported");
            }
        }
        send(stream, &out).await?;
    }
}

/// True if `option` must be refused because TLS is required and not yet up. Only
/// STARTTLS and ABORT are allowed in plain text then (the spec's FORCEDTLS mode).
fn tls_required_first<S>(tls: Option<&dyn Upgrade<S>>, state: &State, option: u32) -> bool {
    let required = tls.is_some_and(|t| t.mode() == TlsMode::Required);
    required && !state.tls && option != OPT_STARTTLS && option != OPT_ABORT
}

/// What `queries` list (`set` false) or select (`set` true) on `device`, by the
/// spec's rules: listing with no queries lists everything; a query of a namespace
/// (`base:`, `qemu:`) or of a name's start ending in `:` (`qemu:dirty-bitmap:`) lists
/// every context under it, but selects nothing; otherwise only the exact name counts.
/// Unknown names are not errors: they match nothing. A device that fails to say what
/// it offers offers nothing this time (the failure goes to the server's notices).
async fn find_contexts<D: BlockDevice>(
    device: &D,
    queries: &[String],
    set: bool,
    peer: &Peer<'_>,
) -> MetaContexts {
    let mut found = MetaContexts::default();
    let limit = if set {
        MAX_SELECTED_CONTEXTS
    } else {
        MAX_LISTED_CONTEXTS
    };
    let add = |found: &mut MetaContexts, name: String| {
        if found.device.len() < limit
            && name.len() <= MAX_STRING_LEN
            && name != META_CONTEXT_BASE_ALLOCATION
            && !found.device.contains(&name)
        {
            found.device.push(name);
        }
    };
    let lookups: Vec<(&str, bool)> = if queries.is_empty() {
        if set {
            return found;
        }
        found.allocation = true;
        vec![("", true)]
    } else {
        let mut lookups = Vec::new();
        for q in queries {
            let wildcard = q.ends_with(':');
            if q == META_CONTEXT_BASE_ALLOCATION || (!set && q == "base:") {
                found.allocation = true;
            } else if q.starts_with("base:") || !q.contains(':') || (set && wildcard) {
                // Nothing else in the spec's namespace; not a name; a wildcard that
                // only lists.
            } else if !lookups.contains(&(q.as_str(), wildcard)) {
                lookups.push((q.as_str(), wildcard));
            }
        }
        lookups
    };
    for (query, wildcard) in lookups {
        if found.device.len() >= limit {
            // Nothing more would be taken: do not make the device look.
            break;
        }
        let names = match device.meta_contexts(query).await {
            Ok(names) => names,
            Err(e) => {
                peer.note(&format!(
                    "meta contexts for {query:?} asked by {}: the device failed to list them: {e}",
                    peer.name
                ));
                continue;
            }
        };
        for name in names {
            let matches = if wildcard {
                name.starts_with(query)
            } else {
                name == query
            };
            if matches {
                add(&mut found, name);
            }
        }
    }
    found
}

fn info_replies<D: BlockDevice>(
    out: &mut Vec<u8>,
    opt: u32,
    export: &Export<D>,
    req: &InfoRequest,
) {
    let device = &*export.device;
    encode_info(
        out,
        opt,
        &Info::Export {
            size: device.size_bytes(),
            transmission_flags: transmission_flags(device),
        },
    );
    if req.requests.contains(&INFO_NAME) {
        encode_info(out, opt, &Info::Name(export.name.clone()));
    }
    if req.requests.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
        encode_info(out, opt, &Info::Description(export.description.clone()));
    }
    // Sent even when not requested: clients ignore it, and it tells those that care.
    encode_info(
        out,
        opt,
        &Info::BlockSize(sanitize_block_sizes(device.block_sizes())),
    );
}

fn enter<D: BlockDevice>(exports: &[Export<D>], index: usize, state: &State) -> Negotiated {
    let device = &exports[index].device;
    Negotiated {
        export: index,
        params: ExportParams {
            size: device.size_bytes(),
            sizes: sanitize_block_sizes(device.block_sizes()),
            structured: state.structured,
            contexts: match &state.selected {
                Some((export, contexts)) if state.structured && *export == index => {
                    Arc::clone(contexts)
                }
                _ => Arc::default(),
            },
            read_only: device.read_only(),
        },
    }
}

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// Answers `option` with the error reply `reply_type` and nothing else.
async fn send_option_error<S: AsyncWrite + Unpin>(
    stream: &mut S,
    option: u32,
    reply_type: u32,
    message: &str,
) -> io::Result<()> {
    let mut out = Vec::new();
    encode_option_error(&mut out, option, reply_type, message);
    send(stream, &out).await
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::mem_device::MemDevice;

    fn found(device: &MemDevice, queries: &[&str], set: bool) -> MetaContexts {
        let queries: Vec<String> = queries.iter().map(|s| s.to_string()).collect();
        let peer = Peer {
            name: "test",
            notices: None,
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(find_contexts(device, &queries, set, &peer))
    }

    fn contexts(allocation: bool, device: &[&str]) -> MetaContexts {
        MetaContexts {
            allocation,
            device: device.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn meta_context_queries() {
        let d = MemDevice::new(1 << 20);
        assert_eq!(found(&d, &[], false), contexts(true, &[]));
        assert_eq!(found(&d, &[], true), contexts(false, &[]));
        assert_eq!(found(&d, &["base:"], false), contexts(true, &[]));
        assert_eq!(found(&d, &["base:"], true), contexts(false, &[]));
        assert_eq!(
            found(&d, &["x-foo:bar", "base:allocation"], true),
            contexts(true, &[])
        );
        assert_eq!(
            found(&d, &["qemu:dirty-bitmap:a"], false),
            contexts(false, &[])
        );
    }

    /// The device's contexts: every one listed by no query, by their namespace or a
    /// name's start ending in `:`; selected only by their exact names; unknown names
    /// match nothing; each once, whatever the queries.
    #[test]
    fn device_contexts_are_listed_by_prefix_and_selected_by_name() {
        let d = MemDevice::new(1 << 20);
        d.start_dirty_bitmap("s1");
        d.start_dirty_bitmap("s2");
        let both = ["qemu:dirty-bitmap:s1", "qemu:dirty-bitmap:s2"];
        assert_eq!(found(&d, &[], false), contexts(true, &both));
        for wildcard in ["qemu:", "qemu:dirty-bitmap:"] {
            assert_eq!(found(&d, &[wildcard], false), contexts(false, &both));
            assert_eq!(found(&d, &[wildcard], true), contexts(false, &[]));
            assert_eq!(
                found(&d, &[wildcard, wildcard, "qemu:dirty-bitmap:s1"], false),
                contexts(false, &both)
            );
        }
        for set in [false, true] {
            assert_eq!(
                found(
                    &d,
                    &[
                        "qemu:dirty-bitmap:s2",
                        "base:allocation",
                        "qemu:dirty-bitmap:s2"
                    ],
                    set
                ),
                contexts(true, &["qemu:dirty-bitmap:s2"])
            );
            for nothing in [
                "qemu:dirty-bitmap:s",
                "qemu:dirty-bitmap:s3",
                "qemu",
                "qemu:d",
            ] {
                assert_eq!(
                    found(&d, &[nothing], set),
                    contexts(false, &[]),
                    "{nothing}"
                );
            }
        }
    }

    /// However many contexts the device offers, a SET selects a bounded number of
    /// them and a LIST lists a bounded number.
    #[test]
    fn selections_and_listings_are_bounded() {
        let d = MemDevice::new(1 << 20);
        for i in 0..MAX_LISTED_CONTEXTS + 3 {
            d.start_dirty_bitmap(&format!("s{i}"));
        }
        assert_eq!(found(&d, &[], false).device.len(), MAX_LISTED_CONTEXTS);
        let names: Vec<String> = (0..MAX_META_QUERIES)
            .map(|i| format!("qemu:dirty-bitmap:s{i}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(found(&d, &names, true).device.len(), MAX_SELECTED_CONTEXTS);
    }
}
