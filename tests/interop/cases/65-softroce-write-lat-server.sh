#!/bin/bash
# softroce against perftest: `softroce write-lat` (host side) as the server, ib_write_lat -x 1
# in vmB as its client: 200 round trips of 1500-byte RDMA WRITEs (FIRST and LAST at MTU 1024).
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server write-lat "-F -n 200 -s 1500"
softroce_perftest_ok write-lat 1500 200
