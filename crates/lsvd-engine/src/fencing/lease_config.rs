//! The lease settings of an open (`EngineConfig::lease`), apart from the lease itself.
//!
//! Why a module of its own: `config` holds every engine setting and must not depend on
//! the engine's running parts; `lease` (which does) re-exports these.

/// Default lease timeout of `lsvd serve` and the commands that change a volume.
pub const DEFAULT_LEASE_TIMEOUT_MS: u32 = 10_000;
/// How often a process waiting for a holder looks for a new generation.
pub const DEFAULT_LEASE_POLL_MS: u64 = 200;

/// What a process that opens a volume does about a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Takeover {
    /// Take the volume at once, whoever held it (no lease: tests and tools that own
    /// the store alone).
    #[default]
    Immediate,
    /// Refuse while a holder renews its lease; take over one whose lease lapsed.
    Refuse,
    /// Wait (a standby) until the holder lets go or its lease lapses.
    Wait,
}

/// The lease settings of an open (`EngineConfig::lease`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long this process may go without renewing before another may take the
    /// volume over; 0: no lease (nothing renewed, acknowledgements never held).
    /// Default 0 for the engine API; `lsvd serve` uses [`DEFAULT_LEASE_TIMEOUT_MS`].
    pub timeout_ms: u32,
    pub takeover: Takeover,
    /// Who this process is, for other processes' messages (host, pid, address).
    pub holder: String,
    /// How often a waiting process looks for the holder's renewals.
    pub poll_ms: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            timeout_ms: 0,
            takeover: Takeover::Immediate,
            holder: String::new(),
            poll_ms: DEFAULT_LEASE_POLL_MS,
        }
    }
}

impl LeaseConfig {
    /// The lease `lsvd serve` and the commands take: the default timeout, refusing
    /// a live holder, described as this host and process.
    pub fn for_command(what: &str) -> LeaseConfig {
        LeaseConfig {
            timeout_ms: DEFAULT_LEASE_TIMEOUT_MS,
            takeover: Takeover::Refuse,
            holder: describe_this_process(what),
            poll_ms: DEFAULT_LEASE_POLL_MS,
        }
    }
}

/// "HOST pid PID (WHAT)": how a holder names itself in the superblock.
pub fn describe_this_process(what: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    let mut s = format!("{host} pid {}", std::process::id());
    if !what.is_empty() {
        s.push_str(&format!(" ({what})"));
    }
    s
}
