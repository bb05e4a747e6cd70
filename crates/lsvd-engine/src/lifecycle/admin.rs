//! Volume administration: create, list, describe; read a volume's metadata.
//!
//! None of it opens a volume: `info` rebuilds the store's view of it
//! ([`crate::recovery::store_recovery`]) without changing anything.
//!
//! The read-only commands (`lsvd info`, `check`, `inspect`, `list`) take no lock and
//! may look at a volume a server is changing: its GC deletes objects, its checkpoints
//! replace older ones, its lease renewals replace superblock generations, all between
//! a command's listing and its reads (issue 41: `lsvd info --json`, polled during GC
//! on Azurite, failed with `404 BlobNotFound`). A key that vanished that way means
//! "look again from a fresh listing": [`look_again`] runs the whole read again, a few
//! times with a short backoff, and only then reports the error, saying the store kept
//! changing. [`held_now`] tells the commands whether a server holds the volume (what
//! they see may then be mid-change: an upload in flight past a gap, a write log in
//! use).

use std::time::Duration;

use lsvd_core::format::checkpoint::CheckpointHeat;
use lsvd_core::format::volume_meta::VolumeMeta;

use crate::keys::{meta_key, validate_volume_name};
use crate::recovery::store_recovery::{is_vanished, recover_store_view};
use crate::store_meta::{random_volume_id, read_meta, write_meta};
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// Create a new volume in the store. Fails with `AlreadyExists` if one of that name
/// exists, `BadInput` for a bad name or size.
pub async fn create_volume(store: &DynStore, name: &str, size_bytes: u64) -> Result<VolumeMeta> {
    create_volume_with(store, name, size_bytes, None).await
}

/// [`create_volume`], encrypted when `encrypt_with` gives the user's key: the key
/// record (a new random data key wrapped under it) is written before the metadata.
pub async fn create_volume_with(
    store: &DynStore,
    name: &str,
    size_bytes: u64,
    encrypt_with: Option<&lsvd_store::sealed::UserKey>,
) -> Result<VolumeMeta> {
    validate_volume_name(name)?;
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) {
        return Err(Error::bad_input(format!(
            "volume size must be a positive multiple of 4096 bytes (got {size_bytes})"
        )));
    }
    let meta = VolumeMeta {
        volume: random_volume_id(),
        size_bytes,
        created_unix_secs: lsvd_store::clock::unix_ms_now() / 1000,
        name: name.to_string(),
        encrypted: encrypt_with.is_some(),
    };
    // A deleted volume of this name leaves its tombstone (removed here); any other
    // keys without metadata are not ours to start a volume among.
    let prefix = format!("{name}/");
    let leftovers = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    if !leftovers.is_empty() && !leftovers.iter().any(|e| e.key == meta_key(name)) {
        if !crate::fencing::volume_super::is_tombstone(store, name, &leftovers).await? {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} keys under '{prefix}' in {} belong to no volume; remove them \
                     before creating '{name}'",
                    leftovers.len(),
                    store.describe()
                ),
            ));
        }
        for e in &leftovers {
            store
                .delete(&e.key)
                .await
                .map_err(|err| err.context(format!("cannot remove tombstone {}", e.key)))?;
        }
    }
    if let Some(user) = encrypt_with {
        crate::lifecycle::encryption::write_new_keys(store, name, user).await?;
    }
    write_meta(store, &meta).await?;
    Ok(meta)
}

