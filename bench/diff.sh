#!/bin/bash
# What an incremental backup costs: export-diff / import-diff against the amount
# changed, on a volume much larger than the change (issue 44's measurement).
#
#   bench/diff.sh [BINARY] [SIZE] [CHANGED_MIB]     (default target/release/lsvd 16G 64)
#
# Serves a fresh SIZE volume, fills 1 GiB spread over it (fio, nbd engine), takes
# snapshot s0, writes CHANGED_MIB MiB of 64 KiB random writes over the whole volume,
# takes s1, and s2 with nothing written since. Then times, each once: a full raw
# export of s1 (the baseline: what a backup without diffs reads), export-diff s1 from
# s0, export-diff s2 from s1 (nothing changed: the fixed cost), and the restore into
# another store (import of s0's image, import-diff of the diff). Prints seconds,
# sizes and MB/s of the changed data.
set -euo pipefail
bin=${1:-target/release/lsvd}; size=${2:-16G}; changed_mib=${3:-64}
tmp=$(mktemp -d /tmp/lsvd-diffbench.XXXXXX)
pid=""
trap 'set +e; [ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
data=$tmp/data; sock=$tmp/nbd.sock
"$bin" --data "$data" create vol --size "$size" >/dev/null
"$bin" --data "$data" serve vol --socket "$sock" 2>"$tmp/serve.log" &
pid=$!
for _ in $(seq 1 1800); do [ -S "$sock" ] && break; sleep 0.1; done
uri="nbd+unix:///vol?socket=$sock"
fio_run() { fio --name=w --ioengine=nbd "--uri=$uri" --refill_buffers --randrepeat=0 \
  --output=/dev/null "$@"; }
fio_run --rw=randwrite --bs=1M --iodepth=8 --io_size=1G
"$bin" --data "$data" snapshot create vol s0 >/dev/null
fio_run --rw=randwrite --bs=64k --iodepth=8 "--io_size=${changed_mib}M"
"$bin" --data "$data" snapshot create vol s1 >/dev/null
"$bin" --data "$data" snapshot create vol s2 >/dev/null
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
full_s=$(t "$bin" --data "$data" export vol@s1 "$tmp/s1.img" --quiet)
diff_s=$(t "$bin" --data "$data" export-diff vol@s1 --from-snap s0 "$tmp/s1.diff" --quiet)
none_s=$(t "$bin" --data "$data" export-diff vol@s2 --from-snap s1 "$tmp/s2.diff" --quiet)
"$bin" --data "$data" export vol@s0 "$tmp/s0.img" --quiet
kill -INT $pid; wait $pid || true
rm -f "$tmp/s1.img"
dst=$tmp/dst
import_s=$(t "$bin" --data "$dst" import "$tmp/s0.img" vol --quiet)
"$bin" --data "$dst" snapshot create vol s0 >/dev/null
apply_s=$(t "$bin" --data "$dst" import-diff "$tmp/s1.diff" vol --quiet)
diff_bytes=$(stat -c %s "$tmp/s1.diff"); none_bytes=$(stat -c %s "$tmp/s2.diff")
printf 'volume %s, %s MiB changed over it after 1 GiB filled\n' "$size" "$changed_mib"
printf '%-36s %8s s\n' "export vol@s1 (full raw image)" "$full_s"
printf '%-36s %8s s  %s bytes  %.0f MB/s of changes\n' "export-diff s1 --from-snap s0" "$diff_s" \
  "$diff_bytes" "$(echo "$diff_bytes / $diff_s / 1000000" | bc -l)"
printf '%-36s %8s s  %s bytes\n' "export-diff s2 --from-snap s1 (none)" "$none_s" "$none_bytes"
printf '%-36s %8s s\n' "import s0 image (restore base)" "$import_s"
printf '%-36s %8s s  %.0f MB/s\n' "import-diff s1.diff" "$apply_s" \
  "$(echo "$diff_bytes / $apply_s / 1000000" | bc -l)"
