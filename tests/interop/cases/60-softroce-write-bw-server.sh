#!/bin/bash
# softroce against perftest: `softroce write-bw` (host side) as the server, ib_write_bw -x 1 in
# vmB as its client: 200 WRITEs of 4 KiB, a completion asked for every 100th, into softroce's
# buffer at addresses cycling through a page. softroce prints the report the client sends.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair server write-bw "-F -n 200 -s 4096"
softroce_perftest_ok write-bw 4096 200
