#!/bin/bash
# softroce against rdma-core: `softroce ud-pingpong` (host side) as the server, ibv_ud_pingpong
# -g 1 in vmB as its client: 512-byte UD SENDs with -c (softroce checks the guest's marks);
# softroce sleeps on its completion channel (-e).
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair server ud "-s 512 -n 200 -c" "-e"
softroce_pair_ok 512 200
