//! Transmission-phase messages: the 28-byte request header, simple replies and
//! structured reply chunks, plus the mapping from `io::Error` to NBD error values.
//!
//! Separate from the handshake codec because after `NBD_OPT_GO` the stream switches to
//! this completely different framing, and because this is the hot path: encoders here
//! write only headers, so large read payloads can be sent without copying.

use std::io;

use super::consts::*;
use super::{Cursor, ProtoError, len_u32, truncate_str};
use crate::AllocationExtent;

pub const REQUEST_HEADER_LEN: usize = 28;
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;
/// Most descriptors the spec lets one BLOCK_STATUS chunk carry.
pub const MAX_BLOCK_STATUS_EXTENTS: usize = 1 << 20;

/// A transmission request command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    pub fn from_u16(v: u16) -> Command {
        match v {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Unknown(v) => v,
        }
    }

    /// Command flags this server accepts with the command. FUA is accepted everywhere
    /// because the spec requires it once `NBD_FLAG_SEND_FUA` is advertised. DF and
    /// FAST_ZERO are not advertised, so they are rejected.
    pub fn allowed_flags(self) -> u16 {
        match self {
            Command::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
            Command::BlockStatus => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            Command::Unknown(_) => 0,
            _ => CMD_FLAG_FUA,
        }
    }
}

/// One request header; for `NBD_CMD_WRITE`, `length` payload bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    /// Client side encoding.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut out = [0u8; REQUEST_HEADER_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_u16().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// Parses a request header. Only the magic is checked here; flags, command and range
/// are validated by the server against the negotiated export.
pub fn parse_request_header(buf: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtoError> {
    let mut c = Cursor::after_magic(buf, REQUEST_MAGIC.to_be_bytes())?;
    Ok(RequestHeader {
        flags: c.u16("flags")?,
        command: Command::from_u16(c.u16("type")?),
        cookie: c.u64("cookie")?,
        offset: c.u64("offset")?,
        length: c.u32("length")?,
    })
}

/// Appends a simple reply header; for a successful READ the data follows it.
pub fn encode_simple_reply(out: &mut Vec<u8>, error: u32, cookie: u64) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Client side: a simple reply header as (error, cookie).
pub fn parse_simple_reply(buf: &[u8; SIMPLE_REPLY_HEADER_LEN]) -> Result<(u32, u64), ProtoError> {
    let mut c = Cursor::after_magic(buf, SIMPLE_REPLY_MAGIC.to_be_bytes())?;
    Ok((c.u32("error")?, c.u64("cookie")?))
}

/// Header of a structured reply chunk; `length` payload bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub reply_type: u16,
    pub cookie: u64,
    pub length: u32,
}

impl ChunkHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.reply_type.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.length.to_be_bytes());
    }
}

/// Client side: parses a structured chunk header.
pub fn parse_chunk_header(buf: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, ProtoError> {
    let mut c = Cursor::after_magic(buf, STRUCTURED_REPLY_MAGIC.to_be_bytes())?;
    Ok(ChunkHeader {
        flags: c.u16("flags")?,
        reply_type: c.u16("type")?,
        cookie: c.u64("cookie")?,
        length: c.u32("length")?,
    })
}

fn done_flag(done: bool) -> u16 {
    if done { REPLY_FLAG_DONE } else { 0 }
}

/// `NBD_REPLY_TYPE_NONE` with DONE: success for any command.
pub fn encode_none_chunk(out: &mut Vec<u8>, cookie: u64) {
    ChunkHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_NONE,
        cookie,
        length: 0,
    }
    .encode(out);
}

/// Header and offset of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk; the caller sends
/// `data_len` bytes of data after it. Fails if the chunk length would overflow.
pub fn encode_offset_data_header(
    out: &mut Vec<u8>,
    cookie: u64,
    offset: u64,
    data_len: usize,
    done: bool,
) -> Result<(), ProtoError> {
    let length = u32::try_from(data_len)
        .ok()
        .and_then(|n| n.checked_add(8))
        .ok_or(ProtoError::Malformed("read chunk too large"))?;
    ChunkHeader {
        flags: done_flag(done),
        reply_type: REPLY_TYPE_OFFSET_DATA,
        cookie,
        length,
    }
    .encode(out);
    out.extend_from_slice(&offset.to_be_bytes());
    Ok(())
}

