//! Maps each trace's volume keys (MSR host+disk, Tencent volume id, SPC
//! ASU, ...) to dense `u32` ids in order of first appearance.
//!
//! The simulator indexes per-volume state by these ids, so they must be
//! small and dense. Lookups happen once per record: the last key is cached
//! (most traces run long stretches on one volume) and a miss costs one hash
//! lookup without allocating; only a new volume allocates its name.

use std::collections::HashMap;

/// A record's volume key as the format parser sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VolumeKey<'a> {
    /// The format has a single volume.
    Single,
    /// A numeric key (ASU, device, LUN, volume id).
    Num(u64),
    /// A textual key made of two parts (MSR host and disk number); the name
    /// is `"{0}_{1}"`.
    Pair(&'a [u8], &'a [u8]),
}

/// The dense id table of one trace.
#[derive(Debug)]
pub(crate) struct Volumes {
    /// Name prefix for numeric keys, e.g. `"asu"` gives `"asu3"`.
    prefix: &'static str,
    names: Vec<String>,
    by_num: HashMap<u64, u32>,
    by_text: HashMap<Box<[u8]>, u32>,
    /// The last numeric key and its id.
    last_num: Option<(u64, u32)>,
    /// The last textual key (joined with `_`) and its id.
    last_text: Option<(Vec<u8>, u32)>,
    /// Scratch buffer for joining `Pair` keys.
    scratch: Vec<u8>,
}

impl Volumes {
    pub(crate) fn new(prefix: &'static str) -> Self {
        Volumes {
            prefix,
            names: Vec::new(),
            by_num: HashMap::new(),
            by_text: HashMap::new(),
            last_num: None,
            last_text: None,
            scratch: Vec::new(),
        }
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The id of `key`, registering it if new.
    #[inline]
    pub(crate) fn id(&mut self, key: VolumeKey<'_>) -> u32 {
        match key {
            VolumeKey::Single => self.num_id(0),
            VolumeKey::Num(n) => self.num_id(n),
            VolumeKey::Pair(a, b) => self.pair_id(a, b),
        }
    }

    #[inline]
    fn num_id(&mut self, n: u64) -> u32 {
        if let Some((k, id)) = self.last_num
            && k == n
        {
            return id;
        }
        let id = match self.by_num.get(&n) {
            Some(&id) => id,
            None => {
                let id = self.push_name(format!("{}{n}", self.prefix));
                self.by_num.insert(n, id);
                id
            }
        };
        self.last_num = Some((n, id));
        id
    }

    fn pair_id(&mut self, a: &[u8], b: &[u8]) -> u32 {
        self.scratch.clear();
        self.scratch.extend_from_slice(a);
        self.scratch.push(b'_');
        self.scratch.extend_from_slice(b);
        if let Some((k, id)) = &self.last_text
            && *k == self.scratch
        {
            return *id;
        }
        let id = match self.by_text.get(self.scratch.as_slice()) {
            Some(&id) => id,
            None => {
                let name = String::from_utf8_lossy(&self.scratch).into_owned();
                let id = self.push_name(name);
                self.by_text
                    .insert(self.scratch.clone().into_boxed_slice(), id);
                id
            }
        };
        let mut last = self.last_text.take().map(|(v, _)| v).unwrap_or_default();
        last.clear();
        last.extend_from_slice(&self.scratch);
        self.last_text = Some((last, id));
        id
    }

    fn push_name(&mut self, name: String) -> u32 {
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(name);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_ids_in_order_of_first_appearance() {
        let mut v = Volumes::new("asu");
        assert_eq!(v.id(VolumeKey::Num(7)), 0);
        assert_eq!(v.id(VolumeKey::Num(7)), 0);
        assert_eq!(v.id(VolumeKey::Num(3)), 1);
        assert_eq!(v.id(VolumeKey::Num(7)), 0);
        assert_eq!(v.id(VolumeKey::Num(3)), 1);
        assert_eq!(v.names(), ["asu7", "asu3"]);
    }

    #[test]
    fn pair_keys() {
        let mut v = Volumes::new("");
        assert_eq!(v.id(VolumeKey::Pair(b"hm", b"0")), 0);
        assert_eq!(v.id(VolumeKey::Pair(b"hm", b"1")), 1);
        assert_eq!(v.id(VolumeKey::Pair(b"hm", b"1")), 1);
        assert_eq!(v.id(VolumeKey::Pair(b"hm", b"0")), 0);
        assert_eq!(v.names(), ["hm_0", "hm_1"]);
    }
}
