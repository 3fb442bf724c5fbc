#!/usr/bin/env bash
# Prints the middleware table of docs/performance.md: UCX 1.13 (ucx_perftest) and Open MPI 4.1
# over UCX, through softroce (`softroce run`, UCX_TLS=rc) and over UCX's TCP transport on
# loopback, two processes, interleaved in one run; medians of SOFTROCE_BENCH_RUNS runs (default
# 5). Needs ucx-utils, openmpi-bin and libopenmpi-dev. Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${SOFTROCE_BENCH_RUNS:-5}
cargo build --release --quiet
softroce=$PWD/target/release/softroce
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_exchange" src/capi/tests/c/mpi_exchange.c
cat >"$work/rank_over_softroce" <<EOF
#!/bin/sh
exec $softroce run --addr 127.0.77.\$((OMPI_COMM_WORLD_RANK + 1)) -- "\$@"
EOF
chmod +x "$work/rank_over_softroce"
port=19900

# One ucx_perftest pair: $1 over (softroce|tcp), the rest the client's test arguments. Prints
# the client's "Final:" line.
perftest() {
  local over=$1
  shift
  port=$((port + 1))
  if [ "$over" = softroce ]; then
    UCX_TLS=rc "$softroce" run --addr 127.0.77.3 -- ucx_perftest -p $port >/dev/null 2>&1 &
    sleep 0.5
    UCX_TLS=rc "$softroce" run --addr 127.0.77.4 -- ucx_perftest 127.0.77.3 -p $port "$@" 2>&1 |
      grep '^Final:'
  else
    UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest -p $port >/dev/null 2>&1 &
    sleep 0.5
    UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest 127.0.0.1 -p $port "$@" 2>&1 | grep '^Final:'
  fi
  wait
}

# The MPI ping-pong and window over $1 (softroce|tcp): mpi_exchange's line.
mpi() {
  if [ "$1" = softroce ]; then
    mpirun --allow-run-as-root -np 2 --mca pml ucx -x UCX_TLS=rc,self \
      "$work/rank_over_softroce" "$work/mpi_exchange"
  else
    mpirun --allow-run-as-root -np 2 --mca pml ucx --mca pml_ucx_tls any \
      --mca pml_ucx_devices any -x UCX_TLS=tcp,self -x UCX_NET_DEVICES=lo "$work/mpi_exchange"
  fi
}

for run in $(seq "$runs"); do
  for over in softroce tcp; do
    # "Final:" columns: iterations, latency 50th percentile, average, overall (µs), bandwidth
    # average, overall (MB/s), ...: the overall latency and bandwidth are taken.
    echo "$run $over tag_lat_8 $(perftest $over -t tag_lat -s 8 -n 20000 | awk '{print $5}')"
    echo "$run $over tag_bw_64k $(perftest $over -t tag_bw -s 65536 -n 2000 | awk '{print $7}')"
    echo "$run $over tag_bw_1m $(perftest $over -t tag_bw -s 1048576 -n 300 | awk '{print $7}')"
    echo "$run $over put_bw_1m $(perftest $over -t ucp_put_bw -s 1048576 -n 300 | awk '{print $7}')"
    echo "$run $over get_64k $(perftest $over -t ucp_get -s 65536 -n 2000 | awk '{print $7}')"
    echo "$run $over mpi_pingpong_8 $(mpi $over | sed -E 's/^ping-pong 8 B: ([0-9.]+) us.*/\1/')"
  done
done >"$work/results"

echo "<!-- $(date -u +%F), $(git rev-parse --short HEAD), $(nproc) cores, medians of $runs runs -->"
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, over, test, value = line.split()
    rows.setdefault(test, {}).setdefault(over, []).append(float(value))
# (test, label, unit, lower is better, target ratio softroce / tcp or None)
tests = [
    ("tag_lat_8", "`tag_lat` 8 B", "µs", True, 1.5),
    ("tag_bw_64k", "`tag_bw` 64 KiB", "MB/s", False, None),
    ("tag_bw_1m", "`tag_bw` 1 MiB", "MB/s", False, 1.0),
    ("put_bw_1m", "`ucp_put_bw` 1 MiB", "MB/s", False, 3.0),
    ("get_64k", "`ucp_get` 64 KiB", "MB/s", False, None),
    ("mpi_pingpong_8", "MPI ping-pong 8 B (half round trip)", "µs", True, None),
]
def cell(values, unit):
    return f"{statistics.median(values):.1f} {unit} ({min(values):.1f}-{max(values):.1f})"
print("| test | UCX over softroce, median (range) | UCX over TCP, median (range) | ratio | target |")
print("|---|---|---|---|---|")
for key, label, unit, lower, target in tests:
    ours, theirs = rows[key]["softroce"], rows[key]["tcp"]
    ratio = statistics.median(ours) / statistics.median(theirs)
    goal = "" if target is None else (f"≤ {target}" if lower else f"≥ {target}")
    met = "" if target is None else (" (met)" if (ratio <= target if lower else ratio >= target) else " (missed)")
    print(f"| {label} | {cell(ours, unit)} | {cell(theirs, unit)} | {ratio:.2f} | {goal}{met} |")
PY
