#!/bin/bash
# Live check: RDMA READs built by softroce's codec from the buffer of an ib_read_bw server in vmB
# (raw path: every response ICRC-verified). Two 4096-byte READs, the second 1024 bytes further on:
# each must come back as READ_RESPONSE_FIRST/MIDDLE/MIDDLE/LAST on consecutive PSNs, FIRST and
# LAST with an ACK AETH and the MSN that counts the READ; the bytes must not be all zero (perftest
# fills its buffer with rand()) and the two READs must agree where they overlap. The server then
# prints the report we sent (4096 bytes, 2 iterations) and exits 0 on its own.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

size=4096
wirecheck_case read "ib_read_bw -d rxe0 -x 1 -F -n 5" read --path raw --size $size
wirecheck_expect "wirecheck read exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ib_read_bw exited $SRV_RC" [ "$SRV_RC" = 0 ]
wirecheck_expect "ib_read_bw did not print the report line of $size bytes x 2" perftest_report_ok "$SRV_OUT" $size 2
echo "ok: 2 overlapping RDMA READs of $size bytes; ib_read_bw printed our report"
