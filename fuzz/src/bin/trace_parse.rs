//! AFL++ harness for the `trace_parse` target; the check is [`lsvd_fuzz::trace_parse::trace`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::trace_parse::trace(data);
    });
}