/// What the store says about a volume, computed without changing anything.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeInfo {
    pub name: String,
    pub volume_id: String,
    pub size_bytes: u64,
    pub created_unix_secs: u64,
    pub live_bytes: u64,
    /// Data and GC objects' bytes, counted uncompressed (what utilization divides by).
    pub store_bytes: u64,
    /// The same objects' bytes as the store lists them (less with compression).
    pub store_listed_bytes: u64,
    /// The compression the volume's settings give new objects (`none` without any).
    pub compression: String,
    /// Objects are sealed with the data key in `<volume>/keys` (`lsvd create --encrypt`).
    pub encrypted: bool,
    /// Live bytes over stored bytes of the objects the volume owns (what GC weighs: a
    /// clone's ancestors' objects are left out, `StoreState::set_shared_below`).
    pub utilization: f64,
    pub objects: u64,
    pub checkpoint_seq: Option<u64>,
    pub closed_cleanly: bool,
    pub next_object_seq: u64,
    pub last_record_seq: u64,
    pub map_extents: u64,
    pub stranded_objects: Vec<u64>,
    pub client_write_bytes: u64,
    pub store_write_bytes: u64,
    pub write_amplification: f64,
    pub gc_passes: u64,
    pub gc_moved_bytes: u64,
    /// Of `gc_moved_bytes`, what the hylog policy moved as hot and as cold.
    pub gc_hot_moved_bytes: u64,
    pub gc_cold_moved_bytes: u64,
    /// The hylog write-frequency tracker the checkpoint carries (none under other
    /// policies).
    pub heat: Option<HeatInfo>,
    /// The volume's snapshots, oldest first.
    pub snapshots: Vec<String>,
    /// For a clone: the snapshot it was made from, `parent@snapshot`.
    pub parent: Option<String>,
    /// The clones made from this volume's snapshots.
    pub clones: Vec<String>,
    /// What `lsvd replicate` last recorded for each replica, oldest update first.
    pub replicas: Vec<ReplicaInfo>,
    /// In a replica: the source it is copied from, as the last pass recorded it
    /// (`objects_behind_now` is 0: the source is not read).
    pub replica_of: Option<ReplicaInfo>,
}

/// One replica's state as its latest finished `lsvd replicate` pass recorded it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaInfo {
    /// The other store: the replica's (in the source's info), the source's (in the
    /// replica's).
    pub peer: String,
    /// When the latest pass finished (ms since the Unix epoch).
    pub updated_unix_ms: u64,
    /// The replica holds the volume as it was at this time (the pass's start).
    pub current_as_of_unix_ms: u64,
    /// Objects that pass found missing in the replica and copied.
    pub lag_objects: u64,
    /// The replica recovers every object below this sequence number.
    pub replica_next_seq: u64,
    /// Objects the volume has written since the pass (its next object now, less the
    /// replica's).
    pub objects_behind_now: u64,
}

impl ReplicaInfo {
    fn of(r: lsvd_core::format::replica_status::ReplicaStatus, objects_behind_now: u64) -> Self {
        ReplicaInfo {
            peer: r.peer,
            updated_unix_ms: r.updated_unix_ms,
            current_as_of_unix_ms: r.current_as_of_unix_ms,
            lag_objects: r.lag_objects,
            replica_next_seq: r.replica_next_seq,
            objects_behind_now,
        }
    }
}

/// What the checkpoint's write-frequency tracker says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeatInfo {
    pub region_bytes: u64,
    /// Regions written at least once.
    pub regions_written: u64,
    /// The hot fraction a GC pass would choose from these counters at the volume's
    /// utilization now (0: it would not separate).
    pub hot_fraction: f64,
    /// The hot regions' share of the (decayed) writes.
    pub hot_write_share: f64,
}

fn heat_info(saved: &CheckpointHeat, size_bytes: u64, utilization: f64) -> HeatInfo {
    // Counters kept under other limits than this version's are described as they
    // are (a tracker that grows takes any region size of at least 4 KiB).
    let tracker = [Some(size_bytes), None]
        .into_iter()
        .find_map(|size| {
            let mut t = lsvd_core::heat::HeatTracker::new(size);
            t.restore(saved).ok().map(|()| t)
        })
        .unwrap_or_default();
    let distribution = tracker.distribution();
    let choice = lsvd_core::hylog::choose(&distribution, utilization);
    HeatInfo {
        region_bytes: 1u64 << saved.region_shift,
        regions_written: distribution.iter().map(|&(_, n)| n).sum(),
        hot_fraction: choice.hot_fraction,
        hot_write_share: choice.hot_write_share,
    }
}

/// How many times a read-only command reads the store before it reports that a key
/// it listed kept vanishing ([`look_again`]).
pub const LOOKS: u32 = 5;
/// The pause before the second look; it doubles before each later one (50, 100, 200,
/// 400 ms: 0.75 s in all).
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// Run `read` (a whole read-only read of the store: listings and the reads of what
/// they named) until it does not fail with a key that vanished under it
/// ([`is_vanished`]), at most [`LOOKS`] times, pausing between looks. Each look says
/// so on stderr (info). After the last, the error is returned saying the store kept
/// changing. Any other result is returned as it is.
pub async fn look_again<T>(what: &str, mut read: impl AsyncFnMut() -> Result<T>) -> Result<T> {
    let mut pause = FIRST_PAUSE;
    let mut look = 1;
    loop {
        match read().await {
            Err(e) if is_vanished(&e) && look < LOOKS => {
                look += 1;
                lsvd_store::log::info(&format!("{what}: {e}; looking again ({look} of {LOOKS})"));
                lsvd_store::clock::SharedClock::default().sleep(pause).await;
                pause *= 2;
            }
            Err(e) if is_vanished(&e) => {
                return Err(e.context(format!(
                    "{what}: the store kept changing under this read ({LOOKS} looks); run it again"
                )));
            }
            other => return other,
        }
    }
}

