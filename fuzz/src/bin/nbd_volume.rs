//! AFL++ harness for the `nbd_volume` target; the check is [`lsvd_fuzz::nbd_volume::volume`].

fn main() {
    afl::fuzz!(|data: &[u8]| {
        lsvd_fuzz::nbd_volume::volume(data);
    });
}
