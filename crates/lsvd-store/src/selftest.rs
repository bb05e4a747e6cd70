//! Startup self-test of an object store: does it keep the promises lsvd relies on?
//!
//! Run it before serving from a store (`lsvd serve` does, once per start). It writes
//! two small probe objects under `.lsvd-selftest/` (volume names cannot start with a
//! dot, so probes never collide with a volume) and removes them again. Checks:
//!
//! 1. `put(IfAbsent)` of a new key succeeds;
//! 2. a second `put(IfAbsent)` of the same key fails with `AlreadyExists` and leaves
//!    the first object in place (a store that ignores `If-None-Match: *` fails here:
//!    lsvd would then have no protection against two writers on one volume);
//! 3. `get` returns the bytes written; `get` of a missing key is `NotFound`;
//! 4. `get_range` returns the requested bytes, clamps a range past the end, and
//!    returns nothing for a range that starts past the end;
//! 5. `list` finds the probe by its directory and by a raw (mid-name) prefix, with
//!    its size, and finds nothing under an unused prefix;
//! 6. several concurrent `put(IfAbsent)` of one key: exactly one wins (catches stores
//!    that check and then write, non-atomically; a race may not show up every time);
//! 7. `delete` removes the probes; deleting a missing key succeeds.
//!
//! A failure names the store, the check and what happened; the caller should refuse
//! to start.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock as _, SystemClock};

use bytes::Bytes;

use super::{ObjectStore, PutMode, StoreResult};
use lsvd_core::error::{Error, ErrorKind};

/// Where probe objects go.
pub const PROBE_PREFIX: &str = ".lsvd-selftest/";

/// Concurrent writers in the race check.
pub const DEFAULT_RACE_WRITERS: usize = 8;

/// A single store operation taking longer than this fails the self-test.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct SelfTestReport {
    pub store: String,
    /// The checks that passed, in order.
    pub checks: Vec<&'static str>,
    pub elapsed: Duration,
}

impl fmt::Display for SelfTestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "object store {} passed the self-test ({} checks: {}) in {} ms",
            self.store,
            self.checks.len(),
            self.checks.join(", "),
            self.elapsed.as_millis()
        )
    }
}

#[derive(Debug, Clone)]
pub struct SelfTestError {
    pub store: String,
    /// Which check failed.
    pub check: &'static str,
    /// What happened.
    pub detail: String,
    /// `Unsupported` when the store answered but broke a promise lsvd relies on; the
    /// store error's kind when an operation failed; `Transient` when it did not answer.
    pub kind: ErrorKind,
}

impl fmt::Display for SelfTestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "object store {} failed the self-test: {}: {}",
            self.store, self.check, self.detail
        )?;
        if self.check == CHECK_IF_ABSENT || self.check == CHECK_RACE {
            write!(
                f,
                ". lsvd needs atomic put-if-absent (S3: PUT with If-None-Match: *) to keep two \
                 writers off one volume; use a store that honours it (e.g. AWS S3, MinIO, \
                 versitygw, Cloudflare R2) or a local directory"
            )?;
        }
        write!(f, ". Refusing to start.")
    }
}

impl std::error::Error for SelfTestError {}

/// The self-test's failure as the crate's error: its kind, and the report as the source
/// (the text is the report's).
impl From<SelfTestError> for Error {
    fn from(e: SelfTestError) -> Self {
        Error::with_source(e.kind, "", e)
    }
}

const CHECK_PUT: &str = "put-if-absent of a new key";
const CHECK_IF_ABSENT: &str = "put-if-absent of an existing key must fail";
const CHECK_GET: &str = "get";
const CHECK_GET_MISSING: &str = "get of a missing key";
const CHECK_RANGE: &str = "get_range";
const CHECK_LIST: &str = "list";
const CHECK_RACE: &str = "concurrent put-if-absent: exactly one wins";
const CHECK_DELETE: &str = "delete";

fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = u128::from_le_bytes(crate::clock::random_id_bytes());
    format!(
        "{nanos:x}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

struct Run<'a> {
    store: &'a dyn ObjectStore,
    checks: Vec<&'static str>,
}

