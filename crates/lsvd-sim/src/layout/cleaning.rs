//! The cleaning utilization measured with lsvd's own GC, for comparison with the
//! analytical relation `U = (u - 1) / ln u` the layout model uses.
//!
//! A volume is filled, then overwritten with uniform random pages, through the
//! simulator ([`VolumeSim`]: the engine's batching, store map and GC) with objects of
//! one segment and greedy GC holding live/stored in a narrow band around the target
//! disk utilization. In steady state every byte GC moves was live in a victim and
//! every byte it frees is refilled by new data, so the victims' utilization is
//! `u = moved / (moved + new)` over the measured half of the run.

use lsvd_core::gc::{GcConfig, GcPolicy};
use lsvd_trace::{Pattern, SyntheticSpec};
use serde::Serialize;

use crate::volume::{SimConfig, VolumeSim};
use lsvd_core::error::Result;

/// What one measurement found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measured {
    /// Mean live/stored over the measured half (sampled every 1024 requests).
    pub disk_utilization: f64,
    /// Live bytes moved / (moved + client bytes) over the measured half.
    pub cleaning_utilization: f64,
}

/// Settings of a measurement.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub volume_bytes: u64,
    pub page_bytes: u64,
    pub segment_bytes: u64,
    /// Random page writes after the fill, as multiples of the volume's pages.
    pub overwrites_per_page: u64,
    pub seed: u64,
}

/// Width of the GC band around the target utilization.
const BAND: f64 = 0.01;

/// Measures the cleaning utilization at disk utilization `disk_u` (in (0, 1)).
pub fn measure(setup: Setup, disk_u: f64) -> Result<Measured> {
    let stop = (disk_u + BAND / 2.0).min(0.999);
    let start = (stop - BAND).max(0.01);
    let gc = GcConfig {
        start_utilization: start,
        stop_utilization: stop,
        policy: GcPolicy::Greedy,
        // One segment of live data per pass, as an LFS cleaner reclaims a few
        // segments at a time: a large pass overshoots the band.
        pass_bytes: setup.segment_bytes,
        defrag_hole_bytes: 0,
    };
    gc.validate().map_err(lsvd_core::error::Error::bad_input)?;
    let cfg = SimConfig {
        batch_size_bytes: setup.segment_bytes,
        batch_timeout_ns: None,
        checkpoint_every_objects: 64,
        checkpoint_interval_ns: None,
        gc,
        volume_size_bytes: Some(setup.volume_bytes),
        series_points: 0,
    };
    let pages = setup.volume_bytes / setup.page_bytes.max(1);
    let spec = SyntheticSpec {
        pattern: Pattern::Uniform,
        volume_size_bytes: setup.volume_bytes,
        io_size_bytes: setup.page_bytes,
        requests: pages.saturating_mul(setup.overwrites_per_page),
        write_fraction: 1.0,
        seed: setup.seed,
        precondition: true,
    };
    let total = spec.total_requests();
    let half = total - spec.requests / 2;
    let mut sim = VolumeSim::new(cfg);
    let (mut moved0, mut client0) = (0, 0);
    let (mut sum_u, mut samples) = (0.0, 0u64);
    for (i, r) in lsvd_trace::synthetic(spec)?.enumerate() {
        let i = i as u64;
        if i == half {
            moved0 = sim.counters().gc_bytes_moved;
            client0 = sim.counters().client_write_bytes;
        }
        sim.request(&r);
        if i >= half && i.is_multiple_of(1024) {
            let stored = sim.state().stored_bytes();
            if stored > 0 {
                sum_u += sim.live_bytes() as f64 / stored as f64;
                samples += 1;
            }
        }
    }
    let moved = sim.counters().gc_bytes_moved - moved0;
    let client = sim.counters().client_write_bytes - client0;
    Ok(Measured {
        disk_utilization: if samples > 0 {
            sum_u / samples as f64
        } else {
            0.0
        },
        cleaning_utilization: if moved + client > 0 {
            moved as f64 / (moved + client) as f64
        } else {
            0.0
        },
    })
}
