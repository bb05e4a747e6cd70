//! A panic in any of a volume's tasks or threads fails the volume, loudly: every
//! request then gets `VolumeFailed` (EIO to an NBD client) naming the panic, a shutdown
//! does not mark it clean, and nothing acknowledged is lost (the next open has it).
//! Before `supervise`, a panicking task just ended: the volume went on half-alive and
//! a shutdown could mark it clean.

use std::time::Duration;

use crate::fencing::lease::{LeaseConfig, Takeover};
use crate::test_support::{create_and_open, poll_until};
use crate::{EngineConfig, open_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

fn config() -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 20,
        checkpoint_every_objects: 1,
        log_size_bytes: 16 << 20,
        lease: LeaseConfig {
            timeout_ms: 600,
            takeover: Takeover::Immediate,
            holder: "panic test".to_string(),
            poll_ms: 50,
        },
        ..EngineConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_any_task_fails_the_volume_and_loses_nothing_acknowledged() {
    for point in [
        "uploader",
        "upload",
        "checkpoint",
        "gc",
        "lease",
        "log writer",
    ] {
        let dir = TempDir::new("engine-panic");
        let store: DynStore = std::sync::Arc::new(MemStore::new());
        let (vol, _) = create_and_open(&store, "v", 64 << 20, dir.path(), config()).await;
        vol.write(0, vec![1; 64 << 10], false).await.expect("write");
        vol.flush().await.expect("flush");
        vol.shared.inject_panic(point);
        // Work that reaches the point: a write (the log writer), a batch to upload (the
        // uploader, the upload, the checkpoint after it); GC and the lease wake by
        // themselves.
        let _ = vol.write(1 << 20, vec![2; 300 << 10], false).await;
        let failed = poll_until(Duration::from_secs(10), async || vol.shared.is_failed()).await;
        assert!(failed, "{point}: the volume did not fail within 10 s");
        let why = vol.shared.failure().expect("a failure");
        assert!(
            why.contains("panicked") && why.contains(&format!("injected panic at {point}")),
            "{point}: {why}"
        );
        let e = vol
            .read(0, 4096)
            .await
            .expect_err("a read of a failed volume");
        assert_eq!(e.kind, ErrorKind::VolumeFailed, "{point}: {e}");
        let e = vol
            .write(0, vec![3; 4096], false)
            .await
            .expect_err("a write to a failed volume");
        assert_eq!(e.kind, ErrorKind::VolumeFailed, "{point}: {e}");
        let e = vol
            .shutdown()
            .await
            .expect_err("a failed volume is not marked clean");
        assert_eq!(e.kind, ErrorKind::VolumeFailed, "{point}: {e}");
        drop(vol);

        let (vol, report) = open_volume(store.clone(), "v", dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("{point}: reopen: {e}"));
        assert!(!report.checkpoint_clean, "{point}: {report:?}");
        assert_eq!(
            vol.read(0, 64 << 10).await.expect("read"),
            vec![1; 64 << 10],
            "{point}: the acknowledged, flushed write"
        );
        vol.shutdown().await.expect("shutdown");
    }
}

/// A panic under a lock poisons it, and another task may take that lock (and fail the
/// volume for the poisoned lock) before the supervisor has caught the panic: the panic
/// is still the reason the volume gives (the test above saw the poisoned lock's
/// reason now and then under load).
#[tokio::test]
async fn the_panic_not_the_lock_it_poisoned_is_the_failure_reason() {
    let dir = TempDir::new("engine-panic-reason");
    let store: DynStore = std::sync::Arc::new(MemStore::new());
    let (vol, _) = create_and_open(&store, "v", 64 << 20, dir.path(), config()).await;
    vol.shared
        .fail("a thread panicked while holding the volume's state lock");
    vol.shared.fail_by_panic("its upload panicked: injected");
    assert_eq!(
        vol.shared.failure().as_deref(),
        Some("its upload panicked: injected")
    );
    // Any later reason, a panic's too, leaves the first cause.
    vol.shared.fail("a later error");
    vol.shared.fail_by_panic("its gc panicked: later");
    assert_eq!(
        vol.shared.failure().as_deref(),
        Some("its upload panicked: injected")
    );
    assert!(
        vol.shutdown().await.is_err(),
        "a failed volume is not marked clean"
    );
}
