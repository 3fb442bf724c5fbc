#!/bin/bash
# softroce against rdma-core: `softroce ud-pingpong` (host side) as the client of
# ibv_ud_pingpong -g 1 in vmB. 1024-byte UD SENDs (vmB's port MTU; softroce's, on br0 at MTU
# 9000, is 4096) with Q_Key 0x11111111,
# to an address handle built from the peer's GID, received behind the 40-byte GRH area; -c on
# both (the guest server checks the client's marks).
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair client ud "-s 1024 -n 200 -c"
softroce_pair_ok 1024 200
