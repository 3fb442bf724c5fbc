#!/bin/bash
# softroce against librdmacm: `rping -c` on kernel rxe in vmB against `softroce rping -s` (host
# side), connected by RDMA-CM. 20 pings of 4 KiB checked by the guest's client (-V); its DREQ
# ends it, and softroce's server prints rping's disconnect lines.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

rping_pair server "-C 20 -S 4096 -V"
rping_ok 20
