# shellcheck shell=bash
# lib.sh: shared functions of the kernel-rxe interop lab. Sourced by run.sh, by every case in
# cases/*.sh and by fixtures.sh. It only defines variables and functions; nothing runs on source.
#
# Layout of the lab (everything lives in one network namespace that has no uplink):
#
#   netns $LAB_NS (no default route, no link to the host's network)
#     br0  10.99.0.1/24 fd99::1/64  <- host-side programs run here: lab_ns_exec CMD..., UDP 4791 free
#      |-- tap0 -- vmA eth0 10.99.0.11 fd99::11  rxe0: GID[0] fe80::...(RoCEv2) GID[1] ::ffff:10.99.0.11
#      |                                               GID[2] fd99::11
#      |-- tap1 -- vmB eth0 10.99.0.12 fd99::12  rxe0: GID[0] fe80::...(RoCEv2) GID[1] ::ffff:10.99.0.12
#      |                                               GID[2] fd99::12
#      |-- tap2    spare (up, enslaved, no guest) for a later third peer
#
# The guests run the stock Debian 12 kernel with rdma_rxe under QEMU/TCG; each one runs a busybox
# "nc -e sh" command server on TCP 5000 that gexec.py talks to.

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_REPO=$(cd "$LAB_DIR/../.." && pwd)
LAB_NS=${SOFTROCE_LAB_NS:-softroce-lab}
LAB_CACHE=${SOFTROCE_LAB_CACHE:-/var/cache/softroce-rxe-lab}
# State of the running lab: qemu/tcpdump pid files, console logs, case logs, staged fixtures.
# One fixed place (not a mktemp dir) so that a later run can find and remove a crashed run's leftovers.
LAB_RUN=$LAB_CACHE/run
LAB_PY=/usr/bin/python3          # Debian's python, not whatever python3 is first on $PATH
LAB_HOST_IP=10.99.0.1
VM_A=10.99.0.11                  # "client" guest by convention
VM_B=10.99.0.12                  # "server" guest by convention
# Unique local IPv6 addresses (fd99::/64, no route anywhere): rxe makes a RoCE v2 GID of each,
# which RoCE over IPv6 needs (the link-local GID 0 would need a scope on the host side).
LAB_HOST_IP6=fd99::1
VM_A6=fd99::11
VM_B6=fd99::12
LAB_GUESTS="vmA vmB"
# Bridge and taps run jumbo frames from the start: a guest then switches between rxe active_mtu
# 1024 (eth0 MTU 1500, the boot default) and 4096 (eth0 MTU 9000) without a reboot.
LAB_LINK_MTU=9000
LAB_MEM_MB=${SOFTROCE_LAB_MEM:-768}
# The guest's busybox ash runs its own applets in preference to $PATH (Debian's busybox-static is
# built that way), and busybox has a "tc" applet without netem: call iproute2's tc by full path.
GUEST_TC=/sbin/tc

# Packages the lab needs on the host (the guest initramfs is assembled from the host's files);
# tshark reads softroce's recordings in the matrix, as Wireshark would.
LAB_PACKAGES="qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils ibverbs-providers perftest
rdmacm-utils busybox-static iproute2 tcpdump cpio kmod python3 tshark nftables"

# ---------------------------------------------------------------------------------------------
# small helpers
log()  { printf '[lab %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die()  { printf '[lab %s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }
now()  { date +%s.%N; }
# elapsed T0 -> seconds since T0 with one decimal
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

guest_ip() {
  case $1 in vmA) echo "$VM_A";; vmB) echo "$VM_B";; *) die "unknown guest '$1'";; esac
}
guest_ip6() {
  case $1 in vmA) echo "$VM_A6";; vmB) echo "$VM_B6";; *) die "unknown guest '$1'";; esac
}

lab_ns_exists() { ip netns list | awk '{print $1}' | grep -qxF "$LAB_NS"; }

# lab_ns_exec CMD...: run a host-side command inside the lab namespace (it sees br0 and the guests).
lab_ns_exec() { ip netns exec "$LAB_NS" "$@"; }

# ---------------------------------------------------------------------------------------------
# host dependencies

lab_install_deps() {
  local missing=() p
  for p in $LAB_PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "host packages: all present, skipping apt"
    return 0
  fi
  log "host packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # An unreachable third-party source makes `apt-get update` fail although Debian's own lists
  # were refreshed: warn, and let the install decide.
  apt-get update -q >"$LAB_CACHE/apt.log" 2>&1 || log "apt-get update reported errors (see $LAB_CACHE/apt.log); trying the install anyway"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LAB_CACHE/apt.log" 2>&1 \
    || { tail -20 "$LAB_CACHE/apt.log" >&2; die "apt-get install failed (log: $LAB_CACHE/apt.log)"; }
}

# lab_kernel_version: the newest Debian kernel that has both /boot/vmlinuz-V and /lib/modules/V.
# (The host may run a different kernel; only the installed linux-image matters.)
lab_kernel_version() {
  local v best=""
  for v in $(ls /lib/modules 2>/dev/null | sort -V); do
    [ -f "/boot/vmlinuz-$v" ] && [ -f "/lib/modules/$v/modules.dep" ] && best=$v
  done
  [ -n "$best" ] || die "no kernel with /boot/vmlinuz-V and /lib/modules/V (is linux-image-amd64 installed?)"
  echo "$best"
}

# ---------------------------------------------------------------------------------------------
# guest build (vmlinux + initramfs), cached outside the clone

# lab_build_guest: sets LAB_KERNEL and LAB_INITRD. The cache key hashes the kernel version, the
# versions of the packages whose files go into the guest, and the contents of the build script
# and of the guest's init: change any of them and the guest is rebuilt.
lab_build_guest() {
  local kver key dir tmp t0 pkgver
  kver=$(lab_kernel_version)
  pkgver=$(dpkg-query -W -f '${Package}=${Version}\n' linux-image-"$kver" rdma-core ibverbs-utils \
           ibverbs-providers perftest rdmacm-utils busybox-static iproute2 tcpdump 2>/dev/null || true)
  key=$( { echo "kernel=$kver"; echo "$pkgver"; cat "$LAB_DIR/guest/build.sh" "$LAB_DIR/guest/init.sh"; } \
         | sha256sum | cut -c1-16)
  dir=$LAB_CACHE/guest-$key
  LAB_KERNEL=$dir/vmlinux
  LAB_INITRD=$dir/initramfs.cpio.gz
  LAB_GUEST_KEY=$key
  if [ -f "$dir/complete" ] && [ -f "$LAB_KERNEL" ] && [ -f "$LAB_INITRD" ]; then
    log "reusing cached guest build $key ($dir)"
    return 0
  fi
  t0=$(now)
  log "building guest $key for kernel $kver into $dir"
  tmp=$dir.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  bash "$LAB_DIR/guest/build.sh" "$kver" "$tmp" >"$LAB_CACHE/build.log" 2>&1 \
    || { tail -30 "$LAB_CACHE/build.log" >&2; rm -rf "$tmp"; die "guest build failed (log: $LAB_CACHE/build.log)"; }
  date -u +%FT%TZ >"$tmp/complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  # Keep the cache small: older guest builds are useless once a newer key has been built.
  find "$LAB_CACHE" -maxdepth 1 -name 'guest-*' ! -name "guest-$key" -exec rm -rf {} + 2>/dev/null || true
  log "guest build $key done in $(elapsed "$t0") s: $(du -sh "$dir" | cut -f1)"
}

