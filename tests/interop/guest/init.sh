#!/bin/sh
# PID 1 of the lab guest (busybox sh). Brings up eth0 and rxe0, starts the command server on TCP
# 5000 and prints "RXEVM READY" (or "RXEVM FAILED: why") on the serial console, which the host
# watches. Parameters come from the kernel command line: rxevm.name=, rxevm.ip=ADDR/PREFIX and
# rxevm.ip6=ADDR/PREFIX (a unique local IPv6 address, which rxe makes a RoCE v2 GID of).
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm

fail() { echo "RXEVM FAILED: $*"; exec sh; }

IP=10.99.0.11/24; IP6=""; NAME=rxevm
for kv in $(cat /proc/cmdline); do
  case "$kv" in
    rxevm.ip=*) IP=${kv#rxevm.ip=};;
    rxevm.ip6=*) IP6=${kv#rxevm.ip6=};;
    rxevm.name=*) NAME=${kv#rxevm.name=};;
  esac
done
hostname "$NAME"
# verbs applications pin their buffers; the default 8 MiB memlock limit is too small for perftest
ulimit -l unlimited

modprobe virtio_pci && modprobe virtio_net || fail "virtio modules"
# rxe computes the ICRC through the crypto API's "crc32"; make sure an implementation is loaded
modprobe crc32_generic 2>/dev/null; modprobe crc32-pclmul 2>/dev/null
modprobe rdma_rxe || fail "modprobe rdma_rxe"
modprobe rdma_ucm || fail "modprobe rdma_ucm"     # RDMA-CM for rping
# netem + prio + u32: the lossy fixture drops only RoCE packets (UDP 4791) on one guest's eth0;
# ingress + mirred + gact + ifb: the matrix's loss cells also drop what comes in (lib.sh: guest_netem)
for m in sch_netem sch_prio cls_u32 sch_ingress act_mirred act_gact ifb; do modprobe $m 2>/dev/null; done

# No DAD: the IPv6 link-local address (RoCEv2 GID index 0) is usable at once, not after ~1 s.
echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad 2>/dev/null
echo 0 >/proc/sys/net/ipv6/conf/all/accept_dad 2>/dev/null
# No router solicitations (there is no router); keeps the wire quiet.
echo 0 >/proc/sys/net/ipv6/conf/default/router_solicitations 2>/dev/null
ip link set lo up
ip link set eth0 up || fail "eth0"
ip addr add "$IP" dev eth0 || fail "ip addr add $IP"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"

# wait (max ~5 s) for the RoCEv2 GIDs: index 0 = IPv6 link-local, index 1 = IPv4-mapped address
G=/sys/class/infiniband/rxe0/ports/1
i=0
until [ "$(cat $G/gid_attrs/types/1 2>/dev/null)" = "RoCE v2" ] && \
      [ "$(cat $G/gid_attrs/types/0 2>/dev/null)" = "RoCE v2" ]; do
  i=$((i+1)); [ $i -gt 50 ] && fail "no RoCE v2 GIDs on rxe0"; sleep 0.1
done
# The IPv6 address comes after rxe0, so that GIDs 0 and 1 stay where they are: rxe adds a RoCE
# v2 GID for it (index 2; case 10-rxe-gids checks which) once the address is up. No DAD on eth0
# (created before the "default" above was set; busybox ip has no "nodad"): usable at once.
if [ -n "$IP6" ]; then
  echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
  ip -6 addr add "$IP6" dev eth0 || fail "ip -6 addr add $IP6"
  i=0
  until [ "$(cat $G/gid_attrs/types/2 2>/dev/null)" = "RoCE v2" ]; do
    i=$((i+1)); [ $i -gt 50 ] && fail "no RoCE v2 GID for $IP6 on rxe0"; sleep 0.1
  done
fi
echo "=== rdma link"; rdma link
echo "=== GID table (index gid type)"
for g in $G/gids/*; do
  n=${g##*/}; v=$(cat "$g" 2>/dev/null)
  [ "$v" = "0000:0000:0000:0000:0000:0000:0000:0000" ] && continue
  echo "$n $v $(cat $G/gid_attrs/types/$n 2>/dev/null)"
done

# Command server for the host (see gexec.py): each connection to TCP 5000 gets a fresh shell.
( while true; do nc -ll -p 5000 -e /bin/sh; sleep 1; done ) >/dev/null 2>&1 &
echo "RXEVM READY name=$NAME ip=$IP ip6=${IP6:-none} uptime=$(cut -d' ' -f1 /proc/uptime)"
# keep a shell on the console for interactive debugging (QEMU monitor/serial), respawned forever
while true; do setsid cttyhack sh; sleep 1; done
