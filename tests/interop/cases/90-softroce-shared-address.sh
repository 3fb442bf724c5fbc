#!/bin/bash
# Many processes on one address (issue 51): Debian's programs on the host side through softroce's
# C library (`softroce run`), three processes at once with their devices on the one address
# 10.99.0.1, against the same programs on kernel rxe in the guests, every pair at the same time.
# Round 1, softroce as the clients: vmB runs two ib_write_bw servers (TCP 18515 and 18516) and an
# rping server (RDMA-CM port 7190), three processes on its one rxe device; the host side runs
# their three clients at once.
# Round 2, softroce as the servers: the host side runs two ib_write_bw servers and an rping
# server at once; vmA runs the first ib_write_bw client, vmB the second and the rping client.
# Each perftest side must exit 0 with its header, the other's GID and its report row (100
# WRITEs of 64 KiB); each rping side must exit 0 with its 20 pings of 4 KiB checked (-V).
# Before issue 51 the second host process on 10.99.0.1 failed to open its device (EADDRINUSE on
# UDP 4791).
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

softroce_build || exit 1
lab_guest_reset vmA vmB || die "cannot reset the guests"

BW_ARGS="-F -n 100 -s 65536"
PINGS=20
RPING_ARGS="-C $PINGS -S 4096 -V -v"
CM_PORT=7190
fails=0

