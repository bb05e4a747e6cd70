//! Encryption at rest: the keys, and the store decorator that seals a volume's objects.
//!
//! Why a store decorator: every byte of client data and every map an encrypted volume
//! keeps in the store lives in its objects (`<volume>/obj/...`: data, GC output,
//! checkpoints). Sealing them where they cross into the store leaves every format and
//! every code path above unchanged (the engine, GC, recovery, `check` read and write
//! plaintext), and nothing can reach the store around it. The other keys of a volume
//! (metadata, settings, superblocks, snapshot and clone records, this key record)
//! hold sizes, names and sequence numbers, no client data; they pass through, so
//! `delete`, `rename`, `list` and the fencing work need no key.
//!
//! The cipher (docs/format/sealed.md): AES-256-GCM from aws-lc-rs (the crypto rustls
//! and the S3 client already use). Each object has its own key, HKDF-SHA256 of the
//! volume's data key with the object's name (`obj/<seq>.<epoch>.<kind>`: names are
//! never reused) as info. An object is cut into 4 KiB segments (format/sealed.rs);
//! segment `i` is sealed with nonce `random(8) || i (u32, big-endian)`, the random
//! part stored before it. Within an object the index makes nonces distinct; across
//! objects the keys differ; and an object name sealed twice (a retried upload
//! re-sealed) draws fresh random parts. Truncating an object at a segment boundary is
//! not caught here but by the object's own header, which gives its length.
//!
//! The data key is random per volume; the user's key (a file of 32 random bytes)
//! only wraps it, in `<volume>/keys` (format/volume_keys.rs).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::{hkdf, hmac};
use bytes::Bytes;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::format::sealed::{
    NONCE_RANDOM_BYTES, SEALED_HEADER_BYTES, SEGMENT_PLAIN_BYTES, TAG_BYTES, decode_sealed_header,
    encode_sealed_header, plain_len, sealed_len, segments_for, split_segments,
};
use lsvd_core::format::volume_keys::{CIPHER_AES256_GCM, VolumeKeys};

use crate::xts::{LocalKeys, XtsKey};
use crate::{
    BoxFuture, CopyBytes, DynStore, ListEntry, ObjectStore, Placement, PutMode, StoreMetric,
    StoreResult,
};

const KEY_BYTES: usize = 32;
const WRAP_AAD: &[u8] = b"lsvd volume keys v1";
const KEY_ID_LABEL: &[u8] = b"lsvd key id v1";
const OBJECT_KEY_SALT: &[u8] = b"lsvd object key v1";
const LOCAL_KEY_SALT: &[u8] = b"lsvd local key v1";
/// Derived object keys kept for reuse (each is an HKDF and an AES key schedule).
const KEY_CACHE_ENTRIES: usize = 4096;

/// The user's key (key-encryption key): 32 bytes from a file, never stored.
pub struct UserKey {
    bytes: [u8; KEY_BYTES],
    /// Where it came from, for messages.
    source: String,
}

impl std::fmt::Debug for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserKey({}, id {})", self.source, hex(&self.id()))
    }
}

impl UserKey {
    /// Read a key file: 32 bytes (`head -c 32 /dev/urandom > vol.key`), or the same
    /// as 64 hexadecimal digits (a trailing newline allowed).
    pub fn from_file(path: &Path) -> Result<UserKey> {
        let raw = std::fs::read(path)
            .map_err(|e| Error::local_io(format!("cannot read key file {}", path.display()), e))?;
        let source = path.display().to_string();
        let text = std::str::from_utf8(&raw).ok().map(str::trim_end);
        let bytes = match (raw.len(), text) {
            (KEY_BYTES, _) => raw.try_into().ok(),
            (_, Some(t)) if t.len() == 2 * KEY_BYTES => from_hex(t),
            _ => None,
        };
        let bytes = bytes.ok_or_else(|| {
            Error::bad_input(format!(
                "key file {source} holds {} bytes; a key file holds 32 random bytes \
                 (make one with: head -c 32 /dev/urandom > {source}) or 64 hex digits",
                std::fs::metadata(path).map_or(0, |m| m.len())
            ))
        })?;
        Ok(UserKey { bytes, source })
    }