/// True if `sb`, a volume's newest superblock generation, says a server holds the
/// volume now: not written at a clean stop or by a delete, and its lease (renewed by
/// writing a generation every third of it) has not run out by this host's clock. Only
/// a hint for messages and for how readily to look again (another host's clock may
/// differ): a server that crashed looks held until its lease runs out.
pub fn held_now(sb: &lsvd_core::format::volume_super::VolumeSuper, now_unix_ms: u64) -> bool {
    !sb.clean
        && !sb.deleting
        && sb.lease_timeout_ms > 0
        && now_unix_ms
            < sb.written_unix_ms
                .saturating_add(u64::from(sb.lease_timeout_ms))
}

/// Milliseconds since the Unix epoch by this host's clock (0 if it is before it).
pub fn now_unix_ms() -> u64 {
    lsvd_store::clock::unix_ms_now()
}

/// The volume's size now: the creation size in its metadata, changed by any
/// `lsvd resize` in its object stream (so this recovers the store's state; a key that
/// vanished under the read is an error [`is_vanished`] recognizes: look again).
pub async fn current_size_bytes(store: &DynStore, meta: &VolumeMeta) -> Result<u64> {
    Ok(recover_store_view(store, meta)
        .await?
        .state
        .volume_size_bytes)
}

/// What the store says about volume `name` ([`VolumeInfo`]), read without changing
/// anything; a volume being changed by a server meanwhile is read again from a fresh
/// listing when a key vanishes under the read ([`look_again`]). `NotFound` if there is
/// no such volume.
pub async fn inspect_volume(store: &DynStore, name: &str) -> Result<VolumeInfo> {
    let meta = read_meta(store, name).await?;
    look_again(&format!("lsvd info {name}"), async || {
        inspect_meta(store, &meta).await
    })
    .await
}

/// One look at the volume `meta` describes.
async fn inspect_meta(store: &DynStore, meta: &VolumeMeta) -> Result<VolumeInfo> {
    let meta = meta.clone();
    let lineage = crate::lifecycle::lineage::load_lineage(store, &meta).await?;
    let mut rec = recover_store_view(store, &meta).await?;
    rec.state.set_shared_below(lineage.owned_from_seq());
    let s = &rec.state;
    let store_bytes = s.stored_bytes();
    // As GC weighs it: a clone's own objects only.
    let utilization = lsvd_core::gc::utilization(s);
    let listed = store
        .list(&crate::keys::objects_prefix(&meta.name))
        .await
        .map_err(|e| e.context(format!("cannot list the objects of {}", meta.name)))?;
    let store_listed_bytes = listed
        .iter()
        .filter(|e| {
            crate::keys::parse_object_name(&e.key)
                .is_some_and(|n| n.kind != lsvd_core::format::object::ObjectKind::Checkpoint)
        })
        .map(|e| e.size_bytes)
        .sum();
    let compression = crate::lifecycle::settings::read_settings(store, &meta)
        .await?
        .map_or_else(Default::default, |s| s.compression);
    Ok(VolumeInfo {
        name: meta.name.clone(),
        volume_id: meta.volume.to_string(),
        // The size the store's objects give it (`lsvd resize`), not the creation size.
        size_bytes: s.volume_size_bytes,
        created_unix_secs: meta.created_unix_secs,
        live_bytes: s.live_bytes(),
        store_bytes,
        store_listed_bytes,
        compression: compression.to_string(),
        encrypted: meta.encrypted,
        utilization,
        objects: s.objects().len() as u64,
        checkpoint_seq: rec.checkpoint_seq,
        closed_cleanly: rec.checkpoint_clean && rec.stranded.is_empty(),
        next_object_seq: s.next_object_seq(),
        last_record_seq: s.last_record_seq(),
        map_extents: s.map().extent_count() as u64,
        stranded_objects: rec.stranded.iter().map(|n| n.seq).collect(),
        client_write_bytes: rec.counters.client_write_bytes,
        store_write_bytes: rec.counters.store_write_bytes,
        write_amplification: if rec.counters.client_write_bytes == 0 {
            0.0
        } else {
            rec.counters.store_write_bytes as f64 / rec.counters.client_write_bytes as f64
        },
        gc_passes: rec.counters.gc_passes,
        gc_moved_bytes: rec.counters.gc_moved_bytes,
        gc_hot_moved_bytes: rec.counters.gc_hot_moved_bytes,
        gc_cold_moved_bytes: rec.counters.gc_cold_moved_bytes,
        heat: rec
            .heat
            .as_ref()
            .map(|h| heat_info(h, s.volume_size_bytes, utilization)),
        snapshots: crate::lifecycle::snapshot::list_snapshots(store, &meta)
            .await?
            .into_iter()
            .map(|r| r.name)
            .collect(),
        parent: lineage.parent(),
        clones: crate::lifecycle::lineage::list_clones(store, &meta.name)
            .await?
            .into_iter()
            .map(|l| format!("{} (from @{})", l.clone, l.snapshot))
            .collect(),
        replicas: crate::lifecycle::replicate::replica_statuses(store, &meta)
            .await?
            .into_iter()
            .map(|r| {
                let behind = s.next_object_seq().saturating_sub(r.replica_next_seq);
                ReplicaInfo::of(r, behind)
            })
            .collect(),
        replica_of: crate::lifecycle::replicate::replica_of(store, &meta)
            .await?
            .map(|r| ReplicaInfo::of(r, 0)),
    })
}