# ---------------------------------------------------------------------------------------------
# network namespace

lab_net_up() {
  ip netns add "$LAB_NS" || die "cannot create netns $LAB_NS"
  local X="ip netns exec $LAB_NS" t
  $X ip link set lo up
  $X ip link add br0 type bridge stp_state 0 forward_delay 0
  $X ip link set br0 mtu "$LAB_LINK_MTU"
  for t in tap0 tap1 tap2; do
    $X ip tuntap add "$t" mode tap
    $X ip link set "$t" mtu "$LAB_LINK_MTU"
    $X ip link set "$t" master br0
    $X ip link set "$t" up
  done
  $X ip addr add "$LAB_HOST_IP/24" dev br0
  $X ip -6 addr add "$LAB_HOST_IP6/64" dev br0 nodad
  $X ip link set br0 up
  # No uplink and no default route: nothing in here can reach (or be reached from) the real network.
  if $X ip route show default | grep -q .; then die "netns $LAB_NS unexpectedly has a default route"; fi
}

# ---------------------------------------------------------------------------------------------
# guests

# lab_boot NAME TAP MAC: start one guest in the background; pid in $LAB_RUN/NAME.pid.
lab_boot() {
  local name=$1 tap=$2 mac=$3 ip ip6
  ip=$(guest_ip "$name") ip6=$(guest_ip6 "$name")
  now >"$LAB_RUN/$name.t0"
  # TCG, not KVM: the host's /dev/kvm (a nested/PVM hypervisor) runs a stock kernel extremely
  # slowly or not at all. The extracted ELF vmlinux boots through its PVH entry point, which
  # skips the in-guest XZ decompression (~11 s to ready instead of ~17 s under TCG).
  # Not -daemonize, which sends QEMU's own messages (e.g. a virtio device's "broken" reason) to
  # /dev/null: a session of its own, its output in NAME.qemu.log.
  rm -f "$LAB_RUN/$name.pid"
  setsid -f ip netns exec "$LAB_NS" qemu-system-x86_64 -name "$name" \
    -accel tcg -cpu max -m "$LAB_MEM_MB" -smp 1 -machine q35 \
    -nodefaults -display none -no-reboot \
    -kernel "$LAB_KERNEL" -initrd "$LAB_INITRD" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 rxevm.name=$name rxevm.ip=$ip/24 rxevm.ip6=$ip6/64" \
    -chardev "socket,id=con0,path=$LAB_RUN/$name.con,server=on,wait=off,logfile=$LAB_RUN/$name.console" \
    -serial chardev:con0 \
    -monitor "unix:$LAB_RUN/$name.mon,server=on,wait=off" \
    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$mac" \
    -pidfile "$LAB_RUN/$name.pid" </dev/null >"$LAB_RUN/$name.qemu.log" 2>&1 9>&- \
    || die "qemu failed to start $name"
  for _ in $(seq 1 100); do [ -s "$LAB_RUN/$name.pid" ] && break; sleep 0.1; done
  [ -s "$LAB_RUN/$name.pid" ] || { cat "$LAB_RUN/$name.qemu.log" >&2; die "qemu failed to start $name"; }
  log "started $name ($ip) qemu pid $(cat "$LAB_RUN/$name.pid")"
}

# lab_wait_ready NAME TIMEOUT: wait for "RXEVM READY" on the console and for the command server.
lab_wait_ready() {
  local name=$1 to=${2:-120} t0 pid deadline
  # (QEMU removes its pid file as it exits: a guest already gone has none)
  t0=$(cat "$LAB_RUN/$name.t0"); pid=$(cat "$LAB_RUN/$name.pid" 2>/dev/null || true)
  deadline=$(( $(date +%s) + to ))
  while ! grep -qa "RXEVM READY" "$LAB_RUN/$name.console" 2>/dev/null; do
    if grep -qa "RXEVM FAILED" "$LAB_RUN/$name.console" 2>/dev/null; then
      tail -40 "$LAB_RUN/$name.console" >&2; die "$name: guest init failed (see above)"
    fi
    { [ -n "$pid" ] && _alive "$pid"; } || { tail -40 "$LAB_RUN/$name.console" "$LAB_RUN/$name.qemu.log" >&2; die "$name: qemu died"; }
    [ "$(date +%s)" -lt "$deadline" ] || { tail -40 "$LAB_RUN/$name.console" >&2; die "$name: not ready after ${to}s"; }
    sleep 0.2
  done
  gexec "$name" 20 'echo ok' >/dev/null || die "$name: command server on TCP 5000 does not answer"
  log "$name ready after $(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s"
}

# guest_nic_state GUEST: what QEMU's monitor says of GUEST's virtio NIC and of its transmit
# queue (output.0, queue 1): whether the device is "broken" (QEMU gave up on it after a
# malformed request) and how far the guest and the device got in the ring.
guest_nic_state() {
  "$LAB_PY" - "$LAB_RUN/$1.mon" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
def reply():
    out = b""
    while not out.endswith(b"(qemu) "):
        d = s.recv(65536)
        if not d:
            break
        out += d
    # the monitor echoes each command with terminal escapes: keep only its answer
    return "\n".join(l for l in out.decode(errors="replace").splitlines()
                     if "\x1b" not in l and not l.startswith("(qemu)"))
reply()
dev = "/machine/peripheral-anon/device[0]/virtio-backend"
for cmd in ("info virtio-status " + dev, "info virtio-queue-status " + dev + " 1"):
    s.sendall(cmd.encode() + b"\n")
    print("(qemu) " + cmd)
    print(reply())
EOF
}

# gexec GUEST TIMEOUT SCRIPT: run a shell script in a guest (vmA/vmB or an IP), print its combined
# output, return its exit status. The guest kills the script after TIMEOUT s (exit 137) and the
# host gives up shortly after that (exit 124), so a hung command fails instead of hanging the run.
gexec() {
  local g=$1 to=$2 script=$3 ip
  case $g in vm*) ip=$(guest_ip "$g");; *) ip=$g;; esac
  ip netns exec "$LAB_NS" "$LAB_PY" "$LAB_DIR/gexec.py" -t "$to" "$ip" "$script"
}

