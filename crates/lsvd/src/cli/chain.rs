//! `lsvd chain ...`: offline administration of a store of several local drives
//! (`--store chain:...`; `rebuild` works on `stripe:` too).
//!
//! * `rebuild`: bring the two copies of every mirrored position in step, copying each
//!   file missing or bad in one copy from the good one. Which copy is good is decided
//!   here, with the formats' own checks (object and record CRCs), since the store
//!   knows nothing of them ([`lsvd_store::chain::rebuild`]).
//! * `add-drive`: append a drive position to a chain
//!   ([`lsvd_store::chain::add_drive`]) and print the --store to use from then on.
//!
//! Both take the data directory's lock, like `lsvd delete`: a server using this data
//! directory must be stopped first (one using the same drives from elsewhere is the
//! operator's to stop).

use std::path::PathBuf;

use clap::Subcommand;

use lsvd_core::format::clone_link::decode_clone_link;
use lsvd_core::format::object::decode_object_header;
use lsvd_core::format::replica_status::decode_replica_status;
use lsvd_core::format::snapshot::decode_snapshot;
use lsvd_core::format::volume_meta::decode_volume_meta;
use lsvd_core::format::volume_super::decode_volume_super;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Common;
use super::progress::Progress;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_engine::keys::{parse_object_name, parse_super_name};
use lsvd_store::chain::add_drive::add_drive;
use lsvd_store::chain::drives::{DriveSpec, parse_spec};
use lsvd_store::chain::meta::Layout;
use lsvd_store::chain::rebuild::{Verdict, rebuild};

#[derive(Subcommand, Debug)]
pub enum ChainCommand {
    /// Repair the mirror copies of a chain: every file missing or bad in one copy of a
    /// mirrored drive is copied from the other.
    ///
    /// Run it with every server using the chain stopped, when `lsvd check` reports a
    /// copy missing or failing its checks, after replacing a failed mirror drive with
    /// an empty directory, or after a copy was out of service. For each mirrored
    /// position (`DIR+MIRROR` in --store) it compares every file of the two
    /// directories; a file one copy lacks is copied from the other, and of two copies
    /// that differ the one that passes its checks (object and metadata CRCs) replaces
    /// the one that fails them. It prints each repair, and each file it could not
    /// repair (no good copy; copies that differ with no way to tell which is right),
    /// and exits 0 only if the copies agree afterwards.
    ///
    /// Example: lsvd --store chain:/mnt/d0/lsvd+/mnt/m0/lsvd,/mnt/d1/lsvd+/mnt/m1/lsvd chain rebuild
    #[command(verbatim_doc_comment)]
    Rebuild {
        /// No progress lines (the report is still printed).
        #[arg(long)]
        quiet: bool,
    },
    /// Add a drive at the end of a chain: the chain grows by one position, and client
    /// writes move onto it when the drives before it are full.
    ///
    /// Run it with every server using the chain stopped, when the chain is full or
    /// about to be (the server logs that no drive has room, uploads wait and then
    /// writes do), with --store giving the chain as it is now. DRIVE is an empty
    /// directory (created if missing) on the new drive, or DIR+MIRROR if the chain's
    /// drives are mirrored. It checks the chain as an open does, writes the new
    /// drive's record, then every old drive's (one generation more, one drive more),
    /// and prints the --store to use from now on: the old one is refused, since its
    /// drives say the chain has one more. If it is interrupted, run it again (or open
    /// the chain with the new --store, which finishes it).
    ///
    /// Example: lsvd --store 'chain:/mnt/d0/lsvd,/mnt/d1/lsvd?drive_size=900G' chain add-drive /mnt/d2/lsvd
    ///   prints: chain:/mnt/d0/lsvd,/mnt/d1/lsvd,/mnt/d2/lsvd?drive_size=900G
    #[command(verbatim_doc_comment)]
    AddDrive {
        /// The new drive: an empty directory, or DIR+MIRROR on a mirrored chain.
        drive: String,
    },
}

pub async fn run(common: &Common, command: ChainCommand) -> Result<()> {
    match command {
        ChainCommand::Rebuild { quiet } => rebuild_command(common, quiet).await,
        ChainCommand::AddDrive { drive } => add_drive_command(common, &drive).await,
    }
}

async fn add_drive_command(common: &Common, drive: &str) -> Result<()> {
    let _lock = super::serve::lock_for_offline(common, "add a drive")?;
    if common.store.starts_with("stripe:") {
        return Err(Error::bad_input(
            "a stripe places every key by a hash of its drive count: drives cannot be added \
             (copy the volumes into a new stripe with `lsvd replicate`)",
        ));
    }
    let (_, spec) = drive_store(&common.store, false)?;
    let copies: Vec<PathBuf> = drive.split('+').map(PathBuf::from).collect();
    if drive.contains([',', '?'])
        || copies.len() > 2
        || copies.iter().any(|c| c.as_os_str().is_empty())
    {
        return Err(Error::bad_input(format!(
            "drive '{drive}': give DIR, or DIR+MIRROR (directory names cannot hold , + or ?)"
        )));
    }
    let added = tokio::task::spawn_blocking(move || add_drive(&spec, &copies))
        .await
        .map_err(|e| Error::with_source(ErrorKind::Transient, "add-drive task failed", e))??;
    let (list, options) = match common.store.split_once('?') {
        Some((list, options)) => (list, format!("?{options}")),
        None => (common.store.as_str(), String::new()),
    };
    println!(
        "added drive {} ({drive}){}: {} drives now, generation {}",
        added.position,
        if added.resumed {
            " (finishing an add that was interrupted)"
        } else {
            ""
        },
        added.record.drive_count,
        added.record.generation
    );
    println!("from now on give this --store (the old one is refused):");
    println!("{list},{drive}{options}");
    Ok(())
}

