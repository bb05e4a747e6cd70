//! A hand-written SVG chart of a run's time series: store size, utilization and
//! cumulative write amplification against client bytes written, one line per simulated
//! volume and configuration. When a charted configuration ran `--gc-policy hylog`, a
//! fourth panel shows the hot fraction its GC passes chose over the same axis (only
//! the hylog lines: the other policies choose none), so one chart shows both what the
//! policy decided and what it cost.

use std::fmt::Write as _;

use lsvd_core::gc::GcPolicy;

use super::report::RunReport;
use super::volume::SeriesPoint;

const WIDTH: f64 = 760.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Round numbers for axis ticks covering `[0, max]`.
pub(crate) fn ticks(max: f64) -> (f64, Vec<f64>) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let top = (max / step).ceil() * step;
    let n = (top / step).round() as usize;
    (top, (0..=n).map(|i| i as f64 * step).collect())
}

pub(crate) fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if (v - v.round()).abs() < 1e-9 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

struct Line<'a> {
    name: String,
    points: &'a [SeriesPoint],
    /// The configuration ran hylog (so its points carry a chosen hot fraction).
    hylog: bool,
}

struct Panel {
    title: &'static str,
    y: fn(&SeriesPoint) -> f64,
    /// Fixed y range (otherwise from the data, starting at 0).
    y_max: Option<f64>,
    /// Draw a 1.0 reference line.
    unit_line: bool,
    /// Only the hylog lines (the hot fraction chosen; 0 for every other policy).
    hylog_only: bool,
}

/// The title of the hot-fraction panel (also what the tests look for).
pub const HOT_FRACTION_TITLE: &str = "hylog: hot fraction chosen by the latest GC pass";

const GIB: f64 = (1u64 << 30) as f64;