# guest_bg GUEST TAG TIMEOUT SCRIPT: start SCRIPT in the background in the guest (e.g. a server);
# its output and exit status go to /tmp/bg.TAG.out in the guest. Collect with guest_wait_bg.
# Like gexec, SCRIPT gets its own session and a watchdog that kills the whole group after
# TIMEOUT s (status 137), so a hung server cannot outlive its case.
guest_bg() {
  local g=$1 tag=$2 to=$3 script=$4
  gexec "$g" 15 "rm -f /tmp/bg.$tag.sh /tmp/bg.$tag.out
cat >/tmp/bg.$tag.sh <<'__BG_EOF_7f3a__'
$script
__BG_EOF_7f3a__
(
  setsid sh /tmp/bg.$tag.sh </dev/null >/tmp/bg.$tag.out 2>&1 &
  p=\$!
  ( sleep $to; kill -KILL -\$p ) &
  w=\$!
  wait \$p; rc=\$?
  kill \$w
  printf '\\n__BG_RC=%s\\n' \$rc >>/tmp/bg.$tag.out
) </dev/null >/dev/null 2>&1 &
echo started" >/dev/null
}

# guest_wait_bg GUEST TAG TIMEOUT: wait for a guest_bg job to end, print its output, return its
# exit status (124 if it did not end within TIMEOUT s; the job itself is killed by its own timeout).
guest_wait_bg() {
  local g=$1 tag=$2 to=$3 out rc
  out=$(gexec "$g" $((to + 5)) "i=0
while ! grep -q '^__BG_RC=' /tmp/bg.$tag.out 2>/dev/null; do
  i=\$((i+1)); [ \$i -gt $((to * 5)) ] && { echo '__BG_RC=124'; break; }; sleep 0.2
done
cat /tmp/bg.$tag.out") || true
  rc=$(printf '%s\n' "$out" | sed -n 's/^__BG_RC=\([0-9]*\)$/\1/p' | tail -1)
  printf '%s\n' "$out" | grep -v '^__BG_RC='
  return "${rc:-125}"
}

# guest_wait_tcp_listen GUEST PORT TIMEOUT: wait until something in the guest listens on TCP PORT
# (IPv4 or IPv6 socket), e.g. the out-of-band exchange port of pingpong/perftest servers.
guest_wait_tcp_listen() {
  local g=$1 port=$2 to=$3 hex
  hex=$(printf '%04X' "$port")
  gexec "$g" $((to + 5)) "i=0
until grep -qiE ':$hex [0-9A-F:]+ 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
  i=\$((i+1)); [ \$i -gt $((to * 10)) ] && { echo 'nothing listens on TCP $port'; exit 1; }; sleep 0.1
done" >/dev/null
}

# lab_guest_fetch FILE DEST GUEST...: copies the host side's FILE to DEST in each GUEST, made
# executable: a web server on the host side for the guests' busybox wget (the guests have no
# other way in).
LAB_FETCH_PORT=8471
lab_guest_fetch() {
  local file=$1 dest=$2 pid g rc=0
  shift 2
  ip netns exec "$LAB_NS" "$LAB_PY" -m http.server "$LAB_FETCH_PORT" --bind "$LAB_HOST_IP" \
    --directory "$(dirname "$file")" >"$LAB_RUN/fetch-http.log" 2>&1 &
  pid=$!
  sleep 1
  for g in "$@"; do
    gexec "$g" 120 "set -e
mkdir -p $(dirname "$dest")
wget -q -O $dest http://$LAB_HOST_IP:$LAB_FETCH_PORT/$(basename "$file")
chmod +x $dest" || { echo "$g: cannot fetch $(basename "$file")" >&2; rc=1; }
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return $rc
}

# lab_guest_reset GUEST...: kill test programs a failed case may have left and remove netem,
# so each case starts from a clean guest.
LAB_TEST_PROGS="ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong ib_write_bw ib_read_bw
ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat rping udaddy ucmatose own_qp tcpdump"
lab_guest_reset() {
  local g
  for g in "$@"; do
    gexec "$g" 15 "killall -q -KILL $(echo $LAB_TEST_PROGS) 2>/dev/null
$GUEST_TC qdisc del dev eth0 root 2>/dev/null; $GUEST_TC qdisc del dev eth0 ingress 2>/dev/null
$GUEST_TC qdisc del dev ifb0 root 2>/dev/null; true" >/dev/null || return 1
  done
}

# guest_netem GUEST LOSS [SPARE]: LOSS % random loss, as on a lossy wire, of the RoCE
# packets (UDP port 4791) GUEST sends and of those it receives. Outgoing: a prio qdisc on eth0
# whose band 1:3 is netem, with u32 filters that put only RoCE into it (as fixtures.sh does), so
# the TCP of the command server and of the tools' exchanges is never lost. Incoming: eth0's
# ingress redirects RoCE to ifb0, whose root qdisc is the same netem. netem, not a tc drop
# action, on the way out: a drop there is reported to the sender (NET_XMIT_DROP), and rxe then
# sends the packet again at once (rxe_net.c rxe_send returns -EAGAIN, rxe_req.c retries), while
# netem's loss is silent. SPARE: "out" or "in" keeps the ACKs (BTH opcode 0x11, at offset 28
# of an IPv4 packet without options) that GUEST sends or receives off the lossy path;
# "dreq-out" the CM DREQs it sends.
# lab_guest_reset removes all of it.
guest_netem() {
  local g=$1 loss=$2 spare=${3:-} tc=$GUEST_TC ack="match ip dport 4791 0xffff match u8 0x11 0xff at 28"
  local out_ack="" in_ack=""
  # A CM DREQ (MAD attribute 0x0015) to QP1: BTH at 28, DETH at 40, the MAD's attribute ID at
  # 64 of an IPv4 datagram without options.
  local dreq="match ip dport 4791 0xffff match u16 0x0015 0xffff at 64"
  case $spare in
    out) out_ack="$tc filter add dev eth0 parent 1: protocol ip prio 1 u32 $ack flowid 1:2";;
    in) in_ack="$tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 $ack action pass";;
    dreq-out) out_ack="$tc filter add dev eth0 parent 1: protocol ip prio 1 u32 $dreq flowid 1:2";;
    "") ;;
    *) echo "guest_netem: SPARE is out, in or dreq-out, not '$spare'"; return 1;;
  esac
  gexec "$g" 15 "set -e
