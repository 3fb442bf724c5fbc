#!/bin/bash
# softroce against perftest: `softroce read-bw` (host side) as the client of ib_read_bw -x 1 in
# vmB: 64 KiB RDMA READs, as many outstanding as both sides take (rxe offers 128, softroce 16),
# each answered with 64 READ responses.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client read-bw "-F -n 50"
softroce_perftest_ok read-bw 65536 50
