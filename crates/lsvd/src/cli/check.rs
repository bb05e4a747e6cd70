//! `lsvd check NAME`: verify every checksum and map invariant of a volume.
//!
//! Reads every object the volume consists of in full and verifies its header and
//! chunk checksums (on a store that keeps copies, the mirrored chain, every copy on its
//! own: a copy missing or failing is reported naming its directory, with the hint to
//! run `lsvd chain rebuild`; the volume's other keys are compared copy to copy), rebuilds the map from the newest checkpoint and the objects after
//! it, checks that every mapped extent lies inside an existing object and that live
//! byte counts agree, and follows the write log's record chain if one is present,
//! verifying every record it would still upload against its CRC32C and data hash.
//! Reports every problem found; exits non-zero if there was any.

use std::collections::BTreeSet;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::object::{ObjectKind, decode_object_header};

use super::Common;
use crate::cache_dev::{CacheDevice, FileCache};
use crate::engine::keys::{ObjectName, object_key, objects_prefix, parse_object_name};
use crate::engine::log_scan::{FoundRecord, chain_break, scan_log, verify_found};
use crate::engine::read_meta;
use crate::engine::store_recovery::recover_store;
use crate::error::{Error, ErrorKind, Result};
use crate::size::format_size;
use crate::store::chain::copy_check::compare_key_copies;

/// Problems found are a `Corrupt` error (after each is printed).
pub async fn check(common: &Common, name: &str) -> Result<()> {
    let store = super::admin::store(common)?;
    let meta = read_meta(&store, name).await?;
    let mut problems: Vec<String> = Vec::new();
    println!(
        "checking volume {name} ({} at creation) in {}",
        format_size(meta.size_bytes),
        store.describe()
    );

    // 0. A store that keeps copies (the mirrored chain): every copy of the volume's
    // keys that are not objects (metadata, superblocks, snapshot records) present and
    // the same. Objects are verified copy by copy below. Both before recovery (step 2),
    // whose reads repair a missing copy.
    let keys = store
        .list(&format!("{name}/"))
        .await
        .map_err(|e| e.context("cannot list the volume's keys"))?;
    let before = problems.len();
    for entry in keys.iter().filter(|e| parse_object_name(&e.key).is_none()) {
        compare_copies(&store, &entry.key, &mut problems).await;
    }
    if problems.len() > before {
        println!(
            "  store copies: {} problems with copies of metadata",
            problems.len() - before
        );
    }

    // 1. Every object in the store, every copy of it: header, chunk checksums,
    // identity. An object counts as verified (for the map checks) if one copy is good.
    let listing = store
        .list(&objects_prefix(name))
        .await
        .map_err(|e| e.context("cannot list objects"))?;
    let mut verified = BTreeSet::new();
    let mut bytes_read = 0u64;
    let mut bad_copies = 0usize;
    for entry in &listing {
        let Some(ObjectName { seq, epoch, kind }) = parse_object_name(&entry.key) else {
            problems.push(format!("{}: unexpected object name", entry.key));
            continue;
        };
        let copies = match store.copies_of(&entry.key).await {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("{}: cannot read: {e}", entry.key));
                continue;
            }
        };
        let mut good = false;
        for i in 0..copies.len() {
            let what = copy_label(&entry.key, &copies, i);
            let bytes = match store.get_copy(&entry.key, i).await {
                Ok(b) => b,
                Err(e) => {
                    let why = if e.is_not_found() {
                        "missing from this copy".to_string()
                    } else {
                        format!("cannot read: {e}")
                    };
                    problems.push(with_hint(format!("{what}: {why}"), &copies));
                    bad_copies += 1;
                    continue;
                }
            };
            bytes_read += bytes.len() as u64;
            match verify_object(&bytes, seq, epoch, kind, &meta) {
                Ok(notes) => {
                    good = true;
                    problems.extend(notes.into_iter().map(|n| format!("{what}: {n}")));
                }
                Err(why) => {
                    problems.push(with_hint(format!("{what}: {why}"), &copies));
                    bad_copies += 1;
                }
            }
        }
        if good {
            verified.insert((seq, epoch));
        }
    }
    if bad_copies > 0 {
        println!("  object copies: {bad_copies} missing or failing their checks");
    }
    println!(
        "  objects: {} listed, {} verified, {} read",
        listing.len(),
        verified.len(),
        format_size(bytes_read)
    );

    // 2. The map: rebuilt exactly as recovery would, then checked against the objects.
    match recover_store(&store, &meta).await {
        Err(e) => problems.push(format!("recovery would fail: {e}")),
        Ok(rec) => {
            let st = &rec.state;
            match rec.superblock {
                Some(sb) => println!(
                    "  volume superblock: generation {}, newest checkpoint {}",
                    sb.generation,
                    sb.newest_checkpoint
                        .map_or("none".into(), |c| format!("{c:016x}"))
                ),
                None => println!("  volume superblock: none (volume never opened by this version)"),
            }
            if let Some(why) = &rec.superblock_violation {
                problems.push(why.clone());
            }
            if !rec.stranded.is_empty() {
                problems.push(format!(
                    "{} stranded objects past a gap (the next open removes them): {:?}",
                    rec.stranded.len(),
                    rec.stranded
                        .iter()
                        .map(|n| format!("{:016x}", n.seq))
                        .collect::<Vec<_>>()
                ));
            }
            let lineage = crate::engine::load_lineage(&store, &meta).await?;
            let mut live_from_map = std::collections::BTreeMap::<u64, u64>::new();
            for p in st.map().iter() {
                let seq = p.location.object_seq;
                *live_from_map.entry(seq).or_default() += p.sectors * SECTOR_BYTES;
                match st.objects().get(&seq) {
                    None => {
                        problems.push(format!("lba {} maps to unknown object {seq:016x}", p.lba))
                    }
                    Some(o) => {
                        let end = p.location.offset + p.sectors * SECTOR_BYTES;
                        if p.location.offset < o.header_bytes as u64 || end > o.total_bytes {
                            problems.push(format!("lba {} maps outside object {seq:016x}", p.lba));
                        }
                        if !verified.contains(&(seq, o.epoch)) && lineage.owner(seq).is_none() {
                            problems.push(format!(
                                "lba {} maps to object {seq:016x}, which is missing or corrupt",
                                p.lba
                            ));
                        }
                    }
                }
            }
            for (&seq, o) in st.objects() {
                let mapped = live_from_map.get(&seq).copied().unwrap_or(0);
                if mapped != o.live_bytes {
                    problems.push(format!(
                        "object {seq:016x}: live bytes {} but map says {mapped}",
                        o.live_bytes
                    ));
                }
            }
            println!(
                "  map: {} extents, {} live in {} objects ({} stored); checkpoint {}",
                st.map().extent_count(),
                format_size(st.live_bytes()),
                st.objects().len(),
                format_size(st.stored_bytes()),
                rec.checkpoint_seq
                    .map_or("none".to_string(), |c| format!("{c:016x}"))
            );
            // Keys of objects in the table must exist (a clone's shared objects are its
            // ancestors', checked with them).
            let shared = st
                .objects()
                .keys()
                .filter(|&&s| lineage.owner(s).is_some())
                .count();
            if shared > 0 {
                println!("  {shared} objects shared with the volumes this one is a clone of");
            }
            for &seq in st.objects().keys() {
                let o = st.objects()[&seq];
                if !verified.contains(&(seq, o.epoch)) && lineage.owner(seq).is_none() {
                    let key = object_key(name, seq, o.epoch, o.kind);
                    problems.push(format!("{key}: in the object table but missing or corrupt"));
                }
            }
            check_log(common, name, &meta, st.last_record_seq(), &mut problems);
        }
    }

    if problems.is_empty() {
        println!("ok: no problems found");
        Ok(())
    } else {
        for p in &problems {
            println!("problem: {p}");
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!("{} problems found in volume {name}", problems.len()),
        ))
    }
}

