#!/bin/bash
# softroce against perftest: `softroce send-bw` (host side) as the client of ib_send_bw -x 1 in
# vmB: 64 KiB SENDs into the receives the server posted before the round that starts the test.
# Each side prints what it measured.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client send-bw "-F -n 50"
softroce_perftest_ok send-bw 65536 50
