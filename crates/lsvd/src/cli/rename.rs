//! `lsvd rename OLD NEW`: the store side is `lsvd_engine::rename_volume` (a copy under the
//! new name, then the old name deleted, safe to run again after an interruption); this
//! adds the local side: no server may use the data directory, a volume whose server
//! stopped without a clean shutdown is recovered from its write log here first, and
//! the old name's files in the data directory (write log, read cache; everything in
//! them is in the store once the volume stopped cleanly) are removed.

use super::Common;
use lsvd_core::error::Result;
use lsvd_core::size::format_size;

pub async fn rename(common: &Common, old: &str, new: &str) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(old)?;
    lsvd_engine::keys::validate_volume_name(new)?;
    let lock = || super::serve::lock_for_offline(common, &format!("rename '{old}'"));
    // Held until the old name's local files are gone.
    let mut held = lock()?;
    let store = super::admin::store(common)?;
    let meta = lsvd_engine::read_meta(&store, old).await?;
    let clean = lsvd_engine::newest_volume_super(&store, &meta)
        .await?
        .is_none_or(|sb| sb.clean);
    if !clean && common.data.join(format!("{old}.wlog")).exists() {
        // Its server stopped without a clean shutdown, on this host: replay its write
        // log, upload it and stop cleanly, as `lsvd serve` would.
        drop(held.take());
        super::snapshot::with_volume(common, old, async |_| Ok(())).await?;
        held = lock()?;
    }
    let renamed = lsvd_engine::rename_volume(&store, old, new).await?;
    for f in super::delete::local_files(common, old) {
        std::fs::remove_file(&f).map_err(|e| {
            lsvd_core::error::Error::local_io(format!("cannot remove {}", f.display()), e)
        })?;
    }
    drop(held);
    println!(
        "renamed volume {old} to {new} in {} ({} keys, {} copied{}); serve it with `lsvd serve {new}`",
        store.describe(),
        renamed.keys_copied + renamed.keys_found,
        format_size(renamed.bytes_copied),
        if renamed.keys_found > 0 {
            format!(", {} found from an interrupted rename", renamed.keys_found)
        } else {
            String::new()
        }
    );
    Ok(())
}
