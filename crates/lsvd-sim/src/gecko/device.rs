//! Device models for the chained-log simulator: each drive is a FIFO queue with a
//! service-time model, on a simulated clock in nanoseconds.
//!
//! * HDD: a request that starts where the previous one ended is sequential and costs
//!   its transfer only, `bytes / rate`. Any other request costs a seek, half a
//!   rotation on average (`30 / rpm` seconds) and the transfer. The seek is the
//!   average seek (`seek_ms`), or, with `short_seek_ms` and `full_seek_ms`, depends
//!   on the distance `d` over the drive's capacity `C`:
//!   `short + (full - short) · sqrt(d / C)`.
//! * SSD: the request's pages (`page` bytes each; a partial page costs a whole one)
//!   are spread over `channels` independent channels by page number
//!   (`page mod channels`); each page takes `read_us` or `program_us` on its channel,
//!   channels serve their pages in arrival order, and the request completes with its
//!   last page.
//!
//! Because every queue is FIFO, a request's completion time is known when it is
//! submitted: [`Device::submit`] returns it. The model is sans-I/O, deterministic and
//! every number can be recomputed by hand (`docs/sim/gecko.md`).

use serde::Serialize;

use lsvd_core::error::{Error, Result};
use lsvd_core::size::parse_size;

/// Nanoseconds per millisecond.
pub const NS_PER_MS: f64 = 1e6;

/// A hard disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hdd {
    /// Average seek, used when no distance model is given.
    pub seek_ms: f64,
    /// Distance-dependent seek: track-to-track (shortest) seek.
    pub short_seek_ms: Option<f64>,
    /// Distance-dependent seek: full-stroke seek.
    pub full_seek_ms: Option<f64>,
    pub rpm: f64,
    /// Media transfer rate, decimal MB per second.
    pub mb_per_s: f64,
}

/// A flash drive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ssd {
    pub page_bytes: u64,
    pub channels: u32,
    pub read_us: f64,
    pub program_us: f64,
}

/// What a drive is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum DeviceModel {
    Hdd(Hdd),
    Ssd(Ssd),
}

impl Default for Hdd {
    /// A 7200 rpm SATA disk: 8.5 ms average seek, 4.17 ms average rotational latency,
    /// 150 MB/s.
    fn default() -> Self {
        Hdd {
            seek_ms: 8.5,
            short_seek_ms: None,
            full_seek_ms: None,
            rpm: 7200.0,
            mb_per_s: 150.0,
        }
    }
}

impl Default for Ssd {
    /// A SATA SSD: 16 KiB pages, 8 channels, 50 us page read, 250 us page program
    /// (8 · 16 KiB / 250 us = 524 MB/s of large writes).
    fn default() -> Self {
        Ssd {
            page_bytes: 16 << 10,
            channels: 8,
            read_us: 50.0,
            program_us: 250.0,
        }
    }
}

impl std::fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceModel::Hdd(h) => {
                match (h.short_seek_ms, h.full_seek_ms) {
                    (Some(a), Some(b)) => write!(f, "hdd: seek {a}..{b} ms by distance")?,
                    _ => write!(f, "hdd: seek {} ms", h.seek_ms)?,
                }
                write!(
                    f,
                    ", {} rpm (half rotation {:.2} ms), {} MB/s",
                    h.rpm,
                    h.rotation_half_ns() / NS_PER_MS,
                    h.mb_per_s
                )
            }
            DeviceModel::Ssd(s) => write!(
                f,
                "ssd: {} KiB pages, {} channels, read {} us, program {} us per page",
                s.page_bytes >> 10,
                s.channels,
                s.read_us,
                s.program_us
            ),
        }
    }
}

