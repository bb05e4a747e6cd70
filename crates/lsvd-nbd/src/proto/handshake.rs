//! Fixed-newstyle handshake messages: the server greeting, client flags, option requests
//! and option replies (including the `NBD_REP_INFO` payloads of `NBD_OPT_INFO`/`GO`).
//!
//! This is the part of the protocol a client uses to pick an export and negotiate
//! features before any I/O; it lives apart from the transmission codec because its
//! framing (IHAVEOPT magic, 64-bit reply magic) is entirely different.

use super::consts::*;
use super::{Cursor, ProtoError, len_u32, put_sized, truncate_str};
use crate::BlockSizes;

/// Bytes the server sends first: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Client option header: IHAVEOPT, option, data length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Server option reply header: magic, option, reply type, data length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless NO_ZEROES was agreed.
pub const EXPORT_NAME_PADDING: usize = 124;

/// The greeting this server sends: fixed newstyle with NO_ZEROES offered.
pub fn encode_greeting() -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// Client side: checks the greeting and returns the server's handshake flags.
pub fn parse_greeting(buf: &[u8; GREETING_LEN]) -> Result<u16, ProtoError> {
    let mut c = Cursor::after_magic(buf, NBDMAGIC.to_be_bytes())?;
    c.magic(IHAVEOPT.to_be_bytes())?;
    c.u16("handshake flags")
}

/// The 32-bit client flags that follow the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

impl ClientFlags {
    pub fn encode(self) -> [u8; 4] {
        let mut v = 0;
        if self.fixed_newstyle {
            v |= FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            v |= FLAG_C_NO_ZEROES;
        }
        u32::to_be_bytes(v)
    }
}

/// Parses client flags; unknown bits are an error (the server must then hang up).
pub fn parse_client_flags(buf: [u8; 4]) -> Result<ClientFlags, ProtoError> {
    let v = u32::from_be_bytes(buf);
    if v & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(ProtoError::Malformed("unknown client flags"));
    }
    Ok(ClientFlags {
        fixed_newstyle: v & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: v & FLAG_C_NO_ZEROES != 0,
    })
}

/// Header of one client option; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn parse_option_header(buf: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
    let mut c = Cursor::after_magic(buf, IHAVEOPT.to_be_bytes())?;
    Ok(OptionHeader {
        option: c.u32("option")?,
        length: c.u32("length")?,
    })
}

/// Client side: appends a complete option (header and data).
pub fn encode_option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    put_sized(out, data);
}

/// Client side: what a client sends after the greeting to go straight to `export`:
/// its flags (fixed newstyle, no zero padding) and `NBD_OPT_EXPORT_NAME`.
pub fn encode_export_name_opening(export: &str) -> Vec<u8> {
    let mut out = ClientFlags {
        fixed_newstyle: true,
        no_zeroes: true,
    }
    .encode()
    .to_vec();
    encode_option(&mut out, OPT_EXPORT_NAME, export.as_bytes());
    out
}

/// Data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InfoRequest {
    pub name: String,
    /// `NBD_INFO_*` types the client asks for.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_sized(out, self.name.as_bytes());
        out.extend_from_slice(
            &u16::try_from(self.requests.len())
                .unwrap_or(u16::MAX)
                .to_be_bytes(),
        );
        for r in self.requests.iter().take(usize::from(u16::MAX)) {
            out.extend_from_slice(&r.to_be_bytes());
        }
    }
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_sized(out, self.export_name.as_bytes());
        out.extend_from_slice(&len_u32(self.queries.len()).to_be_bytes());
        for q in &self.queries {
            put_sized(out, q.as_bytes());
        }
    }
}

/// A parsed client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    ListMetaContext(MetaContextRequest),
    SetMetaContext(MetaContextRequest),
    /// Not understood by this server; answer `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

