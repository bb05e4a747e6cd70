#!/usr/bin/env python3
"""PostgreSQL pgbench on ext4 on each disk under test, in one invocation: TPS and p99.

An application next to fio's synthetic jobs: a database commits every transaction
with an fsync of its write-ahead log, so what it gets from a disk is mostly the
latency of small writes followed by a FLUSH, through a real filesystem's journal.

Every target becomes a block device the same way: its NBD export is a file through
nbdfuse (this kernel has no nbd module) and that file a loop device with direct I/O;
s3backer is a FUSE file already, so its file is the loop device's. On it: ext4, a new
PostgreSQL cluster (its defaults: fsync on, synchronous_commit on), `pgbench -i -s
SCALE`, a CHECKPOINT, the store caught up (lsvd's write log drained, s3backer's block
cache clean), then `pgbench -T SECONDS` with a per-transaction log, from which the
latency percentiles are computed. Ratios are taken against qemu-nbd on a raw file in
the same round; rounds rotate the order of the targets. Run it through
bench/pgbench.sh (installs PostgreSQL, starts versitygw, cleans up after a failure);
see bench/README.md ("pgbench").
"""
import argparse, glob, json, math, os, re, shutil, signal, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the fio benchmark: how its targets are started)

# target key -> what the tables call it
TARGETS = {
    "qemu": "qemu-nbd raw",
    "lsvd": "lsvd local store",
    "lsvd-s3": "lsvd on versitygw",
    "s3backer": "s3backer on versitygw",
}
REFERENCE = "qemu"
PG_USER = "postgres"


