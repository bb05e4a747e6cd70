//! AFL++ harness for the `format_diff` target; the check is [`lsvd_fuzz::format_targets::diff`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::diff(data);
    });
}
