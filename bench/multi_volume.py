#!/usr/bin/env python3
"""Many volumes on one server: the LSVD paper's Figs 12-14, live.

One `lsvd serve` serves N volumes (N = 1, 2, 4, ... 32 by default) on the local file
store; fio writes 16 KiB blocks at random to every volume at once, each at queue
depth 32 over its own NBD connection, for --runtime seconds. Reported per N: total
IOPS, and the store operations per client write (PUTs of objects; the paper's
"backend I/Os per write", 0.25 for LSVD and 6 for RBD on its Ceph cluster), read from
the server's metrics once everything written has reached the store. Each N starts
from fresh volumes (4 GiB each by default, so that GC seldom runs).

    python3 bench/multi_volume.py --lsvd target/release/lsvd [--volumes 1,2,4,8,16,32]
        [--runtime 10] [--size 4G] [--out DIR]

Not part of CI (a measurement, minutes long). See bench/README.md.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import free_port, lsvd_settled, scrape, start, stop_proc, wait_or_kill  # noqa: E402


def run(lsvd, n, runtime, size, scratch):
    data = os.path.join(scratch, f"n{n}")
    os.makedirs(data)
    names = [f"v{i}" for i in range(n)]
    for name in names:
        subprocess.run([lsvd, "--data", data, "create", name, "--size", size],
                       check=True, capture_output=True)
    sock = os.path.join(data, "nbd.sock")
    port = free_port()
    # A 256 MiB write log and no read cache per volume: 32 volumes share this machine.
    server = start([lsvd, "--data", data, "serve", *names, "--no-probe", "--socket", sock,
                    "--log-size", "256M", "--read-cache-size", "0",
                    "--metrics", f"127.0.0.1:{port}"], os.path.join(data, "server.log"))
    try:
        wait_or_kill(server, sock, timeout=120)
        job = os.path.join(data, "job.fio")
        with open(job, "w") as f:
            f.write(f"[global]\nioengine=nbd\nrw=randwrite\nbs=16k\niodepth=32\nsize={size}\n"
                    f"time_based\nruntime={runtime}\nrandrepeat=0\nnorandommap\n"
                    "group_reporting\n")
            for name in names:
                f.write(f"[{name}]\nuri=nbd+unix:///{name}?socket={sock}\n")
        before = scrape(port)
        out = subprocess.run(["fio", "--output-format=json", job], check=True,
                             capture_output=True, text=True).stdout
        # Everything written reaches the store before the store traffic is counted.
        deadline = time.time() + 600
        while not lsvd_settled(port) and time.time() < deadline:
            time.sleep(0.5)
        after = scrape(port)
    finally:
        stop_proc(server)
        # Tens of GiB at 32 volumes: gone before the next N.
        shutil.rmtree(data, ignore_errors=True)
    j = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in
             ("lsvd_store_puts_total", "lsvd_client_write_bytes_total",
              "lsvd_store_write_bytes_total")}
    writes = delta["lsvd_client_write_bytes_total"] / (16 << 10)
    return {
        "volumes": n,
        "iops": j["iops"],
        "p99_us": j.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000,
        "client_writes": writes,
        "store_puts": delta["lsvd_store_puts_total"],
        "puts_per_write": delta["lsvd_store_puts_total"] / writes if writes else 0.0,
        "store_bytes_per_client_byte": (delta["lsvd_store_write_bytes_total"]
                                        / max(delta["lsvd_client_write_bytes_total"], 1)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--volumes", default="1,2,4,8,16,32")
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--size", default="4G", help="per volume")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dir", help="scratch directory (default: under /var/tmp)")
    a = ap.parse_args()
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="lsvd-multi-", dir=a.dir or "/var/tmp")
    rows = []
    try:
        for n in [int(x) for x in a.volumes.split(",")]:
            r = run(a.lsvd, n, a.runtime, a.size, scratch)
            print(f"{n:3} volumes: {r['iops']:9.0f} IOPS, p99 {r['p99_us']:8.0f} us, "
                  f"{r['puts_per_write']:.4f} store PUTs per write, "
                  f"{r['store_bytes_per_client_byte']:.3f} store bytes per client byte",
                  flush=True)
            rows.append(r)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "multi-volume.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "multi-volume.md"), "w") as f:
        f.write("| volumes | IOPS (16 KiB random writes, QD32 each) | p99 µs | store PUTs per "
                "write | store bytes per client byte |\n|---:|---:|---:|---:|---:|\n")
        for r in rows:
            f.write(f"| {r['volumes']} | {r['iops']:,.0f} | {r['p99_us']:,.0f} | "
                    f"{r['puts_per_write']:.4f} | {r['store_bytes_per_client_byte']:.3f} |\n")


if __name__ == "__main__":
    main()
