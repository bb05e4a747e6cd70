//! Minimal leveled logging to stderr. `LSVD_LOG=debug|info|warn|error` sets the level
//! (default info). Messages never include credentials.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

fn threshold() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("LSVD_LOG").as_deref() {
        Ok("debug") => Level::Debug,
        Ok("warn") => Level::Warn,
        Ok("error") => Level::Error,
        _ => Level::Info,
    })
}

pub fn log(level: Level, msg: &str) {
    if level >= threshold() {
        let tag = match level {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        };
        eprintln!("lsvd: {tag}: {msg}");
        #[cfg(any(test, feature = "testutil"))]
        capture::record(&format!("{tag}: {msg}"));
    }
}

/// Lines logged while a test watches ([`capture::Capture`]), so a test can assert
/// that a fault was said. Every test of a process shares it: a test looks for lines
/// naming its own volume or keys.
#[cfg(any(test, feature = "testutil"))]
pub mod capture {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Lines kept at most (the oldest go first).
    const MAX_LINES: usize = 20_000;

    static WATCHERS: AtomicUsize = AtomicUsize::new(0);
    static LINES: Mutex<std::collections::VecDeque<String>> =
        Mutex::new(std::collections::VecDeque::new());

    pub(super) fn record(line: &str) {
        if WATCHERS.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == MAX_LINES {
            lines.pop_front();
        }
        lines.push_back(line.to_string());
    }

    /// Keeps logged lines while it lives.
    pub struct Capture(());

    impl Capture {
        pub fn start() -> Capture {
            WATCHERS.fetch_add(1, Ordering::SeqCst);
            Capture(())
        }

        /// Lines logged so far (by any test) that contain `needle`.
        pub fn lines_with(&self, needle: &str) -> Vec<String> {
            let lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
            lines
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect()
        }
    }

    impl Drop for Capture {
        fn drop(&mut self) {
            if WATCHERS.fetch_sub(1, Ordering::SeqCst) == 1 {
                LINES.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
    }
}

pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}
pub fn info(msg: &str) {
    log(Level::Info, msg)
}
pub fn warn(msg: &str) {
    log(Level::Warn, msg)
}
pub fn error(msg: &str) {
    log(Level::Error, msg)
}
