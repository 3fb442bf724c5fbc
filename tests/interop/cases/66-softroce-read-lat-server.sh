#!/bin/bash
# softroce against perftest: `softroce read-lat` (host side) as the server, ib_read_lat -x 1 in
# vmB as its client: softroce's responder answers 200 READs of 64 bytes; it waits in the closing
# round while the client times them.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server read-lat "-F -n 200 -s 64"
softroce_perftest_ok read-lat 64 200
