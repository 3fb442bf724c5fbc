#!/bin/bash
# softroce against perftest: `softroce write-bw` (host side, 10.99.0.1) as the client of
# ib_write_bw -x 1 in vmB, on two QPs: 64 KiB RDMA WRITEs (64 packets each at path MTU 1024),
# up to 50 in flight per QP, into the server's buffer. Both sides must exit 0 and print the
# header block, each other's GID and the table; the server's row is the report the client sent.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_perftest_pair client write-bw "-F -n 50 -q 2"
softroce_perftest_ok write-bw 65536 100