impl Run<'_> {
    /// The store answered, but not as lsvd needs.
    fn fail(&self, check: &'static str, detail: impl Into<String>) -> SelfTestError {
        self.fail_as(ErrorKind::Unsupported, check, detail)
    }

    /// A store operation failed with `e`.
    fn failed(&self, e: &Error, check: &'static str, detail: impl Into<String>) -> SelfTestError {
        self.fail_as(e.kind, check, detail)
    }

    fn fail_as(
        &self,
        kind: ErrorKind,
        check: &'static str,
        detail: impl Into<String>,
    ) -> SelfTestError {
        SelfTestError {
            store: self.store.describe(),
            check,
            detail: detail.into(),
            kind,
        }
    }

    /// Passes `check` if a get of `key` (never written, or deleted) fails 'not found';
    /// fails it with `when_found` if the get returned data, or with `should` and the
    /// error if it failed otherwise.
    async fn check_not_found(
        &mut self,
        check: &'static str,
        key: &str,
        when_found: String,
        should: String,
    ) -> Result<(), SelfTestError> {
        match self.step(check, self.store.get(key)).await? {
            Err(e) if e.is_not_found() => {
                self.checks.push(check);
                Ok(())
            }
            Ok(_) => Err(self.fail(check, when_found)),
            Err(e) => Err(self.failed(&e, check, format!("{should}, but: {e}"))),
        }
    }

    /// Run one store operation with a deadline.
    async fn step<T>(
        &self,
        check: &'static str,
        fut: impl Future<Output = StoreResult<T>>,
    ) -> Result<StoreResult<T>, SelfTestError> {
        tokio::time::timeout(STEP_TIMEOUT, fut).await.map_err(|_| {
            self.fail_as(
                ErrorKind::Transient,
                check,
                format!("no answer within {STEP_TIMEOUT:?}"),
            )
        })
    }
}

/// Run the self-test with [`DEFAULT_RACE_WRITERS`] writers in the race check.
pub async fn run(store: &dyn ObjectStore) -> Result<SelfTestReport, SelfTestError> {
    run_with(store, DEFAULT_RACE_WRITERS).await
}

/// Run the self-test; `race_writers` concurrent put-if-absent calls (0 skips the race).
pub async fn run_with(
    store: &dyn ObjectStore,
    race_writers: usize,
) -> Result<SelfTestReport, SelfTestError> {
    let clock = SystemClock::new();
    let started = clock.now();
    let suffix = unique_suffix();
    let probe = format!("{PROBE_PREFIX}{suffix}.probe");
    let race_key = format!("{PROBE_PREFIX}{suffix}.race");
    let mut run = Run {
        store,
        checks: Vec::new(),
    };
    let result = checks(&mut run, &probe, &race_key, race_writers).await;
    if result.is_err() {
        // Best effort: leave nothing behind.
        let _ = tokio::time::timeout(STEP_TIMEOUT, store.delete(&probe)).await;
        let _ = tokio::time::timeout(STEP_TIMEOUT, store.delete(&race_key)).await;
    }
    result?;
    Ok(SelfTestReport {
        store: store.describe(),
        checks: run.checks,
        elapsed: clock.now().saturating_sub(started),
    })
}

