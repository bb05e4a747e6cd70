# Sourced by the A/B benchmarks (catch_up.sh, local_ab.sh, read_after_write.sh,
# read_path.sh): how they read their NAME=BINARY[:ARGS] arguments and how they sum up
# their rounds, written once.
#
#   parse_spec NAME=BINARY[:ARGS]   sets $name, $bin and $args (empty without :ARGS)
#   medians FILE NKEYS FORMAT       one line per group of FILE's rows (grouped by their
#                                   first NKEYS fields, in the order first seen): the
#                                   Python FORMAT filled with the keys and then the median
#                                   of each other column, by position; {n} is the number
#                                   of rows and {each} the first value of every row
parse_spec() {
  name=${1%%=*}
  local rest=${1#*=}
  bin=${rest%%:*}
  args=""
  if [[ $rest == *:* ]]; then args=${rest#*:}; fi
}

medians() {
  python3 - "$@" <<'PY'
import statistics, sys
path, nkeys, fmt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
groups = {}
for line in open(path):
    fields = line.split()
    groups.setdefault(tuple(fields[:nkeys]), []).append([float(v) for v in fields[nkeys:]])
for key, rows in groups.items():
    med = [statistics.median(col) for col in zip(*rows)]
    each = ", ".join(f"{row[0]:.0f}" for row in rows)
    print(fmt.format(*key, *med, n=len(rows), each=each))
PY
}