/// `NBD_REPLY_TYPE_ERROR` with an optional message (truncated to 4096 bytes).
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str, done: bool) {
    let message = truncate_str(message, MAX_STRING_LEN);
    let length = 6 + len_u32(message.len());
    ChunkHeader {
        flags: done_flag(done),
        reply_type: REPLY_TYPE_ERROR,
        cookie,
        length,
    }
    .encode(out);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&u16::try_from(message.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// `NBD_REPLY_TYPE_BLOCK_STATUS` for one context. At most
/// [`MAX_BLOCK_STATUS_EXTENTS`] descriptors are encoded; extra ones are dropped.
pub fn encode_block_status_chunk(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    extents: &[AllocationExtent],
    done: bool,
) {
    let extents = &extents[..extents.len().min(MAX_BLOCK_STATUS_EXTENTS)];
    let length = 4 + 8 * len_u32(extents.len());
    ChunkHeader {
        flags: done_flag(done),
        reply_type: REPLY_TYPE_BLOCK_STATUS,
        cookie,
        length,
    }
    .encode(out);
    out.extend_from_slice(&context_id.to_be_bytes());
    for e in extents {
        out.extend_from_slice(&e.length_bytes.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
    }
}

/// Client side: parses a BLOCK_STATUS chunk payload into (context id, extents).
pub fn parse_block_status(data: &[u8]) -> Result<(u32, Vec<AllocationExtent>), ProtoError> {
    let mut c = Cursor::new(data);
    let id = c.u32("context id")?;
    if c.remaining() == 0 || !c.remaining().is_multiple_of(8) {
        return Err(ProtoError::Malformed("block status length not 4 + 8*n"));
    }
    let mut extents = Vec::with_capacity(c.remaining() / 8);
    while c.remaining() > 0 {
        extents.push(AllocationExtent {
            length_bytes: c.u32("extent length")?,
            flags: c.u32("extent flags")?,
        });
    }
    Ok((id, extents))
}

/// Client side: parses an error chunk payload into (error, message).
pub fn parse_error_chunk(data: &[u8]) -> Result<(u32, String), ProtoError> {
    let mut c = Cursor::new(data);
    let error = c.u32("error")?;
    let len = usize::from(c.u16("message length")?);
    let message = c.string(len, "message longer than chunk")?;
    Ok((error, message))
}

/// Maps a device error to the NBD error value, as documented on [`crate::BlockDevice`].
pub fn error_code(err: &io::Error) -> u32 {
    match err.kind() {
        io::ErrorKind::InvalidInput => EINVAL,
        io::ErrorKind::StorageFull => ENOSPC,
        io::ErrorKind::Unsupported => ENOTSUP,
        io::ErrorKind::PermissionDenied => EPERM,
        io::ErrorKind::BrokenPipe => ESHUTDOWN,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::XorShift;

    #[test]
    fn request_header_golden() {
        let hdr = RequestHeader {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset: 0x1000,
            length: 0x200,
        };
        let bytes = hdr.encode();
        assert_eq!(
            bytes,
            [
                0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10,
                0, 0, 0, 0x02, 0
            ]
        );
        assert_eq!(parse_request_header(&bytes), Ok(hdr));
        let mut bad = bytes;
        bad[3] = 0x14;
        assert_eq!(parse_request_header(&bad), Err(ProtoError::BadMagic));
    }

    #[test]
    fn commands_round_trip() {
        for v in 0..20u16 {
            assert_eq!(Command::from_u16(v).to_u16(), v);
        }
        assert_eq!(Command::from_u16(7), Command::BlockStatus);
        assert_eq!(Command::from_u16(8), Command::Unknown(8));
        assert_eq!(Command::Read.allowed_flags(), CMD_FLAG_FUA);
        assert_eq!(
            Command::WriteZeroes.allowed_flags(),
            CMD_FLAG_FUA | CMD_FLAG_NO_HOLE
        );
    }

    #[test]
    fn simple_reply_golden() {
        let mut out = Vec::new();
        encode_simple_reply(&mut out, EINVAL, 0xAB);
        assert_eq!(
            out,
            [
                0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 0xAB
            ]
        );
        let hdr: [u8; 16] = out[..].try_into().expect("16 bytes");
        assert_eq!(parse_simple_reply(&hdr), Ok((EINVAL, 0xAB)));
    }

    #[test]
    fn chunk_golden() {
        let mut out = Vec::new();
        encode_none_chunk(&mut out, 7);
        assert_eq!(
            out,
            [
                0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0
            ]
        );

        out.clear();
        encode_offset_data_header(&mut out, 7, 0x200, 4, true).expect("small");
        assert_eq!(
            out,
            [
                0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 12, 0, 0, 0,
                0, 0, 0, 2, 0
            ]
        );
        assert!(encode_offset_data_header(&mut out, 7, 0, u32::MAX as usize, true).is_err());

        out.clear();
        encode_error_chunk(&mut out, 7, EIO, "bad", true);
        assert_eq!(
            out,
            [
                0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0,
                5, 0, 3, b'b', b'a', b'd'
            ]
        );
        assert_eq!(parse_error_chunk(&out[20..]), Ok((EIO, "bad".to_string())));

        out.clear();
        let extents = [
            AllocationExtent {
                length_bytes: 4096,
                flags: 0,
            },
            AllocationExtent {
                length_bytes: 8192,
                flags: 3,
            },
        ];
        encode_block_status_chunk(&mut out, 7, 1, &extents, true);
        assert_eq!(
            out,
            [
                0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 20, 0, 0, 0,
                1, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 3
            ]
        );
        let hdr: [u8; 20] = out[..20].try_into().expect("20 bytes");
        assert_eq!(
            parse_chunk_header(&hdr),
            Ok(ChunkHeader {
                flags: 1,
                reply_type: REPLY_TYPE_BLOCK_STATUS,
                cookie: 7,
                length: 20
            })
        );
        assert_eq!(parse_block_status(&out[20..]), Ok((1, extents.to_vec())));
    }

    #[test]
    fn error_message_truncated() {
        let mut out = Vec::new();
        encode_error_chunk(&mut out, 1, EIO, &"é".repeat(3000), false);
        let hdr: [u8; 20] = out[..20].try_into().expect("20 bytes");
        let parsed = parse_chunk_header(&hdr).expect("valid");
        assert_eq!(parsed.flags, 0);
        assert_eq!(parsed.length as usize, out.len() - 20);
        let (_, msg) = parse_error_chunk(&out[20..]).expect("valid");
        assert!(msg.len() <= MAX_STRING_LEN);
    }

    #[test]
    fn error_codes() {
        use io::ErrorKind::*;
        assert_eq!(error_code(&io::Error::from(InvalidInput)), EINVAL);
        assert_eq!(error_code(&io::Error::from(StorageFull)), ENOSPC);
        assert_eq!(error_code(&io::Error::from(Unsupported)), ENOTSUP);
        assert_eq!(error_code(&io::Error::from(PermissionDenied)), EPERM);
        assert_eq!(error_code(&io::Error::from(BrokenPipe)), ESHUTDOWN);
        assert_eq!(error_code(&io::Error::other("x")), EIO);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = XorShift(0xDEAD_BEEF_1234_5678);
        for i in 0..20_000 {
            let mut hdr = [0u8; REQUEST_HEADER_LEN];
            hdr.copy_from_slice(&rng.bytes(REQUEST_HEADER_LEN));
            if i % 2 == 0 {
                hdr[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            }
            if let Ok(h) = parse_request_header(&hdr) {
                assert_eq!(h.encode(), hdr);
                let _ = h.command.allowed_flags();
            }
            let _ = parse_chunk_header(&rng.array());
            let _ = parse_simple_reply(&rng.array());
            let len = rng.below(48) as usize;
            let data = rng.bytes(len);
            let _ = parse_block_status(&data);
            let _ = parse_error_chunk(&data);
        }
    }
}
