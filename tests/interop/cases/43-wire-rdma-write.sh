#!/bin/bash
# Live check: RDMA WRITEs built by softroce's codec into the buffer of an ib_write_bw server in
# vmB (UDP path), after perftest's own out-of-band exchange (which gives us its QPN, PSN, R_Key
# and VA). Each 4096-byte WRITE (WRITE_FIRST with the RETH, MIDDLE, MIDDLE, LAST) must get an
# ACK of its last PSN with the next MSN. The server then prints the report we sent it (size 4096,
# 5 iterations) and exits 0 on its own.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=4096 iters=5
wirecheck_case write "ib_write_bw -d rxe0 -x 1 -F -n 5" write --path udp --size $size --iters $iters
wirecheck_expect "wirecheck write exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ib_write_bw exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ib_write_bw did not print the report line of $size bytes x $iters" perftest_report_ok "$SRV_OUT" $size $iters
echo "ok: $iters RDMA WRITEs of $size bytes acknowledged; ib_write_bw printed our report"
