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
    # The same queue depth as randwrite-4k-qd32 over four NBD connections (fio's nbd
    # engine opens one per job): does the server scale past one connection?
    ("randwrite-4k-4conn-qd8", ["--rw=randwrite", "--bs=4k", "--iodepth=8", "--numjobs=4"]),
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
            "io_bytes": x["io_bytes"],
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
    """fio arguments for one target; `backend` returns cumulative store counters
    (puts, gets, store_write_bytes, client_write_bytes or None, read cache hits and
    misses or None) when the target has a store behind it, and `settled` says whether
    the store has caught up with every write (nothing left in a write log or a dirty
    cache)."""

    def __init__(self, name, fio_args, backend=None, settled=None):
        self.name, self.fio_args, self.backend, self.settled = name, fio_args, backend, settled

    def settle(self, timeout=600):
        """Wait until the store has caught up; returns the seconds it took."""
        t0 = time.time()
        while self.settled and not self.settled():
            if time.time() - t0 > timeout:
                print(f"   store did not catch up within {timeout} s", file=sys.stderr)
                break
            time.sleep(0.5)
        return time.time() - t0


def start(cmd, log=None, **kw):
    """Start cmd in the background; its stderr goes to the file log, or to a pipe (read
    if it exits early) when there is none."""
    if log is None:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, **kw)


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


def lsvd_counters(port):
    v = scrape(port)
    return {
        "puts": v.get("lsvd_store_puts_total", 0),
        "gets": v.get("lsvd_store_gets_total", 0),
        "store_write_bytes": v.get("lsvd_store_write_bytes_total", 0),
        "client_write_bytes": v.get("lsvd_client_write_bytes_total", 0),
        "read_cache_hits": v.get("lsvd_read_cache_hits_total", 0),
        "read_cache_misses": v.get("lsvd_read_cache_misses_total", 0),
        "log_write_bytes": v.get("lsvd_log_write_bytes_total", 0),
    }


def lsvd_settled(port):
    v = scrape(port)
    return v.get("lsvd_log_used_bytes", 1) == 0 and v.get("lsvd_uploads_pending", 1) == 0


def s3backer_settled(path):
    return s3backer_stats(path).get("block_cache_dirty_ratio", 1) == 0


def s3backer_stats(path):
    """The `stats` file of an s3backer mount: {name: number}."""
    vals = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                try:
                    vals[parts[0]] = float(parts[1])
                except ValueError:
                    pass
    return vals


def s3backer_counters(path, block_size):
    v = s3backer_stats(path)
    return {
        # Blocks of zeros are DELETEd, not PUT (http_deletes, not counted here).
        "puts": v.get("http_puts", 0),
        "gets": v.get("http_gets", 0),
        "store_write_bytes": v.get("http_normal_blocks_written", 0) * block_size,
        "client_write_bytes": None,  # from fio
        "read_cache_hits": v.get("block_cache_read_hits"),
        "read_cache_misses": v.get("block_cache_read_misses"),
    }


def s3_env():
    """(endpoint, access key id, secret, bucket) from scripts/with-versitygw.sh."""
    names = ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "LSVD_TEST_S3_BUCKET"]
    vals = [os.environ.get(n, "") for n in names]
    missing = [n for n, v in zip(names, vals) if not v]
    if missing:
        sys.exit(f"bench: --s3 needs {', '.join(missing)}: run through scripts/with-versitygw.sh (bench/run.sh does)")
    return vals


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_or_kill(p, path, timeout=30):
    """Wait for the socket path of process p; kill p if it does not appear."""
    try:
        wait_for(path, timeout)
    except BaseException:
        p.kill()
        p.wait()
        raise


def start_qemu_nbd(image, sock, vol_size, log=None, **kw):
    """qemu-nbd on a new raw file of vol_size (no host page cache, native AIO, up to 4
    clients); returns once it listens on the Unix socket."""
    subprocess.run(["fallocate", "-l", vol_size, image], check=True)
    p = start(["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-k", sock, "-t", "-e", "4", image], log, **kw)
    wait_or_kill(p, sock)
    return p


