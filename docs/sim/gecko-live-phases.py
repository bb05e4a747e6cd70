#!/usr/bin/env python3
"""Three phases of a gecko-live.sh run, from lsvd's own counters (the *-samples.txt
files): before GC (from when the write log is full), GC beside the clients (from the
first GC pass to the first client object held back for GC), and clients held behind
GC (to the end). Prints application and GC MB/s (10^6 bytes) per phase and layout.

    python3 docs/sim/gecko-live-phases.py [NAME]     # NAME: gecko-live-headroom
"""
import sys
from pathlib import Path

NAME = sys.argv[1] if len(sys.argv) > 1 else "gecko-live-headroom"
OUT = Path(__file__).resolve().parent / "out"
LOG_FULL_BYTES = 0.9 * 64 * 2**20  # 90% of gecko-live.sh's 64 MiB write log


def phases(layout):
    path = OUT / f"{NAME}-{layout}-samples.txt"
    lines = path.read_text().splitlines()
    ix = {h: i for i, h in enumerate(lines[0].split())}
    rows = [[float(x) if x != "NA" else 0.0 for x in l.split()] for l in lines[1:] if l.strip()]

    def at(cond):
        return next((r for r in rows if cond(r)), None)

    def val(r, name):
        return r[ix[name]]

    full = at(lambda r: val(r, "log_used_bytes") > LOG_FULL_BYTES)
    gc = at(lambda r: val(r, "gc_passes") > 0 or val(r, "gc_pass_in_flight") > 0)
    held = at(lambda r: val(r, "uploads_held") > 0)
    end = rows[-1]

    def rate(a, b, name):
        if a is None or b is None or val(b, "epoch_ms") <= val(a, "epoch_ms"):
            return float("nan")
        return (val(b, name) - val(a, name)) / ((val(b, "epoch_ms") - val(a, "epoch_ms")) / 1000) / 1e6

    t0 = val(rows[0], "epoch_ms")
    secs = lambda r: (val(r, "epoch_ms") - t0) / 1000 if r else float("nan")
    return {
        "gc_s": secs(gc), "held_s": secs(held),
        "before": rate(full, gc, "client_write_bytes"),
        "beside": rate(gc, held, "client_write_bytes"),
        "beside_gc": rate(gc, held, "gc_moved_bytes"),
        "held": rate(held, end, "client_write_bytes"),
        "held_gc": rate(held, end, "gc_moved_bytes"),
    }


print(f"{NAME}: app MB/s (GC moved MB/s); seconds from the first sample (fill included)")
print("| layout | before GC | GC beside clients | clients held behind GC | beside / before |")
print("|---|---:|---:|---:|---:|")
for layout in ["stripe", "move-to-tail", "compact-in-body"]:
    p = phases(layout)
    print(f"| {layout} | {p['before']:.1f} | {p['beside']:.1f} (GC {p['beside_gc']:.1f}), "
          f"{p['held_s'] - p['gc_s']:.0f} s | {p['held']:.1f} (GC {p['held_gc']:.1f}) | "
          f"{p['beside'] / p['before']:.2f} |")