def log(msg):
    print(f"pgbench: {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout=600, both=False, **kw):
    """Run cmd to completion; its standard output (and error, with both) is returned,
    and shown if it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr if both else p.stdout


def as_pg(cmd):
    """cmd as the PostgreSQL user (the server refuses to run as root)."""
    return ["runuser", "-u", PG_USER, "--"] + cmd


def pg_bindir():
    """The newest /usr/lib/postgresql/N/bin with a server and pgbench (Debian's layout)."""
    found = [d for d in glob.glob("/usr/lib/postgresql/*/bin")
             if os.path.exists(os.path.join(d, "postgres")) and os.path.exists(os.path.join(d, "pgbench"))]
    if not found:
        sys.exit("pgbench: no PostgreSQL server in /usr/lib/postgresql/*/bin: scripts/install-bench-deps.sh installs it")
    return max(found, key=lambda d: int(re.sub(r"\D", "", d.split("/")[-2]) or 0))


class Cleanup:
    """Undo steps, run last-in first-out; a failing step is reported and the rest still run."""

    def __init__(self):
        self.steps = []

    def push(self, what, fn):
        self.steps.append((what, fn))

    def run(self):
        while self.steps:
            what, fn = self.steps.pop()
            try:
                fn()
            except Exception as e:  # keep undoing the rest
                log(f"cleanup: {what}: {e}")


def umount(path):
    """Unmount path, retrying while it is busy; lazily as the last resort."""
    for _ in range(20):
        if not bench.mounted(path):
            return
        if subprocess.run(["umount", path], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["umount", "-l", path], capture_output=True)


def fuse_unmount(path, proc=None):
    """Unmount a FUSE mount and wait for its daemon (proc) to exit."""
    if bench.mounted(path):
        tool = "fusermount3" if shutil.which("fusermount3") else "fusermount"
        if subprocess.run([tool, "-u", path], capture_output=True).returncode != 0:
            umount(path)
    if proc is not None:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop(proc, timeout=300):
    """SIGINT (lsvd drains and stops cleanly), then SIGKILL after timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_pid(path, pid):
    with open(path, "w") as f:
        f.write(f"{pid}\n")


def settle(what, settled, timeout=600):
    """Wait until the store behind a target has caught up; returns the seconds waited."""
    t0 = time.time()
    while not settled():
        if time.time() - t0 > timeout:
            log(f"{what}: the store did not catch up within {timeout} s")
            break
        time.sleep(0.5)
    return time.time() - t0


def nbd_multi_conn(uri):
    """Whether the server advertises multi-conn (nbdfuse then opens 4 connections)."""
    try:
        return json.loads(run(["nbdinfo", "--json", uri], timeout=30))["exports"][0].get("can_multi_conn", False)
    except Exception:
        return None


def start_server(key, d, a, rnd, cl):
    """Start target key's server in directory d. Returns (NBD URI or None, the file to
    put a loop device on or None, settled() or None)."""
    kw = {"start_new_session": True}  # a Ctrl-C reaches this driver only; it stops them in order
    slog = os.path.join(d, "server.log")
    if key == "qemu":
        sock = os.path.join(d, "nbd.sock")
        p = bench.start_qemu_nbd(os.path.join(d, "raw.img"), sock, a.vol_size, log=slog, **kw)
        uri = f"nbd+unix:///?socket={sock}"
        settled = None
    elif key in ("lsvd", "lsvd-s3"):
        sock = os.path.join(d, "nbd.sock")
        port = bench.free_port()
        store = f"s3://{bench.s3_env()[3]}/pgbench-lsvd-r{rnd}" if key == "lsvd-s3" else None
        p = bench.start_lsvd(a.lsvd, os.path.join(d, "data"), store, sock, port, a.vol_size,
                             extra=a.serve_arg, log=slog, **kw)
        uri = f"nbd+unix:///bench?socket={sock}"
        settled = lambda port=port: bench.lsvd_settled(port)  # noqa: E731
    else:  # s3backer
        mnt = os.path.join(d, "s3backer")
        p, _ = bench.start_s3backer(os.path.join(d, "s3backer-passwd"), mnt, f"pgbench-s3backer-r{rnd}/",
                                    a.vol_size, log=slog, **kw)
        write_pid(os.path.join(d, "server.pid"), p.pid)
        cl.push("stop s3backer", lambda: stop(p))
        cl.push("unmount s3backer", lambda: fuse_unmount(mnt, p))
        stats = os.path.join(mnt, "stats")
        return None, os.path.join(mnt, "file"), lambda: bench.s3backer_settled(stats)
    write_pid(os.path.join(d, "server.pid"), p.pid)
    cl.push(f"stop {TARGETS[key]}", lambda: stop(p))
    return uri, None, settled


def attach(uri, d, a, cl):
    """The NBD export at uri as a file, through nbdfuse. Returns the file's path."""
    mnt = os.path.join(d, "nbdfuse")
    os.makedirs(mnt)
    pidfile = os.path.join(d, "nbdfuse.pid")
    cmd = ["nbdfuse", "-P", pidfile]
    if a.connections:
        cmd += ["-C", str(a.connections)]
    p = bench.start(cmd + [os.path.join(mnt, "disk"), uri], os.path.join(d, "nbdfuse.log"), start_new_session=True)
    cl.push("unmount nbdfuse", lambda: fuse_unmount(mnt, p))
    t0 = time.time()
    while not (os.path.exists(pidfile) and bench.mounted(mnt)):
        if p.poll() is not None:
            raise RuntimeError(f"nbdfuse exited {p.returncode}; see {d}/nbdfuse.log")
        if time.time() - t0 > 60:
            raise RuntimeError("nbdfuse did not mount within 60 s")
        time.sleep(0.05)
    return os.path.join(mnt, "disk")


def loop_device(path, cl):
    """A loop device on path with direct I/O (no second page cache under ext4's).
    Returns (device, whether direct I/O is on)."""
    dev = run(["losetup", "-f", "--show", "--direct-io=on", path], timeout=60).strip()
    cl.push(f"detach {dev}", lambda: run(["losetup", "-d", dev], timeout=60))
    try:
        with open(f"/sys/block/{os.path.basename(dev)}/loop/dio") as f:
            dio = f.read().strip() == "1"
    except OSError:
        dio = None
    return dev, dio


def postgres(d, bindir, cl):
    """A new cluster on the ext4 at d/fs, started; returns the pgbench/psql connection args."""
    pgdata = os.path.join(d, "fs", "pgdata")
    sockdir = os.path.join(d, "pgsock")
    for p in (pgdata, sockdir):
        os.makedirs(p)
        shutil.chown(p, PG_USER, PG_USER)
    run(as_pg([os.path.join(bindir, "initdb"), "-D", pgdata, "-A", "trust", "-U", PG_USER, "-E", "UTF8",
               "--no-locale", "--no-instructions"]), timeout=300)
    with open(os.path.join(pgdata, "postgresql.conf"), "a") as f:
        # Unix socket only, outside the disk under test; every durability setting at its default.
        f.write(f"\n# bench/pgbench.py\nlisten_addresses = ''\nunix_socket_directories = '{sockdir}'\n"
                "port = 5432\nlog_checkpoints = on\n")
    pglog = os.path.join(sockdir, "postgres.log")
    run(as_pg([os.path.join(bindir, "pg_ctl"), "-D", pgdata, "-l", pglog, "-w", "-t", "120", "start"]), timeout=180)

    def pg_stop():
        r = subprocess.run(as_pg([os.path.join(bindir, "pg_ctl"), "-D", pgdata, "-m", "fast", "-w", "-t", "120",
                                  "stop"]), capture_output=True, timeout=180)
        if r.returncode != 0 and os.path.exists(os.path.join(pgdata, "postmaster.pid")):
            run(as_pg([os.path.join(bindir, "pg_ctl"), "-D", pgdata, "-m", "immediate", "-w", "stop"]), timeout=180)
    cl.push("stop PostgreSQL", pg_stop)
    return ["-h", sockdir, "-p", "5432", "-U", PG_USER], sockdir


def latencies_us(prefix):
    """Transaction latencies (µs) from pgbench's per-transaction logs (-l): the third
    field of each line of PREFIX.PID[.THREAD]."""
    out = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    out.append(int(parts[2]))
    return sorted(out)


def percentile(sorted_vals, q):
    """Nearest-rank percentile q (0-100] of sorted values."""
    if not sorted_vals:
        return 0.0
    return float(sorted_vals[max(0, math.ceil(q / 100 * len(sorted_vals)) - 1)])


def run_target(key, rnd, a, bindir, scratch):
    """Set up target key, load and run pgbench, tear everything down; returns the figures."""
    d = os.path.join(scratch, f"{key}-r{rnd}")
    os.makedirs(d)
    cl = Cleanup()
    res = {}
    try:
        t0 = time.time()
        uri, path, settled = start_server(key, d, a, rnd, cl)
        if uri is not None:
            res["nbd_multi_conn"] = nbd_multi_conn(uri)
            path = attach(uri, d, a, cl)
        dev, res["loop_direct_io"] = loop_device(path, cl)
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev], timeout=600)
        fs = os.path.join(d, "fs")
        os.makedirs(fs)
        run(["mount", "-o", "noatime", dev, fs], timeout=120)
        cl.push(f"unmount {fs}", lambda: umount(fs))
        os.chmod(d, 0o755)
        conn, sockdir = postgres(d, bindir, cl)
        res["setup_s"] = time.time() - t0
        t0 = time.time()
        run(as_pg([os.path.join(bindir, "createdb")] + conn + ["bench"]), timeout=120)
        run(as_pg([os.path.join(bindir, "pgbench")] + conn + ["-i", "-q", "-s", str(a.scale), "bench"]),
            timeout=3600, cwd=sockdir)
        run(as_pg([os.path.join(bindir, "psql")] + conn + ["-q", "-c", "CHECKPOINT", "bench"]), timeout=600)
        res["init_s"] = time.time() - t0
        if settled is not None:
            res["catch_up_s"] = settle(TARGETS[key], settled)
        log(f"{TARGETS[key]}: round {rnd}: loaded scale {a.scale} in {res['init_s']:.1f} s; "
            f"running {a.seconds} s, {a.clients} clients")
        prefix = os.path.join(sockdir, "tx")
        res["loadavg_1m_before"] = loadavg()
        out = run(as_pg([os.path.join(bindir, "pgbench")] + conn + [
            "-c", str(a.clients), "-j", str(a.threads), "-T", str(a.seconds), "-P", "5",
            "-l", f"--log-prefix={prefix}", "bench"]), timeout=a.seconds + 600, both=True, cwd=sockdir)
        m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
        if not m:
            raise RuntimeError(f"no tps in pgbench's output:\n{out}")
        res["tps"] = float(m.group(1))
        m = re.search(r"number of failed transactions: (\d+)", out)
        res["failed"] = int(m.group(1)) if m else 0
        lat = latencies_us(prefix)
        res["transactions"] = len(lat)
        res["lat_avg_ms"] = statistics.fmean(lat) / 1000 if lat else 0.0
        for q in (50, 99):
            res[f"p{q}_ms"] = percentile(lat, q) / 1000
        res["max_ms"] = (lat[-1] / 1000) if lat else 0.0
        progress = [float(x) for x in re.findall(r"progress: [0-9.]+ s, ([0-9.]+) tps", out)]
        res["min_5s_tps"] = min(progress) if progress else None
        res["loadavg_1m_after"] = loadavg()
        log(f"{TARGETS[key]}: round {rnd}: {res['tps']:.1f} TPS, p99 {res['p99_ms']:.1f} ms")
        return res
    except BaseException:
        show_logs(d)
        raise
    finally:
        cl.run()
        # The disks (a raw file, lsvd's write log and read cache, its store) take GBs
        # per target: remove them before the next, unless something is still mounted.
        if not any(m == d or m.startswith(d + "/") for m in mount_points()):
            shutil.rmtree(d, ignore_errors=True)


