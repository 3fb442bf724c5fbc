#!/bin/bash
# Live check: kernel rxe ignores a CNP harmlessly. Against ibv_rc_pingpong in vmB: a CNP (BTH
# opcode 0x81, BECN, PSN 0, 16 reserved bytes; IBTA Annex A17.9.3), as softroce's notification
# point sends one when a switch marks a packet CE, to the guest's QP must get no answer; the SEND
# that follows gets its ACK and the echo, and ibv_rc_pingpong (-n 1) prints its result lines and
# exits 0. rxe has no reaction point: its opcode checks admit RC, UC and UD only.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=64
wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s $size -n 1" cnp --path udp --size $size
wirecheck_expect "wirecheck cnp exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size 1
echo "ok: the CNP went unanswered, then the round trip"
