#!/usr/bin/env bash
# Two processes on one address beside two processes on two addresses (issue 51): two pairs of
# softroce's perftest tools run at once, their servers on one address (members of its group)
# or on two, their clients likewise, in alternating rounds of one run. Prints the medians of
# SOFTROCE_BENCH_RUNS rounds (default 5) of each layout, and the ratio shared / apart:
# - 64 B RDMA WRITE message rate (`write-bw -s 64`), the two pairs' sum;
# - 8 B SEND ping-pong half round trip (`send-lat -s 8`, t_typical), the two pairs' mean.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
tool=./target/release/softroce
runs=${SOFTROCE_BENCH_RUNS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# pair NAME TOOL ARGS SERVER CLIENT PORT: one server and its client, the client's output kept.
pair() {
  local name=$1 cmd=$2 args=$3 server=$4 client=$5 port=$6
  # shellcheck disable=SC2086
  $tool "$cmd" --bind "$server" -p "$port" $args >/dev/null 2>&1 &
  local server_pid=$!
  sleep 0.3
  # shellcheck disable=SC2086
  $tool "$cmd" --bind "$client" -p "$port" $args "$server" >"$out/$name" 2>&1
  wait "$server_pid"
}

# round LAYOUT CMD ARGS: both pairs at once; prints the client lines' numbers.
round() {
  local layout=$1 cmd=$2 args=$3
  if [ "$layout" = shared ]; then
    set -- 127.0.10.5 127.0.10.5 127.0.10.6 127.0.10.6
  else
    set -- 127.0.10.1 127.0.10.2 127.0.10.3 127.0.10.4
  fi
  pair a "$cmd" "$args" "$1" "$3" 18710 &
  pair b "$cmd" "$args" "$2" "$4" 18711 &
  wait
  # The result line: the one after the column names.
  for side in a b; do
    awk 'found { print; exit } /#bytes/ { found = 1 }' "$out/$side"
  done
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A rate lat
for layout in apart shared; do rate[$layout]=""; lat[$layout]=""; done
for _ in $(seq "$runs"); do
  for layout in apart shared; do
    # MsgRate is the fifth column of write-bw's result line, in Mpps: the sum of both pairs.
    r=$(round "$layout" write-bw "-s 64 -n 200000" | awk '{ s += $5 } END { print s * 1000 }')
    # t_typical is the fifth column of send-lat's: the mean of both pairs.
    l=$(round "$layout" send-lat "-s 8 -n 20000" | awk '{ s += $5; n++ } END { print s / n }')
    rate[$layout]+="$r"$'\n'
    lat[$layout]+="$l"$'\n'
  done
done
ra=$(printf '%s' "${rate[apart]}" | median)
rs=$(printf '%s' "${rate[shared]}" | median)
la=$(printf '%s' "${lat[apart]}" | median)
ls=$(printf '%s' "${lat[shared]}" | median)
echo "<!-- $(date -u +%F), $(nproc) cores, $(git rev-parse --short HEAD), medians of $runs rounds -->"
echo "<!-- rates apart: $(echo ${rate[apart]}) shared: $(echo ${rate[shared]}) -->"
echo "<!-- latencies apart: $(echo ${lat[apart]}) shared: $(echo ${lat[shared]}) -->"
echo "| two pairs at once | two addresses | one address | one / two |"
echo "|---|---|---|---|"
awk -v a="$ra" -v s="$rs" 'BEGIN { printf "| 64 B RDMA WRITEs, k messages/s (sum) | %.0f | %.0f | %.2f |\n", a, s, s / a }'
awk -v a="$la" -v s="$ls" 'BEGIN { printf "| 8 B SEND ping-pong, half round trip µs (mean) | %.2f | %.2f | %.2f |\n", a, s, s / a }'
