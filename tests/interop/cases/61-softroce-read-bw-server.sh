#!/bin/bash
# softroce against perftest: `softroce read-bw` (host side) as the server, ib_read_bw -x 1 in
# vmB as its client on two QPs: softroce's responder answers 16 KiB READs from both.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server read-bw "-F -n 50 -q 2 -s 16384"
softroce_perftest_ok read-bw 16384 100
