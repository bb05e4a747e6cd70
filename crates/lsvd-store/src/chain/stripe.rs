//! The striped store (`stripe:DIR0,DIR1,...`): one log spread over every drive, the
//! "log over RAID-0" baseline the chained store is compared with.
//!
//! Each key lives on the drive a hash of its name picks ([`home_drive`]), so every
//! operation goes to exactly one drive, put-if-absent is the local store's atomic link
//! (between processes too), and there is no index to keep. Placement hints are
//! ignored: client and GC writes land on every drive alike.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::drives::{DriveSpec, describe};
use super::meta::{DRIVE_RECORD_NAME, Layout};
use super::open::open_drives;
use super::position::{Drive, Read, mirror_metrics};
use super::{home_drive, merge_listings, reserved_key_error};
use crate::fs::{blocking, valid_key};
use crate::{
    BoxFuture, CopyBytes, ListEntry, ObjectStore, OpenMode, PutMode, StoreMetric, StoreResult,
};
use lsvd_core::error::{Error, Result};

#[derive(Clone)]
pub struct StripeStore {
    drives: Arc<Vec<Drive>>,
    describe: String,
}

impl StripeStore {
    /// Open (or create, if every directory is blank) the stripe `spec` describes.
    pub fn open(spec: &DriveSpec) -> Result<StripeStore> {
        Self::open_mode(spec, OpenMode::ReadWrite)
    }

    /// [`open`](Self::open) in `mode` (read-only: see [`super::open`]).
    pub fn open_mode(spec: &DriveSpec, mode: OpenMode) -> Result<StripeStore> {
        if spec.drive_size_bytes.is_some() {
            return Err(Error::bad_input(
                "stripe: drive_size applies to chain: only (a stripe fills its drives evenly)",
            ));
        }
        let opened = open_drives(&spec.dirs, Layout::Stripe, mode)?;
        let describe = describe("stripe", &opened.drives);
        Ok(StripeStore {
            drives: Arc::new(opened.drives),
            describe,
        })
    }

    /// The drive `key` lives on; refuses invalid keys and the drive record's name.
    fn home(&self, key: &str) -> StoreResult<&Drive> {
        if key == DRIVE_RECORD_NAME {
            return Err(reserved_key_error(key));
        }
        valid_key(key)?;
        Ok(&self.drives[home_drive(key, self.drives.len())])
    }

    async fn read(&self, key: String, read: Read) -> StoreResult<Vec<u8>> {
        self.home(&key)?.read(&key, &read).await
    }
}

impl ObjectStore for StripeStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        Box::pin(async move { self.home(&key)?.put(&key, data, mode).await })
    }
    super::reads_through_read!();
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let (drives, prefix) = (self.drives.clone(), prefix.to_string());
        Box::pin(blocking(move || merge_listings(&drives, &prefix)))
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        let key = key.to_string();
        Box::pin(async move { self.home(&key)?.delete(&key).await })
    }
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn is_local(&self) -> bool {
        true
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        mirror_metrics(&self.drives)
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        let key = key.to_string();
        Box::pin(async move { self.home(&key)?.read_copies(&key, range).await })
    }
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let key = key.to_string();
        Box::pin(async move { self.home(&key)?.rewrite_differing(&key, good).await })
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let key = key.to_string();
        Box::pin(async move { Ok(self.home(&key)?.copy_names()) })
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move { self.home(&key)?.read_one_copy(&key, copy).await })
    }
}