/// The layout and drives of `--store`, which must be `chain:` (or, where `stripe_too`,
/// `stripe:`).
fn drive_store(url: &str, stripe_too: bool) -> Result<(Layout, DriveSpec)> {
    if let Some(spec) = url.strip_prefix("chain:") {
        return Ok((Layout::Chain, parse_spec("chain", spec)?));
    }
    if stripe_too && let Some(spec) = url.strip_prefix("stripe:") {
        return Ok((Layout::Stripe, parse_spec("stripe", spec)?));
    }
    Err(Error::bad_input(format!(
        "--store {url}: not a chain of drives (give --store chain:DIR0[+MIRROR0],DIR1[+MIRROR1],...)"
    )))
}

async fn rebuild_command(common: &Common, quiet: bool) -> Result<()> {
    let _lock = super::serve::lock_for_offline(common, "rebuild the chain's copies")?;
    let (layout, spec) = drive_store(&common.store, true)?;
    if spec.dirs.iter().all(|copies| copies.len() < 2) {
        println!(
            "{}: no drive is mirrored (DIR+MIRROR): nothing to rebuild",
            common.store
        );
        return Ok(());
    }
    // Progress: the bytes of every file compared so far (the total is not known up
    // front: the copies are listed a drive at a time).
    let compared = Arc::new(AtomicU64::new(0));
    let ticker = {
        let compared = compared.clone();
        let mut shown = Progress::new("chain rebuild", 0, quiet);
        tokio::spawn(async move {
            use lsvd_store::clock::{Clock, SystemClock};
            let clock = SystemClock::new();
            loop {
                clock.sleep(std::time::Duration::from_millis(200)).await;
                shown.update(compared.load(Ordering::Relaxed));
            }
        })
    };
    let counted = compared.clone();
    let verify = move |key: &str, bytes: &[u8]| {
        counted.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        verify_key(key, bytes)
    };
    let report = tokio::task::spawn_blocking(move || rebuild(&spec, layout, &verify))
        .await
        .map_err(|e| Error::with_source(ErrorKind::Transient, "rebuild task failed", e));
    ticker.abort();
    Progress::new("", 0, quiet).clear();
    let report = report??;
    for line in &report.repaired {
        println!("repaired: {line}");
    }
    for line in &report.unresolved {
        println!("problem: {line}");
    }
    println!(
        "{} mirrored drives, {} files compared, {} repaired, {} left as they were",
        report.positions,
        report.keys,
        report.repaired.len(),
        report.unresolved.len()
    );
    if report.unresolved.is_empty() {
        println!("ok: the copies of every mirrored drive agree");
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "{} files could not be repaired (listed above)",
                report.unresolved.len()
            ),
        ))
    }
}

/// Does this copy of `key` pass the checks of the key's format? Objects: header,
/// length, name and chunk CRCs; volume metadata, superblocks, snapshot records,
/// clone links, replica status: their decoders (magic, version, CRC32C).
fn verify_key(key: &str, bytes: &[u8]) -> Verdict {
    let verdict = |r: std::result::Result<(), String>| match r {
        Ok(()) => Verdict::Good,
        Err(why) => Verdict::Bad(why),
    };
    if let Some(n) = parse_object_name(key) {
        return verdict((|| {
            let h = decode_object_header(bytes).map_err(|e| e.to_string())?;
            if h.seq != n.seq || h.kind != n.kind || h.epoch != n.epoch {
                return Err(format!(
                    "header says seq {:016x} epoch {} kind {:?}",
                    h.seq, h.epoch, h.kind
                ));
            }
            super::check::verify_object_body(&h, bytes)
        })());
    }
    let Some((_volume, rest)) = key.split_once('/') else {
        return Verdict::Unknown;
    };
    let checked = if rest == "meta" {
        decode_volume_meta(bytes).map(|_| ())
    } else if parse_super_name(key).is_some() {
        decode_volume_super(bytes).map(|_| ())
    } else if rest.starts_with("snap/") {
        decode_snapshot(bytes).map(|_| ())
    } else if rest == "parent" || rest.starts_with("clones/") {
        decode_clone_link(bytes).map(|_| ())
    } else if rest == "replica-of" || rest.starts_with("replicas/") {
        decode_replica_status(bytes).map(|_| ())
    } else {
        return Verdict::Unknown;
    };
    verdict(checked.map_err(|e| e.to_string()))
}
