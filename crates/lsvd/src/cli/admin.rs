//! `lsvd create`, `lsvd list`, `lsvd info`, `lsvd sync`, `lsvd selftest`, and the two
//! ways commands open the store.
//!
//! The read-only commands (`info`, `list`, `check`, `inspect`, `snapshot list`) open it
//! with [`store_read_only`]: they take no lock and may run beside a live server, so
//! they change nothing (no mirror resync, repair or delete, issue 40) and read a volume
//! being changed from a fresh listing when a key vanishes under them
//! (`lsvd_engine::look_again`, issue 41).

use super::Common;
use lsvd_core::compression::Compression;
use lsvd_core::error::{Error, Result};
use lsvd_core::size::{format_size, parse_size};
use lsvd_engine::recovery::store_recovery::{is_vanished, vanished};
use lsvd_store::DynStore;

/// The store for `serve` and the commands that change it (those that may do the
/// store's upkeep, such as a chain's mirror resync, hold the data directory's lock).
pub(super) fn store(common: &Common) -> Result<DynStore> {
    common.open_store()
}

/// The store for a read-only command: nothing in it changes
/// ([`lsvd_store::OpenMode::ReadOnly`]).
pub(super) fn store_read_only(common: &Common) -> Result<DynStore> {
    common.open_store_read_only()
}

/// The store through which volume `name`'s objects read and write in the clear: the
/// store itself for a plain volume, for an encrypted one the store unlocked with the
/// key file (`--key-file` or `LSVD_KEY_FILE`); `Denied` without it or with a wrong
/// one. Called before anything is written.
pub(super) async fn unlocked(common: &Common, store: &DynStore, name: &str) -> Result<DynStore> {
    let (volume, _) = lsvd_engine::split_export_name(name);
    lsvd_engine::unlock_volume(store, volume, common.user_key()?.as_ref()).await
}

/// The keys of volume `name`'s local files (`--encrypt-local`), for an encrypted
/// volume given its key file; None otherwise.
pub(super) async fn local_keys(
    common: &Common,
    store: &DynStore,
    name: &str,
) -> Result<Option<std::sync::Arc<lsvd_store::xts::LocalKeys>>> {
    let (volume, _) = lsvd_engine::split_export_name(name);
    lsvd_engine::local_keys(store, volume, common.user_key()?.as_ref()).await
}

/// `lsvd selftest`: run the store self-test and say how it went.
pub async fn selftest(common: &Common) -> Result<()> {
    let store = store(common)?;
    let report =
        lsvd_store::selftest::run_with(&*store, common.file.selftest_race_writers().max(2)).await?;
    println!("{report}");
    Ok(())
}

/// `lsvd sync NAME`: ask the server on this data directory to put everything `NAME`
/// acknowledged into the store.
pub async fn sync(common: &Common, name: &str) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(name)?;
    let request = crate::control::Request::Sync {
        volume: name.to_string(),
    };
    let Some(reply) = crate::control::request(&common.data, &request).await? else {
        return Err(Error::new(
            lsvd_core::error::ErrorKind::NotFound,
            format!(
                "no lsvd serve uses {} (a volume stopped cleanly has everything in the \
                 store already; after a crash, `lsvd serve {name}` uploads what its write \
                 log held, and a clean stop finishes)",
                common.data.display()
            ),
        ));
    };
    match (reply.ok, reply.records_through) {
        (true, Some(through)) => {
            println!(
                "{name}: every write acknowledged before this command is in the store \
                 (write-log records through {through})"
            );
            Ok(())
        }
        _ => Err(reply.into_error()),
    }
}

pub async fn create(
    common: &Common,
    name: &str,
    size: &str,
    compression: Option<Compression>,
    encrypt: bool,
) -> Result<()> {
    let size_bytes = parse_size(size)?;
    if size_bytes == 0 || size_bytes % 4096 != 0 {
        return Err(Error::bad_input(format!(
            "--size {size}: must be a positive multiple of 4K"
        )));
    }
    let user_key = match (encrypt, common.user_key()?) {
        (true, None) => {
            return Err(Error::bad_input(
                "--encrypt needs the key that will unlock the volume: --key-file PATH (or \
                 LSVD_KEY_FILE); make one with: head -c 32 /dev/urandom > vol.key",
            ));
        }
        (true, key) => key,
        (false, _) => None,
    };
    let store = store(common)?;
    let meta = lsvd_engine::create_volume_with(&store, name, size_bytes, user_key.as_ref()).await?;
    // After the metadata: settings written first could land on a volume of the same
    // name that another create made meanwhile.
    let compressed = match compression {
        Some(c) if !c.is_none() => {
            lsvd_engine::set_compression(&store, &meta, c).await?;
            format!(", compressed with {c}")
        }
        _ => String::new(),
    };
    let encrypted = match &user_key {
        Some(k) => format!(", encrypted (unlocked by {})", k.source()),
        None => String::new(),
    };
    println!(
        "created volume {name}: {} (id {}) in {}{compressed}{encrypted}",
        format_size(size_bytes),
        meta.volume,
        store.describe()
    );
    Ok(())
}

