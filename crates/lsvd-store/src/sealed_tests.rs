use std::sync::Arc;

use super::*;
use crate::mem::MemStore;

fn user(b: u8) -> UserKey {
    UserKey::from_bytes([b; 32], "test.key")
}

fn sealed_over(inner: DynStore) -> SealedStore {
    let dk = DataKey::random().expect("random");
    SealedStore::new(inner, &dk)
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
}

const KEY: &str = "vol/obj/0000000000000001.0000000000000002.d";

#[tokio::test]
async fn objects_are_sealed_and_every_range_reads_back() {
    let inner: DynStore = Arc::new(MemStore::new());
    let store = sealed_over(inner.clone());
    // 1 MiB + 5: sealed and opened on the blocking pool (past INLINE_CRYPTO_BYTES).
    for n in [1usize, 4095, 4096, 4097, 3 * 4096 + 100, (1 << 20) + 5] {
        let plain = pattern(n);
        store
            .put(KEY, Bytes::from(plain.clone()), PutMode::Overwrite)
            .await
            .expect("put");
        let raw = inner.get(KEY).await.expect("raw");
        assert_eq!(raw.len() as u64, sealed_len(n as u64));
        assert_eq!(&raw[..8], b"LSVDSEAL");
        assert_eq!(store.get(KEY).await.expect("get"), plain);
        for (a, b) in [
            (0, 1),
            (0, n),
            (4095, 4097),
            (n - 1, n),
            (1, n + 5000),
            (n, n + 9),
        ] {
            let (a, b) = (a.min(n) as u64, b as u64);
            let got = store.get_range(KEY, a..b).await.expect("range");
            let want = &plain[a as usize..(b as usize).min(n)];
            assert_eq!(got, want, "n {n} range {a}..{b}");
        }
        let listed = store.list("vol/").await.expect("list");
        assert_eq!(listed[0].size_bytes, n as u64, "list gives plaintext sizes");
    }
}

#[tokio::test]
async fn no_plaintext_reaches_the_store_and_other_keys_pass_through() {
    let inner: DynStore = Arc::new(MemStore::new());
    let store = sealed_over(inner.clone());
    let marker = b"LSVD-SECRET-MARKER-0123456789".repeat(300);
    store
        .put(KEY, Bytes::from(marker.clone()), PutMode::Overwrite)
        .await
        .expect("put");
    let raw = inner.get(KEY).await.expect("raw");
    assert!(
        !raw.windows(12).any(|w| w == &marker[..12]),
        "plaintext stored"
    );
    // Metadata is not an object: stored as given.
    store
        .put("vol/meta", Bytes::from_static(b"meta"), PutMode::Overwrite)
        .await
        .expect("put meta");
    assert_eq!(inner.get("vol/meta").await.expect("meta"), b"meta");
    assert!(store.seals_objects() && !inner.seals_objects());
}

#[tokio::test]
async fn altered_moved_or_foreign_segments_are_refused() {
    let inner: DynStore = Arc::new(MemStore::new());
    let store = sealed_over(inner.clone());
    let plain = pattern(3 * 4096);
    store
        .put(KEY, Bytes::from(plain), PutMode::Overwrite)
        .await
        .expect("put");
    let raw = inner.get(KEY).await.expect("raw");
    // One bit anywhere in a segment.
    for at in [16, 16 + 8, 16 + 4000, 16 + 4119, raw.len() - 1] {
        let mut bad = raw.clone();
        bad[at] ^= 1;
        inner
            .put(KEY, Bytes::from(bad), PutMode::Overwrite)
            .await
            .expect("put");
        let e = store.get(KEY).await.expect_err("altered");
        assert_eq!(e.kind, ErrorKind::Corrupt, "{e}");
    }
    // Two segments swapped.
    let mut swapped = raw[..16].to_vec();
    swapped.extend_from_slice(&raw[16 + 4120..16 + 2 * 4120]);
    swapped.extend_from_slice(&raw[16..16 + 4120]);
    swapped.extend_from_slice(&raw[16 + 2 * 4120..]);
    inner
        .put(KEY, Bytes::from(swapped), PutMode::Overwrite)
        .await
        .expect("put");
    assert!(store.get_range(KEY, 0..10).await.is_err());
    // The same bytes under another object's name.
    let other = "vol/obj/0000000000000002.0000000000000002.d";
    inner
        .put(other, Bytes::from(raw.clone()), PutMode::Overwrite)
        .await
        .expect("put");
    assert!(store.get(other).await.is_err());
    // Another volume's data key.
    inner
        .put(KEY, Bytes::from(raw), PutMode::Overwrite)
        .await
        .expect("put");
    let foreign = sealed_over(inner.clone());
    assert_eq!(
        foreign.get(KEY).await.expect_err("foreign").kind,
        ErrorKind::Corrupt
    );
    // A plaintext object where a sealed one belongs.
    inner
        .put(
            KEY,
            Bytes::from_static(b"LSVDOBJ plain"),
            PutMode::Overwrite,
        )
        .await
        .expect("put");
    let e = store.get(KEY).await.expect_err("plain");
    assert!(e.to_string().contains("not sealed"), "{e}");
}

