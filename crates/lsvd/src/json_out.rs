//! The answer of a `--json` command, printed one way for every command (probe, replay,
//! config, info). A leaf module: the commands import it, it imports none of them.

use lsvd_core::error::{Error, ErrorKind, Result};

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::with_source(ErrorKind::Unsupported, "cannot encode JSON", e))?;
    println!("{text}");
    Ok(())
}
