#!/bin/bash
# softroce against rdma-core: `softroce rc-pingpong` (host side, 10.99.0.1) as the client of
# ibv_rc_pingpong -g 1 in vmB. 4 KiB messages at path MTU 1024, so every SEND is FIRST, MIDDLE,
# MIDDLE, LAST both ways, acknowledged by both transports; -c on both (the guest server checks
# the client's marks). softroce polls its CQ. Both sides must exit 0, print their result lines
# and each other's IPv4-mapped GID.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair client rc "-s 4096 -m 1024 -n 200 -c"
softroce_pair_ok 4096 200
