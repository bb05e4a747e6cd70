//! `lsvd sim`: trace-driven simulation on the same core as the live engine.

use clap::Args;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Trace files to replay.
    pub traces: Vec<std::path::PathBuf>,
}

pub fn run(_args: SimArgs) -> Result<(), String> {
    Err("lsvd sim is not implemented yet".into())
}
