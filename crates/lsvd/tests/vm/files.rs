//! The file tree the guest writes and the oracle that judges what a boot finds.
//!
//! A file's path is `rR/dD/fI-SIZE` and its content is a function of the round's seed
//! and the path (64-byte lines `"SEED PATH LINE"` padded to 63 bytes plus a newline,
//! cut at SIZE), so the host knows every file's expected bytes from its name alone,
//! whether or not the guest reported it synced.

use std::collections::BTreeMap;

/// The seed of the guest's file contents in `round` (a 31-bit number: the guest's
/// shell LCG works modulo 2^31).
pub fn content_seed(base_seed: u64, round: u32) -> u32 {
    (mix(base_seed ^ u64::from(round).wrapping_mul(0xA24B_AED4_963E_E407)) % (1 << 31)) as u32
}

/// splitmix64's finaliser: spreads a seed over all bits.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes the guest writes to `path` (what `gen` in scripts/vm/init.sh prints).
pub fn content(seed: u32, path: &str, size: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(size as usize + 64);
    let mut line = 0u64;
    while (out.len() as u64) < size {
        let text = format!("{seed} {path} {line}");
        out.extend_from_slice(format!("{text:<63}\n").as_bytes());
        line += 1;
    }
    out.truncate(size as usize);
    out
}

/// CRC-32 (IEEE 802.3, zlib's; what busybox `crc32` prints).
pub fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// `rR/dD/fI-SIZE` -> (R, SIZE).
pub fn parse_path(path: &str) -> Option<(u32, u64)> {
    let mut parts = path.split('/');
    let round = parts.next()?.strip_prefix('r')?.parse().ok()?;
    parts.next()?.strip_prefix('d')?.parse::<u32>().ok()?;
    let (_, size) = parts.next()?.strip_prefix('f')?.split_once('-')?;
    if parts.next().is_some() {
        return None;
    }
    Some((round, size.parse().ok()?))
}

/// A file as one line of the guest reports it: `PATH SIZE CRC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileState {
    pub path: String,
    pub size: u64,
    pub crc: u32,
}

impl FileState {
    pub fn parse(rest: &str) -> Option<FileState> {
        let mut it = rest.split_whitespace();
        let path = it.next()?.to_string();
        let size = it.next()?.parse().ok()?;
        let crc = u32::from_str_radix(it.next()?, 16).ok()?;
        it.next().is_none().then_some(FileState { path, size, crc })
    }
}

/// The CRC a complete file at `path` must have, or why the name is not one of ours.
pub fn expected(base_seed: u64, path: &str) -> Result<(u64, u32), String> {
    let (round, size) = parse_path(path).ok_or_else(|| format!("unexpected file {path}"))?;
    let seed = content_seed(base_seed, round);
    Ok((size, crc32(&content(seed, path, size))))
}

/// What the crash that ended a round promises about the synced files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// Cache intact: every synced file is intact.
    AllSynced,
    /// Cache lost: the synced files before `floor` (in sync order) are intact, and the
    /// intact ones form a prefix of the sync order.
    Prefix { floor: usize },
}

/// The result of judging one boot's file list.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Synced files found intact.
    pub intact: usize,
    /// Synced files lost (only allowed past the floor when the cache was lost).
    pub lost: usize,
    /// Files found shorter than their name says (never synced: a crash mid-write).
    pub partial: usize,
    /// Complete files that were never reported synced (written just before the crash).
    pub unsynced_complete: usize,
    pub errors: Vec<String>,
}

