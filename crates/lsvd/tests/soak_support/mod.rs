//! The pieces of the soak (crates/lsvd/tests/soak.rs): the per-block oracle, the
//! workload and the misbehaving clients, and the processes it stops and starts.

pub mod load;
pub mod oracle;
pub mod procs;

/// The text of `http://ADDR/metrics`, or None if it does not answer.
pub fn metrics_text(addr: &str) -> Option<String> {
    crate::common::fetch_metrics(addr).filter(|text| text.contains("lsvd_"))
}

/// The value of `lsvd_NAME` (with or without a `{volume=...}` label) in `text`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let plain = format!("lsvd_{name} ");
    let labelled = format!("lsvd_{name}{{");
    text.lines().find_map(|l| {
        let rest = if let Some(r) = l.strip_prefix(&plain) {
            r
        } else if l.starts_with(&labelled) {
            l.rsplit_once(' ')?.1
        } else {
            return None;
        };
        rest.trim().parse().ok()
    })
}