/// Parses an option's data. An `Err` means the option is known but its data is invalid:
/// answer `NBD_REP_ERR_INVALID` (or hang up, for `NBD_OPT_EXPORT_NAME`).
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, ProtoError> {
    let no_data = |opt: ClientOption| {
        if data.is_empty() {
            Ok(opt)
        } else {
            Err(ProtoError::Malformed("option takes no data"))
        }
    };
    match option {
        OPT_EXPORT_NAME => Cursor::new(data)
            .string(data.len(), "export name")
            .map(ClientOption::ExportName),
        // The spec asks servers to ignore stray data on ABORT.
        OPT_ABORT => Ok(ClientOption::Abort),
        OPT_LIST => no_data(ClientOption::List),
        OPT_STARTTLS => no_data(ClientOption::StartTls),
        OPT_STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
        OPT_INFO => parse_info_request(data).map(ClientOption::Info),
        OPT_GO => parse_info_request(data).map(ClientOption::Go),
        OPT_LIST_META_CONTEXT => {
            parse_meta_context_request(data).map(ClientOption::ListMetaContext)
        }
        OPT_SET_META_CONTEXT => parse_meta_context_request(data).map(ClientOption::SetMetaContext),
        other => Ok(ClientOption::Unknown(other)),
    }
}

fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    let mut c = Cursor::new(data);
    let name_len = c.u32("name length")? as usize;
    let name = c.string(name_len, "name longer than option")?;
    let count = usize::from(c.u16("info count")?);
    if c.remaining() != count * 2 {
        return Err(ProtoError::Malformed(
            "info request count disagrees with length",
        ));
    }
    let mut requests = Vec::with_capacity(count);
    for _ in 0..count {
        requests.push(c.u16("info request")?);
    }
    Ok(InfoRequest { name, requests })
}

fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
    let mut c = Cursor::new(data);
    let name_len = c.u32("name length")? as usize;
    let export_name = c.string(name_len, "name longer than option")?;
    let count = c.u32("query count")? as usize;
    // Each query needs at least its 4-byte length, so this bounds the allocation.
    if count > c.remaining() / 4 {
        return Err(ProtoError::Malformed("query count exceeds option length"));
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        let len = c.u32("query length")? as usize;
        queries.push(c.string(len, "query longer than option")?);
    }
    if c.remaining() != 0 {
        return Err(ProtoError::Malformed("trailing bytes after queries"));
    }
    Ok(MetaContextRequest {
        export_name,
        queries,
    })
}

/// Appends one option reply (header and data).
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    put_sized(out, data);
}

/// An error reply carrying a human-readable message (truncated to 4096 bytes).
pub fn encode_option_error(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    encode_option_reply(
        out,
        option,
        reply_type,
        truncate_str(message, MAX_STRING_LEN).as_bytes(),
    );
}

/// `NBD_REP_SERVER` for `NBD_OPT_LIST`: name length, name, then the description.
pub fn encode_rep_server(out: &mut Vec<u8>, option: u32, name: &str, description: &str) {
    let name = truncate_str(name, MAX_STRING_LEN);
    let description = truncate_str(description, MAX_STRING_LEN);
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    put_sized(&mut data, name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    encode_option_reply(out, option, REP_SERVER, &data);
}

/// One `NBD_REP_INFO` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size: u64,
        transmission_flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize(BlockSizes),
    /// An information type this crate does not know; clients must ignore it.
    Unknown(u16),
}

/// Appends `info` as an `NBD_REP_INFO` reply to `option`.
pub fn encode_info(out: &mut Vec<u8>, option: u32, info: &Info) {
    let mut data = Vec::with_capacity(14);
    match info {
        Info::Export {
            size,
            transmission_flags,
        } => {
            data.extend_from_slice(&INFO_EXPORT.to_be_bytes());
            data.extend_from_slice(&size.to_be_bytes());
            data.extend_from_slice(&transmission_flags.to_be_bytes());
        }
        Info::Name(name) => {
            data.extend_from_slice(&INFO_NAME.to_be_bytes());
            data.extend_from_slice(truncate_str(name, MAX_STRING_LEN).as_bytes());
        }
        Info::Description(d) => {
            data.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
            data.extend_from_slice(truncate_str(d, MAX_STRING_LEN).as_bytes());
        }
        Info::BlockSize(b) => {
            data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
            data.extend_from_slice(&b.minimum_bytes.to_be_bytes());
            data.extend_from_slice(&b.preferred_bytes.to_be_bytes());
            data.extend_from_slice(&b.maximum_bytes.to_be_bytes());
        }
        Info::Unknown(t) => data.extend_from_slice(&t.to_be_bytes()),
    }
    encode_option_reply(out, option, REP_INFO, &data);
}

