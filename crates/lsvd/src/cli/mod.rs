//! Command-line interface: argument definitions and dispatch.

mod admin;
mod chain;
mod check;
mod delete;
mod diff;
pub(crate) mod duration;
#[cfg(test)]
mod engine_args_tests;
mod image;
mod inspect;
mod progress;
mod rename;
mod replicate;
mod serve;
mod snapshot;
mod tuning;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config_file::LsvdConfig;
use lsvd_core::error::{Error, Result};
use lsvd_engine::{EngineConfig, RecoveryMode};

#[derive(Parser, Debug)]
#[command(
    name = "lsvd",
    version,
    about = "A log-structured virtual disk: NBD in front, a write log on local SSD, an object store behind.",
    long_about = "lsvd serves virtual disks over NBD. Writes are appended to a write log on a local \
disk (a FLUSH costs one fdatasync) and batched into immutable objects in an object store (a local \
directory by default). A volume is defined by what is in the store; the local data directory is a \
cache that can be rebuilt from the store.\n\nQuick start:\n  lsvd serve                      # creates disk0 (16 GiB) on first start\n  nbdinfo nbd://127.0.0.1:10809/disk0",
    after_help = "Environment: LSVD_CONFIG sets --config, LSVD_DATA sets --data, LSVD_STORE sets --store, \
LSVD_LOG=debug|info|warn|error sets the log level. For s3:// stores: AWS_ENDPOINT_URL, AWS_REGION, \
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or the [s3] section of the config file); \
LSVD_S3_CREDENTIALS=instance (or [s3] credentials = \"instance\") takes them from the cloud's \
credential chain (web identity, container, instance metadata), never used otherwise. For gs:// \
stores: GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY or GOOGLE_APPLICATION_CREDENTIALS \
(LSVD_GCS_CREDENTIALS=instance for the metadata server). For az:// stores: \
AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or a SAS or token), or \
AZURE_STORAGE_USE_EMULATOR=true for Azurite (LSVD_AZURE_CREDENTIALS=instance for a managed \
identity).\n\n\
Exit status: 0 on success; 2 for usage errors and invalid input (arguments, names, sizes, \
options, config file); 1 for every other failure. Errors are printed as one line: \
`lsvd: error: MESSAGE`."
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Global options as given on the command line (or by their environment variables).
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Config file (TOML): store, data directory, S3, retry and self-test settings.
    /// `lsvd config-example` prints one with every key.
    #[arg(long, global = true, env = "LSVD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Directory for local state (write logs, lock). Disposable: the store defines the
    /// volume. Default: `data` from the config file, else ./lsvd-data.
    #[arg(long, global = true, env = "LSVD_DATA")]
    pub data: Option<PathBuf>,
    /// Where volumes live: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX (Google Cloud
    /// Storage), az://CONTAINER/PREFIX (Azure Blob Storage), file:///path or a plain
    /// path (one that starts like `name:` is taken for a URL scheme: write ./name:x);
    /// chain:DIR0,DIR1[,...][?drive_size=SIZE&gc=compact-in-body|move-to-tail] (a log
    /// chained over local drives: client objects on the tail drive, GC output in the
    /// body; DIR+MIRROR mirrors a drive) or stripe:DIR0,DIR1[,...] (objects spread over
    /// the drives). Default:
    /// `store` from the config file, else file://<DATA>/store.
    #[arg(long, global = true, env = "LSVD_STORE")]
    pub store: Option<String>,
    /// Key file of encrypted volumes: 32 random bytes (make one with
    /// `head -c 32 /dev/urandom > vol.key`, keep it safe and apart from the store). It
    /// unlocks the volume's data key; without it an encrypted volume cannot be read.
    #[arg(long, global = true, env = "LSVD_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
}

impl CommonArgs {
    /// Load the config file, if any, and settle the data directory and store URL
    /// (flags and their variables win over the file).
    pub fn resolve(self) -> Result<Common> {
        let file = match &self.config {
            Some(path) => LsvdConfig::load(path)?,
            None => LsvdConfig::default(),
        };
        for w in &file.warnings {
            lsvd_store::log::warn(w);
        }
        let data = file.data_dir(self.data.as_deref());
        let store = file.store_url(self.store.as_deref(), &data);
        Ok(Common {
            data,
            store,
            file,
            key_file: self.key_file,
            file_path: self.config,
        })
    }
}

pub use crate::config_file::Common;

