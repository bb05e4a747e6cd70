//! What a volume's limits are, and where they come from: `lsvd serve --limit-*`
//! (defaults for every volume the command serves) under the config file's
//! `[volumes.NAME]` entries (each key set there wins for that volume).

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use lsvd_core::error::{Error, Result};
use lsvd_core::size::parse_size;

/// The burst when none is given: a second's worth of each rate.
pub const DEFAULT_BURST: Duration = Duration::from_secs(1);

/// One volume's limits. `None` or `Some(0)`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Reads and writes together, per second.
    pub iops: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
    /// Bytes read and written together, per second.
    pub bps: Option<u64>,
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    /// How much of each rate an idle volume saves up and may then spend at once, as a
    /// time: 1 s (the default) lets 500 I/Os through at once under `limit_iops = 500`.
    pub burst: Option<Duration>,
}

impl Limits {
    fn rates(&self) -> [(&'static str, Option<u64>); 6] {
        [
            ("limit_iops", self.iops),
            ("limit_read_iops", self.read_iops),
            ("limit_write_iops", self.write_iops),
            ("limit_bps", self.bps),
            ("limit_read_bps", self.read_bps),
            ("limit_write_bps", self.write_bps),
        ]
    }

    /// Is any limit set (above zero)?
    pub fn any(&self) -> bool {
        self.rates().iter().any(|(_, r)| r.is_some_and(|r| r > 0))
    }

    pub fn burst_ns(&self) -> u64 {
        self.burst.unwrap_or(DEFAULT_BURST).as_nanos() as u64
    }

    /// Each limit by its config key, 0 for none (for metrics).
    pub fn by_key(&self) -> [(&'static str, u64); 6] {
        self.rates().map(|(k, r)| (k, r.unwrap_or(0)))
    }

    /// `self`'s settings where it has them, `defaults`' elsewhere.
    pub fn over(self, defaults: &Limits) -> Limits {
        Limits {
            iops: self.iops.or(defaults.iops),
            read_iops: self.read_iops.or(defaults.read_iops),
            write_iops: self.write_iops.or(defaults.write_iops),
            bps: self.bps.or(defaults.bps),
            read_bps: self.read_bps.or(defaults.read_bps),
            write_bps: self.write_bps.or(defaults.write_bps),
            burst: self.burst.or(defaults.burst),
        }
    }

    /// For the log: `limit_iops 500, limit_write_bps 100.0 MiB/s (burst 1s)`, or
    /// `no limits`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .rates()
            .iter()
            .filter_map(|&(key, r)| {
                let r = r.filter(|&r| r > 0)?;
                Some(if key.ends_with("bps") {
                    format!("{key} {}/s", lsvd_core::size::format_size(r))
                } else {
                    format!("{key} {r}")
                })
            })
            .collect();
        if parts.is_empty() {
            return "no limits".to_string();
        }
        let burst = self.burst.unwrap_or(DEFAULT_BURST);
        format!("{} (burst {burst:?})", parts.join(", "))
    }
}

/// A number or a string in the config file: `limit_bps = "100M"` or `104857600`,
/// `limit_burst = "500ms"`, `2` or `0.5`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum NumberOrText {
    Integer(u64),
    Float(f64),
    Text(String),
}

/// A `[volumes.NAME]` table of the config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSection {
    pub limit_iops: Option<u64>,
    pub limit_read_iops: Option<u64>,
    pub limit_write_iops: Option<u64>,
    pub limit_bps: Option<NumberOrText>,
    pub limit_read_bps: Option<NumberOrText>,
    pub limit_write_bps: Option<NumberOrText>,
    pub limit_burst: Option<NumberOrText>,
}

fn bytes_per_sec(key: &str, v: &Option<NumberOrText>) -> Result<Option<u64>> {
    match v {
        None => Ok(None),
        Some(NumberOrText::Integer(n)) => Ok(Some(*n)),
        Some(NumberOrText::Text(s)) => parse_size(s)
            .map(Some)
            .map_err(|e| e.context(key.to_string())),
        Some(NumberOrText::Float(_)) => Err(Error::bad_input(format!(
            "{key}: give bytes per second as a whole number or a size like \"100M\""
        ))),
    }
}

