#!/usr/bin/env python3
"""GC pacing: client write latency with GC off and with GC collecting all the time.

One run, one volume: fill it and overwrite it once with random 4 KiB writes (GC off, so
about half the store is garbage), then measure 4 KiB random writes at QD1 and a fixed
rate (fio, nbd engine over a Unix socket) on a release `lsvd serve`, alternating

  off  GC disabled (--gc-start 0);
  on   --gc-start just above the volume's utilization (GC starts at once, with the
       store barely over its bound) and --gc-stop 0.99 (GC never finishes during the
       case: it collects the whole time),

for a number of rounds. Reports p50/p90/p99/p99.9 completion latency of each and the
ratio on/off (goal: p99 at most 2x), with what GC did meanwhile (passes, MB moved,
seconds with a pass in flight, client batches held back), scraped from the metrics
endpoint. See bench/README.md, "GC pacing".
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, threading, time

from bench import free_port, scrape  # bench/bench.py, next to this script


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Server:
    n = 0
    extra = []  # --serve-arg: for every lsvd serve of the run

    def __init__(self, lsvd, data, sock, port, extra):
        self.port = port
        self.sock = sock
        if os.path.exists(sock):
            os.unlink(sock)
        cmd = [lsvd, "--data", data, "serve", "bench", "--socket", sock, "--metrics", f"127.0.0.1:{port}",
               "--read-cache-size", "64M"] + Server.extra + extra
        Server.n += 1
        self.log = os.path.join(os.path.dirname(data), f"serve-{Server.n}.log")
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        t = time.time()
        while not os.path.exists(sock):
            if self.proc.poll() is not None:
                raise RuntimeError(f"lsvd serve exited: {self.tail()}")
            if time.time() - t > 120:
                raise RuntimeError("lsvd serve did not start")
            time.sleep(0.05)
        self.uri = f"nbd+unix:///bench?socket={sock}"

    def tail(self):
        with open(self.log) as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        """SIGINT: drain, upload everything, clean checkpoint."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=1800)
        if self.proc.returncode != 0:
            raise RuntimeError(f"lsvd serve exited with {self.proc.returncode}: {self.tail()}")


def fio(uri, args):
    # json+ adds the full completion-latency histogram (clat_ns.bins), which the
    # summary merges over rounds.
    cmd = ["fio", "--name=job", "--output-format=json+", "--ioengine=nbd", f"--uri={uri}",
           "--randrepeat=0", "--norandommap", "--group_reporting"] + args
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]


