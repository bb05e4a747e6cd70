#!/usr/bin/env python3
"""Clones of one image read at once (a boot storm): one read cache per server, shared.

The LSVD paper keeps one cache SSD per host for all its volumes. Here a base volume is
written (--image of random data), snapshotted and cloned N times; then every clone is
read whole at once (nbdcopy to /dev/null, one per clone), from a cold data directory,
two ways in the same run:

  shared    one `lsvd serve` of the N clones: one read cache (what lsvd does)
  separate  N `lsvd serve` processes, one clone each, each with a read cache of its
            own (what a cache per volume costs: every clone fetches the image again)

Reported per way: GETs and bytes fetched from the store, read-cache misses, and the
wall time until every clone was read. With --s3 the store is the S3 server that
scripts/with-versitygw.sh started; otherwise a local directory.

    scripts/with-versitygw.sh python3 bench/clone_boot.py --lsvd target/release/lsvd --s3
        [--clones 4] [--image 256M] [--out DIR] [--dir SCRATCH]

Not part of CI (a measurement). See bench/README.md.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import free_port, s3_env, scrape, start, stop_proc, wait_or_kill  # noqa: E402

COUNTERS = ("lsvd_store_gets_total", "lsvd_store_get_bytes_total",
            "lsvd_read_cache_misses_total", "lsvd_read_cache_hits_total")


def lsvd(binary, data, store, *args):
    cmd = [binary, "--data", data] + (["--store", store] if store else []) + list(args)
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def serve(binary, data, store, names, sock):
    port = free_port()
    args = [binary, "--data", data] + (["--store", store] if store else []) + [
        "serve", *names, "--no-probe", "--socket", sock, "--log-size", "64M",
        "--read-cache-size", "2G", "--metrics", f"127.0.0.1:{port}"]
    p = start(args, os.path.join(data, "server.log"))
    wait_or_kill(p, sock, timeout=120)
    return p, port


def read_all(uris):
    """Every export read whole at once; seconds until the last is done."""
    t0 = time.time()
    procs = [subprocess.Popen(["nbdcopy", "--connections", "2", u, "null:"]) for u in uris]
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"clone_boot: nbdcopy failed ({p.returncode})")
    return time.time() - t0


def way(binary, store, clones, scratch, shared):
    servers = []
    try:
        if shared:
            data = os.path.join(scratch, "shared")
            os.makedirs(data)
            sock = os.path.join(data, "nbd.sock")
            servers.append(serve(binary, data, store, clones, sock))
            uris = [f"nbd+unix:///{c}?socket={sock}" for c in clones]
        else:
            uris = []
            for c in clones:
                data = os.path.join(scratch, f"separate-{c}")
                os.makedirs(data)
                sock = os.path.join(data, "nbd.sock")
                servers.append(serve(binary, data, store, [c], sock))
                uris.append(f"nbd+unix:///{c}?socket={sock}")
        before = [scrape(port) for _, port in servers]
        seconds = read_all(uris)
        after = [scrape(port) for _, port in servers]
    finally:
        for p, _ in servers:
            stop_proc(p)
    total = {k: sum(a.get(k, 0) - b.get(k, 0) for a, b in zip(after, before)) for k in COUNTERS}
    return {"seconds": round(seconds, 2), **{k.removeprefix("lsvd_"): int(v) for k, v in total.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--clones", type=int, default=4)
    ap.add_argument("--image", default="256M", help="bytes of random data in the base")
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="clone-boot-", dir=a.dir)
    try:
        binary = os.path.abspath(a.lsvd)
        store = None
        if a.s3:
            _, _, _, bucket = s3_env()
            store = f"s3://{bucket}/clone-boot-{os.getpid()}"
        else:
            store = os.path.join(scratch, "store")
        writer = os.path.join(scratch, "writer")
        os.makedirs(writer)
        lsvd(binary, writer, store, "create", "base", "--size", a.image)
        image = os.path.join(scratch, "image.raw")
        with open(image, "wb") as f:
            left = int(subprocess.run(["numfmt", "--from=iec", a.image], check=True,
                                      capture_output=True, text=True).stdout)
            while left > 0:
                n = min(left, 1 << 20)
                f.write(os.urandom(n))
                left -= n
        sock = os.path.join(writer, "nbd.sock")
        p, _ = serve(binary, writer, store, ["base"], sock)
        try:
            subprocess.run(["nbdcopy", image, f"nbd+unix:///base?socket={sock}"], check=True)
        finally:
            stop_proc(p)
        os.remove(image)
        lsvd(binary, writer, store, "snapshot", "create", "base", "golden")
        clones = [f"c{i}" for i in range(a.clones)]
        for c in clones:
            lsvd(binary, writer, store, "clone", "base@golden", c)
        result = {"clones": a.clones, "image": a.image, "store": "s3" if a.s3 else "local",
                  "shared": way(binary, store, clones, scratch, True),
                  "separate": way(binary, store, clones, scratch, False)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    s, p = result["shared"], result["separate"]
    lines = [f"{a.clones} clones of a {a.image} image read whole at once, {result['store']} store",
             f"{'':10} {'GETs':>8} {'MiB fetched':>12} {'misses':>8} {'seconds':>8}"]
    for name, r in (("shared", s), ("separate", p)):
        lines.append(f"{name:10} {r['store_gets_total']:>8} {r['store_get_bytes_total'] / 2**20:>12.1f} "
                     f"{r['read_cache_misses_total']:>8} {r['seconds']:>8}")
    lines.append(f"shared/separate: GETs {s['store_gets_total'] / max(1, p['store_gets_total']):.2f}x, "
                 f"time {s['seconds'] / max(0.01, p['seconds']):.2f}x")
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "clone_boot.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(a.out, "clone_boot.txt"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
