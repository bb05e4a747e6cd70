//! The `lsvd` command.
//!
//! Exit status: 0 on success, 2 for invalid input (like clap's usage errors), 1 for
//! any other failure; the error is printed as one line.

use clap::Parser;

use lsvd_core::error::ErrorKind;

fn main() {
    let cli = lsvd::cli::Cli::parse();
    if let Err(e) = lsvd::cli::run(cli) {
        eprintln!("lsvd: error: {e}");
        let code = if e.kind == ErrorKind::BadInput { 2 } else { 1 };
        std::process::exit(code);
    }
}