/// `lsvd key rotate NAME --new-key-file NEW` (the current key from `--key-file`).
pub async fn rotate_key(common: &Common, name: &str, new_key_file: &std::path::Path) -> Result<()> {
    let Some(old) = common.user_key()? else {
        return Err(Error::bad_input(format!(
            "lsvd key rotate {name}: give the current key with --key-file (or LSVD_KEY_FILE)"
        )));
    };
    let new = lsvd_store::sealed::UserKey::from_file(new_key_file)?;
    let store = store(common)?;
    lsvd_engine::rotate_key(&store, name, &old, &new).await?;
    println!(
        "{name}: now unlocked by {} (no longer by {}); clones of it keep their own key",
        new.source(),
        old.source()
    );
    Ok(())
}

/// `lsvd config NAME [--compression C]`: change the settings given, then print them.
pub async fn config(common: &Common, name: &str, compression: Option<Compression>) -> Result<()> {
    let store = store(common)?;
    let meta = lsvd_engine::read_meta(&store, name).await?;
    let changed = compression.is_some();
    let settings = match compression {
        Some(c) => Some(lsvd_engine::set_compression(&store, &meta, c).await?),
        None => lsvd_engine::read_settings(&store, &meta).await?,
    };
    let compression = settings.map_or_else(Compression::default, |s| s.compression);
    println!("{name}: compression {compression}");
    if changed {
        println!(
            "  (objects written from the next time a server opens {name} on; stored objects stay as they are)"
        );
    }
    Ok(())
}