    /// A key from bytes (tests, tools); `source` names it in messages.
    pub fn from_bytes(bytes: [u8; KEY_BYTES], source: &str) -> UserKey {
        UserKey {
            bytes,
            source: source.to_string(),
        }
    }

    /// Names the key without revealing it.
    pub fn id(&self) -> [u8; 8] {
        let tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, &self.bytes),
            KEY_ID_LABEL,
        );
        let mut id = [0u8; 8];
        id.copy_from_slice(&tag.as_ref()[..8]);
        id
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

impl Drop for UserKey {
    fn drop(&mut self) {
        self.bytes.fill(0);
    }
}

/// A volume's data key: encrypts its objects for its whole life.
pub struct DataKey([u8; KEY_BYTES]);

impl Drop for DataKey {
    fn drop(&mut self) {
        self.0.fill(0);
    }
}

impl DataKey {
    /// A new random key (`lsvd create --encrypt`).
    pub fn random() -> Result<DataKey> {
        let mut k = [0u8; KEY_BYTES];
        aws_lc_rs::rand::fill(&mut k)
            .map_err(|_| Error::new(ErrorKind::LocalIo, "no random bytes for a new data key"))?;
        Ok(DataKey(k))
    }

    /// The key record holding this key wrapped under `user`.
    pub fn wrap(&self, user: &UserKey) -> Result<VolumeKeys> {
        let mut nonce = [0u8; 12];
        aws_lc_rs::rand::fill(&mut nonce)
            .map_err(|_| Error::new(ErrorKind::LocalIo, "no random bytes for a nonce"))?;
        let mut sealed = self.0.to_vec();
        let tag = aes_key(&user.bytes)
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(WRAP_AAD),
                &mut sealed,
            )
            .map_err(|_| Error::new(ErrorKind::LocalIo, "sealing the data key failed"))?;
        sealed.extend_from_slice(tag.as_ref());
        Ok(VolumeKeys {
            cipher: CIPHER_AES256_GCM,
            key_id: user.id(),
            nonce,
            wrapped_key: sealed
                .try_into()
                .expect("a 32-byte key and a 16-byte tag make 48 bytes"),
        })
    }

    /// The keys of volume `volume_id`'s local files (`--encrypt-local`): HKDF-SHA256
    /// of the data key with the file and the volume id (a clone shares its base's
    /// data key, not its local keys), so they stay the same across key rotations
    /// (docs/format/local-encryption.md).
    pub fn local_keys(&self, volume_id: &[u8; 16]) -> Result<LocalKeys> {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, LOCAL_KEY_SALT).extract(&self.0);
        let derive = |label: &[u8], out: &mut [u8]| {
            prk.expand(&[label, &volume_id[..]], Len(out.len()))
                .and_then(|okm| okm.fill(out))
                .map_err(|_| Error::new(ErrorKind::LocalIo, "deriving a local key failed"))
        };
        let xts = |label: &[u8]| -> Result<Arc<XtsKey>> {
            let mut k = [0u8; 64];
            derive(label, &mut k)?;
            let key = XtsKey::new(&k);
            k.fill(0);
            key.map(Arc::new)
        };
        let mut id = [0u8; 8];
        derive(b"id", &mut id)?;
        Ok(LocalKeys {
            id,
            write_log: xts(b"wlog")?,
            read_cache: xts(b"rcache")?,
            slot_table: xts(b"rcache.slots")?,
        })
    }

    /// The data key in `record`, unwrapped with `user`; `Denied` naming `volume` if
    /// `user` is not the key it was wrapped with.
    pub fn unwrap(record: &VolumeKeys, user: &UserKey, volume: &str) -> Result<DataKey> {
        let mut buf = record.wrapped_key;
        let opened = aes_key(&user.bytes)
            .open_in_place(
                Nonce::assume_unique_for_key(record.nonce),
                Aad::from(WRAP_AAD),
                &mut buf,
            )
            .ok()
            .and_then(|k| <[u8; KEY_BYTES]>::try_from(&*k).ok());
        buf.fill(0);
        opened.map(DataKey).ok_or_else(|| {
            Error::new(
                ErrorKind::Denied,
                format!(
                    "volume '{volume}': the key in {} (id {}) does not unlock it; its key has id {}",
                    user.source,
                    hex(&user.id()),
                    hex(&record.key_id)
                ),
            )
        })
    }
}

