//! The tuned settings of `lsvd serve` and where each one came from.
//!
//! Why: `lsvd probe` measures the device and the store and decides a few engine
//! settings; an operator may also set them in the config file or on the command line.
//! One place resolves them, with one precedence, so that `serve` uses and `info`
//! shows the same values:
//!
//! 1. a command-line flag (`--log-writes-in-flight`, `--group-commit-max`,
//!    `--batch-size`, `--uploads`, `--read-fetch`);
//! 2. the config file's `[tuning]` section;
//! 3. a probe profile: the device profile (`<data>/probe-profile`, from `lsvd probe
//!    PATH`) for the write log, the store profile (`<data>/store-profiles/…`, from
//!    `lsvd probe --store URL`) for uploads and fetches;
//! 4. the built-in default ([`EngineConfig::default`]).
//!
//! Resolution ([`resolve`]) is a pure function of the four layers; loading the profiles
//! (and deciding that one is unusable: corrupt, or measured under another directory or
//! for another store) is in [`load_device_layer`] and [`load_store_layer`], which never
//! fail: a profile that cannot be used is a warning and the defaults.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use lsvd_engine::EngineConfig;

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    Flag,
    Config,
    /// The device profile (`lsvd probe PATH`).
    ProbeProfile,
    /// The store profile (`lsvd probe --store URL`).
    StoreProfile,
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Flag => "flag",
            Origin::Config => "config",
            Origin::ProbeProfile => "probe profile",
            Origin::StoreProfile => "store probe profile",
            Origin::Default => "default",
        })
    }
}

/// Values of the tuned settings one layer sets (None: not set by it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layer {
    pub log_writes_in_flight: Option<usize>,
    pub group_commit_max_bytes: Option<u64>,
    pub batch_size_bytes: Option<u64>,
    pub uploads_in_flight: Option<usize>,
    pub read_fetch_bytes: Option<u64>,
}

/// One resolved setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuned<T> {
    pub value: T,
    pub origin: Origin,
}

/// Every tuned setting, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuning {
    pub log_writes_in_flight: Tuned<usize>,
    pub group_commit_max_bytes: Tuned<u64>,
    pub batch_size_bytes: Tuned<u64>,
    pub uploads_in_flight: Tuned<usize>,
    pub read_fetch_bytes: Tuned<u64>,
}

/// The four layers, highest precedence first (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layers {
    pub flags: Layer,
    pub config: Layer,
    pub device_profile: Layer,
    pub store_profile: Layer,
}

fn pick<T: Copy>(
    layers: &Layers,
    get: impl Fn(&Layer) -> Option<T>,
    profile_origin: Origin,
    default: T,
) -> Tuned<T> {
    let profile = match profile_origin {
        Origin::StoreProfile => &layers.store_profile,
        _ => &layers.device_profile,
    };
    [
        (get(&layers.flags), Origin::Flag),
        (get(&layers.config), Origin::Config),
        (get(profile), profile_origin),
    ]
    .into_iter()
    .find_map(|(v, origin)| v.map(|value| Tuned { value, origin }))
    .unwrap_or(Tuned {
        value: default,
        origin: Origin::Default,
    })
}

/// Resolve every setting: flag > config > profile > default. The device profile only
/// sets the write-log settings and the store profile only the store ones, whatever
/// else their layers hold.
pub fn resolve(layers: &Layers) -> Tuning {
    let d = EngineConfig::default();
    let dev = Origin::ProbeProfile;
    let sto = Origin::StoreProfile;
    Tuning {
        log_writes_in_flight: pick(
            layers,
            |l| l.log_writes_in_flight,
            dev,
            d.log_writes_in_flight,
        ),
        group_commit_max_bytes: pick(
            layers,
            |l| l.group_commit_max_bytes,
            dev,
            d.group_commit_max_bytes,
        ),
        batch_size_bytes: pick(layers, |l| l.batch_size_bytes, sto, d.batch_size_bytes),
        uploads_in_flight: pick(layers, |l| l.uploads_in_flight, sto, d.uploads_in_flight),
        read_fetch_bytes: pick(layers, |l| l.read_fetch_bytes, sto, d.read_fetch_bytes),
    }
}

impl Tuning {
    /// Set the tuned fields of `config`.
    pub fn apply(&self, config: &mut EngineConfig) {
        config.log_writes_in_flight = self.log_writes_in_flight.value;
        config.group_commit_max_bytes = self.group_commit_max_bytes.value;
        config.batch_size_bytes = self.batch_size_bytes.value;
        config.uploads_in_flight = self.uploads_in_flight.value;
        config.read_fetch_bytes = self.read_fetch_bytes.value;
    }

