#!/bin/bash
# softroce against perftest: `softroce atomic-bw` (host side) as the client of ib_atomic_bw -x 1
# in vmB: 100 FETCH_AND_ADDs on addresses a cache line apart, each answered with an
# ATOMIC_ACKNOWLEDGE.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client atomic-bw "-F -n 100"
softroce_perftest_ok atomic-bw 8 100
