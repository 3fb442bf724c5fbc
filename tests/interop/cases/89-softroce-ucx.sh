#!/bin/bash
# UCX against UCX: Debian's ucx_perftest (UCX 1.13) on the host side through softroce's
# libibverbs.so.1 (`softroce run`, which gives it /dev/infiniband) against the same ucx_perftest
# in vmB on kernel rxe, softroce as the client, then as the server, over UCX_TLS=rc (RC for the
# data, UD for UCX's wire-up): the tag-matching latency (eager sends), then 64 KiB messages,
# which UCX moves by rendezvous (RDMA READ of the sender's buffer). Both sides must exit 0 and
# the client print its result.
# vmB's UCX runs with UCX_UD_ETH_DGID_CHECK=n: kernel rxe reports 0 in a UD completion's sl,
# where UCX 1.13 reads the network header's type (ConnectX reports it, as softroce does), and
# without it UCX on rxe drops every datagram, softroce's or another rxe's (rxe's defect, not
# the case's).
# timeout: 600
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

SR_TIMEOUT=120
guest_ucx="env UCX_TLS=rc UCX_UD_ETH_DGID_CHECK=n ucx_perftest -p 18515"
host_ucx="env UCX_TLS=rc ucx_perftest -p 18515"

ucx_ok() {
  local test=$1 client=$G_OUT
  [ "$SR_ROLE" = client ] && client=$SR_OUT
  wirecheck_expect "softroce's side exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest's side exited $G_RC" [ "$G_RC" = 0 ]
  wirecheck_expect "the client printed no result" grep -q '^Final:' <<<"$client"
  echo "ok: ucx_perftest $test, softroce $SR_ROLE"
}

for test in "-t tag_lat -s 8 -n 500" "-t tag_bw -s 65536 -n 100"; do
  softroce_guest_pair client ucx "$guest_ucx" "$(sr_c_cmd "$host_ucx $test")" ""
  ucx_ok "$test"
  softroce_guest_pair server ucx "$guest_ucx $test" "$(sr_c_cmd "$host_ucx")" "tcp:18515"
  ucx_ok "$test"
done