    /// `(name, value as text, origin)` for each setting, for `lsvd info`.
    pub fn rows(&self) -> Vec<(&'static str, String, Origin)> {
        let size = lsvd_core::size::format_size;
        vec![
            (
                "log writes in flight",
                self.log_writes_in_flight.value.to_string(),
                self.log_writes_in_flight.origin,
            ),
            (
                "group-commit cap",
                size(self.group_commit_max_bytes.value),
                self.group_commit_max_bytes.origin,
            ),
            (
                "batch size",
                size(self.batch_size_bytes.value),
                self.batch_size_bytes.origin,
            ),
            (
                "uploads in flight",
                self.uploads_in_flight.value.to_string(),
                self.uploads_in_flight.origin,
            ),
            (
                "read fetch size",
                size(self.read_fetch_bytes.value),
                self.read_fetch_bytes.origin,
            ),
        ]
    }
}

/// Limits every layer is checked against (flags and config are refused outside them;
/// profile values are clamped by the probe's rules, which stay inside them).
pub mod limits {
    pub const LOG_WRITES_IN_FLIGHT: std::ops::RangeInclusive<usize> = 1..=64;
    pub const GROUP_COMMIT_MAX_BYTES: std::ops::RangeInclusive<u64> = (64 << 10)..=(4 << 20);
    pub const BATCH_SIZE_BYTES: std::ops::RangeInclusive<u64> = 4096..=(1 << 30);
    pub const UPLOADS_IN_FLIGHT: std::ops::RangeInclusive<usize> = 1..=256;
    /// Whole read-cache chunks (64 KiB), at most 16 MiB.
    pub const READ_FETCH_BYTES: std::ops::RangeInclusive<u64> = (64 << 10)..=(16 << 20);
    pub const READ_FETCH_UNIT_BYTES: u64 = 64 << 10;
}

/// Check one layer's values against [`limits`]; `what` names the layer's spelling of
/// each setting in the message (e.g. `--uploads` or `[tuning] uploads`).
pub fn validate(layer: &Layer, names: &LayerNames) -> lsvd_core::error::Result<()> {
    use lsvd_core::error::Error;
    use lsvd_core::size::format_size as fs;
    let range_u = |v: Option<usize>, r: std::ops::RangeInclusive<usize>, n: &str| match v {
        Some(v) if !r.contains(&v) => Err(Error::bad_input(format!(
            "{n} must be between {} and {}",
            r.start(),
            r.end()
        ))),
        _ => Ok(()),
    };
    let range_b = |v: Option<u64>, r: std::ops::RangeInclusive<u64>, n: &str| match v {
        Some(v) if !r.contains(&v) => Err(Error::bad_input(format!(
            "{n} must be between {} and {}",
            fs(*r.start()),
            fs(*r.end())
        ))),
        _ => Ok(()),
    };
    range_u(
        layer.log_writes_in_flight,
        limits::LOG_WRITES_IN_FLIGHT,
        names.log_writes_in_flight,
    )?;
    range_b(
        layer.group_commit_max_bytes,
        limits::GROUP_COMMIT_MAX_BYTES,
        names.group_commit_max,
    )?;
    range_b(
        layer.batch_size_bytes,
        limits::BATCH_SIZE_BYTES,
        names.batch_size,
    )?;
    range_u(
        layer.uploads_in_flight,
        limits::UPLOADS_IN_FLIGHT,
        names.uploads,
    )?;
    range_b(
        layer.read_fetch_bytes,
        limits::READ_FETCH_BYTES,
        names.read_fetch,
    )?;
    if let Some(v) = layer.read_fetch_bytes
        && !v.is_multiple_of(limits::READ_FETCH_UNIT_BYTES)
    {
        return Err(Error::bad_input(format!(
            "{} must be a multiple of 64K (the read-cache chunk)",
            names.read_fetch
        )));
    }
    Ok(())
}

/// How a layer spells each setting, for messages.
pub struct LayerNames {
    pub log_writes_in_flight: &'static str,
    pub group_commit_max: &'static str,
    pub batch_size: &'static str,
    pub uploads: &'static str,
    pub read_fetch: &'static str,
}

pub const FLAG_NAMES: LayerNames = LayerNames {
    log_writes_in_flight: "--log-writes-in-flight",
    group_commit_max: "--group-commit-max",
    batch_size: "--batch-size",
    uploads: "--uploads",
    read_fetch: "--read-fetch",
};

pub const CONFIG_NAMES: LayerNames = LayerNames {
    log_writes_in_flight: "[tuning] log_writes_in_flight",
    group_commit_max: "[tuning] group_commit_max",
    batch_size: "[tuning] batch_size",
    uploads: "[tuning] uploads",
    read_fetch: "[tuning] read_fetch",
};