fn number(key: &str, value: &str, min: f64, max: f64) -> Result<f64> {
    let v: f64 = value
        .trim()
        .parse()
        .map_err(|_| Error::bad_input(format!("--device: {key}='{value}' is not a number")))?;
    if !(v.is_finite() && v >= min && v <= max) {
        return Err(Error::bad_input(format!(
            "--device: {key}={value} must be between {min} and {max}"
        )));
    }
    Ok(v)
}

/// The `key=value` pairs after `hdd:` or `ssd:`.
fn pairs(rest: Option<&str>) -> Result<Vec<(&str, &str)>> {
    let Some(rest) = rest else {
        return Ok(Vec::new());
    };
    rest.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| Error::bad_input(format!("--device: '{p}' is not KEY=VALUE")))
        })
        .collect()
}

impl std::str::FromStr for DeviceModel {
    type Err = Error;

    /// `hdd[:seek_ms=8.5,rpm=7200,mb_per_s=150,short_seek_ms=1,full_seek_ms=16]` or
    /// `ssd[:page=16K,channels=8,read_us=50,program_us=250]`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (kind, rest) = match s.split_once(':') {
            Some((k, r)) => (k.trim(), Some(r)),
            None => (s, None),
        };
        let kv = pairs(rest)?;
        match kind {
            "hdd" => {
                let mut h = Hdd::default();
                for (k, v) in kv {
                    match k {
                        "seek_ms" => h.seek_ms = number(k, v, 0.0, 1000.0)?,
                        "short_seek_ms" => h.short_seek_ms = Some(number(k, v, 0.0, 1000.0)?),
                        "full_seek_ms" => h.full_seek_ms = Some(number(k, v, 0.0, 1000.0)?),
                        "rpm" => h.rpm = number(k, v, 1.0, 100_000.0)?,
                        "mb_per_s" => h.mb_per_s = number(k, v, 0.001, 1e6)?,
                        _ => {
                            return Err(Error::bad_input(format!(
                                "--device hdd: unknown key '{k}' (seek_ms, short_seek_ms, full_seek_ms, rpm, mb_per_s)"
                            )));
                        }
                    }
                }
                match (h.short_seek_ms, h.full_seek_ms) {
                    (None, None) => {}
                    (Some(a), Some(b)) if a <= b => {}
                    (Some(_), Some(_)) => {
                        return Err(Error::bad_input(
                            "--device hdd: short_seek_ms must not exceed full_seek_ms",
                        ));
                    }
                    _ => {
                        return Err(Error::bad_input(
                            "--device hdd: give both short_seek_ms and full_seek_ms (distance-dependent seek) or neither",
                        ));
                    }
                }
                Ok(DeviceModel::Hdd(h))
            }
            "ssd" => {
                let mut d = Ssd::default();
                for (k, v) in kv {
                    match k {
                        "page" => {
                            let b = parse_size(v).map_err(|e| e.context("--device ssd: page"))?;
                            if !(512..=(1 << 20)).contains(&b) {
                                return Err(Error::bad_input(format!(
                                    "--device ssd: page={v} must be between 512 bytes and 1M"
                                )));
                            }
                            d.page_bytes = b;
                        }
                        "channels" => d.channels = number(k, v, 1.0, 1024.0)? as u32,
                        "read_us" => d.read_us = number(k, v, 0.001, 1e6)?,
                        "program_us" => d.program_us = number(k, v, 0.001, 1e6)?,
                        _ => {
                            return Err(Error::bad_input(format!(
                                "--device ssd: unknown key '{k}' (page, channels, read_us, program_us)"
                            )));
                        }
                    }
                }
                Ok(DeviceModel::Ssd(d))
            }
            _ => Err(Error::bad_input(format!(
                "--device '{s}': expected hdd[:KEY=VALUE,...] or ssd[:KEY=VALUE,...]"
            ))),
        }
    }
}

impl Hdd {
    /// Half a rotation, in ns.
    pub fn rotation_half_ns(&self) -> f64 {
        30e9 / self.rpm
    }