/// Seals and opens the objects of one volume (and its ancestors', for a clone that
/// kept its base's key).
struct ObjectCipher {
    prk: hkdf::Prk,
    keys: Mutex<HashMap<String, Arc<LessSafeKey>>>,
}

impl ObjectCipher {
    fn new(data_key: &DataKey) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, OBJECT_KEY_SALT).extract(&data_key.0);
        ObjectCipher {
            prk,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// The key of the object named `name` (`obj/...`).
    fn key(&self, name: &str) -> Result<Arc<LessSafeKey>> {
        let mut keys = self.keys.lock().expect("key cache lock is never poisoned");
        if let Some(k) = keys.get(name) {
            return Ok(k.clone());
        }
        let info = [name.as_bytes()];
        let okm = self
            .prk
            .expand(&info, &AES_256_GCM)
            .map_err(|_| Error::new(ErrorKind::LocalIo, "deriving an object key failed"))?;
        let key = Arc::new(LessSafeKey::new(UnboundKey::from(okm)));
        if keys.len() >= KEY_CACHE_ENTRIES {
            keys.clear();
        }
        keys.insert(name.to_string(), key.clone());
        Ok(key)
    }

    fn seal(&self, name: &str, plain: &[u8]) -> Result<Vec<u8>> {
        let key = self.key(name)?;
        let mut out = Vec::with_capacity(sealed_len(plain.len() as u64) as usize);
        out.extend_from_slice(&encode_sealed_header());
        // Every segment's random nonce part, drawn at once (one call, not one per 4 KiB).
        let segments = plain.len().div_ceil(SEGMENT_PLAIN_BYTES as usize);
        let mut randoms = vec![0u8; segments * NONCE_RANDOM_BYTES as usize];
        os_random(&mut randoms)?;
        let randoms = randoms.chunks_exact(NONCE_RANDOM_BYTES as usize);
        for ((i, segment), random) in plain
            .chunks(SEGMENT_PLAIN_BYTES as usize)
            .enumerate()
            .zip(randoms)
        {
            let random: [u8; 8] = random.try_into().expect("chunks of 8");
            out.extend_from_slice(&random);
            let start = out.len();
            out.extend_from_slice(segment);
            let tag = key
                .seal_in_place_separate_tag(
                    nonce(random, i as u64)?,
                    Aad::empty(),
                    &mut out[start..],
                )
                .map_err(|_| Error::new(ErrorKind::LocalIo, "sealing a segment failed"))?;
            out.extend_from_slice(tag.as_ref());
        }
        Ok(out)
    }

    /// Open whole segments `stored`, the first of them segment `first`.
    fn open(&self, key_name: &str, name: &str, first: u64, stored: &[u8]) -> Result<Vec<u8>> {
        let key = self.key(name)?;
        let corrupt = |why: &str| {
            Error::new(
                ErrorKind::Corrupt,
                format!("object {key_name} {why} (altered, or sealed with another volume's key)"),
            )
        };
        let segments = split_segments(stored).map_err(|e| corrupt(&e.to_string()))?;
        let mut out = Vec::with_capacity(stored.len());
        for (j, segment) in segments.into_iter().enumerate() {
            let (random, body) = segment.split_at(NONCE_RANDOM_BYTES as usize);
            let random: [u8; 8] = random.try_into().expect("split at 8");
            let start = out.len();
            out.extend_from_slice(body);
            let n = key
                .open_in_place(
                    nonce(random, first + j as u64)?,
                    Aad::empty(),
                    &mut out[start..],
                )
                .map_err(|_| {
                    corrupt(&format!(
                        "fails authentication in segment {}",
                        first + j as u64
                    ))
                })?
                .len();
            out.truncate(start + n);
        }
        Ok(out)
    }
}

