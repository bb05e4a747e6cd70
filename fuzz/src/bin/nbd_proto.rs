//! AFL++ harness for the `nbd_proto` target; the check is [`lsvd_fuzz::nbd_proto::proto`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::nbd_proto::proto(data);
    });
}
