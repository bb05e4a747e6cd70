//! AFL++ harness for the `format_checkpoint` target; the check is [`lsvd_fuzz::format_targets::checkpoint`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::checkpoint(data);
    });
}
