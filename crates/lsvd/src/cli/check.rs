//! `lsvd check NAME`: verify every checksum and map invariant of a volume.
//!
//! Reads every object the volume consists of in full and verifies its header and
//! chunk checksums (on a store that keeps copies, the mirrored chain, every copy on its
//! own: a copy missing or failing is reported naming its directory, with the hint to
//! run `lsvd chain rebuild`; the volume's other keys are compared copy to copy),
//! rebuilds the map from the newest checkpoint and the objects after it, checks that
//! every mapped extent lies inside an existing object and that live byte counts agree,
//! and follows the write log's record chain if one is present, verifying every record
//! it would still upload against its CRC32C and data hash. Reports every problem
//! found; exits non-zero if there was any.
//!
//! A read-only command: the store is opened so that nothing in it changes (a mirror
//! copy found missing is reported, not repaired), and it may run while a server
//! changes the volume. So the store is read in *looks*: the map as recovery rebuilds
//! it first, then the listing of objects, each verified once (objects never change,
//! so a later look reads only the new ones). A key that vanished between a listing
//! and its read (GC, a newer checkpoint), or problems found while a server holds the
//! volume (an object the map needs deleted since the map was read, a mirror copy in
//! the middle of its put), are looked at again from a fresh listing, up to
//! `lsvd_engine::LOOKS` times with a short pause; only what the last look found is
//! reported. While a server holds the volume, objects of its epoch past a gap are
//! uploads in flight (noted, not a problem), and the write log a server on this data
//! directory is writing is not checked. (A server that stopped without a clean
//! shutdown looks like a holder until its lease runs out: its problems are reported
//! after the looks.)

use std::collections::{BTreeSet, HashSet};

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
use lsvd_core::format::object::{ObjectHeader, ObjectKind, decode_object_header};
use lsvd_core::format::volume_meta::VolumeMeta;

use super::Common;
use super::progress::Progress;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::size::format_size;
use lsvd_engine::cache_dev::{CacheDevice, FileCache};
use lsvd_engine::keys::{ObjectName, object_key, objects_prefix, parse_object_name};
use lsvd_engine::read_meta;
use lsvd_engine::recovery::log_scan::{FoundRecord, chain_break, scan_log, verify_found};
use lsvd_engine::recovery::store_recovery::{is_vanished, recover_store_view};
use lsvd_engine::{LOOKS, held_now, now_unix_ms};
use lsvd_store::DynStore;
use lsvd_store::chain::copy_check::compare_key_copies;

/// What one look at the store found.
#[derive(Default)]
struct Look {
    /// What to print about the store, in order.
    lines: Vec<String>,
    problems: Vec<String>,
    /// Set when a key vanished under this look: why (look again).
    changed: Option<String>,
    /// Who holds the volume, if a server does now (its newest superblock says so).
    holder: Option<String>,
    /// The last write-log record the store holds, when recovery succeeded.
    last_record_seq: Option<u64>,
}

/// What looks learn that stays true: the copies that verified (objects never change
/// under a name), and the bytes read.
#[derive(Default)]
struct Memo {
    good: HashSet<(String, usize)>,
    bytes_read: u64,
}

