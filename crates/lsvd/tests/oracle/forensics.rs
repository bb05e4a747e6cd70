//! Post-mortem help for a violation: where the write-log image and the store say a
//! block's data is, and whose stamp sits there.

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::object::decode_object_header;
use lsvd_core::format::record::{
    ExtentKind, RECORD_ALIGN_BYTES, RECORD_MAGIC, decode_record_header, verify_record,
};
use lsvd_engine::keys::{objects_prefix, parse_object_name};
use lsvd_store::DynStore;

use super::stamp::{self, BLOCK};

const SECTORS_PER_BLOCK: u64 = (BLOCK / 512) as u64;

/// Blocks named in violation messages ("block N: ..."), at most `max`.
pub fn blocks_in(violations: &str, max: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for part in violations.split("block ").skip(1) {
        let num: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(b) = num.parse::<u64>()
            && part[num.len()..].starts_with(':')
            && !out.contains(&b)
        {
            out.push(b);
            if out.len() == max {
                break;
            }
        }
    }
    out
}

fn describe_stamp(block: u64, data: &[u8]) -> String {
    match stamp::decode(block, data) {
        stamp::Seen::Garbage(g) => format!("garbage ({g})"),
        s => format!("{s:?}"),
    }
}

/// Every extent of a record with the stamp its data carries.
fn record_summary(image: &[u8], off: usize, h: &lsvd_core::format::record::RecordHeader) -> String {
    let mut data_at = off + h.header_bytes as usize;
    let mut parts = Vec::new();
    for e in &h.extents {
        match e.kind {
            ExtentKind::Zero => parts.push(format!("[{}+{} zero]", e.lba, e.sectors)),
            ExtentKind::Data => {
                let first = e.lba / SECTORS_PER_BLOCK;
                let at = data_at.min(image.len());
                let end = (data_at + BLOCK).min(image.len());
                let s = match stamp::decode(first, &image[at..end]) {
                    stamp::Seen::Write(id) => format!("#{id}"),
                    stamp::Seen::Zero => "zeros".into(),
                    stamp::Seen::Garbage(_) => {
                        let mut blk = [0u8; 8];
                        let mut id = [0u8; 8];
                        if end >= at + 24 {
                            blk.copy_from_slice(&image[at + 8..at + 16]);
                            id.copy_from_slice(&image[at + 16..at + 24]);
                        }
                        format!(
                            "stamp of block {} #{}",
                            u64::from_le_bytes(blk),
                            u64::from_le_bytes(id)
                        )
                    }
                };
                parts.push(format!("[{}+{} {s}]", e.lba, e.sectors));
                data_at += e.sectors as usize * 512;
            }
        }
    }
    parts.join(" ")
}

