//! The NBD server over lsvd's own adapter: the `nbd_session` script against
//! `lsvd::nbd_device::NbdVolume` on a real engine `Volume`.
//!
//! Why a target of its own: `nbd_session` drives the protocol crate against an
//! in-memory reference device, so the code between the protocol and the engine (how
//! CACHE, NO_HOLE zeroing and BLOCK_STATUS are served in bounded pieces, the started
//! and task paths of writes, trims and flushes, the errors the engine maps to errnos)
//! would be fuzzed by nothing. Here every input gets a fresh volume: created in an
//! in-memory store (`mem://`), opened on an in-memory write log ([`MemLog`]) with
//! small settings, on a single-threaded runtime; the same script
//! then runs against it (both export names lead to this one volume), with the same
//! strict client checks: every reply well-formed, data read back equal to a shadow
//! copy, nothing past the end succeeding, BLOCK_STATUS never calling written data
//! zero. After the session:
//! - unless raw bytes went out (requests the shadow cannot know of), the whole volume
//!   read through the engine equals the shadow;
//! - the volume shuts down cleanly (drain, upload, checkpoint).
//!
//! The script's first bytes are read as `nbd_session` reads them (export sizes, block
//! sizes) so the two targets' seeds fit both; here they choose the volume's size, a
//! multiple of 4 KiB up to 4 MiB (so CACHE and NO_HOLE zeroing take several 1 MiB
//! pieces), and the block sizes are lsvd's own (512 B minimum, 2 MiB maximum with this
//! write log).

use std::io;
use std::sync::{Arc, Mutex};

use lsvd::nbd_device::NbdVolume;
use lsvd_engine::cache_dev::CacheDevice;
use lsvd_engine::{EngineConfig, create_volume, open_volume_on};
use lsvd_nbd::Export;

use crate::bytes::Bytes;
use crate::nbd_session::{Guarded, block_sizes, drive};

/// The write log: the engine's smallest.
const LOG_BYTES: u64 = lsvd_engine::MIN_LOG_SIZE_BYTES;

/// A write log in memory: the engine's cache device without a file (and without the
/// power-failure bookkeeping of lsvd's `FaultyCache`, which copies the whole device).
struct MemLog(Mutex<Vec<u8>>);

impl MemLog {
    fn range(len: usize, offset: u64, size: usize) -> io::Result<std::ops::Range<usize>> {
        usize::try_from(offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(len)?))
            .filter(|r| r.end <= size)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "past the write log"))
    }
}

impl CacheDevice for MemLog {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let log = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        let r = Self::range(buf.len(), offset, log.len())?;
        buf.copy_from_slice(&log[r]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut log = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        let r = Self::range(buf.len(), offset, log.len())?;
        log[r].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        LOG_BYTES
    }
}

/// Target `nbd_volume`.
pub fn volume(data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(data));
}

fn config() -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        // Batches close when full or at shutdown, not on a timer: the same input takes
        // the same path however long it runs.
        batch_timeout_ms: 600_000,
        log_size_bytes: LOG_BYTES,
        read_cache_bytes: 0,
        upload_memory_bytes: 1 << 20,
        // No randomness between runs of one input.
        jitter_seed: Some(1),
        ..EngineConfig::default()
    }
}

async fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    // As nbd_session: two export sizes, then block sizes (ignored here).
    let size = 4096 * u64::from(1 + b.below(64 << 10) % 1024);
    let _ = b.below(8 << 10);
    let _ = block_sizes(&mut b);

    let store = lsvd_store::open_store("mem://").expect("mem store");
    create_volume(&store, "disk", size)
        .await
        .expect("create volume");
    let cache: Arc<dyn CacheDevice> = Arc::new(MemLog(Mutex::new(vec![0; LOG_BYTES as usize])));
    let (volume, _) = open_volume_on(store, "disk", cache, "fuzz", config())
        .await
        .expect("open volume");
    let device = Arc::new(Guarded {
        inner: NbdVolume::new(Arc::clone(&volume), LOG_BYTES),
        size,
    });
    let exports = vec![
        Export {
            name: "disk".into(),
            description: "fuzzed lsvd volume".into(),
            device: Arc::clone(&device),
        },
        Export {
            name: "other".into(),
            description: String::new(),
            device,
        },
    ];
    let attached = drive(exports, [size, size], &mut b).await;
    if let Some(att) = attached.filter(|a| !a.raw_sent) {
        let got = volume.read(0, size).await.expect("read the whole volume");
        if let Some(at) = got.iter().zip(&att.shadow).position(|(g, w)| g != w) {
            panic!("after the session the volume differs from what the client wrote at byte {at}");
        }
    }
    volume.shutdown().await.expect("clean shutdown");
}
