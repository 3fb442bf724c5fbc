#!/bin/bash
# softroce against perftest: `softroce send-bw` (host side) as the server, ib_send_bw -x 1 in
# vmB as its client: 100 SENDs of 4 KiB into receives softroce posts (and posts again while
# more are to come), timed from the first to the last.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server send-bw "-F -n 100 -s 4096"
softroce_perftest_ok send-bw 4096 100
