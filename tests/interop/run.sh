#!/bin/bash
# run.sh: the kernel-rxe interop lab. Boots two QEMU guests running the stock Debian kernel's
# rdma_rxe in a private network namespace, runs the cases in cases/*.sh and the cells of the
# interop matrix (matrix.sh) against them (and, with --fixtures, regenerates packet-fixtures/rxe/),
# prints a result table and the matrix's table, and tears everything down.
# See README.md next to this file.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"

usage() {
  cat <<EOF
usage: $0 [options]      (as root)

  --fixtures      also regenerate packet-fixtures/rxe/*.pcap and MANIFEST.tsv
  --only REGEX    run only the cases whose name matches REGEX (grep -E), e.g. 'gids|fixture:ud_';
                  matrix cells are cases named matrix:TOOL:ROLE:COLUMN, e.g. 'matrix:.*:ipv6'
  --matrix-md FILE  write the matrix's table as markdown to FILE
                  (default \$SOFTROCE_LAB_CACHE/matrix.md)
  --perf          also run perftest between the two guests on kernel rxe and through softroce's
                  library (perf.sh), and write the table as markdown to \$SOFTROCE_LAB_CACHE/perf.md
  --budget        also trace each latency row in a guest: what a datagram costs there from its
                  arrival to the send it allows, on rxe and on softroce (perf.sh budget), as
                  markdown in \$SOFTROCE_LAB_CACHE/budget.md
  --keep          leave the lab running afterwards (guests, namespace) for debugging;
                  tear it down later with: $0 --down
  --build-only    install packages and build/cache the guest, then exit (no lab)
  --down          tear down a lab left by --keep (or by a crashed run), then exit
  -h, --help      this text

environment:
  SOFTROCE_LAB_CACHE   cache and run-state directory (default /var/cache/softroce-rxe-lab)
  SOFTROCE_LAB_NS      network namespace name (default softroce-lab)
  SOFTROCE_LAB_BIN     a softroce binary to use instead of building target/release/softroce
EOF
}

OPT_PERF=0 OPT_BUDGET=0 OPT_FIXTURES=0 OPT_KEEP=0 OPT_ONLY="" OPT_BUILD_ONLY=0 OPT_DOWN=0 OPT_MATRIX_MD=$LAB_CACHE/matrix.md
while [ $# -gt 0 ]; do
  case $1 in
    --fixtures) OPT_FIXTURES=1;;
    --perf) OPT_PERF=1;;
    --budget) OPT_BUDGET=1;;
    --keep) OPT_KEEP=1;;
    --only) [ $# -ge 2 ] || die "--only needs a regex"; OPT_ONLY=$2; shift;;
    --matrix-md) [ $# -ge 2 ] || die "--matrix-md needs a file"; OPT_MATRIX_MD=$2; shift;;
    --build-only) OPT_BUILD_ONLY=1;;
    --down) OPT_DOWN=1;;
    -h|--help) usage; exit 0;;
    *) usage >&2; die "unknown option '$1'";;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "run as root: the lab creates a network namespace, a bridge and taps"
[ -c /dev/net/tun ] || die "/dev/net/tun is missing (needed for the guests' tap devices)"
mkdir -p "$LAB_CACHE"
# One lab at a time: the namespace name, addresses and run directory are fixed. Children that
# outlive us (the qemu processes, each in a session of its own) are started with fd 9 closed, or
# a --keep lab would hold the lock.
exec 9>"$LAB_CACHE/lock"
flock -n 9 || die "another run.sh is using $LAB_CACHE (lock $LAB_CACHE/lock)"

if [ "$OPT_DOWN" = 1 ]; then
  lab_down && log "lab is down: no netns $LAB_NS, no lab qemu left" || die "teardown incomplete"
  exit 0
fi

declare -a STAGE_NAMES=() STAGE_SECS=()
stage_done() { STAGE_NAMES+=("$1"); STAGE_SECS+=("$(elapsed "$2")"); }
T_START=$(now)

t0=$(now); lab_install_deps; stage_done "host packages (apt)" "$t0"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found after install"
t0=$(now); lab_build_guest; stage_done "guest build (cache $LAB_GUEST_KEY)" "$t0"
if [ "$OPT_BUILD_ONLY" = 1 ]; then
  log "guest: $LAB_KERNEL, $LAB_INITRD"
  exit 0
fi

# leftovers of a crashed run or of --keep: our recorded pids and our namespace only
if lab_ns_exists || compgen -G "$LAB_RUN/*.pid" >/dev/null; then
  log "removing leftovers of a previous lab run"
  lab_down || die "cannot remove the previous lab (netns $LAB_NS); see above"
fi
rm -rf "$LAB_RUN"
mkdir -p "$LAB_RUN/cases"

CASE_PID=""
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CASE_PID" ]; then kill -TERM "$CASE_PID" 2>/dev/null || true; wait "$CASE_PID" 2>/dev/null || true; fi
  if [ "$OPT_KEEP" = 1 ]; then
    log "--keep: lab left running (netns $LAB_NS, guests vmA $VM_A / vmB $VM_B, state in $LAB_RUN)"
    log "  ip netns exec $LAB_NS $HERE/gexec.py $VM_A 'ibv_devinfo -d rxe0'"
    log "  tear down: $0 --down"
  elif lab_down; then
    log "cleanup ok: netns $LAB_NS deleted, lab qemu processes stopped"
  else
    log "cleanup INCOMPLETE (see above)"; rc=1
  fi
  exit $rc
}
trap on_exit EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

t0=$(now)
lab_net_up
lab_boot vmA tap0 52:54:00:99:00:11
lab_boot vmB tap1 52:54:00:99:00:12
lab_wait_ready vmA 180
lab_wait_ready vmB 180
stage_done "network + boot of 2 guests" "$t0"

declare -a RES_NAME=() RES_STATUS=() RES_SECS=() RETRIED=()
# How many times a case runs at the most while each attempt ends with a guest unwell (its NIC
# stalled, or it stopped answering its command server).
STALL_ATTEMPTS=3
FAILED=0
# run_case NAME TIMEOUT CMD...: run one case as its own process (group) under a hard timeout.
# Started in the background and wait-ed for, so that Ctrl-C reaches our trap at once.
# Returns 1 only if --only filtered the case out; the verdict goes to RES_* and FAILED.
run_case() {
  local name=$1 to=$2 t0 rc=0 log status secs unwell=""; shift 2
  if [ "${RUN_CASE_FORCE:-0}" != 1 ] && [ -n "$OPT_ONLY" ] && ! echo "$name" | grep -qE -- "$OPT_ONLY"; then
    return 1   # filtered out
  fi
  log=$LAB_RUN/cases/${name//[:\/]/_}.log
  log "case $name (timeout ${to}s)"
  t0=$(now)
  mark_consoles
  attempt_case "$log" "$to" "$@" || rc=$?
  # A guest's virtual NIC stopped transmitting for good during the case, which no case is
  # known to cause and none recovers from (README.md, "A guest's virtual NIC"): every later
  # case would fail. The guests are booted again and the case runs once more, up to
  # STALL_ATTEMPTS attempts in all; each failed attempt's log, the guests' consoles and QEMU's
  # view of their NICs are kept. A failure with the guests well stands at once.
  local attempt=1 kept
  while [ "$rc" != 0 ] && unwell=$(guests_unwell) && [ -n "$unwell" ]; do
    kept=${log%.log}.attempt-$attempt
    if [ "$attempt" -ge "$STALL_ATTEMPTS" ]; then
      log "case $name: $unwell in attempt $attempt of $STALL_ATTEMPTS; booting the guests again for the cases after it"
      (reboot_guests "$kept") || true
      break
    fi
    log "case $name: $unwell; booting the guests again and running the case once more"
    mv "$log" "$log.attempt-$attempt"
    RETRIED+=("$name, attempt $attempt ($unwell)")
    if ! (reboot_guests "$kept"); then
      echo "the guests could not be booted again" >>"$log.attempt-$attempt"
      cp "$log.attempt-$attempt" "$log"
      break
    fi
    rc=0
    attempt=$((attempt + 1))
    mark_consoles
    attempt_case "$log" "$to" "$@" || rc=$?
  done
  # A stall in an attempt that passed still leaves a NIC stopped for the cases after.
  if [ "$rc" = 0 ] && [ "$attempt" -gt 1 ] && [ -n "$(guests_unwell)" ]; then
    (reboot_guests "${log%.log}.attempt-$attempt") || true
  fi
  if [ "$rc" = 0 ]; then status=PASS; else status=FAIL; FAILED=1; fi
  secs=$(elapsed "$t0")
  RES_NAME+=("$name"); RES_STATUS+=("$status"); RES_SECS+=("$secs")
  if [ "$status" = FAIL ]; then
    log "case $name FAILED (exit $rc); last lines of $log:"
    tail -n 40 "$log" | sed 's/^/    | /' >&2
  fi
  return 0   # ran (its verdict is in RES_STATUS / FAILED)
}

# attempt_case LOG TIMEOUT CMD...: one run of a case, its output to LOG; returns its exit status.
attempt_case() {
  local log=$1 to=$2 t0 rc=0; shift 2
  t0=$(now)
  # 9>&-: the case (and e.g. a tcpdump it starts) must not inherit the lab lock
  timeout -k 10 "$to" "$@" >"$log" 2>&1 </dev/null 9>&- &
  CASE_PID=$!
  wait "$CASE_PID" || rc=$?
  CASE_PID=""
  # 124 is also what gexec returns for an unresponsive guest: only blame the case timeout if the
  # case really ran that long
  if [ "$rc" = 124 ] && [ "$(elapsed "$t0" | cut -d. -f1)" -ge $((to - 1)) ]; then
    echo "case timed out after ${to}s" >>"$log"
  fi
  return "$rc"
}

# mark_consoles: remembers how long each guest's console is, so that guests_unwell reads only
# what the next attempt adds.
declare -A CONSOLE_MARK=()
mark_consoles() {
  local g
  for g in vmA vmB; do CONSOLE_MARK[$g]=$(stat -c %s "$LAB_RUN/$g.console" 2>/dev/null || echo 0); done
}

# guests_unwell: what is wrong with the guests after a failed attempt, or nothing if both are
# well: a guest whose console says, since mark_consoles, that its NIC's transmit queue timed out
# (the kernel's "NETDEV WATCHDOG", printed once a boot, or virtio_net's own "TX timeout on
# queue"), or one that no longer answers its command server. The console alone is not enough:
# the watchdog fires only once the transmit ring is full, which a quiet guest may take minutes
# to reach (CI on a3f07f8: the NIC stopped in matrix:write-lat:server:loss, the watchdog spoke
# four minutes and six failed cases later).
# A guest whose kernel crashed is not one of these, and neither guest is then: that may be
# rxe's answer to what softroce sent, a finding the case's failure must show rather than a
# second attempt hide.
KERNEL_CRASH='Kernel panic|Oops|general protection fault|kernel BUG at|BUG: (unable to handle|kernel NULL)'
guests_unwell() {
  local g what="" crashed=0
  for g in vmA vmB; do
    if console_since_mark "$g" | grep -qaE "$KERNEL_CRASH"; then
      log "$g's kernel crashed during the case (its console, $LAB_RUN/$g.console)"
      crashed=1
    elif console_since_mark "$g" | grep -qaE 'NETDEV WATCHDOG|TX timeout on queue'; then
      what+="${what:+, }$g's virtual NIC stopped transmitting (its console: transmit queue timed out)"
    elif ! gexec "$g" 10 true >/dev/null 2>&1; then
      what+="${what:+, }$g does not answer its command server"
    fi
  done
  [ "$crashed" = 1 ] || echo "$what"
}

# console_since_mark GUEST: what GUEST's console gained since mark_consoles.
console_since_mark() {
  tail -c +"$(( ${CONSOLE_MARK[$1]:-0} + 1 ))" "$LAB_RUN/$1.console" 2>/dev/null || true
}

# reboot_guests PREFIX: both guests stopped and booted again, as at the start; their consoles so
# far are kept as PREFIX.vmA.console and PREFIX.vmB.console (a boot starts a new one), QEMU's
# messages as PREFIX.vmX.qemu.log, and QEMU's view of their NICs (guest_nic_state) as
# PREFIX.vmX.virtio. Run it in a subshell: a guest that does not come back fails it (lab_boot and
# lab_wait_ready die), and the run goes on to report the case.
reboot_guests() {
  local g
  for g in vmA vmB; do guest_nic_state "$g" >"$1.$g.virtio" 2>&1 || true; done
  lab_stop_guest vmA && lab_stop_guest vmB || return 1
  for g in vmA vmB; do
    mv "$LAB_RUN/$g.console" "$1.$g.console" 2>/dev/null || true
    mv "$LAB_RUN/$g.qemu.log" "$1.$g.qemu.log" 2>/dev/null || true
  done
  lab_boot vmA tap0 52:54:00:99:00:11
  lab_boot vmB tap1 52:54:00:99:00:12
  lab_wait_ready vmA 180
  lab_wait_ready vmB 180
}

t0=$(now)
for f in "$HERE"/cases/*.sh; do
  # a case may declare its own limit in a "# timeout: N" header line
  to=$(sed -n 's/^# timeout: *\([0-9]\+\).*/\1/p' "$f" | head -1)
  run_case "$(basename "$f" .sh)" "${to:-120}" bash "$f" || true
done
stage_done "self-test cases" "$t0"

# The interop matrix: one case per cell, in matrix.sh's order. Each cell leaves vmB as it found it.
t0=$(now)
for cell in $(bash "$HERE/matrix.sh" list); do
  run_case "matrix:$cell" 150 bash "$HERE/matrix.sh" run "$cell" || true
done
stage_done "interop matrix cells" "$t0"

if [ "$OPT_PERF" = 1 ]; then
  t0=$(now)
  RUN_CASE_FORCE=1 run_case "perf" 1800 bash "$HERE/perf.sh" run "$LAB_CACHE/perf.md" || true
  stage_done "perftest on rxe and on softroce between the guests" "$t0"
fi

if [ "$OPT_BUDGET" = 1 ]; then
  t0=$(now)
  RUN_CASE_FORCE=1 run_case "budget" 1800 bash "$HERE/perf.sh" budget "$LAB_CACHE/budget.md" || true
  stage_done "what a datagram costs in the guests" "$t0"
fi

if [ "$OPT_FIXTURES" = 1 ]; then
  t0=$(now)
  fx_failed=0 fx_ran=0
  for n in $(bash "$HERE/fixtures.sh" list); do
    before=$FAILED; FAILED=0
    run_case "fixture:$n" 300 bash "$HERE/fixtures.sh" capture "$n" && fx_ran=$((fx_ran + 1))
    [ "$FAILED" = 1 ] && fx_failed=1
    FAILED=$(( before | FAILED ))
  done
  # Publish only when every capture of this run worked: never a half-regenerated fixture set.
  # (With --only, the captures that ran are published and the other manifest rows are kept.)
  if [ "$fx_ran" = 0 ]; then
    log "--fixtures: no fixture matched --only '$OPT_ONLY'"
  elif [ "$fx_failed" = 0 ]; then
    RUN_CASE_FORCE=1 run_case "fixture:publish" 120 bash "$HERE/fixtures.sh" publish || true
  else
    RES_NAME+=("fixture:publish"); RES_STATUS+=("SKIP"); RES_SECS+=("0.0")
    log "not publishing fixtures: some captures failed"
  fi
  stage_done "fixture generation" "$t0"
fi

echo
printf '%-34s %-6s %8s\n' CASE RESULT SECONDS
for i in "${!RES_NAME[@]}"; do
  printf '%-34s %-6s %8s\n' "${RES_NAME[$i]}" "${RES_STATUS[$i]}" "${RES_SECS[$i]}"
done
echo
for i in "${!STAGE_NAMES[@]}"; do
  printf '  stage %-40s %7s s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}"
done
for i in "${!RETRIED[@]}"; do
  echo "  ran again, the guests booted again after a guest was unwell: ${RETRIED[$i]}"
done
T_TOTAL=$(elapsed "$T_START")
printf '  %-46s %7s s\n' "total (before teardown)" "$T_TOTAL"
echo "  case logs: $LAB_RUN/cases/"
# The matrix's table, from the results of its cells and of the softroce cases it starts from.
if grep -qE '^(matrix:|[0-9]+-softroce-)' <<<"$(printf '%s\n' "${RES_NAME[@]}")"; then
  for i in "${!RES_NAME[@]}"; do printf '%s\t%s\t%s\n' "${RES_NAME[$i]}" "${RES_STATUS[$i]}" "${RES_SECS[$i]}"; done >"$LAB_RUN/results.tsv"
  mkdir -p "$(dirname "$OPT_MATRIX_MD")"
  bash "$HERE/matrix.sh" table "$LAB_RUN/results.tsv" "$OPT_MATRIX_MD" \
    "$(awk -v t="$T_TOTAL" 'BEGIN { printf "%d min %02d s", t / 60, t % 60 }')" || log "cannot write the matrix table"
fi
if [ "$OPT_PERF" = 1 ] && [ -s "$LAB_CACHE/perf.md" ]; then
  echo; cat "$LAB_CACHE/perf.md"; echo "  markdown: $LAB_CACHE/perf.md"
fi
if [ "$OPT_BUDGET" = 1 ] && [ -s "$LAB_CACHE/budget.md" ]; then
  echo; cat "$LAB_CACHE/budget.md"; echo "  markdown: $LAB_CACHE/budget.md"
fi
[ ${#RES_NAME[@]} -gt 0 ] || { log "no case matched --only '$OPT_ONLY'"; exit 1; }
[ "$FAILED" = 0 ] || { log "some cases FAILED"; exit 1; }
log "all cases passed"
