//! `lsvd snapshot create|list|delete`, `lsvd clone` and `lsvd resize`.
//!
//! Create and delete go to the `lsvd serve` that uses this data directory when there
//! is one (only it knows what its write log holds, and its GC must learn of the
//! change); otherwise the command opens the volume itself for the moment it takes
//! (recovery, the operation, a clean stop), exactly as a server would. List only
//! reads the store.

use std::path::Path;

use clap::Subcommand;

use super::Common;
use crate::control::{Reply, Request};
use lsvd_core::error::{Error, Result};
use lsvd_core::size::format_size;
use lsvd_engine::EngineConfig;

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Take a snapshot: it holds every write acknowledged before the command, and reads
    /// back unchanged however the volume is written afterwards (`lsvd serve VOL@SNAP`
    /// serves it read-only). GC keeps the objects it needs until it is deleted.
    Create {
        /// The volume.
        volume: String,
        /// The snapshot's name: 1-64 characters of A-Z a-z 0-9 . _ -
        snapshot: String,
    },
    /// List a volume's snapshots, oldest first.
    List {
        volume: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot and the objects only it kept.
    Delete { volume: String, snapshot: String },
}

pub async fn run(common: &Common, command: SnapshotCommand) -> Result<()> {
    match command {
        SnapshotCommand::Create { volume, snapshot } => create(common, &volume, &snapshot).await,
        SnapshotCommand::List { volume, json } => list(common, &volume, json).await,
        SnapshotCommand::Delete { volume, snapshot } => delete(common, &volume, &snapshot).await,
    }
}

async fn create(common: &Common, volume: &str, snapshot: &str) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(volume)?;
    lsvd_engine::validate_snapshot_name(snapshot)?;
    let request = Request::SnapshotCreate {
        volume: volume.to_string(),
        snapshot: snapshot.to_string(),
    };
    let through = match ask_server(&common.data, &request).await? {
        Some(reply) => reply.through_seq.unwrap_or(0),
        None => {
            with_volume(common, volume, async |v| {
                Ok(v.create_snapshot(snapshot).await?.through_seq)
            })
            .await?
        }
    };
    println!(
        "created snapshot {volume}@{snapshot} (objects below {through:016x}); serve it read-only with `lsvd serve {volume}@{snapshot}`"
    );
    Ok(())
}

async fn delete(common: &Common, volume: &str, snapshot: &str) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(volume)?;
    lsvd_engine::validate_snapshot_name(snapshot)?;
    let request = Request::SnapshotDelete {
        volume: volume.to_string(),
        snapshot: snapshot.to_string(),
    };
    let deleted = match ask_server(&common.data, &request).await? {
        Some(reply) => reply.objects_deleted.unwrap_or(0),
        None => with_volume(common, volume, async |v| v.delete_snapshot(snapshot).await).await?,
    };
    println!("deleted snapshot {volume}@{snapshot} ({deleted} objects only it kept deleted)");
    Ok(())
}

/// `lsvd resize VOL --size NEW [--allow-shrink]`: through the server when there is
/// one (it owns the volume's write log and its NBD size), else by opening the volume.
pub async fn resize(common: &Common, volume: &str, size: &str, allow_shrink: bool) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(volume)?;
    let size_bytes = lsvd_core::size::parse_size(size)?;
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) {
        return Err(Error::bad_input(format!(
            "--size {size}: must be a positive multiple of 4K"
        )));
    }
    let request = Request::Resize {
        volume: volume.to_string(),
        size_bytes,
        allow_shrink,
    };
    let old = match ask_server(&common.data, &request).await? {
        Some(reply) => reply.old_size_bytes.unwrap_or(size_bytes),
        None => {
            with_volume(common, volume, async |v| {
                Ok(v.resize(size_bytes, allow_shrink).await?.old_size_bytes)
            })
            .await?
        }
    };
    let (from, to) = (format_size(old), format_size(size_bytes));
    if old == size_bytes {
        println!("volume {volume} is already {to}");
    } else {
        println!("resized volume {volume} from {from} to {to}");
    }
    Ok(())
}

