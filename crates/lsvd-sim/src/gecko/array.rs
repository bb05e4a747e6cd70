//! The drives under a layout, optionally mirrored (`--layout chain:3x2`,
//! `stripe:3x2`): the layout places log addresses on N positions; with mirroring each
//! position is a pair of drives holding the same data.
//!
//! Gecko runs a mirrored chain (each chain position a pair of disks) against a log on
//! mirrored RAID-0 (RAID-10). Here a write to a position goes to both of its drives
//! and completes when both have it; a read goes to the drive of the pair whose queue
//! drains first (the less busy one). Without mirroring a position is one drive.

use super::device::{Device, DeviceModel, Op};

/// The drives: position `p`, copy `k` is drive `p · copies + k`.
#[derive(Debug, Clone)]
pub struct Array {
    copies: usize,
    drives: Vec<Device>,
}

impl Array {
    /// `positions` positions of `copies` (1 or 2) drives each.
    pub fn new(model: &DeviceModel, positions: u32, copies: u32, drive_bytes: u64) -> Array {
        let copies = copies.max(1) as usize;
        Array {
            copies,
            drives: (0..positions as usize * copies)
                .map(|_| Device::new(model.clone(), drive_bytes))
                .collect(),
        }
    }

    /// Queues `bytes` at `offset` of position `position`; returns when it completes.
    pub fn submit(&mut self, now_ns: u64, op: Op, position: u32, offset: u64, bytes: u64) -> u64 {
        let first = position as usize * self.copies;
        let Some(pair) = self.drives.get_mut(first..first + self.copies) else {
            return now_ns;
        };
        match op {
            Op::Write => pair
                .iter_mut()
                .map(|d| d.submit(now_ns, op, offset, bytes))
                .fold(now_ns, u64::max),
            Op::Read => pair
                .iter_mut()
                .min_by_key(|d| d.idle_at_ns())
                .map_or(now_ns, |d| d.submit(now_ns, op, offset, bytes)),
        }
    }

    /// Per drive (in drive order): service time / `end_ns`.
    pub fn busy_fractions(&self, end_ns: u64) -> Vec<f64> {
        self.drives
            .iter()
            .map(|d| {
                if end_ns == 0 {
                    0.0
                } else {
                    d.busy_ns() as f64 / end_ns as f64
                }
            })
            .collect()
    }
}