/// A profile layer and what to say about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedLayer {
    pub layer: Layer,
    /// One line for `info` (which profile, or why none is used).
    pub status: String,
    /// A warning to print (an unusable profile), if any.
    pub warning: Option<String>,
}

impl LoadedLayer {
    /// No layer: the profile cannot be used, `why` (the status and the warning).
    pub fn unusable(why: String) -> LoadedLayer {
        LoadedLayer {
            status: format!("unusable: {why}"),
            warning: Some(why),
            ..LoadedLayer::default()
        }
    }
}

/// The device profile of `data_dir` as a layer. Never fails: no profile is an empty
/// layer; a corrupt or unreadable one, or one measured under another directory, is an
/// empty layer and a warning.
pub fn load_device_layer(data_dir: &Path) -> LoadedLayer {
    let path = super::profile::profile_path(data_dir);
    match super::load_profile(data_dir) {
        Ok(None) => LoadedLayer {
            status: format!("none ({} does not exist)", path.display()),
            ..LoadedLayer::default()
        },
        Err(e) => {
            let why = format!("{e}: using the defaults (run `lsvd probe` again to replace it)");
            LoadedLayer::unusable(why)
        }
        Ok(Some(p)) => {
            let here = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
            if Path::new(&p.path) != here {
                let why = format!(
                    "probe profile {} was measured under {}, not the data directory {}: \
                     using the defaults (run `lsvd probe {}` to measure it)",
                    path.display(),
                    p.path,
                    here.display(),
                    here.display()
                );
                return LoadedLayer::unusable(why);
            }
            LoadedLayer {
                layer: device_layer(&p.decisions),
                status: format!(
                    "{} (measured under {} by lsvd {}{})",
                    path.display(),
                    p.path,
                    p.lsvd_version,
                    if p.direct { "" } else { ", without O_DIRECT" }
                ),
                warning: None,
            }
        }
    }
}

/// The settings a device profile's decisions give: the group-commit cap. Its "log
/// writes in flight" is advice only, like direct log I/O: the probe measures queue
/// depth with O_DIRECT writes, while the engine writes its log through the page
/// cache, where overlapped writes measured no better than one at a time on this
/// project's 2-core machine (and 1 MiB sequential writes worse: docs/ARCHITECTURE.md,
/// "Why these choices"). It applies once the log has direct I/O.
pub fn device_layer(d: &super::Decisions) -> Layer {
    Layer {
        group_commit_max_bytes: Some(d.group_commit_cap_bytes.clamp(
            *limits::GROUP_COMMIT_MAX_BYTES.start(),
            *limits::GROUP_COMMIT_MAX_BYTES.end(),
        )),
        ..Layer::default()
    }
}

/// The settings a store profile's decisions give.
pub fn store_layer(d: &super::store::StoreDecisions) -> Layer {
    let fetch =
        (d.read_fetch_bytes / limits::READ_FETCH_UNIT_BYTES * limits::READ_FETCH_UNIT_BYTES).clamp(
            *limits::READ_FETCH_BYTES.start(),
            *limits::READ_FETCH_BYTES.end(),
        );
    Layer {
        read_fetch_bytes: Some(fetch),
        batch_size_bytes: Some(d.batch_size_bytes.clamp(
            *limits::BATCH_SIZE_BYTES.start(),
            *limits::BATCH_SIZE_BYTES.end(),
        )),
        uploads_in_flight: Some(usize::try_from(d.uploads_in_flight).unwrap_or(1).clamp(
            *limits::UPLOADS_IN_FLIGHT.start(),
            *limits::UPLOADS_IN_FLIGHT.end(),
        )),
        ..Layer::default()
    }
}

