//! `lsvd inspect`: dump a volume's persisted structures in readable form.
//!
//! Read-only: the store is opened so that nothing in it changes, and a volume a server
//! is changing meanwhile is read again from a fresh listing when a key it listed
//! vanishes before it is read (`lsvd_engine::look_again`); what is printed comes from one
//! look.

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, decode_cache_super};
use lsvd_core::format::checkpoint::decode_checkpoint;
use lsvd_core::format::object::{ObjectKind, decode_object_header};
use lsvd_core::format::record::ExtentKind;

use super::{Common, InspectWhat};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::format::volume_super::decode_volume_super;
use lsvd_engine::cache_dev::{CacheDevice, FileCache};
use lsvd_engine::keys::{object_key, objects_prefix, parse_object_name, super_prefix};
use lsvd_engine::recovery::log_scan::scan_log;
use lsvd_engine::recovery::store_recovery::vanished;
use lsvd_store::DynStore;

/// `what` fails its checks.
fn corrupt(what: impl Into<String>, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::with_source(ErrorKind::Corrupt, what, e)
}

pub async fn inspect(common: &Common, what: InspectWhat) -> Result<()> {
    match what {
        InspectWhat::Objects { name } => {
            let store = super::admin::store_read_only(common)?;
            let listing = store.list(&objects_prefix(&name)).await?;
            println!(
                "{:<18} {:>6} {:<10} {:>12}",
                "seq", "epoch", "kind", "bytes"
            );
            for e in listing {
                match parse_object_name(&e.key) {
                    Some(n) => println!(
                        "{:016x}   {:>6} {:<10} {:>12}",
                        n.seq,
                        n.epoch,
                        format!("{:?}", n.kind),
                        e.size_bytes
                    ),
                    None => println!("{:<18} {:>6} {:<10} {:>12}", e.key, "?", "?", e.size_bytes),
                }
            }
            Ok(())
        }
        InspectWhat::Object { name, seq } => {
            let store = super::admin::store_read_only(common)?;
            let store = super::admin::unlocked(common, &store, &name).await?;
            let seq = parse_seq(&seq)?;
            let (key, bytes) = lsvd_engine::look_again(
                &format!("lsvd inspect object {name} {seq:016x}"),
                async || find_object(&store, &name, seq).await,
            )
            .await?;
            let h = decode_object_header(&bytes).map_err(|e| corrupt(key.as_str(), e))?;
            println!("object {key}");
            println!(
                "  kind {:?}, seq {:016x}, volume {}",
                h.kind, h.seq, h.volume
            );
            println!("  last write-log record {}", h.last_record_seq);
            if let Some(size) = h.volume_size_bytes {
                println!(
                    "  resizes the volume to {} ({size} bytes)",
                    lsvd_core::size::format_size(size)
                );
            }
            println!(
                "  header {} bytes, data {} bytes ({} stored), {} chunks of {} bytes, codec {:?}",
                h.header_bytes,
                h.data_bytes,
                h.stored_data_bytes(),
                h.chunk_crcs.len(),
                h.chunk_bytes,
                h.codec
            );
            let data = h.open_whole(&bytes);
            let data_ok = data.as_ref().map(drop);
            println!(
                "  data checksums: {}",
                if data_ok.is_ok() {
                    "ok".to_string()
                } else {
                    format!("{data_ok:?}")
                }
            );
            for &(lba, sectors) in &h.trims {
                println!("  trim   lba {lba:>12} +{sectors}");
            }
            for (e, off) in h.extent_offsets() {
                match e.source {
                    Some(src) => println!(
                        "  extent lba {:>12} +{:<8} at {off:>10}  from {:016x}@{}",
                        e.lba, e.sectors, src.object_seq, src.object_offset
                    ),
                    None => println!("  extent lba {:>12} +{:<8} at {off:>10}", e.lba, e.sectors),
                }
            }
            if h.kind == ObjectKind::Checkpoint {
                let payload = data.map_err(|e| corrupt("", e))?;
                let ck = decode_checkpoint(&payload).map_err(|e| corrupt("", e))?;
                println!(
                    "  checkpoint: clean={} size={} next_object={:016x} last_record={} objects={} extents={}",
                    ck.clean,
                    ck.volume_size_bytes,
                    ck.next_object_seq,
                    ck.last_record_seq,
                    ck.objects.len(),
                    ck.extents.len()
                );
                if let Some(heat) = &ck.heat {
                    println!(
                        "    heat: {} regions of {} bytes, {} decays, {} bytes since the last",
                        heat.counts.len(),
                        1u64 << heat.region_shift,
                        heat.decays,
                        heat.since_decay_bytes
                    );
                }
                for o in &ck.objects {
                    println!(
                        "    object {:016x} kind {} total {} live {}",
                        o.seq, o.kind, o.total_bytes, o.live_bytes
                    );
                }
                for e in ck.extents.iter().take(1000) {
                    println!(
                        "    lba {:>12} +{:<8} -> {:016x}@{}",
                        e.lba, e.sectors, e.object_seq, e.object_offset
                    );
                }
                if ck.extents.len() > 1000 {
                    println!("    ... {} more extents", ck.extents.len() - 1000);
                }
            }
            Ok(())
        }
        InspectWhat::Super { name } => {
            let store = super::admin::store_read_only(common)?;
            let generations =
                lsvd_engine::look_again(&format!("lsvd inspect super {name}"), async || {
                    read_generations(&store, &name).await
                })
                .await?;
            if generations.is_empty() {
                println!("volume {name}: no superblock generations in the store");
            }
            for (key, bytes) in generations {
                match decode_volume_super(&bytes) {
                    Err(err) => println!("{key}: CORRUPT: {err}"),
                    Ok(sb) => {
                        let seq = |c: Option<u64>| c.map_or("none".into(), |c| format!("{c:016x}"));
                        println!("{key}");
                        println!(
                            "  generation {}, session {:016x}, volume {}{}",
                            sb.generation,
                            sb.session,
                            sb.volume,
                            if sb.clean {
                                ", written at clean shutdown"
                            } else {
                                ""
                            }
                        );
                        println!(
                            "  checkpoints: newest {}, previous {}",
                            seq(sb.newest_checkpoint),
                            seq(sb.previous_checkpoint)
                        );
                        println!(
                            "  durable through object {:016x} (exclusive), store holds records through {}",
                            sb.durable_through, sb.last_record_seq
                        );
                        println!(
                            "  written at {} ms since the Unix epoch",
                            sb.written_unix_ms
                        );
                    }
                }
            }
            Ok(())
        }
        InspectWhat::Log { name } => {
            let path = common.data.join(format!("{name}.wlog"));
            let (file, _) = FileCache::open_or_create(&path, 0)
                .map_err(|e| Error::local_io(path.display().to_string(), e))?;
            let read_failed = |e| Error::local_io("", e);
            for slot in 0..2u64 {
                let mut b = vec![0u8; CACHE_SUPER_BYTES];
                file.read_at(&mut b, slot * CACHE_SUPER_BYTES as u64)
                    .map_err(read_failed)?;
                match decode_cache_super(&b) {
                    Ok(sb) => println!(
                        "superblock {slot}: generation {} clean={} volume {} log [{}, {}) tail offset {} seq {}",
                        sb.generation,
                        sb.clean,
                        sb.volume,
                        sb.log_start,
                        sb.log_end,
                        sb.tail_offset,
                        sb.tail_seq
                    ),
                    Err(e) => println!("superblock {slot}: invalid ({e})"),
                }
            }
            let mut a = vec![0u8; CACHE_SUPER_BYTES];
            let mut b = vec![0u8; CACHE_SUPER_BYTES];
            file.read_at(&mut a, 0).map_err(read_failed)?;
            file.read_at(&mut b, CACHE_SUPER_BYTES as u64)
                .map_err(read_failed)?;
            let sb = lsvd_core::format::cache_super::newest_cache_super(&a, &b)
                .map_err(|e| corrupt("", e))?;
            // An encrypted log (`--encrypt-local`) reads with the volume's keys.
            let keys = match sb.local_key_id {
                Some(_) => {
                    let store = super::admin::store_read_only(common)?;
                    super::admin::local_keys(common, &store, &name).await?
                }
                None => None,
            };
            let file = lsvd_engine::local_encryption::readable_write_log(
                std::sync::Arc::new(file),
                &sb,
                keys.as_deref(),
                &path,
            )?;
            let file = &*file;
            let chain = scan_log(file, &sb);
            match lsvd_engine::write::log_index::check_against_chain(file, &sb, &chain) {
                (Some(i), problems) => println!(
                    "write-log index: generation {}, {} records (seq {}..={}){}",
                    i.generation,
                    i.records.len(),
                    i.records.first().map_or(0, |r| r.header.seq),
                    i.records.last().map_or(0, |r| r.header.seq),
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!("; PROBLEMS: {}", problems.join("; "))
                    }
                ),
                (None, _) => println!("write-log index: none valid for this open"),
            }
            println!("{} records on the chain", chain.len());
            for r in &chain {
                println!(
                    "record seq {} at {} ({} bytes, crc {:08x}, prev {:08x})",
                    r.header.seq,
                    r.offset,
                    r.header.total_bytes(),
                    r.header.crc,
                    r.header.prev_crc
                );
                for e in &r.header.extents {
                    let kind = if e.kind == ExtentKind::Data {
                        "data"
                    } else {
                        "zero"
                    };
                    println!(
                        "  {kind} lba {:>12} +{} ({} bytes)",
                        e.lba,
                        e.sectors,
                        e.sectors as u64 * SECTOR_BYTES
                    );
                }
            }
            Ok(())
        }
    }
}

