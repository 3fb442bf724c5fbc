#!/usr/bin/env bash
# The latency of C programs that wait for their completions in ibv_get_cq_event (issue 52):
# qperf 0.4.11's rc_lat with RDMA-CM, waiting for events (-cm1) and polling (-cm1 -cp1), beside
# its tcp_lat over the same loopback in the same run (the issue's target: rc_lat -cm1 at most
# 1.5x tcp_lat); ibv_rc_pingpong -e and ib_send_lat -e (8 B). Two processes through softroce's
# library, both under the same progress; rows alternate with the baseline's, run by run.
#
#   bash benches/event_latency.sh                  # this tree's library
#   bash benches/event_latency.sh /path/to/rdma    # ... and, alternated, another build's
#                                                  # library directory (target/release/rdma)
#
# SOFTROCE_BENCH_RUNS runs (default 5); prints "row library value" lines (µs; qperf and
# ib_send_lat the half round trip, ibv_rc_pingpong a whole one), then the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${SOFTROCE_BENCH_RUNS:-5}
cargo build --release --quiet
libs=("this:$PWD/target/release/rdma")
if [ $# -gt 0 ]; then libs+=("base:$1"); fi
progress=${SOFTROCE_PROGRESS:-hybrid}
server=127.0.14.1
client=127.0.14.2
port=18800
out=$(mktemp)
trap 'rm -f "$out"; kill $(jobs -p) 2>/dev/null || true' EXIT

# through LIB ADDR PROGRAM ARGS...: runs PROGRAM on softroce's library in LIB at ADDR, in
# place of the shell that runs this (so that a server started with `(through ...) &` is $!).
through() {
  local lib=$1 addr=$2
  shift 2
  exec env LD_LIBRARY_PATH="$lib" SOFTROCE_ADDR="$addr" SOFTROCE_PROGRESS="$progress" "$@"
}

# next_port: a TCP port no earlier row used (rows run in subshells, so the count is kept here).
next_port() {
  port=$((port + 1))
}

# qperf_row PORT LIB TEST ARGS...: the client's latency in µs (LIB "tcp": plain qperf).
qperf_row() {
  local port=$1 lib=$2 test=$3
  shift 3
  if [ "$lib" = tcp ]; then
    qperf -lp $port >/dev/null 2>&1 &
  else
    (through "$lib" $server qperf -lp $port >/dev/null 2>&1) &
  fi
  local pid=$!
  sleep 0.5
  local got
  if [ "$lib" = tcp ]; then
    got=$(qperf -lp $port -t 3 "$@" $server "$test")
  else
    got=$(through "$lib" $client qperf -lp $port -t 3 "$@" $server "$test")
  fi
  kill $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  # "latency  =  61.2 us" (or ms)
  awk '/latency/ { v = $3; if ($4 == "ms") v *= 1000; print v }' <<<"$got"
}

# pair PORT LIB PROGRAM ARGS...: the client's output of PROGRAM against a server of the same.
pair() {
  local port=$1 lib=$2 program=$3
  shift 3
  (through "$lib" $server "$program" -p $port "$@" >/dev/null 2>&1) &
  local pid=$!
  sleep 0.5
  (through "$lib" $client "$program" -p $port "$@" $server 2>&1)
  wait $pid 2>/dev/null || true
}

for run in $(seq "$runs"); do
  next_port
  echo "$run tcp_lat tcp $(qperf_row $port tcp tcp_lat)" | tee -a "$out"
  for entry in "${libs[@]}"; do
    name=${entry%%:*} lib=${entry#*:}
    next_port
    echo "$run rc_lat_events $name $(qperf_row $port "$lib" rc_lat -cm1)" | tee -a "$out"
    next_port
    echo "$run rc_lat_polling $name $(qperf_row $port "$lib" rc_lat -cm1 -cp1)" | tee -a "$out"
    # "5000 iters in 0.11 seconds = 22.01 usec/iter"
    next_port
    pingpong=$(pair $port "$lib" ibv_rc_pingpong -g 0 -e -s 8 -n 5000 |
      awk '/usec\/iter/ { print $(NF - 1) }')
    echo "$run rc_pingpong_events $name $pingpong" | tee -a "$out"
    # perftest's table: bytes, iterations, min, max, typical, ...
    next_port
    send_lat=$(pair $port "$lib" ib_send_lat -x 0 -F -e -s 8 -n 5000 |
      awk '$1 == 8 && NF >= 5 { print $5 }')
    echo "$run send_lat_events $name $send_lat" | tee -a "$out"
  done
done

echo
echo "medians of $runs runs (µs):"
awk '{ print $2, $3, $4 }' "$out" | sort -k1,1 -k2,2 -k3,3g | awk '
  { key = $1 " " $2; values[key] = values[key] " " $3; count[key]++ }
  END {
    for (key in values) {
      n = split(substr(values[key], 2), v, " ")
      printf "%-20s %s\n", key, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
  }' | sort