/// The store profile for `store_url` in `data_dir` as a layer; never fails (as
/// [`load_device_layer`]).
pub fn load_store_layer(data_dir: &Path, store_url: &str) -> LoadedLayer {
    let path = super::store_profile::store_profile_path(data_dir, store_url);
    match super::store_profile::load_store_profile(data_dir, store_url) {
        Ok(None) => LoadedLayer {
            status: format!("none (no `lsvd probe --store` profile for {store_url})"),
            ..LoadedLayer::default()
        },
        Err(e) => {
            let why = format!(
                "{e}: using the defaults (run `lsvd probe --store {store_url}` to replace it)"
            );
            LoadedLayer::unusable(why)
        }
        Ok(Some(p)) => LoadedLayer {
            layer: store_layer(&p.decisions),
            status: format!("{} (measured by lsvd {})", path.display(), p.lsvd_version),
            warning: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device profile's in-flight advice is not applied while the log is written
    /// through the page cache (it measured O_DIRECT parallelism).
    #[test]
    fn the_device_profile_sets_the_group_commit_cap_only() {
        let d = crate::probe::Decisions {
            page_size_bytes: 4096,
            log_align_bytes: 4096,
            useful_parallelism: 32,
            log_writes_in_flight: 16,
            group_commit_cap_bytes: 1 << 20,
            direct_log_io: true,
            notes: Vec::new(),
        };
        let layer = device_layer(&d);
        assert_eq!(layer.log_writes_in_flight, None);
        assert_eq!(layer.group_commit_max_bytes, Some(1 << 20));
    }

    #[test]
    fn a_store_layer_stays_inside_the_limits() {
        let l = store_layer(&crate::probe::store::StoreDecisions {
            read_fetch_bytes: 100 << 10,
            batch_size_bytes: 1,
            uploads_in_flight: 0,
            notes: vec![],
        });
        assert_eq!(l.read_fetch_bytes, Some(64 << 10));
        assert_eq!(l.batch_size_bytes, Some(4096));
        assert_eq!(l.uploads_in_flight, Some(1));
    }

    #[test]
    fn precedence_is_flag_config_profile_default() {
        let mut layers = Layers::default();
        let t = resolve(&layers);
        assert_eq!(t.log_writes_in_flight.origin, Origin::Default);
        assert_eq!(t.log_writes_in_flight.value, 1);
        assert_eq!(
            t.read_fetch_bytes,
            Tuned {
                value: 64 << 10,
                origin: Origin::Default
            }
        );

        layers.device_profile.log_writes_in_flight = Some(16);
        layers.store_profile.uploads_in_flight = Some(8);
        let t = resolve(&layers);
        assert_eq!(
            t.log_writes_in_flight,
            Tuned {
                value: 16,
                origin: Origin::ProbeProfile
            }
        );
        assert_eq!(
            t.uploads_in_flight,
            Tuned {
                value: 8,
                origin: Origin::StoreProfile
            }
        );

        layers.config.log_writes_in_flight = Some(4);
        layers.config.uploads_in_flight = Some(2);
        let t = resolve(&layers);
        assert_eq!(
            t.log_writes_in_flight,
            Tuned {
                value: 4,
                origin: Origin::Config
            }
        );
        assert_eq!(
            t.uploads_in_flight,
            Tuned {
                value: 2,
                origin: Origin::Config
            }
        );

        layers.flags.log_writes_in_flight = Some(2);
        let t = resolve(&layers);
        assert_eq!(
            t.log_writes_in_flight,
            Tuned {
                value: 2,
                origin: Origin::Flag
            }
        );
        assert_eq!(t.uploads_in_flight.origin, Origin::Config);

        // A profile only sets its own settings.
        let mut layers = Layers::default();
        layers.device_profile.uploads_in_flight = Some(9);
        layers.store_profile.log_writes_in_flight = Some(9);
        let t = resolve(&layers);
        assert_eq!(t.uploads_in_flight.origin, Origin::Default);
        assert_eq!(t.log_writes_in_flight.origin, Origin::Default);

        let mut config = EngineConfig::default();
        layers.flags.read_fetch_bytes = Some(256 << 10);
        resolve(&layers).apply(&mut config);
        assert_eq!(config.read_fetch_bytes, 256 << 10);
    }

    #[test]
    fn validation_names_the_setting() {
        let ok = Layer {
            log_writes_in_flight: Some(16),
            group_commit_max_bytes: Some(1 << 20),
            batch_size_bytes: Some(8 << 20),
            uploads_in_flight: Some(4),
            read_fetch_bytes: Some(128 << 10),
        };
        validate(&ok, &FLAG_NAMES).expect("valid");
        for (bad, name) in [
            (
                Layer {
                    log_writes_in_flight: Some(0),
                    ..ok
                },
                "--log-writes-in-flight",
            ),
            (
                Layer {
                    group_commit_max_bytes: Some(8 << 20),
                    ..ok
                },
                "--group-commit-max",
            ),
            (
                Layer {
                    uploads_in_flight: Some(0),
                    ..ok
                },
                "--uploads",
            ),
            (
                Layer {
                    read_fetch_bytes: Some(100 << 10),
                    ..ok
                },
                "--read-fetch",
            ),
            (
                Layer {
                    read_fetch_bytes: Some(32 << 20),
                    ..ok
                },
                "--read-fetch",
            ),
        ] {
            let e = validate(&bad, &FLAG_NAMES).expect_err("invalid");
            assert_eq!(e.kind, lsvd_core::error::ErrorKind::BadInput);
            assert!(e.to_string().contains(name), "{e}");
        }
    }
}