async fn checks(
    run: &mut Run<'_>,
    probe: &str,
    race_key: &str,
    race_writers: usize,
) -> Result<(), SelfTestError> {
    let store = run.store;
    let first: Bytes = format!("lsvd self-test probe, first write, {probe}, ")
        .into_bytes()
        .into_iter()
        .chain((0..200u32).map(|i| (i * 7 + 3) as u8))
        .collect();
    let second = Bytes::from_static(b"lsvd self-test probe: SECOND WRITE (must not land)");

    // 1. put-if-absent of a new key.
    match run
        .step(
            CHECK_PUT,
            store.put(probe, first.clone(), PutMode::IfAbsent),
        )
        .await?
    {
        Ok(()) => run.checks.push(CHECK_PUT),
        Err(e) => return Err(run.failed(&e, CHECK_PUT, format!("put of {probe} failed: {e}"))),
    }

    // 2. put-if-absent of the same key must fail with AlreadyExists.
    match run
        .step(
            CHECK_IF_ABSENT,
            store.put(probe, second.clone(), PutMode::IfAbsent),
        )
        .await?
    {
        Ok(()) => {
            return Err(run.fail(
                CHECK_IF_ABSENT,
                format!(
                    "a second put-if-absent of {probe} succeeded; the store ignores \
                     conditional writes"
                ),
            ));
        }
        Err(e) if e.kind == ErrorKind::AlreadyExists => run.checks.push(CHECK_IF_ABSENT),
        Err(e) => {
            return Err(run.failed(
                &e,
                CHECK_IF_ABSENT,
                format!(
                    "a second put-if-absent of {probe} should fail with 'already exists', \
                     but failed with {:?}: {e}",
                    e.kind
                ),
            ));
        }
    }

    // 3. get returns the first write; a missing key is NotFound.
    match run.step(CHECK_GET, store.get(probe)).await? {
        Ok(b) if b == first => run.checks.push(CHECK_GET),
        Ok(b) if b == second => {
            return Err(run.fail(
                CHECK_IF_ABSENT,
                "the second put-if-absent was refused but overwrote the object anyway",
            ));
        }
        Ok(b) => {
            return Err(run.fail(
                CHECK_GET,
                format!(
                    "read back {} bytes that differ from the {} written",
                    b.len(),
                    first.len()
                ),
            ));
        }
        Err(e) => return Err(run.failed(&e, CHECK_GET, format!("get of {probe} failed: {e}"))),
    }
    let missing = format!("{probe}.missing");
    run.check_not_found(
        CHECK_GET_MISSING,
        &missing,
        format!("get of {missing}, never written, returned data"),
        format!("get of {missing} should fail with 'not found'"),
    )
    .await?;

    // 4. Ranged reads: inside, clamped at the end, past the end.
    let len = first.len() as u64;
    let cases: [(std::ops::Range<u64>, &[u8]); 3] = [
        (5..17, &first[5..17]),
        (len - 3..len + 100, &first[first.len() - 3..]),
        (len + 10..len + 20, &[]),
    ];
    for (range, want) in cases {
        match run
            .step(CHECK_RANGE, store.get_range(probe, range.clone()))
            .await?
        {
            Ok(b) if b == want => {}
            Ok(b) => {
                return Err(run.fail(
                    CHECK_RANGE,
                    format!(
                        "bytes {range:?} of a {len}-byte object: got {} bytes, expected {}",
                        b.len(),
                        want.len()
                    ),
                ));
            }
            Err(e) => {
                return Err(run.failed(
                    &e,
                    CHECK_RANGE,
                    format!("bytes {range:?} of a {len}-byte object: {e}"),
                ));
            }
        }
    }
    run.checks.push(CHECK_RANGE);

    // 5. list by directory, by raw prefix, and an unused prefix.
    let raw_prefix = &probe[..probe.len() - 4];
    let empty_prefix = format!("{probe}.nothing-here/");
    for (prefix, expect) in [
        (PROBE_PREFIX, true),
        (raw_prefix, true),
        (&*empty_prefix, false),
    ] {
        let entries = match run.step(CHECK_LIST, store.list(prefix)).await? {
            Ok(e) => e,
            Err(e) => return Err(run.failed(&e, CHECK_LIST, format!("list '{prefix}': {e}"))),
        };
        let found = entries.iter().find(|e| e.key == probe);
        match (found, expect) {
            (Some(e), true) if e.size_bytes == len => {}
            (Some(e), true) => {
                return Err(run.fail(
                    CHECK_LIST,
                    format!(
                        "list '{prefix}' gives {probe} as {} bytes, not {len}",
                        e.size_bytes
                    ),
                ));
            }
            (None, true) => {
                return Err(run.fail(
                    CHECK_LIST,
                    format!(
                        "list '{prefix}' does not include {probe} ({} entries)",
                        entries.len()
                    ),
                ));
            }
            (_, false) if !entries.is_empty() => {
                return Err(run.fail(
                    CHECK_LIST,
                    format!(
                        "list '{prefix}' should be empty but has {} entries, e.g. {}",
                        entries.len(),
                        entries[0].key
                    ),
                ));
            }
            (_, false) => {}
        }
        if entries.windows(2).any(|w| w[0].key >= w[1].key)
            || entries.iter().any(|e| !e.key.starts_with(prefix))
        {
            return Err(run.fail(
                CHECK_LIST,
                format!("list '{prefix}' is not sorted, or has keys outside the prefix"),
            ));
        }
    }
    run.checks.push(CHECK_LIST);

    // 6. Concurrent put-if-absent of one key: exactly one wins.
    if race_writers > 1 {
        let puts = (0..race_writers).map(|i| {
            let data = Bytes::from(format!("racer {i}"));
            async move {
                let r = tokio::time::timeout(
                    STEP_TIMEOUT,
                    store.put(race_key, data.clone(), PutMode::IfAbsent),
                )
                .await;
                (data, r)
            }
        });
        let results = join_all(puts).await;
        let mut winners = Vec::new();
        for (data, r) in results {
            match r {
                Ok(Ok(())) => winners.push(data),
                Ok(Err(e)) if e.kind == ErrorKind::AlreadyExists => {}
                Ok(Err(e)) => {
                    return Err(run.failed(
                        &e,
                        CHECK_RACE,
                        format!("a racing put-if-absent of {race_key} failed: {e}"),
                    ));
                }
                Err(_) => {
                    return Err(run.fail_as(
                        ErrorKind::Transient,
                        CHECK_RACE,
                        format!("a racing put-if-absent of {race_key} did not finish"),
                    ));
                }
            }
        }
        if winners.len() != 1 {
            return Err(run.fail(
                CHECK_RACE,
                format!(
                    "{} of {race_writers} concurrent put-if-absent calls of {race_key} \
                     succeeded; exactly one must",
                    winners.len()
                ),
            ));
        }
        match run.step(CHECK_RACE, store.get(race_key)).await? {
            Ok(b) if b == winners[0] => run.checks.push(CHECK_RACE),
            Ok(_) => {
                return Err(run.fail(
                    CHECK_RACE,
                    "the object holds a losing writer's data, not the winner's",
                ));
            }
            Err(e) => return Err(run.failed(&e, CHECK_RACE, format!("get {race_key}: {e}"))),
        }
    }

    // 7. delete, and deleting a missing key succeeds.
    for key in [probe, race_key, probe] {
        if let Err(e) = run.step(CHECK_DELETE, store.delete(key)).await? {
            return Err(run.failed(&e, CHECK_DELETE, format!("delete {key}: {e}")));
        }
    }
    run.check_not_found(
        CHECK_DELETE,
        probe,
        format!("{probe} can still be read after delete"),
        "get after delete should be 'not found'".into(),
    )
    .await
}

