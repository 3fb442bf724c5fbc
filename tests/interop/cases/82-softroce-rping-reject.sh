#!/bin/bash
# A REQ for a port no one listens on, both ways. softroce's rping client against vmB, which
# listens on nothing: kernel rxe's CM answers REJ 8 (invalid service ID, cm.c cm_issue_rej) and
# softroce prints rping's line and exits 255 within a second, not after its retries. vmB's
# rping client against a softroce device that listens on 7174 only: softroce's CM answers
# port 7175 with REJ 8, and the guest's rping reports RDMA_CM_EVENT_REJECTED, error 8.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

softroce_build
lab_guest_reset vmB
rc=0 t0=$(now)
out=$(lab_ns_exec timeout 30 "$SOFTROCE_BIN" rping -c -a "$VM_B" -I "$LAB_HOST_IP" -C 1 -p 7175 2>&1) || rc=$?
secs=$(elapsed "$t0")
echo "---- softroce rping -c -a $VM_B -p 7175 (exit $rc, $secs s)"; printf '%s\n' "$out"
wirecheck_expect "softroce exited $rc, not rping's 255" [ "$rc" = 255 ]
wirecheck_expect "no rping REJECTED line with error 8" \
  grep -qx 'cma event RDMA_CM_EVENT_REJECTED, error 8' <<<"$out"
wirecheck_expect "the REJ took $secs s: not the kernel's answer" [ "${secs%.*}" -lt 4 ]

srv=$LAB_RUN/softroce-rping-reject-server.out
# `ip netns exec` execs timeout, so $! is its PID, and a TERM to it reaches the server.
ip netns exec "$LAB_NS" timeout 60 "$SOFTROCE_BIN" rping -s -a "$LAB_HOST_IP" -d >"$srv" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -qx rdma_listen "$srv" && break; sleep 0.1; done
grc=0
gout=$(gexec vmB 30 "rping -c -a $LAB_HOST_IP -p 7175 -C 1") || grc=$?
echo "---- vmB: rping -c -a $LAB_HOST_IP -p 7175 (exit $grc)"; printf '%s\n' "$gout"
wirecheck_expect "the guest's rping exited $grc, not 255" [ "$grc" = 255 ]
wirecheck_expect "the guest's rping did not report REJECTED, error 8" \
  grep -q 'cma event RDMA_CM_EVENT_REJECTED, error 8' <<<"$gout"
echo "ok: REJ 8 both ways"