/// The key and bytes of object `seq` of volume `name`: the newest epoch's object with
/// that number (others are a superseded writer's, which `inspect objects` lists).
/// `NotFound` if the listing has none; one listed and gone when read (GC) is an error
/// `look_again` recognizes.
async fn find_object(store: &DynStore, name: &str, seq: u64) -> Result<(String, Vec<u8>)> {
    let listing = store.list(&objects_prefix(name)).await?;
    let found = listing
        .iter()
        .filter_map(|e| parse_object_name(&e.key))
        .filter(|n| n.seq == seq)
        .max_by_key(|n| n.epoch)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no object {seq:016x} in volume {name}"),
            )
        })?;
    let key = object_key(name, seq, found.epoch, found.kind);
    match store.get(&key).await {
        Ok(bytes) => Ok((key, bytes)),
        Err(e) if e.is_not_found() => Err(vanished(e)),
        Err(e) => Err(e),
    }
}

/// Every superblock generation of volume `name`, oldest first: key and bytes. One
/// listed and gone when read (replaced by a lease renewal) is an error `look_again`
/// recognizes.
async fn read_generations(store: &DynStore, name: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for e in store.list(&super_prefix(name)).await? {
        match store.get(&e.key).await {
            Ok(bytes) => out.push((e.key, bytes)),
            Err(err) if err.is_not_found() => return Err(vanished(err)),
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}

fn parse_seq(s: &str) -> Result<u64> {
    let t = s.trim_start_matches("0x");
    u64::from_str_radix(t, 16).map_err(|_| {
        Error::bad_input(format!(
            "invalid object sequence number '{s}' (hexadecimal, as listed)"
        ))
    })
}