/// Problems found are a `Corrupt` error (after each is printed).
pub async fn check(common: &Common, name: &str, quiet: bool) -> Result<()> {
    let store = super::admin::store_read_only(common)?;
    let store = super::admin::unlocked(common, &store, name).await?;
    let meta = read_meta(&store, name).await?;
    println!(
        "checking volume {name} ({} at creation) in {}",
        format_size(meta.size_bytes),
        store.describe()
    );
    let mut memo = Memo::default();
    let mut pause = std::time::Duration::from_millis(50);
    let mut looks = 1;
    let found = loop {
        let look = look_at(&store, &meta, &mut memo, quiet).await?;
        let again = match (&look.changed, &look.holder) {
            (Some(why), _) => Some(why.clone()),
            (None, Some(holder)) if !look.problems.is_empty() => Some(format!(
                "{} problems while {holder} holds the volume",
                look.problems.len()
            )),
            _ => None,
        };
        match again {
            Some(why) if looks < LOOKS => {
                looks += 1;
                lsvd_store::log::info(&format!(
                    "lsvd check {name}: {why}; looking again ({looks} of {LOOKS})"
                ));
                lsvd_store::clock::SharedClock::default().sleep(pause).await;
                pause *= 2;
            }
            _ => break look,
        }
    };
    for line in &found.lines {
        println!("{line}");
    }
    if looks > 1 {
        println!(
            "  looked {looks} times (a key vanished under a look, or a server holds the volume): this is the last look"
        );
    }
    let mut problems = found.problems;
    if let Some(why) = &found.changed {
        problems.push(format!(
            "the store kept changing under the check ({looks} looks; the last: {why}): run it again, or stop the server to check a volume at rest"
        ));
    }
    if let Some(last) = found.last_record_seq {
        let log = common.data.join(format!("{name}.wlog"));
        // A server on this data directory (its control socket answers) that holds
        // the volume is writing this log: what a scan finds is mid-write.
        let server_here =
            std::os::unix::net::UnixStream::connect(crate::control::socket_path(&common.data))
                .is_ok();
        match &found.holder {
            Some(holder) if server_here && log.exists() => println!(
                "  write log: {} not checked: {holder} on this data directory holds the volume and is writing it (stop it to check the log)",
                log.display()
            ),
            _ => {
                let keys = super::admin::local_keys(common, &store, name).await?;
                check_log(common, name, &meta, keys.as_deref(), last, &mut problems)
            }
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

/// One look at the store: the map as recovery rebuilds it, then every object listed
/// after it (each copy), then the map against the objects. Errors only for what fails
/// the whole check (the clone links cannot be read).
async fn look_at(
    store: &DynStore,
    meta: &VolumeMeta,
    memo: &mut Memo,
    quiet: bool,
) -> Result<Look> {
    let name = &meta.name;
    let mut look = Look::default();

    // 0. A store that keeps copies (the mirrored chain): every copy of the volume's
    // keys that are not objects (metadata, superblocks, snapshot records) present and
    // the same. Objects are verified copy by copy below. A key gone from every copy
    // was deleted since the listing (an older superblock generation, a snapshot).
    let keys = store
        .list(&format!("{name}/"))
        .await
        .map_err(|e| e.context("cannot list the volume's keys"))?;
    let before = look.problems.len();
    for entry in keys.iter().filter(|e| parse_object_name(&e.key).is_none()) {
        compare_copies(store, &entry.key, &mut look.problems).await;
    }
    if look.problems.len() > before {
        look.lines.push(format!(
            "  store copies: {} problems with copies of metadata",
            look.problems.len() - before
        ));
    }

    // 1. The map, rebuilt exactly as recovery would, before the listing: whatever the
    // map needs was listed then, unless deleted since.
    let rec = match recover_store_view(store, meta).await {
        Ok(rec) => Some(rec),
        Err(e) if is_vanished(&e) => {
            look.changed = Some(e.to_string());
            return Ok(look);
        }
        Err(e) => {
            look.problems.push(format!("recovery would fail: {e}"));
            None
        }
    };
    let sb = rec.as_ref().and_then(|r| r.superblock.as_ref());
    look.holder = sb
        .filter(|sb| held_now(sb, now_unix_ms()))
        .map(|sb| format!("a server ({})", sb.holder));

    // 2. Every object in the store, every copy of it: header, chunk checksums,
    // identity. An object counts as verified (for the map checks) if one copy is good.
    let listing = store
        .list(&objects_prefix(name))
        .await
        .map_err(|e| e.context("cannot list objects"))?;
    let mut listed = HashSet::new();
    let mut verified = BTreeSet::new();
    let mut vanished = BTreeSet::new();
    let mut bad_copies = 0usize;
    let total_bytes = listing.iter().map(|e| e.size_bytes).sum();
    let mut progress = Progress::new(format!("check {name}"), total_bytes, quiet);
    let mut done_bytes = 0u64;
    for entry in &listing {
        done_bytes += entry.size_bytes;
        progress.update(done_bytes);
        let Some(ObjectName { seq, epoch, kind }) = parse_object_name(&entry.key) else {
            look.problems
                .push(format!("{}: unexpected object name", entry.key));
            continue;
        };
        listed.insert((seq, epoch));
        let copies = match store.copies_of(&entry.key).await {
            Ok(c) => c,
            Err(e) if e.is_not_found() => {
                vanished.insert((seq, epoch));
                continue;
            }
            Err(e) => {
                look.problems
                    .push(format!("{}: cannot read: {e}", entry.key));
                continue;
            }
        };
        let mut good = false;
        let mut missing = Vec::new();
        let mut copy_problems = Vec::new();
        for i in 0..copies.len() {
            if memo.good.contains(&(entry.key.clone(), i)) {
                good = true;
                continue;
            }
            let what = copy_label(&entry.key, &copies, i);
            let bytes = match store.get_copy(&entry.key, i).await {
                Ok(b) => b,
                Err(e) if e.is_not_found() => {
                    missing.push(with_hint(
                        format!("{what}: missing from this copy"),
                        &copies,
                    ));
                    continue;
                }
                Err(e) => {
                    copy_problems.push(with_hint(format!("{what}: cannot read: {e}"), &copies));
                    continue;
                }
            };
            memo.bytes_read += bytes.len() as u64;
            match verify_object(&bytes, seq, epoch, kind, meta) {
                Ok(notes) => {
                    good = true;
                    memo.good.insert((entry.key.clone(), i));
                    look.problems
                        .extend(notes.into_iter().map(|n| format!("{what}: {n}")));
                }
                Err(why) => copy_problems.push(with_hint(format!("{what}: {why}"), &copies)),
            }
        }
        // Missing from every copy: deleted since the listing (GC).
        if !good && copy_problems.is_empty() && missing.len() == copies.len() {
            vanished.insert((seq, epoch));
            continue;
        }
        bad_copies += missing.len() + copy_problems.len();
        look.problems.extend(missing);
        look.problems.extend(copy_problems);
        if good {
            verified.insert((seq, epoch));
        }
    }
    progress.clear();
    if bad_copies > 0 {
        look.lines.push(format!(
            "  object copies: {bad_copies} missing or failing their checks"
        ));
    }
    let verified_count = verified.len();
    look.lines.push(format!(
        "  objects: {} listed, {verified_count} verified, {} read",
        listing.len() - vanished.len(),
        format_size(memo.bytes_read)
    ));

    // 3. The map against the objects.
    let Some(rec) = rec else {
        return Ok(look);
    };
    let st = &rec.state;
    match &rec.superblock {
        Some(sb) => look.lines.push(format!(
            "  volume superblock: generation {}, newest checkpoint {}{}",
            sb.generation,
            sb.newest_checkpoint
                .map_or("none".into(), |c| format!("{c:016x}")),
            look.holder
                .as_ref()
                .map_or(String::new(), |h| format!("; held by {h}"))
        )),
        None => look
            .lines
            .push("  volume superblock: none (volume never opened by this version)".into()),
    }
    if let Some(why) = &rec.superblock_violation {
        look.problems.push(why.clone());
    }
    // Objects of the holder's epoch past a gap are uploads in flight while it serves.
    let in_flight = |n: &ObjectName| {
        look.holder.is_some()
            && rec
                .superblock
                .as_ref()
                .is_some_and(|sb| sb.epoch == n.epoch)
    };
    let (uploading, stranded): (Vec<&ObjectName>, Vec<&ObjectName>) =
        rec.stranded.iter().partition(|n| in_flight(n));
    if !uploading.is_empty() {
        look.lines.push(format!(
            "  {} objects past a gap: uploads in flight (a server holds the volume)",
            uploading.len()
        ));
    }
    if !stranded.is_empty() {
        look.problems.push(format!(
            "{} stranded objects past a gap (the next open removes them): {:?}",
            stranded.len(),
            stranded
                .iter()
                .map(|n| format!("{:016x}", n.seq))
                .collect::<Vec<_>>()
        ));
    }
    let lineage = lsvd_engine::load_lineage(store, meta).await?;
    // An object the map needs that is gone now was deleted after the map was read
    // (GC, once a newer checkpoint no longer needed it): this look is stale.
    let gone =
        |seq: u64, epoch: u64| vanished.contains(&(seq, epoch)) && lineage.owner(seq).is_none();
    let mut live_from_map = std::collections::BTreeMap::<u64, u64>::new();
    for p in st.map().iter() {
        let seq = p.location.object_seq;
        *live_from_map.entry(seq).or_default() += p.sectors * SECTOR_BYTES;
        match st.objects().get(&seq) {
            None => look
                .problems
                .push(format!("lba {} maps to unknown object {seq:016x}", p.lba)),
            Some(o) => {
                let end = p.location.offset + p.sectors * SECTOR_BYTES;
                if p.location.offset < o.header_bytes as u64 || end > o.total_bytes {
                    look.problems
                        .push(format!("lba {} maps outside object {seq:016x}", p.lba));
                }
                if !verified.contains(&(seq, o.epoch))
                    && lineage.owner(seq).is_none()
                    && !gone(seq, o.epoch)
                {
                    look.problems.push(format!(
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
            look.problems.push(format!(
                "object {seq:016x}: live bytes {} but map says {mapped}",
                o.live_bytes
            ));
        }
    }
    look.lines.push(format!(
        "  map: {} extents, {} live in {} objects ({} stored); checkpoint {}",
        st.map().extent_count(),
        format_size(st.live_bytes()),
        st.objects().len(),
        format_size(st.stored_bytes()),
        rec.checkpoint_seq
            .map_or("none".to_string(), |c| format!("{c:016x}"))
    ));
    // Keys of objects in the table must exist (a clone's shared objects are its
    // ancestors', checked with them).
    let shared = st
        .objects()
        .keys()
        .filter(|&&s| lineage.owner(s).is_some())
        .count();
    if shared > 0 {
        look.lines.push(format!(
            "  {shared} objects shared with the volumes this one is a clone of"
        ));
    }
    let mut deleted_since = Vec::new();
    for (&seq, o) in st.objects() {
        if verified.contains(&(seq, o.epoch)) || lineage.owner(seq).is_some() {
            continue;
        }
        let key = object_key(name, seq, o.epoch, o.kind);
        if gone(seq, o.epoch) {
            deleted_since.push(key);
        } else {
            look.problems
                .push(format!("{key}: in the object table but missing or corrupt"));
        }
    }
    if let Some(first) = deleted_since.first() {
        look.changed = Some(format!(
            "{} objects the map needs were deleted after it was read ({first}, ...): a newer checkpoint replaced it",
            deleted_since.len()
        ));
    }
    look.last_record_seq = Some(st.last_record_seq());
    Ok(look)
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
/// A key gone from every copy was deleted since it was listed: nothing to say.
async fn compare_copies(store: &DynStore, key: &str, problems: &mut Vec<String>) {
    let found = match compare_key_copies(&**store, key).await {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return,
        Err(e) => {
            problems.push(format!("{key}: cannot read: {e}"));
            return;
        }
    };
    if found.names.len() > 1
        && found.unreadable.len() == found.names.len()
        && found.unreadable.iter().all(|(_, e)| e.is_not_found())
    {
        return;
    }
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

/// The checks of an object's bytes past its header: the length the header gives, and
/// the data against the header's chunk checksums.
pub(crate) fn verify_object_body(
    h: &ObjectHeader,
    bytes: &[u8],
) -> std::result::Result<(), String> {
    if h.total_bytes() != bytes.len() as u64 {
        return Err(format!(
            "length {} but header says {}",
            bytes.len(),
            h.total_bytes()
        ));
    }
    // Every chunk's checksum, and every compressed chunk opened.
    h.open_whole(bytes).map(drop).map_err(|e| e.to_string())
}

/// Check one copy of object `seq`: Err if it cannot be used (header, length, chunk
/// checksums), else the identity mismatches found (reported, but the data is sound).
fn verify_object(
    bytes: &[u8],
    seq: u64,
    epoch: u64,
    kind: ObjectKind,
    meta: &VolumeMeta,
) -> std::result::Result<Vec<String>, String> {
    let h = decode_object_header(bytes).map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    if h.seq != seq || h.kind != kind || h.volume != meta.volume || h.epoch != epoch {
        notes.push(format!(
            "header says seq {:016x} epoch {} kind {:?} volume {}",
            h.seq, h.epoch, h.kind, h.volume
        ));
    }
    verify_object_body(&h, bytes)?;
    Ok(notes)
}

fn check_log(
    common: &Common,
    name: &str,
    meta: &VolumeMeta,
    keys: Option<&lsvd_store::xts::LocalKeys>,
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
    let file = match lsvd_engine::local_encryption::readable_write_log(
        std::sync::Arc::new(file),
        &sb,
        keys,
        &path,
    ) {
        Ok(f) => f,
        Err(e) => {
            problems.push(e.message);
            return;
        }
    };
    let file = &*file;
    let chain = scan_log(file, &sb);
    let (index, index_problems) =
        lsvd_engine::write::log_index::check_against_chain(file, &sb, &chain);
    if let Some(i) = &index {
        println!(
            "  write-log index: generation {}, {} records",
            i.generation,
            i.records.len()
        );
    }
    problems.extend(index_problems);
    problems.extend(corrupt_records(
        file,
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
