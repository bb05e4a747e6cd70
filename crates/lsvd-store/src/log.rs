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
