//! AFL++ harness for the `format_object` target; the check is [`lsvd_fuzz::format_targets::object`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::object(data);
    });
}
