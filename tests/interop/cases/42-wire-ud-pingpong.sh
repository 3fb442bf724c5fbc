#!/bin/bash
# Live check: softroce's codec as the client of ibv_ud_pingpong in vmB (raw path: every packet
# from rxe ICRC-verified). UD SEND_ONLY with a DETH (Q_Key 0x11111111, our source QP) both ways;
# the guest's packets must carry the Q_Key, its QPN as source QP and consecutive PSNs from the
# one it announced, and echo our 512 bytes; it prints its result lines and exits 0.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=512 iters=10
wirecheck_case ud "ibv_ud_pingpong -d rxe0 -g 1 -s $size -n $iters" \
  ud-pingpong --path raw --size $size --iters $iters
wirecheck_expect "wirecheck ud-pingpong exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_ud_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_ud_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size $iters
echo "ok: $iters UD round trips of $size bytes"
