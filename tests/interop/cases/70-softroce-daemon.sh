#!/bin/bash
# softroce daemon against rdma-core and perftest on kernel rxe: `softroce daemon` (host side)
# serves rc-pingpong on TCP 18515 and write-bw on 18516, and on RDMA-CM rping on port 7174
# and write-bw -R on 18517 (control and two data connections each). Several clients at once: vmA runs
# ibv_rc_pingpong while vmB runs ib_write_bw. One after another: vmB runs ibv_rc_pingpong twice.
# One vanishes: vmA's ib_write_bw of 10^5 WRITEs (far more than it can send in the 3 s it is
# given; a write-bw server does not count them) is killed mid-transfer. Then the daemon's
# counters (SIGUSR1) must show every session accounted for, none running, and no QP, CQ, region
# or address handle left; SIGTERM must end it with status 0.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

softroce_build
lab_guest_reset vmA
lab_guest_reset vmB
out=$LAB_RUN/softroce-daemon.out err=$LAB_RUN/softroce-daemon.err
# `ip netns exec` execs the daemon, so $! is the daemon's own PID, for the signals below.
ip netns exec "$LAB_NS" "$SOFTROCE_BIN" daemon --bind "$LAB_HOST_IP" --idle-timeout 10 \
  --serve 'rc-pingpong -p 18515 -s 4096 -n 200' --serve 'write-bw -p 18516 -s 65536 -n 200' \
  --serve 'rping -s -p 7174 -S 4096' --serve 'write-bw -R -p 18517 -s 16384 -n 200 -q 2 -m 1024' \
  >"$out" 2>"$err" &
daemon=$!
# Whatever happens, no daemon outlives the case: it would hold 10.99.0.1:4791 and TCP 18515.
stop_daemon() {
  kill -TERM "$daemon" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$daemon" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$daemon" 2>/dev/null || true
}
trap stop_daemon EXIT
for _ in $(seq 1 100); do grep -q ' ready$' "$err" && break; sleep 0.1; done
grep -q ' ready$' "$err" || { cat "$err"; die "the daemon did not start"; }

pingpong="ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 200 $LAB_HOST_IP"
write_bw="ib_write_bw -d rxe0 -x 1 -F -p 18516 -s 65536 -n 200 $LAB_HOST_IP"
fails=0
check() { # WHAT RC OUTPUT: a client must exit 0 with its result lines
  echo "---- $1 (exit $2)"; printf '%s\n' "$3"
  if [ "$2" != 0 ] || ! grep -qE '^[0-9]+ iters in|^ 65536 +200 ' <<<"$3"; then
    echo "FAIL: $1"; fails=$((fails + 1))
  fi
}

echo "== two clients at once: vmA rc-pingpong, vmB write-bw"
guest_bg vmA pp "$SR_TIMEOUT" "$pingpong"
guest_bg vmB wb "$SR_TIMEOUT" "$write_bw"
rc=0; o=$(guest_wait_bg vmA pp 120) || rc=$?; check "vmA $pingpong" "$rc" "$o"
rc=0; o=$(guest_wait_bg vmB wb 120) || rc=$?; check "vmB $write_bw" "$rc" "$o"

echo "== one after another: vmB rc-pingpong twice"
for k in 1 2; do
  rc=0; o=$(gexec vmB 120 "$pingpong") || rc=$?; check "vmB $pingpong ($k)" "$rc" "$o"
done

echo "== RDMA-CM clients at once: vmA rping, vmB ib_write_bw -R on two QPs"
rping="rping -c -a $LAB_HOST_IP -C 20 -S 4096 -V"
write_bw_cm="ib_write_bw -d rxe0 -x 1 -F -R -p 18517 -s 16384 -n 200 -q 2 -m 1024 $LAB_HOST_IP"
guest_bg vmA rp "$SR_TIMEOUT" "$rping"
guest_bg vmB wbr "$SR_TIMEOUT" "$write_bw_cm"
rc=0; o=$(guest_wait_bg vmA rp 120) || rc=$?
echo "---- vmA $rping (exit $rc)"; printf '%s\n' "$o"
[ "$rc" = 0 ] || { echo "FAIL: vmA $rping"; fails=$((fails + 1)); }
rc=0; o=$(guest_wait_bg vmB wbr 120) || rc=$?
echo "---- vmB $write_bw_cm (exit $rc)"; printf '%s\n' "$o"
# two QPs of 200 WRITEs each, on rdma_cm
if [ "$rc" != 0 ] || ! grep -qE '^ 16384 +400 ' <<<"$o" || ! grep -q '^ Data ex. method : rdma_cm' <<<"$o"; then
  echo "FAIL: vmB $write_bw_cm"; fails=$((fails + 1))
fi

echo "== a client that vanishes: vmA write-bw, killed mid-transfer"
o=$(gexec vmA 60 "${write_bw/-n 200/-n 100000} >/tmp/killed.out 2>&1 & p=\$!
sleep 3; kill -KILL \$p && echo killed; cat /tmp/killed.out") || true
printf '%s\n' "$o"
grep -qx killed <<<"$o" || { echo "FAIL: the client ended before it was killed"; fails=$((fails + 1)); }

# The killed client's session ends when the daemon reads the end of its connection.
for _ in $(seq 1 50); do
  kill -USR1 "$daemon"; sleep 0.3
  tail -n 40 "$out" | grep -q 'running 0$' && break
done
echo "---- the daemon's counters"; tail -n 40 "$out"
tail -n 40 "$out" | grep -qx 'sessions: accepted 7 succeeded 6 failed 1 refused 0, running 0' \
  || { echo "FAIL: the sessions are not 6 succeeded and 1 failed"; fails=$((fails + 1)); }
tail -n 40 "$out" | grep -qx 'resources: qps 0 cqs 0 regions 0 windows 0 srqs 0 address_handles 0' \
  || { echo "FAIL: the daemon still holds objects"; fails=$((fails + 1)); }

trap - EXIT
kill -TERM "$daemon"
rc=0; wait "$daemon" || rc=$?
echo "---- the daemon's log"; cat "$err"
[ "$rc" = 0 ] || { echo "FAIL: the daemon exited $rc on SIGTERM"; fails=$((fails + 1)); }
grep -q 'counters at exit' "$out" || { echo "FAIL: no counters at exit"; fails=$((fails + 1)); }
[ "$fails" = 0 ]
