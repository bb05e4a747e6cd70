//! The engine on a chained-drive store: copy fallback, drive adds, the tail cache and
//! recovery, end to end through a volume.

mod add_drive_tests;
mod copy_fallback_recovery_tests;
mod copy_fallback_tests;
mod engine_tests;
mod tail_cache_tests;