/// `key`, or `key (copy in DIR)` when the store keeps more than one copy.
fn copy_label(key: &str, copies: &[String], i: usize) -> String {
    match copies.get(i) {
        Some(dir) if copies.len() > 1 => format!("{key} (copy in {dir})"),
        _ => key.to_string(),
    }
}

/// A problem with one copy of several: say how to fix it.
fn with_hint(problem: String, copies: &[String]) -> String {
    if copies.len() > 1 {
        format!(
            "{problem}; run `lsvd chain rebuild` with the server stopped to rewrite it from a good copy"
        )
    } else {
        problem
    }
}

/// Every copy of `key` (a key with no checksums of its own that this check knows)
/// read on its own: a copy that cannot be read, or copies that differ, are problems.
async fn compare_copies(store: &crate::store::DynStore, key: &str, problems: &mut Vec<String>) {
    let found = match compare_key_copies(&**store, key).await {
        Ok(f) => f,
        Err(e) => {
            problems.push(format!("{key}: cannot read: {e}"));
            return;
        }
    };
    let copies = &found.names;
    for (i, e) in &found.unreadable {
        let why = if e.is_not_found() {
            "missing from this copy".to_string()
        } else {
            format!("cannot read: {e}")
        };
        problems.push(with_hint(
            format!("{}: {why}", copy_label(key, copies, *i)),
            copies,
        ));
    }
    if let Some(differing) = &found.differing {
        let dirs: Vec<&str> = differing.iter().map(|i| copies[*i].as_str()).collect();
        problems.push(with_hint(
            format!("{key}: the copies in {} differ", dirs.join(" and ")),
            copies,
        ));
    }
}

