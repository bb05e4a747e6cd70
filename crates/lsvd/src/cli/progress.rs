//! Progress of a long command (export, import): how far, how fast, how long still.
//!
//! Why its own: every command that may run for minutes should say where it is, the
//! same way. On a terminal the line is redrawn in place; otherwise (a log, a pipe) a
//! plain line every few seconds; nothing with `--quiet`. The final line gives totals
//! either way, unless quiet.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use lsvd_core::size::format_size;
use lsvd_store::clock::{Clock, SystemClock};

/// How often a line is printed when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// How often the line is redrawn on a terminal.
const TERMINAL_EVERY: Duration = Duration::from_millis(200);

pub struct Progress {
    what: String,
    total_bytes: u64,
    quiet: bool,
    terminal: bool,
    clock: SystemClock,
    last_shown: Duration,
}

impl Progress {
    /// `what` names the work ("export vol@s1"); `total_bytes` is how much there is.
    pub fn new(what: impl Into<String>, total_bytes: u64, quiet: bool) -> Progress {
        Progress {
            what: what.into(),
            total_bytes,
            quiet,
            terminal: std::io::stderr().is_terminal(),
            clock: SystemClock::new(),
            last_shown: Duration::ZERO,
        }
    }

    /// `done_bytes` of the total are done.
    pub fn update(&mut self, done_bytes: u64) {
        if self.quiet {
            return;
        }
        let every = if self.terminal {
            TERMINAL_EVERY
        } else {
            PLAIN_EVERY
        };
        let now = self.clock.now();
        if now.saturating_sub(self.last_shown) < every {
            return;
        }
        self.last_shown = now;
        let line = self.line(done_bytes, now);
        let mut err = std::io::stderr().lock();
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// The total changed (a listing finished, say).
    pub fn set_total(&mut self, total_bytes: u64) {
        self.total_bytes = total_bytes;
    }

    /// Erase the redrawn line (a terminal), for a command whose summary goes to stdout.
    pub fn clear(&self) {
        if !self.quiet && self.terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }

    /// The last line: `summary` (what was done, in the caller's words) and the rate.
    pub fn finish(&self, done_bytes: u64, summary: &str) {
        if self.quiet {
            return;
        }
        let secs = self.clock.now().as_secs_f64();
        let rate = done_bytes as f64 / secs.max(1e-3);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K");
        }
        let _ = writeln!(
            err,
            "lsvd: {}: {summary} in {secs:.1} s ({}/s)",
            self.what,
            format_size(rate as u64)
        );
    }

    /// The line after `elapsed` since the start.
    fn line(&self, done_bytes: u64, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = done_bytes as f64 / secs;
        if self.total_bytes == 0 {
            // How much there is is not known: how far and how fast only.
            return format!(
                "lsvd: {}: {} so far, {}/s",
                self.what,
                format_size(done_bytes),
                format_size(rate as u64)
            );
        }
        let left = self.total_bytes.saturating_sub(done_bytes);
        let eta = if rate > 0.0 {
            format!("{:.0} s left", left as f64 / rate)
        } else {
            "time left unknown".to_string()
        };
        let percent = done_bytes as f64 * 100.0 / self.total_bytes.max(1) as f64;
        format!(
            "lsvd: {}: {} of {} ({percent:.0}%), {}/s, {eta}",
            self.what,
            format_size(done_bytes),
            format_size(self.total_bytes),
            format_size(rate as u64)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_how_far_how_fast_and_how_long() {
        let p = Progress::new("export v", 4 << 30, false);
        let line = p.line(1 << 30, Duration::from_secs(2));
        assert!(
            line.starts_with("lsvd: export v: 1.0 GiB of 4.0 GiB (25%), "),
            "{line}"
        );
        assert!(line.ends_with("512.0 MiB/s, 6 s left"), "{line}");
        let unknown = Progress::new("chain rebuild", 0, false);
        let line = unknown.line(3 << 20, Duration::from_secs(2));
        assert_eq!(line, "lsvd: chain rebuild: 3.0 MiB so far, 1.5 MiB/s");
    }
}
