//! HDD layout models: the write cost of `overwrite`, `lfs` and `hylog` on a disk
//! described by its positioning time and transfer rate, as HyLog (Wang, Zhao, Bunt,
//! FAST '04) compares them.
//!
//! lsvd itself is log-structured on an object store, where "positioning" is a
//! request's latency and cost; this model exists to reproduce HyLog's
//! Overwrite-vs-LFS crossover and to see where logging stops paying on a device with
//! a given ratio of positioning time to bandwidth. It is sans-I/O: pure functions of
//! the disk, the page and segment sizes and the utilization, so every number in
//! `docs/sim/crossover.md` can be recomputed by hand.
//!
//! The model (uniform random page updates, TPC-B-like):
//!
//! * `overwrite`: each page write is one positioned I/O, `t_page = T_pos + P/B`.
//! * `lfs`: pages are gathered into segments of `N = S/P` pages written with one
//!   positioned I/O, `t_seg = T_pos + S/B`. Cleaning a segment at utilization `u`
//!   reads `1/(1-u)` segments and writes back `u/(1-u)`, so writing one segment of
//!   new data costs `2/(1-u)` segment I/Os: `t_lfs = 2/(1-u) · t_seg / N` per page.
//!   LFS wins while the segment I/O efficiency `E = N · t_page / t_seg` exceeds
//!   `2/(1-u)`, i.e. up to the crossover `u* = 1 - 2/E`.
//! * The cleaning utilization `u` at disk utilization `U` (live / disk) is the
//!   analytical relation for uniform updates `U = (u - 1) / ln u` (each page of a
//!   segment survives until cleaning with probability `e^{-(1-u)/U}`); it is the
//!   relation HyLog's table follows (0.52 ↔ 0.74, 0.88 ↔ 0.94, 0.94 ↔ 0.97).
//!   [`cleaning`] measures the same thing with lsvd's own GC in the simulator.
//! * `hylog`: a fraction `h` of the pages (the hottest; under uniform updates any
//!   `h` of them) is logged in a partition that gets all the free space, the rest is
//!   updated in place. The log partition's utilization is `hU / (hU + 1 - U)`; a
//!   write costs `w(h) · t_lfs(u_hot) + (1 - w(h)) · t_page`, where `w(h)` is the
//!   share of writes that go to the hot pages (`h` for uniform). HyLog picks the `h`
//!   that minimizes this ([`Model::hylog_best`]); `h = 0` is overwrite and `h = 1`
//!   is LFS, so the optimum is never worse than either.

pub mod cleaning;
pub mod cli;
pub mod plot;
pub mod report;

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Bytes per MB in transfer rates (disk makers' decimal megabytes).
pub const BYTES_PER_MB: f64 = 1e6;

/// A disk: positioning time (average seek plus rotational latency) and transfer rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Disk {
    /// The preset's year, or `custom`.
    pub name: String,
    pub positioning_ms: f64,
    pub transfer_mb_per_s: f64,
}

impl Disk {
    /// DEC RZ26, HyLog's 1991 disk: 15 ms, 2.3 MB/s.
    pub fn y1991() -> Disk {
        Disk::new("1991", 15.0, 2.3)
    }

    /// Quantum Atlas 10K, HyLog's 1999 disk. The slides give no numbers for it; these
    /// are its data sheet's: 5.0 ms average seek plus 3.0 ms average rotational
    /// latency (10,000 rpm), and 18 MB/s, the low end of its 18-26 MB/s media rate.
    pub fn y1999() -> Disk {
        Disk::new("1999", 8.0, 18.0)
    }

    /// Seagate Cheetah X15 36LP, HyLog's 2003 disk: 5.6 ms, 61 MB/s.
    pub fn y2003() -> Disk {
        Disk::new("2003", 5.6, 61.0)
    }

    fn new(name: &str, positioning_ms: f64, transfer_mb_per_s: f64) -> Disk {
        Disk {
            name: name.to_string(),
            positioning_ms,
            transfer_mb_per_s,
        }
    }

    /// Time of one positioned I/O of `bytes`, in ms.
    pub fn io_ms(&self, bytes: u64) -> f64 {
        self.positioning_ms + bytes as f64 / (self.transfer_mb_per_s * BYTES_PER_MB) * 1e3
    }
}

impl FromStr for Disk {
    type Err = String;

    /// `1991`, `1999`, `2003`, or `POSITIONING_MS:MB_PER_S` (`10:40`, `10ms:40MB/s`).
    fn from_str(s: &str) -> Result<Disk, String> {
        match s.trim() {
            "1991" => return Ok(Disk::y1991()),
            "1999" => return Ok(Disk::y1999()),
            "2003" => return Ok(Disk::y2003()),
            _ => {}
        }
        let bad = || {
            format!("disk '{s}': expected 1991, 1999, 2003 or POSITIONING_MS:MB_PER_S (e.g. 8:120)")
        };
        let (pos, rate) = s.split_once(':').ok_or_else(bad)?;
        let pos = pos.trim().trim_end_matches("ms");
        let rate = rate
            .trim()
            .trim_end_matches("MB/s")
            .trim_end_matches("mb/s");
        let pos: f64 = pos.trim().parse().map_err(|_| bad())?;
        let rate: f64 = rate.trim().parse().map_err(|_| bad())?;
        if !(pos.is_finite() && pos >= 0.0 && rate.is_finite() && rate > 0.0) {
            return Err(format!(
                "disk '{s}': positioning must be >= 0 ms and the rate > 0 MB/s"
            ));
        }
        Ok(Disk::new("custom", pos, rate))
    }
}

