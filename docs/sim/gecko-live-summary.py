#!/usr/bin/env python3
"""Summarise gecko-live.sh's raw outputs: for each layout, fio's write MB/s before GC
started and while it ran (medians of fio's per-second samples), GC MB/s, and what each
drive read and wrote meanwhile.

Usage: gecko-live-summary.py [--name NAME] OUT_DIR LAYOUT...
Reads OUT_DIR/NAME-LAYOUT-{fio-bytes,samples,phases}.txt (NAME: gecko-live). MB is
10^6 bytes.
       gecko-live-summary.py --fio-json RUN.json
prints fio's totals and, one line a second, its cumulative bytes written, from the JSON
status reports of `fio --status-interval=1 --output-format=json`.
"""

import json
import os
import statistics
import sys


def read_phases(path):
    phases = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0].endswith("_ms"):
                phases[parts[0]] = int(parts[1])
    return phases


def fio_json(path):
    """Print fio's totals and `epoch_ms write_bytes` lines from its status reports."""
    text = open(path).read()
    decoder = json.JSONDecoder()
    reports = []
    i = 0
    while True:
        j = text.find("{", i)
        if j < 0:
            break
        try:
            obj, i = decoder.raw_decode(text, j)
        except json.JSONDecodeError:
            break
        reports.append(obj)
    last = reports[-1]["jobs"][0]
    w = last["write"]
    pct = w["clat_ns"].get("percentile", {})
    print(
        f"# fio: {w['io_bytes']} bytes in {w['runtime']} ms = "
        f"{w['io_bytes'] / w['runtime'] / 1e3:.1f} MB/s, {w['iops']:.0f} IOPS; "
        f"clat ms p50 {pct.get('50.000000', 0) / 1e6:.2f} p99 {pct.get('99.000000', 0) / 1e6:.2f} "
        f"max {w['clat_ns']['max'] / 1e6:.0f}; cpu usr {last['usr_cpu']:.1f}% sys {last['sys_cpu']:.1f}%"
    )
    print("epoch_ms write_bytes")
    for r in reports:
        print(r["timestamp_ms"], r["jobs"][0]["write"]["io_bytes"])


def read_fio_bytes(path):
    """[(epoch ms, cumulative bytes written)] from fio's status reports. fio asks for
    one a second, but while lsvd stalls the writes they come 3-5 s apart, or two in
    the same second."""
    points = [(0, 0)]
    with open(path) as f:
        for line in f:
            cols = line.split()
            if len(cols) == 2 and cols[0].isdigit():
                points.append((int(cols[0]), int(cols[1])))
    return points[1:]


