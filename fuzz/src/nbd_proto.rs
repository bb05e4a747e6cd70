//! Fuzz checks for the sans-I/O NBD codec (`lsvd_nbd::proto`).
//!
//! The first byte picks a parser; the rest is its input. Every parser must not panic,
//! and what it accepts must re-encode, with the matching encoder, to bytes that parse to
//! the same value; where the wire form is canonical, to the very input bytes.

use lsvd_nbd::proto::consts::{MAX_STRING_LEN, OPT_GO, REP_INFO};
use lsvd_nbd::proto::handshake::{
    ClientOption, GREETING_LEN, OPTION_HEADER_LEN, OPTION_REPLY_HEADER_LEN, encode_greeting,
    encode_info, encode_meta_context, encode_option, encode_option_reply, parse_client_flags,
    parse_greeting, parse_info, parse_meta_context, parse_option, parse_option_header,
    parse_option_reply_header,
};
use lsvd_nbd::proto::transmission::{
    CHUNK_HEADER_LEN, ChunkHeader, REQUEST_HEADER_LEN, SIMPLE_REPLY_HEADER_LEN,
    encode_block_status_chunk, encode_error_chunk, encode_simple_reply, parse_block_status,
    parse_chunk_header, parse_error_chunk, parse_request_header, parse_simple_reply,
};

use crate::bytes::Bytes;

fn fixed<const N: usize>(b: &[u8]) -> Option<[u8; N]> {
    b.get(..N).and_then(|s| s.try_into().ok())
}

/// The option data `opt` would carry on the wire, re-encoded from its parsed form.
fn reencode_option(opt: &ClientOption) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match opt {
        ClientOption::ExportName(name) => out.extend_from_slice(name.as_bytes()),
        ClientOption::Info(req) | ClientOption::Go(req) => req.encode(&mut out),
        ClientOption::ListMetaContext(req) | ClientOption::SetMetaContext(req) => {
            req.encode(&mut out)
        }
        ClientOption::List | ClientOption::StartTls | ClientOption::StructuredReply => {}
        // ABORT ignores its data; unknown options keep theirs opaque.
        ClientOption::Abort | ClientOption::Unknown(_) => return None,
    }
    Some(out)
}

fn check_option(option: u32, data: &[u8]) {
    let Ok(parsed) = parse_option(option, data) else {
        return;
    };
    if let Some(bytes) = reencode_option(&parsed) {
        assert_eq!(
            bytes, data,
            "option {option} does not re-encode to its input"
        );
        assert_eq!(parse_option(option, &bytes), Ok(parsed));
    }
}

/// Strips the 20-byte option reply header an encoder wrote in front of its payload.
fn reply_payload(out: &[u8]) -> &[u8] {
    let hdr = fixed::<OPTION_REPLY_HEADER_LEN>(out).expect("encoder wrote a reply header");
    let hdr = parse_option_reply_header(&hdr).expect("encoder wrote a valid reply header");
    let payload = &out[OPTION_REPLY_HEADER_LEN..];
    assert_eq!(hdr.length as usize, payload.len(), "reply length field");
    payload
}

fn check_info(data: &[u8]) {
    let Ok(info) = parse_info(data) else {
        return;
    };
    let mut out = Vec::new();
    encode_info(&mut out, OPT_GO, &info);
    let hdr =
        fixed::<OPTION_REPLY_HEADER_LEN>(&out).and_then(|h| parse_option_reply_header(&h).ok());
    assert_eq!(hdr.map(|h| h.reply_type), Some(REP_INFO));
    let payload = reply_payload(&out);
    assert_eq!(
        parse_info(payload),
        Ok(info.clone()),
        "info re-encodes differently"
    );
    if !matches!(info, lsvd_nbd::proto::handshake::Info::Unknown(_)) {
        assert_eq!(payload, data, "info is not canonical");
    }
}