/// Check one copy of object `seq`: Err if it cannot be used (header, length, chunk
/// checksums), else the identity mismatches found (reported, but the data is sound).
fn verify_object(
    bytes: &[u8],
    seq: u64,
    epoch: u64,
    kind: ObjectKind,
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
) -> std::result::Result<Vec<String>, String> {
    let h = decode_object_header(bytes).map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    if h.seq != seq || h.kind != kind || h.volume != meta.volume || h.epoch != epoch {
        notes.push(format!(
            "header says seq {:016x} epoch {} kind {:?} volume {}",
            h.seq, h.epoch, h.kind, h.volume
        ));
    }
    if h.total_bytes() != bytes.len() as u64 {
        return Err(format!(
            "length {} but header says {}",
            bytes.len(),
            h.total_bytes()
        ));
    }
    h.verify_data(h.header_bytes as u64, &bytes[h.header_bytes as usize..])
        .map_err(|e| e.to_string())?;
    Ok(notes)
}

fn check_log(
    common: &Common,
    name: &str,
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
    last_in_store: u64,
    problems: &mut Vec<String>,
) {
    let path = common.data.join(format!("{name}.wlog"));
    if !path.exists() {
        println!(
            "  write log: none at {} (the store alone defines the volume)",
            path.display()
        );
        return;
    }
    let file = match FileCache::open_or_create(&path, 0) {
        Ok((f, _)) => f,
        Err(e) => {
            problems.push(format!("{}: cannot open: {e}", path.display()));
            return;
        }
    };
    let mut a = vec![0u8; CACHE_SUPER_BYTES];
    let mut b = vec![0u8; CACHE_SUPER_BYTES];
    if file.read_at(&mut a, 0).is_err() || file.read_at(&mut b, CACHE_SUPER_BYTES as u64).is_err() {
        problems.push(format!("{}: too short for a superblock", path.display()));
        return;
    }
    let sb = match newest_cache_super(&a, &b) {
        Ok(sb) => sb,
        Err(e) => {
            problems.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    if sb.volume != meta.volume {
        problems.push(format!(
            "{}: belongs to volume {}, not {}",
            path.display(),
            sb.volume,
            meta.volume
        ));
        return;
    }
    let chain = scan_log(&file, &sb);
    let (index, index_problems) = crate::engine::log_index::check_against_chain(&file, &sb, &chain);
    if let Some(i) = &index {
        println!(
            "  write-log index: generation {}, {} records",
            i.generation,
            i.records.len()
        );
    }
    problems.extend(index_problems);
    problems.extend(corrupt_records(
        &file,
        &sb,
        &chain,
        index.as_ref(),
        last_in_store,
    ));
    let pending: Vec<_> = chain
        .iter()
        .filter(|r| r.header.seq > last_in_store)
        .collect();
    println!(
        "  write log: {} records on the chain from seq {}, {} not yet in the store{}",
        chain.len(),
        sb.tail_seq,
        pending.len(),
        if sb.clean { "; closed cleanly" } else { "" }
    );
    if let Some(first) = pending.first()
        && first.header.seq != last_in_store + 1
    {
        problems.push(format!(
            "write log resumes at record {} but the store ends at {last_in_store}",
            first.header.seq
        ));
    }
    if sb.tail_seq > last_in_store + 1 {
        problems.push(format!(
            "write log released records up to {} that the store does not hold",
            sb.tail_seq - 1
        ));
    }
}

/// Every record the log would still upload (past `last_in_store`) that fails its
/// checksums, as problems: records the write-log index lists past the end of the
/// verified chain (durable when the index was written, so acknowledged), and the
/// record that ends the chain if the log was closed cleanly (so it is not a torn
/// write). A record ending the chain after a crash is only noted: a torn write, or
/// (if a valid record chained to it follows) possibly a changed one, but a power
/// failure can leave an unsynced record torn and a later one whole.
fn corrupt_records(
    file: &dyn CacheDevice,
    sb: &lsvd_core::format::cache_super::CacheSuper,
    chain: &[FoundRecord],
    index: Option<&lsvd_core::format::log_index::LogIndex>,
    last_in_store: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut reported = BTreeSet::new();
    let chain_end = chain.last().map_or(sb.tail_seq, |c| c.header.seq + 1);
    for r in index.map_or(&[][..], |i| &i.records[..]) {
        if r.header.seq < chain_end || r.header.seq <= last_in_store {
            continue;
        }
        let found = FoundRecord {
            offset: r.offset,
            header: r.header.clone(),
        };
        if let Some(c) = verify_found(file, &found) {
            reported.insert(c.seq);
            problems.push(format!(
                "{c}; the write-log index lists it as durable, so it was acknowledged; it will not be uploaded"
            ));
        }
    }
    if let Some(b) = chain_break(file, sb, chain)
        && b.record.seq > last_in_store
        && !reported.contains(&b.record.seq)
    {
        if sb.clean {
            problems.push(format!(
                "{}; the log was closed cleanly, so it is not a torn write; recovery stops before it",
                b.record
            ));
        } else if b.followed {
            // A power failure can leave an unsynced record torn and a later one
            // whole, so this alone does not prove the device changed synced data.
            println!(
                "  warning: {}; a valid record chained to it follows: power failed before it was synced, or the cache device changed it; recovery stops before it",
                b.record
            );
        } else {
            println!(
                "  note: the log ends at record {} that fails verification: a write torn by a crash (never reported durable), not replayed",
                b.record.seq
            );
        }
    }
    problems
}