/// What the log image (every valid record, live or stale) and the store hold for
/// `blocks`.
pub async fn explain(image: &[u8], store: &DynStore, volume: &str, blocks: &[u64]) -> String {
    let mut out = Vec::new();
    if image.len() >= 2 * CACHE_SUPER_BYTES {
        out.push(format!(
            "cache superblock: {:?}",
            newest_cache_super(
                &image[..CACHE_SUPER_BYTES],
                &image[CACHE_SUPER_BYTES..2 * CACHE_SUPER_BYTES]
            )
        ));
    }
    let mut off = 2 * CACHE_SUPER_BYTES;
    while off + RECORD_ALIGN_BYTES as usize <= image.len() {
        if &image[off..off + 8] == RECORD_MAGIC
            && let Ok(h) = decode_record_header(&image[off..])
        {
            let valid = verify_record(&h, &image[off..]).is_ok();
            let mut data_at = off as u64 + h.header_bytes as u64;
            for e in &h.extents {
                let (lo, hi) = (e.lba, e.lba + e.sectors as u64);
                for &b in blocks {
                    let s = b * SECTORS_PER_BLOCK;
                    if s >= lo && s < hi {
                        let what = match e.kind {
                            ExtentKind::Zero => "zero".to_string(),
                            ExtentKind::Data => {
                                let at = (data_at + (s - lo) * 512) as usize;
                                describe_stamp(b, &image[at..(at + BLOCK).min(image.len())])
                            }
                        };
                        if let ExtentKind::Data = e.kind {
                            let at = data_at + (s - lo) * 512;
                            out.push(format!(
                                "device writes touching block {b}'s data at {at} in this record: {}",
                                writes_touching(at, BLOCK as u64)
                            ));
                        }
                        out.push(format!(
                            "log: record seq {} at {off} ({} bytes, crc {:#x} {}, prev {:#x}) maps block {b}: {what}; all extents: {}",
                            h.seq,
                            h.total_bytes(),
                            h.crc,
                            if valid { "ok" } else { "BAD" },
                            h.prev_crc,
                            record_summary(image, off, &h)
                        ));
                    }
                }
                if e.kind == ExtentKind::Data {
                    data_at += e.sectors as u64 * 512;
                }
            }
        }
        off += RECORD_ALIGN_BYTES as usize;
    }
    let listing = match store.list(&objects_prefix(volume)).await {
        Ok(l) => l,
        Err(e) => {
            out.push(format!("store: cannot list: {e}"));
            return out.join("\n    ");
        }
    };
    for entry in listing {
        let Some(lsvd_engine::keys::ObjectName { seq, kind, .. }) = parse_object_name(&entry.key)
        else {
            continue;
        };
        let Ok(bytes) = store.get(&entry.key).await else {
            continue;
        };
        let Ok(h) = decode_object_header(&bytes) else {
            out.push(format!(
                "store: object {seq} ({kind:?}) header does not decode"
            ));
            continue;
        };
        for &(lba, sectors) in &h.trims {
            for &b in blocks {
                let s = b * SECTORS_PER_BLOCK;
                if s >= lba && s < lba + sectors {
                    out.push(format!(
                        "store: object {seq} ({kind:?}, last record {}) trims block {b}",
                        h.last_record_seq
                    ));
                }
            }
        }
        for (e, offset) in h.extent_offsets() {
            for &b in blocks {
                let s = b * SECTORS_PER_BLOCK;
                if s >= e.lba && s < e.lba + e.sectors as u64 {
                    let at = (offset + (s - e.lba) * 512) as usize;
                    out.push(format!(
                        "store: object {seq} ({kind:?}, last record {}) maps block {b}{}: {}",
                        h.last_record_seq,
                        e.source
                            .map(|src| format!(
                                " (moved from object {} @{})",
                                src.object_seq, src.object_offset
                            ))
                            .unwrap_or_default(),
                        describe_stamp(b, &bytes[at..(at + BLOCK).min(bytes.len())])
                    ));
                }
            }
        }
    }
    out.join("\n    ")
}

/// Records written with data that does not carry the stamp of the block it is written
/// for (the workload always writes stamped blocks). Filled by [`record_checker`].
pub static WRITE_ANOMALIES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A cache write hook that checks every write-log record as it is written.
pub fn record_checker() -> lsvd_engine::cache_dev::faulty::WriteHook {
    use lsvd_engine::cache_dev::faulty::DevEvent;
    Box::new(|ev| {
        let (offset, buf) = match ev {
            DevEvent::Sync => {
                DEVICE_LOG
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((u64::MAX, 0, 0));
                return;
            }
            DevEvent::Write { offset, data } | DevEvent::DurableWrite { offset, data } => {
                (offset, data)
            }
        };
        let seq = if buf.len() >= 40 && &buf[..8] == RECORD_MAGIC {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[32..40]);
            u64::from_le_bytes(b)
        } else {
            u64::MAX
        };
        {
            let mut log = DEVICE_LOG.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() > 200_000 {
                log.drain(..100_000);
            }
            log.push((offset, buf.len() as u64, seq));
        }
        if buf.len() < 8 || &buf[..8] != RECORD_MAGIC {
            return;
        }
        let Ok(h) = decode_record_header(buf) else {
            return;
        };
        let mut bad = Vec::new();
        if verify_record(&h, buf).is_err() {
            bad.push("bad CRC as written".to_string());
        }
        let mut data_at = h.header_bytes as usize;
        for e in &h.extents {
            if e.kind != ExtentKind::Data {
                continue;
            }
            let blocks = e.sectors as u64 / SECTORS_PER_BLOCK;
            for i in 0..blocks {
                let b = e.lba / SECTORS_PER_BLOCK + i;
                let at = data_at + i as usize * BLOCK;
                if at + BLOCK <= buf.len()
                    && let stamp::Seen::Garbage(g) = stamp::decode(b, &buf[at..at + BLOCK])
                {
                    bad.push(format!("block {b}: {g}"));
                }
            }
            data_at += e.sectors as usize * 512;
        }
        if !bad.is_empty() {
            let msg = format!(
                "record seq {} written at {offset} carries wrong data: {}\n{}",
                h.seq,
                bad.join("; "),
                std::backtrace::Backtrace::force_capture()
            );
            WRITE_ANOMALIES
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(msg);
        }
    })
}

