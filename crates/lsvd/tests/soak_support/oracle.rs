//! The soak's oracle: for every 4 KiB block, which contents a read may return.
//!
//! Each block has its own version counter. A write of block `b` at version `v` writes
//! [`pattern`]`(seed, b, v)`: the block number and version in the first 16 bytes, then
//! bytes derived from both, so a read names the write it came from and a torn,
//! misdirected or corrupt block is told apart from an old one. A trim is a version too
//! (its contents are zeros); version 0 is "never written" (zeros).
//!
//! Writers own disjoint runs of blocks, so the versions of one block are issued in
//! order by one task and each is acknowledged before the next is issued. Then:
//!
//! - a read that starts after version `a` was acknowledged and ends before version
//!   `i + 1` is issued must return a version in `a..=i` (the last acknowledged write,
//!   or one in flight, never an older one);
//! - after a completed FLUSH (or a FUA write) the version acknowledged before it is
//!   *durable*: after a crash with the cache intact the block holds a version in
//!   `durable..=issued`.
//!
//! Writes whose outcome is unknown (sent on a connection that was then dropped) are
//! issued and never acknowledged: they stay acceptable until a later write of the block
//! is acknowledged. A write cut off in the middle of its payload must never be seen:
//! its payload carries [`POISON`] as its version.

use std::sync::Mutex;

pub const BLOCK: u64 = 4096;
/// The version stamped in the payload of writes that are never completely sent.
pub const POISON: u32 = u32::MAX;

#[derive(Debug, Default, Clone)]
struct BlockState {
    issued: u32,
    acked: u32,
    durable: u32,
    /// Versions that were trims (read as zeros).
    trims: Vec<u32>,
}

pub struct Oracle {
    seed: u64,
    blocks: Vec<Mutex<BlockState>>,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The contents of block `block` at `version` (zeros for version 0).
pub fn pattern(seed: u64, block: u64, version: u32) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK as usize];
    if version == 0 {
        return out;
    }
    out[0..8].copy_from_slice(&block.to_le_bytes());
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out[12..16].copy_from_slice(&(seed as u32).to_le_bytes());
    let mut x = mix(seed ^ block.wrapping_mul(0x1000_0000_01b3) ^ u64::from(version) << 40);
    for chunk in out[16..].chunks_exact_mut(8) {
        x = mix(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    out
}

impl Oracle {
    pub fn new(seed: u64, blocks: u64) -> Oracle {
        Oracle {
            seed,
            blocks: (0..blocks)
                .map(|_| Mutex::new(BlockState::default()))
                .collect(),
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn state(&self, block: u64) -> std::sync::MutexGuard<'_, BlockState> {
        self.blocks[block as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Issue a write (or, with `trim`, a trim) of `n` blocks from `first`: returns the
    /// payload to send (empty for a trim) and the versions issued.
    pub fn begin_write(&self, first: u64, n: u64, trim: bool) -> (Vec<u8>, Vec<u32>) {
        let mut data = Vec::new();
        let mut versions = Vec::new();
        for b in first..first + n {
            let mut st = self.state(b);
            st.issued += 1;
            let v = st.issued;
            if trim {
                st.trims.push(v);
            } else {
                data.extend_from_slice(&pattern(self.seed, b, v));
            }
            versions.push(v);
        }
        (data, versions)
    }

    /// The write of `versions` from `first` was acknowledged (durable with `fua`).
    pub fn ack_write(&self, first: u64, versions: &[u32], fua: bool) {
        for (i, v) in versions.iter().enumerate() {
            let mut st = self.state(first + i as u64);
            st.acked = st.acked.max(*v);
            if fua {
                st.durable = st.durable.max(*v);
            }
        }
    }

    /// The version of `block` acknowledged so far.
    pub fn acked(&self, block: u64) -> u32 {
        self.state(block).acked
    }

    /// The newest version of `block` issued so far.
    pub fn issued(&self, block: u64) -> u32 {
        self.state(block).issued
    }

    /// A FLUSH that started after `(block, version)` was acknowledged completed.
    pub fn mark_durable(&self, block: u64, version: u32) {
        let mut st = self.state(block);
        st.durable = st.durable.max(version);
    }

    pub fn durable(&self, block: u64) -> u32 {
        self.state(block).durable
    }

    /// Check `data` read from `block`, given the versions `lo..=hi` acceptable; returns
    /// the version it holds.
    pub fn check(&self, block: u64, data: &[u8], lo: u32, hi: u32) -> Result<u32, String> {
        if data.len() != BLOCK as usize {
            return Err(format!("block {block}: read {} bytes", data.len()));
        }
        if data.iter().all(|&b| b == 0) {
            let st = self.state(block);
            if lo == 0 {
                return Ok(0);
            }
            return match st.trims.iter().rev().find(|t| (lo..=hi).contains(*t)) {
                Some(&t) => Ok(t),
                None => Err(format!(
                    "block {block}: reads as zeros, but versions {lo}..={hi} are acceptable \
                     and none of them is a trim (an acknowledged write was lost)"
                )),
            };
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&data[0..8]);
        let owner = u64::from_le_bytes(word);
        let mut v4 = [0u8; 4];
        v4.copy_from_slice(&data[8..12]);
        let version = u32::from_le_bytes(v4);
        if owner != block {
            return Err(format!(
                "block {block}: holds data stamped for block {owner} version {version} \
                 (misdirected or corrupt)"
            ));
        }
        if version == POISON {
            return Err(format!(
                "block {block}: holds the payload of a WRITE whose connection dropped halfway \
                 through its payload (must never be executed)"
            ));
        }
        if data != pattern(self.seed, block, version).as_slice() {
            return Err(format!(
                "block {block}: version {version} stamp but its bytes differ (torn or corrupt)"
            ));
        }
        if !(lo..=hi).contains(&version) {
            return Err(format!(
                "block {block}: version {version}, acceptable {lo}..={hi} ({})",
                if version < lo {
                    "an acknowledged write was lost"
                } else {
                    "a write that was never issued?"
                }
            ));
        }
        if self.state(block).trims.contains(&version) {
            return Err(format!(
                "block {block}: version {version} was a trim, reads data"
            ));
        }
        Ok(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_rejects_lost_torn_and_poisoned_blocks() {
        let o = Oracle::new(7, 4);
        let (data, v) = o.begin_write(1, 2, false);
        assert!(o.check(1, &data[..4096], o.acked(1), o.issued(1)).is_ok());
        o.ack_write(1, &v, false);
        // Zeros after an acknowledged write: lost.
        assert!(o.check(1, &[0u8; 4096], o.acked(1), o.issued(1)).is_err());
        // Torn: stamp right, bytes wrong.
        let mut torn = data[..4096].to_vec();
        torn[100] ^= 1;
        assert!(o.check(1, &torn, 1, 1).is_err());
        // Misdirected: block 2's data at block 1.
        assert!(o.check(1, &data[4096..], 1, 1).is_err());
        let mut poison = pattern(7, 3, POISON);
        poison[8..12].copy_from_slice(&POISON.to_le_bytes());
        assert!(o.check(3, &poison, 0, 0).is_err());
        // A trim makes zeros acceptable.
        let (_, t) = o.begin_write(1, 1, true);
        o.ack_write(1, &t, false);
        assert_eq!(o.check(1, &[0u8; 4096], o.acked(1), o.issued(1)), Ok(2));
    }
}
