//! The transmission half of the session script: requests, and a strict check of every
//! reply against the request and a shadow copy of the export.

use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::transmission::{
    Command, RequestHeader, parse_block_status, parse_chunk_header, parse_error_chunk,
    parse_simple_reply,
};
use lsvd_nbd::server::{MAX_DISCARDED_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES};
use tokio::io::DuplexStream;

use super::{Attached, expect_eof, is_error_value, read_n, send};
use crate::bytes::Bytes;

/// Largest WRITE payload a script sends (longer lengths are cut to this, except those
/// past [`MAX_DISCARDED_PAYLOAD_BYTES`], which the server must refuse by hanging up;
/// a WRITE over the export's maximum but not past that is refused with its payload
/// skipped, which the short ones of an export with a small maximum exercise).
const MAX_SCRIPT_WRITE: u32 = 256 << 10;

fn pick_range(b: &mut Bytes<'_>, size: u64) -> (u64, u32) {
    let small =
        |b: &mut Bytes<'_>, n: u64| u64::from(b.below(u32::try_from(n).unwrap_or(u32::MAX)));
    match b.below(5) {
        0 => {
            let off = small(b, size + 1);
            (off, small(b, size - off + 1) as u32)
        }
        1 => {
            let off = 512 * small(b, size / 512 + 1);
            let len = 512 * small(b, size.saturating_sub(off) / 512 + 1);
            (off, len as u32)
        }
        2 => {
            let back = small(b, 4096).min(size);
            (size - back, small(b, 8192) as u32)
        }
        3 => (b.u64(), b.u32()),
        _ => (small(b, size + 4096), small(b, 1 << 17) as u32),
    }
}

/// Runs the rest of the script as requests on an attached export.
pub(super) async fn requests(s: &mut DuplexStream, b: &mut Bytes<'_>, att: &mut Attached) {
    let mut cookie = 0u64;
    while !b.is_empty() {
        cookie += 1;
        let command = match b.below(11) {
            0 | 1 => Command::Read,
            2 | 3 => Command::Write,
            4 => Command::Flush,
            5 => Command::Trim,
            6 => Command::Cache,
            7 => Command::WriteZeroes,
            8 => Command::BlockStatus,
            9 => Command::Disc,
            _ => {
                if b.bool() {
                    // Raw bytes: the rest of the script goes out as it is.
                    att.raw_sent = true;
                    send(s, b.rest()).await;
                    return;
                }
                // Any code; a known one is that command (the wire cannot tell).
                Command::from_u16(b.u16())
            }
        };
        let flags = match b.below(6) {
            0 => CMD_FLAG_FUA,
            1 => CMD_FLAG_NO_HOLE,
            2 => CMD_FLAG_REQ_ONE,
            3 => b.u16(),
            _ => 0,
        };
        let (offset, mut length) = pick_range(b, att.size);
        let oversized = command == Command::Write && length as usize > MAX_DISCARDED_PAYLOAD_BYTES;
        if command == Command::Write && !oversized && length > MAX_SCRIPT_WRITE {
            length %= MAX_SCRIPT_WRITE;
        }
        let hdr = RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        let mut msg = hdr.encode().to_vec();
        let mut payload = Vec::new();
        if command == Command::Write && !oversized {
            let seed = b.u8();
            payload = (0..length)
                .map(|i| seed.wrapping_add((i % 251) as u8))
                .collect();
            msg.extend_from_slice(&payload);
        }
        if !send(s, &msg).await {
            panic!("server stopped reading before {command:?}");
        }
        if command == Command::Disc {
            expect_eof(s, "after DISC").await;
            return;
        }
        if oversized {
            expect_eof(s, "after an oversized WRITE").await;
            return;
        }
        let ok = reply(s, &hdr, att).await;
        let end = offset.checked_add(u64::from(length));
        let in_range = end.is_some_and(|e| e <= att.size);
        let ranged = !matches!(command, Command::Flush | Command::Unknown(_));
        if ranged && !in_range {
            assert!(
                !ok,
                "{command:?} at {offset}+{length} past {} succeeded",
                att.size
            );
        }
        if matches!(command, Command::Unknown(_)) {
            assert!(!ok, "unknown command succeeded");
        }
        if ok && in_range {
            let r = offset as usize..(offset + u64::from(length)) as usize;
            match command {
                Command::Write => att.shadow[r].copy_from_slice(&payload),
                Command::Trim | Command::WriteZeroes => att.shadow[r].fill(0),
                _ => {}
            }
        }
    }
}

/// A whole `N`-byte reply header whose first four bytes, `magic`, were read already:
/// reads the rest (panicking with `what` if the stream ends first).
async fn header_after_magic<const N: usize>(
    s: &mut DuplexStream,
    magic: &[u8],
    what: &str,
) -> [u8; N] {
    let rest = read_n(s, N - 4).await.expect(what);
    let mut buf = [0u8; N];
    buf[..4].copy_from_slice(magic);
    buf[4..].copy_from_slice(&rest);
    buf
}

