#!/bin/bash
# Live check: softroce's codec as the client of ibv_rc_pingpong in vmB, through a UDP socket
# (kernel framing, IP_PMTUDISC_DO, ICRC sealed by KernelFraming). 20 round trips of 4096 bytes:
# each SEND goes out as SEND_FIRST/MIDDLE/MIDDLE/LAST at MTU 1024, rxe must ACK its last PSN
# with the right MSN, the guest's SEND back must be our bytes (pingpong echoes its buffer), and
# our ACKs must complete the guest's sends: the guest then prints its result lines and exits 0.
# rxe's packets are decoded but their ICRC is unverified on this path (no IP header).
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=4096 iters=20
wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s $size -n $iters" \
  rc-pingpong --path udp --size $size --iters $iters
wirecheck_expect "wirecheck rc-pingpong exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size $iters
echo "ok: $iters RC round trips of $size bytes over a UDP socket; ibv_rc_pingpong: $(printf '%s\n' "$SRV_OUT" | grep 'usec/iter')"