def start_lsvd(lsvd, data, store, sock, port, vol_size, extra=(), log=None, **kw):
    """A new volume `bench` of vol_size in data (on store, if given), served on the Unix
    socket with a 2 GiB write log, a 1 GiB read cache and metrics on 127.0.0.1:port;
    returns once the socket exists."""
    st = ["--store", store] if store else []
    subprocess.run([lsvd, "--data", data] + st + ["create", "bench", "--size", vol_size],
                   check=True, capture_output=True)
    p = start([lsvd, "--data", data] + st + ["serve", "bench", "--socket", sock, "--log-size", "2G",
                                             "--read-cache-size", "1G", "--metrics", f"127.0.0.1:{port}"]
              + list(extra), log, **kw)
    wait_or_kill(p, sock, timeout=120)
    return p


def start_s3backer(cred, mnt, prefix, vol_size, block_size="4k", log=None, **kw):
    """s3backer on the versitygw of scripts/with-versitygw.sh: one FUSE file,
    mnt/file, one object per block under prefix. Returns (process, block size in
    bytes) once mnt is mounted.

    The store is strongly consistent, so s3backer's eventual-consistency guards (MD5
    cache, minimum delay between writes of a block) are off; they would cap writes at
    --md5CacheSize per --md5CacheTime. Block cache: 1 GiB in memory, like lsvd's read
    cache; write-back after 250 ms (its default)."""
    endpoint, key_id, secret, bucket = s3_env()
    bs = block_size
    bs_bytes = int(bs[:-1]) * {"k": 1 << 10, "m": 1 << 20}[bs[-1].lower()] if bs[-1].isalpha() else int(bs)
    os.makedirs(mnt)
    with open(os.open(cred, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(f"{key_id}:{secret}\n")
    p = start([
        "s3backer", "-f", f"--baseURL={endpoint.rstrip('/')}/", f"--accessFile={cred}",
        "--authVersion=aws4", f"--size={vol_size}", f"--blockSize={bs}", f"--prefix={prefix}",
        "--md5CacheSize=0", "--md5CacheTime=0", "--minWriteDelay=0",
        f"--blockCacheSize={(1 << 30) // bs_bytes}", "--blockCacheThreads=32",
        "--directIO", "--quiet", bucket, mnt], log, **kw)
    t0 = time.time()
    while not mounted(mnt):
        if p.poll() is not None:
            why = p.stderr.read().decode(errors="replace") if p.stderr else f"see {log}"
            raise RuntimeError(f"s3backer exited: {why}")
        if time.time() - t0 > 60:
            p.kill()
            raise RuntimeError("s3backer did not mount within 60 s")
        time.sleep(0.1)
    return p, bs_bytes


PROBED = "lsvd local store (probed)"


def serve_help(lsvd):
    return subprocess.run([lsvd, "serve", "--help"], capture_output=True, text=True).stdout


def default_settings_args(lsvd):
    """`lsvd serve` arguments that keep the built-in defaults even where a probe
    profile exists (--no-probe, if this lsvd has it)."""
    return ["--no-probe"] if "--no-probe" in serve_help(lsvd) else []


def start_lsvd_probed(lsvd, data, sock, port, vol_size, extra=()):
    """lsvd on the local store after `lsvd probe --quick` of its data directory (the
    profile is saved there, where `serve` looks for it), plus extra serve arguments
    (e.g. the settings the probe printed, for a serve that does not read profiles)."""
    os.makedirs(data)
    subprocess.run([lsvd, "--data", data, "probe", data, "--quick"], check=True, capture_output=True)
    if "--no-probe" not in serve_help(lsvd) and not extra:
        print(f"   note: this lsvd serve does not read the probe profile and no --probe-serve-arg was given: "
              f"'{PROBED}' runs the default settings (an A/A comparison)", file=sys.stderr)
    return start_lsvd(lsvd, data, None, sock, port, vol_size, extra=extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lsvd", required=True)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--s3", action="store_true",
                    help="also lsvd and s3backer on versitygw (needs the scripts/with-versitygw.sh environment)")
    ap.add_argument("--s3backer-block-size", default="4k", help="s3backer --blockSize (default 4k)")
    ap.add_argument("--probe", action="store_true",
                    help="also lsvd on the local store with the settings `lsvd probe` chose (see start_lsvd_probed)")
    ap.add_argument("--probe-serve-arg", action="append", default=[],
                    help="extra `lsvd serve` argument for the probed target only (repeatable)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dir", default=None, help="scratch directory on the disk to test (default: under /var/tmp)")
    a = ap.parse_args()
    runtime = 3 if a.quick else 15
    size = "256M" if a.quick else "1G"
    vol_size = "2G" if a.quick else "4G"
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="lsvd-bench-", dir=a.dir or "/var/tmp")
    os.makedirs(a.out, exist_ok=True)
    results = {}
    procs = []
    mounts = []
    try:
        targets = []
        raw = os.path.join(scratch, "raw.img")
        subprocess.run(["fallocate", "-l", vol_size, raw], check=True)
        targets.append(Target("raw file (direct)", ["--ioengine=libaio", "--direct=1", f"--filename={raw}"]))
        sock = os.path.join(scratch, "nbdkit.sock")
        procs.append(start(["nbdkit", "-f", "-U", sock, "memory", vol_size]))
        wait_for(sock)
        targets.append(Target("nbdkit memory", ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}"]))
        qsock = os.path.join(scratch, "qemu.sock")
        procs.append(start_qemu_nbd(os.path.join(scratch, "qemu.img"), qsock, vol_size))
        targets.append(Target("qemu-nbd raw", ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={qsock}"]))
        lsock = os.path.join(scratch, "lsvd.sock")
        port = free_port()
        procs.append(start_lsvd(a.lsvd, os.path.join(scratch, "lsvd-data"), None, lsock, port, vol_size,
                                extra=default_settings_args(a.lsvd) if a.probe else ()))
        targets.append(Target("lsvd local store", ["--ioengine=nbd", f"--uri=nbd+unix:///bench?socket={lsock}"],
                              backend=lambda port=port: lsvd_counters(port),
                              settled=lambda port=port: lsvd_settled(port)))
        if a.probe:
            psock = os.path.join(scratch, "lsvd-probed.sock")
            pport = free_port()
            procs.append(start_lsvd_probed(a.lsvd, os.path.join(scratch, "lsvd-probed-data"), psock, pport,
                                           vol_size, a.probe_serve_arg))
            targets.append(Target(PROBED, ["--ioengine=nbd", f"--uri=nbd+unix:///bench?socket={psock}"],
                                  backend=lambda port=pport: lsvd_counters(port),
                                  settled=lambda port=pport: lsvd_settled(port)))
        if a.s3:
            bucket = s3_env()[3]
            # lsvd with its volume in the versitygw bucket (write log and read cache local).
            ssock = os.path.join(scratch, "lsvd-s3.sock")
            sport = free_port()
            procs.append(start_lsvd(a.lsvd, os.path.join(scratch, "lsvd-s3-data"), f"s3://{bucket}/bench-lsvd",
                                    ssock, sport, vol_size))
            targets.append(Target("lsvd on versitygw", ["--ioengine=nbd", f"--uri=nbd+unix:///bench?socket={ssock}"],
                                  backend=lambda port=sport: lsvd_counters(port),
                                  settled=lambda port=sport: lsvd_settled(port)))
            mnt = os.path.join(scratch, "s3backer-mnt")
            sb, bs_bytes = start_s3backer(os.path.join(scratch, "s3backer-passwd"), mnt, "bench-s3backer/",
                                          vol_size, a.s3backer_block_size)
            procs.append(sb)
            mounts.append(mnt)
            targets.append(Target("s3backer on versitygw",
                                  ["--ioengine=libaio", "--direct=1", f"--filename={os.path.join(mnt, 'file')}"],
                                  backend=lambda m=mnt, b=bs_bytes: s3backer_counters(os.path.join(m, "stats"), b),
                                  settled=lambda m=mnt: s3backer_settled(os.path.join(m, "stats"))))
        for t in targets:
            print(f"== {t.name}", file=sys.stderr)
            t0 = time.time()
            precondition(t.fio_args, size)
            print(f"   precondition ({size}) {time.time() - t0:.1f} s", file=sys.stderr)
            if t.settled:
                print(f"   store caught up {t.settle():.1f} s later", file=sys.stderr)
            before = t.backend() if t.backend else None
            results[t.name] = {}
            catch_up = 0.0
            for i, (job, args) in enumerate(JOBS):
                if i > 0 and t.settled:
                    # Each job starts with the store caught up, so the backlog one job
                    # leaves (uploads, write-back) does not land on the next.
                    catch_up += t.settle()
                job_before = t.backend() if t.backend else None
                r = fio(t.fio_args, args, runtime, size)
                if r is not None and job_before is not None and "log_write_bytes" in job_before:
                    # The write log's bytes per client byte during this job alone.
                    job_after = t.backend()
                    cw = job_after["client_write_bytes"] - job_before["client_write_bytes"]
                    if cw:
                        r["log_bytes_per_client_byte"] = (
                            job_after["log_write_bytes"] - job_before["log_write_bytes"]) / cw
                if r is None:
                    print(f"   {job:24} n/a (not supported by this target)", file=sys.stderr)
                    continue
                results[t.name][job] = r
                # As in the table: read + write for a mixed job (the write side alone
                # read as a collapse mid-run).
                iops, mbps, _, p99 = headline(r)
                print(f"   {job:24} {iops:10.0f} IOPS {mbps:8.1f} MB/s p99 {p99:8.0f} us",
                      file=sys.stderr)
            if before is not None:
                # Count what reaches the store for these writes: wait until the write
                # log (lsvd) or the dirty block cache (s3backer) has drained.
                catch_up += t.settle()
                print(f"   waited {catch_up:.1f} s in all for the store to catch up after jobs", file=sys.stderr)
                after = t.backend()
                fio_written = sum(r.get("write", {}).get("io_bytes", 0)
                                  for j, r in results[t.name].items() if isinstance(r, dict))
                cw = (after["client_write_bytes"] - before["client_write_bytes"]
                      if after["client_write_bytes"] is not None else fio_written)
                sw = after["store_write_bytes"] - before["store_write_bytes"]
                d = lambda k: (after[k] - before[k]) if after.get(k) is not None and before.get(k) is not None else None
                results[t.name]["backend"] = {
                    "store_puts": d("puts"),
                    "store_gets": d("gets"),
                    "client_write_bytes": cw,
                    "store_write_bytes": sw,
                    "store_bytes_per_client_byte": (sw / cw) if cw else 0,
                    "read_cache_hits": d("read_cache_hits"),
                    "read_cache_misses": d("read_cache_misses"),
                    "catch_up_s": catch_up,
                }
    finally:
        for m in mounts:
            subprocess.run(["fusermount3" if shutil.which("fusermount3") else "fusermount", "-u", m],
                           capture_output=True)
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
    backends = [(n, results[n]["backend"]) for n in names if results[n].get("backend")]
    if backends:
        out += ("\nBackend traffic for the jobs, counted from when the store had caught up with the "
                "preconditioning until it had caught up with the last job's writes (every job starts with the "
                "store caught up; catch-up is the time spent waiting for that after the jobs, in all):\n\n"
                "| target | store PUTs | store GETs | client MB written | store MB written | store bytes per client byte | cache hits / misses | catch-up s |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for n, b in backends:
            num = lambda v: "n/a" if v is None else f"{v:.0f}"
            cache = ("n/a" if b.get("read_cache_hits") is None
                     else f"{b['read_cache_hits']:.0f} / {num(b.get('read_cache_misses'))}")
            out += (f"| {n} | {num(b.get('store_puts'))} | {num(b.get('store_gets'))} | "
                    f"{b.get('client_write_bytes', 0) / 1e6:.1f} | {b.get('store_write_bytes', 0) / 1e6:.1f} | "
                    f"{b['store_bytes_per_client_byte']:.2f} | {cache} | {b.get('catch_up_s', 0):.1f} |\n")
    out += goals(results)
    out += probed_vs_defaults(results)
    return out


def probed_vs_defaults(results):
    """--probe: each job's IOPS with the probed settings over the defaults, same run."""
    probed, default = results.get(PROBED), results.get("lsvd local store")
    if not probed or not default:
        return ""
    rows = []
    for job, _ in JOBS:
        if job in probed and job in default:
            p, d = headline(probed[job])[0], headline(default[job])[0]
            rows.append(f"| {job} | {d:.0f} | {p:.0f} | {p / max(d, 1e-9):.2f}x |")
    return ("\nProbed settings vs defaults, lsvd local store (same run):\n\n"
            "| job | defaults IOPS | probed IOPS | probed / defaults |\n|---|---:|---:|---:|\n" + "\n".join(rows) + "\n")


# The goals of issue 17, each checked in the same run: (how the goal reads, job, the lsvd
# target, the reference target, the factor lsvd's IOPS must reach over the reference's).
# A reference of None compares the job's log bytes per client byte with the factor as a
# ceiling instead; "job:NAME" is job NAME on the same target.
GOALS = [
    ("4K random write QD32, local store >= 0.7x nbdkit memory",
     "randwrite-4k-qd32", "lsvd local store", "nbdkit memory", 0.7),
    ("4K write + fsync QD1 >= 0.9x raw file",
     "syncwrite-4k-qd1", "lsvd local store", "raw file (direct)", 0.9),
    ("1M sequential write QD8, local store >= 0.45x raw file",
     "seqwrite-1m-qd8", "lsvd local store", "raw file (direct)", 0.45),
    ("4K random read QD32, local store >= 1.0x qemu-nbd",
     "randread-4k-qd32", "lsvd local store", "qemu-nbd raw", 1.0),
    ("versitygw: 4K random read >= 0.8x local store",
     "randread-4k-qd32", "lsvd on versitygw", "lsvd local store", 0.8),
    ("versitygw: 4K random read >= 1.0x s3backer",
     "randread-4k-qd32", "lsvd on versitygw", "s3backer on versitygw", 1.0),
    ("versitygw: 70/30 mix >= 0.8x local store",
     "mixed-70r30w-4k-qd32", "lsvd on versitygw", "lsvd local store", 0.8),
    ("versitygw: 70/30 mix >= 1.0x s3backer",
     "mixed-70r30w-4k-qd32", "lsvd on versitygw", "s3backer on versitygw", 1.0),
    ("versitygw: 1M sequential write >= 1.0x s3backer",
     "seqwrite-1m-qd8", "lsvd on versitygw", "s3backer on versitygw", 1.0),
    ("versitygw: 4K random write >= 2x s3backer",
     "randwrite-4k-qd32", "lsvd on versitygw", "s3backer on versitygw", 2.0),
    ("4 connections, random write >= 1.5x one connection",
     "randwrite-4k-4conn-qd8", "lsvd local store", "job:randwrite-4k-qd32", 1.5),
    ("4 connections, random write >= 0.7x nbdkit memory (the ceiling)",
     "randwrite-4k-4conn-qd8", "lsvd local store", "nbdkit memory", 0.7),
    ("log bytes per client byte, 4K write + fsync QD1 <= 1.25",
     "syncwrite-4k-qd1", "lsvd local store", None, 1.25),
]


def goals(results):
    rows = []
    for text, job, target, ref, factor in GOALS:
        r = results.get(target, {}).get(job)
        if not r:
            continue
        if ref is None:
            x = r.get("log_bytes_per_client_byte")
            if x is None:
                continue
            rows.append(f"| {text} | {x:.3f} | {'met' if x <= factor else 'NOT met'} |")
            continue
        if ref.startswith("job:"):
            # Another job on the same target.
            base = results[target].get(ref[len("job:"):])
        else:
            base = results.get(ref, {}).get(job)
        if not base:
            continue
        ratio = headline(r)[0] / max(headline(base)[0], 1e-9)
        rows.append(f"| {text} | {ratio:.2f}x | {'met' if ratio >= factor else 'NOT met'} |")
    if not rows:
        return ""
    return ("\nGoals (issue 17), from this run alone:\n\n| goal | this run | |\n|---|---:|---|\n"
            + "\n".join(rows) + "\n")


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
