//! The settings of one chained-log simulation and their validation: every setting a
//! user can give is checked here, so the event loop never sees a value it cannot
//! handle.

use super::device::DeviceModel;
use super::layout::{BLOCK_BYTES, ChainGc, Geometry, LayoutKind, VictimPolicy};
use super::trace::TraceMix;
use lsvd_core::error::{Error, Result};

/// One simulation's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub geo: Geometry,
    pub device: DeviceModel,
    pub chain_gc: ChainGc,
    pub policy: VictimPolicy,
    pub clients: u32,
    pub queue_depth: u32,
    pub io_bytes: u64,
    pub write_fraction: f64,
    /// Logical address space as a fraction of the drives' total capacity.
    pub fill: f64,
    /// Trace-driven clients instead of random writes (then `fill` is unused: the
    /// address space is what the traces touch).
    pub trace: Option<std::sync::Arc<TraceMix>>,
    /// 0 disables GC.
    pub gc_start_free: f64,
    pub gc_stop_free: f64,
    pub duration_ns: u64,
    pub interval_ns: u64,
    pub seed: u64,
    /// Drives per layout position: 1, or 2 for a mirrored layout (`chain:3x2`).
    pub copies: u32,
    /// Tail cache (LRU of client-written blocks), in 4 KiB blocks; 0 is off.
    pub tail_cache_blocks: u64,
}

impl Config {
    /// The run's name: `chain:2 compact-in-body`, `stripe:2`.
    pub fn name(&self) -> String {
        let mirror = if self.copies > 1 {
            format!("x{}", self.copies)
        } else {
            String::new()
        };
        match self.geo.kind {
            LayoutKind::Stripe => format!("stripe:{}{mirror}", self.geo.drives),
            LayoutKind::Chain => format!(
                "chain:{}{mirror} {}",
                self.geo.drives,
                match self.chain_gc {
                    ChainGc::CompactInBody => "compact-in-body",
                    ChainGc::MoveToTail => "move-to-tail",
                }
            ),
        }
    }

    /// Checks the settings; every failure is `BadInput`.
    pub fn validate(&self) -> Result<()> {
        let g = &self.geo;
        let bad = |m: String| Err(Error::bad_input(m));
        if !(1..=64).contains(&g.drives) {
            return bad(format!("{} drives: between 1 and 64", g.drives));
        }
        if g.segment_bytes < BLOCK_BYTES || !g.segment_bytes.is_multiple_of(BLOCK_BYTES) {
            return bad("--segment-size must be a positive multiple of 4K".into());
        }
        if g.kind == LayoutKind::Stripe
            && (g.chunk_bytes < BLOCK_BYTES
                || !g.chunk_bytes.is_multiple_of(BLOCK_BYTES)
                || !g
                    .chunk_bytes
                    .checked_mul(u64::from(g.drives))
                    .is_some_and(|row| g.segment_bytes.is_multiple_of(row)))
        {
            return bad(format!(
                "stripe: --stripe-unit {} must be a multiple of 4K and --segment-size {} a multiple of stripe-unit x {} drives",
                g.chunk_bytes, g.segment_bytes, g.drives
            ));
        }
        let per_drive = g.segments_per_drive();
        if g.kind == LayoutKind::Chain && !g.drive_bytes.is_multiple_of(g.segment_bytes) {
            return bad("--drive-size must be a multiple of --segment-size".into());
        }
        if per_drive > 1 << 22
            || g.segments() > 1 << 22
            || per_drive < g.reserve_segments.saturating_add(1).saturating_mul(4)
        {
            return bad(format!(
                "--drive-size / --segment-size = {per_drive} segments per drive: need at least 4 x (--gc-reserve + 1) and at most 4M segments in all"
            ));
        }
        if g.segments().saturating_mul(g.blocks_per_segment()) > 1 << 30 {
            return bad(
                "the drives hold more than 2^30 blocks (4 TiB): too big to simulate".into(),
            );
        }
        if self.io_bytes < BLOCK_BYTES
            || !self.io_bytes.is_multiple_of(BLOCK_BYTES)
            || self.io_bytes > g.segment_bytes
        {
            return bad("--io-size must be a multiple of 4K and at most --segment-size".into());
        }
        if self.trace.is_none() && !(self.fill > 0.0 && self.fill <= 0.9) {
            return bad(format!("--fill {}: must be in (0, 0.9]", self.fill));
        }
        let usable = g.segments() - g.pools() as u64 * (g.reserve_segments + 1);
        if self.logical_blocks() > usable * g.blocks_per_segment() {
            return bad(match &self.trace {
                Some(t) => format!(
                    "the traces touch {} MiB: they do not fit beside the GC reserve (raise --drive-size)",
                    (t.logical_blocks * BLOCK_BYTES) >> 20
                ),
                None => format!(
                    "--fill {}: the address space does not fit beside the GC reserve",
                    self.fill
                ),
            });
        }
        if !(1..=2).contains(&self.copies) {
            return bad(format!(
                "{} copies: a layout is mirrored twice at most",
                self.copies
            ));
        }
        if self.tail_cache_blocks > 1 << 30 {
            return bad("--tail-cache: at most 4 TiB".into());
        }
        if !(0.0..=1.0).contains(&self.write_fraction) {
            return bad("--write-fraction must be between 0 and 1".into());
        }
        let ok_gc = self.gc_start_free == 0.0
            || (self.gc_start_free > 0.0
                && self.gc_start_free < self.gc_stop_free
                && self.gc_stop_free <= 1.0);
        if !ok_gc {
            return bad("GC thresholds: need 0 < --gc-free-start < --gc-free-stop <= 1 (or --gc-free-start 0: no GC)".into());
        }
        if !(1..=4096).contains(&(u64::from(self.clients) * u64::from(self.queue_depth))) {
            return bad("--clients x --queue-depth must be between 1 and 4096".into());
        }
        if self.interval_ns < 1_000_000
            || self.duration_ns == 0
            || self.duration_ns / self.interval_ns > 100_000
        {
            return bad(
                "--interval-ms must be >= 1 and --seconds / interval at most 100000".into(),
            );
        }
        Ok(())
    }

    pub fn logical_blocks(&self) -> u64 {
        if let Some(t) = &self.trace {
            return t.logical_blocks;
        }
        let blocks = (self.geo.segments() * self.geo.blocks_per_segment()) as f64 * self.fill;
        let per_io = self.io_bytes / BLOCK_BYTES;
        (blocks as u64 / per_io.max(1)) * per_io.max(1)
    }
}
