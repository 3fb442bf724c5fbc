#!/bin/bash
# softroce against perftest: `softroce atomic-bw` (host side) as the server, ib_atomic_bw -x 1
# in vmB as its client: softroce's responder executes 100 FETCH_AND_ADDs on its buffer.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server atomic-bw "-F -n 100"
softroce_perftest_ok atomic-bw 8 100
