//! The soak's clients: 16 NBD connections of mixed reads, writes, flushes and trims,
//! every answer checked against the [`Oracle`], and the connections that misbehave on
//! purpose (hang up halfway through a WRITE payload, or right after a request).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lsvd_nbd::client::{Client, Target};
use lsvd_nbd::proto::consts::{CMD_FLUSH, CMD_READ, CMD_WRITE};
use lsvd_nbd::proto::handshake::{GREETING_LEN, encode_export_name_opening, parse_greeting};
use lsvd_nbd::proto::transmission::{Command, RequestHeader};

use super::oracle::{BLOCK, Oracle, POISON, pattern};
use crate::rng::Rng;

/// Connections of the workload.
pub const CONNECTIONS: u64 = 16;
/// Each writer owns runs of this many blocks (run `r` belongs to `r % CONNECTIONS`).
pub const RUN_BLOCKS: u64 = 16;

#[derive(Default)]
pub struct Counters {
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub blocks_checked: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    /// Reads that failed while the store was away (allowed; counted).
    pub read_errors_store_away: AtomicU64,
}

/// What the workers share with the test.
pub struct Shared {
    pub oracle: Arc<Oracle>,
    pub counters: Counters,
    pub stop: AtomicBool,
    /// Set while the store is down and for a while after it is back: reads of data
    /// that is only in the store may fail then.
    pub store_away: AtomicBool,
    pub failures: Mutex<Vec<String>>,
    /// Blocks `0..zone` are the workload's.
    pub zone: u64,
}

