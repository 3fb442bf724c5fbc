#!/bin/bash
# Live check: rxe drops a packet whose ICRC is wrong. Against ibv_rc_pingpong in vmB (UDP path):
# a SEND_ONLY at the expected PSN with its ICRC bits flipped gets no answer within 1 s; the same
# packet with the ICRC KernelFraming computes then gets its ACK (MSN 1) and the guest's echo, and
# the one round trip (-n 1) lets ibv_rc_pingpong print its result lines and exit 0.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=64
wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s $size -n 1" bad-icrc --path udp --size $size
wirecheck_expect "wirecheck bad-icrc exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size 1
echo "ok: corrupted ICRC dropped silently, the right one acknowledged"