fn nonce(random: [u8; 8], index: u64) -> Result<Nonce> {
    let index = u32::try_from(index)
        .map_err(|_| Error::bad_input("an object of more than 2^32 segments (16 TiB)"))?;
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&random);
    n[8..].copy_from_slice(&index.to_be_bytes());
    Ok(Nonce::assume_unique_for_key(n))
}

/// `buf` filled by the kernel's CSPRNG (`getrandom(2)`), for the nonces' random parts.
/// Not aws-lc's RNG: its per-thread generator seeds itself from a jitter entropy
/// source, and the upload threads come and go, so it cost half the instructions of an
/// encrypted write (callgrind); one system call per object costs next to nothing.
fn os_random(buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the
        // duration of the call; getrandom writes at most that many.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::local_io("no random bytes for nonces (getrandom)", e));
        }
        done += n as usize;
    }
    Ok(())
}

fn aes_key(bytes: &[u8; KEY_BYTES]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(t: &str) -> Option<[u8; KEY_BYTES]> {
    let mut out = [0u8; KEY_BYTES];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The name an object's key derives from (`obj/...`, the same under any volume name:
/// a rename copies objects byte for byte), or None for keys that are not objects.
fn object_name(key: &str) -> Option<&str> {
    key.find("/obj/").map(|i| &key[i + 1..])
}

/// [`ObjectStore`] over an inner store that seals objects on the way in and opens
/// them on the way out; other keys pass through.
pub struct SealedStore {
    inner: DynStore,
    cipher: Arc<ObjectCipher>,
}

impl SealedStore {
    pub fn new(inner: DynStore, data_key: &DataKey) -> Self {
        SealedStore {
            inner,
            cipher: Arc::new(ObjectCipher::new(data_key)),
        }
    }

    async fn seal_body(&self, key: &str, data: Bytes) -> Result<Bytes> {
        if object_name(key).is_none() {
            return Ok(data);
        }
        let (cipher, key) = (self.cipher.clone(), key.to_string());
        off_runtime(data.len(), move || {
            let name = object_name(&key).expect("checked above");
            Ok(Bytes::from(cipher.seal(name, &data)?))
        })
        .await
    }

    async fn open_whole(&self, key: &str, bytes: Vec<u8>) -> Result<Vec<u8>> {
        if object_name(key).is_none() {
            return Ok(bytes);
        }
        decode_sealed_header(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("object {key} is not sealed ({e}); was it written without encryption?"),
            )
        })?;
        self.open_segments(key, 0, bytes, SEALED_HEADER_BYTES as usize)
            .await
    }

    /// Open the whole segments in `stored[from..]`, the first of them segment `first`.
    async fn open_segments(
        &self,
        key: &str,
        first: u64,
        stored: Vec<u8>,
        from: usize,
    ) -> Result<Vec<u8>> {
        let (cipher, key) = (self.cipher.clone(), key.to_string());
        off_runtime(stored.len(), move || {
            let name = object_name(&key).expect("an object's key");
            cipher.open(&key, name, first, stored.get(from..).unwrap_or_default())
        })
        .await
    }

    async fn ranged(&self, key: &str, range: Range<u64>, background: bool) -> Result<Vec<u8>> {
        if object_name(key).is_none() {
            return match background {
                true => self.inner.get_range_background(key, range).await,
                false => self.inner.get_range(key, range).await,
            };
        }
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let (first, stored) = segments_for(&range);
        let bytes = match background {
            true => self.inner.get_range_background(key, stored).await?,
            false => self.inner.get_range(key, stored).await?,
        };
        let plain = self.open_segments(key, first, bytes, 0).await?;
        Ok(slice_of(plain, first, &range))
    }
}

/// Sealing or opening more than this runs on the blocking pool, as the local store's
/// large reads do: AES-GCM over a whole object takes milliseconds, which a runtime
/// thread (serving leases, uploads, the async API) must not spend. A client's 4 KiB
/// read opens one or two segments inline.
const INLINE_CRYPTO_BYTES: usize = 256 << 10;

