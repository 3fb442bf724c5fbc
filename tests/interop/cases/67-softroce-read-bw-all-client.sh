#!/bin/bash
# softroce against perftest: `softroce read-bw -a` (host side) as the client of ib_read_bw -a -x 1
# in vmB: every size from 2 bytes to 8 MiB, 5 READs of each, so softroce READs from rxe messages
# of 1 to 8192 packets at MTU 1024, at most 5 outstanding (the TX depth -n 5 leaves). rxe answers the largest over
# seconds under TCG, and the requester must wait them out rather than ask again (the stale
# responses push its retry timer back, as rxe_comp.c does: see requester.rs). softroce prints a
# row per size; ib_read_bw prints the last, which softroce reports to it.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

SR_TIMEOUT=240
softroce_perftest_pair client read-bw "-F -a -n 5"
softroce_perftest_ok read-bw 8388608 5
rows=$(grep -cE '^ [0-9]+ +5 ' <<<"$SR_OUT" || true)
wirecheck_expect "a row per size from 2 B to 8 MiB in softroce's output (23; it printed $rows)" \
  [ "$rows" = 23 ]
