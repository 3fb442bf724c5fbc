#!/bin/bash
# matrix.sh: the interop matrix. softroce's tools on the host side of the lab against the stock
# rdma-core and perftest tools in vmB, in both roles. The cases of cases/5*.sh and cases/6*.sh
# are its first column (MTU 1024, IPv4, UDP backend, no loss); each other column changes one or
# more of these (a column "raw+mtu4096" both):
#
#   mtu4096  vmB's eth0 at MTU 9000, so that rxe's active_mtu is 4096; both sides -m 4096 (ud-pingpong, which has no -m: -s 4096)
#   ipv6     the RoCE addresses (GIDs) are fd99::1 and vmB's fd99::12 (its GID index 2)
#   raw      softroce --backend raw: the raw IPv4 socket backend
#   loss     1% netem loss of the RoCE packets vmB sends and of those it receives
#   rdma_cm  connected by RDMA-CM: the perftest tools with -R (no TCP at all); for rping,
#            ucmatose and udaddy, which always are, the cell is their base case (cases/8*.sh)
#   capi     the host side runs Debian's own program of the row (ibv_rc_pingpong, ib_write_bw,
#            rping, ...) unmodified through softroce's libibverbs.so.1 and librdmacm.so.1
#            (`softroce run`) in place of softroce's tool; otherwise the base column
#
# The RDMA-CM tools (rping, ucmatose, udaddy) are rows too, against librdmacm's in vmB; their
# base cases are cases/80-86.
#   matrix.sh list                    the cells that run, TOOL:ROLE:COLUMN, in run order
#   matrix.sh run CELL                run one cell (run.sh runs each as the case "matrix:CELL")
#   matrix.sh table RESULTS MD [TIME] print the pass/fail table of the cases and cells in
#                                     RESULTS (lines "NAME<tab>PASS|FAIL|SKIP"), write it as
#                                     markdown to MD; TIME: the lab run's, for MD's heading
#
# README.md ("The interop matrix") describes the cells and what each one checks.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cm.sh"

MX_TOOLS="rc-pingpong uc-pingpong ud-pingpong write-bw read-bw send-bw atomic-bw send-lat write-lat read-lat
rping ucmatose udaddy"
MX_COLUMNS="mtu4096 ipv6 raw loss ipv6+mtu4096 raw+mtu4096 rdma_cm capi"
MX_LOSS=1
MX_CSUM_MARK=$LAB_RUN/matrix.ipv6-udp-checksum

# mx_has FEATURE [COLUMN]: COLUMN (default: the cell's) has FEATURE.
mx_has() { [[ "+${2:-$MX_COL}+" == *"+$1+"* ]]; }

mx_title() {
  local f t="" sep=""
  [ "$1" = base ] && { echo "MTU 1024, IPv4, UDP"; return; }
  for f in ${1//+/ }; do
    case $f in
      mtu4096) t+="${sep}MTU 4096";;
      ipv6) t+="${sep}IPv6";;
      raw) t+="${sep}raw";;
      loss) t+="${sep}$MX_LOSS% loss";;
      rdma_cm) t+="${sep}RDMA-CM (-R)";;
      capi) t+="${sep}C programs on libibverbs.so.1";;
    esac
    sep=", "
  done
  echo "$t"
}

# mx_cm_tool TOOL: TOOL is one of librdmacm's, which always connect by RDMA-CM.
mx_cm_tool() { case $1 in rping|ucmatose|udaddy) return 0;; *) return 1;; esac; }

# mx_na TOOL COLUMN: why the cell does not exist (exit 1 if it does).
mx_na() {
  if { [ "$1" = uc-pingpong ] || [ "$1" = ud-pingpong ] || [ "$1" = udaddy ]; } && mx_has loss "$2"; then
    echo "UC and UD do not retransmit (IBTA 9.8, unreliable service): a lost packet is a lost message, which the tools wait for forever"
  elif [ "${1%-pingpong}" != "$1" ] && mx_has rdma_cm "$2"; then
    echo "rdma-core's pingpong tools have no RDMA-CM mode: their exchange is TCP"
  else
    return 1
  fi
}

