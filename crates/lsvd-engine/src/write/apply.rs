//! Applying uploaded objects to the store map, in sequence order, a step at a time.
//!
//! The pipeline decides which object is next (`Pipeline::begin_apply`); this module
//! runs the steps: about [`APPLY_STEP_PIECES`] map entries per hold of the state lock
//! (applying 2,048 scattered extents at once held the lock every client write takes
//! for 2-8 ms). Once objects are applied their records may be freed from the write
//! log, which keeps them (and serves reads of them) until it needs the space
//! ([`crate::write::log_tail`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::shared::Shared;
use crate::write::log_tail::persist_tail_off_runtime;

/// Map entries inserted or displaced per hold of the state lock while applying an
/// object: about 0.2 ms on a volume of 200,000 extents.
const APPLY_STEP_PIECES: usize = 256;

/// Apply every uploaded object whose turn has come; then, if the write log has less
/// free space than it keeps (`EngineConfig::log_free_target_bytes`), free the oldest
/// uploaded records: make the new tail durable and free the space. Uploaded records
/// not freed stay readable from the log.
pub(crate) async fn apply_ready(shared: &Arc<Shared>) {
    while apply_next(shared).await {}
    let through = {
        let mut st = shared.lock();
        let target = shared.config.log_free_target_for(st.log.capacity_bytes());
        let freeable = st.pipeline.freeable_through();
        let through = st.log.free_through_for(target, freeable);
        // What status reports as kept (`Volume::status`): records in
        // (log_freeing_through, log_classified_through].
        st.log_classified_through = freeable;
        if let Some(t) = through {
            st.log_freeing_through = st.log_freeing_through.max(t);
        }
        through
    };
    if let Some(through) = through {
        persist_tail_off_runtime(shared, through, false).await;
    }
}

/// Apply the next object in sequence order, if it is there and no other task is
/// applying one, releasing the state lock between steps.
async fn apply_next(shared: &Shared) -> bool {
    let begun = shared.lock().pipeline.begin_apply();
    match begun {
        Ok(Some(_)) => {}
        Ok(None) => return false,
        Err(e) => {
            shared.fail(&format!("applying an object: {e}"));
            return false;
        }
    }
    loop {
        {
            let mut guard = shared.lock();
            let st = &mut *guard;
            // The write-log map keeps its entries: the log still holds the same
            // data, and reads of it stay local until the record is freed
            // (`crate::write::log_tail`).
            let done = st.pipeline.apply_step(APPLY_STEP_PIECES, |_, _, _| {});
            if let Some(applied) = done {
                shared
                    .stats
                    .gc_superseded_bytes
                    .fetch_add(applied.superseded_bytes, Ordering::Relaxed);
                return true;
            }
        }
        // Let a client write that is waiting for the lock take it.
        tokio::task::yield_now().await;
    }
}
