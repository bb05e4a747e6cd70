//! The tuned settings `serve` runs with and `info` shows: flags, the config file's
//! `[tuning]`, then the probe profiles saved under `--data` (measured on first start
//! unless `--no-probe`), resolved by `probe::settings`.

use super::{Common, TuningArgs};
use crate::probe::settings::{self, Layers, LoadedLayer, Tuning};
use lsvd_core::error::Result;

/// The tuned settings in force and a line about each profile (for `info`).
pub(super) struct Resolved {
    pub tuning: Tuning,
    pub device_profile: String,
    pub store_profile: String,
}

/// When to probe the data directory if it has no device profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProfileUse {
    /// Use saved profiles; measure the disk if there is none (`serve`).
    ProbeIfMissing,
    /// Use saved profiles, measure nothing (`info`).
    LoadOnly,
    /// Neither (`serve --no-probe`).
    Ignore,
}

/// Resolve the tuned settings: flags > config `[tuning]` > probe profiles > defaults.
/// Bad flags or config are errors; a profile that cannot be used (corrupt, measured
/// elsewhere, a failed first-start probe) is one warning line and the defaults.
pub(super) fn resolve_tuning(
    common: &Common,
    flags: &TuningArgs,
    use_: ProfileUse,
) -> Result<Resolved> {
    let flags = flags.layer()?;
    let config = common.file.tuning_layer()?;
    let ignored = || LoadedLayer {
        status: "not used (--no-probe)".to_string(),
        ..LoadedLayer::default()
    };
    let (mut device, store) = match use_ {
        ProfileUse::Ignore => (ignored(), ignored()),
        _ => (
            settings::load_device_layer(&common.data),
            settings::load_store_layer(&common.data, &common.store),
        ),
    };
    let missing = !crate::probe::profile::profile_path(&common.data).exists();
    if use_ == ProfileUse::ProbeIfMissing && missing {
        device = match crate::probe::first_start_probe(&common.data) {
            Ok(p) => LoadedLayer {
                layer: settings::device_layer(&p.decisions),
                status: format!(
                    "{} (measured now, on first start)",
                    crate::probe::profile::profile_path(&common.data).display()
                ),
                warning: None,
            },
            Err(e) => {
                let why = format!("the first-start probe failed ({e}): using the defaults");
                LoadedLayer::unusable(why)
            }
        };
    }
    for w in [&device.warning, &store.warning].into_iter().flatten() {
        lsvd_store::log::warn(w);
    }
    let tuning = settings::resolve(&Layers {
        flags,
        config,
        device_profile: device.layer,
        store_profile: store.layer,
    });
    Ok(Resolved {
        tuning,
        device_profile: device.status,
        store_profile: store.status,
    })
}