/// Every device write as (offset, length, record seq or MAX) and syncs as
/// (MAX, 0, 0), in device order (all devices of this process, most recent kept).
pub static DEVICE_LOG: std::sync::Mutex<Vec<(u64, u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// The device writes that touched `[at, at+len)`, most recent last, with the number of
/// syncs between consecutive entries.
pub fn writes_touching(at: u64, len: u64) -> String {
    let log = DEVICE_LOG.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    let mut syncs = 0;
    for &(off, n, seq) in log.iter() {
        if off == u64::MAX {
            syncs += 1;
            continue;
        }
        if off < at + len && at < off + n {
            out.push(format!(
                "(+{syncs} syncs) write [{off}, {}) seq {}",
                off + n,
                if seq == u64::MAX {
                    "-".to_string()
                } else {
                    seq.to_string()
                }
            ));
            syncs = 0;
        }
    }
    out.push(format!("(+{syncs} syncs since)"));
    let n = out.len();
    out[n.saturating_sub(12)..].join("; ")
}

/// Anomalies seen so far (and forget them).
pub fn take_write_anomalies() -> Vec<String> {
    std::mem::take(&mut *WRITE_ANOMALIES.lock().unwrap_or_else(|p| p.into_inner()))
}

/// CRC-valid records in a device image whose data does not carry the stamps of the
/// blocks they are for: (offset, length, description).
pub fn image_anomalies(image: &[u8]) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    let mut off = 2 * CACHE_SUPER_BYTES;
    while off + RECORD_ALIGN_BYTES as usize <= image.len() {
        if &image[off..off + 8] == RECORD_MAGIC
            && let Ok(h) = decode_record_header(&image[off..])
            && verify_record(&h, &image[off..]).is_ok()
        {
            let mut data_at = off + h.header_bytes as usize;
            for e in &h.extents {
                if e.kind != ExtentKind::Data {
                    continue;
                }
                for i in 0..e.sectors as u64 / SECTORS_PER_BLOCK {
                    let b = e.lba / SECTORS_PER_BLOCK + i;
                    let at = data_at + i as usize * BLOCK;
                    if let stamp::Seen::Garbage(g) = stamp::decode(b, &image[at..at + BLOCK]) {
                        out.push((
                            off as u64,
                            h.total_bytes(),
                            format!("valid record seq {} at {off}: block {b}: {g}", h.seq),
                        ));
                    }
                }
                data_at += e.sectors as usize * 512;
            }
        }
        off += RECORD_ALIGN_BYTES as usize;
    }
    out
}

#[cfg(test)]
mod tests {
    use lsvd_core::VolumeId;
    use lsvd_core::format::record::{RecordExtent, encode_record};

    use super::*;

    #[test]
    fn record_crc_covers_the_last_block() {
        let extents: Vec<RecordExtent> = (0..8)
            .map(|i| RecordExtent {
                lba: i * 64,
                sectors: 8,
                kind: ExtentKind::Data,
            })
            .collect();
        let data: Vec<u8> = (0..32768u32).map(|i| (i * 7 + 3) as u8).collect();
        let rec = encode_record(VolumeId([1; 16]), 700, 0x1234, &extents, &data);
        let h = decode_record_header(&rec).expect("decode");
        assert!(verify_record(&h, &rec).is_ok());
        let mut bad = rec.clone();
        let n = bad.len();
        bad[n - 4096..].fill(0x11);
        assert!(
            verify_record(&h, &bad).is_err(),
            "CRC must cover the last block"
        );
    }
}