$tc qdisc add dev eth0 root handle 1: prio
$tc qdisc add dev eth0 parent 1:3 handle 30: netem loss $loss%
$out_ack
$tc filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip dport 4791 0xffff flowid 1:3
$tc filter add dev eth0 parent 1: protocol ipv6 prio 3 u32 match ip6 dport 4791 0xffff flowid 1:3
ip link set ifb0 up
$tc qdisc add dev ifb0 root handle 1: netem loss $loss%
$tc qdisc add dev eth0 handle ffff: ingress
$in_ack
$tc filter add dev eth0 parent ffff: protocol ip prio 2 u32 match ip dport 4791 0xffff action mirred egress redirect dev ifb0
$tc filter add dev eth0 parent ffff: protocol ipv6 prio 3 u32 match ip6 dport 4791 0xffff action mirred egress redirect dev ifb0
echo \"$g: netem loss $loss% on RoCE out of eth0 and into it (via ifb0)${spare:+, spared: $spare}\""
}

# guest_netem_stats GUEST: "OUT_SENT OUT_DROPPED IN_SENT IN_DROPPED", the packets GUEST's two
# netem qdiscs (guest_netem) passed and dropped.
guest_netem_stats() {
  gexec "$1" 15 "{ $GUEST_TC -s qdisc show dev eth0; $GUEST_TC -s qdisc show dev ifb0; } |
awk '/^qdisc netem/ { n = 1; next } n && /Sent/ { gsub(/[(,]/, \" \"); printf \"%s %s \", \$4, \$7; n = 0 }'"
}

# guest_gid_index GUEST ADDRESS: the index of rxe0's RoCE v2 GID for ADDRESS (IPv4 or IPv6).
guest_gid_index() {
  local want
  want=$(gid_exploded "$2")
  gexec "$1" 15 "G=/sys/class/infiniband/rxe0/ports/1
for f in \$G/gids/*; do
  n=\${f##*/}
  [ \"\$(cat \$f)\" = $want ] && [ \"\$(cat \$G/gid_attrs/types/\$n 2>/dev/null)\" = 'RoCE v2' ] && { echo \$n; exit 0; }
done
echo 'no RoCE v2 GID $want on rxe0' >&2; exit 1"
}

# gid_exploded ADDRESS: the GID of an address as sysfs shows it (an IPv4 address as its
# IPv4-mapped IPv6 form): eight groups of four hex digits.
gid_exploded() {
  "$LAB_PY" -c 'import ipaddress, sys
a = ipaddress.ip_address(sys.argv[1])
if a.version == 4: a = ipaddress.IPv6Address("::ffff:" + str(a))
print(a.exploded)' "$1"
}

# gid_text ADDRESS: the GID of an address as rdma-core's pingpong prints it (inet_ntop).
gid_text() {
  case $1 in
    *:*) "$LAB_PY" -c 'import ipaddress, sys; print(ipaddress.IPv6Address(sys.argv[1]))' "$1";;
    *) echo "::ffff:$1";;
  esac
}

# guest_burn_qpn GUEST: create (and destroy) one QP in GUEST. rxe hands out QP numbers in
# sequence, and two guests that ran the same programs would give both ends of every connection
# the same QPN (and so, as rxe derives it from the QPN, the same UDP source port). Captures are
# more useful when source and destination QPNs differ, so the fixtures burn one QPN in vmB first.
# ibv_rc_pingpong creates its QP before it listens on its TCP port: wait for the port, then kill.
guest_burn_qpn() {
  gexec "$1" 20 "ibv_rc_pingpong -d rxe0 -g 1 -p 18600 </dev/null >/dev/null 2>&1 &
p=\$!; i=0
until grep -qiE ':48A8 [0-9A-F:]+ 0A ' /proc/net/tcp /proc/net/tcp6; do
  i=\$((i+1)); [ \$i -gt 100 ] && { kill -KILL \$p; echo 'burner did not listen'; exit 1; }; sleep 0.1
done
kill -KILL \$p; wait \$p 2>/dev/null; true" >/dev/null
}

# guest_active_mtu GUEST: rxe0 port 1 active_mtu (1024, 4096, ...).
guest_active_mtu() {
  gexec "$1" 15 "ibv_devinfo -d rxe0 -i 1" | sed -n 's/.*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p'
}

# guest_set_mtu MTU(1024|4096) GUEST...: switch eth0 between 1500 and 9000 and wait until rxe
# follows (rxe listens for NETDEV_CHANGEMTU and recomputes active_mtu; no reboot needed).
guest_set_mtu() {
  local want=$1 eth g i; shift
  case $want in 1024) eth=1500;; 4096) eth=9000;; *) die "guest_set_mtu: unsupported $want";; esac
  for g in "$@"; do
    gexec "$g" 15 "ip link set eth0 mtu $eth" >/dev/null || return 1
    for i in $(seq 1 20); do
      [ "$(guest_active_mtu "$g")" = "$want" ] && continue 2
      sleep 0.2
    done
    echo "$g: rxe0 active_mtu is $(guest_active_mtu "$g"), want $want after eth0 mtu $eth" >&2
    return 1
  done
}

# ---------------------------------------------------------------------------------------------
# capture on the bridge

# lab_capture_start FILE COUNT FILTER: tcpdump on br0 inside the namespace, in the background.
# br0 sees every frame forwarded between the taps (a bridge passes forwarded frames to taps of the
# bridge device itself when it is promiscuous, which tcpdump makes it). -s 0: whole frames;
# --immediate-mode: hand each packet to tcpdump at once. Without it libpcap's TPACKET_V3 ring
# delivers packets in blocks, on a 1 s timeout, and packets still in the ring when tcpdump gets
# SIGINT are silently lost (seen: "41 packets received by filter, 0 packets captured" for a
# short rping run). -U: write each packet to the file at once. -Z root: Debian's tcpdump otherwise
# drops to user tcpdump, who cannot write into the root-owned run directory. The pid goes to
# $LAB_RUN/tcpdump.*.pid so the lab's cleanup can kill it if the case dies first.
lab_capture_start() {
  local file=$1 count=$2 filter=$3 i
  rm -f "$file" "$file.log"
  ip netns exec "$LAB_NS" tcpdump -i br0 -n -s 0 -U --immediate-mode -Z root -c "$count" -w "$file" "$filter" \
    >"$file.log" 2>&1 &
  LAB_CAPTURE_PID=$! LAB_CAPTURE_FILE=$file
  echo "$LAB_CAPTURE_PID" >"$LAB_RUN/tcpdump.$LAB_CAPTURE_PID.pid"
  for i in $(seq 1 50); do
    grep -q "listening on" "$file.log" 2>/dev/null && return 0
    kill -0 "$LAB_CAPTURE_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$file.log" >&2; return 1
}

