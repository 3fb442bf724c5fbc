#!/bin/bash
# softroce against rdma-core: `softroce uc-pingpong` (host side) as the server, ibv_uc_pingpong
# -g 1 in vmB as its client, 2 KiB messages at path MTU 1024 (two packets each way per message).
# softroce sends one datagram per packet (--no-segmentation), so every packet has IP ID 0.
# timeout: 180
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_pair server uc "-s 2048 -m 1024 -n 200" "--no-segmentation"
softroce_pair_ok 2048 200
