#!/bin/bash
# Live check: FETCH_ADDs built by softroce's codec on the buffer of an ib_atomic_bw server in vmB
# (raw path: every response ICRC-verified). Each must get an ATOMIC_ACKNOWLEDGE with its PSN, an
# ACK AETH with the next MSN, and an original value equal to the previous one plus the addend.
# The server then prints the report we sent (8 bytes, 3 iterations) and exits 0 on its own.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

iters=3
wirecheck_case atomic "ib_atomic_bw -d rxe0 -x 1 -F -n 5" atomic --path raw --iters $iters
wirecheck_expect "wirecheck atomic exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ib_atomic_bw exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ib_atomic_bw did not print the report line of 8 bytes x $iters" perftest_report_ok "$SRV_OUT" 8 $iters
echo "ok: $iters FETCH_ADDs with consistent original values; ib_atomic_bw printed our report"
