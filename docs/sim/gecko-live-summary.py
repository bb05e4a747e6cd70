#!/usr/bin/env python3
"""Summarise gecko-live.sh's raw outputs: for each layout, fio's write MB/s before GC
started and while it ran (medians of fio's per-second samples), GC MB/s, and what each
drive read and wrote meanwhile.

Usage: gecko-live-summary.py OUT_DIR LAYOUT...
Reads OUT_DIR/gecko-live-LAYOUT-{fio-bw,samples,phases}.txt. MB is 10^6 bytes.
"""

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


def read_fio_bw(path):
    """[(end of the second, epoch ms), MB/s] from a write_bw_log (KiB/s)."""
    out = []
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) >= 2 and cols[0].isdigit():
                out.append((int(cols[0]), int(cols[1]) * 1024 / 1e6))
    return out


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


def rate(rows, key, t0, t1):
    """MB/s of counter `key` between the samples nearest t0 and t1 (epoch ms)."""
    inside = [r for r in rows if t0 <= r["epoch_ms"] <= t1 and r.get(key) is not None]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    secs = (b["epoch_ms"] - a["epoch_ms"]) / 1000
    return (b[key] - a[key]) / 1e6 / secs if secs > 0 else None


def cpu_busy(rows, t0, t1):
    inside = [r for r in rows if t0 <= r["epoch_ms"] <= t1]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    total = b["cpu_total"] - a["cpu_total"]
    return (b["cpu_busy"] - a["cpu_busy"]) / total if total > 0 else None


def cores(rows, key, t0, t1):
    """CPU cores used by the processes behind jiffies counter `key`."""
    inside = [r for r in rows if t0 <= r["epoch_ms"] <= t1 and r.get(key) is not None]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    secs = (b["epoch_ms"] - a["epoch_ms"]) / 1000
    return (b[key] - a[key]) / os.sysconf("SC_CLK_TCK") / secs if secs > 0 else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def med(xs):
    return statistics.median(xs) if xs else None


def summarise(out_dir, layout):
    pre = f"{out_dir}/gecko-live-{layout}"
    ph = read_phases(f"{pre}-phases.txt")
    bw = read_fio_bw(f"{pre}-fio-bw.txt")
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
    if gc_start is None:
        before = [v for _, v in bw]
        during = []
    else:
        before = [v for t, v in bw if t <= gc_start]
        during = [v for t, v in bw if t - 1000 >= gc_start]
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
        "mean_during": statistics.fmean(during) if during else None,
        "gc_moved": rate(rows, "gc_moved_bytes", g0, run1) if gc_start else None,
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
            (rate(rows, f"{d}_read_bytes", run0, g0), rate(rows, f"{d}_write_bytes", run0, g0))
            for d in drives
        ],
        "drives_during": [
            (rate(rows, f"{d}_read_bytes", g0, run1), rate(rows, f"{d}_write_bytes", g0, run1))
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
        app = [v for e, v in bw if t < e <= t1]
        inflight = [r for r in rows if t <= r["epoch_ms"] <= t1]
        timeline.append(
            (
                (t - run0) / 1000,
                statistics.fmean(app) if app else None,
                rate(rows, "gc_moved_bytes", t, t1),
                [
                    (rate(rows, f"{d}_read_bytes", t, t1), rate(rows, f"{d}_write_bytes", t, t1))
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
    out_dir, layouts = sys.argv[1], sys.argv[2:]
    results = []
    print("fio 4 KiB random writes, QD32, per-second samples; MB = 10^6 bytes\n")
    print(
        "| layout | fill MB/s | GC starts at | app MB/s before GC (median, n) "
        "| app MB/s while GC runs (median, n; mean) | GC moved MB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for layout in layouts:
        res, timeline, drives = summarise(out_dir, layout)
        results.append((res, timeline, drives))
        gs = "no GC" if res["gc_start_s"] is None else f"{res['gc_start_s']:.0f} s"
        print(
            f"| {layout} | {fmt(res['fill_mb_s'])} | {gs} "
            f"| {fmt(res['before'])} ({res['n_before']}) "
            f"| {fmt(res['during'])} ({res['n_during']}; {fmt(res['mean_during'])}) "
            f"| {fmt(res['gc_moved'])} |"
        )
    for res, timeline, drives in results:
        print(f"\n## {res['layout']}\n")
        if res["gc_during_fill"]:
            print("GC ran during the fill already")
        print(
            f"store writes MB/s before GC {fmt(res['store_write_before'])}, "
            f"during {fmt(res['store_write_during'])}; "
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
                    f"{d} read {fmt(r)} write {fmt(w)}" for d, (r, w) in zip(drives, per)
                )
                print(f"drive MB/s {name}: {cols}")
        print()
        head = " | ".join(f"{d} r/w" for d in drives)
        print(f"| s | app MB/s | GC moved MB/s | {head} | GC pass | held | tail |")
        print("|---:|---:|---:|" + "---|" * len(drives) + "---:|---:|---:|")
        for t, app, gc, per, inflight, held, tail in timeline:
            cols = " | ".join(f"{fmt(r)}/{fmt(w)}" for r, w in per)
            tail_s = "-" if tail is None else f"{tail:.0f}"
            print(
                f"| {t:.0f} | {fmt(app)} | {fmt(gc)} | {cols} | {inflight:.0f} "
                f"| {held:.0f} | {tail_s} |"
            )


if __name__ == "__main__":
    main()
