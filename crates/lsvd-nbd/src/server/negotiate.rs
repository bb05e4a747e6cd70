//! Drives the fixed-newstyle handshake on a stream: greeting, client flags, then option
//! haggling until the client enters transmission (`NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME`)
//! or leaves.
//!
//! It owns the per-connection negotiation state (structured replies, selected metadata
//! context, whether TLS is up) and turns it into the [`ExportParams`] the transmission
//! phase runs with. With a TLS policy it also enforces the spec's FORCEDTLS rules and
//! upgrades the stream in place at `NBD_OPT_STARTTLS` (see `tls.rs`).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::request::{ExportParams, sanitize_block_sizes};
use super::tls::{TlsMode, Upgrade};
use super::{Export, MAX_OPTION_BYTES, MAX_OPTION_DISCARD_BYTES, Notices, shutdown_requested};
use crate::BlockDevice;
use crate::proto::consts::*;
use crate::proto::handshake::*;

/// Context id reported by `NBD_OPT_SET_META_CONTEXT` for `base:allocation`.
pub(crate) const ALLOCATION_CONTEXT_ID: u32 = 1;

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
    /// Export index for which `base:allocation` was selected by the last
    /// `NBD_OPT_SET_META_CONTEXT`.
    allocation_for: Option<usize>,
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
                    state.allocation_for = None;
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
                    state.allocation_for = None;
                }
                if !state.structured {
                    encode_option_error(
                        &mut out,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    );
                } else if let Some(index) = find_export(exports, &req.export_name) {
                    if meta_context_matches(&req.queries, set) {
                        let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
                        encode_meta_context(&mut out, opt, id, META_CONTEXT_BASE_ALLOCATION);
                        if set {
                            state.allocation_for = Some(index);
                        }
                    }
                    encode_option_reply(&mut out, opt, REP_ACK, &[]);
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

/// Whether `base:allocation` is selected by `queries`. Listing with no queries lists
/// everything, and `base:` is a wildcard for listing only; setting needs the full name.
fn meta_context_matches(queries: &[String], set: bool) -> bool {
    if !set && queries.is_empty() {
        return true;
    }
    queries
        .iter()
        .any(|q| q == META_CONTEXT_BASE_ALLOCATION || (!set && q == "base:"))
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
            allocation_context: state.structured && state.allocation_for == Some(index),
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

    #[test]
    fn meta_context_queries() {
        let q = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(meta_context_matches(&q(&[]), false));
        assert!(!meta_context_matches(&q(&[]), true));
        assert!(meta_context_matches(&q(&["base:"]), false));
        assert!(!meta_context_matches(&q(&["base:"]), true));
        assert!(meta_context_matches(
            &q(&["x-foo:bar", "base:allocation"]),
            true
        ));
        assert!(!meta_context_matches(&q(&["qemu:dirty-bitmap:a"]), false));
    }
}
