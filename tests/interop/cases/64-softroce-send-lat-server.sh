#!/bin/bash
# softroce against perftest: `softroce send-lat` (host side) as the server, ib_send_lat -x 1 in
# vmB as its client: 200 round trips of 2 KiB SENDs (two packets each way at MTU 1024).
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server send-lat "-F -n 200 -s 2048"
softroce_perftest_ok send-lat 2048 200
