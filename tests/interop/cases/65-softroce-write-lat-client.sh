#!/bin/bash
# softroce against perftest: `softroce write-lat` (host side) as the client of ib_write_lat -x 1
# in vmB: 200 round trips of 64-byte RDMA WRITEs, each side polling the last byte of its buffer
# for the other's count; the server writes first.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client write-lat "-F -n 200 -s 64"
softroce_perftest_ok write-lat 64 200