/// The chart for `report`: the `max_lines` volume/configuration pairs with the most
/// client bytes written.
pub fn chart(report: &RunReport, max_lines: usize) -> String {
    let mut chosen: Vec<&super::report::VolumeResult> = report
        .volumes
        .iter()
        .filter(|v| !v.series.is_empty())
        .collect();
    chosen.sort_by_key(|v| std::cmp::Reverse(v.report.counters.client_write_bytes));
    chosen.truncate(max_lines.min(COLORS.len()));
    let multi_input = report.inputs.len() > 1;
    let lines: Vec<Line<'_>> = chosen
        .iter()
        .map(|v| {
            let mut name = v.volume.clone();
            if multi_input && let Some(i) = report.inputs.get(v.input) {
                let file = std::path::Path::new(&i.name)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| i.name.clone());
                name = format!("{file}: {name}");
            }
            if !v.config.is_empty() {
                name = format!("{name} ({})", v.config);
            }
            Line {
                name,
                points: &v.series,
                hylog: matches!(v.gc_policy.parse::<GcPolicy>(), Ok(GcPolicy::HyLog)),
            }
        })
        .collect();
    let mut panels = vec![
        Panel {
            title: "store size (GiB)",
            y: |p| p.store_bytes as f64 / GIB,
            y_max: None,
            unit_line: false,
            hylog_only: false,
        },
        Panel {
            title: "utilization (live / stored)",
            y: |p| p.utilization,
            y_max: Some(1.0),
            unit_line: false,
            hylog_only: false,
        },
        Panel {
            title: "write amplification (cumulative)",
            y: |p| p.write_amplification,
            y_max: None,
            unit_line: true,
            hylog_only: false,
        },
    ];
    if lines.iter().any(|l| l.hylog) {
        panels.push(Panel {
            title: HOT_FRACTION_TITLE,
            y: |p| p.gc_hot_fraction,
            y_max: Some(1.0),
            unit_line: false,
            hylog_only: true,
        });
    }
    let legend_height = 18.0 * lines.len() as f64 + 10.0;
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP) + legend_height;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x_max_raw = lines
        .iter()
        .flat_map(|l| l.points.iter())
        .map(|p| p.client_write_bytes as f64 / GIB)
        .fold(0.0, f64::max);
    let (x_top, x_ticks) = ticks(x_max_raw);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="20" font-size="14" font-weight="bold">lsvd sim: against client bytes written (GiB)</text>"#
    );
    for (pi, panel) in panels.iter().enumerate() {
        let y0 = TOP + pi as f64 * (PANEL_HEIGHT + GAP);
        let shown = |l: &&Line<'_>| l.hylog || !panel.hylog_only;
        let y_raw = lines
            .iter()
            .filter(shown)
            .flat_map(|l| l.points.iter())
            .map(panel.y)
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let (y_top, y_ticks) = ticks(panel.y_max.unwrap_or(y_raw * 1.05));
        let px = |x: f64| LEFT + x / x_top * plot_w;
        let py = |y: f64| y0 + PANEL_HEIGHT - (y / y_top).clamp(0.0, 1.0) * PANEL_HEIGHT;
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
            y0 - 6.0,
            panel.title
        );
        for t in &y_ticks {
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                py(*t) + 4.0,
                label(*t),
                y = py(*t)
            );
        }
        for t in &x_ticks {
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{y0:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                y0 + PANEL_HEIGHT,
                y0 + PANEL_HEIGHT + 14.0,
                label(*t),
                x = px(*t)
            );
        }
        if panel.unit_line && y_top >= 1.0 {
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#888" stroke-dasharray="4 3"/>"##,
                LEFT + plot_w,
                y = py(1.0)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y0:.1}" width="{plot_w:.1}" height="{PANEL_HEIGHT}" fill="none" stroke="#444"/>"##
        );
        for (li, line) in lines.iter().enumerate() {
            if !shown(&line) {
                continue;
            }
            let mut d = String::new();
            for (i, p) in line.points.iter().enumerate() {
                let y = (panel.y)(p);
                if !y.is_finite() {
                    continue;
                }
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if i == 0 { "M" } else { " L" },
                    px(p.client_write_bytes as f64 / GIB),
                    py(y)
                );
            }
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
                COLORS[li % COLORS.len()]
            );
        }
    }
    let ly = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP) - 20.0;
    for (li, line) in lines.iter().enumerate() {
        let y = ly + 18.0 * li as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 24.0,
            COLORS[li % COLORS.len()],
            LEFT + 30.0,
            y + 4.0,
            escape(&line.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        let (top, t) = ticks(2.3);
        assert_eq!(top, 2.5);
        assert_eq!(t, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        let (top, _) = ticks(0.0);
        assert!(top > 0.0);
        assert_eq!(label(0.25), "0.25");
        assert_eq!(label(1.0), "1");
        assert_eq!(label(20.0), "20");
        assert_eq!(label(12.5), "12.5");
    }

    /// A small skewed run with the given policies, with series.
    fn run(policies: &str) -> RunReport {
        let line = format!(
            "lsvd sim --synthetic hotcold:0.1:0.9 --volume-size 16M --requests 40000 --precondition --batch-size 256K --gc-pass 1M --gc-start 0.8 --gc-policy {policies} --series"
        );
        let a = crate::parse_cli(crate::tests::words(&line)).expect("parse");
        super::super::simulate(&a).expect("simulate")
    }

    #[test]
    fn hot_fraction_panel_only_when_hylog_ran() {
        let r = run("greedy,hylog");
        let hylog = r
            .volumes
            .iter()
            .find(|v| v.gc_policy == "hylog")
            .expect("a hylog run");
        assert!(
            hylog.series.iter().any(|p| p.gc_hot_fraction > 0.0),
            "hylog separated at some point of the series"
        );
        let svg = chart(&r, 8);
        assert!(svg.contains(HOT_FRACTION_TITLE));
        // Three panels for both lines, the hot-fraction panel for hylog's only.
        assert_eq!(svg.matches("<path").count(), 3 * 2 + 1);
        // The hylog line in the last panel reaches above its zero line: the chosen
        // fraction is drawn, not a flat 0.
        let last = svg
            .rsplit("<path d=\"")
            .next()
            .expect("a path")
            .split('"')
            .next()
            .expect("path data");
        let ys: Vec<f64> = last
            .split(['M', 'L', ' '])
            .filter_map(|pt| pt.split_once(','))
            .map(|(_, y)| y.parse::<f64>().expect("y"))
            .collect();
        let zero = TOP + 3.0 * (PANEL_HEIGHT + GAP) + PANEL_HEIGHT;
        assert!(ys.iter().all(|y| *y <= zero + 0.1), "{last}");
        assert!(ys.iter().any(|y| *y < zero - 1.0), "{last}");

        let r = run("greedy,cost-benefit");
        let svg = chart(&r, 8);
        assert!(!svg.contains(HOT_FRACTION_TITLE));
        assert!(!svg.contains("hot fraction"));
        assert_eq!(svg.matches("<path").count(), 3 * 2);
    }
}