pub async fn list(common: &Common) -> Result<()> {
    let store = store_read_only(common)?;
    let lines = lsvd_engine::look_again("lsvd list", async || list_lines(&store).await).await?;
    if lines.is_empty() {
        eprintln!(
            "no volumes in {} (create one with: lsvd create NAME --size 20G)",
            store.describe()
        );
    }
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// One look at the store for `lsvd list`: a line per volume, then one per name with
/// keys but no metadata. A volume deleted or changed under the look is an error
/// [`is_vanished`] recognizes (look again).
async fn list_lines(store: &DynStore) -> Result<Vec<String>> {
    let (names, leftovers) = lsvd_engine::list_volumes_and_leftovers(store).await?;
    let finish = |name: &str| format!("finish with: lsvd delete {name} --yes");
    let mut lines = Vec::new();
    for name in names {
        match lsvd_engine::read_meta(store, &name).await {
            Ok(meta) => match lsvd_engine::is_being_deleted(store, &meta).await {
                Ok(true) => lines.push(format!(
                    "{name}\t{}\t(being deleted: {})",
                    format_size(meta.size_bytes),
                    finish(&name)
                )),
                _ => {
                    // The size now (`lsvd resize`); the creation size if the store
                    // cannot be read back right now.
                    let size = match lsvd_engine::current_size_bytes(store, &meta).await {
                        Ok(size) => size,
                        Err(e) if is_vanished(&e) => return Err(e),
                        Err(_) => meta.size_bytes,
                    };
                    lines.push(format!(
                        "{name}\t{}{}",
                        format_size(size),
                        relations(store, &name).await
                    ));
                }
            },
            // Listed a moment ago: deleted (or being renamed) under the look.
            Err(e) if e.is_not_found() => return Err(vanished(e)),
            Err(e) => lines.push(format!("{name}\t(unreadable: {e})")),
        }
    }
    for name in leftovers {
        lines.push(format!(
            "{name}\t-\t(keys but no volume metadata: remove with lsvd delete {name} --yes)"
        ));
    }
    Ok(lines)
}

/// What `lsvd list` says of a volume's place among clones: the snapshot it was made
/// from, the clones made from it (empty for neither; unreadable links are skipped:
/// `lsvd info` reports them).
async fn relations(store: &DynStore, name: &str) -> String {
    let mut out = String::new();
    if let Ok(Some(link)) = lsvd_engine::lifecycle::lineage::parent_link(store, name).await {
        out.push_str(&format!("\tclone of {}@{}", link.parent, link.snapshot));
    }
    if let Ok(clones) = lsvd_engine::list_clones(store, name).await
        && !clones.is_empty()
    {
        let names: Vec<String> = clones
            .iter()
            .map(|l| format!("{} (@{})", l.clone, l.snapshot))
            .collect();
        out.push_str(&format!("\tclones: {}", names.join(", ")));
    }
    out
}

pub async fn info(
    common: &Common,
    name: &str,
    json: bool,
    tuning: &super::TuningArgs,
) -> Result<()> {
    let store = unlocked(common, &store_read_only(common)?, name).await?;
    let info = lsvd_engine::inspect_volume(&store, name).await?;
    let resolved =
        super::tuning::resolve_tuning(common, tuning, super::tuning::ProfileUse::LoadOnly)?;
    if json {
        let mut value = serde_json::to_value(&info).map_err(|e| {
            Error::with_source(
                lsvd_core::error::ErrorKind::Unsupported,
                "cannot encode JSON",
                e,
            )
        })?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "settings".into(),
                serde_json::json!({
                    "tuning": resolved.tuning,
                    "probe_profile": resolved.device_profile,
                    "store_profile": resolved.store_profile,
                }),
            );
        }
        return crate::json_out::print_json(&value);
    }
    println!("volume:        {}", info.name);
    println!("id:            {}", info.volume_id);
    println!(
        "size:          {} ({} bytes)",
        format_size(info.size_bytes),
        info.size_bytes
    );
    println!("live data:     {}", format_size(info.live_bytes));
    println!(
        "store data:    {} ({} as stored)",
        format_size(info.store_bytes),
        format_size(info.store_listed_bytes)
    );
    println!("compression:   {}", info.compression);
    println!(
        "encryption:    {}",
        match info.encrypted {
            true => "AES-256-GCM (objects sealed; data key wrapped in the key record)",
            false => "none",
        }
    );
    println!("utilization:   {:.1}%", info.utilization * 100.0);
    println!("objects:       {}", info.objects);
    println!("map extents:   {}", info.map_extents);
    match info.checkpoint_seq {
        Some(c) => println!(
            "checkpoint:    {c:016x}{}",
            if info.closed_cleanly {
                " (closed cleanly)"
            } else {
                ""
            }
        ),
        None => println!("checkpoint:    none"),
    }
    println!("next object:   {:016x}", info.next_object_seq);
    println!(
        "written:       {} by clients, {} to the store (write amplification {:.2}; as of the checkpoint)",
        format_size(info.client_write_bytes),
        format_size(info.store_write_bytes),
        info.write_amplification
    );
    println!(
        "gc:            {} passes, {} moved",
        info.gc_passes,
        format_size(info.gc_moved_bytes)
    );
    if let Some(heat) = &info.heat {
        println!(
            "gc hylog:      {} moved as hot, {} as cold",
            format_size(info.gc_hot_moved_bytes),
            format_size(info.gc_cold_moved_bytes)
        );
        let now = if heat.hot_fraction > 0.0 {
            format!(
                "a GC pass now would treat {:.1}% of the written data as hot ({:.1}% of the writes)",
                heat.hot_fraction * 100.0,
                heat.hot_write_share * 100.0
            )
        } else {
            "a GC pass now would not separate hot from cold".to_string()
        };
        println!(
            "heat:          {} regions of {} written; {now}",
            heat.regions_written,
            format_size(heat.region_bytes)
        );
    }
    if !info.snapshots.is_empty() {
        println!(
            "snapshots:     {} (serve one read-only as {}@NAME)",
            info.snapshots.join(", "),
            info.name
        );
    }
    if let Some(parent) = &info.parent {
        println!("clone of:      {parent}");
    }
    if !info.clones.is_empty() {
        println!("clones:        {}", info.clones.join(", "));
    }
    let now_ms = lsvd_store::clock::unix_ms_now();
    if let Some(r) = &info.replica_of {
        println!(
            "replica of:    {} as it was {:.0} s ago (the last pass ended {:.0} s ago); \
             serving this copy ends replication into it",
            r.peer,
            now_ms.saturating_sub(r.current_as_of_unix_ms) as f64 / 1000.0,
            now_ms.saturating_sub(r.updated_unix_ms) as f64 / 1000.0
        );
    }
    for r in &info.replicas {
        println!(
            "replica:       {}: holds the volume as of {:.0} s ago ({} objects behind now; \
             its last pass copied {} objects and ended {:.0} s ago)",
            r.peer,
            now_ms.saturating_sub(r.current_as_of_unix_ms) as f64 / 1000.0,
            r.objects_behind_now,
            r.lag_objects,
            now_ms.saturating_sub(r.updated_unix_ms) as f64 / 1000.0
        );
    }
    let store_metrics = store.metrics();
    if !store_metrics.is_empty() {
        let shown: Vec<String> = store_metrics
            .iter()
            .map(|m| format!("{} {}", m.name, m.value))
            .collect();
        println!("store:         {}", shown.join(", "));
    }
    if let Some(m) = store_metrics
        .iter()
        .find(|m| m.name == "degraded_positions" && m.value > 0.0)
    {
        println!(
            "degraded:      {} mirrored drive positions serve from one copy; the next start rebuilds the other",
            m.value
        );
    }
    if !info.stranded_objects.is_empty() {
        println!(
            "stranded:      {} objects past a gap (removed at next open)",
            info.stranded_objects.len()
        );
    }
    println!(
        "settings of `lsvd serve` on {} (flag > config > probe profile > default):",
        common.data.display()
    );
    for (setting, value, origin) in resolved.tuning.rows() {
        println!("  {setting:<21} {value:>10}  ({origin})");
    }
    println!("  probe profile:  {}", resolved.device_profile);
    println!("  store profile:  {}", resolved.store_profile);
    Ok(())
}
