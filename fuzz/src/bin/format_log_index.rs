//! AFL++ harness for the `format_log_index` target; the check is [`lsvd_fuzz::format_targets::log_index`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::log_index(data);
    });
}
