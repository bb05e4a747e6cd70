//! `lsvd serve`'s engine options turned into an `EngineConfig`: the `auto` values
//! resolve against the options they depend on.

use clap::Parser;

use super::EngineArgs;
use lsvd_core::error::ErrorKind;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    engine: EngineArgs,
}

fn config(args: &[&str]) -> lsvd_core::error::Result<lsvd_engine::EngineConfig> {
    let parsed = Args::try_parse_from(std::iter::once("lsvd").chain(args.iter().copied()))
        .expect("the options parse");
    parsed.engine.to_config()
}

#[test]
fn gc_headroom_defaults_to_a_quarter_of_the_write_log() {
    let c = config(&[]).expect("defaults");
    assert_eq!(c.effective_gc_headroom_bytes(), c.log_size_bytes / 4);
    assert_eq!(
        c.effective_gc_headroom_bytes(),
        256 << 20,
        "the default 1G log"
    );
    let c = config(&["--log-size", "2G"]).expect("2G log");
    assert_eq!(c.effective_gc_headroom_bytes(), 512 << 20);
    let c = config(&["--gc-headroom", "0"]).expect("none");
    assert_eq!(c.effective_gc_headroom_bytes(), 0);
    let c = config(&["--gc-headroom", "4G", "--log-size", "64M"]).expect("explicit");
    assert_eq!(c.effective_gc_headroom_bytes(), 4 << 30);
    let e = config(&["--gc-headroom", "lots"]).expect_err("not a size");
    assert_eq!(e.kind, ErrorKind::BadInput);
    assert!(e.to_string().contains("--gc-headroom"), "{e}");
}

#[test]
fn gc_defrag_hole_is_off_by_default_and_takes_a_size() {
    assert_eq!(config(&[]).expect("defaults").gc.defrag_hole_bytes, 0);
    let c = config(&["--gc-defrag-hole", "8K"]).expect("8K");
    assert_eq!(c.gc.defrag_hole_bytes, 8 << 10);
    let e = config(&["--gc-defrag-hole", "wide"]).expect_err("not a size");
    assert_eq!(e.kind, ErrorKind::BadInput);
    assert!(e.to_string().contains("--gc-defrag-hole"), "{e}");
}
