#!/bin/bash
# softroce against rdma-core: `softroce uc-pingpong` (host side) as the client of
# ibv_uc_pingpong -g 1 in vmB. 2 KiB messages at path MTU 1024: UC SEND_FIRST and SEND_LAST,
# unacknowledged, so a single dropped packet would stall the run. softroce sleeps on its
# completion channel (-e).
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair client uc "-s 2048 -m 1024 -n 200" "-e"
softroce_pair_ok 2048 200