# lab_capture_stop: give in-flight frames a moment, stop tcpdump (SIGINT flushes the file), and
# fail unless tcpdump wrote every packet its filter accepted and the kernel dropped none.
lab_capture_stop() {
  local pid=${LAB_CAPTURE_PID:-} file=${LAB_CAPTURE_FILE:-} i cap rcv drop
  [ -n "$pid" ] || return 0
  sleep 1
  kill -INT "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$LAB_RUN/tcpdump.$pid.pid"
  LAB_CAPTURE_PID=
  cap=$(sed -n 's/^\([0-9]*\) packets\{0,1\} captured$/\1/p' "$file.log")
  rcv=$(sed -n 's/^\([0-9]*\) packets\{0,1\} received by filter$/\1/p' "$file.log")
  drop=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel$/\1/p' "$file.log")
  if [ -z "$cap" ] || [ "$cap" != "$rcv" ] || [ "$drop" != 0 ]; then
    echo "capture incomplete: captured=${cap:-?} received=${rcv:-?} dropped=${drop:-?} ($file.log)"
    return 1
  fi
  echo "capture: $cap packets"
}

# pcap_count FILE: number of frames in a pcap file.
pcap_count() { "$LAB_PY" "$LAB_DIR/verify_icrc.py" --count "$1"; }

# ---------------------------------------------------------------------------------------------
# a two-sided run: server in vmB (background), client in vmA (foreground)

# run_pair TAG SERVER_CMD CLIENT_CMD [TIMEOUT] [LISTEN_PORT]: prints both outputs, returns 0 only if
# both sides exit 0. LISTEN_PORT: TCP port to wait for before starting the client (pingpong and
# perftest: 18515); "-" means just wait a fixed 2 s (rping: RDMA-CM listens, not TCP).
# A CLIENT_CMD that starts with "host:" runs on the host side of the lab (10.99.0.1) instead of
# in vmA: softroce as the client.
run_pair() {
  local tag=$1 scmd=$2 ccmd=$3 to=${4:-60} port=${5:-18515} crc=0 src=0
  guest_bg vmB "$tag" "$to" "$scmd" || { echo "cannot start server in vmB"; return 1; }
  if [ "$port" = "-" ]; then sleep 2
  else guest_wait_tcp_listen vmB "$port" 15 || { echo "server did not listen on $port:"; guest_wait_bg vmB "$tag" 1; return 1; }
  fi
  case $ccmd in
    host:*)
      echo "---- client (host side $LAB_HOST_IP): ${ccmd#host:}"
      lab_ns_exec timeout "$to" sh -c "${ccmd#host:}" 2>&1 || crc=$?;;
    *)
      echo "---- client (vmA $VM_A): $ccmd"
      gexec vmA "$to" "$ccmd" || crc=$?;;
  esac
  echo "---- client exit status $crc"
  echo "---- server (vmB $VM_B): $scmd"
  guest_wait_bg vmB "$tag" "$to" || src=$?
  echo "---- server exit status $src"
  [ "$crc" = 0 ] && [ "$src" = 0 ]
}

# ---------------------------------------------------------------------------------------------
# cleanup