/// A burst: seconds (whole or not), or a duration like `500ms`; 0 or `off`: none.
pub fn parse_burst(key: &str, v: &NumberOrText) -> Result<Duration> {
    let bad = || {
        Error::bad_input(format!(
            "{key}: give the burst as seconds of the rate (e.g. 1, 0.5) or a duration like \"500ms\""
        ))
    };
    match v {
        NumberOrText::Integer(n) => Ok(Duration::from_secs(*n)),
        NumberOrText::Float(f) if f.is_finite() && *f >= 0.0 && *f <= 3600.0 => {
            Ok(Duration::from_secs_f64(*f))
        }
        NumberOrText::Float(_) => Err(bad()),
        // Seconds as text (a flag's value): as the number.
        NumberOrText::Text(s) if s.trim().parse::<f64>().is_ok() => parse_burst(
            key,
            &NumberOrText::Float(s.trim().parse().map_err(|_| bad())?),
        ),
        // `0` and `off` are no burst.
        NumberOrText::Text(s) => crate::cli::duration::parse_duration(key, s)
            .map(|d| d.unwrap_or(Duration::ZERO))
            .map_err(|_| bad()),
    }
}

impl VolumeSection {
    /// The limits this table sets (keys it leaves out: `None`).
    pub fn limits(&self) -> Result<Limits> {
        Ok(Limits {
            iops: self.limit_iops,
            read_iops: self.limit_read_iops,
            write_iops: self.limit_write_iops,
            bps: bytes_per_sec("limit_bps", &self.limit_bps)?,
            read_bps: bytes_per_sec("limit_read_bps", &self.limit_read_bps)?,
            write_bps: bytes_per_sec("limit_write_bps", &self.limit_write_bps)?,
            burst: self
                .limit_burst
                .as_ref()
                .map(|b| parse_burst("limit_burst", b))
                .transpose()?,
        })
    }
}

/// Check every `[volumes.NAME]` table, so a bad value stops the start (or a reload)
/// with the table's name.
pub fn validate(volumes: &BTreeMap<String, VolumeSection>) -> Result<()> {
    for (name, section) in volumes {
        section
            .limits()
            .map_err(|e| e.context(format!("[volumes.{name}]")))?;
    }
    Ok(())
}

/// The limits of export `export`: `defaults` under its `[volumes.EXPORT]` table, or
/// for a snapshot export `VOL@SNAP` without one, under `[volumes.VOL]`'s.
pub fn for_export(
    defaults: &Limits,
    volumes: &BTreeMap<String, VolumeSection>,
    export: &str,
) -> Result<Limits> {
    let section = volumes.get(export).or_else(|| {
        let (volume, _) = lsvd_engine::split_export_name(export);
        volumes.get(volume)
    });
    match section {
        None => Ok(*defaults),
        Some(s) => Ok(s.limits()?.over(defaults)),
    }
}

/// The `[volumes.NAME]` tables that apply to none of `exports` (a misspelt name, or a
/// volume another server serves): worth a line, since a typo would go unlimited.
pub fn unmatched<'a>(
    volumes: &'a BTreeMap<String, VolumeSection>,
    exports: &[String],
) -> Vec<&'a str> {
    volumes
        .keys()
        .filter(|table| {
            !exports
                .iter()
                .any(|e| e == *table || lsvd_engine::split_export_name(e).0 == table.as_str())
        })
        .map(String::as_str)
        .collect()
}