fn check_meta_context(data: &[u8]) {
    let Ok((id, name)) = parse_meta_context(data) else {
        return;
    };
    assert!(name.len() <= MAX_STRING_LEN);
    let mut out = Vec::new();
    encode_meta_context(&mut out, OPT_GO, id, &name);
    assert_eq!(reply_payload(&out), data, "meta context is not canonical");
}

fn check_error_chunk(data: &[u8]) {
    let Ok((error, message)) = parse_error_chunk(data) else {
        return;
    };
    let mut out = Vec::new();
    encode_error_chunk(&mut out, 7, error, &message, true);
    let hdr = fixed::<CHUNK_HEADER_LEN>(&out).expect("chunk header");
    let hdr = parse_chunk_header(&hdr).expect("valid chunk header");
    let payload = &out[CHUNK_HEADER_LEN..];
    assert_eq!(hdr.length as usize, payload.len());
    assert_eq!(parse_error_chunk(payload), Ok((error, message)));
    assert_eq!(
        payload,
        &data[..payload.len()],
        "error chunk prefix differs"
    );
}

fn check_block_status(data: &[u8]) {
    let Ok((id, extents)) = parse_block_status(data) else {
        return;
    };
    let mut out = Vec::new();
    encode_block_status_chunk(&mut out, 1, id, &extents, true);
    assert_eq!(
        &out[CHUNK_HEADER_LEN..],
        data,
        "block status is not canonical"
    );
}

/// Target `nbd_proto`.
pub fn proto(data: &[u8]) {
    let mut b = Bytes::new(data);
    let which = b.u8();
    let rest = b.rest();
    match which % 12 {
        0 => {
            if let Some(buf) = fixed::<GREETING_LEN>(rest)
                && let Ok(flags) = parse_greeting(&buf)
            {
                let mut ours = encode_greeting();
                ours[16..].copy_from_slice(&flags.to_be_bytes());
                assert_eq!(ours, buf);
            }
        }
        1 => {
            if let Some(buf) = fixed::<4>(rest)
                && let Ok(flags) = parse_client_flags(buf)
            {
                assert_eq!(flags.encode(), buf, "client flags re-encode");
            }
        }
        2 => {
            if let Some(buf) = fixed::<OPTION_HEADER_LEN>(rest)
                && let Ok(h) = parse_option_header(&buf)
            {
                let mut out = Vec::new();
                encode_option(&mut out, h.option, &[]);
                assert_eq!(&out[..12], &buf[..12]);
            }
        }
        3 => {
            let option = u32::from(rest.first().copied().unwrap_or(0) % 12);
            check_option(option, rest.get(1..).unwrap_or(&[]));
        }
        4 => {
            if let Some(buf) = fixed::<OPTION_REPLY_HEADER_LEN>(rest)
                && let Ok(h) = parse_option_reply_header(&buf)
            {
                let mut out = Vec::new();
                encode_option_reply(&mut out, h.option, h.reply_type, &[]);
                assert_eq!(&out[..16], &buf[..16]);
            }
        }
        5 => check_info(rest),
        6 => check_meta_context(rest),
        7 => {
            if let Some(buf) = fixed::<REQUEST_HEADER_LEN>(rest)
                && let Ok(h) = parse_request_header(&buf)
            {
                assert_eq!(h.encode(), buf, "request header re-encodes differently");
            }
        }
        8 => {
            if let Some(buf) = fixed::<SIMPLE_REPLY_HEADER_LEN>(rest)
                && let Ok((error, cookie)) = parse_simple_reply(&buf)
            {
                let mut out = Vec::new();
                encode_simple_reply(&mut out, error, cookie);
                assert_eq!(out, buf);
            }
        }
        9 => {
            if let Some(buf) = fixed::<CHUNK_HEADER_LEN>(rest)
                && let Ok(h) = parse_chunk_header(&buf)
            {
                let mut out = Vec::new();
                ChunkHeader { ..h }.encode(&mut out);
                assert_eq!(out, buf);
            }
        }
        10 => check_error_chunk(rest),
        _ => check_block_status(rest),
    }
}