/// Judges the files a boot found (`have`) against the synced files in sync order
/// (`synced`). On success the synced list is cut to the intact prefix (a cache-lost
/// round may have lost its tail).
pub fn judge(
    base_seed: u64,
    have: &[FileState],
    synced: &mut Vec<FileState>,
    promise: Promise,
) -> Verdict {
    let mut v = Verdict::default();
    let found: BTreeMap<&str, &FileState> = have.iter().map(|f| (f.path.as_str(), f)).collect();
    // Every file found: complete ones have exactly the right bytes.
    for f in have {
        match expected(base_seed, &f.path) {
            Err(e) => v.errors.push(e),
            Ok((size, crc)) => {
                if f.size > size {
                    v.errors.push(format!(
                        "{} has {} bytes, more than written",
                        f.path, f.size
                    ));
                } else if f.size < size {
                    v.partial += 1;
                } else if f.crc != crc {
                    v.errors.push(format!(
                        "{} is complete but its content is wrong (crc {:08x}, expected {crc:08x})",
                        f.path, f.crc
                    ));
                } else if !synced.iter().any(|s| s.path == f.path) {
                    v.unsynced_complete += 1;
                }
            }
        }
    }
    let intact: Vec<bool> = synced
        .iter()
        .map(|s| found.get(s.path.as_str()).is_some_and(|f| *f == s))
        .collect();
    let first_lost = intact.iter().position(|ok| !ok).unwrap_or(intact.len());
    v.intact = intact.iter().filter(|ok| **ok).count();
    v.lost = synced.len() - v.intact;
    let describe = |i: usize| match found.get(synced[i].path.as_str()) {
        None => format!("{} (synced #{i}) is missing", synced[i].path),
        Some(f) => format!(
            "{} (synced #{i}) is damaged: {} bytes crc {:08x}, synced {} bytes crc {:08x}",
            synced[i].path, f.size, f.crc, synced[i].size, synced[i].crc
        ),
    };
    match promise {
        Promise::AllSynced => {
            for i in (0..synced.len()).filter(|&i| !intact[i]) {
                v.errors.push(format!("cache intact: {}", describe(i)));
            }
        }
        Promise::Prefix { floor } => {
            for i in (0..floor.min(synced.len())).filter(|&i| !intact[i]) {
                v.errors
                    .push(format!("made durable in the store, yet {}", describe(i)));
            }
            if let Some(j) = (first_lost..synced.len()).find(|&j| intact[j]) {
                v.errors.push(format!(
                    "not a prefix: {} (synced #{j}) is intact but {}",
                    synced[j].path,
                    describe(first_lost)
                ));
            }
        }
    }
    if v.errors.is_empty() {
        synced.truncate(first_lost);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_zlib() {
        // busybox crc32 of "hello\n" (and zlib.crc32).
        assert_eq!(crc32(b"hello\n"), 0x363a_3020);
    }

    #[test]
    fn content_matches_the_guests_awk() {
        // Reported by the guest (scripts/vm/init.sh) with lsvd.seed=12345.
        for (path, size, crc) in [
            ("r1/d0/f0-198048", 198_048, 0x7caa_af3f),
            ("r1/d2/f10-306", 306, 0x652b_53a9),
            ("r1/d3/f3-57344", 57_344, 0x0d77_b19e),
        ] {
            let data = content(12345, path, size);
            assert_eq!(data.len() as u64, size);
            assert_eq!(crc32(&data), crc, "{path}");
        }
        assert_eq!(parse_path("r1/d2/f10-306"), Some((1, 306)));
        assert_eq!(parse_path("r1/d2/f10-306/x"), None);
        assert_eq!(parse_path("lost+found"), None);
    }

    fn file(base: u64, round: u32, i: u32, size: u64) -> FileState {
        let path = format!("r{round}/d{}/f{i}-{size}", i % 4);
        let (_, crc) = expected(base, &path).expect("our name");
        FileState { path, size, crc }
    }

    /// The oracle rejects what it must: a lost synced file with the cache intact, a
    /// lost file below the floor, a hole in the prefix, wrong bytes, a foreign file.
    #[test]
    fn judge_rejects_violations() {
        let base = 5;
        let all: Vec<FileState> = (0..6)
            .map(|i| file(base, 1, i, 1000 + u64::from(i)))
            .collect();

        // Everything there: fine under both promises.
        for promise in [Promise::AllSynced, Promise::Prefix { floor: 6 }] {
            let mut synced = all.clone();
            let v = judge(base, &all, &mut synced, promise);
            assert!(v.errors.is_empty(), "{:?}", v.errors);
            assert_eq!((v.intact, v.lost), (6, 0));
        }

        // The last two lost: only a cache-lost crash may do that, above the floor.
        let have = &all[..4];
        let mut synced = all.clone();
        assert!(
            !judge(base, have, &mut synced, Promise::AllSynced)
                .errors
                .is_empty()
        );
        let mut synced = all.clone();
        assert!(
            !judge(base, have, &mut synced, Promise::Prefix { floor: 5 })
                .errors
                .is_empty()
        );
        let mut synced = all.clone();
        let v = judge(base, have, &mut synced, Promise::Prefix { floor: 4 });
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(synced, all[..4].to_vec(), "the lost tail is forgotten");

        // A hole: #2 missing while #3 is there is no prefix.
        let holed: Vec<FileState> = all
            .iter()
            .filter(|f| f.path != all[2].path)
            .cloned()
            .collect();
        let mut synced = all.clone();
        let v = judge(base, &holed, &mut synced, Promise::Prefix { floor: 0 });
        assert!(
            v.errors.iter().any(|e| e.contains("not a prefix")),
            "{:?}",
            v.errors
        );

        // A complete file with other bytes, a file larger than its name, a stranger.
        for bad in [
            FileState {
                crc: all[0].crc ^ 1,
                ..all[0].clone()
            },
            FileState {
                size: all[0].size + 1,
                ..all[0].clone()
            },
            FileState {
                path: "r1/x".into(),
                ..all[0].clone()
            },
        ] {
            let mut have = all.clone();
            have.push(bad.clone());
            let mut synced = Vec::new();
            let v = judge(base, &have, &mut synced, Promise::AllSynced);
            assert!(!v.errors.is_empty(), "{bad:?} accepted");
        }

        // A short file that was never synced is only counted.
        let mut have = all.clone();
        have.push(FileState {
            size: 10,
            ..file(base, 2, 0, 5000)
        });
        let mut synced = all.clone();
        let v = judge(base, &have, &mut synced, Promise::AllSynced);
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(v.partial, 1);
    }
}