/// `lsvd serve`'s limits: defaults for every volume it serves.
#[derive(Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Most reads and writes (together) per second each volume gets, e.g. 500.
    /// Requests over a limit wait, never fail. A `[volumes.NAME]` table of the config
    /// file (--config) overrides this and every --limit-* for its volume (key
    /// `limit_iops`, and so on), and SIGHUP reloads those tables. TRIM and
    /// WRITE_ZEROES count as one write each; FLUSH does not count [default: no limit]
    #[arg(long, value_name = "N")]
    pub limit_iops: Option<u64>,
    /// Most reads per second each volume gets (on top of --limit-iops).
    #[arg(long, value_name = "N")]
    pub limit_read_iops: Option<u64>,
    /// Most writes (TRIM and WRITE_ZEROES included) per second each volume gets.
    #[arg(long, value_name = "N")]
    pub limit_write_iops: Option<u64>,
    /// Most bytes read and written (together) per second each volume gets, e.g. 100M.
    /// Only READ and WRITE carry bytes: a TRIM or WRITE_ZEROES counts as an I/O only.
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub limit_bps: Option<u64>,
    /// Most bytes read per second each volume gets, e.g. 50M.
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub limit_read_bps: Option<u64>,
    /// Most bytes written per second each volume gets, e.g. 50M.
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub limit_write_bps: Option<u64>,
    /// How much of each limit an idle volume saves up and may spend at once, as a
    /// time at the limit's rate: with 1s and --limit-iops 500, 500 requests go at once
    /// after a quiet second, then 500 a second. 0: no burst, requests evenly spaced
    /// (e.g. 0, 250ms, 2s) [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = burst_arg)]
    pub limit_burst: Option<Duration>,
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn burst_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_burst("--limit-burst", &NumberOrText::Text(s.to_string())).map_err(|e| e.to_string())
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            iops: self.limit_iops,
            read_iops: self.limit_read_iops,
            write_iops: self.limit_write_iops,
            bps: self.limit_bps,
            read_bps: self.limit_read_bps,
            write_bps: self.limit_write_bps,
            burst: self.limit_burst,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> Result<Limits> {
        let s: VolumeSection = toml::from_str(text).map_err(|e| Error::bad_input(e.to_string()))?;
        s.limits()
    }

    #[test]
    fn sizes_numbers_and_bursts_parse() {
        let l = section(
            "limit_iops = 500\nlimit_read_bps = \"100M\"\nlimit_write_bps = 4096\nlimit_burst = 0.5\n",
        )
        .expect("valid");
        assert_eq!(l.iops, Some(500));
        assert_eq!(l.read_bps, Some(100 << 20));
        assert_eq!(l.write_bps, Some(4096));
        assert_eq!(l.burst, Some(Duration::from_millis(500)));
        assert_eq!(l.burst_ns(), 500_000_000);
        for (burst, want) in [("\"250ms\"", 250), ("2", 2000), ("\"0\"", 0), ("0", 0)] {
            let l = section(&format!("limit_burst = {burst}")).expect(burst);
            assert_eq!(l.burst, Some(Duration::from_millis(want)), "{burst}");
        }
        assert_eq!(Limits::default().burst_ns(), 1_000_000_000);
        assert_eq!(burst_arg("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(burst_arg("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(burst_arg("off"), Ok(Duration::ZERO));
        assert!(burst_arg("soon").is_err() && size_arg("lots").is_err());
        for bad in [
            "limit_bps = \"lots\"",
            "limit_bps = 1.5",
            "limit_iops = -1",
            "limit_iops = \"500\"",
            "limit_burst = -1.0",
            "limit_burst = \"soon\"",
            "limit_ios = 5",
        ] {
            assert!(section(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_volume_table_overrides_the_defaults_key_by_key() {
        let defaults = LimitArgs {
            limit_iops: Some(1000),
            limit_bps: Some(size_arg("100M").expect("a size")),
            ..LimitArgs::default()
        }
        .limits();
        let mut volumes = BTreeMap::new();
        volumes.insert(
            "slow".to_string(),
            VolumeSection {
                limit_iops: Some(500),
                ..VolumeSection::default()
            },
        );
        volumes.insert(
            "free".to_string(),
            VolumeSection {
                limit_iops: Some(0),
                limit_bps: Some(NumberOrText::Integer(0)),
                ..VolumeSection::default()
            },
        );
        let slow = for_export(&defaults, &volumes, "slow").expect("slow");
        assert_eq!((slow.iops, slow.bps), (Some(500), Some(100 << 20)));
        assert_eq!(
            for_export(&defaults, &volumes, "slow@snap1").expect("snap"),
            slow,
            "a snapshot export without a table of its own takes its volume's"
        );
        assert!(!for_export(&defaults, &volumes, "free").expect("free").any());
        assert_eq!(
            for_export(&defaults, &volumes, "other").expect("o"),
            defaults
        );
        assert_eq!(
            slow.describe(),
            "limit_iops 500, limit_bps 100.0 MiB/s (burst 1s)"
        );
        assert_eq!(Limits::default().describe(), "no limits");
        let served = ["slow@snap1".to_string(), "free".to_string()];
        assert_eq!(unmatched(&volumes, &served), Vec::<&str>::new());
        assert_eq!(unmatched(&volumes, &served[1..]), vec!["slow"]);
    }
}
