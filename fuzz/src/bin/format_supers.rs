//! AFL++ harness for the `format_supers` target; the check is [`lsvd_fuzz::format_targets::supers`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::format_targets::supers(data);
    });
}
