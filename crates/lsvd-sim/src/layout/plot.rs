//! A small hand-written SVG of a layout sweep: page writes per second against disk
//! utilization, one panel per disk, one line per layout, with the model's crossover
//! (dashed) and HyLog's (dotted).

use std::fmt::Write as _;

use super::report::LayoutReport;

const WIDTH: f64 = 700.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 30.0;
const GAP: f64 = 50.0;
const COLORS: [&str; 3] = ["#d62728", "#1f77b4", "#2ca02c"];

/// The SVG text.
pub fn svg(report: &LayoutReport) -> String {
    let n = report.disks.len().max(1) as f64;
    let height = TOP + n * (PANEL + GAP);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, d) in report.disks.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL + GAP);
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (top + PANEL, top);
        let us: Vec<f64> = d.rows.iter().map(|r| r.disk_utilization).collect();
        let umin = us.iter().copied().fold(f64::INFINITY, f64::min);
        let umax = us.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let span = if umax > umin { umax - umin } else { 1.0 };
        let ymax = d
            .rows
            .iter()
            .flat_map(|r| r.pages_per_second.iter().map(|(_, v)| *v))
            .fold(1.0, f64::max)
            * 1.05;
        let px = |u: f64| x0 + (u - umin) / span * (x1 - x0);
        let py = |v: f64| y0 - v.min(ymax) / ymax * (y0 - y1);
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="{}" font-size="13">disk {}, {} KiB pages, {} KiB segments: page writes per second</text>"#,
            top - 8.0,
            d.model.disk,
            d.model.page_bytes / 1024,
            d.model.segment_bytes / 1024
        );
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{y1}" width="{}" height="{PANEL}" fill="none" stroke="#888"/>"##,
            x1 - x0
        );
        for k in 0..=4 {
            let v = ymax * f64::from(k) / 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#,
                x0 - 4.0,
                py(v) + 4.0
            );
        }
        for u in [umin, (umin + umax) / 2.0, umax] {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{u:.2}</text>"#,
                px(u),
                y0 + 14.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">disk utilization</text>"#,
            (x0 + x1) / 2.0,
            y0 + 28.0
        );
        let layouts: Vec<_> = d
            .rows
            .first()
            .map(|r| r.pages_per_second.iter().map(|(l, _)| *l).collect())
            .unwrap_or_default();
        for (j, l) in layouts.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let points: Vec<String> = d
                .rows
                .iter()
                .filter_map(|r| {
                    r.pages_per_second
                        .get(j)
                        .map(|(_, v)| format!("{:.1},{:.1}", px(r.disk_utilization), py(*v)))
                })
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" fill="{color}">{}</text>"#,
                x1 + 8.0,
                y1 + 14.0 + j as f64 * 14.0,
                l.name()
            );
        }
        let marks = [
            (d.crossover.map(|c| c.1), "6,4", "model"),
            (d.hylog_table.map(|c| c.1), "2,3", "HyLog"),
        ];
        for (k, (u, dash, name)) in marks.iter().enumerate() {
            let Some(u) = u else { continue };
            if *u < umin || *u > umax {
                continue;
            }
            let x = px(*u);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{y0}" stroke="#555" stroke-dasharray="{dash}"/>"##
            );
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" fill="#555">{name} crossover {u:.3}</text>"##,
                x1 + 8.0,
                y1 + 70.0 + k as f64 * 14.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
