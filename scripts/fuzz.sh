#!/usr/bin/env bash
# Coverage-guided fuzzing of lsvd's parsers with AFL++ (`cargo afl`, stable toolchain).
#
#   scripts/fuzz.sh                      short run: every target for 8 s (CI, from test.sh)
#   scripts/fuzz.sh --long               every target for 600 s
#   scripts/fuzz.sh --long --seconds N   every target for N s
#   scripts/fuzz.sh --targets a,b        only these targets (any mode)
#   scripts/fuzz.sh --list               the targets
#   scripts/fuzz.sh --build-only         install the tools and build, fuzz nothing
#
# Installs cargo-afl (pinned) and builds AFL++ for this toolchain if they are missing,
# builds the instrumented targets of fuzz/ into target/fuzz, replays every seed of
# fuzz/corpus/<target> through its target, then fuzzes each from that corpus (fixed
# seed: -s 1), and prints per target the executions, exec/s, edges found and map
# coverage, and crashes and hangs, from AFL's fuzzer_stats.
# Runs are kept in target/fuzz/runs/<target>; new crashes and hangs are listed there.
# Exits non-zero if a seed fails or a target found a crash or a hang. What each
# target checks: docs/fuzzing.md.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

CARGO_AFL_VERSION=0.18.2
TARGETS=(format_record format_object format_checkpoint format_log_index format_supers format_diff
    nbd_proto nbd_session nbd_volume trace_parse)
seconds=8
long=0
build_only=0
selected=()

while [ $# -gt 0 ]; do
    case "$1" in
    --long) long=1; seconds=600 ;;
    --seconds) seconds="$2"; shift ;;
    --targets) IFS=, read -r -a selected <<<"$2"; shift ;;
    --list) printf '%s\n' "${TARGETS[@]}"; exit 0 ;;
    --build-only) build_only=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ "${#selected[@]}" -gt 0 ] || selected=("${TARGETS[@]}")
for t in "${selected[@]}"; do
    if [[ ! " ${TARGETS[*]} " == *" $t "* ]]; then
        echo "fuzz: unknown target $t (try --list)" >&2
        exit 2
    fi
done

start=$SECONDS
# cargo-afl, pinned; it carries the AFL++ sources it builds below.
if ! cargo afl --version 2>/dev/null | grep -q "cargo-afl $CARGO_AFL_VERSION"; then
    echo "fuzz: installing cargo-afl $CARGO_AFL_VERSION"
    cargo install --locked cargo-afl --version "$CARGO_AFL_VERSION"
fi
# AFL++ itself (afl-fuzz and its runtime), built once per toolchain into ~/.local/share.
if ! out=$(cargo afl config --build 2>&1); then
    if ! grep -q "already built" <<<"$out"; then
        echo "$out" >&2
        echo "fuzz: building AFL++ failed (needs make and a C compiler)" >&2
        exit 1
    fi
fi

target_dir="$repo/target/fuzz"
bins=()
for t in "${selected[@]}"; do bins+=(--bin "$t"); done
(cd fuzz && cargo afl build --release --locked --target-dir "$target_dir" "${bins[@]}")
echo "fuzz: tools and instrumented build took $((SECONDS - start)) s" >&2
[ "$build_only" -eq 0 ] || exit 0

# This is a shared machine: no CPU pinning, no frequency checks, no core dumps wanted.
export AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_NO_UI=1 AFL_QUIET=1
[ "$long" -eq 1 ] || export AFL_FAST_CAL=1

afl_stat() { sed -n "s/^$1 *: *//p" "$2"; }
failed=0
report=()
for t in "${selected[@]}"; do
    out="$target_dir/runs/$t"
    rm -rf "$out"
    mkdir -p "$out"
    # Replay every seed first: AFL++ only warns about (and skips) a seed that crashes,
    # and the regression-* seeds are the inputs of bugs that were fixed.
    for seed in "fuzz/corpus/$t"/*; do
        if ! timeout 60 "$target_dir/release/$t" <"$seed" >"$out/seed.log" 2>&1; then
            grep -m1 -A1 panicked "$out/seed.log" >&2 || tail -3 "$out/seed.log" >&2
            echo "fuzz: seed $seed fails $t" >&2
            failed=1
        fi
    done
    echo "fuzz: $t for ${seconds} s" >&2
    t0=$SECONDS
    cargo afl fuzz -i "fuzz/corpus/$t" -o "$out" -V "$seconds" -s 1 -t 2000 \
        "$target_dir/release/$t" >"$out/afl.log" 2>&1 || {
        tail -20 "$out/afl.log" >&2
        echo "fuzz: afl-fuzz failed on $t (log: $out/afl.log)" >&2
        failed=1
        continue
    }
    s="$out/default/fuzzer_stats"
    crashes=$(afl_stat saved_crashes "$s")
    hangs=$(afl_stat saved_hangs "$s")
    report+=("$(printf '%-18s %12s %9s %11s %8s %7s %5s %4s' "$t" \
        "$(afl_stat execs_done "$s")" "$(afl_stat execs_per_sec "$s")" \
        "$(afl_stat edges_found "$s")/$(afl_stat total_edges "$s")" "$(afl_stat bitmap_cvg "$s")" \
        "$(afl_stat corpus_count "$s")" "$crashes" "$hangs") $((SECONDS - t0))s")
    if [ "$crashes" != 0 ] || [ "$hangs" != 0 ]; then
        failed=1
        ls "$out"/default/crashes/id:* "$out"/default/hangs/id:* 2>/dev/null >&2 || true
    fi
done

printf '%-18s %12s %9s %11s %8s %7s %5s %4s\n' target execs exec/s edges map corpus crash hang
printf '%s\n' "${report[@]}"
echo "fuzz: total $((SECONDS - start)) s"
if [ "$failed" -ne 0 ]; then
    echo "fuzz: crashes or hangs found; inputs under $target_dir/runs/*/default/{crashes,hangs}" >&2
    echo "fuzz: reproduce with: $target_dir/release/TARGET < INPUT" >&2
    exit 1
fi