def utilization(lsvd, data):
    info = json.loads(subprocess.run([lsvd, "--data", data, "info", "bench", "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    return info["utilization"]


def measure(server, a):
    """The measured job, with the metrics sampled every second while it runs."""
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                samples.append(scrape(server.port))
            except OSError:
                pass
            stop.wait(1.0)

    before = scrape(server.port)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    j = fio(server.uri, ["--rw=randwrite", "--bs=4k", "--iodepth=1", f"--rate_iops={a.rate}",
                         "--time_based", f"--runtime={a.runtime}", f"--size={a.size}",
                         "--percentile_list=50:90:99:99.9:99.99"])
    stop.set()
    th.join()
    after = scrape(server.port)
    w = j["write"]
    pct = w["clat_ns"]["percentile"]
    d = lambda k: after.get(k, 0) - before.get(k, 0)
    return {
        "iops": w["iops"],
        "writes": w["total_ios"],
        "p50_us": pct["50.000000"] / 1000,
        "p90_us": pct["90.000000"] / 1000,
        "p99_us": pct["99.000000"] / 1000,
        "p99.9_us": pct["99.900000"] / 1000,
        "p99.99_us": pct["99.990000"] / 1000,
        "max_us": w["clat_ns"]["max"] / 1000,
        "clat_bins": w["clat_ns"].get("bins", {}),
        "mean_us": w["clat_ns"]["mean"] / 1000,
        "gc_passes": d("lsvd_gc_passes_total"),
        "gc_moved_mb": d("lsvd_gc_moved_bytes_total") / 1e6,
        "store_written_mb": d("lsvd_store_write_bytes_total") / 1e6,
        "client_written_mb": d("lsvd_client_write_bytes_total") / 1e6,
        "utilization_start": before.get("lsvd_utilization", 0),
        "utilization_end": after.get("lsvd_utilization", 0),
        "max_uploads_held": max((s.get("lsvd_uploads_held", 0) for s in samples), default=0),
        "seconds_with_uploads_held": sum(1 for s in samples if s.get("lsvd_uploads_held", 0) > 0),
        "seconds_gc_active": sum(1 for x in samples if x.get("lsvd_gc_pass_in_flight", 0) > 0),
        "samples": len(samples),
    }


def render(res, a, date):
    rows = [
        f"GC pacing, {date}: {a.size} volume filled, then overwritten once with random 4 KiB writes (GC off); "
        f"then fio 4 KiB randwrite QD1 at {a.rate} IOPS for {a.runtime} s per case, GC off and GC on alternating "
        f"({a.rounds} rounds), nbd over a Unix socket, release `lsvd serve`, local store, default batch (8 MiB), "
        f"GC pass (32 MiB) and GC rate ({res['gc_rate']}). GC on: --gc-start just above the volume's utilization "
        f"(GC starts at once, the store barely over its bound), --gc-stop 0.99 (GC collects through the whole case).",
        "",
        "| round | case | IOPS | p50 µs | p90 µs | p99 µs | p99.9 µs | p99.99 µs | max µs | GC passes | GC moved MB | utilization | GC pass in flight (s) | batches held (max / s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, rnd in enumerate(res["rounds"]):
        for name in ("off", "on"):
            r = rnd[name]
            label = "GC off" if name == "off" else f"GC on ({r['gc_args']})"
            rows.append(
                f"| {i + 1} | {label} | {r['iops']:.0f} | {r['p50_us']:.0f} | {r['p90_us']:.0f} | {r['p99_us']:.0f} | "
                f"{r['p99.9_us']:.0f} | {r['p99.99_us']:.0f} | {r['max_us']:.0f} | {r['gc_passes']:.0f} | "
                f"{r['gc_moved_mb']:.0f} | {r['utilization_start']:.3f} → {r['utilization_end']:.3f} | "
                f"{r['seconds_gc_active']} of {r['samples']} | {r['max_uploads_held']:.0f} / {r['seconds_with_uploads_held']} |")
    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    # Each round's GC-on case against the GC-off case just before it; the median over
    # rounds (the machine is shared: a round can be disturbed).
    ratio = lambda k: median([r["on"][k] / r["off"][k] for r in res["rounds"]])
    per_round = ", ".join(f"{r['on']['p99_us'] / r['off']['p99_us']:.2f}x" for r in res["rounds"])
    within = sum(1 for r in res["rounds"] if r["on"]["p99_us"] <= 2 * r["off"]["p99_us"])
    # All rounds' writes of a case pooled (fio's latency histograms merged): the p99
    # of every write made with GC on against every write made with it off.
    pooled = {c: percentile_of_bins([r[c]["clat_bins"] for r in res["rounds"]], (99, 99.9))
              for c in ("off", "on")}
    res["pooled_p99_us"] = {c: pooled[c][0] for c in pooled}
    moved = sum(r["on"]["gc_moved_mb"] for r in res["rounds"]) / (a.runtime * len(res["rounds"]))
    res["p99_ratio"] = ratio("p99_us")
    rows += [
        "",
        f"GC on / GC off, median over rounds: p99 **{ratio('p99_us'):.2f}x** (goal ≤ 2x; per round {per_round}; "
        f"{within} of {len(res['rounds'])} rounds within 2x), "
        f"p50 {ratio('p50_us'):.2f}x, p90 {ratio('p90_us'):.2f}x, p99.9 {ratio('p99.9_us'):.2f}x. "
        f"All rounds pooled: p99 {pooled['off'][0]:.0f} µs off, {pooled['on'][0]:.0f} µs on "
        f"(**{pooled['on'][0] / pooled['off'][0]:.2f}x**), p99.9 {pooled['off'][1]:.0f} µs off, "
        f"{pooled['on'][1]:.0f} µs on ({pooled['on'][1] / pooled['off'][1]:.2f}x). "
        f"GC relocated {moved:.1f} MB/s on average while on.",
    ]
    return "\n".join(rows) + "\n"


def percentile_of_bins(bin_sets, pcts):
    """Percentiles (µs) of fio latency histograms ({"ns": count}) merged."""
    merged = {}
    for bins in bin_sets:
        for ns, n in bins.items():
            merged[int(ns)] = merged.get(int(ns), 0) + n
    total = sum(merged.values())
    out = []
    for pct in pcts:
        rank, seen = total * pct / 100, 0
        for ns in sorted(merged):
            seen += merged[ns]
            if seen >= rank:
                out.append(ns / 1000)
                break
        else:
            out.append(0.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--size", default="1G", help="volume size")
    ap.add_argument("--rate", type=int, default=1000, help="client writes per second")
    ap.add_argument("--runtime", type=int, default=40, help="seconds per case")
    ap.add_argument("--rounds", type=int, default=5, help="GC off / GC on pairs, alternating")
    ap.add_argument("--gc-rate", default="16M", help="lsvd serve --gc-rate (0: unpaced GC)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dir", default=None, help="scratch directory (default: under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (server logs)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for every lsvd serve (repeat: --serve-arg=--uploads --serve-arg=1)")
    a = ap.parse_args()
    Server.extra = a.serve_arg
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="lsvd-gcpace-", dir=a.dir or "/var/tmp")
    data = os.path.join(scratch, "data")
    sock = os.path.join(scratch, "lsvd.sock")
    port = free_port()
    res = {"gc_rate": f"--gc-rate {a.gc_rate}"}
    server = None
    try:
        subprocess.run([a.lsvd, "--data", data, "create", "bench", "--size", a.size], check=True, capture_output=True)
        log(f"== fill {a.size} and overwrite it once with random 4 KiB writes (GC off)")
        server = Server(a.lsvd, data, sock, port, ["--gc-start", "0"])
        fio(server.uri, ["--rw=write", "--bs=1m", "--iodepth=8", f"--size={a.size}"])
        fio(server.uri, ["--rw=randwrite", "--bs=4k", "--iodepth=32", f"--size={a.size}", f"--io_size={a.size}"])
        server.stop()
        log(f"   utilization {utilization(a.lsvd, data):.3f}")

        res["rounds"] = []
        for i in range(a.rounds):
            rnd = {}
            log(f"== round {i + 1}: GC off, randwrite 4k QD1 {a.rate} IOPS for {a.runtime} s")
            server = Server(a.lsvd, data, sock, port, ["--gc-start", "0", "--gc-rate", a.gc_rate])
            rnd["off"] = measure(server, a)
            rnd["off"]["gc_args"] = "--gc-start 0"
            server.stop()
            log(f"   p50 {rnd['off']['p50_us']:.0f} us p99 {rnd['off']['p99_us']:.0f} us p99.9 {rnd['off']['p99.9_us']:.0f} us")
            # Start GC at once, with the store only just over its bound (so client
            # uploads are not held back for long while GC catches up), and never reach
            # the stop threshold during the case: it collects the whole time.
            util = utilization(a.lsvd, data)
            gc_args = ["--gc-start", f"{util + 0.002:.4f}", "--gc-stop", "0.99", "--gc-rate", a.gc_rate]
            log(f"== round {i + 1}: GC on ({' '.join(gc_args)}), randwrite 4k QD1 {a.rate} IOPS for {a.runtime} s")
            server = Server(a.lsvd, data, sock, port, gc_args)
            rnd["on"] = measure(server, a)
            rnd["on"]["gc_args"] = " ".join(gc_args[:4])
            server.stop()
            server = None
            log(f"   p50 {rnd['on']['p50_us']:.0f} us p99 {rnd['on']['p99_us']:.0f} us p99.9 {rnd['on']['p99.9_us']:.0f} us; "
                f"GC {rnd['on']['gc_passes']:.0f} passes, {rnd['on']['gc_moved_mb']:.0f} MB moved")
            res["rounds"].append(rnd)
    finally:
        if server is not None and server.proc.poll() is None:
            server.proc.kill()
        if a.keep:
            log(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    date = time.strftime("%Y-%m-%d")
    res["date"] = date
    res["params"] = {"size": a.size, "rate_iops": a.rate, "runtime_s": a.runtime, "rounds": a.rounds}
    table = render(res, a, date)
    with open(os.path.join(a.out, "gc_pacing.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(a.out, "gc_pacing.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
