//! The log side of opening a volume, decided before anything is written: which
//! session the write log on disk belongs to, and what to replay, keep or bridge of
//! the record chain found (`lsvd_core::recovery::plan_log_recovery` decides; this
//! gathers its input and turns its answer into positions in the log).

use std::path::Path;

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, CacheSuper};
use lsvd_core::recovery::{LogRecoveryInput, LogRecoveryRefusal, SeqRange, plan_log_recovery};

use crate::cache_layout::CacheLayout;
use crate::config::RecoveryMode;
use crate::recovery::log_scan::FoundRecord;
use lsvd_core::error::{Error, ErrorKind, Result};

/// The session of the write log at `path` (its index epoch: the session id it
/// claimed the volume with), if the file exists and holds `meta`'s log. Read before
/// anything is made, so a process refused the volume leaves no file behind.
pub(crate) fn log_session_of(
    path: &Path,
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
) -> Option<CacheSuper> {
    use lsvd_core::format::cache_super::newest_cache_super;
    use std::io::Read;
    let mut head = vec![0u8; 2 * CACHE_SUPER_BYTES];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    let (a, b) = head.split_at(CACHE_SUPER_BYTES);
    newest_cache_super(a, b)
        .ok()
        .filter(|sb| sb.volume == meta.volume)
}

/// What the log side of recovery decided.
pub(crate) struct LogPlan {
    /// Records the store lacks, in order.
    pub(crate) replay: Vec<FoundRecord>,
    /// Records the store holds, in order, before `replay`: the log keeps them.
    pub(crate) keep: Vec<FoundRecord>,
    /// Records dropped past a gap (accept-prefix): an empty object covers them.
    pub(crate) bridge_through: Option<u64>,
    pub(crate) next_record_seq: u64,
    /// CRC of the newest valid record (the next record chains to it).
    pub(crate) last_record_crc: u32,
    /// Where appends continue.
    pub(crate) head: u64,
}

/// Decide what to do with the record chain found, given what the store holds
/// (`lsvd_core::recovery::plan_log_recovery`), and where appends continue.
pub(crate) fn plan_log(
    chain: Vec<FoundRecord>,
    existing: Option<&CacheSuper>,
    layout: &CacheLayout,
    last_in_store: u64,
    store_last_written_by_this_log: bool,
    mode: RecoveryMode,
) -> Result<LogPlan> {
    let input = LogRecoveryInput {
        cache_tail_seq: existing.map(|sb| sb.tail_seq),
        chain: match (chain.first(), chain.last()) {
            (Some(first), Some(last)) => SeqRange::new(first.header.seq, last.header.seq),
            _ => None,
        },
        store_last_record_seq: last_in_store,
        store_last_written_by_this_log,
        mode,
    };
    let plan = plan_log_recovery(&input).map_err(|refusal| match refusal {
        // 2^64 records cannot have been written: the numbers come from damaged bytes.
        LogRecoveryRefusal::SequenceNumbersExhausted { .. } => {
            Error::new(ErrorKind::Corrupt, refusal.to_string())
        }
        _ => Error::new(
            ErrorKind::DataLoss,
            format!(
                "{refusal}. Start with --recovery-mode accept-prefix to continue from what the store has"
            ),
        ),
    })?;
    for w in &plan.warnings {
        lsvd_store::log::warn(&format!("{w} (--recovery-mode accept-prefix)"));
    }
    // The newest valid record: appends continue after it, chained to its CRC.
    let (last_record_crc, head) = match (chain.last(), existing) {
        (Some(r), _) => {
            let end = r.offset + r.header.total_bytes();
            let head = if end >= layout.log_end {
                layout.log_start
            } else {
                end
            };
            (r.header.crc, head)
        }
        (None, Some(sb)) => (0, sb.tail_offset),
        (None, None) => (0, layout.log_start),
    };
    let in_range = |range: Option<SeqRange>, r: &FoundRecord| {
        range.is_some_and(|range| range.contains(r.header.seq))
    };
    let (keep, rest): (Vec<_>, Vec<_>) = chain.into_iter().partition(|r| in_range(plan.keep, r));
    let replay = rest
        .into_iter()
        .filter(|r| in_range(plan.replay, r))
        .collect();
    Ok(LogPlan {
        replay,
        keep,
        bridge_through: plan.bridge_through,
        next_record_seq: plan.next_record_seq,
        last_record_crc,
        head,
    })
}