/// Names of the volumes in a store.
pub async fn list_volumes(store: &DynStore) -> Result<Vec<String>> {
    Ok(list_volumes_and_leftovers(store).await?.0)
}

/// Names of the volumes in a store, and names with keys (other than a deleted
/// volume's tombstone) but no metadata.
pub async fn list_volumes_and_leftovers(store: &DynStore) -> Result<(Vec<String>, Vec<String>)> {
    let entries = store
        .list("")
        .await
        .map_err(|e| e.context(format!("cannot list {}", store.describe())))?;
    let mut volumes = std::collections::BTreeSet::new();
    let mut prefixes = std::collections::BTreeSet::new();
    for e in &entries {
        if let Some(n) = e.key.strip_suffix("/meta").filter(|n| !n.contains('/')) {
            volumes.insert(n.to_string());
        }
        // Superblock generations alone are what a finished delete leaves.
        if let Some((n, _)) = e.key.split_once('/')
            && validate_volume_name(n).is_ok()
            && crate::keys::parse_super_name(&e.key).is_none()
        {
            prefixes.insert(n.to_string());
        }
    }
    let leftovers = prefixes.difference(&volumes).cloned().collect();
    Ok((volumes.into_iter().collect(), leftovers))
}

#[cfg(test)]
mod tests {
    //! A key that vanishes between a listing and its read (issue 41): a store that
    //! answers `NotFound` for the volume's checkpoint a given number of times stands
    //! for a server whose GC and checkpoints delete what a read-only command listed.

    use crate::test_support::create_and_open;
    use std::ops::Range;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use bytes::Bytes;

    use super::*;
    use crate::EngineConfig;
    use crate::recovery::store_recovery::recover_store;
    use lsvd_store::mem::MemStore;
    use lsvd_store::testutil::TempDir;
    use lsvd_store::{BoxFuture, ListEntry, ObjectStore, PutMode, StoreResult};

    /// `inner`, except that reads of a checkpoint are `NotFound` while `vanish` is
    /// above 0 (each one counted down), as if it was deleted after the listing.
    struct Vanishing {
        inner: DynStore,
        vanish: AtomicU32,
        reads: AtomicU32,
    }

    impl Vanishing {
        fn read(&self, key: &str) -> Option<Error> {
            if !key.ends_with(".c") {
                return None;
            }
            self.reads.fetch_add(1, Ordering::SeqCst);
            let left = self.vanish.load(Ordering::SeqCst);
            if left == 0 {
                return None;
            }
            self.vanish.store(left - 1, Ordering::SeqCst);
            Some(Error::new(ErrorKind::NotFound, format!("{key}: gone")))
        }
    }