/// Await every future concurrently (no `futures` dependency for one call site).
async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;
    use crate::{BoxFuture, ListEntry};
    use std::ops::Range;

    /// A store that ignores put-if-absent (like Garage, or S3 services before 2024).
    struct IgnoresIfAbsent(MemStore);

    impl ObjectStore for IgnoresIfAbsent {
        fn put(&self, key: &str, data: Bytes, _: PutMode) -> BoxFuture<'_, StoreResult<()>> {
            self.0.put(key, data, PutMode::Overwrite)
        }
        fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            self.0.get(key)
        }
        fn get_range(&self, key: &str, r: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            self.0.get_range(key, r)
        }
        fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
            self.0.list(prefix)
        }
        fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
            self.0.delete(key)
        }
        fn describe(&self) -> String {
            "mem://ignores-if-absent".into()
        }
    }

    #[tokio::test]
    async fn passes_on_mem_and_fs_and_cleans_up() {
        let mem = MemStore::new();
        let report = run(&mem).await.expect("mem store passes");
        assert_eq!(report.checks.len(), 8, "{report}");
        assert!(mem.snapshot().is_empty(), "probes removed");

        let dir = crate::testutil::TempDir::new("selftest");
        let fs = crate::fs::FsStore::open(dir.path()).expect("open");
        let report = run(&fs).await.expect("fs store passes");
        assert!(report.to_string().contains("passed the self-test"));
        assert!(fs.list("").await.expect("list").is_empty());
    }

    #[tokio::test]
    async fn fails_when_put_if_absent_is_ignored() {
        let store = IgnoresIfAbsent(MemStore::new());
        let e = run(&store).await.expect_err("must fail");
        assert_eq!(e.check, CHECK_IF_ABSENT);
        let msg = e.to_string();
        assert!(msg.contains("mem://ignores-if-absent"), "{msg}");
        assert!(msg.contains("ignores conditional writes"), "{msg}");
        assert!(msg.contains("Refusing to start"), "{msg}");
        assert!(store.0.snapshot().is_empty(), "probe removed after failure");
    }
}