    /// Transfer time of `bytes`, in ns.
    pub fn transfer_ns(&self, bytes: u64) -> f64 {
        bytes as f64 * 1e3 / self.mb_per_s
    }

    /// Seek time over `distance_bytes` on a drive of `capacity_bytes`, in ns.
    pub fn seek_ns(&self, distance_bytes: u64, capacity_bytes: u64) -> f64 {
        match (self.short_seek_ms, self.full_seek_ms) {
            (Some(short), Some(full)) => {
                let x = (distance_bytes as f64 / capacity_bytes.max(1) as f64).min(1.0);
                (short + (full - short) * x.sqrt()) * NS_PER_MS
            }
            _ => self.seek_ms * NS_PER_MS,
        }
    }
}

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One drive: its model and queue state.
#[derive(Debug, Clone)]
pub struct Device {
    model: DeviceModel,
    capacity_bytes: u64,
    /// HDD: when the queue drains, and where the last queued request ends.
    free_at_ns: u64,
    last_end: Option<u64>,
    /// SSD: when each channel drains.
    channel_free_ns: Vec<u64>,
    /// Sum of service times (for utilization).
    busy_ns: u64,
}

impl Device {
    pub fn new(model: DeviceModel, capacity_bytes: u64) -> Device {
        let channels = match &model {
            DeviceModel::Ssd(s) => s.channels.max(1) as usize,
            DeviceModel::Hdd(_) => 0,
        };
        Device {
            model,
            capacity_bytes,
            free_at_ns: 0,
            last_end: None,
            channel_free_ns: vec![0; channels],
            busy_ns: 0,
        }
    }

    /// Total service time so far.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// When everything queued so far is done (SSD: its last channel drains).
    pub fn idle_at_ns(&self) -> u64 {
        self.channel_free_ns
            .iter()
            .copied()
            .fold(self.free_at_ns, u64::max)
    }

    /// The HDD service time of a request at `offset` given where the previous one
    /// ended (`None`: the head position is unknown, so it is positioned).
    pub fn hdd_service_ns(
        h: &Hdd,
        capacity_bytes: u64,
        last_end: Option<u64>,
        offset: u64,
        bytes: u64,
    ) -> u64 {
        let transfer = h.transfer_ns(bytes);
        let t = if last_end == Some(offset) {
            transfer
        } else {
            let distance = last_end.map_or(capacity_bytes / 3, |e| e.abs_diff(offset));
            h.seek_ns(distance, capacity_bytes) + h.rotation_half_ns() + transfer
        };
        t.round() as u64
    }

    /// Queues a request submitted at `now_ns`; returns when it completes.
    pub fn submit(&mut self, now_ns: u64, op: Op, offset: u64, bytes: u64) -> u64 {
        match &self.model {
            DeviceModel::Hdd(h) => {
                let service =
                    Self::hdd_service_ns(h, self.capacity_bytes, self.last_end, offset, bytes);
                let start = now_ns.max(self.free_at_ns);
                self.free_at_ns = start + service;
                self.last_end = Some(offset + bytes);
                self.busy_ns += service;
                self.free_at_ns
            }
            DeviceModel::Ssd(s) => {
                let page = s.page_bytes.max(1);
                let per_page = match op {
                    Op::Read => s.read_us,
                    Op::Write => s.program_us,
                };
                let per_page_ns = (per_page * 1e3).round() as u64;
                let first = offset / page;
                let last = (offset + bytes.max(1) - 1) / page;
                let channels = self.channel_free_ns.len().max(1) as u64;
                let mut done = now_ns;
                for p in first..=last {
                    let c = (p % channels) as usize;
                    let Some(free) = self.channel_free_ns.get_mut(c) else {
                        continue;
                    };
                    let end = now_ns.max(*free) + per_page_ns;
                    *free = end;
                    done = done.max(end);
                    self.busy_ns += per_page_ns;
                }
                done
            }
        }
    }
}