/// `lsvd clone VOL@SNAP NEW`: only the store is involved (the snapshot's objects are
/// there already), so no server is asked.
pub async fn clone(common: &Common, source: &str, name: &str) -> Result<()> {
    let (volume, Some(snapshot)) = lsvd_engine::split_export_name(source) else {
        return Err(Error::bad_input(format!(
            "'{source}': clone a snapshot, VOL@SNAP (lsvd snapshot create VOL SNAP makes one)"
        )));
    };
    let store = super::admin::store(common)?;
    let store = super::admin::unlocked(common, &store, volume).await?;
    let meta = lsvd_engine::create_clone(&store, volume, snapshot, name).await?;
    // The clone compresses as its base does (changed with `lsvd config` like any volume).
    let base = lsvd_engine::read_meta(&store, volume).await?;
    let compressed = match lsvd_engine::read_settings(&store, &base).await? {
        Some(s) if !s.compression.is_none() => {
            lsvd_engine::set_compression(&store, &meta, s.compression).await?;
            format!(", compressed with {} as {volume} is", s.compression)
        }
        _ => String::new(),
    };
    println!(
        "created volume {name}: a writable clone of {volume}@{snapshot} (id {}{compressed}); serve it with `lsvd serve {name}`",
        meta.volume
    );
    Ok(())
}

async fn list(common: &Common, volume: &str, json: bool) -> Result<()> {
    let store = super::admin::store_read_only(common)?;
    let meta = lsvd_engine::read_meta(&store, volume).await?;
    let snapshots = lsvd_engine::list_snapshots(&store, &meta).await?;
    if json {
        let rows: Vec<serde_json::Value> = snapshots
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "export": format!("{volume}@{}", s.name),
                    "created_unix_ms": s.created_unix_ms,
                    "base_checkpoint": s.base_checkpoint,
                    "through_seq": s.through_seq,
                    "last_record_seq": s.last_record_seq,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| Error::bad_input(e.to_string()))?
        );
        return Ok(());
    }
    if snapshots.is_empty() {
        println!("volume {volume} has no snapshots");
        return Ok(());
    }
    println!(
        "{:<24} {:<26} {:>18}",
        "SNAPSHOT", "CREATED (UTC)", "OBJECTS BELOW"
    );
    for s in &snapshots {
        println!(
            "{:<24} {:<26} {:>18}",
            s.name,
            utc(s.created_unix_ms),
            format!("{:016x}", s.through_seq)
        );
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` for milliseconds since the Unix epoch.
fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The server's answer, or None when no server uses `data`. A refusal is an error of
/// the kind the server gave.
async fn ask_server(data: &Path, request: &Request) -> Result<Option<Reply>> {
    match crate::control::request(data, request).await? {
        None => Ok(None),
        Some(reply) if reply.ok => Ok(Some(reply)),
        Some(reply) => Err(reply.into_error()),
    }
}

/// Open `volume` on this data directory (no server uses it), run `f`, stop cleanly.
/// A write log made only for this is removed again.
pub(super) async fn with_volume<T>(
    common: &Common,
    volume: &str,
    f: impl AsyncFnOnce(&lsvd_engine::Volume) -> Result<T>,
) -> Result<T> {
    let _lock = super::serve::lock_data_dir(&common.data)?;
    let store = super::admin::store(common)?;
    let store = super::admin::unlocked(common, &store, volume).await?;
    let log_path = common.data.join(format!("{volume}.wlog"));
    // Opening the volume claims it: a server elsewhere would be fenced out. A volume
    // not stopped cleanly, whose write log is not here, is served (or was last served)
    // on another host: the command belongs there.
    let meta = lsvd_engine::read_meta(&store, volume).await?;
    let newest = lsvd_engine::newest_volume_super(&store, &meta).await?;
    if newest.as_ref().is_some_and(|sb| !sb.clean) && !log_path.exists() {
        return Err(Error::new(
            lsvd_core::error::ErrorKind::Conflict,
            format!(
                "volume '{volume}' is served by another lsvd (or its server stopped without \
                 a clean shutdown) and its write log is not in {}: run this command on the \
                 host that serves it, with that server's --data",
                common.data.display()
            ),
        ));
    }
    let config = EngineConfig {
        // No write log here yet: nothing to upload, a small one will do.
        log_size_bytes: if log_path.exists() {
            EngineConfig::default().log_size_bytes
        } else {
            lsvd_engine::MIN_LOG_SIZE_BYTES
        },
        read_cache_bytes: 0,
        // Never from under a live server: one that renews its lease is refused.
        lease: lsvd_engine::fencing::lease::LeaseConfig::for_command("lsvd command"),
        // A write log encrypted by `serve --encrypt-local` is read and kept so.
        local_keys: super::admin::local_keys(common, &store, volume).await?,
        ..EngineConfig::default()
    };
    let (vol, report) = lsvd_engine::open_volume(store, volume, &common.data, config).await?;
    let result = f(&vol).await;
    let closed = vol.shutdown().await;
    if report.cache_created && closed.is_ok() {
        let _ = std::fs::remove_file(&log_path);
    }
    let out = result?;
    closed?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(super::utc(1_795_000_000_000), "2026-11-18 11:06:40");
    }
}