impl Shared {
    pub fn fail(&self, msg: String) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < 20 {
            f.push(msg);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn failed(&self) -> bool {
        !self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// Read `n` blocks from `first` and check each against the oracle.
pub async fn read_check(
    c: &Client,
    oracle: &Oracle,
    first: u64,
    n: u64,
) -> Result<Result<(), String>, std::io::Error> {
    let lo: Vec<u32> = (first..first + n).map(|b| oracle.acked(b)).collect();
    let data = c.read(first * BLOCK, (n * BLOCK) as u32).await?;
    for (i, b) in (first..first + n).enumerate() {
        let hi = oracle.issued(b);
        let block = &data[i * BLOCK as usize..(i + 1) * BLOCK as usize];
        if let Err(e) = oracle.check(b, block, lo[i], hi) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// One workload connection until `shared.stop`.
pub async fn worker(target: Target, id: u64, mut rng: Rng, shared: Arc<Shared>) {
    let c = match Client::connect(&target).await {
        Ok(c) => c,
        Err(e) => return shared.fail(format!("worker {id}: connect: {e}")),
    };
    let oracle = &shared.oracle;
    let k = &shared.counters;
    let runs = shared.zone / RUN_BLOCKS;
    let my_runs: Vec<u64> = (0..runs).filter(|r| r % CONNECTIONS == id).collect();
    // Writes acknowledged since the last FLUSH this connection started.
    let mut unflushed: Vec<(u64, u32)> = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let roll = rng.below(100);
        let run = *rng.pick(&my_runs);
        let start = run * RUN_BLOCKS + rng.below(RUN_BLOCKS);
        let room = run * RUN_BLOCKS + RUN_BLOCKS - start;
        let n = rng.range(1, room.min(8));
        if roll < 45 {
            let fua = rng.chance(0.05);
            let (data, versions) = oracle.begin_write(start, n, false);
            if let Err(e) = c.write(start * BLOCK, &data, fua).await {
                return shared.fail(format!(
                    "worker {id}: WRITE of {n} blocks at block {start} failed: {e}"
                ));
            }
            oracle.ack_write(start, &versions, fua);
            unflushed.extend((start..).zip(versions.iter().copied()));
            k.writes.fetch_add(1, Ordering::Relaxed);
            k.write_bytes.fetch_add(n * BLOCK, Ordering::Relaxed);
            if fua {
                k.fua_writes.fetch_add(1, Ordering::Relaxed);
            }
        } else if roll < 85 {
            // Any blocks of the workload, also those other connections write.
            let n = rng.range(1, 16);
            let first = rng.below(shared.zone - n);
            let away_at_start = shared.store_away.load(Ordering::SeqCst);
            match read_check(&c, oracle, first, n).await {
                Ok(Ok(())) => {
                    k.reads.fetch_add(1, Ordering::Relaxed);
                    k.read_bytes.fetch_add(n * BLOCK, Ordering::Relaxed);
                    k.blocks_checked.fetch_add(n, Ordering::Relaxed);
                }
                Ok(Err(e)) => return shared.fail(format!("worker {id}: READ: {e}")),
                Err(_) if away_at_start || shared.store_away.load(Ordering::SeqCst) => {
                    k.read_errors_store_away.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    return shared.fail(format!(
                        "worker {id}: READ of {n} blocks at block {first} failed with the \
                         store up: {e}"
                    ));
                }
            }
        } else if roll < 93 {
            let covered = std::mem::take(&mut unflushed);
            if let Err(e) = c.flush().await {
                return shared.fail(format!("worker {id}: FLUSH failed: {e}"));
            }
            for (b, v) in covered {
                oracle.mark_durable(b, v);
            }
            k.flushes.fetch_add(1, Ordering::Relaxed);
        } else {
            let (_, versions) = oracle.begin_write(start, n, true);
            if let Err(e) = c.trim(start * BLOCK, (n * BLOCK) as u32).await {
                return shared.fail(format!(
                    "worker {id}: TRIM of {n} blocks at block {start} failed: {e}"
                ));
            }
            oracle.ack_write(start, &versions, false);
            unflushed.extend((start..).zip(versions.iter().copied()));
            k.trims.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Ways a client hangs up on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hangup {
    /// WRITE header and half its payload, then close: must never be executed.
    HalfWrite,
    /// A whole WRITE, then close without reading the reply: may or may not land.
    WriteNoReply,
    /// A 1 MiB READ, then close without reading the reply.
    ReadNoReply,
    /// A FLUSH, then close without reading the reply.
    FlushNoReply,
}

/// A raw connection through the handshake (`NBD_OPT_EXPORT_NAME`, no zero padding).
fn handshake(socket: &Path, export: &str) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut greeting = [0u8; GREETING_LEN];
    s.read_exact(&mut greeting)?;
    parse_greeting(&greeting).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    let out = encode_export_name_opening(export);
    s.write_all(&out)?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply)?;
    Ok(s)
}

fn header(command: u16, offset: u64, length: u32) -> [u8; 28] {
    RequestHeader {
        flags: 0,
        command: Command::from_u16(command),
        cookie: 7,
        offset,
        length,
    }
    .encode()
}

/// Hang up as `kind` says. Writes go to fresh blocks `first..first + n` of the fault
/// zone (never written by anyone else), so the oracle can hold every outcome.
pub fn drop_connection(
    socket: &Path,
    export: &str,
    oracle: &Oracle,
    kind: Hangup,
    first: u64,
    n: u64,
    read_at: u64,
) -> std::io::Result<()> {
    let mut s = handshake(socket, export)?;
    match kind {
        Hangup::HalfWrite => {
            let mut data = Vec::new();
            for b in first..first + n {
                data.extend_from_slice(&pattern(oracle.seed(), b, POISON));
            }
            s.write_all(&header(CMD_WRITE, first * BLOCK, data.len() as u32))?;
            s.write_all(&data[..data.len() / 2])?;
        }
        Hangup::WriteNoReply => {
            // Issued, never acknowledged: both the old and the new contents stay
            // acceptable.
            let (data, _) = oracle.begin_write(first, n, false);
            s.write_all(&header(CMD_WRITE, first * BLOCK, data.len() as u32))?;
            s.write_all(&data)?;
        }
        Hangup::ReadNoReply => s.write_all(&header(CMD_READ, read_at * BLOCK, 1 << 20))?,
        Hangup::FlushNoReply => s.write_all(&header(CMD_FLUSH, 0, 0))?,
    }
    // Close at once: a reset, not a polite NBD_CMD_DISC.
    drop(s);
    Ok(())
}
