#!/bin/bash
# softroce against perftest: `softroce read-lat` (host side) as the client of ib_read_lat -x 1 in
# vmB: 200 RDMA READs of 4 KiB, one at a time. The server prints no table, as ib_read_lat's.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client read-lat "-F -n 200 -s 4096"
softroce_perftest_ok read-lat 4096 200
