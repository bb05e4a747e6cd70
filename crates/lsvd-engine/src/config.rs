//! Tunables of a running volume, with their defaults.

use lsvd_core::pipeline::PipelineConfig;
pub use lsvd_core::recovery::RecoveryMode;

use lsvd_store::clock::SharedClock;

/// Engine settings. Defaults suit a VM disk on a local SSD.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Client bytes per object before it is closed. Default: 8 MiB.
    pub batch_size_bytes: u64,
    /// A non-empty batch is closed after this long even if not full. Default: 2000 ms.
    pub batch_timeout_ms: u64,
    /// Object uploads in flight at once. Default: 4. Minimum: 1.
    pub uploads_in_flight: usize,
    /// Size of the write-log file, made on first start. Default: 1 GiB. Minimum: 16 MiB.
    pub log_size_bytes: u64,
    /// Most client bytes grouped into one log record. Default: 4 MiB.
    pub group_commit_max_bytes: u64,
    /// Log writes issued at once (overlapped, their callers answered in log order).
    /// Default: 1. Minimum: 1. `lsvd probe` measures what the device rewards.
    pub log_writes_in_flight: usize,
    /// Write a checkpoint after this many objects. Default: 64.
    pub checkpoint_every_objects: u64,
    /// Also write a checkpoint when objects were written and this long has passed
    /// since the last one. Default: 300000 (5 minutes).
    pub checkpoint_interval_ms: u64,
    /// Accept a shorter prefix than the cache promises (operator override).
    pub recovery_mode: RecoveryMode,
    /// Garbage collection thresholds and policy (default: start below 70% live,
    /// stop above 75%, greedy, 32 MiB per pass).
    pub gc: lsvd_core::gc::GcConfig,
    /// Size of the read-cache file (0 disables it). Default: 1 GiB.
    pub read_cache_bytes: u64,
    /// One read cache shared by every volume opened with it (`lsvd serve` opens one
    /// per process, `read_cache_bytes` big): chunks are keyed by the object's owner,
    /// so a clone hits its base's cached data. None (the default): each volume opens
    /// a cache of its own, `<volume>.rcache`. A volume whose local files are
    /// encrypted ([`local_keys`](Self::local_keys)) always keeps its own.
    pub host_read_cache: Option<std::sync::Arc<crate::read::cache::HostReadCache>>,
    /// Bytes fetched from the store by one read miss (whole read-cache chunks, at least
    /// one). Default: 64 KiB. `lsvd probe --store` measures what the store rewards.
    pub read_fetch_bytes: u64,
    /// How new objects (client data, GC's relocations, checkpoints) store their chunks:
    /// raw (format version 4) or compressed where that saves space (version 5).
    /// Objects already written keep theirs until GC rewrites them. `None` (the
    /// default): what the volume's settings in the store say (`lsvd create
    /// --compression`, `lsvd config`), no compression without settings; `Some`:
    /// this, whatever they say (`lsvd serve --compression`).
    pub compression: Option<lsvd_core::compression::Compression>,
    /// The mode of the write log and read cache: `Some(true)` encrypted (`lsvd serve
    /// --encrypt-local`; needs [`local_keys`](Self::local_keys)), `Some(false)` in
    /// the clear (`lsvd serve` without it). Files in the other mode are made anew if
    /// they were closed cleanly, else keep theirs until a clean stop. `None` (other
    /// commands, the default): files keep their mode; new ones are in the clear
    /// (`crate::local_encryption`).
    pub encrypt_local: Option<bool>,
    /// The keys of this volume's local files: an encrypted volume's, derived from its
    /// data key (`lifecycle::encryption::local_keys`); None for a plain volume.
    pub local_keys: Option<std::sync::Arc<lsvd_store::xts::LocalKeys>>,
    /// Most bytes fetched ahead of a sequential reader, and in flight for read-ahead
    /// at once. None (the default): 4 MiB when the store is remote, none when it is
    /// local (its objects are on local disk already). `Some(0)` disables it.
    pub read_ahead_bytes: Option<u64>,
    /// Copy uploaded objects' data into the read cache. Default: `Auto` (when the store
    /// is remote).
    pub read_cache_admit: Admission,
    /// GC moves at most this many bytes per second, or four times the rate clients
    /// write (times the share of the GC headroom used) if that is more, and unpaced
    /// while clients are idle (`engine::gc::Pacer`); 0: always unpaced. Default:
    /// 16 MiB/s.
    pub gc_min_rate_bytes: u64,
    /// How far the store may grow past live/`gc.start_utilization` before client
    /// objects wait for GC (`PipelineConfig::gc_headroom_bytes`); within it GC's pace
    /// follows how much of it is used (`crate::maintenance::gc::Pacer`). `None`
    /// (`lsvd serve`'s default, `--gc-headroom auto`): [`gc_headroom_for_log`] of the
    /// write log's size; `Some(0)` (this struct's default, which the engine's tests are
    /// written for): none, no GC pass starts while more than `GC_MAX_BACKLOG_OBJECTS`
    /// wait for upload.
    pub gc_headroom_bytes: Option<u64>,
    /// Write-log records kept in memory after they are written, so the upload takes
    /// them from there instead of reading them back from the log
    /// (`engine::recent_records`). Default: 32 MiB (four default batches); 0 reads
    /// every record back (and verifies it).
    pub upload_memory_bytes: u64,
    /// Uploaded records stay in the write log, and reads of their data are served from
    /// there (no GET, no read-cache slot), until the log's free space falls below this;
    /// then the oldest uploaded ones are freed (the LSVD paper's write cache, which
    /// keeps data after write-back). None (the default): a quarter of the log, at least
    /// [`MIN_LOG_FREE_TARGET_BYTES`]. `Some(u64::MAX)`: free every record once it is
    /// uploaded.
    pub log_free_target_bytes: Option<u64>,
    /// Every timer of the engine runs on this clock. Default: the system clock; tests
    /// use `clock::ManualClock`.
    pub clock: SharedClock,
    /// Seed of the upload retries' jitter. Default: None, a random seed per open.
    pub jitter_seed: Option<u64>,
    /// The volume's lease: how long it holds, what to do about another holder, who
    /// this process is (`engine::lease`). Default: no lease (the engine API claims at
    /// once and renews nothing; `lsvd serve` and the commands take one).
    pub lease: crate::fencing::lease_config::LeaseConfig,
    /// How long a request may wait for what it needs (a renewed lease, room in the
    /// write log) before it fails instead. Default: 30000 (30 s).
    pub stall_timeout_ms: u64,
    /// Discard a write log whose records a superseded session acknowledged (another
    /// process claimed the volume since) instead of refusing to open. Default: false.
    pub discard_superseded_log: bool,
    /// Keep what a replication pass registered in the source store still needs
    /// (`engine::replica_hold`) for at most this long after the pass began; 0 keeps
    /// nothing for replicas. Default: [`DEFAULT_REPLICA_HOLD_MS`] (1 hour).
    pub replica_hold_ms: u64,
    /// Delete what replication passes keep once it comes to more than this many
    /// bytes. Default: [`DEFAULT_REPLICA_HOLD_MAX_BYTES`] (16 GiB).
    pub replica_hold_max_bytes: u64,
}