    impl ObjectStore for Vanishing {
        fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
            self.inner.put(key, data, mode)
        }
        fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            match self.read(key) {
                Some(e) => Box::pin(async move { Err(e) }),
                None => self.inner.get(key),
            }
        }
        fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
            match self.read(key) {
                Some(e) => Box::pin(async move { Err(e) }),
                None => self.inner.get_range(key, range),
            }
        }
        fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
            self.inner.list(prefix)
        }
        fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
            self.inner.delete(key)
        }
        fn describe(&self) -> String {
            "vanishing".into()
        }
    }

    /// A volume `v` with data and a checkpoint (a clean stop), in memory.
    fn volume_with_a_checkpoint() -> MemStore {
        let mem = MemStore::new();
        let store: DynStore = Arc::new(mem.clone());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let dir = TempDir::new("look-again");
            let config = EngineConfig {
                log_size_bytes: 16 << 20,
                read_cache_bytes: 0,
                ..EngineConfig::default()
            };
            let (vol, _) = create_and_open(&store, "v", 4 << 20, dir.path(), config).await;
            vol.write(0, vec![7; 64 << 10], true).await.expect("write");
            vol.shutdown().await.expect("shutdown");
        });
        mem
    }

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_read_only_read_looks_again_when_a_listed_key_vanishes() {
        let mem = volume_with_a_checkpoint();
        let vanishing = Arc::new(Vanishing {
            inner: Arc::new(mem),
            vanish: AtomicU32::new(1),
            reads: AtomicU32::new(0),
        });
        let store: DynStore = vanishing.clone();
        paused().block_on(async {
            let meta = read_meta(&store, "v").await.expect("meta");
            // The view for a read-only command stops at the vanished checkpoint...
            let e = recover_store_view(&store, &meta)
                .await
                .err()
                .expect("vanished");
            assert!(is_vanished(&e), "{e}");
            assert!(e.to_string().contains("listed a moment before"), "{e}");
            // ...which recovery for a claimed volume passes over, as before.
            vanishing.vanish.store(1, Ordering::SeqCst);
            let rec = recover_store(&store, &meta).await.expect("passed over");
            assert_eq!(rec.skipped_checkpoints.len(), 1);

            // `lsvd info` looks again, and the second look sees the volume whole.
            vanishing.vanish.store(1, Ordering::SeqCst);
            vanishing.reads.store(0, Ordering::SeqCst);
            let info = inspect_volume(&store, "v").await.expect("info");
            assert_eq!(vanishing.reads.load(Ordering::SeqCst), 2, "two looks");
            assert_eq!(info.live_bytes, 64 << 10);
            assert!(info.closed_cleanly);

            // A key that keeps vanishing: LOOKS looks, then the error, saying so.
            vanishing.vanish.store(u32::MAX, Ordering::SeqCst);
            vanishing.reads.store(0, Ordering::SeqCst);
            let started = tokio::time::Instant::now();
            let e = inspect_volume(&store, "v")
                .await
                .expect_err("kept vanishing");
            assert_eq!(vanishing.reads.load(Ordering::SeqCst), LOOKS);
            assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
            assert!(e.to_string().contains("kept changing"), "{e}");
            // Paused between looks: 50 + 100 + 200 + 400 ms.
            assert_eq!(started.elapsed(), Duration::from_millis(750));

            // A volume that does not exist is not looked for again.
            vanishing.reads.store(0, Ordering::SeqCst);
            let e = inspect_volume(&store, "nosuch")
                .await
                .expect_err("no volume");
            assert!(e.is_not_found() && !is_vanished(&e), "{e}");
            assert_eq!(vanishing.reads.load(Ordering::SeqCst), 0);
        });
    }

    #[test]
    fn held_now_follows_the_lease() {
        let sb =
            |clean: bool, lease_timeout_ms: u32| lsvd_core::format::volume_super::VolumeSuper {
                volume: lsvd_core::format::VolumeId([1; 16]),
                generation: 3,
                session: 1,
                clean,
                deleting: false,
                newest_checkpoint: None,
                previous_checkpoint: None,
                durable_through: 0,
                last_record_seq: 0,
                written_unix_ms: 1_000_000,
                epoch: 1,
                lease_timeout_ms,
                holder: "lsvd serve".into(),
                history: lsvd_core::history::History::legacy(),
            };
        assert!(held_now(&sb(false, 10_000), 1_005_000));
        assert!(
            !held_now(&sb(false, 10_000), 1_010_000),
            "the lease ran out"
        );
        assert!(!held_now(&sb(true, 10_000), 1_005_000), "stopped cleanly");
        assert!(!held_now(&sb(false, 0), 1_005_000), "no lease kept");
    }
}
