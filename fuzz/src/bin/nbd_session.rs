//! AFL++ harness for the `nbd_session` target; the check is [`lsvd_fuzz::nbd_session::session`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::nbd_session::session(data);
    });
}