/// Reads and checks the whole reply to `hdr`; whether it reported success.
async fn reply(s: &mut DuplexStream, hdr: &RequestHeader, att: &Attached) -> bool {
    let what = hdr.command;
    let mut ok = true;
    let mut data_seen = 0u64;
    loop {
        let magic = read_n(s, 4)
            .await
            .unwrap_or_else(|| panic!("no reply to {what:?}"));
        let magic_value = u32::from_be_bytes([magic[0], magic[1], magic[2], magic[3]]);
        if magic_value == SIMPLE_REPLY_MAGIC {
            let buf = header_after_magic(s, &magic, "short simple reply").await;
            let (error, cookie) = parse_simple_reply(&buf).expect("simple reply parses");
            assert_eq!(cookie, hdr.cookie, "simple reply cookie");
            assert!(data_seen == 0, "simple reply after structured chunks");
            if error != 0 {
                assert!(is_error_value(error), "error value {error}");
                return false;
            }
            if what == Command::Read {
                if att.structured {
                    assert_eq!(hdr.length, 0, "simple reply to a structured READ");
                }
                let data = read_n(s, hdr.length as usize)
                    .await
                    .expect("READ payload cut short");
                check_data(att, hdr.offset, &data);
            }
            assert!(
                what != Command::BlockStatus,
                "BLOCK_STATUS answered without status"
            );
            return true;
        }
        assert!(att.structured, "structured reply that was not negotiated");
        let buf = header_after_magic(s, &magic, "short chunk header").await;
        let chunk = parse_chunk_header(&buf).expect("reply magic neither simple nor structured");
        assert_eq!(chunk.cookie, hdr.cookie, "chunk cookie");
        assert!(
            chunk.length as usize <= MAX_PAYLOAD_BYTES + 8,
            "chunk of {} bytes",
            chunk.length
        );
        let payload = read_n(s, chunk.length as usize)
            .await
            .expect("chunk payload cut short");
        let done = chunk.flags & REPLY_FLAG_DONE != 0;
        assert_eq!(chunk.flags & !REPLY_FLAG_DONE, 0, "unknown chunk flags");
        match chunk.reply_type {
            REPLY_TYPE_NONE => {
                assert!(
                    done && payload.is_empty(),
                    "NONE chunk not final or not empty"
                );
            }
            REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(what, Command::Read, "data chunk for {what:?}");
                assert!(payload.len() >= 8, "data chunk without offset");
                let mut off = [0u8; 8];
                off.copy_from_slice(&payload[..8]);
                let off = u64::from_be_bytes(off);
                let data = &payload[8..];
                assert!(
                    off >= hdr.offset
                        && off + data.len() as u64 <= hdr.offset + u64::from(hdr.length),
                    "data chunk outside the request"
                );
                check_data(att, off, data);
                data_seen += data.len() as u64;
            }
            REPLY_TYPE_BLOCK_STATUS => {
                assert_eq!(what, Command::BlockStatus, "status chunk for {what:?}");
                let (id, extents) = parse_block_status(&payload).expect("block status parses");
                assert_eq!(Some(id), att.allocation_id, "status for another context");
                let total: u64 = extents.iter().map(|e| u64::from(e.length_bytes)).sum();
                assert!(extents.iter().all(|e| e.length_bytes > 0), "empty extent");
                assert!(total <= u64::from(hdr.length), "status past the request");
                if hdr.flags & CMD_FLAG_REQ_ONE != 0 {
                    assert_eq!(extents.len(), 1, "REQ_ONE answered with several extents");
                }
                let mut at = hdr.offset;
                for e in &extents {
                    assert_eq!(e.flags & !(STATE_HOLE_ZERO), 0, "unknown status flags");
                    // What is reported as reading as zeros must read as zeros.
                    if e.flags & lsvd_nbd::STATE_ZERO != 0 {
                        let r = at as usize..(at + u64::from(e.length_bytes)) as usize;
                        assert!(
                            att.shadow.get(r).is_some_and(|d| d.iter().all(|&b| b == 0)),
                            "status says zeros at {at}+{} over written data",
                            e.length_bytes
                        );
                    }
                    at += u64::from(e.length_bytes);
                }
                data_seen += 1;
            }
            REPLY_TYPE_ERROR | REPLY_TYPE_ERROR_OFFSET => {
                let (error, _) = parse_error_chunk(&payload).expect("error chunk parses");
                assert!(is_error_value(error), "error value {error}");
                ok = false;
            }
            t => panic!("unknown chunk type {t}"),
        }
        if done {
            if ok && what == Command::Read {
                assert_eq!(data_seen, u64::from(hdr.length), "READ not fully answered");
            }
            if ok && what == Command::BlockStatus {
                assert!(data_seen > 0, "BLOCK_STATUS answered without status");
            }
            return ok;
        }
    }
}

const STATE_HOLE_ZERO: u32 = lsvd_nbd::STATE_HOLE | lsvd_nbd::STATE_ZERO;

fn check_data(att: &Attached, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let want = att.shadow.get(start..start + data.len());
    assert!(
        want == Some(data),
        "READ at {offset} returned other data than was written"
    );
}
