//! The `lsvd` command.
//!
//! Exit status: 0 on success, 2 for invalid input (like clap's usage errors), 1 for
//! any other failure; the error is printed as one line. Output to a pipe that closed
//! (`lsvd info vol | head -3`) ends the command quietly with status 141, as SIGPIPE
//! ends other tools (the signal itself stays ignored: the server and the store
//! clients write to sockets, where a peer that went away is an error to handle, not a
//! reason to die).

use clap::Parser;

use lsvd_core::error::ErrorKind;

/// Exit status of a command whose standard output went away (128 + SIGPIPE).
const EXIT_BROKEN_PIPE: i32 = 141;

fn main() {
    quiet_on_broken_stdout();
    let cli = lsvd::cli::Cli::parse();
    if let Err(e) = lsvd::cli::run(cli) {
        eprintln!("lsvd: error: {e}");
        let code = if e.kind == ErrorKind::BadInput { 2 } else { 1 };
        std::process::exit(code);
    }
}

/// `println!` panics when standard output is a pipe whose reader has gone: exit as a
/// tool killed by SIGPIPE would, without a panic message. Every other panic is
/// reported as before.
fn quiet_on_broken_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        default(info);
    }));
}