/// Default of [`EngineConfig::replica_hold_ms`]: a pass that has not finished within
/// an hour is probably dead, and one that is alive starts again from a newer
/// checkpoint, keeping what it copied.
pub const DEFAULT_REPLICA_HOLD_MS: u64 = 3_600_000;

/// Default of [`EngineConfig::replica_hold_max_bytes`].
pub const DEFAULT_REPLICA_HOLD_MAX_BYTES: u64 = 16 << 30;

/// Default of [`EngineConfig::stall_timeout_ms`].
pub const DEFAULT_STALL_TIMEOUT_MS: u64 = 30_000;

pub use lsvd_core::pipeline::GC_MAX_BACKLOG_OBJECTS;

impl EngineConfig {
    /// The compression new objects are written with (after open has resolved
    /// [`compression`](Self::compression) from the volume's settings).
    pub fn compression(&self) -> lsvd_core::compression::Compression {
        self.compression.unwrap_or_default()
    }

    /// The upload pipeline's settings.
    pub fn pipeline_config(&self) -> PipelineConfig {
        PipelineConfig {
            batch_size_bytes: self.batch_size_bytes,
            batch_timeout_ns: Some(self.batch_timeout_ms.saturating_mul(1_000_000)),
            checkpoint_every_objects: self.checkpoint_every_objects,
            checkpoint_interval_ns: Some(self.checkpoint_interval_ms.saturating_mul(1_000_000)),
            uploads_in_flight: self.uploads_in_flight,
            gc: self.gc,
            gc_max_backlog: GC_MAX_BACKLOG_OBJECTS,
            gc_headroom_bytes: self.effective_gc_headroom_bytes(),
        }
    }

