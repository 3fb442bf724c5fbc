#!/bin/bash
# softroce against librdmacm: `ucmatose` on kernel rxe in vmB (the client) against `softroce
# ucmatose` (host side, the server).
# RC connections made by RDMA-CM (two at once), 100 SENDs of 4 KiB each way on each (four packets
# at MTU 1024), the server sending first and ending both connections with DREQs; the client asks
# for no RNR retry, so its receives must be posted before it connects.
# Both sides must exit 0 and print exactly their tool's lines.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

cm_tool_pair server ucmatose 7471 "-c 2 -C 100 -S 4096"
cm_tool_ok ucmatose
