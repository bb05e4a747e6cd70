//! What a `--layout` sweep reports: shared by the text and JSON output (`cli`) and the
//! chart (`plot`).

use serde::Serialize;

use super::{Layout, Model};

/// One utilization of one disk.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub disk_utilization: f64,
    /// LFS's cleaning utilization used for the `lfs` column.
    pub cleaning_utilization: f64,
    /// The analytical one, for comparison when `cleaning` is `sim`.
    pub analytic_cleaning_utilization: f64,
    /// With `--cleaning sim`: live/stored measured in the simulation.
    pub measured_disk_utilization: Option<f64>,
    /// Page writes per second per layout asked for, in `--layout` order.
    pub pages_per_second: Vec<(Layout, f64)>,
    pub hylog_hot_fraction: f64,
}

/// One disk's sweep.
#[derive(Debug, Clone, Serialize)]
pub struct DiskReport {
    pub model: Model,
    pub overwrite_page_ms: f64,
    pub segment_io_ms: f64,
    pub segment_efficiency: f64,
    /// (cleaning utilization, disk utilization) where LFS stops beating overwrite,
    /// from the model.
    pub crossover: Option<(f64, f64)>,
    /// The same from HyLog's table, for the preset disks.
    pub hylog_table: Option<(f64, f64)>,
    /// With `--cleaning sim`: the measured disk utilization at which the measured
    /// cleaning utilization reaches the model's crossover (linear interpolation
    /// between sweep points; `None` outside the sweep).
    pub measured_crossover_disk_utilization: Option<f64>,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayoutReport {
    pub cleaning: String,
    pub disks: Vec<DiskReport>,
}