#[test]
fn wrapped_keys_unwrap_only_with_their_user_key() {
    let dk = DataKey::random().expect("random");
    let record = dk.wrap(&user(1)).expect("wrap");
    let back = DataKey::unwrap(&record, &user(1), "vol").expect("unwrap");
    assert_eq!(back.0, dk.0);
    let e = DataKey::unwrap(&record, &user(2), "vol")
        .err()
        .expect("a wrong key is refused");
    assert_eq!(e.kind, ErrorKind::Denied);
    assert!(e.to_string().contains("volume 'vol'"), "{e}");
    // Rewrapped under another key, the same data key.
    let again = back.wrap(&user(2)).expect("rewrap");
    assert_eq!(
        DataKey::unwrap(&again, &user(2), "vol").expect("new").0,
        dk.0
    );
    assert_ne!(record.key_id, again.key_id);
}

#[test]
fn key_files_hold_32_bytes_or_64_hex_digits() {
    let dir = std::env::temp_dir().join(format!("lsvd-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let raw = dir.join("raw.key");
    std::fs::write(&raw, [7u8; 32]).expect("write");
    let hexed = dir.join("hex.key");
    std::fs::write(&hexed, format!("{}\n", "07".repeat(32))).expect("write");
    let short = dir.join("short.key");
    std::fs::write(&short, [7u8; 16]).expect("write");
    let a = UserKey::from_file(&raw).expect("raw");
    let b = UserKey::from_file(&hexed).expect("hex");
    assert_eq!(a.bytes, b.bytes);
    let e = UserKey::from_file(&short).expect_err("short");
    assert_eq!(e.kind, ErrorKind::BadInput);
    assert!(e.to_string().contains("head -c 32 /dev/urandom"), "{e}");
    assert!(!format!("{a:?}").contains("0707"), "Debug leaks the key");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Local keys (`--encrypt-local`) are the same for the same data key and volume, and
/// differ between volumes sharing a data key (a clone and its base) and between files.
#[test]
fn local_keys_are_per_volume_and_per_file() {
    let dk = DataKey::random().expect("random");
    let (a, a_again, clone) = (
        dk.local_keys(&[1; 16]).expect("keys"),
        dk.local_keys(&[1; 16]).expect("keys"),
        dk.local_keys(&[2; 16]).expect("keys"),
    );
    assert_eq!(a.id, a_again.id);
    assert_ne!(a.id, clone.id);
    let sealed = |k: &crate::xts::XtsKey| {
        let mut b = vec![7u8; 512];
        k.encrypt(&mut b, 8192).expect("encrypt");
        b
    };
    assert_eq!(sealed(&a.write_log), sealed(&a_again.write_log));
    assert_ne!(sealed(&a.write_log), sealed(&clone.write_log));
    assert_ne!(sealed(&a.write_log), sealed(&a.read_cache));
    assert_ne!(sealed(&a.read_cache), sealed(&a.slot_table));
}