def mount_points():
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f]


def show_logs(d, lines=15):
    """The last lines of a failed target's logs (the scratch directory goes away)."""
    for name in ("server.log", "nbdfuse.log", os.path.join("pgsock", "postgres.log")):
        path = os.path.join(d, name)
        try:
            with open(path, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            continue
        if tail:
            log(f"last lines of {path}:\n" + "".join(tail).rstrip())


def loadavg():
    """The 1-minute load average: how busy the (shared) machine was around a run."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(rounds, keys):
    """Per target: medians over rounds, and the median over rounds of each round's ratio
    to the reference (same round, so the machine's load drifts less between them)."""
    out = {}
    for k in keys:
        rs = [r[k] for r in rounds if k in r]
        if not rs:
            continue
        s = {f: median([r.get(f) for r in rs]) for f in ("tps", "p50_ms", "p99_ms", "max_ms", "lat_avg_ms",
                                                          "min_5s_tps", "init_s")}
        refs = [(r[k], r[REFERENCE]) for r in rounds if k in r and REFERENCE in r]
        s["tps_vs_ref"] = median([x["tps"] / y["tps"] for x, y in refs if y["tps"]])
        s["p99_vs_ref"] = median([x["p99_ms"] / y["p99_ms"] for x, y in refs if y["p99_ms"]])
        s["rounds"] = len(rs)
        out[k] = s
    return out


def render(a, rounds, summary, meta):
    f = lambda v, fmt="{:.1f}": "n/a" if v is None else fmt.format(v)  # noqa: E731
    lines = [
        f"pgbench (TPC-B-like), scale {a.scale}, {a.clients} clients, {a.threads} threads, {a.seconds} s per run, "
        f"{len(rounds)} round(s); ext4 on a loop device (direct I/O) over nbdfuse (s3backer: over its own FUSE "
        f"file); PostgreSQL {meta['postgres']} with its defaults (fsync, synchronous_commit on). Medians over "
        f"rounds; ratios are the median of each round's ratio to {TARGETS[REFERENCE]} in the same round.",
        "",
        "| target | TPS | p50 ms | p99 ms | max ms | lowest 5 s TPS | TPS vs qemu-nbd | p99 vs qemu-nbd | load s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, s in summary.items():
        lines.append(f"| {TARGETS[k]} | {f(s['tps'])} | {f(s['p50_ms'], '{:.2f}')} | {f(s['p99_ms'], '{:.2f}')} | "
                     f"{f(s['max_ms'])} | {f(s['min_5s_tps'])} | {f(s['tps_vs_ref'], '{:.2f}x')} | "
                     f"{f(s['p99_vs_ref'], '{:.2f}x')} | {f(s['init_s'])} |")
    if len(rounds) > 1:
        lines += ["", "Each round (targets in rotated order):", "",
                  "| round | target | TPS | p99 ms | transactions | failed | load average after |",
                  "|---:|---|---:|---:|---:|---:|---:|"]
        for i, r in enumerate(rounds, 1):
            for k, x in r.items():
                lines.append(f"| {i} | {TARGETS[k]} | {x['tps']:.1f} | {x['p99_ms']:.2f} | {x['transactions']} | "
                             f"{x['failed']} | {f(x.get('loadavg_1m_after'))} |")
    goals = []
    ref = summary.get(REFERENCE)
    for k in ("lsvd", "lsvd-s3"):
        s = summary.get(k)
        if s and ref and s["tps_vs_ref"] is not None:
            goals.append(f"| pgbench TPS on ext4, {TARGETS[k]} >= qemu-nbd on a raw file | {s['tps_vs_ref']:.2f}x | "
                         f"{'met' if s['tps_vs_ref'] >= 1.0 else 'NOT met'} |")
    s = summary.get("s3backer")
    if s and ref and s["tps_vs_ref"] is not None:
        goals.append(f"| s3backer on versitygw, for comparison (its fsync is not durable) | {s['tps_vs_ref']:.2f}x | |")
    if goals:
        lines += ["", "Goal (issue 17), from this run alone:", "", "| goal | this run | |", "|---|---:|---|"] + goals
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lsvd", required=True, help="the lsvd binary (release build)")
    ap.add_argument("--scratch", required=True, help="an empty directory on the disk to test (bench/pgbench.sh makes it)")
    ap.add_argument("--s3", action="store_true", help="also lsvd and s3backer on versitygw (scripts/with-versitygw.sh)")
    ap.add_argument("--targets", default=None,
                    help=f"comma-separated subset of {','.join(TARGETS)} (default: all; qemu is the reference)")
    ap.add_argument("--quick", action="store_true", help="20 s runs (default 60 s)")
    ap.add_argument("--seconds", type=int, default=None, help="seconds per pgbench run (overrides --quick)")
    ap.add_argument("--scale", type=int, default=10, help="pgbench scale factor (default 10: 1M accounts, ~160 MB)")
    ap.add_argument("--clients", type=int, default=8, help="pgbench clients (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="pgbench threads (default 2)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of all targets; medians are reported (default 1)")
    ap.add_argument("--vol-size", default="4G", help="size of each disk (default 4G)")
    ap.add_argument("--connections", type=int, default=None,
                    help="nbdfuse --connections (default: nbdfuse's: 4 if the server advertises multi-conn, else 1)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `lsvd serve` argument (repeatable)")
    ap.add_argument("--out", default="bench/results", help="writes pgbench.md and pgbench.json here")
    a = ap.parse_args()
    a.seconds = a.seconds or (20 if a.quick else 60)
    if os.geteuid() != 0:
        sys.exit("pgbench: needs root (losetup, mount; PostgreSQL runs as the postgres user)")
    keys = list(TARGETS) if a.targets is None else [k.strip() for k in a.targets.split(",") if k.strip()]
    bad = [k for k in keys if k not in TARGETS]
    if bad:
        sys.exit(f"pgbench: unknown target(s) {', '.join(bad)}; choose from {', '.join(TARGETS)}")
    if not a.s3:
        keys = [k for k in keys if k not in ("lsvd-s3", "s3backer")]
    if a.s3:
        bench.s3_env()  # fails early with a clear message outside with-versitygw.sh
    bindir = pg_bindir()
    pg_version = run([os.path.join(bindir, "postgres"), "--version"]).strip().split(" ", 2)[-1]
    scratch = os.path.abspath(a.scratch)
    write_pid(os.path.join(scratch, "driver.pid"), os.getpid())

    def on_signal(signum, _frame):
        # Once: the cleanup that follows must not be interrupted by a second signal.
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)

    need = 2 * bench_size_bytes(a.vol_size) + (4 << 30)
    free = shutil.disk_usage(scratch).free
    if free < need:
        sys.exit(f"pgbench: {free / 2**30:.1f} GiB free under {scratch}; one target needs up to "
                 f"{need / 2**30:.1f} GiB (a {a.vol_size} disk, lsvd's 2 GiB log and 1 GiB read cache, its store)")
    meta = {"postgres": pg_version, "scale": a.scale, "clients": a.clients, "threads": a.threads,
            "seconds": a.seconds, "vol_size": a.vol_size, "connections": a.connections, "serve_args": a.serve_arg}
    rounds = []
    for rnd in range(1, a.rounds + 1):
        order = keys[(rnd - 1) % len(keys):] + keys[:(rnd - 1) % len(keys)]
        results = {}
        for k in order:
            results[k] = run_target(k, rnd, a, bindir, scratch)
        rounds.append(results)
        # After every round, so a failure later still leaves the rounds done.
        table = write_results(a, rounds, keys, meta)
    print(table)


def bench_size_bytes(size):
    """'4G' -> bytes (K, M, G, T suffixes, powers of 1024)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", size.strip(), re.IGNORECASE)
    if not m:
        sys.exit(f"pgbench: bad size {size!r} (e.g. 4G)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def write_results(a, rounds, keys, meta):
    summary = summarize(rounds, keys)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "pgbench.json"), "w") as f:
        json.dump({"meta": meta, "rounds": rounds, "summary": summary}, f, indent=2)
    table = render(a, rounds, summary, meta)
    with open(os.path.join(a.out, "pgbench.md"), "w") as f:
        f.write(table)
    return table


if __name__ == "__main__":
    main()