    /// The GC headroom this configuration gives: its own, or the default for its log.
    pub fn effective_gc_headroom_bytes(&self) -> u64 {
        self.gc_headroom_bytes
            .unwrap_or_else(|| gc_headroom_for_log(self.log_size_bytes))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            batch_size_bytes: 8 << 20,
            batch_timeout_ms: 2000,
            uploads_in_flight: 4,
            log_size_bytes: 1 << 30,
            group_commit_max_bytes: 4 << 20,
            log_writes_in_flight: 1,
            checkpoint_every_objects: 64,
            checkpoint_interval_ms: 300_000,
            recovery_mode: RecoveryMode::Strict,
            gc: lsvd_core::gc::GcConfig::default(),
            read_cache_bytes: 1 << 30,
            read_fetch_bytes: 64 << 10,
            compression: None,
            encrypt_local: None,
            local_keys: None,
            host_read_cache: None,
            read_ahead_bytes: None,
            read_cache_admit: Admission::Auto,
            gc_min_rate_bytes: 16 << 20,
            gc_headroom_bytes: Some(0),
            upload_memory_bytes: upload_memory_for_batch(8 << 20),
            log_free_target_bytes: None,
            clock: SharedClock::default(),
            jitter_seed: None,
            lease: Default::default(),
            stall_timeout_ms: DEFAULT_STALL_TIMEOUT_MS,
            discard_superseded_log: false,
            replica_hold_ms: DEFAULT_REPLICA_HOLD_MS,
            replica_hold_max_bytes: DEFAULT_REPLICA_HOLD_MAX_BYTES,
        }
    }
}

/// The default GC headroom (`EngineConfig::gc_headroom_bytes`, `--gc-headroom auto`)
/// for a write log of `log_size_bytes`: a quarter of it.
pub fn gc_headroom_for_log(log_size_bytes: u64) -> u64 {
    log_size_bytes / 4
}

/// The default of `EngineConfig::upload_memory_bytes` (`--upload-memory auto`) for
/// batches of `batch_size_bytes`: four batches.
pub fn upload_memory_for_batch(batch_size_bytes: u64) -> u64 {
    batch_size_bytes.saturating_mul(4)
}

/// Least free space the write log keeps by default (`log_free_target_bytes`): room
/// for a few group commits of the largest size, so the writer seldom waits while
/// uploaded records are freed. A log of this size or less keeps no uploaded records.
pub const MIN_LOG_FREE_TARGET_BYTES: u64 = 64 << 20;

impl EngineConfig {
    /// Free space the write log keeps for a log of `capacity_bytes`
    /// (`log_free_target_bytes`).
    pub fn log_free_target_for(&self, capacity_bytes: u64) -> u64 {
        self.log_free_target_bytes
            .unwrap_or((capacity_bytes / 4).max(MIN_LOG_FREE_TARGET_BYTES))
    }
}

/// Read-ahead when the store is remote and `EngineConfig::read_ahead_bytes` is None.
pub const DEFAULT_READ_AHEAD_BYTES: u64 = 4 << 20;

pub const MIN_LOG_SIZE_BYTES: u64 = 16 << 20;

/// Whether uploaded data is admitted to the read cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// When the store is remote (S3): reads of recently written data then need no GET.
    /// A local store is read from the local disk anyway.
    Auto,
    Always,
    Never,
}

impl Admission {
    /// Does this setting admit uploads, to a store that asks for it
    /// (`ObjectStore::admit_uploads_to_cache`: remote stores, the chain) or not?
    pub fn admits(self, store_asks: bool) -> bool {
        match self {
            Admission::Auto => store_asks,
            Admission::Always => true,
            Admission::Never => false,
        }
    }
}

impl std::str::FromStr for Admission {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Admission::Auto),
            "always" => Ok(Admission::Always),
            "never" => Ok(Admission::Never),
            _ => Err(format!(
                "unknown read-cache admission '{s}' (use auto, always or never)"
            )),
        }
    }
}
