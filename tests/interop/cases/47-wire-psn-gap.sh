#!/bin/bash
# Live check: a PSN gap gets one NAK. Against ibv_rc_pingpong in vmB (raw path: the NAK's ICRC
# verified): a SEND_ONLY 5 PSNs ahead of the expected one must get RC_ACKNOWLEDGE with syndrome
# 0x60 (PSN sequence error), the expected PSN in its BTH and MSN 0; the SEND at the expected PSN
# then gets its ACK and the echo, and ibv_rc_pingpong (-n 1) prints its result lines and exits 0.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=64
wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s $size -n 1" psn-gap --path raw --size $size
wirecheck_expect "wirecheck psn-gap exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong did not print its result lines" pingpong_result_ok "$SRV_OUT" $size 1
echo "ok: NAK 0x60 with the expected PSN, then the round trip"
