//! Clones and their parents as the store's links say: where a clone's objects live
//! (the ancestors that own the objects below each snapshot it was made from,
//! [`Lineage`]), and which clones depend on a volume.
//!
//! Why a module of its own: the shared engine state holds the lineage (every object
//! key goes through it), snapshot deletes ask which clones depend on them, and
//! cloning (`crate::lifecycle::clone`) writes the links; keeping the reading below all three
//! keeps the state and the snapshot operations from importing the clone operations.

use lsvd_core::format::VolumeId;
use lsvd_core::format::clone_link::{CloneLink, decode_clone_link};
use lsvd_core::format::volume_meta::VolumeMeta;

use crate::store_meta::read_meta;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_store::DynStore;

/// An ancestor that owns the objects below `below_seq` (and at or above the next
/// older ancestor's).
#[derive(Debug, Clone)]
pub struct Ancestor {
    pub below_seq: u64,
    pub name: String,
    pub volume: VolumeId,
    /// The snapshot of it this chain goes through.
    pub snapshot: String,
}

/// Where a volume's objects live: its ancestors, oldest (lowest `below_seq`) first.
/// Empty for a volume that is not a clone.
#[derive(Debug, Clone, Default)]
pub struct Lineage(pub Vec<Ancestor>);

impl Lineage {
    /// The ancestor that owns object `seq`; None if the volume itself does.
    pub fn owner(&self, seq: u64) -> Option<&Ancestor> {
        self.0.iter().find(|a| seq < a.below_seq)
    }
    /// The first object the volume owns: every one below is an ancestor's (0 for a
    /// volume that is not a clone).
    pub fn owned_from_seq(&self) -> u64 {
        self.0.last().map_or(0, |a| a.below_seq)
    }
    /// The parent (the newest ancestor) as `name@snapshot`.
    pub fn parent(&self) -> Option<String> {
        self.0.last().map(|a| format!("{}@{}", a.name, a.snapshot))
    }
}

/// Deepest chain of clones of clones followed.
const MAX_CLONE_DEPTH: usize = 64;

/// `<clone>/parent`.
pub fn parent_key(clone: &str) -> String {
    format!("{clone}/parent")
}

/// `<parent>/clones/`: the links of a volume's clones.
pub fn clones_prefix(parent: &str) -> String {
    format!("{parent}/clones/")
}

pub fn child_key(parent: &str, clone: &str) -> String {
    format!("{parent}/clones/{clone}")
}

async fn read_link(store: &DynStore, key: &str) -> Result<Option<CloneLink>> {
    match store.get(key).await {
        Ok(bytes) => decode_clone_link(&bytes).map(Some).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("clone link {key} is corrupt"),
                e,
            )
        }),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.context(format!("cannot read {key}"))),
    }
}

/// The ancestors of `meta`'s volume, from its `parent` link up. A link that does not
/// name this volume, or a parent whose identity changed (deleted and created again),
/// is `Corrupt`/`NotFound`: the clone's shared objects are gone.
pub async fn load_lineage(store: &DynStore, meta: &VolumeMeta) -> Result<Lineage> {
    let mut chain = Vec::new();
    let mut current = meta.clone();
    while let Some(link) = read_link(store, &parent_key(&current.name)).await? {
        if link.clone != current.name || link.clone_volume != current.volume {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{} names another volume", parent_key(&current.name)),
            ));
        }
        if chain.len() >= MAX_CLONE_DEPTH {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "'{}' is a clone more than {MAX_CLONE_DEPTH} levels deep",
                    meta.name
                ),
            ));
        }
        let parent = read_meta(store, &link.parent).await.map_err(|e| {
            e.context(format!(
                "volume '{}' is a clone of {}@{}",
                current.name, link.parent, link.snapshot
            ))
        })?;
        if parent.volume != link.parent_volume {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "volume '{}' is a clone of {}@{}, but that volume was deleted and created again",
                    current.name, link.parent, link.snapshot
                ),
            ));
        }
        chain.push(Ancestor {
            below_seq: link.through_seq,
            name: link.parent.clone(),
            volume: link.parent_volume,
            snapshot: link.snapshot.clone(),
        });
        current = parent;
    }
    chain.reverse();
    Ok(Lineage(chain))
}

/// The clones made from `parent`'s snapshots, as their links say.
pub async fn list_clones(store: &DynStore, parent: &str) -> Result<Vec<CloneLink>> {
    let prefix = clones_prefix(parent);
    let listing = store
        .list(&prefix)
        .await
        .map_err(|e| e.context(format!("cannot list {prefix}")))?;
    let mut out = Vec::new();
    for e in listing {
        if let Some(link) = read_link(store, &e.key).await? {
            out.push(link);
        }
    }
    Ok(out)
}

/// Refuse (`Conflict`) when a clone still depends on `parent` (on its snapshot
/// `snapshot`, or on any of them when None), naming the clones.
pub async fn refuse_if_cloned(
    store: &DynStore,
    parent: &str,
    snapshot: Option<&str>,
) -> Result<()> {
    let clones: Vec<String> = list_clones(store, parent)
        .await?
        .into_iter()
        .filter(|l| snapshot.is_none_or(|s| s == l.snapshot))
        .map(|l| format!("{} (from {}@{})", l.clone, l.parent, l.snapshot))
        .collect();
    if clones.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Conflict,
        format!(
            "clones still depend on it: {}; delete them first (lsvd delete NAME --yes)",
            clones.join(", ")
        ),
    ))
}

/// Read `clone`'s parent link, if it is a clone.
pub async fn parent_link(store: &DynStore, clone: &str) -> Result<Option<CloneLink>> {
    read_link(store, &parent_key(clone)).await
}
