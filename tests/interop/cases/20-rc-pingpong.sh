#!/bin/bash
# Lab self-test: guest-to-guest RC traffic works end to end. ibv_rc_pingpong server in vmB, client
# in vmA, IPv4-mapped GID (-g 1), 4 KiB messages (4 packets each at MTU 1024). Both sides must exit
# 0 and print their result lines ("N bytes in S seconds = ..." and "N iters in S seconds = ...").
# timeout: 90
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

lab_guest_reset vmA vmB
cmd="ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 50"
out=$(run_pair selftest_rc "$cmd" "$cmd $VM_B" 60) || { echo "$out"; echo "pingpong failed"; exit 1; }
echo "$out"
n=$(echo "$out" | grep -cE '^409600 bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$' || true)
m=$(echo "$out" | grep -cE '^50 iters in [0-9.]+ seconds = [0-9.]+ usec/iter$' || true)
[ "$n" = 2 ] && [ "$m" = 2 ] || { echo "expected both result lines from both sides, got $n/$m"; exit 1; }
echo "rc pingpong ok: $(echo "$out" | grep -m1 'usec/iter')"