def bytes_at(points, t):
    """fio's cumulative bytes at epoch ms `t`, linear between its reports."""
    if t <= points[0][0]:
        return points[0][1] * max(0.0, 1 - (points[0][0] - t) / 1000)
    for (t0, b0), (t1, b1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return b0 if t1 == t0 else b0 + (b1 - b0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def app_rate(points, t0, t1):
    """fio's MB/s between epoch ms t0 and t1."""
    if t1 <= t0:
        return None
    return (bytes_at(points, t1) - bytes_at(points, t0)) / 1e6 / ((t1 - t0) / 1000)


def app_seconds(points, t0, t1):
    """fio's MB/s in each whole second from t0 to t1."""
    return [app_rate(points, t, t + 1000) for t in range(int(t0), int(t1) - 999, 1000)]


def read_samples(path):
    with open(path) as f:
        header = f.readline().split()
        rows = []
        for line in f:
            vals = line.split()
            if len(vals) != len(header):
                continue  # cut off when the sampler was stopped
            row = {}
            for k, v in zip(header, vals):
                try:
                    row[k] = float(v)
                except ValueError:
                    row[k] = None
            rows.append(row)
    return rows


def growth(rows, key, t0, t1):
    """How much counter `key` grew from t0 to t1 (epoch ms) and over how many ms: between
    the first and the last sample of that span that have it (None without two)."""
    inside = [r for r in rows if t0 <= r["epoch_ms"] <= t1 and r.get(key) is not None]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return b[key] - a[key], b["epoch_ms"] - a["epoch_ms"]


def per_second(rows, key, t0, t1, unit=1):
    """Growth of counter `key` per second from t0 to t1, in `unit`s (None if unmeasured)."""
    grown = growth(rows, key, t0, t1)
    if grown is None or grown[1] <= 0:
        return None
    return grown[0] / unit / (grown[1] / 1000)


def rate(rows, key, t0, t1):
    """MB/s of counter `key` between the samples nearest t0 and t1 (epoch ms)."""
    return per_second(rows, key, t0, t1, unit=1e6)


def cpu_busy(rows, t0, t1):
    total, busy_jiffies = growth(rows, "cpu_total", t0, t1), growth(rows, "cpu_busy", t0, t1)
    if total is None or busy_jiffies is None or total[0] <= 0:
        return None
    return busy_jiffies[0] / total[0]


def busy(rows, drive, t0, t1):
    """Share of the time drive `drive` had a request in flight (None if not sampled)."""
    key = f"{drive}_busy_ms"
    if key not in rows[0]:
        return None
    # Busy milliseconds per second, as a share of the second.
    return per_second(rows, key, t0, t1, unit=1000)


def cores(rows, key, t0, t1):
    """CPU cores used by the processes behind jiffies counter `key`."""
    return per_second(rows, key, t0, t1, unit=os.sysconf("SC_CLK_TCK"))


def stalled(rows, t0, t1):
    """Share of sample intervals from t0 to t1 in which lsvd accepted no client write."""
    inside = [r for r in rows if t0 <= r["epoch_ms"] <= t1 and r["client_write_bytes"] is not None]
    pairs = list(zip(inside, inside[1:]))
    if not pairs:
        return None
    return sum(1 for a, b in pairs if b["client_write_bytes"] == a["client_write_bytes"]) / len(pairs)


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def med(xs):
    return statistics.median(xs) if xs else None


def summarise(out_dir, name, layout):
    pre = f"{out_dir}/{name}-{layout}"
    ph = read_phases(f"{pre}-phases.txt")
    fio = read_fio_bytes(f"{pre}-fio-bytes.txt")
    fio_end = fio[-1][0]
    rows = read_samples(f"{pre}-samples.txt")
    run0, run1 = ph["run_start_ms"], ph["run_end_ms"]
    drives = sorted({k.split("_")[0] for k in rows[0] if k.startswith("d") and "_read" in k})

    # GC's regime starts at the first sample with a pass in flight or a client object
    # held back for GC (lsvd holds client objects once the store reaches
    # live/--gc-start + one batch, which can come a little before the pass starts).
    gc_start = first_pass = first_held = None
    for r in rows:
        if r["epoch_ms"] < run0:
            continue
        if first_pass is None and (r["gc_pass_in_flight"] or 0) >= 1:
            first_pass = r["epoch_ms"]
        if first_held is None and (r["uploads_held"] or 0) > 0:
            first_held = r["epoch_ms"]
    if first_pass is not None or first_held is not None:
        gc_start = min(t for t in (first_pass, first_held) if t is not None)
    gc_during_fill = any(
        (r["gc_pass_in_flight"] or 0) >= 1 for r in rows if r["epoch_ms"] < run0
    )
    # A fio sample at t covers (t - 1 s, t]: before GC if it ends by the first sample
    # that saw a pass, during GC if it starts after it.
    # The random writes start with an empty write log, which takes writes at the local
    # disk's speed until it is full: "before GC" counts from then.
    max_log = max((r["log_used_bytes"] or 0) for r in rows if run0 <= r["epoch_ms"] <= run1)
    log_full = next(
        (
            r["epoch_ms"]
            for r in rows
            if r["epoch_ms"] >= run0 and (r["log_used_bytes"] or 0) >= 0.9 * max_log
        ),
        run0,
    )
    g_end = gc_start if gc_start is not None else fio_end
    before = app_seconds(fio, log_full, g_end)
    during = app_seconds(fio, gc_start, fio_end) if gc_start is not None else []
    held = sum(1 for r in rows if run0 <= r["epoch_ms"] <= run1 and (r["uploads_held"] or 0) > 0)
    tail_moves = []
    last = None
    for r in rows:
        if r["tail_drive"] is not None and r["tail_drive"] != last:
            if last is not None:
                tail_moves.append(((r["epoch_ms"] - run0) / 1000, int(r["tail_drive"])))
            last = r["tail_drive"]
    fill_mb_s = None
    vol = [r for r in rows if r["epoch_ms"] <= ph["fill_end_ms"]]
    if vol:
        fill_mb_s = rate(rows, "client_write_bytes", ph["fill_start_ms"], ph["fill_end_ms"])

    g0 = gc_start if gc_start is not None else run1
    res = {
        "layout": layout,
        "fill_mb_s": fill_mb_s,
        "gc_start_s": None if gc_start is None else (gc_start - run0) / 1000,
        "first_pass_s": None if first_pass is None else (first_pass - run0) / 1000,
        "first_held_s": None if first_held is None else (first_held - run0) / 1000,
        "gc_during_fill": gc_during_fill,
        "before": med(before),
        "n_before": len(before),
        "during": med(during),
        "n_during": len(during),
        "mean_before": app_rate(fio, log_full, g_end),
        "mean_during": app_rate(fio, gc_start, fio_end) if gc_start is not None else None,
        "stalled_during": stalled(rows, gc_start, run1) if gc_start is not None else None,
        "log_full_s": (log_full - run0) / 1000,
        "client_before": rate(rows, "client_write_bytes", log_full, g_end),
        "client_during": rate(rows, "client_write_bytes", g_end, run1) if gc_start else None,
        "gc_moved": rate(rows, "gc_moved_bytes", g0, run1) if gc_start else None,
        "gc_read": sum(
            rate(rows, f"{d}_read_bytes", g0, run1) or 0 for d in drives
        ) if gc_start else None,
        "store_write_before": rate(rows, "store_write_bytes", run0, g0),
        "store_write_during": rate(rows, "store_write_bytes", g0, run1) if gc_start else None,
        "held_s": held,
        "tail_moves": tail_moves,
        "cpu_before": cpu_busy(rows, run0, g0),
        "cpu_during": cpu_busy(rows, g0, run1) if gc_start else None,
        "lsvd_cores": (cores(rows, "lsvd_cpu", run0, g0), cores(rows, "lsvd_cpu", g0, run1)),
        "drives_cores": (
            cores(rows, "drives_cpu", run0, g0),
            cores(rows, "drives_cpu", g0, run1),
        ),
        "drives_before": [
            (
                rate(rows, f"{d}_read_bytes", run0, g0),
                rate(rows, f"{d}_write_bytes", run0, g0),
                busy(rows, d, run0, g0),
            )
            for d in drives
        ],
        "drives_during": [
            (
                rate(rows, f"{d}_read_bytes", g0, run1),
                rate(rows, f"{d}_write_bytes", g0, run1),
                busy(rows, d, g0, run1),
            )
            for d in drives
        ]
        if gc_start
        else [],
    }
    # Timeline: 5 s steps from the start of the random writes.
    timeline = []
    t = run0
    while t < run1:
        t1 = min(t + 5000, run1)
        app = app_rate(fio, t, t1)
        inflight = [r for r in rows if t <= r["epoch_ms"] <= t1]
        timeline.append(
            (
                (t - run0) / 1000,
                app,
                rate(rows, "gc_moved_bytes", t, t1),
                [
                    (
                        rate(rows, f"{d}_read_bytes", t, t1),
                        rate(rows, f"{d}_write_bytes", t, t1),
                        busy(rows, d, t, t1),
                    )
                    for d in drives
                ],
                max((r["gc_pass_in_flight"] or 0) for r in inflight) if inflight else 0,
                max((r["uploads_held"] or 0) for r in inflight) if inflight else 0,
                inflight[-1]["tail_drive"] if inflight else None,
            )
        )
        t = t1
    return res, timeline, drives


def main():
    if sys.argv[1] == "--fio-json":
        fio_json(sys.argv[2])
        return
    name = "gecko-live"
    args = sys.argv[1:]
    if args[0] == "--name":
        name, args = args[1], args[2:]
    out_dir, layouts = args[0], args[1:]
    results = []
    print(
        "fio 4 KiB random writes, QD32. app MB/s: fio's bytes over the phase (its "
        "cumulative count, linear between its reports), with the median of its seconds "
        "in brackets; before GC counts from when the write log is full. MB = 10^6 bytes\n"
    )
    print(
        "| layout | fill MB/s | GC from | app MB/s before GC (median of n s) "
        "| app MB/s while GC runs (median of n s) | GC moved MB/s | drives' read MB/s "
        "while GC | lsvd client writes MB/s before / during GC |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for layout in layouts:
        res, timeline, drives = summarise(out_dir, name, layout)
        results.append((res, timeline, drives))
        gs = "no GC" if res["gc_start_s"] is None else f"{res['gc_start_s']:.0f} s"
        print(
            f"| {layout} | {fmt(res['fill_mb_s'])} | {gs} "
            f"| {fmt(res['mean_before'])} ({fmt(res['before'])} of {res['n_before']}) "
            f"| {fmt(res['mean_during'])} ({fmt(res['during'])} of {res['n_during']}) "
            f"| {fmt(res['gc_moved'])} | {fmt(res['gc_read'])} "
            f"| {fmt(res['client_before'])} / {fmt(res['client_during'])} |"
        )
    for res, timeline, drives in results:
        print(f"\n## {res['layout']}\n")
        if res["gc_during_fill"]:
            print("GC ran during the fill already")
        print(
            f"store writes MB/s before GC {fmt(res['store_write_before'])}, "
            f"during {fmt(res['store_write_during'])}; "
            f"write log full at {fmt(res['log_full_s'], 0)} s (before-GC samples start there), "
            f"share of 1 s samples with no client write accepted while GC ran: "
            f"{fmt(res['stalled_during'], 2)}, "
            f"first GC pass at {fmt(res['first_pass_s'], 0)} s, first client object held "
            f"at {fmt(res['first_held_s'], 0)} s, seconds with objects held: {res['held_s']}; "
            f"machine CPU busy before GC {fmt(res['cpu_before'], 2)}, "
            f"during {fmt(res['cpu_during'], 2)}; cores used by lsvd before/during "
            f"{fmt(res['lsvd_cores'][0], 2)}/{fmt(res['lsvd_cores'][1], 2)}, "
            f"by the drives' nbdkit+nbdfuse {fmt(res['drives_cores'][0], 2)}/"
            f"{fmt(res['drives_cores'][1], 2)}"
        )
        if res["tail_moves"]:
            moves = ", ".join(f"to drive {d} at {s:.0f} s" for s, d in res["tail_moves"])
            print(f"tail moves (seconds from the start of the random writes): {moves}")
        for name, per in (("before GC", res["drives_before"]), ("while GC", res["drives_during"])):
            if per:
                cols = ", ".join(
                    f"{d} read {fmt(r)} write {fmt(w)} busy {fmt(b, 2)}"
                    for d, (r, w, b) in zip(drives, per)
                )
                print(f"drive MB/s {name}: {cols}")
        print()
        head = " | ".join(f"{d} MB/s r/w (busy)" for d in drives)
        print(f"| s | app MB/s | GC moved MB/s | {head} | GC pass | held | tail |")
        print("|---:|---:|---:|" + "---|" * len(drives) + "---:|---:|---:|")
        for t, app, gc, per, inflight, held, tail in timeline:
            cols = " | ".join(
                f"{fmt(r)}/{fmt(w)}" + ("" if b is None else f" ({fmt(b, 2)})") for r, w, b in per
            )
            tail_s = "-" if tail is None else f"{tail:.0f}"
            print(
                f"| {t:.0f} | {fmt(app)} | {fmt(gc)} | {cols} | {inflight:.0f} "
                f"| {held:.0f} | {tail_s} |"
            )


if __name__ == "__main__":
    main()
