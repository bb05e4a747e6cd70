//! SIGHUP: read the config file again and apply its `[volumes.NAME]` limits to the
//! exports being served, without a restart. Only the limits: everything else in the
//! file (store, data, S3, tuning) stays as the server started with it, and the log
//! line says so. A file that no longer parses changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsvd_core::error::Result;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::limits::{Limits, for_export};
use super::throttle::Throttle;

/// Load `path` and give each of `throttles` its limits from it (over `defaults`);
/// the lines to log, one per export.
pub fn reload(path: &Path, defaults: &Limits, throttles: &[Arc<Throttle>]) -> Result<Vec<String>> {
    let file = crate::config_file::LsvdConfig::load(path)?;
    // Every export's limits first: a bad table changes none.
    let mut new = Vec::new();
    for t in throttles {
        new.push(for_export(defaults, &file.volumes, t.export())?);
    }
    Ok(throttles
        .iter()
        .zip(new)
        .map(|(t, limits)| {
            t.set_limits(&limits);
            format!("{}: {}", t.export(), limits.describe())
        })
        .collect())
}

/// SIGHUP, caught from now on (its default is to stop the process); `None` if it
/// cannot be (said in the log).
pub fn catch_sighup() -> Option<Signal> {
    let caught = signal(SignalKind::hangup());
    if caught.is_err() {
        lsvd_store::log::warn("cannot catch SIGHUP: limits cannot be reloaded");
    }
    caught.ok()
}

/// Reload on every SIGHUP (`hangup`, from [`catch_sighup`]) until `shutdown`. Without
/// a config file there is nothing to reload: SIGHUP says so.
pub async fn on_sighup(
    hangup: Option<Signal>,
    path: Option<PathBuf>,
    defaults: Limits,
    throttles: Vec<Arc<Throttle>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Some(mut hangup) = hangup else {
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            got = hangup.recv() => if got.is_none() { return },
        }
        let Some(path) = &path else {
            lsvd_store::log::warn(
                "SIGHUP: no config file (--config) to reload limits from; nothing changed",
            );
            continue;
        };
        match reload(path, &defaults, &throttles) {
            Ok(lines) => lsvd_store::log::info(&format!(
                "SIGHUP: reloaded QoS limits from {} ({}); other settings in the file \
                 take effect at the next start",
                path.display(),
                lines.join("; ")
            )),
            Err(e) => lsvd_store::log::warn(&format!(
                "SIGHUP: limits not reloaded, they stay as they were: {e}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reload_applies_the_file_and_a_bad_file_changes_nothing() {
        let dir = lsvd_store::testutil::TempDir::new("qos-reload");
        let path = dir.path().join("lsvd.toml");
        let clock: Arc<dyn lsvd_store::clock::Clock> =
            Arc::new(lsvd_store::clock::ManualClock::default());
        let defaults = Limits {
            iops: Some(1000),
            ..Limits::default()
        };
        let a = Throttle::new("a", &defaults, clock.clone());
        let b = Throttle::new("b", &defaults, clock);
        let both = [a.clone(), b.clone()];
        std::fs::write(
            &path,
            "[volumes.a]\nlimit_iops = 500\nlimit_write_bps = \"1M\"\n",
        )
        .expect("write");
        let lines = reload(&path, &defaults, &both).expect("reload");
        assert_eq!(a.limits().iops, Some(500));
        assert_eq!(a.limits().write_bps, Some(1 << 20));
        assert_eq!(b.limits(), defaults);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("a: limit_iops 500"), "{lines:?}");
        for bad in [
            "[volumes.a]\nlimit_iop = 5\n",
            "[volumes.b]\nlimit_bps = \"x\"\n",
        ] {
            std::fs::write(&path, bad).expect("write");
            assert!(reload(&path, &defaults, &both).is_err(), "{bad}");
            assert_eq!(a.limits().iops, Some(500), "unchanged after {bad}");
        }
    }
}