# host_bg NAME CMD...: CMD on the host side of the namespace, in the background, within
# $SR_TIMEOUT s, its output in $LAB_RUN/shared-NAME.out. host_wait NAME collects it.
declare -A HOST_PID=()
host_bg() {
  local name=$1; shift
  # `ip netns exec` execs timeout, so $! is its PID, and a TERM to it reaches the program.
  ip netns exec "$LAB_NS" timeout "$SR_TIMEOUT" "$@" >"$LAB_RUN/shared-$name.out" 2>&1 &
  HOST_PID[$name]=$!
}
# host_wait NAME: waits for host_bg's NAME (in this shell: a subshell cannot wait for it); sets
# H_RC and H_OUT.
host_wait() {
  H_RC=0
  wait "${HOST_PID[$1]}" || H_RC=$?
  unset "HOST_PID[$1]"
  H_OUT=$(cat "$LAB_RUN/shared-$1.out")
}
# Whatever happens, no host-side program outlives the case holding 10.99.0.1's ports.
stop_hosts() {
  local pid
  for pid in "${HOST_PID[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap stop_hosts EXIT

# expect WHAT CMD...: counts a failure ("FAIL: WHAT") unless CMD holds; the case goes on, so that
# its log shows every pair.
expect() {
  local what=$1; shift
  "$@" || { echo "FAIL: $what"; fails=$((fails + 1)); }
}

# show WHO RC OUTPUT
show() { echo "---- $1 (exit $2)"; printf '%s\n' "$3"; }

# perftest_pair_ok WHAT RC OUT ROLE PEER: one perftest side exited 0 with its header, PEER's
# GID as the remote one and its report row (perftest_side_ok).
perftest_pair_ok() {
  show "$1" "$2" "$3"
  expect "$1 exited $2" [ "$2" = 0 ]
  expect "$1's output (above)" perftest_side_ok "$3" write-bw 65536 100 "$4" "$5"
}

# rping_side_ok WHAT RC OUT LINE: one rping side exited 0 with $PINGS lines of rping's text
# starting with LINE ("ping data: " for the client, "server ping data: " for the server).
rping_side_ok() {
  show "$1" "$2" "$3"
  expect "$1 exited $2" [ "$2" = 0 ]
  expect "$1 printed $(grep -c "^$4" <<<"$3") ping lines, not $PINGS" \
    [ "$(grep -cE "^$4rdma-ping-[0-9]+: [A-z]+" <<<"$3")" = "$PINGS" ]
}

echo "== round 1: three servers in vmB, their three clients on the host side on $LAB_HOST_IP at once"
guest_bg vmB sa_bw1 "$SR_TIMEOUT" "ib_write_bw -d rxe0 -x 1 $BW_ARGS -p 18515"
guest_bg vmB sa_bw2 "$SR_TIMEOUT" "ib_write_bw -d rxe0 -x 1 $BW_ARGS -p 18516"
guest_bg vmB sa_rp "$SR_TIMEOUT" "rping -s -a $VM_B -p $CM_PORT $RPING_ARGS"
guest_wait_tcp_listen vmB 18515 15 || die "vmB's first ib_write_bw does not listen"
guest_wait_tcp_listen vmB 18516 15 || die "vmB's second ib_write_bw does not listen"
guest_wait_cm_listen vmB "$CM_PORT" 15 || die "vmB's rping does not listen"
# shellcheck disable=SC2046 # sr_c_cmd's words
{
  host_bg c_bw1 $(sr_c_cmd "ib_write_bw -x 0 $BW_ARGS -p 18515") "$VM_B"
  host_bg c_bw2 $(sr_c_cmd "ib_write_bw -x 0 $BW_ARGS -p 18516") "$VM_B"
  host_bg c_rp $(sr_c_cmd "rping -c -a $VM_B -I $LAB_HOST_IP -p $CM_PORT $RPING_ARGS")
}
host_wait c_bw1; perftest_pair_ok "host ib_write_bw client of 18515" "$H_RC" "$H_OUT" client "$VM_B"
host_wait c_bw2; perftest_pair_ok "host ib_write_bw client of 18516" "$H_RC" "$H_OUT" client "$VM_B"
host_wait c_rp; rping_side_ok "host rping client" "$H_RC" "$H_OUT" "ping data: "
for job in sa_bw1:18515 sa_bw2:18516; do
  rc=0; o=$(guest_wait_bg vmB "${job%%:*}" 30) || rc=$?
  perftest_pair_ok "vmB ib_write_bw server on ${job#*:}" "$rc" "$o" server "$LAB_HOST_IP"
done
rc=0; o=$(guest_wait_bg vmB sa_rp 30) || rc=$?
rping_side_ok "vmB rping server" "$rc" "$o" "server ping data: "

lab_guest_reset vmA vmB || die "cannot reset the guests"

echo "== round 2: three servers on the host side on $LAB_HOST_IP, their clients in vmA and vmB at once"
# shellcheck disable=SC2046 # sr_c_cmd's words
{
  host_bg s_bw1 $(sr_c_cmd "ib_write_bw -x 0 $BW_ARGS -p 18515")
  host_bg s_bw2 $(sr_c_cmd "ib_write_bw -x 0 $BW_ARGS -p 18516")
  host_bg s_rp $(sr_c_cmd "rping -s -a $LAB_HOST_IP -p $CM_PORT -d $RPING_ARGS")
}
for i in $(seq 1 150); do
  sr_ready tcp:18515 && sr_ready tcp:18516 && sr_ready '^rdma_listen$' "$LAB_RUN/shared-s_rp.out" && break
  sleep 0.1
done
sr_ready tcp:18515 && sr_ready tcp:18516 && sr_ready '^rdma_listen$' "$LAB_RUN/shared-s_rp.out" || {
  for s in s_bw1 s_bw2 s_rp; do echo "---- $s"; cat "$LAB_RUN/shared-$s.out"; done
  die "the host side's servers are not all ready"
}
guest_bg vmA sa_bw1 "$SR_TIMEOUT" "ib_write_bw -d rxe0 -x 1 $BW_ARGS -p 18515 $LAB_HOST_IP"
guest_bg vmB sa_bw2 "$SR_TIMEOUT" "ib_write_bw -d rxe0 -x 1 $BW_ARGS -p 18516 $LAB_HOST_IP"
guest_bg vmB sa_rp "$SR_TIMEOUT" "rping -c -a $LAB_HOST_IP -p $CM_PORT $RPING_ARGS"
rc=0; o=$(guest_wait_bg vmA sa_bw1 "$SR_TIMEOUT") || rc=$?
perftest_pair_ok "vmA ib_write_bw client of 18515" "$rc" "$o" client "$LAB_HOST_IP"
rc=0; o=$(guest_wait_bg vmB sa_bw2 "$SR_TIMEOUT") || rc=$?
perftest_pair_ok "vmB ib_write_bw client of 18516" "$rc" "$o" client "$LAB_HOST_IP"
rc=0; o=$(guest_wait_bg vmB sa_rp "$SR_TIMEOUT") || rc=$?
rping_side_ok "vmB rping client" "$rc" "$o" "ping data: "
# A server whose client failed would wait for ever: stop them all before collecting them.
[ "$fails" = 0 ] || stop_hosts
host_wait s_bw1; perftest_pair_ok "host ib_write_bw server on 18515" "$H_RC" "$H_OUT" server "$VM_A"
host_wait s_bw2; perftest_pair_ok "host ib_write_bw server on 18516" "$H_RC" "$H_OUT" server "$VM_B"
host_wait s_rp; rping_side_ok "host rping server" "$H_RC" "$H_OUT" "server ping data: "

trap - EXIT
[ "$fails" = 0 ] && echo "ok: two ib_write_bw and an rping at once, three host processes on $LAB_HOST_IP, in both roles"
[ "$fails" = 0 ]
