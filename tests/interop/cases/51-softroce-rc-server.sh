#!/bin/bash
# softroce against rdma-core: `softroce rc-pingpong` (host side) as the server, ibv_rc_pingpong
# -g 1 in vmB as its client. 4 KiB messages at path MTU 1024 with -c (softroce checks the guest's
# marks); softroce sleeps on its completion channel (-e). Both sides must exit 0, print their
# result lines and each other's IPv4-mapped GID.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair server rc "-s 4096 -m 1024 -n 200 -c" "-e"
softroce_pair_ok 4096 200