# _alive PID: the process exists and is not a zombie (a killed qemu, started detached, is a
# zombie until init reaps it, and kill -0 still succeeds on it).
_alive() {
  local st
  st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# _recorded_pid PIDFILE COMM_PREFIX: print the pid recorded in PIDFILE if that process still is
# what we started (its comm starts with COMM_PREFIX): never a reused pid, never anything by name.
_recorded_pid() {
  local pid comm
  pid=$(cat "$1" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  [ -n "$comm" ] && [ "${comm#"$2"}" != "$comm" ] && echo "$pid"
  return 0
}

# lab_stop_guest NAME: stop one guest started by lab_boot (TERM, then KILL after 5 s), by its
# recorded pid, whose file goes once the process is gone. Fails if it survives.
lab_stop_guest() {
  local pid i
  pid=$(_recorded_pid "$LAB_RUN/$1.pid" qemu-system)
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do _alive "$pid" || break; sleep 0.1; done
    if _alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    for i in $(seq 1 30); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    if _alive "$pid"; then log "$1 (qemu pid $pid) is still running"; return 1; fi
    log "stopped $1 (qemu pid $pid)"
  fi
  rm -f "$LAB_RUN/$1.pid"
}

# lab_down: stop our captures and guests (by recorded pid: TERM, then KILL after 5 s), delete the
# namespace, and check that none of it is left. Returns non-zero if something survived.
lab_down() {
  local f pids="" pid i left=0 alive
  for f in "$LAB_RUN"/tcpdump.*.pid; do [ -e "$f" ] && pids="$pids $(_recorded_pid "$f" tcpdump)"; done
  for f in "$LAB_RUN"/vm*.pid; do [ -e "$f" ] && pids="$pids $(_recorded_pid "$f" qemu-system)"; done
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  for i in $(seq 1 50); do
    alive=""
    for pid in $pids; do _alive "$pid" && alive="$alive $pid"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in $alive; do log "pid $pid ignored SIGTERM, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; done
  # wait (max 3 s) for init to reap them too, so that a `pgrep qemu` right after shows nothing
  for i in $(seq 1 30); do
    alive=""
    for pid in $pids; do [ -e "/proc/$pid" ] && alive="$alive $pid"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in $pids; do
    if _alive "$pid"; then log "pid $pid still alive"; left=1; else log "stopped pid $pid"; fi
  done
  rm -f "$LAB_RUN"/tcpdump.*.pid "$LAB_RUN"/vm*.pid
  # Second sweep: anything still running inside our namespace was started by the lab (a pid file
  # may be gone, e.g. if the cache directory was removed under a --keep lab). `ip netns pids`
  # names exactly those processes; nothing else on the host is touched.
  if lab_ns_exists; then
    pids=$(ip netns pids "$LAB_NS" 2>/dev/null | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
      log "processes still inside netns $LAB_NS: $pids- stopping them"
      for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
      for i in $(seq 1 50); do [ -z "$(ip netns pids "$LAB_NS" 2>/dev/null)" ] && break; sleep 0.1; done
      for pid in $(ip netns pids "$LAB_NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      sleep 0.2
      [ -z "$(ip netns pids "$LAB_NS" 2>/dev/null)" ] || { log "processes left in netns $LAB_NS"; left=1; }
    fi
  fi
  if lab_ns_exists; then ip netns del "$LAB_NS" || left=1; fi
  if lab_ns_exists; then log "netns $LAB_NS still exists"; left=1; fi
  return $left
}

# ---------------------------------------------------------------------------------------------
# wirecheck: live checks of softroce's wire codec from the host side (cases/4*.sh)
#
# tests/interop/wirecheck is a small binary that speaks RoCEv2 to a guest tool's server in vmB
# through softroce's codec, as a scripted peer per check: `wirecheck --help` lists the checks, and
# README.md ("Live checks") says what each one proves.

WIRECHECK_DIR=$LAB_DIR/wirecheck
WIRECHECK=$WIRECHECK_DIR/target/release/wirecheck

# wirecheck_build: build wirecheck (a no-op when it is up to date). This runs outside the
# namespace, which has no uplink: on a machine with a cold cargo cache the build fetches crates.
wirecheck_build() {
  echo "---- building $WIRECHECK_DIR"
  cargo build --release --quiet --manifest-path "$WIRECHECK_DIR/Cargo.toml" \
    || { echo "cannot build wirecheck"; return 1; }
}

# wirecheck_case TAG SERVER_CMD CHECK ARGS...: one live check against a guest server. Builds
# wirecheck, resets vmB, starts SERVER_CMD there (guest_bg, killed after 60 s at the latest), waits
# for its out-of-band port TCP 18515, runs `wirecheck CHECK ARGS... --server $VM_B` in the
# namespace and collects the server. Prints both sides' output. Sets WC_RC (the check's exit
# status), SRV_OUT and SRV_RC (the server's output and exit status). If the check failed, the
# server is killed first instead of being waited for (it may still sit in accept()).
wirecheck_case() {
  local tag=$1 scmd=$2; shift 2
  wirecheck_build || return 1
  lab_guest_reset vmB || { echo "cannot reset vmB"; return 1; }
  guest_bg vmB "$tag" 60 "$scmd" || { echo "cannot start '$scmd' in vmB"; return 1; }
  if ! guest_wait_tcp_listen vmB 18515 15; then
    echo "'$scmd' does not listen on TCP 18515:"; guest_wait_bg vmB "$tag" 1; return 1
  fi
  echo "---- wirecheck $* --server $VM_B (in netns $LAB_NS)"
  WC_RC=0
  lab_ns_exec "$WIRECHECK" "$@" --server "$VM_B" || WC_RC=$?
  echo "---- wirecheck exit status $WC_RC"
  [ "$WC_RC" = 0 ] || lab_guest_reset vmB || true
  SRV_RC=0
  SRV_OUT=$(guest_wait_bg vmB "$tag" 30) || SRV_RC=$?
  echo "---- server (vmB): $scmd"
  printf '%s\n' "$SRV_OUT"
  echo "---- server exit status $SRV_RC"
}

# wirecheck_expect WHAT CONDITION...: fail the case with "FAIL: WHAT" unless CONDITION holds.
wirecheck_expect() {
  local what=$1; shift
  "$@" || { echo "FAIL: $what"; exit 1; }
}

# pingpong_result_ok OUTPUT SIZE ITERS: an ibv_*_pingpong printed both of its result lines
# ("2*SIZE*ITERS bytes in S seconds = X Mbit/sec", "ITERS iters in S seconds = X usec/iter").
pingpong_result_ok() {
  grep -qE "^$(($2 * $3 * 2)) bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" <<<"$1" &&
    grep -qE "^$3 iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" <<<"$1"
}

# perftest_report_ok OUTPUT SIZE ITERS: a perftest server printed its result line with the message
# size and iteration count the client reported at the end of the out-of-band exchange.
#
# A check that greps a variable reads it from a here-string, never from `printf ... | grep -q`:
# bash's printf writes a pipe a line at a time, `grep -q` leaves at its first match, and a
# line written after that kills printf with SIGPIPE, which `set -o pipefail` makes the check's
# failure (seen once in CI: case 63 failed on output whose result row was there).
perftest_report_ok() {
  grep -qE "^ $2 +$3 +[0-9.]+ +[0-9.]+[[:space:]]+[0-9.]+$" <<<"$1"
}

# ---------------------------------------------------------------------------------------------
# softroce's own tools against the guests' rdma-core tools (cases/5*.sh)
#
# `softroce rc-pingpong`, `uc-pingpong` and `ud-pingpong` run on the host side of the namespace as
# a softroce device on $LAB_HOST_IP (--bind), against ibv_*_pingpong -g 1 (rxe's IPv4-mapped GID)
# in vmB, in both roles. README.md ("softroce against rdma-core") lists the cases.

SOFTROCE_BIN=${SOFTROCE_LAB_BIN:-$LAB_REPO/target/release/softroce}

# The RoCE addresses of a softroce pair, which are the two GIDs: softroce's device (--bind) and
# vmB's address, whose rxe GID index the guest tool gets (-g, -x). The cases of cases/5*.sh and
# cases/6*.sh use these defaults (IPv4, GID index 1); the matrix's IPv6 cells change them
# (matrix.sh). The out-of-band TCP exchange always runs over IPv4, between $LAB_HOST_IP and $VM_B.
# SR_OPTS: more options for softroce (e.g. --backend raw). SR_TIMEOUT: the seconds each side
# may take. SR_PREPARE: a command run after vmB is reset (lab_guest_reset) and before the pair
# starts (the matrix's netem).
# SR_C: 1 puts Debian's own program (ibv_*_pingpong, perftest's ib_*, rping, ucmatose, udaddy) on
# the host side in place of softroce's tool of the same name, run unmodified through softroce's
# libibverbs.so.1 and librdmacm.so.1 (`softroce run`): the matrix's capi column.
SR_BIND=$LAB_HOST_IP SR_PEER=$VM_B SR_GID=1 SR_OPTS="" SR_PREPARE="" SR_TIMEOUT=90 SR_C=0

# softroce_build: build target/release/softroce and its C library once per lab run. It runs outside the namespace,
# which has no uplink (a cold cargo cache fetches crates), and only once, so that every case of a
# run uses the same binary even if the sources change meanwhile. With SOFTROCE_LAB_BIN set, that
# binary is used as it is, and nothing is built.
softroce_build() {
  [ -n "${SOFTROCE_LAB_BIN:-}" ] && { [ -x "$SOFTROCE_BIN" ] || { echo "no $SOFTROCE_BIN"; return 1; }; return 0; }
  [ -e "$LAB_RUN/softroce.built" ] && return 0
  echo "---- building $SOFTROCE_BIN and its C library (rdma/ beside it)"
  cargo build --release --quiet --manifest-path "$LAB_REPO/Cargo.toml" --bin softroce --bin softroce-rdma \
    || { echo "cannot build softroce"; return 1; }
  touch "$LAB_RUN/softroce.built"
}

# guest_rxe_counters GUEST: rxe0's non-zero hw_counters, one "name value" per line. rxe drops
# packets it rejects (a bad ICRC, addresses that do not match the QP's GIDs) without counting
# them, so a stall shows as packets sent by one side and not in the other's rcvd_pkts.
guest_rxe_counters() {
  gexec "$1" 15 'cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . * | sed -n "s/:\([1-9][0-9]*\)\$/ \1/p"'
}

# softroce_pair ROLE TOOL ARGS [SOFTROCE_ARGS]: one run of `softroce TOOL-pingpong` against
# ibv_TOOL_pingpong (TOOL: rc, uc or ud) in vmB, both with ARGS (rdma-core's syntax), the guest
# with -g $SR_GID, softroce with --bind $SR_BIND, $SR_OPTS and SOFTROCE_ARGS.
#   ROLE client: the guest tool is the server, softroce the client (connects to $VM_B);
#   ROLE server: softroce is the server, the guest tool the client (connects to $LAB_HOST_IP).
# Prints both sides' output and vmB's rxe counters before and after. Sets SR_OUT and SR_RC
# (softroce's output and exit status), G_OUT and G_RC (the guest tool's). When one side fails,
# the other is stopped at once instead of waited for.
softroce_pair() {
  local role=$1 tool=$2 args=$3 sargs=${4:-}
  # With --bind the server listens before it prints its local address line; rdma-core's prints
  # it first, so its server is ready once TCP 18515 listens. Its one GID is index 0.
  if [ "$SR_C" = 1 ]; then
    softroce_guest_pair "$role" "$tool" "ibv_${tool}_pingpong -d rxe0 -g $SR_GID $args" \
      "$(sr_c_cmd "ibv_${tool}_pingpong -g 0 $args $sargs")" tcp:18515
  else
    softroce_guest_pair "$role" "$tool" "ibv_${tool}_pingpong -d rxe0 -g $SR_GID $args" \
      "$SOFTROCE_BIN ${tool}-pingpong --bind $SR_BIND $SR_OPTS $args $sargs" 'local address'
  fi
}

# sr_c_cmd PROGRAM ARGS...: the host side's command line that runs PROGRAM unmodified through
# softroce's C library, its device on $SR_BIND, its port's MTU $SR_MTU (1024 unless set: the
# host side's br0 runs jumbo frames, so the link's would be 4096 where vmB's port has 1024, and
# a CM client names its port's MTU in its REQ), line-buffered (stdbuf -oL, an LD_PRELOAD that
# the C library does not mind), so that a server's ready line reaches its file as printed.
sr_c_cmd() { echo "$SOFTROCE_BIN run --addr $SR_BIND --mtu ${SR_MTU:-1024} -- stdbuf -oL $*"; }

# softroce_guest_pair ROLE TAG GUEST_CMD SOFTROCE_CMD READY: what softroce_pair and
# softroce_perftest_pair do, for any pair of tools with a TCP exchange on port 18515: the guest
# command in vmB (TAG names its job), softroce's on the host side, the server's side given by
# ROLE as in softroce_pair. A softroce server is ready for its client once its output has a
# line matching READY (grep). Also sets SR_ROLE to ROLE, and SR_CNT_BEFORE and SR_CNT_AFTER to
# vmB's rxe counters (guest_rxe_counters) before and after the pair.
softroce_guest_pair() {
  local role=$1 tag=$2 gcmd=$3 scmd=$4 ready=$5
  softroce_build || return 1
  lab_guest_reset vmB || { echo "cannot reset vmB"; return 1; }
  if [ -n "$SR_PREPARE" ]; then $SR_PREPARE || { echo "'$SR_PREPARE' failed"; return 1; }; fi
  SR_CNT_BEFORE=$(guest_rxe_counters vmB)
  echo "---- vmB rxe0 counters before"; printf '%s\n' "$SR_CNT_BEFORE"
  SR_RC=0 G_RC=0 SR_ROLE=$role
  case $role in
    client)
      guest_bg vmB "sr_$tag" "$SR_TIMEOUT" "$gcmd" || { echo "cannot start '$gcmd' in vmB"; return 1; }
      if ! guest_wait_tcp_listen vmB 18515 15; then
        echo "'$gcmd' does not listen on TCP 18515:"; guest_wait_bg vmB "sr_$tag" 1; return 1
      fi
      SR_OUT=$(lab_ns_exec timeout "$SR_TIMEOUT" $scmd "$VM_B" 2>&1) || SR_RC=$?
      [ "$SR_RC" = 0 ] || lab_guest_reset vmB || true
      G_OUT=$(guest_wait_bg vmB "sr_$tag" 30) || G_RC=$?
      gcmd="$gcmd (server)" scmd="$scmd $VM_B (client)"
      ;;
    server)
      sr_serve_guest_client "$scmd" "$ready" "$gcmd $LAB_HOST_IP" "$LAB_RUN/softroce-$tag-server.out"
      gcmd="$gcmd $LAB_HOST_IP (client)" scmd="$scmd (server)"
      ;;
    *) echo "softroce_guest_pair: ROLE is client or server, not '$role'"; return 1;;
  esac
  sr_pair_report "$scmd" "$gcmd"
}

# sr_serve_guest_client SOFTROCE_CMD READY GUEST_CMD OUT: SOFTROCE_CMD, softroce's server, in
# the background on the host side (its output in OUT) until it is ready (sr_ready READY OUT),
# then GUEST_CMD in vmB as its client; the server is stopped if the client failed. Each side is
# given $SR_TIMEOUT seconds. Sets SR_OUT/SR_RC and G_OUT/G_RC.
sr_serve_guest_client() {
  local scmd=$1 ready=$2 gcmd=$3 out=$4 pid i
  # `ip netns exec` execs timeout, so $! is its PID, and a TERM to it reaches the server
  # (lab_ns_exec, a function, would run in a subshell of its own).
  ip netns exec "$LAB_NS" timeout "$SR_TIMEOUT" $scmd >"$out" 2>&1 &
  pid=$!
  for i in $(seq 1 100); do
    sr_ready "$ready" "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  G_OUT=$(gexec vmB "$SR_TIMEOUT" "$gcmd") || G_RC=$?
  [ "$G_RC" = 0 ] || kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || SR_RC=$?
  SR_OUT=$(cat "$out")
}

# sr_ready READY OUT: a host-side server is ready: READY is tcp:PORT and something listens on
# TCP PORT in the namespace, or a line of its output OUT matches READY (grep).
sr_ready() {
  case $1 in
    tcp:*) [ -n "$(lab_ns_exec ss -Hltn "sport = :${1#tcp:}")" ];;
    *) grep -q "$1" "$2";;
  esac
}

# sr_pair_report SOFTROCE_CMD GUEST_CMD: prints both sides of the last pair, their exit
# statuses and vmB's rxe counters after it (SR_CNT_AFTER).
sr_pair_report() {
  echo "---- softroce (host side, $SR_BIND): $1"
  printf '%s\n' "$SR_OUT"
  echo "---- softroce exit status $SR_RC"
  echo "---- vmB: $2"
  printf '%s\n' "$G_OUT"
  echo "---- vmB exit status $G_RC"
  SR_CNT_AFTER=$(guest_rxe_counters vmB)
  echo "---- vmB rxe0 counters after"; printf '%s\n' "$SR_CNT_AFTER"
}

# softroce_pair_ok SIZE ITERS: the last softroce_pair passed: both sides exited 0 and printed
# their result lines for SIZE and ITERS, each printed the other's GID ($SR_PEER's and $SR_BIND's)
# as the remote one, and neither found a page without the client's mark (-c).
softroce_pair_ok() {
  local peer_gid host_gid
  peer_gid=$(gid_text "$SR_PEER") host_gid=$(gid_text "$SR_BIND")
  wirecheck_expect "softroce exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest tool exited $G_RC" [ "$G_RC" = 0 ]
  wirecheck_expect "softroce did not print its result lines" pingpong_result_ok "$SR_OUT" "$1" "$2"
  wirecheck_expect "the guest tool did not print its result lines" pingpong_result_ok "$G_OUT" "$1" "$2"
  wirecheck_expect "softroce's remote GID is not vmB's ($peer_gid)" \
    grep -qE "^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID $peer_gid\$" <<<"$SR_OUT"
  wirecheck_expect "vmB's remote GID is not softroce's ($host_gid)" \
    grep -qE "^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID $host_gid\$" <<<"$G_OUT"
  wirecheck_expect "a page without the client's mark (-c)" _no_invalid_data "$SR_OUT$G_OUT"
  echo "ok: softroce $(printf '%s\n' "$SR_OUT" | grep 'usec/iter'); vmB $(printf '%s\n' "$G_OUT" | grep 'usec/iter')"
}

_no_invalid_data() { ! grep -q 'invalid data' <<<"$1"; }

# ---------------------------------------------------------------------------------------------
# softroce's perftest tools against perftest in the guests (cases/6*.sh)
#
# `softroce write-bw`, `read-bw`, `send-bw`, `atomic-bw`, `send-lat`, `write-lat` and `read-lat`
# run on the host side as a softroce device on $LAB_HOST_IP (--bind) against perftest's ib_*_bw
# and ib_*_lat -x 1 (rxe's IPv4-mapped GID) in vmB, in both roles. README.md ("softroce against
# perftest") lists the cases.

# softroce_perftest_pair ROLE TEST ARGS [SOFTROCE_ARGS]: one run of `softroce TEST` (write-bw,
# ..., read-lat) against perftest's ib_TEST (ib_write_bw, ..., ib_read_lat) in vmB, both with
# ARGS (perftest's syntax) and -x $SR_GID, softroce also with --bind $SR_BIND, $SR_OPTS and
# SOFTROCE_ARGS.
# ROLE, the output and the variables set are softroce_pair's. A softroce server is ready once it
# prints perftest's "Waiting for client to connect" banner, which it does once it listens.
softroce_perftest_pair() {
  local role=$1 test=$2 args=$3 sargs=${4:-}
  if [ "$SR_C" = 1 ]; then
    softroce_guest_pair "$role" "${test//-/_}" "ib_${test//-/_} -d rxe0 -x $SR_GID $args" \
      "$(sr_c_cmd "ib_${test//-/_} -x 0 $args $sargs")" tcp:18515
  else
    softroce_guest_pair "$role" "${test//-/_}" "ib_${test//-/_} -d rxe0 -x $SR_GID $args" \
      "$SOFTROCE_BIN $test --bind $SR_BIND -x $SR_GID $SR_OPTS $args $sargs" 'Waiting for client to connect'
  fi
}

# perftest_gid_line ADDRESS: the GID line perftest prints for ADDRESS's GID (IPv4-mapped for an
# IPv4 address), its 16 bytes in "%02d".
perftest_gid_line() {
  "$LAB_PY" -c 'import ipaddress, sys
a = ipaddress.ip_address(sys.argv[1])
if a.version == 4: a = ipaddress.IPv6Address("::ffff:" + str(a))
print(" GID: " + ":".join("%02d" % b for b in a.packed))' "$1"
}

# perftest_side_ok OUTPUT TEST SIZE ITERS ROLE PEER: the output of one side (softroce's or
# perftest's, in ROLE server or client) of TEST has the test's header block, the PEER address's
# GID as the remote one, and the result table that side prints with a row for SIZE and ITERS:
# both sides of the bandwidth tests (the servers of ib_write_bw, ib_read_bw and ib_atomic_bw
# print the client's report) and of the latency tests, except the server of ib_read_lat, which
# prints no table. (perftest prints a standard deviation of "-nan" for some runs: seen with one
# 72 ms sample, a retransmission, among 500 of 150-330 us in a loss cell.)
perftest_side_ok() {
  local out=$1 test=$2 size=$3 iters=$4 role=$5 peer=$6 title
  case $test in
    write-bw) title="RDMA_Write BW Test";;
    read-bw) title="RDMA_Read BW Test";;
    send-bw) title="Send BW Test";;
    atomic-bw) title="Atomic FETCH_AND_ADD BW Test";;
    write-lat) title="RDMA_Write Latency Test";;
    read-lat) title="RDMA_Read Latency Test";;
    send-lat) title="Send Latency Test";;
    *) echo "perftest_side_ok: unknown test '$test'"; return 1;;
  esac
  grep -qxF "                    $title" <<<"$out" || { echo "no header block for $title"; return 1; }
  grep -A1 '^ remote address: LID 0000 QPN 0x' <<<"$out" | grep -qxF "$(perftest_gid_line "$peer")" \
    || { echo "no remote address with the GID of $peer"; return 1; }
  if [ "$test" = read-lat ] && [ "$role" = server ]; then return 0; fi
  case $test in
    *-bw)
      grep -qxF ' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]' <<<"$out" &&
        perftest_report_ok "$out" "$size" "$iters";;
    *-lat)
      grep -qF ' #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]' <<<"$out" &&
        grep -qE "^ $size +$iters([[:space:]]+([0-9.]+|-?nan|inf)){7}[[:space:]]*\$" <<<"$out";;
  esac || { echo "no result table with a row for $size bytes x $iters"; return 1; }
}

# softroce_perftest_ok TEST SIZE ITERS: the last softroce_perftest_pair passed: both sides
# exited 0, and each printed TEST's header block, the other's GID as the remote one, and its
# result table with a row for SIZE and ITERS (perftest_side_ok).
softroce_perftest_ok() {
  local test=$1 size=$2 iters=$3 g_role=server
  [ "$SR_ROLE" = server ] && g_role=client
  wirecheck_expect "softroce exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest tool exited $G_RC" [ "$G_RC" = 0 ]
  wirecheck_expect "softroce's output (above)" \
    perftest_side_ok "$SR_OUT" "$test" "$size" "$iters" "$SR_ROLE" "$SR_PEER"
  wirecheck_expect "the guest tool's output (above)" \
    perftest_side_ok "$G_OUT" "$test" "$size" "$iters" "$g_role" "$SR_BIND"
  echo "ok: $test, softroce $SR_ROLE and ib_${test//-/_} $g_role: $size bytes x $iters"
}
