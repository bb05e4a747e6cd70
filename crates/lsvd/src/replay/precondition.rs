//! `lsvd replay --precondition`: write every range the trace will read, then wait
//! until the server has moved it out of its write log into the store, so that the
//! replay's reads go through the read cache.

#![expect(
    clippy::disallowed_methods,
    reason = "a live replay issues a trace to a real server in real time"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lsvd_nbd::client::Client;

use super::scrape::scrape;
use super::{pattern, pieces, take_slot};
use lsvd_core::error::{Error, ErrorKind, Result};

/// Precondition writes in flight (each holds a 4 MiB buffer).
const PRECONDITION_WRITES_IN_FLIGHT: usize = 8;

/// Disjoint byte ranges `[start, end)`; overlapping and touching ranges merge as they
/// are added, so memory grows with the number of separate ranges only.
#[derive(Debug, Default)]
pub(super) struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(super) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.ranges.range(..=s).next_back()
            && pe >= s
        {
            s = ps;
            e = e.max(pe);
        }
        while let Some((&ns, &ne)) = self.ranges.range(s..).next() {
            if ns > e {
                break;
            }
            self.ranges.remove(&ns);
            e = e.max(ne);
        }
        self.ranges.insert(s, e);
    }

    pub(super) fn len(&self) -> usize {
        self.ranges.len()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }
}

/// Write every range in `ranges` with the replay's pattern (pieces of up to 4 MiB),
/// then FLUSH. The export refusing is `Permanent`.
pub(super) async fn write_ranges(client: &Arc<Client>, ranges: &RangeSet) -> Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(PRECONDITION_WRITES_IN_FLIGHT));
    let mut tasks: tokio::task::JoinSet<Result<()>> = tokio::task::JoinSet::new();
    let mut first_error: Option<Error> = None;
    let task_failed = |e| Error::with_source(ErrorKind::Permanent, "precondition write task", e);
    'ranges: for (at, n) in ranges.iter().flat_map(|(start, end)| pieces(start, end)) {
        let permit = take_slot(&slots).await?;
        let c = client.clone();
        tasks.spawn(async move {
            let r = c
                .write(at, &pattern(at, n as usize), false)
                .await
                .map_err(|e| {
                    Error::with_source(
                        ErrorKind::Permanent,
                        format!("precondition write of {n} bytes at {at}"),
                        e,
                    )
                });
            drop(permit);
            r
        });
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done.map_err(task_failed).and_then(|r| r) {
                first_error = Some(e);
                break 'ranges;
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done.map_err(task_failed).and_then(|r| r) {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    client
        .flush()
        .await
        .map_err(|e| Error::with_source(ErrorKind::Permanent, "precondition flush", e))
}

/// Poll the metrics until `volume` has nothing in its write log and no uploads
/// pending: every preconditioned byte is then read from the store (through the read
/// cache), not from the log.
pub(super) async fn wait_uploaded(url: &str, volume: &str, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let s = scrape(url).await?;
        let log = s
            .value("lsvd_log_used_bytes", Some(volume))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("{url} has no lsvd_log_used_bytes for volume {volume}"),
                )
            })?;
        let pending = s.value("lsvd_uploads_pending", Some(volume)).unwrap_or(0.0);
        if log == 0.0 && pending == 0.0 {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::new(
                ErrorKind::Transient,
                format!(
                    "--precondition: after {} s volume {volume} still has {log} bytes in its write log and {pending} uploads pending; is the store slow or unreachable (see the server's log)? Raise --precondition-timeout to wait longer",
                    timeout.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_overlapping_and_touching() {
        let mut r = RangeSet::default();
        r.insert(100, 200);
        r.insert(300, 400);
        r.insert(0, 0); // empty: ignored
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(100, 200), (300, 400)]);
        r.insert(200, 250); // touches the first
        r.insert(350, 360); // inside the second
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(100, 250), (300, 400)]);
        r.insert(50, 500); // swallows both
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(50, 500)]);
        r.insert(600, 700);
        r.insert(10, 20);
        r.insert(20, 600); // joins everything
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 700)]);
        assert_eq!((r.len(), r.bytes()), (1, 690));
    }
}
