#!/bin/bash
# Live check: softroce's codec as the client of ibv_rc_pingpong in vmB, through raw IP sockets
# (FrameRepr::emit builds the whole IPv4 datagram, with IP IDs of our choosing; every packet
# from rxe arrives with its IP header and its ICRC is verified, a bad one fails the check).
# 2050-byte messages: SEND_FIRST/MIDDLE/LAST with 2 bytes and a 2-byte pad in the LAST, both
# ways. The first PSN is 0xfffff0, so our PSNs wrap through 0 during the run.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=2050 iters=20
wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s $size -n $iters" \
  rc-pingpong --path raw --size $size --iters $iters --psn 0xfffff0
wirecheck_expect "wirecheck rc-pingpong exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size $iters
echo "ok: $iters RC round trips of $size bytes over raw sockets, PSN wrap, every ICRC verified"