impl fmt::Display for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} ms, {} MB/s)",
            self.name, self.positioning_ms, self.transfer_mb_per_s
        )
    }
}

/// A disk layout HyLog compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Update in place: one positioned I/O per page.
    Overwrite,
    /// Log-structured: segments written sequentially, plus cleaning.
    Lfs,
    /// Hot pages logged, cold pages updated in place.
    Hylog,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Overwrite, Layout::Lfs, Layout::Hylog];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Overwrite => "overwrite",
            Layout::Lfs => "lfs",
            Layout::Hylog => "hylog",
        }
    }
}

impl FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> Result<Layout, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "overwrite" | "in-place" => Ok(Layout::Overwrite),
            "lfs" | "log" => Ok(Layout::Lfs),
            "hylog" => Ok(Layout::Hylog),
            _ => Err(format!("layout '{s}': expected overwrite, lfs or hylog")),
        }
    }
}

/// The analytical relation between cleaning and disk utilization, `U = (u - 1) / ln u`
/// and its inverse: the core's, which the live hylog policy uses too.
pub use lsvd_core::hylog::{cleaning_utilization, disk_utilization};

/// HyLog's choice at one utilization.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HylogChoice {
    /// Fraction of pages logged.
    pub hot_fraction: f64,
    /// Utilization of the log partition (the hot pages plus all free space).
    pub hot_disk_utilization: f64,
    /// Cleaning utilization in the log partition.
    pub hot_cleaning_utilization: f64,
    /// Expected time per page write, ms.
    pub page_ms: f64,
}

/// A disk with a page and segment size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    pub disk: Disk,
    pub page_bytes: u64,
    pub segment_bytes: u64,
}

/// Steps of the hot-fraction search in [`Model::hylog_best`].
const HOT_FRACTION_STEPS: u32 = 1000;

impl Model {
    /// Pages per segment.
    pub fn pages_per_segment(&self) -> f64 {
        self.segment_bytes as f64 / self.page_bytes.max(1) as f64
    }

    /// Overwrite: one positioned page I/O, ms.
    pub fn overwrite_page_ms(&self) -> f64 {
        self.disk.io_ms(self.page_bytes)
    }

    /// One positioned segment I/O, ms.
    pub fn segment_io_ms(&self) -> f64 {
        self.disk.io_ms(self.segment_bytes)
    }

    /// Segment I/O efficiency: time to write a segment's pages in place over the time
    /// to write the segment.
    pub fn segment_efficiency(&self) -> f64 {
        self.pages_per_segment() * self.overwrite_page_ms() / self.segment_io_ms()
    }

    /// LFS time per page write at cleaning utilization `u`, ms (infinite at `u = 1`).
    pub fn lfs_page_ms(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        if u >= 1.0 {
            return f64::INFINITY;
        }
        2.0 / (1.0 - u) * self.segment_io_ms() / self.pages_per_segment()
    }

    /// HyLog time per page write with hot fraction `h` at disk utilization `disk_u`,
    /// uniform updates (the hot pages get the share `h` of the writes), ms.
    pub fn hylog_page_ms(&self, disk_u: f64, h: f64) -> HylogChoice {
        let h = h.clamp(0.0, 1.0);
        let disk_u = disk_u.clamp(0.0, 1.0);
        let live = h * disk_u;
        let hot_disk_u = if live > 0.0 {
            live / (live + 1.0 - disk_u)
        } else {
            0.0
        };
        let hot_u = cleaning_utilization(hot_disk_u);
        let page_ms = if h == 0.0 {
            self.overwrite_page_ms()
        } else if h == 1.0 {
            self.lfs_page_ms(hot_u)
        } else {
            h * self.lfs_page_ms(hot_u) + (1.0 - h) * self.overwrite_page_ms()
        };
        HylogChoice {
            hot_fraction: h,
            hot_disk_utilization: hot_disk_u,
            hot_cleaning_utilization: hot_u,
            page_ms,
        }
    }

    /// The hot fraction that minimizes the HyLog write cost at `disk_u` (a search
    /// over 0, 0.001, ..., 1; ties go to the smaller fraction).
    pub fn hylog_best(&self, disk_u: f64) -> HylogChoice {
        let mut best = self.hylog_page_ms(disk_u, 0.0);
        for i in 1..=HOT_FRACTION_STEPS {
            let c = self.hylog_page_ms(disk_u, f64::from(i) / f64::from(HOT_FRACTION_STEPS));
            if c.page_ms < best.page_ms {
                best = c;
            }
        }
        best
    }

    /// The cleaning utilization at which LFS stops beating overwrite, `1 - 2/E`
    /// (`None` if LFS never wins, `E <= 2`).
    pub fn crossover_cleaning_utilization(&self) -> Option<f64> {
        let e = self.segment_efficiency();
        (e > 2.0).then(|| 1.0 - 2.0 / e)
    }

    /// The crossover as (cleaning utilization, disk utilization).
    pub fn crossover(&self) -> Option<(f64, f64)> {
        self.crossover_cleaning_utilization()
            .map(|u| (u, disk_utilization(u)))
    }

    /// Page writes per second of `layout` at disk utilization `disk_u`, given the
    /// LFS cleaning utilization there.
    pub fn throughput(&self, layout: Layout, disk_u: f64, cleaning_u: f64) -> f64 {
        let ms = match layout {
            Layout::Overwrite => self.overwrite_page_ms(),
            Layout::Lfs => self.lfs_page_ms(cleaning_u),
            Layout::Hylog => self.hylog_best(disk_u).page_ms,
        };
        if ms.is_finite() && ms > 0.0 {
            1e3 / ms
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests;
