//! `lsvd delete`: remove a volume from the store and its files from the data directory.
//!
//! Deleting is for good, so it asks for `--yes` and first says what goes. The store
//! side (fencing a server that still holds the volume, finishing an interrupted
//! delete) is `lsvd_engine::delete_volume`; this adds the local side: the data directory's
//! lock (a server using it must be stopped first) and the volume's cache files.

use std::io::IsTerminal;
use std::path::PathBuf;

use super::Common;
use lsvd_core::error::{Error, Result};
use lsvd_core::size::format_size;

/// The volume's files in the data directory (write log, read cache).
pub(super) fn local_files(common: &Common, name: &str) -> Vec<PathBuf> {
    ["wlog", "rcache", "rcache.slots", "rcache.map"]
        .iter()
        .map(|ext| common.data.join(format!("{name}.{ext}")))
        .filter(|p| p.exists())
        .collect()
}

pub async fn delete(common: &Common, name: &str, yes: bool) -> Result<()> {
    // A server on this data directory holds its lock (and may hold the volume).
    let _lock = super::serve::lock_for_offline(common, &format!("delete '{name}'"))?;
    let store = common.open_store()?;
    let plan = lsvd_engine::plan_delete(&store, name).await?;
    let files = local_files(common, name);
    let what = format!(
        "volume '{name}' in {}: {} store key{}, {}{}{}",
        store.describe(),
        plan.keys.len(),
        if plan.keys.len() == 1 { "" } else { "s" },
        format_size(plan.bytes),
        if plan.resuming {
            " (an earlier delete was interrupted)"
        } else {
            ""
        },
        if files.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
            format!("; local files {}", names.join(", "))
        }
    );
    if !yes {
        return Err(Error::bad_input(format!(
            "this deletes {what}, for good (a server elsewhere that still serves it stops \
             at its next upload); run again with --yes to delete"
        )));
    }
    let on_terminal = std::io::stderr().is_terminal();
    let progress = move |done: usize, total: usize| {
        if on_terminal {
            eprint!("\rdeleting: {done}/{total} keys");
        }
    };
    lsvd_engine::delete_volume(&store, &plan, &progress).await?;
    if on_terminal {
        eprintln!();
    }
    for f in &files {
        std::fs::remove_file(f)
            .map_err(|e| Error::local_io(format!("cannot remove {}", f.display()), e))?;
    }
    println!("deleted {what}");
    Ok(())
}
