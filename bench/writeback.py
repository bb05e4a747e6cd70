#!/usr/bin/env python3
"""Write-back behaviour (the LSVD paper's section 4.4, Figure 11), scaled to this machine.

The paper writes 20 GB at random into an 80 GB volume and reports when the client's
writes completed (77 s) and when the backend image was in step with the cache (120 s):
write-back runs at full speed while the client writes, so the store is consistent
soon after the client stops (bcache, by contrast, wrote back nothing under load and
took over 1,500 s). Here: a fresh volume of 4 x --bytes, --bytes of random writes of
--bs at queue depth 32 (fio, nbd engine), with a write log large enough to take the
whole burst (--log-size, default 2 x --bytes). Sampled every half second from the
metrics endpoint: bytes uploaded to the store, bytes in the write log, uploads pending.

Reported: seconds until the client's writes completed, seconds until the store held
everything (write log empty, no upload pending: the remote image in step), the
write-back rate while the client wrote and after, what GC moved, and the timeline.
The baseline, in the same run: the same fio job on a raw file on the same filesystem
(`--direct=1`, then fdatasync), the device's own speed for this pattern.

    python3 bench/writeback.py --lsvd target/release/lsvd [--bytes 2G] [--bs 64k]
    scripts/with-versitygw.sh python3 bench/writeback.py --lsvd BIN --s3

Not part of CI (a measurement). See bench/README.md and docs/seeds.md.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import free_port, s3_env, scrape, start, stop_proc, wait_or_kill  # noqa: E402


def size_bytes(text):
    return int(subprocess.run(["numfmt", "--from=iec", text], check=True,
                              capture_output=True, text=True).stdout)


def fio_job(target, nbytes, bs, extra):
    """Random writes of `nbytes` in `bs` pieces at QD32; fio's seconds."""
    out = subprocess.run(
        ["fio", "--name=wb", *target, f"--size={nbytes}", f"--io_size={nbytes}",
         "--rw=randwrite", f"--bs={bs}", "--iodepth=32", "--randrepeat=0",
         "--norandommap", "--output-format=json", *extra],
        check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job["job_runtime"] / 1000.0


def raw_baseline(scratch, nbytes, bs):
    path = os.path.join(scratch, "raw.img")
    with open(path, "wb") as f:
        f.truncate(4 * nbytes)
    t0 = time.time()
    fio_job([f"--filename={path}", "--ioengine=libaio", "--direct=1"], nbytes, bs,
            ["--end_fsync=1"])
    took = time.time() - t0
    os.remove(path)
    return took


class Sampler(threading.Thread):
    """The metrics every half second, from the start of the client's writes."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.samples, self.stop = port, [], threading.Event()
        self.t0 = time.time()

    def run(self):
        while not self.stop.is_set():
            try:
                m = scrape(self.port)
                self.samples.append((time.time() - self.t0, m))
            except OSError:
                pass
            self.stop.wait(0.5)


def lsvd_run(binary, scratch, store, nbytes, bs, log_size):
    data = os.path.join(scratch, "data")
    os.makedirs(data)
    base = [binary, "--data", data] + (["--store", store] if store else [])
    subprocess.run(base + ["create", "vol", "--size", str(4 * nbytes)], check=True,
                   capture_output=True)
    sock, port = os.path.join(data, "nbd.sock"), free_port()
    p = start(base + ["serve", "vol", "--no-probe", "--socket", sock, "--log-size",
                      str(log_size), "--metrics", f"127.0.0.1:{port}"],
              os.path.join(data, "server.log"))
    try:
        wait_or_kill(p, sock, timeout=120)
        sampler = Sampler(port)
        sampler.start()
        client = fio_job(["--ioengine=nbd", f"--uri=nbd+unix:///vol?socket={sock}"],
                         nbytes, bs, [])
        while True:
            m = scrape(port)
            if m.get("lsvd_log_used_bytes", 1) == 0 and m.get("lsvd_uploads_pending", 1) == 0:
                break
            if time.time() - sampler.t0 > 3600:
                sys.exit("writeback: the store did not catch up within an hour")
            time.sleep(0.2)
        synced = time.time() - sampler.t0
        time.sleep(0.6)
        sampler.stop.set()
        sampler.join()
    finally:
        stop_proc(p)
    return client, synced, sampler.samples


def rate_between(samples, t_from, t_to, key="lsvd_store_write_bytes_total"):
    inside = [(t, m[key]) for t, m in samples if t_from <= t <= t_to and key in m]
    if len(inside) < 2 or inside[-1][0] == inside[0][0]:
        return 0.0
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--bytes", default="2G", help="bytes of random writes (the volume is 4x)")
    ap.add_argument("--bs", default="64k", help="fio block size")
    ap.add_argument("--log-size", help="write log size (default: 2x --bytes)")
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    nbytes = size_bytes(a.bytes)
    log_size = size_bytes(a.log_size) if a.log_size else 2 * nbytes
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="writeback-", dir=a.dir)
    try:
        store = None
        if a.s3:
            _, _, _, bucket = s3_env()
            store = f"s3://{bucket}/writeback-{os.getpid()}"
        raw = raw_baseline(scratch, nbytes, a.bs)
        client, synced, samples = lsvd_run(os.path.abspath(a.lsvd), scratch, store, nbytes,
                                           a.bs, log_size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    last = samples[-1][1] if samples else {}
    first = samples[0][1] if samples else {}
    uploaded = (last.get("lsvd_store_write_bytes_total", 0)
                - first.get("lsvd_store_write_bytes_total", 0)) / 1e6
    moved = (last.get("lsvd_gc_moved_bytes_total", 0)
             - first.get("lsvd_gc_moved_bytes_total", 0)) / 1e6
    during = rate_between(samples, 0, client)
    after = rate_between(samples, client, synced)
    result = {
        "store": "s3" if a.s3 else "local", "bytes": nbytes, "bs": a.bs,
        "log_size": log_size, "raw_seconds": round(raw, 1),
        "client_seconds": round(client, 1), "synced_seconds": round(synced, 1),
        "client_mb_s": round(nbytes / 1e6 / client, 1),
        "writeback_mb_s_while_client_writes": round(during, 1),
        "writeback_mb_s_after": round(after, 1),
        "uploaded_mb": round(uploaded), "gc_moved_mb": round(moved),
        "timeline": [(round(t, 1), round(m.get("lsvd_store_write_bytes_total", 0) / 1e6),
                      round(m.get("lsvd_log_used_bytes", 0) / 1e6))
                     for t, m in samples[::4]],
    }
    print(f"{a.bytes} of {a.bs} random writes into a {4 * nbytes / 2**30:.0f} GiB volume, "
          f"{result['store']} store, write log {log_size / 2**30:.1f} GiB")
    print(f"  raw file (O_DIRECT, then fdatasync): {raw:.1f} s")
    print(f"  lsvd: client done after {client:.1f} s ({result['client_mb_s']} MB/s, "
          f"{client / raw:.2f}x the raw file's time); store in step after {synced:.1f} s "
          f"({synced / client:.2f}x the client's time)")
    print(f"  write-back {during:.0f} MB/s while the client wrote, {after:.0f} MB/s after; "
          f"{uploaded:.0f} MB uploaded, GC moved {moved:.0f} MB")
    print("  timeline (s, MB uploaded, MB in the write log):")
    for t, up, log in result["timeline"]:
        print(f"    {t:7.1f} {up:8} {log:8}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
