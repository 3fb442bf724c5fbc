#!/bin/bash
# softroce against perftest: `softroce send-lat` (host side) as the client of ib_send_lat -x 1 in
# vmB: 200 round trips of one 64-byte SEND each way, the client first. Both sides time them.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client send-lat "-F -n 200 -s 64"
softroce_perftest_ok send-lat 64 200
