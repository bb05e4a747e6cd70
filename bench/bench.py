#!/usr/bin/env python3
"""Run fio jobs against lsvd and baselines in one invocation; report ratios.

Every target is measured in the same run, on the same disk, so ratios are meaningful
even on a noisy machine. See bench/README.md.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time

JOBS = [
    # name, fio args, size note
    ("randwrite-4k-qd32", ["--rw=randwrite", "--bs=4k", "--iodepth=32"]),
    ("randread-4k-qd32", ["--rw=randread", "--bs=4k", "--iodepth=32"]),
    ("seqwrite-1m-qd8", ["--rw=write", "--bs=1m", "--iodepth=8"]),
    ("syncwrite-4k-qd1", ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1"]),
    ("mixed-70r30w-4k-qd32", ["--rw=randrw", "--rwmixread=70", "--bs=4k", "--iodepth=32"]),
]


def wait_for(path, timeout=30):
    t = time.time()
    while not os.path.exists(path):
        if time.time() - t > timeout:
            raise RuntimeError(f"timed out waiting for {path}")
        time.sleep(0.05)


def fio(target_args, job_args, runtime, size):
    cmd = ["fio", "--name=job", "--output-format=json", "--time_based", f"--runtime={runtime}",
           f"--size={size}", "--randrepeat=0", "--norandommap", "--group_reporting"] + target_args + job_args
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        # e.g. nbdkit memory does not support FLUSH, so fdatasync jobs cannot run.
        return None
    out = proc.stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    res = {}
    for d in ("read", "write"):
        x = j[d]
        if x["io_bytes"] == 0:
            continue
        lat = x.get("clat_ns", {}).get("percentile", {})
        res[d] = {
            "iops": x["iops"],
            "mbps": x["bw_bytes"] / 1e6,
            "p50_us": lat.get("50.000000", 0) / 1000,
            "p99_us": lat.get("99.000000", 0) / 1000,
        }
    sync = j.get("sync", {}).get("lat_ns", {}).get("percentile", {})
    if sync:
        res["sync_p99_us"] = sync.get("99.000000", 0) / 1000
    return res


def precondition(target_args, size):
    subprocess.run(["fio", "--name=fill", "--rw=write", "--bs=1m", "--iodepth=8", f"--size={size}"]
                   + target_args, check=True, capture_output=True)


class Target:
    def __init__(self, name, fio_args, stop=None, backend=None):
        self.name, self.fio_args, self.stop, self.backend = name, fio_args, stop, backend


def start(cmd, **kw):
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def stop_proc(p):
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()


def scrape(port):
    import urllib.request
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    vals = {}
    for line in body.splitlines():
        if line.startswith("lsvd_") and " " in line:
            k, v = line.rsplit(" ", 1)
            vals[k.split("{")[0]] = vals.get(k.split("{")[0], 0) + float(v)
    return vals


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--s3", action="store_true", help="also lsvd on versitygw (needs scripts/with-versitygw.sh env)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dir", default=None, help="scratch directory on the disk to test (default: under /var/tmp)")
    a = ap.parse_args()
    runtime = 3 if a.quick else 15
    size = "256M" if a.quick else "1G"
    vol_size = "2G" if a.quick else "4G"
    scratch = tempfile.mkdtemp(prefix="lsvd-bench-", dir=a.dir or "/var/tmp")
    os.makedirs(a.out, exist_ok=True)
    results = {}
    procs = []
    try:
        targets = []
        raw = os.path.join(scratch, "raw.img")
        subprocess.run(["fallocate", "-l", vol_size, raw], check=True)
        targets.append(Target("raw file (direct)", ["--ioengine=libaio", "--direct=1", f"--filename={raw}"]))
        sock = os.path.join(scratch, "nbdkit.sock")
        procs.append(start(["nbdkit", "-f", "-U", sock, "memory", vol_size]))
        wait_for(sock)
        targets.append(Target("nbdkit memory", ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}"]))
        qraw = os.path.join(scratch, "qemu.img")
        subprocess.run(["fallocate", "-l", vol_size, qraw], check=True)
        qsock = os.path.join(scratch, "qemu.sock")
        procs.append(start(["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-k", qsock, "-t", "-e", "4", qraw]))
        wait_for(qsock)
        targets.append(Target("qemu-nbd raw", ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={qsock}"]))
        data = os.path.join(scratch, "lsvd-data")
        subprocess.run([a.lsvd, "--data", data, "create", "bench", "--size", vol_size], check=True, capture_output=True)
        lsock = os.path.join(scratch, "lsvd.sock")
        port = free_port()
        lp = start([a.lsvd, "--data", data, "serve", "bench", "--socket", lsock, "--log-size", "2G",
                    "--read-cache-size", "1G", "--metrics", f"127.0.0.1:{port}"])
        procs.append(lp)
        wait_for(lsock)
        targets.append(Target("lsvd local store", ["--ioengine=nbd", f"--uri=nbd+unix:///bench?socket={lsock}"],
                              backend=port))
        for t in targets:
            print(f"== {t.name}", file=sys.stderr)
            precondition(t.fio_args, size)
            before = scrape(t.backend) if t.backend else None
            results[t.name] = {}
            for job, args in JOBS:
                r = fio(t.fio_args, args, runtime, size)
                if r is None:
                    print(f"   {job:24} n/a (not supported by this target)", file=sys.stderr)
                    continue
                results[t.name][job] = r
                w = r.get("write", r.get("read", {}))
                print(f"   {job:24} {w.get('iops', 0):10.0f} IOPS {w.get('mbps', 0):8.1f} MB/s p99 {w.get('p99_us', 0):8.0f} us",
                      file=sys.stderr)
            if before is not None:
                after = scrape(t.backend)
                cw = after.get("lsvd_client_write_bytes_total", 0) - before.get("lsvd_client_write_bytes_total", 0)
                sw = after.get("lsvd_store_write_bytes_total", 0) - before.get("lsvd_store_write_bytes_total", 0)
                results[t.name]["backend"] = {
                    "store_puts": after.get("lsvd_store_puts_total", 0) - before.get("lsvd_store_puts_total", 0),
                    "store_gets": after.get("lsvd_store_gets_total", 0) - before.get("lsvd_store_gets_total", 0),
                    "store_bytes_per_client_byte": (sw / cw) if cw else 0,
                    "read_cache_hits": after.get("lsvd_read_cache_hits_total", 0) - before.get("lsvd_read_cache_hits_total", 0),
                    "read_cache_misses": after.get("lsvd_read_cache_misses_total", 0) - before.get("lsvd_read_cache_misses_total", 0),
                }
    finally:
        for p in procs:
            stop_proc(p)
        shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    table = render(results)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(table)
    with open(os.path.join(a.out, "chart.svg"), "w") as f:
        f.write(chart(results))
    print(table)


def headline(r):
    """IOPS of the job's main direction."""
    if "write" in r and "read" in r:
        return r["read"]["iops"] + r["write"]["iops"], r["read"]["mbps"] + r["write"]["mbps"], r["read"]["p50_us"], r["read"]["p99_us"]
    x = r.get("write") or r.get("read") or {}
    return x.get("iops", 0), x.get("mbps", 0), x.get("p50_us", 0), x.get("p99_us", 0)