# mx_base_cell TOOL COLUMN: the cell is its tool's base case, not a run of its own: the rdma_cm
# column of the tools that always connect by RDMA-CM.
mx_base_cell() { mx_cm_tool "$1" && mx_has rdma_cm "$2"; }

# mx_case_name TOOL ROLE: the case of cases/ that is the cell's base column, e.g.
# 50-softroce-rc-client for rc-pingpong client, 60-softroce-write-bw-client for write-bw client.
mx_case_name() {
  local f short=${1%-pingpong}
  for f in "$LAB_DIR"/cases/*-softroce-"$short"-"$2".sh; do
    [ -e "$f" ] && basename "$f" .sh
  done
}

# mx_def TOOL COLUMN: the cell's options, the same for both roles. Sets MX_KIND (pingpong or
# perftest), MX_ARGS (both sides, in rdma-core's or perftest's syntax), MX_SIZE and MX_ITERS (the
# result lines both sides must print) and MX_MSGS (messages that carry MX_SIZE bytes: the
# packet count check of mtu4096). Sizes make every message several packets long at the cell's
# MTU; loss cells have over a thousand RoCE packets each way or in total, so that some are lost.
mx_def() {
  local tool=$1 col=$2 m=1024 big=4096
  if mx_has mtu4096 "$col"; then m=4096 big=16384; fi
  case $tool in
    rc-pingpong)
      MX_KIND=pingpong MX_SIZE=$big MX_ITERS=200
      if mx_has loss "$col"; then MX_ITERS=300; fi
      MX_ARGS="-s $MX_SIZE -m $m -n $MX_ITERS -c" MX_MSGS=$((2 * MX_ITERS));;
    uc-pingpong)
      MX_KIND=pingpong MX_SIZE=$((big / 2)) MX_ITERS=200
      MX_ARGS="-s $MX_SIZE -m $m -n $MX_ITERS -c" MX_MSGS=$((2 * MX_ITERS));;
    ud-pingpong)
      # a UD message is one packet of at most the port MTU, and neither side takes -m: the
      # ports follow their links (vmB's eth0, the namespace's br0 at 9000 for softroce)
      MX_KIND=pingpong MX_SIZE=$m MX_ITERS=200
      MX_ARGS="-s $MX_SIZE -n $MX_ITERS -c" MX_MSGS=$((2 * MX_ITERS));;
    write-bw|read-bw|send-bw)
      MX_KIND=perftest MX_SIZE=$((big * 4)) MX_ITERS=100
      if mx_has loss "$col"; then MX_ITERS=200; fi
      MX_ARGS="-F -n $MX_ITERS -s $MX_SIZE -m $m" MX_MSGS=$MX_ITERS;;
    atomic-bw)
      MX_KIND=perftest MX_SIZE=8 MX_ITERS=200
      if mx_has loss "$col"; then MX_ITERS=1000; fi
      MX_ARGS="-F -n $MX_ITERS -m $m" MX_MSGS=0;;
    send-lat|write-lat)
      MX_KIND=perftest MX_SIZE=$((big / 2)) MX_ITERS=200
      if mx_has loss "$col"; then MX_ITERS=500; fi
      MX_ARGS="-F -n $MX_ITERS -s $MX_SIZE -m $m" MX_MSGS=$((2 * MX_ITERS));;
    read-lat)
      MX_KIND=perftest MX_SIZE=$big MX_ITERS=200
      if mx_has loss "$col"; then MX_ITERS=500; fi
      MX_ARGS="-F -n $MX_ITERS -s $MX_SIZE -m $m" MX_MSGS=$MX_ITERS;;
    rping)
      # a READ and a WRITE of $big bytes a ping. With loss, fewer and larger pings: most of
      # rping's packets are single-packet SENDs, their ACKs and last packets, and each one lost
      # costs the QPs' ACK timeout, which the guest's CM sets to about 2.1 s (packet life 18);
      # a lost packet inside a READ or WRITE is recovered at once (NAK, or the gap seen).
      MX_KIND=rping MX_SIZE=$big MX_ITERS=20
      if mx_has loss "$col"; then MX_SIZE=$((big * 4)) MX_ITERS=24; fi
      MX_ARGS="-C $MX_ITERS -S $MX_SIZE -V" MX_MSGS=$((2 * MX_ITERS));;
    ucmatose)
      # two connections, -C SENDs of $big bytes each way on each
      MX_KIND=cm MX_SIZE=$big MX_ITERS=50
      if mx_has loss "$col"; then MX_ITERS=100; fi
      MX_ARGS="-c 2 -C $MX_ITERS -S $MX_SIZE" MX_MSGS=$((4 * MX_ITERS));;
    udaddy)
      # a datagram is one packet of at most the port MTU, here exactly it
      MX_KIND=cm MX_SIZE=$m MX_ITERS=100
      MX_ARGS="-C $MX_ITERS -S $MX_SIZE" MX_MSGS=$((2 * MX_ITERS));;
    *) die "matrix: unknown tool '$tool'";;
  esac
  if mx_has rdma_cm "$col" && [ "$MX_KIND" = perftest ]; then MX_ARGS+=" -R"; fi
  # a CM client names its path MTU in its REQ (cm.sh, rping_pair)
  SR_MTU=$m
}

cmd_list() {
  local col tool role
  for col in $MX_COLUMNS; do
    for tool in $MX_TOOLS; do
      mx_na "$tool" "$col" >/dev/null && continue
      mx_base_cell "$tool" "$col" && continue
      for role in client server; do echo "$tool:$role:$col"; done
    done
  done
}

# ---------------------------------------------------------------------------------------------
# one cell

# mx_counter NAME: how much vmB's rxe0 hw_counter NAME grew during the pair.
mx_counter() {
  local a b
  a=$(awk -v n="$1" '$1 == n { print $2 }' <<<"$SR_CNT_BEFORE")
  b=$(awk -v n="$1" '$1 == n { print $2 }' <<<"$SR_CNT_AFTER")
  echo $(( ${b:-0} - ${a:-0} ))
}

# mx_snmp6 NAME: a counter of the host side's IPv6 stack (/proc/net/snmp6 in the namespace).
mx_snmp6() { lab_ns_exec awk -v n="$1" '$1 == n { print $2 }' /proc/net/snmp6; }

# mx_udp_out: the UDP datagrams the host side's IPv4 stack has sent (Udp OutDatagrams in the
# namespace's /proc/net/snmp). The raw backend's packets do not count there.
mx_udp_out() {
  lab_ns_exec awk '$1 == "Udp:" { if (!c) { for (i = 2; i <= NF; i++) if ($i == "OutDatagrams") c = i } else print $c }' /proc/net/snmp
}

# mx_prepare: softroce_guest_pair's SR_PREPARE: netem for a loss cell.
mx_prepare() {
  if mx_has loss; then
    # rc_pingpong's client exits once its last receive completes and destroys its QP: if the
    # ACK of that last message were lost, the server would retry into the void and fail
    # (IBV_WC_RETRY_EXC_ERR). Only the ACKs the pingpong client sends are spared for that.
    # ib_write_lat has no closing round either: each side exits once its loop ends. softroce
    # keeps its QP a while to answer a resent WRITE whose ACK it sent was lost
    # (Context::answer_late_resends); rxe's ib_write_lat does not, so the ACKs vmB sends are
    # spared, or softroce's last WRITE would be retried into the void 1% of the time.
    # ucmatose's server disconnects once its last receive completes: if the ACK of the
    # client's last SEND were lost, the DREQ would move the client's QP to ERROR with that
    # SEND unacknowledged, and the client, failing it, never answers the DREQ (the likely
    # cause of a hang seen once in CI on f7c297e: no packet from vmB after the DREQ). The ACKs
    # softroce sends as ucmatose's server are spared for that.
    # rping's client disconnects once its last ping is checked and destroys its id at once,
    # so the kernel's CM does not send its DREQ again: had it been lost, softroce's rping
    # server, like librdmacm's, would wait for the disconnect for ever (a hang seen once in
    # CI on 9169808: the client exited 0, and no "DISCONNECT EVENT" at the server). The DREQ
    # vmB sends is spared for that.
    local spare=""
    if [ "$MX_TOOL" = rc-pingpong ]; then
      if [ "$MX_ROLE" = client ]; then spare=in; else spare=out; fi
    elif [ "$MX_TOOL" = write-lat ]; then
      spare=out
    elif [ "$MX_TOOL" = ucmatose ] && [ "$MX_ROLE" = server ]; then
      spare=in
    elif [ "$MX_TOOL" = rping ] && [ "$MX_ROLE" = server ]; then
      spare=dreq-out
    fi
    guest_netem vmB "$MX_LOSS" $spare || return 1
  fi
}

# mx_pcap_check: what softroce recorded (--pcap) of the cell's traffic: some packets, none with a
# bad ICRC or malformed, and Wireshark's dissector (tshark) takes every frame for RoCEv2; for
# ipv6 all between the two IPv6 GIDs; for mtu4096 some packet with 4096 bytes of payload.
mx_pcap_check() {
  local dec frames ws
  [ -n "$MX_PCAP" ] || return 0
  dec=$("$SOFTROCE_BIN" decode "$MX_PCAP") || { echo "FAIL: softroce decode $MX_PCAP failed"; exit 1; }
  frames=$(grep -E '^ *[0-9]+ +[0-9.]+ [0-9a-f.:]+ -> ' <<<"$dec" || true)
  echo "---- softroce's recording ($MX_PCAP): $(grep -c . <<<"$frames") RoCE packets, ICRC" \
    "$(sed -n '/^ICRC:/,/^[^ ]/p' <<<"$dec" | awk 'NF == 2 { printf "%s %s ", $1, $2 }')"
  wirecheck_expect "softroce recorded no packet" [ -n "$frames" ]
  ws=$(tshark -r "$MX_PCAP" -T fields -e frame.protocols 2>/dev/null) \
    || { echo "FAIL: tshark could not read $MX_PCAP"; exit 1; }
  echo "---- tshark: $(grep -c . <<<"$ws") frames, $(grep -c ':udp:infiniband' <<<"$ws") of them RoCEv2 (udp:infiniband)"
  wirecheck_expect "tshark does not take every frame softroce recorded for RoCEv2 (udp:infiniband)" \
    _all_match ':udp:infiniband(:|$)' "$ws"
  wirecheck_expect "tshark read $(grep -c . <<<"$ws") frames where softroce decode read $(grep -c . <<<"$frames")" \
    [ "$(grep -c . <<<"$ws")" = "$(grep -c . <<<"$frames")" ]
  wirecheck_expect "softroce recorded packets with a bad ICRC" grep -qE '^  bad +0$' <<<"$dec"
  wirecheck_expect "softroce recorded malformed RoCE frames" grep -qx 'malformed RoCE frames: 0' <<<"$dec"
  if mx_has ipv6; then
    wirecheck_expect "softroce recorded packets not between $SR_BIND and $SR_PEER" \
      _all_match " ($SR_BIND -> $SR_PEER|$SR_PEER -> $SR_BIND) " "$frames"
  fi
  if mx_has mtu4096 && [ "$MX_MSGS" -gt 0 ]; then
    wirecheck_expect "softroce recorded no packet with 4096 bytes of payload" grep -q ' len=4096 ' <<<"$frames"
  fi
}
_all_match() { ! grep -vqE "$1" <<<"$2"; }

cmd_run() {
  local cell=$1 why stats sent_out drop_out sent_in drop_in pkts csum0=0 csum udp0=0 udp
  IFS=: read -r MX_TOOL MX_ROLE MX_COL <<<"$cell"
  if why=$(mx_na "$MX_TOOL" "$MX_COL"); then echo "not a cell: $why"; exit 1; fi
  mx_def "$MX_TOOL" "$MX_COL"
  echo "==== $MX_TOOL, softroce as the $MX_ROLE, $(mx_title "$MX_COL"): $MX_ARGS"
  # whatever happens, leave vmB as the other cases expect it: MTU 1024, no netem (a failed pair
  # stops the guest's tool itself, and every case resets vmB before it starts)
  trap '! mx_has loss || lab_guest_reset vmB >/dev/null 2>&1 || true
    ! mx_has mtu4096 || guest_set_mtu 1024 vmB >/dev/null 2>&1 || true' EXIT
  softroce_build || exit 1
  SR_PREPARE=mx_prepare SR_TIMEOUT=30 MX_PCAP=""
  if mx_has capi; then SR_C=1; fi
  # a lost packet may cost a 2 s ACK timeout, and a CM tool waits out its peer's DREQ period
  # (up to 7 s) before it exits (CmToolDevice)
  if mx_has loss; then SR_TIMEOUT=60; fi
  # (the C library records nothing: its programs take no --pcap)
  if [ "$SR_C" = 0 ] && grep -q -- '--pcap' <<<"$("$SOFTROCE_BIN" rc-pingpong --help)"; then
    MX_PCAP=$LAB_RUN/cases/matrix_${cell//[:+]/_}.pcap
    rm -f "$MX_PCAP"
    SR_OPTS="$SR_OPTS --pcap $MX_PCAP"
  fi
  if mx_has mtu4096; then
    guest_set_mtu 4096 vmB
    echo "vmB: eth0 mtu 9000, rxe0 active_mtu $(guest_active_mtu vmB)"
  fi
  if mx_has ipv6; then
    SR_BIND=$LAB_HOST_IP6 SR_PEER=$VM_B6
    SR_GID=$(guest_gid_index vmB "$VM_B6")
    echo "vmB: $VM_B6 is rxe0's GID $SR_GID; softroce --bind $SR_BIND"
    csum0=$(mx_snmp6 Udp6InCsumErrors)
    # Once a cell has seen the host drop rxe's IPv6 datagrams (below), the others cannot pass
    # either: they fail after 2 s instead of 30.
    if [ -e "$MX_CSUM_MARK" ]; then SR_TIMEOUT=2; echo "(2 s limit: $(cat "$MX_CSUM_MARK"))"; fi
  fi
  if mx_has raw; then
    grep -q -- '--backend' <<<"$("$SOFTROCE_BIN" rc-pingpong --help)" \
      || { echo "FAIL: this softroce has no --backend option (no raw backend in its tools)"; exit 1; }
    SR_OPTS="$SR_OPTS --backend raw"
    udp0=$(mx_udp_out)
  fi

  case $MX_KIND in
    pingpong) softroce_pair "$MX_ROLE" "${MX_TOOL%-pingpong}" "$MX_ARGS";;
    perftest)
      if mx_has rdma_cm; then perftest_cm_pair "$MX_ROLE" "$MX_TOOL" "$MX_ARGS"
      else softroce_perftest_pair "$MX_ROLE" "$MX_TOOL" "$MX_ARGS"; fi;;
    rping) rping_pair "$MX_ROLE" "$MX_ARGS";;
    cm) cm_tool_pair "$MX_ROLE" "$MX_TOOL" "$([ "$MX_TOOL" = ucmatose ] && echo 7471 || echo 7174)" "$MX_ARGS";;
  esac
  echo "---- vmB rxe0: sent_pkts +$(mx_counter sent_pkts), rcvd_pkts +$(mx_counter rcvd_pkts)," \
    "duplicate_request +$(mx_counter duplicate_request), out_of_seq_request +$(mx_counter out_of_seq_request)," \
    "rcvd_seq_err +$(mx_counter rcvd_seq_err), completer_retry_err +$(mx_counter completer_retry_err)," \
    "retry_exceeded_err +$(mx_counter retry_exceeded_err)"
  if mx_has loss; then
    stats=$(guest_netem_stats vmB)
    read -r sent_out drop_out sent_in drop_in <<<"$stats"
    echo "---- netem on vmB: out $sent_out passed, $drop_out lost; in $sent_in passed, $drop_in lost"
  fi
  if [ "$SR_RC" != 0 ] || [ "$G_RC" != 0 ]; then
    if [ -n "$MX_PCAP" ] && [ -s "$MX_PCAP" ]; then
      echo "---- the last packets softroce recorded ($MX_PCAP)"
      "$SOFTROCE_BIN" decode "$MX_PCAP" | grep -E '^ *[0-9]+ +[0-9.]+ ' | tail -12 || true
    fi
  fi
  if mx_has ipv6; then
    csum=$(( $(mx_snmp6 Udp6InCsumErrors) - csum0 ))
    echo "---- host side: Udp6InCsumErrors +$csum"
    if [ "$csum" -gt 0 ] && { [ "$SR_RC" != 0 ] || [ "$G_RC" != 0 ]; }; then
      echo "$cell failed with Udp6InCsumErrors +$csum" >"$MX_CSUM_MARK"
      echo "FAIL: the host's kernel dropped rxe's IPv6 RoCE datagrams (Udp6InCsumErrors): rxe sends them with UDP checksum 0, which a UDPv6 socket takes only with UDP_NO_CHECK6_RX (RFC 6936), and softroce's socket does not set it"
      exit 1
    fi
  fi

  case $MX_KIND in
    pingpong) softroce_pair_ok "$MX_SIZE" "$MX_ITERS";;
    perftest) softroce_perftest_ok "$MX_TOOL" "$MX_SIZE" "$MX_ITERS";;
    rping) rping_ok "$MX_ITERS";;
    cm) cm_tool_ok "$MX_TOOL";;
  esac
  if mx_has rdma_cm; then
    wirecheck_expect "softroce does not say it ran on rdma_cm" grep -q '^ Data ex. method : rdma_cm' <<<"$SR_OUT"
    wirecheck_expect "perftest does not say it ran on rdma_cm" grep -q '^ Data ex. method : rdma_cm' <<<"$G_OUT"
  fi
  mx_pcap_check
  if mx_has mtu4096; then
    if [ "$MX_KIND" = perftest ]; then
      wirecheck_expect "softroce does not print 'Mtu : 4096[B]'" grep -qE '^ Mtu +: 4096\[B\]$' <<<"$SR_OUT"
      wirecheck_expect "perftest does not print 'Mtu : 4096[B]'" grep -qE '^ Mtu +: 4096\[B\]$' <<<"$G_OUT"
    fi
    # rxe's own count: the data went in 4096-byte packets, so vmB sent and received fewer
    # packets, ACKs included, than the data alone takes at MTU 1024
    if [ "$MX_MSGS" -gt 0 ]; then
      pkts=$(( $(mx_counter sent_pkts) + $(mx_counter rcvd_pkts) ))
      wirecheck_expect "vmB sent and received $pkts packets: not fewer than the $((MX_MSGS * MX_SIZE / 1024)) that $MX_MSGS messages of $MX_SIZE bytes take at MTU 1024" \
        [ "$pkts" -lt $((MX_MSGS * MX_SIZE / 1024)) ]
      echo "ok: $pkts packets for $MX_MSGS messages of $MX_SIZE bytes (at MTU 1024 the data alone is $((MX_MSGS * MX_SIZE / 1024)))"
    fi
  fi
  if mx_has raw; then
    # the raw socket, not the UDP socket, sent softroce's packets
    udp=$(( $(mx_udp_out) - udp0 ))
    pkts=$("$SOFTROCE_BIN" decode "$MX_PCAP" | grep -cE "^ *[0-9]+ +[0-9.]+ $SR_BIND -> " || true)
    wirecheck_expect "the host side's UDP sent $udp datagrams (Udp OutDatagrams): not the raw backend" [ "$udp" = 0 ]
    wirecheck_expect "softroce recorded no packet it sent" [ "$pkts" -gt 0 ]
    echo "ok: softroce sent $pkts packets, none through the kernel's UDP (Udp OutDatagrams +0)"
  fi
  if mx_has loss; then
    wirecheck_expect "netem lost no packet (out $drop_out, in $drop_in): nothing was recovered" \
      [ $((drop_out + drop_in)) -gt 0 ]
    echo "ok: $((drop_out + drop_in)) RoCE packets lost and recovered from"
  fi
}

# ---------------------------------------------------------------------------------------------
# the table

# mx_note TEXT: sets MX_MARK to "[N]", N the footnote number of TEXT in MX_NOTES (added if new).
mx_note() {
  local i
  for i in "${!MX_NOTES[@]}"; do
    [ "${MX_NOTES[$i]}" = "$1" ] && { MX_MARK="[$((i + 1))]"; return; }
  done
  MX_NOTES+=("$1"); MX_MARK="[${#MX_NOTES[@]}]"
}

cmd_table() {
  local results=$1 md=$2 total=${3:-} tool role col name st why log i rows_md="" rows_txt=""
  local head_md="| tool | softroce |" sep_md="|---|---|" head_txt kver rdma pt rev
  local -A status=()
  local -a cells=()
  MX_NOTES=()
  while IFS=$'\t' read -r name st _; do status[$name]=$st; done <"$results"
  for tool in $MX_TOOLS; do
    for role in client server; do
      cells=()
      for col in base $MX_COLUMNS; do
        if why=$(mx_na "$tool" "$col"); then
          mx_note "$why"; cells+=("— $MX_MARK"); continue
        fi
        if [ "$col" = base ] || mx_base_cell "$tool" "$col"; then
          name=$(mx_case_name "$tool" "$role")
        else
          name="matrix:$tool:$role:$col"
        fi
        st=${status[$name]:-}
        log=$LAB_RUN/cases/${name//[:\/]/_}.log
        case $st in
          PASS) cells+=("PASS");;
          FAIL)
            why=$(grep -m1 '^FAIL: ' "$log" 2>/dev/null | cut -c7- || true)
            [ -n "$why" ] || why=$(grep -m1 -E 'timed out|exit status [1-9]' "$log" 2>/dev/null || true)
            mx_note "${why:-see $log}"; cells+=("FAIL $MX_MARK");;
          *) cells+=("·");;
        esac
      done
      rows_md+="| $tool | $role |"
      rows_txt+=$(printf '%-12s %-7s' "$tool" "$role")
      for i in "${!cells[@]}"; do
        rows_md+=" ${cells[$i]} |"
        rows_txt+=$(printf ' %-14s' "${cells[$i]/—/n\/a}")
      done
      rows_md+=$'\n' rows_txt+=$'\n'
    done
  done
  head_txt=$(printf '%-12s %-7s' tool softroce)
  for col in base $MX_COLUMNS; do
    head_md+=" $(mx_title "$col") |"; sep_md+="---|"
    head_txt+=$(printf ' %-14s' "$(mx_title "$col" | sed 's/MTU 1024, IPv4, UDP/base/')")
  done
  kver=$(lab_kernel_version 2>/dev/null || echo "?")
  rdma=$(dpkg-query -W -f '${Version}' rdma-core 2>/dev/null || echo "?")
  pt=$(dpkg-query -W -f '${Version}' perftest 2>/dev/null || echo "?")
  # (read-only git: --no-optional-locks keeps status from refreshing the index)
  rev=$(git -C "$LAB_REPO" rev-parse --short HEAD 2>/dev/null || echo "?")
  if [ -n "$(git -C "$LAB_REPO" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    rev+=" with uncommitted changes"
  fi
  {
    echo "Interop matrix, $(date -u +%F): softroce $rev on the host side of the lab against the"
    echo "stock tools on kernel rxe in a QEMU guest (Debian 12, kernel $kver, rdma-core $rdma,"
    echo "perftest $pt)${total:+; the whole lab run took $total}. \"softroce\" is its role;"
    echo "· = not run in this run."
    echo
    echo "$head_md"; echo "$sep_md"; printf '%s' "$rows_md"
    echo
    for i in "${!MX_NOTES[@]}"; do echo "[$((i + 1))] ${MX_NOTES[$i]}  "; done
  } >"$md"
  echo
  echo "interop matrix: softroce's tools against rxe in vmB (base = MTU 1024, IPv4, UDP; · = not run)"
  echo "$head_txt"; printf '%s' "$rows_txt"
  for i in "${!MX_NOTES[@]}"; do echo "  [$((i + 1))] ${MX_NOTES[$i]}"; done
  echo "  markdown: $md"
}

case ${1:-} in
  list) cmd_list;;
  run) [ $# = 2 ] || die "usage: matrix.sh run TOOL:ROLE:COLUMN"; cmd_run "$2";;
  table) [ $# -ge 3 ] || die "usage: matrix.sh table RESULTS MD [TIME]"; cmd_table "$2" "$3" "${4:-}";;
  *) die "usage: matrix.sh list | run CELL | table RESULTS MD [TIME]";;
esac
