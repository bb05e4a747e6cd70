//! The `lsvd` command.

use clap::Parser;

fn main() {
    let cli = lsvd::cli::Cli::parse();
    if let Err(e) = lsvd::cli::run(cli) {
        eprintln!("lsvd: error: {e}");
        std::process::exit(1);
    }
}
