//! Reading a running `lsvd serve --metrics` endpoint: a minimal HTTP GET and a parser
//! for the Prometheus text lines the replay needs (per-volume samples).

use lsvd_core::error::{Error, ErrorKind, Result};

/// Largest metrics response read.
const MAX_METRICS_BYTES: u64 = 16 << 20;

/// One scrape of a Prometheus text endpoint: `(metric, volume label, value)`.
pub(super) struct Scrape {
    samples: Vec<(String, String, f64)>,
}

impl Scrape {
    pub(super) fn parse(body: &str) -> Scrape {
        let samples = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (head, value) = l.trim_end().rsplit_once(' ')?;
                let value = value.parse::<f64>().ok()?;
                let (name, volume) = match head.split_once('{') {
                    Some((name, labels)) => {
                        let labels = labels.strip_suffix('}')?;
                        let volume = labels
                            .split(',')
                            .find_map(|kv| kv.trim().strip_prefix("volume=\""))
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or("");
                        (name, volume)
                    }
                    None => (head, ""),
                };
                Some((name.to_string(), volume.to_string(), value))
            })
            .collect();
        Scrape { samples }
    }

    /// The metric's value for `volume`, or summed over every volume with `None`;
    /// `None` if the endpoint has no such sample.
    pub(super) fn value(&self, name: &str, volume: Option<&str>) -> Option<f64> {
        let mut found = None;
        for (n, v, x) in &self.samples {
            if n == name && volume.is_none_or(|want| want == v) {
                *found.get_or_insert(0.0) += x;
            }
        }
        found
    }

    /// Volume labels of `name`'s samples.
    pub(super) fn volumes(&self, name: &str) -> Vec<&str> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, v, _)| v.as_str())
            .collect()
    }
}

/// GET `url` (http:// only) and parse the answer. A URL that is not `http://` is
/// `BadInput`, a failed connection `Transient`, an answer that is not 200 `Permanent`.
pub(super) async fn scrape(url: &str) -> Result<Scrape> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::bad_input(format!("{url}: only http:// is supported")))?;
    let failed = |e| Error::with_source(ErrorKind::Transient, url, e);
    let (hostport, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/metrics".into()));
    let mut s = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(failed)?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(failed)?;
    let mut raw = Vec::new();
    s.take(MAX_METRICS_BYTES)
        .read_to_end(&mut raw)
        .await
        .map_err(failed)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::new(ErrorKind::Permanent, format!("{url}: not an HTTP response")))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("");
        return Err(Error::new(ErrorKind::Permanent, format!("{url}: {status}")));
    }
    Ok(Scrape::parse(body))
}

/// The volume label of the export in the metrics: its name, or the only volume
/// there is. `None` when neither tells.
pub(super) fn export_volume(scrape: &Scrape, export: &str) -> Option<String> {
    let vols = scrape.volumes("lsvd_log_used_bytes");
    if vols.contains(&export) {
        return Some(export.to_string());
    }
    match vols.as_slice() {
        [only] => Some(only.to_string()),
        _ => None,
    }
}

/// Read-cache (hits, misses) of `volume` (or of all volumes).
pub(super) fn cache_counts(s: &Scrape, volume: Option<&str>) -> (f64, f64) {
    (
        s.value("lsvd_read_cache_hits_total", volume).unwrap_or(0.0),
        s.value("lsvd_read_cache_misses_total", volume)
            .unwrap_or(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_per_volume() {
        let body = "# HELP lsvd_log_used_bytes x\n# TYPE lsvd_log_used_bytes gauge\n\
            lsvd_log_used_bytes{volume=\"a\"} 4096\nlsvd_log_used_bytes{volume=\"b\"} 0\n\
            lsvd_read_cache_hits_total{volume=\"a\"} 3\nlsvd_read_cache_hits_total{volume=\"b\"} 5\n\
            lsvd_read_cache_hits_total_other{volume=\"a\"} 100\n";
        let s = Scrape::parse(body);
        assert_eq!(s.value("lsvd_log_used_bytes", Some("a")), Some(4096.0));
        assert_eq!(s.value("lsvd_read_cache_hits_total", None), Some(8.0));
        assert_eq!(s.value("lsvd_read_cache_hits_total", Some("b")), Some(5.0));
        assert_eq!(s.value("lsvd_uploads_pending", Some("a")), None);
        assert_eq!(export_volume(&s, "b").as_deref(), Some("b"));
        assert_eq!(export_volume(&s, ""), None, "two volumes, no name");
        let one = Scrape::parse("lsvd_log_used_bytes{volume=\"disk0\"} 0\n");
        assert_eq!(export_volume(&one, "").as_deref(), Some("disk0"));
    }
}
