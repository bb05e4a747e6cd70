//! The volume's locks: the order they are taken in, checked in debug builds, and what
//! a poisoned one means.
//!
//! Why: `Shared` holds several mutexes, and two threads taking two of them in opposite
//! orders deadlock, silently, under load. Writing the order down and checking it on
//! every take in debug builds (every test run) turns a deadlock that might happen into
//! a panic that names both locks.
//!
//! # Lock order
//!
//! A thread holding one of these takes only locks *later* in the list:
//!
//! 1. `super_lock`: cache superblock and write-log index writes (they share a sync);
//!    the state is read under it.
//! 2. `state` (`Shared::lock`): the pipeline, the overlay map, log space.
//! 3. `volume_super`: the generation this process wrote last.
//! 4. `pins`: what snapshots keep.
//! 5. `replica_holds`: what replication passes under way keep.
//! 6. `deferred_deletes`: objects waiting for the next checkpoint to be deleted.
//! 7. `headers`: object headers cached for read verification.
//! 8. `jitter`: the seeded jitter generator.
//! 9. `failure`: why the volume failed (taken by `Shared::fail`, from anywhere).
//!
//! The tokio mutexes (`resizing`, `deletions`, `volume_super_writes`) are held across
//! awaits and are not in this order: none of the locks above is held while one of them
//! is awaited (a std guard cannot live across an await in a spawned task).
//!
//! # Poisoning
//!
//! A poisoned lock means a thread panicked while holding it, and what it guards may be
//! half-updated. Taking one fails the volume (every request gets EIO, nothing more is
//! uploaded or marked clean, as docs/SEMANTICS.md says of a panic) and hands out the
//! guard all the same, so the failure path can run.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

/// The volume's std mutexes, in the order they may be taken (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LockRank {
    SuperLock,
    State,
    VolumeSuper,
    Pins,
    ReplicaHolds,
    DeferredDeletes,
    Headers,
    Jitter,
    Failure,
}

impl LockRank {
    pub(crate) fn name(self) -> &'static str {
        match self {
            LockRank::SuperLock => "cache superblock",
            LockRank::State => "state",
            LockRank::VolumeSuper => "volume superblock",
            LockRank::Pins => "snapshot pins",
            LockRank::ReplicaHolds => "replica holds",
            LockRank::DeferredDeletes => "deferred deletes",
            LockRank::Headers => "object header cache",
            LockRank::Jitter => "jitter",
            LockRank::Failure => "failure",
        }
    }
}

thread_local! {
    /// The ranked locks this thread holds, in the order it took them (debug builds).
    static HELD: RefCell<Vec<LockRank>> = const { RefCell::new(Vec::new()) };
}

/// Note that this thread is about to take `rank`: in debug builds, panic if it holds a
/// lock of the same or a later rank.
pub(crate) fn enter(rank: LockRank) {
    if cfg!(debug_assertions) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(&last) = held.iter().max()
                && last >= rank
            {
                // Dropped before the panic, so unwinding guards find the list free.
                let order: Vec<&str> = held.iter().map(|r| r.name()).collect();
                drop(held);
                panic!(
                    "lock order: taking the {} lock while holding {order:?} \
                     (crates/lsvd-engine/src/locks.rs says the order)",
                    rank.name()
                );
            }
            held.push(rank);
        });
    }
}

/// Note that this thread let go of `rank` (debug builds).
pub(crate) fn leave(rank: LockRank) {
    if cfg!(debug_assertions) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(i) = held.iter().rposition(|&r| r == rank) {
                held.remove(i);
            }
        });
    }
}

/// A guard of a ranked lock: lets go of its rank when dropped.
pub(crate) struct Ranked<'a, T> {
    guard: MutexGuard<'a, T>,
    rank: LockRank,
}

impl<'a, T> Ranked<'a, T> {
    /// `guard`, taken after [`enter`]`(rank)`.
    pub(crate) fn new(guard: MutexGuard<'a, T>, rank: LockRank) -> Self {
        Ranked { guard, rank }
    }
}

impl<T> Deref for Ranked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Ranked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Ranked<'_, T> {
    fn drop(&mut self) {
        leave(self.rank);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn locks_taken_in_order_pass() {
        let (a, b) = (Mutex::new(1), Mutex::new(2));
        enter(LockRank::State);
        let ga = Ranked::new(a.lock().expect("a"), LockRank::State);
        enter(LockRank::Pins);
        let gb = Ranked::new(b.lock().expect("b"), LockRank::Pins);
        assert_eq!(*ga + *gb, 3);
        drop(gb);
        drop(ga);
        // Released: the same order again, and the later lock alone, pass.
        enter(LockRank::Pins);
        leave(LockRank::Pins);
        HELD.with(|h| assert!(h.borrow().is_empty()));
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_lock_taken_out_of_order_panics_naming_both() {
        let outcome = std::thread::spawn(|| {
            let m = Mutex::new(());
            enter(LockRank::DeferredDeletes);
            let _g = Ranked::new(m.lock().expect("m"), LockRank::DeferredDeletes);
            enter(LockRank::State);
        })
        .join();
        let panic = outcome.expect_err("out of order panics");
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("taking the state lock") && msg.contains("deferred deletes"),
            "{msg}"
        );
    }
}