async fn off_runtime<T: Send + 'static>(
    len: usize,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match len <= INLINE_CRYPTO_BYTES {
        true => f(),
        false => crate::fs::blocking(f).await,
    }
}

/// `range` (plaintext offsets) out of the plaintext of segments from `first` on.
fn slice_of(mut plain: Vec<u8>, first: u64, range: &Range<u64>) -> Vec<u8> {
    let from = ((range.start - first * SEGMENT_PLAIN_BYTES) as usize).min(plain.len());
    let to = (from + (range.end - range.start) as usize).min(plain.len());
    plain.truncate(to);
    plain.drain(..from);
    plain
}

impl ObjectStore for SealedStore {
    fn put(&self, key: &str, data: Bytes, mode: PutMode) -> BoxFuture<'_, StoreResult<()>> {
        self.put_placed(key, data, mode, &Placement::Client)
    }
    fn put_placed(
        &self,
        key: &str,
        data: Bytes,
        mode: PutMode,
        placement: &Placement,
    ) -> BoxFuture<'_, StoreResult<()>> {
        let (key, placement) = (key.to_string(), placement.clone());
        Box::pin(async move {
            let body = self.seal_body(&key, data).await?;
            self.inner.put_placed(&key, body, mode, &placement).await
        })
    }
    fn get(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            let bytes = self.inner.get(&key).await?;
            self.open_whole(&key, bytes).await
        })
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move { self.ranged(&key, range, false).await })
    }
    fn get_range_background(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move { self.ranged(&key, range, true).await })
    }
    fn list(&self, prefix: &str) -> BoxFuture<'_, StoreResult<Vec<ListEntry>>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let mut entries = self.inner.list(&prefix).await?;
            for e in &mut entries {
                if object_name(&e.key).is_some() {
                    e.size_bytes = plain_len(e.size_bytes).unwrap_or(e.size_bytes);
                }
            }
            Ok(entries)
        })
    }
    fn delete(&self, key: &str) -> BoxFuture<'_, StoreResult<()>> {
        self.inner.delete(key)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn admit_uploads_to_cache(&self) -> bool {
        self.inner.admit_uploads_to_cache()
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        self.inner.metrics()
    }
    fn seals_objects(&self) -> bool {
        true
    }
    fn get_range_copies(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> BoxFuture<'_, StoreResult<Vec<CopyBytes>>> {
        let key = key.to_string();
        Box::pin(async move {
            let Some(name) = object_name(&key) else {
                return self.inner.get_range_copies(&key, range).await;
            };
            if range.is_empty() {
                return self.inner.get_range_copies(&key, range).await;
            }
            let (first, stored) = segments_for(&range);
            let copies = self.inner.get_range_copies(&key, stored).await?;
            // A copy that fails authentication is one that cannot be read: left out.
            Ok(copies
                .into_iter()
                .filter_map(|c| {
                    let plain = self.cipher.open(&key, name, first, &c.bytes).ok()?;
                    Some(CopyBytes {
                        copy: c.copy,
                        bytes: slice_of(plain, first, &range),
                    })
                })
                .collect())
        })
    }
    /// The good plaintext is sealed afresh, so every copy differs from it and every
    /// copy is rewritten (a repair is rare; the copies then hold equal plaintext).
    fn repair_copies(&self, key: &str, good: Bytes) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        let key = key.to_string();
        Box::pin(async move {
            let body = self.seal_body(&key, good).await?;
            self.inner.repair_copies(&key, body).await
        })
    }
    fn copies_of(&self, key: &str) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        self.inner.copies_of(key)
    }
    fn get_copy(&self, key: &str, copy: usize) -> BoxFuture<'_, StoreResult<Vec<u8>>> {
        let key = key.to_string();
        Box::pin(async move {
            let bytes = self.inner.get_copy(&key, copy).await?;
            self.open_whole(&key, bytes).await
        })
    }
}

#[cfg(test)]
#[path = "sealed_tests.rs"]
mod tests;

/// `TAG_BYTES` is what aws-lc-rs appends; the layout's constant must agree.
const _: () = assert!(TAG_BYTES as usize == 16);