/// `lsvd key ...`.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Change the key file that unlocks an encrypted volume: its data key is wrapped
    /// again under the new key (one small record rewritten; no data is). Give the
    /// current key with --key-file. Afterwards only the new key unlocks the volume; a
    /// server already running keeps working. Clones keep the key they had. Example:
    /// lsvd key rotate disk0 --key-file old.key --new-key-file new.key
    Rotate {
        /// The volume.
        name: String,
        /// The new key file (32 random bytes: head -c 32 /dev/urandom > new.key).
        #[arg(long, value_name = "PATH")]
        new_key_file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a volume in the store.
    Create {
        /// Volume name: 1-64 characters of A-Z a-z 0-9 . _ -
        name: String,
        /// Size, e.g. 20G, 512M (binary units). Must be a multiple of 4 KiB.
        #[arg(long)]
        size: String,
        /// Compress what the volume stores: `none` (the default), `lz4` (fast) or
        /// `zstd[:LEVEL]` (smaller; level 1-19, default 3). Saved in the volume's
        /// settings; change it later with `lsvd config`.
        #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
        compression: Option<lsvd_core::compression::Compression>,
        /// Encrypt what the volume stores (AES-256-GCM): client data and maps in every
        /// object. Needs --key-file (the key that unlocks it; every command that reads
        /// the volume's data then needs it too). Fixed at creation.
        #[arg(long)]
        encrypt: bool,
    },
    /// Show or change a volume's settings, kept in the store beside it so that every
    /// server of the volume uses them. A change applies from the next time a server
    /// opens the volume, to the objects it writes (and GC rewrites); objects already
    /// stored stay as they are and read as before. Example: lsvd config disk0
    /// --compression zstd
    Config {
        /// The volume.
        name: String,
        /// How new objects are compressed: none, lz4 or zstd[:LEVEL].
        #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
        compression: Option<lsvd_core::compression::Compression>,
    },
    /// Manage the key of an encrypted volume.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Write a volume, or a snapshot of it, as a raw image: to a file (made sparse:
    /// ranges never written, and zero blocks, are holes), a block device, or `-`
    /// (standard output, every byte). A snapshot is read beside a server that serves
    /// its volume; a volume itself must not be served (take a snapshot of a served
    /// one). Memory stays at 1 MiB whatever the size. Example: lsvd export disk0@daily
    /// disk0.img
    Export {
        /// VOL or VOL@SNAP.
        source: String,
        /// The image file (must not exist), a block device, or `-`.
        output: String,
        /// No progress lines and no summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Make a new volume from a raw image: a file (the volume's size is the file's,
    /// rounded up to 4 KiB, unless --size says more) or `-` (standard input; --size
    /// needed). Blocks of zeros are not written, so a sparse image stays sparse in the
    /// store. Example: lsvd import disk0.img disk1
    Import {
        /// The image file, or `-`.
        input: String,
        /// The new volume's name.
        name: String,
        /// The volume's size (at least the image's), e.g. 20G.
        #[arg(long)]
        size: Option<String>,
        /// As for `lsvd create`.
        #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
        compression: Option<lsvd_core::compression::Compression>,
        /// As for `lsvd create` (needs --key-file).
        #[arg(long)]
        encrypt: bool,
        /// No progress lines and no summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Write what changed between two snapshots of a volume (or everything in one, without
    /// --from-snap) as a diff stream: data runs and zeroed runs, each checksummed. Reads
    /// only the changed data, beside a server that serves the volume. Apply it elsewhere
    /// with `lsvd import-diff`. Example: lsvd export-diff disk0@tue --from-snap mon
    /// tue.diff
    ExportDiff {
        /// VOL@SNAP: the snapshot the diff brings a volume to.
        source: String,
        /// The older snapshot of the same volume the diff starts from (default: the
        /// empty volume, so the diff holds every block written).
        #[arg(long, value_name = "BASE")]
        from_snap: Option<String>,
        /// The diff file (must not exist) or `-`.
        output: String,
        /// No progress lines and no summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Apply a diff from `lsvd export-diff`, then take the diff's snapshot: on a
    /// volume whose newest snapshot is the diff's base and that was not written since,
    /// or (a diff without a base) on a new volume, which it creates. A chain of diffs
    /// applied in order restores every snapshot. Refuses, changing nothing, a volume
    /// the diff does not fit. Example: lsvd import-diff tue.diff disk0-copy
    ImportDiff {
        /// The diff file, or `-`.
        input: String,
        /// The volume to apply it to.
        name: String,
        /// For a volume this creates: as for `lsvd create`.
        #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
        compression: Option<lsvd_core::compression::Compression>,
        /// For a volume this creates: as for `lsvd create` (needs --key-file).
        #[arg(long)]
        encrypt: bool,
        /// No progress lines and no summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Delete a volume: its objects, checkpoints and metadata in the store, and its
    /// write log and read cache in the data directory. Data not yet uploaded is lost
    /// with it. Stop a server using this data directory first; a server elsewhere that
    /// still serves the volume stops at its next upload (a 96-byte tombstone stays in
    /// the store for that until the name is created again). An interrupted delete
    /// leaves the volume unopenable; run the command again to finish it.
    Delete {
        /// The volume to delete.
        name: String,
        /// Really delete (without it, only say what would go).
        #[arg(long)]
        yes: bool,
    },
    /// Make every write a served volume acknowledged so far durable in the store, not
    /// only in the write log (before copying the store, or moving the volume to another
    /// host). Asks the `lsvd serve` that uses this data directory, through its control
    /// socket; waits until the objects are uploaded.
    Sync {
        /// The served volume.
        name: String,
    },
    /// Change a volume's size. Growing is always allowed: the new space reads as
    /// zeros. Shrinking discards the data past the new end, so it needs
    /// --allow-shrink. Asks the `lsvd serve` that uses this data directory when there
    /// is one (connections made afterwards see the new size; I/O past the end of a
    /// shrunk volume fails on older ones); otherwise opens the volume for the moment
    /// it takes. Snapshots keep the size they were taken with.
    Resize {
        /// The volume.
        name: String,
        /// The new size, e.g. 40G, 512M (binary units); a multiple of 4 KiB.
        #[arg(long)]
        size: String,
        /// Allow a smaller size (the data past it is discarded).
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Give a volume another name in the same store: its data, snapshots and size move
    /// with it (the keys are copied under NEW, then OLD's are deleted). The volume must
    /// not be served (stop its server first); clones and volumes with clones keep
    /// their name. Interrupted, run it again to finish.
    Rename {
        /// The volume's name now.
        old: String,
        /// Its new name: 1-64 characters of A-Z a-z 0-9 . _ -
        new: String,
    },
    /// Make a writable volume from a snapshot: NEW starts as VOL@SNAP and shares its
    /// data in the store (only what NEW writes is stored again). Clones of clones work.
    /// VOL refuses to delete SNAP, or itself, while NEW exists.
    Clone {
        /// The snapshot to start from: VOL@SNAP (`lsvd snapshot create` makes one).
        source: String,
        /// The new volume's name.
        name: String,
    },
    /// Copy a volume (objects, checkpoints, snapshots) into another store, lazily and
    /// out of order, so that the copy is always a prefix of the volume's history (never
    /// a mix), even when stopped at any point; a second run resumes without copying
    /// again. --follow keeps copying as the volume is written and collected. Serve the
    /// copy with `lsvd serve --store STORE_URL VOL` (that ends replication to it).
    Replicate(replicate::ReplicateArgs),
    /// Take, list and delete snapshots of a volume.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Serve volumes over NBD until interrupted (Ctrl-C drains and shuts down cleanly).
    Serve(ServeArgs),
    /// List the volumes in the store.
    List,
    /// Show a volume's size, space use and recovery state, read from the store, and
    /// the tuned settings `serve` would use on this data directory, with where each
    /// comes from (flag, config, probe profile, default). Give `serve`'s tuning flags
    /// to see their effect.
    Info {
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tuning: TuningArgs,
    },
    /// Verify every checksum and map invariant of a volume (reads all its objects,
    /// showing how far it is on stderr).
    Check {
        name: String,
        /// No progress lines (the report is still printed).
        #[arg(long)]
        quiet: bool,
    },
    /// Administer a store of several local drives (--store chain:...): repair mirror
    /// copies, add a drive. Offline: stop the servers using the chain first.
    #[command(subcommand)]
    Chain(chain::ChainCommand),
    /// Dump write-log records, object headers and checkpoints in readable form.
    #[command(subcommand)]
    Inspect(InspectWhat),
    /// Replay a block trace through a running NBD export (e.g. a served volume).
    Replay(crate::replay::ReplayArgs),
    /// Check that the store keeps the promises lsvd relies on: put-if-absent (also
    /// under concurrent writers), ranged reads, listing, delete. `serve` runs this at
    /// every start.
    Selftest,
    /// Print an example config file (for --config) with every key.
    ConfigExample,
    /// Replay block traces or synthetic workloads through the batching, map and GC
    /// code of the engine with a simulated store; report write amplification and more.
    Sim(lsvd_sim::SimArgs),
    /// Measure the local device a write log will live on (page size, fdatasync latency,
    /// parallelism) and print the log layout it implies.
    #[command(long_about = crate::probe::LONG_ABOUT)]
    Probe(crate::probe::ProbeArgs),
}

#[derive(Subcommand, Debug)]
pub enum InspectWhat {
    /// List a volume's objects with their kinds and sizes.
    Objects { name: String },
    /// Show one object's header (and a checkpoint's contents). SEQ is hexadecimal.
    Object { name: String, seq: String },
    /// Show the write log's superblocks and the records on its chain.
    Log { name: String },
    /// Show the volume superblock generations in the store (newest last).
    Super { name: String },
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Volumes to serve, one NBD export each; the first is also the default export.
    /// With none, serves `disk0`, creating it (16 GiB) if the store has no volumes.
    /// `VOL@SNAP` serves snapshot SNAP of VOL read-only (export `VOL@SNAP`), next to
    /// VOL itself if both are named.
    pub names: Vec<String>,
    /// TCP address to listen on. Default 127.0.0.1:10809 unless only --socket is given.
    /// A non-loopback address (e.g. 0.0.0.0:10809) needs TLS (--tls-cert, --tls-key) or
    /// --insecure.
    #[arg(long)]
    pub listen: Option<String>,
    /// Unix socket path to listen on (a stale socket from a crashed server is replaced).
    /// Always plain NBD: file permissions are its access control.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve NBD over TLS on --listen with this certificate (PEM; the chain, server
    /// first). Clients connect with nbds:// URIs or qemu's tls-creds. Example:
    /// --tls-cert /etc/lsvd/tls/server-cert.pem
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM: PKCS#8, RSA or EC), readable by its owner only
    /// (chmod 600; a key group or others can read is refused). Example:
    /// --tls-key /etc/lsvd/tls/server-key.pem
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require every TLS client to present a certificate signed by this CA (PEM): the
    /// access control of a networked lsvd. Without it any client that completes a TLS
    /// handshake gets every export (`serve` warns). Example: --tls-client-ca /etc/lsvd/tls/ca-cert.pem
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// `required` (the default with --tls-cert): clients must start TLS before anything
    /// else, plain clients are refused. `optional`: plain clients are served too (on a
    /// non-loopback address that needs --insecure). Example: --tls optional
    #[arg(long, value_name = "MODE", value_parser = ["required", "optional"], requires = "tls_cert")]
    pub tls: Option<String>,
    /// Allow plain text on a non-loopback address: NBD on --listen (anyone who can
    /// reach the port can read and write every export) and HTTP on --metrics (anyone
    /// can read every volume's metrics). Prints a warning for each.
    #[arg(long)]
    pub insecure: bool,
    /// Stand by for one volume served by another lsvd (another host, or another
    /// --data on this one, with the same --store): serve nothing until that server
    /// stops (at once after a clean stop) or its lease lapses (--lease-timeout after
    /// its last renewal, if it crashed, hung or lost the store), then take the volume
    /// over and export it on this server's own --listen/--socket. After a crash the
    /// volume holds what the store had: writes the old server acknowledged but had not
    /// uploaded are lost, as after losing its disk. Example: lsvd serve disk0 --standby
    #[arg(long)]
    pub standby: bool,
    /// This data directory's write log holds records a superseded session
    /// acknowledged (another process took the volume over since): discard them, with a
    /// warning, instead of refusing to start. They are not in the volume either way.
    #[arg(long)]
    pub discard_superseded_log: bool,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9100). Plain
    /// HTTP without access control: a non-loopback address needs --insecure.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Do not measure the disk on a first start without a probe profile, and ignore
    /// saved probe profiles (device and store): the built-in defaults, under flags and
    /// the config file's [tuning].
    #[arg(long)]
    pub no_probe: bool,
    /// Each NBD connection has a thread of its own. Once it has taken every request
    /// the client sent, it polls for the next one this many microseconds (0..1000)
    /// before it sleeps, as long as the client keeps sending that quickly: a client
    /// at queue depth 1 then waits tens of µs less per request (no wake-up from
    /// sleep), for some CPU while it is busy. 0 turns polling off.
    #[arg(long, value_name = "US", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub busy_poll_us: u64,
    /// How long an NBD client may take from connecting to choosing an export; a
    /// client still in its handshake then is closed (e.g. 500ms, 10s; it cannot be
    /// off). At most 256 clients are in their handshake at once: more are closed at
    /// once, not kept waiting.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub handshake_timeout: String,
    /// Close an NBD connection that sends no request for this long while none of its
    /// requests is running, or takes no reply for this long (e.g. 30s, 10m, 1h). `0`
    /// or `off`: never, for clients that keep a quiet connection open on purpose (a
    /// kernel nbd device, nbdfuse); qemu reconnects by itself.
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    pub idle_timeout: String,
    #[command(flatten)]
    pub limits: crate::qos::LimitArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The settings `lsvd probe` decides. Each flag wins over the config file's
/// `[tuning]`, which wins over the probe profiles, which win over the defaults.
#[derive(Args, Debug, Clone, Default)]
pub struct TuningArgs {
    /// Client bytes per object before it is uploaded (4K..1G) [default: store
    /// profile, else 8M].
    #[arg(long, value_name = "SIZE")]
    pub batch_size: Option<String>,
    /// Object uploads in flight per volume (1..256) [default: store profile, else 4].
    #[arg(long, value_name = "N")]
    pub uploads: Option<usize>,
    /// Write-log writes issued at once (1..64) [default: probe profile, else 1].
    #[arg(long, value_name = "N")]
    pub log_writes_in_flight: Option<usize>,
    /// Most client bytes grouped into one write-log record (64K..4M) [default: probe
    /// profile, else 4M].
    #[arg(long, value_name = "SIZE")]
    pub group_commit_max: Option<String>,
    /// Bytes one read-cache miss fetches from the store, whole 64K chunks (64K..16M)
    /// [default: store profile, else 64K].
    #[arg(long, value_name = "SIZE")]
    pub read_fetch: Option<String>,
}

impl TuningArgs {
    /// These flags as a settings layer; an invalid value is `BadInput`.
    pub fn layer(&self) -> Result<crate::probe::settings::Layer> {
        use crate::probe::settings::{FLAG_NAMES, Layer, validate};
        let size = |v: &Option<String>| -> Result<Option<u64>> {
            v.as_deref().map(lsvd_core::size::parse_size).transpose()
        };
        let layer = Layer {
            log_writes_in_flight: self.log_writes_in_flight,
            group_commit_max_bytes: size(&self.group_commit_max)?,
            batch_size_bytes: size(&self.batch_size)?,
            uploads_in_flight: self.uploads,
            read_fetch_bytes: size(&self.read_fetch)?,
        };
        validate(&layer, &FLAG_NAMES)?;
        Ok(layer)
    }
}

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub tuning: TuningArgs,
    /// Upload a partial batch after this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub batch_timeout_ms: u64,
    /// Size of each volume's write-log file (made on first start).
    #[arg(long, default_value = "1G")]
    pub log_size: String,
    /// Write a checkpoint every this many objects.
    #[arg(long, default_value_t = 64)]
    pub checkpoint_every: u64,
    /// Also write a checkpoint this many seconds after the last one when objects were
    /// written since (bounds recovery work on a slowly written volume).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub checkpoint_interval: u64,
    /// `strict` refuses to start if acknowledged data is missing; `accept-prefix` starts
    /// from the longest recoverable prefix and says what was dropped.
    #[arg(long, default_value = "strict", value_parser = ["strict", "accept-prefix"])]
    pub recovery_mode: String,
    /// Size of the read cache on local disk (0 disables it). `serve` keeps one cache
    /// for all the volumes it serves (`@host.rcache` in the data directory), fair
    /// between them: a volume holding no more than its share (size / volumes served)
    /// keeps it whatever the others read. A clone reading its base's data, or a
    /// snapshot export, hits what the base cached. With `--encrypt-local` each volume
    /// has an encrypted cache this size of its own instead.
    #[arg(long, default_value = "1G")]
    pub read_cache_size: String,
    /// Copy each uploaded object's data into the read cache, so reading recently
    /// written data needs no GET: `auto` does when the store is remote (S3), `always`,
    /// or `never`. Uploaded data fills free space; in a full cache it displaces read
    /// data only while it holds less than half.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub read_cache_admit: String,
    /// Fetch this far ahead of a sequential reader, in the background (at most this
    /// much in flight; 0 disables it). Also ahead of a reader going back over data
    /// that was written together, whatever its LBAs (several reads in a row landing in
    /// one object): the rest of that object. `auto`: 4M when the store is remote, 0
    /// when it is local.
    #[arg(long, default_value = "auto")]
    pub read_ahead: String,
    /// Start garbage collection when live/stored bytes falls below this (0 disables GC).
    #[arg(long, default_value_t = 0.70)]
    pub gc_start: f64,
    /// Stop garbage collection when live/stored bytes rises above this.
    #[arg(long, default_value_t = 0.75)]
    pub gc_stop: f64,
    /// Victim selection: `greedy` (least live first), `cost-benefit` (LFS: live
    /// fraction and age) or `hylog` (measures write frequencies and keeps hot and cold
    /// data in separate objects: what GC moves, and fresh writes too, at the cost of
    /// more, smaller data objects; see docs/sim/hylog.md).
    #[arg(long, default_value = "greedy", value_parser = ["greedy", "cost-benefit", "hylog"])]
    pub gc_policy: String,
    /// Defragmenting GC (the LSVD paper's "defrag"): where two extents a GC pass moves
    /// are at most this far apart in the volume and the data between them is in the
    /// store, move that data too, so the three become one extent of the volume's map
    /// (less memory, fewer pieces per read). The price: more bytes moved (on small
    /// random writes 8-14% more, for 9-39% fewer extents; docs/seeds.md) and, on a
    /// remote store, a ranged GET per gap. 0: off. Example: --gc-defrag-hole 8K
    #[arg(long, default_value = "0")]
    pub gc_defrag_hole: String,
    /// While clients do I/O, GC moves at most this many bytes per second, or more as
    /// the --gc-headroom runs out: up to four times the rate clients write (with no
    /// headroom, four times whenever that is more). 0: as fast as it can. Once clients
    /// have done no I/O for two seconds GC is not paced, until their next request.
    #[arg(long, default_value = "16M")]
    pub gc_rate: String,
    /// How far the store may grow past live/--gc-start before client writes wait for
    /// GC. Within it GC runs beside client writes at a pace that follows how much of
    /// it is used: `--gc-rate` while little is, up to four times the clients' write
    /// rate as it runs out, and unpaced once clients are idle, so a burst of writes is
    /// not slowed by GC and the store shrinks back afterwards. `auto`: a quarter of
    /// --log-size (more lets a burst leave the store so sparse that the read cache,
    /// which holds whole chunks of objects, holds little live data, and reads from a
    /// remote store miss it until GC has caught up). 0: client objects wait for GC as
    /// soon as it falls behind, and the store stays within live/--gc-start plus two
    /// batches. On a chained-drive store (--store chain:...) GC cleans the body
    /// while the tail takes client writes, as in Gecko. Costs up to that much more
    /// store space during bursts. Example: --gc-headroom 4G
    #[arg(long, default_value = "auto", value_name = "SIZE")]
    pub gc_headroom: String,
    /// Keep each volume's newest write-log records in memory, up to this many bytes,
    /// so uploads take them from there instead of reading them back from the log.
    /// `auto`: four batches (32M at the default --batch-size). 0: every upload reads
    /// its records back from the log and verifies their checksums (what a record
    /// dropped from memory, or replayed after a restart, always gets).
    #[arg(long, default_value = "auto", value_name = "SIZE")]
    pub upload_memory: String,
    /// Free space the write log keeps. Uploaded data stays in the log, and reads of it
    /// are served from there (no GET, no read-cache slot), until the log's free space
    /// falls below this; then the oldest uploaded records are freed. `auto`: a quarter
    /// of --log-size, at least 64M (a log of 64M or less keeps nothing). `all`: free
    /// each record as soon as it is uploaded. Example: --log-free-target 512M
    #[arg(long, default_value = "auto", value_name = "SIZE")]
    pub log_free_target: String,
    /// How long this server may go without renewing its lease on the volume (it
    /// renews every third of it) before another lsvd may take the volume over; and
    /// how long a new server waits for a holder that stopped renewing before it takes
    /// over. A server that cannot renew in time (paused, cut off from the store, a
    /// full or refusing store) holds its answers until it has renewed. Example:
    /// --lease-timeout 5s
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub lease_timeout: String,
    /// How long a request may wait (for a lease renewal, for room in a full write
    /// log) before it fails instead: ENOSPC while the store refuses uploads as full,
    /// EIO otherwise (the store refuses the credentials, is unreachable, or too slow).
    /// Once one write failed so, writes that find the log still full fail at once
    /// until uploads free room. Nothing acknowledged is lost. Example:
    /// --stall-timeout 60s
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub stall_timeout: String,
    /// Compress the objects this server writes (data, GC, checkpoints) with `none`,
    /// `lz4` or `zstd[:LEVEL]` (level 1-19, default 3), whatever each volume's
    /// settings say; without it each volume uses its own (`lsvd config VOL
    /// --compression`, none by default). Chunks that do not shrink are stored raw.
    #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
    pub compression: Option<lsvd_core::compression::Compression>,
    /// Encrypt this data directory's files too: the write log (client data not yet
    /// uploaded, and its index) and the read cache (copies of object data, and its
    /// table), with XTS-AES-256 under keys derived from the volume's data key. Needs
    /// an encrypted volume (`lsvd create --encrypt`) and its --key-file. Without it
    /// they hold client data in the clear (docs/SEMANTICS.md, "Encryption at rest").
    /// Files in the other mode are made anew as asked if they were closed cleanly,
    /// else keep their mode until the first start after a clean stop. Example:
    /// lsvd serve vm1 --key-file vm1.key --encrypt-local
    #[arg(long)]
    pub encrypt_local: bool,
    /// How long GC keeps what a replication pass under way (`lsvd replicate`) still
    /// has to copy, counted from the pass's start: old checkpoints and objects it
    /// emptied are deleted only once no pass registered in the store needs them, or
    /// once the pass is this old (a replicator that died), or once they come to more
    /// than --replica-hold-max. 0 or off: keep nothing for replicas (a long pass under
    /// heavy GC may then start again and again). Example: --replica-hold 4h
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub replica_hold: String,
    /// Most garbage kept for replication passes under way; past it, it is deleted
    /// (and those passes start again from a newer checkpoint).
    #[arg(long, value_name = "SIZE", default_value = "16G")]
    pub replica_hold_max: String,
}

impl EngineArgs {
    /// The engine configuration these options ask for, with the tuned settings from
    /// the flags alone (no config file, no profile); an invalid one is `BadInput`.
    pub fn to_config(&self) -> Result<EngineConfig> {
        let layers = crate::probe::settings::Layers {
            flags: self.tuning.layer()?,
            ..Default::default()
        };
        self.to_config_tuned(&crate::probe::settings::resolve(&layers))
    }

    /// The engine configuration with the tuned settings of `tuning` (see
    /// `probe::settings`); an invalid option is `BadInput`.
    pub fn to_config_tuned(&self, tuning: &crate::probe::settings::Tuning) -> Result<EngineConfig> {
        let batch_size_bytes = tuning.batch_size_bytes.value;
        let log_size_bytes = lsvd_core::size::parse_size(&self.log_size)?;
        if log_size_bytes < lsvd_engine::config::MIN_LOG_SIZE_BYTES {
            return Err(Error::bad_input("--log-size must be at least 16M"));
        }
        let gc = lsvd_core::gc::GcConfig {
            start_utilization: self.gc_start,
            stop_utilization: self.gc_stop,
            policy: self.gc_policy.parse().map_err(Error::bad_input)?,
            pass_bytes: lsvd_core::gc::pass_bytes_for_batch(batch_size_bytes),
            defrag_hole_bytes: lsvd_core::size::parse_size(&self.gc_defrag_hole)
                .map_err(|e| Error::bad_input(format!("--gc-defrag-hole: {e}")))?,
        };
        gc.validate()
            .map_err(|e| Error::bad_input(format!("--gc-start/--gc-stop: {e}")))?;
        let read_cache_bytes = lsvd_core::size::parse_size(&self.read_cache_size)?;
        let gc_min_rate_bytes = lsvd_core::size::parse_size(&self.gc_rate)?;
        let gc_headroom_bytes = match self.gc_headroom.as_str() {
            "auto" => None,
            size => Some(
                lsvd_core::size::parse_size(size)
                    .map_err(|e| Error::bad_input(format!("--gc-headroom: {e}")))?,
            ),
        };
        let upload_memory_bytes = match self.upload_memory.as_str() {
            "auto" => lsvd_engine::config::upload_memory_for_batch(batch_size_bytes),
            size => lsvd_core::size::parse_size(size)
                .map_err(|e| Error::bad_input(format!("--upload-memory: {e}")))?,
        };
        let log_free_target_bytes = match self.log_free_target.as_str() {
            "auto" => None,
            "all" => Some(u64::MAX),
            size => Some(
                lsvd_core::size::parse_size(size)
                    .map_err(|e| Error::bad_input(format!("--log-free-target: {e}")))?,
            ),
        };
        let lease_timeout =
            duration::parse_positive_duration("--lease-timeout", &self.lease_timeout)?;
        if lease_timeout < std::time::Duration::from_millis(300)
            || lease_timeout.as_millis() > u128::from(u32::MAX)
        {
            return Err(Error::bad_input(format!(
                "invalid --lease-timeout '{}': give 300ms or more (10s is the default)",
                self.lease_timeout
            )));
        }
        let lease_timeout_ms = lease_timeout.as_millis() as u32;
        let stall_timeout_ms =
            duration::parse_positive_duration("--stall-timeout", &self.stall_timeout)?.as_millis()
                as u64;
        let replica_hold_ms = duration::parse_duration("--replica-hold", &self.replica_hold)?
            .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64);
        let replica_hold_max_bytes = lsvd_core::size::parse_size(&self.replica_hold_max)
            .map_err(|e| Error::bad_input(format!("--replica-hold-max: {e}")))?;
        let read_ahead_bytes = match self.read_ahead.as_str() {
            "auto" => None,
            size => Some(lsvd_core::size::parse_size(size)?),
        };
        let mut config = EngineConfig {
            read_ahead_bytes,
            gc,
            read_cache_bytes,
            read_cache_admit: self.read_cache_admit.parse().map_err(Error::bad_input)?,
            gc_min_rate_bytes,
            gc_headroom_bytes,
            upload_memory_bytes,
            log_free_target_bytes,
            batch_timeout_ms: self.batch_timeout_ms.max(1),
            log_size_bytes,
            checkpoint_every_objects: self.checkpoint_every.max(1),
            checkpoint_interval_ms: self.checkpoint_interval.max(1).saturating_mul(1000),
            recovery_mode: if self.recovery_mode == "accept-prefix" {
                RecoveryMode::AcceptPrefix
            } else {
                RecoveryMode::Strict
            },
            lease: lsvd_engine::fencing::lease::LeaseConfig {
                timeout_ms: lease_timeout_ms,
                ..lsvd_engine::fencing::lease::LeaseConfig::for_command("lsvd serve")
            },
            stall_timeout_ms,
            replica_hold_ms,
            replica_hold_max_bytes,
            compression: self.compression,
            encrypt_local: Some(self.encrypt_local),
            ..EngineConfig::default()
        };
        tuning.apply(&mut config);
        Ok(config)
    }
}

/// A `--compression` value: none, lz4, zstd or zstd:LEVEL.
fn parse_compression(s: &str) -> std::result::Result<lsvd_core::compression::Compression, String> {
    s.parse()
}

/// Run the command. What failed is in the error's kind: `BadInput` is the user's
/// mistake (`main` exits 2 for it, as for a usage error), anything else exits 1.
pub fn run(cli: Cli) -> Result<(), Error> {
    if let Command::Sim(args) = cli.command {
        // Pure computation: no runtime needed.
        return lsvd_sim::run(args);
    }
    if let Command::Probe(args) = cli.command {
        // Blocking I/O on its own threads (the store probe starts its own runtime).
        let store_given = cli.common.store.is_some();
        return crate::probe::run(&cli.common.resolve()?, store_given, args);
    }
    if let Command::ConfigExample = cli.command {
        print!("{}", crate::config_file::EXAMPLE);
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::local_io("cannot start runtime", e))?;
    let common = cli.common.resolve()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Create {
                name,
                size,
                compression,
                encrypt,
            } => admin::create(&common, &name, &size, compression, encrypt).await,
            Command::Key(KeyCommand::Rotate { name, new_key_file }) => {
                admin::rotate_key(&common, &name, &new_key_file).await
            }
            Command::Config { name, compression } => {
                admin::config(&common, &name, compression).await
            }
            Command::Delete { name, yes } => delete::delete(&common, &name, yes).await,
            Command::Export {
                source,
                output,
                quiet,
            } => image::export(&common, &source, &output, quiet).await,
            Command::Import {
                input,
                name,
                size,
                compression,
                encrypt,
                quiet,
            } => {
                image::import(
                    &common,
                    &input,
                    &name,
                    size.as_deref(),
                    compression,
                    encrypt,
                    quiet,
                )
                .await
            }
            Command::ExportDiff {
                source,
                from_snap,
                output,
                quiet,
            } => diff::export_diff(&common, &source, from_snap.as_deref(), &output, quiet).await,
            Command::ImportDiff {
                input,
                name,
                compression,
                encrypt,
                quiet,
            } => diff::import_diff(&common, &input, &name, compression, encrypt, quiet).await,
            Command::Sync { name } => admin::sync(&common, &name).await,
            Command::Snapshot(c) => snapshot::run(&common, c).await,
            Command::Clone { source, name } => snapshot::clone(&common, &source, &name).await,
            Command::Rename { old, new } => rename::rename(&common, &old, &new).await,
            Command::Resize {
                name,
                size,
                allow_shrink,
            } => snapshot::resize(&common, &name, &size, allow_shrink).await,
            Command::Replicate(args) => replicate::run(&common, args).await,
            Command::Serve(args) => serve::serve(&common, args).await,
            Command::List => admin::list(&common).await,
            Command::Info { name, json, tuning } => {
                admin::info(&common, &name, json, &tuning).await
            }
            Command::Check { name, quiet } => check::check(&common, &name, quiet).await,
            Command::Chain(c) => chain::run(&common, c).await,
            Command::Inspect(what) => inspect::inspect(&common, what).await,
            Command::Replay(args) => crate::replay::run(args).await,
            Command::Selftest => admin::selftest(&common).await,
            Command::ConfigExample => Ok(()),
            Command::Sim(_) | Command::Probe(_) => Ok(()),
        }
    })
}
