#!/bin/bash
# Lab self-test: both guests have rxe0 on eth0, port ACTIVE at MTU 1024, and the three RoCEv2 GIDs
# the other cases rely on: index 0 = IPv6 link-local (fe80::/64), index 1 = IPv4-mapped address,
# index 2 = the guest's unique local IPv6 address (fd99::11, fd99::12: the matrix's IPv6 cells).
# timeout: 60
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

for g in $LAB_GUESTS; do
  ip=$(guest_ip "$g")
  out=$(gexec "$g" 20 'rdma link show rxe0/1
ibv_devinfo -d rxe0 -i 1
G=/sys/class/infiniband/rxe0/ports/1
for i in 0 1 2; do echo "gid$i $(cat $G/gids/$i) $(cat $G/gid_attrs/types/$i) $(cat $G/gid_attrs/ndevs/$i)"; done')
  echo "== $g"; echo "$out"
  # e.g. "link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0"
  grep -qE '^link rxe0/1 state ACTIVE .*netdev eth0' <<<"$out" || { echo "$g: rxe0 not ACTIVE on eth0"; exit 1; }
  grep -qE 'state:[[:space:]]+PORT_ACTIVE' <<<"$out" || { echo "$g: port 1 not PORT_ACTIVE"; exit 1; }
  grep -qE 'active_mtu:[[:space:]]+1024' <<<"$out" || { echo "$g: active_mtu is not 1024"; exit 1; }
  # ::ffff:10.99.0.11 -> 0000:0000:0000:0000:0000:ffff:0a63:000b
  mapped=$(echo "$ip" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
  grep -qx "gid1 $mapped RoCE v2 eth0" <<<"$out" || { echo "$g: GID 1 is not $mapped RoCE v2 on eth0"; exit 1; }
  ula=$(gid_exploded "$(guest_ip6 "$g")")
  grep -qx "gid2 $ula RoCE v2 eth0" <<<"$out" || { echo "$g: GID 2 is not $ula RoCE v2 on eth0"; exit 1; }
  grep -qE '^gid0 fe80:0000:0000:0000:[0-9a-f:]{19} RoCE v2 eth0$' <<<"$out" \
    || { echo "$g: GID 0 is not an fe80:: RoCE v2 GID on eth0"; exit 1; }
done
echo "both guests: rxe0 ACTIVE, MTU 1024, GID0 link-local, GID1 IPv4-mapped, GID2 fd99:: (all RoCEv2)"
