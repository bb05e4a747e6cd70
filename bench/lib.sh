# Sourced by the A/B benchmarks (catch_up.sh, local_ab.sh, read_after_write.sh,
# read_path.sh): how they read their NAME=BINARY[:ARGS] arguments, written once.
#
#   parse_spec NAME=BINARY[:ARGS]   sets $name, $bin and $args (empty without :ARGS)
parse_spec() {
  name=${1%%=*}
  local rest=${1#*=}
  bin=${rest%%:*}
  args=""
  if [[ $rest == *:* ]]; then args=${rest#*:}; fi
}
