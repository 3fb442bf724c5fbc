#!/usr/bin/env bash
# The per-message budget of the latency programs through softroce's C library (issue 52, item 1):
# for Debian's ib_write_lat, ib_read_lat, ib_send_lat (8 B) and ibv_rc_pingpong (8 B), the last
# two also waiting for events (-e, in ibv_get_cq_event), each
# side (the server, which for READ and WRITE is the passive one, and the client), with hybrid
# and thread progress: the system calls per iteration by kind, counted with strace (every
# thread of the process).
# Each figure is the difference between a run of SHORT and one of LONG iterations, over the
# difference in iterations, so the set-up and the teardown fall out.
#
# Counts, not times: strace slows a run, which changes how often a spinning poll finds
# nothing, so the empty receives and yields are what a slowed run makes; the others are not.
#
# With --instructions, the instructions instead, by part, each side under callgrind in turn
# (callgrind_parts.py says what each column counts), the four programs without -e. Each side
# runs on one CPU of its own, as in the lab's guests (the traced one on CPU 1, its peer on
# CPU 0): the engine's progress chooses by the CPUs it may use.
#
#   bash benches/latency_budget.sh                  # prints a markdown table
#   bash benches/latency_budget.sh --instructions   # ... of instructions
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
lib=$PWD/target/release/rdma
short=${SOFTROCE_BUDGET_SHORT:-500}
long=${SOFTROCE_BUDGET_LONG:-1500}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
server_addr=127.0.13.1
client_addr=127.0.13.2

# args PROGRAM N: the program's arguments for N iterations (the server's; the client adds the
# server's address). PROGRAM may carry flags of its own ("ib_send_lat -e").
args() {
  local flags=${1#* }
  [ "$flags" = "$1" ] && flags=
  case $1 in
    ibv_rc_pingpong*) echo "-g 0 -s 8 -n $2 -p 18760 $flags" ;;
    *) echo "-x 0 -F -s 8 -n $2 -p 18760 $flags" ;;
  esac
}

# side ROLE PROGRAM PROGRESS N WRAP...: runs the pair, ROLE's side under WRAP, the other under
# peer_wrap (if any).
peer_wrap=()
side() {
  local role=$1 program=$2 progress=$3 n=$4 waited=0
  shift 4
  local server_wrap=("${peer_wrap[@]}") client_wrap=("${peer_wrap[@]}")
  if [ "$role" = server ]; then server_wrap=("$@"); else client_wrap=("$@"); fi
  # shellcheck disable=SC2046
  env LD_LIBRARY_PATH="$lib" SOFTROCE_ADDR=$server_addr SOFTROCE_PROGRESS="$progress" \
    "${server_wrap[@]}" "${program%% *}" $(args "$program" "$n") >/dev/null 2>&1 &
  local server=$!
  # The client connects once, at once: the server must listen first (under callgrind it takes
  # seconds to start).
  until ss -Hltn "sport = :18760" | grep -q .; do
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 300 ] || { echo "$program's server does not listen" >&2; return 1; }
  done
  # shellcheck disable=SC2046
  env LD_LIBRARY_PATH="$lib" SOFTROCE_ADDR=$client_addr SOFTROCE_PROGRESS="$progress" \
    "${client_wrap[@]}" "${program%% *}" $(args "$program" "$n") $server_addr >/dev/null 2>&1
  wait "$server"
}

# syscalls TRACE: "sendmsg recvmsg-data recvmsg-empty sleeps futex yields other" of an strace
# log of several threads (a call another thread interrupted is counted where it resumes).
syscalls() {
  awk '
    /<unfinished \.\.\.>/ { next }
    {
      if (match($0, /<\.\.\. [a-z_0-9]+ resumed>/)) {
        name = substr($0, RSTART + 5, RLENGTH - 14)
        rest = substr($0, RSTART + RLENGTH)
      } else if (match($0, /^[0-9]+ +[a-z_0-9]+\(/)) {
        name = substr($0, RSTART, RLENGTH - 1)
        sub(/^[0-9]+ +/, "", name)
        rest = $0
      } else next
      if (rest !~ / = /) next
      if (name == "recvmsg" && rest ~ / = -1 EAGAIN/) empty++
      else if (name == "sendmsg" || name == "sendto") send++
      else if (name == "recvmsg" || name == "recvfrom") data++
      else if (name ~ /^(epoll_wait|epoll_pwait|poll|ppoll)$/) sleeps++
      else if (name == "futex") futex++
      else if (name == "sched_yield") yields++
      else other++
    }
    END { printf "%d %d %d %d %d %d %d\n", send, data, empty, sleeps, futex, yields, other }
  ' "$1"
}

per_iteration() { # A B: (B - A) / (long - short), per field, one decimal
  paste -d' ' <(tr ' ' '\n' <<<"$1") <(tr ' ' '\n' <<<"$2") |
    awk -v d=$((long - short)) '{ v = ($2 - $1) / d; printf "%.1f ", ((v < 0.05 && v > -0.05) ? 0 : v) }'
}

if [ "${1:-}" = --instructions ]; then
  peer_wrap=(taskset -c 0)
  echo "<!-- $(date -u +%F), $(git rev-parse --short HEAD), callgrind, iterations $short and $long -->"
  echo "| program | progress | side | turns | a turn's own | datagrams in | each | datagrams out | each | posts | each | arrival to send |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for program in ib_write_lat ib_read_lat ib_send_lat ibv_rc_pingpong; do
    for progress in hybrid thread; do
      for role in server client; do
        for n in "$short" "$long"; do
          side "$role" "$program" "$progress" "$n" taskset -c 1 valgrind --tool=callgrind \
            --callgrind-out-file="$out/$n.callgrind"
        done
        printf '| `%s` | %s | %s | %s |\n' "$program" "$progress" "$role" \
          "$(python3 benches/callgrind_parts.py "$out/$short.callgrind" "$out/$long.callgrind" $((long - short)))"
      done
    done
  done
  exit 0
fi

echo "<!-- $(date -u +%F), $(nproc) cores, $(git rev-parse --short HEAD), iterations $short and $long -->"
echo "| program | progress | side | sendmsg | recvmsg, data | recvmsg, empty | poll/epoll | futex | sched_yield | other |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for program in ib_write_lat ib_read_lat ib_send_lat ibv_rc_pingpong "ib_send_lat -e" \
  "ibv_rc_pingpong -e"; do
  for progress in hybrid thread; do
    for role in server client; do
      side "$role" "$program" "$progress" "$short" strace -f -qq -o "$out/a" \
        -e trace=sendmsg,sendto,recvmsg,recvfrom,epoll_wait,epoll_pwait,poll,ppoll,futex,sched_yield,clock_gettime,write,read,eventfd2,rt_sigprocmask,fcntl
      side "$role" "$program" "$progress" "$long" strace -f -qq -o "$out/b" \
        -e trace=sendmsg,sendto,recvmsg,recvfrom,epoll_wait,epoll_pwait,poll,ppoll,futex,sched_yield,clock_gettime,write,read,eventfd2,rt_sigprocmask,fcntl
      counts=$(per_iteration "$(syscalls "$out/a")" "$(syscalls "$out/b")")
      printf '| `%s` | %s | %s | %s |\n' "$program" "$progress" "$role" \
        "$(tr ' ' '|' <<<"${counts% }" | sed 's/|/ | /g')"
    done
  done
done
