#!/bin/bash
# softroce against librdmacm: a DREP lost on its way to the kernel's CM. `softroce ucmatose`
# (host side, the client) against `ucmatose` on kernel rxe in vmB (the server), which ends both
# connections with DREQs and waits for their DISCONNECTED events (cmatose.c
# `disconnect_events`). An nftables rule in the lab's namespace drops the first DREP softroce
# sends. The kernel sends that DREQ again after the response time softroce's REQ announced
# (cm.c `cm_req_handler`: 2^(20-8) ms, about 4.1 s), long after the tool is done: the tool's
# device waits out that period before it exits (`Device::linger`) and answers it. Without the
# wait, the DREQ finds no one and the guest's ucmatose retries it for a minute.
# Both sides must exit 0 and print their tool's lines; softroce sent three DREPs, one dropped.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

TABLE=softroce_lab_lost_drep
drop_first_drep() {
  lab_ns_exec nft delete table inet "$TABLE" 2>/dev/null || true
  # In an IPv4 datagram the BTH's destination QP (1, the CM's) lies 32 bytes in (IP 20, UDP 8,
  # BTH's first 4), and the MAD's attribute ID (DREP, 0x0016) 64 bytes in (BTH 12, DETH 8,
  # then 16 bytes into the MAD header). The first DREP of every three is dropped.
  lab_ns_exec nft -f - <<NFT
table inet $TABLE {
  chain out {
    type filter hook output priority 0;
    meta nfproto ipv4 udp dport 4791 @nh,256,32 1 @nh,512,16 0x0016 numgen inc mod 3 0 counter drop
    meta nfproto ipv4 udp dport 4791 @nh,256,32 1 @nh,512,16 0x0016 counter
  }
}
NFT
}
trap 'lab_ns_exec nft delete table inet "$TABLE" 2>/dev/null || true' EXIT

# One DREP a datagram: with segmentation offload, DREPs sent in one turn would leave as one
# UDP_SEGMENT send, which netfilter sees, drops and counts as one packet.
SR_OPTS="$SR_OPTS --no-segmentation"
SR_PREPARE=drop_first_drep cm_tool_pair client ucmatose 7471 "-c 2 -C 10 -S 1000"
counters=$(lab_ns_exec nft list table inet "$TABLE" | grep -o 'packets [0-9]*' | awk '{print $2}' | xargs)
echo "---- DREPs softroce sent: dropped, passed: $counters"
cm_tool_ok ucmatose
read -r dropped passed <<<"$counters"
wirecheck_expect "no DREP was dropped: the case tested nothing" [ "$dropped" = 1 ]
wirecheck_expect "softroce did not answer the repeated DREQ ($passed DREPs passed, 2 expected)" [ "$passed" = 2 ]
echo "ok: the DREP that was lost was sent again, to the DREQ the kernel repeated"