/// Client side: parses the data of an `NBD_REP_INFO` reply.
pub fn parse_info(data: &[u8]) -> Result<Info, ProtoError> {
    let mut c = Cursor::new(data);
    let ty = c.u16("info type")?;
    let info = match ty {
        INFO_EXPORT => Info::Export {
            size: c.u64("export size")?,
            transmission_flags: c.u16("flags")?,
        },
        INFO_NAME => Info::Name(c.string(c.remaining(), "name")?),
        INFO_DESCRIPTION => Info::Description(c.string(c.remaining(), "description")?),
        INFO_BLOCK_SIZE => Info::BlockSize(BlockSizes {
            minimum_bytes: c.u32("minimum")?,
            preferred_bytes: c.u32("preferred")?,
            maximum_bytes: c.u32("maximum")?,
        }),
        other => return Ok(Info::Unknown(other)),
    };
    if c.remaining() != 0 {
        return Err(ProtoError::Malformed("info payload has wrong length"));
    }
    Ok(info)
}

/// `NBD_REP_META_CONTEXT`: context id and name.
pub fn encode_meta_context(out: &mut Vec<u8>, option: u32, context_id: u32, name: &str) {
    let mut data = Vec::with_capacity(4 + name.len());
    data.extend_from_slice(&context_id.to_be_bytes());
    data.extend_from_slice(truncate_str(name, MAX_STRING_LEN).as_bytes());
    encode_option_reply(out, option, REP_META_CONTEXT, &data);
}

/// Client side: parses `NBD_REP_META_CONTEXT` data into (id, name).
pub fn parse_meta_context(data: &[u8]) -> Result<(u32, String), ProtoError> {
    let mut c = Cursor::new(data);
    let id = c.u32("context id")?;
    Ok((id, c.string(c.remaining(), "context name")?))
}

/// The reply that ends `NBD_OPT_EXPORT_NAME`: size, transmission flags, maybe padding.
pub fn encode_export_name_reply(
    out: &mut Vec<u8>,
    size: u64,
    transmission_flags: u16,
    no_zeroes: bool,
) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING]);
    }
}

/// Client side: the header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