def render(results):
    names = list(results)
    raw = names[0]
    ref = "lsvd local store" if "lsvd local store" in results else None
    lines = ["| job | target | IOPS | MB/s | p50 µs | p99 µs | vs raw file | vs lsvd |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for job, _ in JOBS:
        for n in names:
            r = results[n].get(job)
            if not r:
                continue
            iops, mbps, p50, p99 = headline(r)
            base = headline(results[raw][job])[0] if job in results[raw] else 0
            lref = headline(results[ref][job])[0] if ref and job in results[ref] else 0
            lines.append(f"| {job} | {n} | {iops:.0f} | {mbps:.1f} | {p50:.0f} | {p99:.0f} | "
                         f"{iops / base if base else 0:.2f}x | {iops / lref if lref else 0:.2f}x |")
    out = "\n".join(lines) + "\n"
    for n in names:
        b = results[n].get("backend")
        if b:
            out += (f"\n{n} backend: {b['store_puts']:.0f} PUTs, {b['store_gets']:.0f} GETs, "
                    f"{b['store_bytes_per_client_byte']:.2f} store bytes per client byte, read cache "
                    f"{b['read_cache_hits']:.0f} hits / {b['read_cache_misses']:.0f} misses\n")
    return out


def chart(results):
    names = list(results)
    jobs = [j for j, _ in JOBS]
    raw = names[0]
    w, h, left, top = 900, 60 + 40 * len(jobs) * len(names) // 2, 220, 30
    bar_h = 14
    rows = []
    y = top
    colors = ["#888", "#4a90d9", "#d9a44a", "#3cb371", "#c0392b", "#8e44ad"]
    maxratio = max((headline(results[n][j])[0] / max(headline(results[raw][j])[0], 1e-9))
                   for n in names for j in jobs if j in results[n] and j in results[raw]) or 1
    for j in jobs:
        rows.append(f'<text x="10" y="{y + 12}" font-size="13" font-weight="bold">{j}</text>')
        y += 18
        for i, n in enumerate(names):
            if j not in results[n]:
                continue
            ratio = headline(results[n][j])[0] / max(headline(results[raw][j])[0], 1e-9) if j in results[raw] else 0
            bw = (w - left - 80) * ratio / maxratio
            rows.append(f'<text x="20" y="{y + 11}" font-size="11">{n}</text>')
            rows.append(f'<rect x="{left}" y="{y}" width="{bw:.1f}" height="{bar_h}" fill="{colors[i % len(colors)]}"/>')
            rows.append(f'<text x="{left + bw + 4:.1f}" y="{y + 11}" font-size="11">{ratio:.2f}x</text>')
            y += bar_h + 3
        y += 8
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{y + 20}" font-family="sans-serif">'
            f'<text x="10" y="18" font-size="14">IOPS relative to fio on the raw file (same run)</text>'
            + "".join(rows) + "</svg>\n")


if __name__ == "__main__":
    main()
