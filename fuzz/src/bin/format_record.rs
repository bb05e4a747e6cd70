//! AFL++ harness for the `format_record` target; the check is [`lsvd_fuzz::format_targets::record`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::record(data);
    });
}
