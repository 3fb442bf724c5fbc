#!/bin/bash
# softroce against librdmacm: `softroce rping -c` (host side, 10.99.0.1) against `rping -s` on
# kernel rxe in vmB, connected by RDMA-CM (REQ, REP, RTU on QP1). 20 pings of 4 KiB (a READ and
# a WRITE of four packets each at MTU 1024), checked by the client (-V); the client's DREQ ends
# it, and the guest's server prints its disconnect line.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

rping_pair client "-C 20 -S 4096 -V"
rping_ok 20