pub fn parse_option_reply_header(
    buf: &[u8; OPTION_REPLY_HEADER_LEN],
) -> Result<OptionReplyHeader, ProtoError> {
    let mut c = Cursor::after_magic(buf, OPTION_REPLY_MAGIC.to_be_bytes())?;
    Ok(OptionReplyHeader {
        option: c.u32("option")?,
        reply_type: c.u32("reply type")?,
        length: c.u32("length")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::XorShift;

    #[test]
    fn greeting_golden() {
        let g = encode_greeting();
        assert_eq!(&g[..], b"NBDMAGICIHAVEOPT\x00\x03");
        assert_eq!(parse_greeting(&g), Ok(3));
    }

    #[test]
    fn client_flags() {
        assert_eq!(
            parse_client_flags([0, 0, 0, 3]),
            Ok(ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true
            })
        );
        assert_eq!(
            parse_client_flags([0, 0, 0, 1]),
            Ok(ClientFlags {
                fixed_newstyle: true,
                no_zeroes: false
            })
        );
        assert!(parse_client_flags([0, 0, 0, 4]).is_err());
        assert!(parse_client_flags([0x80, 0, 0, 0]).is_err());
        assert_eq!(
            ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true
            }
            .encode(),
            [0, 0, 0, 3]
        );
    }

    #[test]
    fn option_header_golden() {
        let mut out = Vec::new();
        encode_option(&mut out, OPT_GO, &[0xAA, 0xBB]);
        assert_eq!(out, b"IHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x02\xAA\xBB");
        let hdr: [u8; 16] = out[..16].try_into().expect("16 bytes");
        assert_eq!(
            parse_option_header(&hdr),
            Ok(OptionHeader {
                option: 7,
                length: 2
            })
        );
        let mut bad = hdr;
        bad[0] = b'X';
        assert_eq!(parse_option_header(&bad), Err(ProtoError::BadMagic));
    }

    #[test]
    fn info_request_golden_and_parse() {
        let req = InfoRequest {
            name: "ab".into(),
            requests: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let mut data = Vec::new();
        req.encode(&mut data);
        assert_eq!(data, [0, 0, 0, 2, b'a', b'b', 0, 2, 0, 3, 0, 1]);
        assert_eq!(
            parse_option(OPT_GO, &data),
            Ok(ClientOption::Go(req.clone()))
        );
        assert_eq!(parse_option(OPT_INFO, &data), Ok(ClientOption::Info(req)));
        // Name length pointing past the data, count disagreeing, too short.
        assert!(parse_option(OPT_GO, &[0, 0, 0, 9, b'a', 0, 0]).is_err());
        assert!(parse_option(OPT_GO, &[0, 0, 0, 0, 0, 2, 0, 3]).is_err());
        assert!(parse_option(OPT_GO, &[0, 0, 0, 0, 0]).is_err());
        assert_eq!(
            parse_option(OPT_GO, &[0, 0, 0, 0, 0, 0]),
            Ok(ClientOption::Go(InfoRequest {
                name: String::new(),
                requests: vec![]
            }))
        );
    }

    #[test]
    fn meta_context_request_golden_and_parse() {
        let req = MetaContextRequest {
            export_name: "e".into(),
            queries: vec!["base:".into()],
        };
        let mut data = Vec::new();
        req.encode(&mut data);
        assert_eq!(
            data,
            b"\x00\x00\x00\x01e\x00\x00\x00\x01\x00\x00\x00\x05base:"
        );
        assert_eq!(
            parse_option(OPT_LIST_META_CONTEXT, &data),
            Ok(ClientOption::ListMetaContext(req.clone()))
        );
        assert_eq!(
            parse_option(OPT_SET_META_CONTEXT, &data),
            Ok(ClientOption::SetMetaContext(req))
        );
        // Huge query count must not allocate or panic.
        assert!(parse_option(OPT_SET_META_CONTEXT, &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).is_err());
        // Trailing garbage.
        let mut trailing = data.clone();
        trailing.push(0);
        assert!(parse_option(OPT_SET_META_CONTEXT, &trailing).is_err());
    }

    #[test]
    fn simple_options() {
        assert_eq!(parse_option(OPT_LIST, &[]), Ok(ClientOption::List));
        assert!(parse_option(OPT_LIST, &[1]).is_err());
        assert!(parse_option(OPT_STRUCTURED_REPLY, &[1]).is_err());
        assert_eq!(parse_option(OPT_STARTTLS, &[]), Ok(ClientOption::StartTls));
        assert_eq!(parse_option(OPT_ABORT, &[1, 2]), Ok(ClientOption::Abort));
        assert_eq!(
            parse_option(OPT_EXPORT_NAME, b"disk"),
            Ok(ClientOption::ExportName("disk".into()))
        );
        assert!(parse_option(OPT_EXPORT_NAME, &[0xff]).is_err());
        assert!(parse_option(OPT_EXPORT_NAME, b"a\0b").is_err());
        assert!(parse_option(OPT_EXPORT_NAME, &vec![b'a'; 5000]).is_err());
        assert_eq!(parse_option(42, &[1, 2, 3]), Ok(ClientOption::Unknown(42)));
    }

    #[test]
    fn option_reply_golden() {
        let mut out = Vec::new();
        encode_option_reply(&mut out, OPT_LIST, REP_ACK, &[]);
        assert_eq!(
            out,
            [
                0, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0
            ]
        );
        let hdr: [u8; 20] = out[..].try_into().expect("20 bytes");
        assert_eq!(
            parse_option_reply_header(&hdr),
            Ok(OptionReplyHeader {
                option: OPT_LIST,
                reply_type: REP_ACK,
                length: 0
            })
        );

        out.clear();
        encode_option_error(&mut out, 99, REP_ERR_UNSUP, "no");
        assert_eq!(
            &out[8..],
            [0, 0, 0, 99, 0x80, 0, 0, 1, 0, 0, 0, 2, b'n', b'o']
        );

        out.clear();
        encode_rep_server(&mut out, OPT_LIST, "ab", "d");
        assert_eq!(
            &out[8..],
            [
                0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0, 2, b'a', b'b', b'd'
            ]
        );
    }

    #[test]
    fn info_golden() {
        let cases: Vec<(Info, Vec<u8>)> = vec![
            (
                Info::Export {
                    size: 0x1_0000_0000,
                    transmission_flags: 0x012d,
                },
                vec![0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0x01, 0x2d],
            ),
            (Info::Name("x".into()), vec![0, 1, b'x']),
            (Info::Description("yz".into()), vec![0, 2, b'y', b'z']),
            (
                Info::BlockSize(BlockSizes {
                    minimum_bytes: 512,
                    preferred_bytes: 4096,
                    maximum_bytes: 1 << 25,
                }),
                vec![0, 3, 0, 0, 2, 0, 0, 0, 0x10, 0, 0x02, 0, 0, 0],
            ),
        ];
        for (info, payload) in cases {
            let mut out = Vec::new();
            encode_info(&mut out, OPT_GO, &info);
            assert_eq!(&out[8..16], [0, 0, 0, 7, 0, 0, 0, 3]);
            assert_eq!(&out[16..20], len_u32(payload.len()).to_be_bytes());
            assert_eq!(&out[20..], &payload[..]);
            assert_eq!(parse_info(&payload), Ok(info));
        }
        assert_eq!(parse_info(&[0, 9, 1, 2]), Ok(Info::Unknown(9)));
        assert!(parse_info(&[0, 0, 1]).is_err());
    }

    #[test]
    fn meta_context_and_export_name_golden() {
        let mut out = Vec::new();
        encode_meta_context(&mut out, OPT_SET_META_CONTEXT, 1, "base:allocation");
        assert_eq!(&out[8..20], [0, 0, 0, 10, 0, 0, 0, 4, 0, 0, 0, 19]);
        assert_eq!(&out[20..24], [0, 0, 0, 1]);
        assert_eq!(&out[24..], b"base:allocation");
        assert_eq!(
            parse_meta_context(&out[20..]),
            Ok((1, "base:allocation".to_string()))
        );

        out.clear();
        encode_export_name_reply(&mut out, 4096, 0x0001, true);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1]);
        out.clear();
        encode_export_name_reply(&mut out, 4096, 0x0001, false);
        assert_eq!(out.len(), 10 + 124);
        assert!(out[10..].iter().all(|&b| b == 0));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for i in 0..20_000 {
            let len = rng.below(64) as usize;
            let mut data = rng.bytes(len);
            // Sometimes make the leading length field plausible so deeper paths run.
            if data.len() >= 4 && i % 2 == 0 {
                let n = rng.below(data.len() as u64) as u32;
                data[..4].copy_from_slice(&n.to_be_bytes());
            }
            let option = rng.below(12) as u32;
            let _ = parse_option(option, &data);
            let _ = parse_info(&data);
            let _ = parse_meta_context(&data);
            let _ = parse_option_header(&rng.array());
            let _ = parse_option_reply_header(&rng.array());
            let _ = parse_client_flags([data.first().copied().unwrap_or(0), 0, 0, i as u8]);
        }
    }
}
