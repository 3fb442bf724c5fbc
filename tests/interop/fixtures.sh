#!/bin/bash
# fixtures.sh: packet fixtures captured from guest-to-guest runs of kernel rxe, and of softroce
# (on the host side) against kernel rxe.
#
#   fixtures.sh list            names of the fixtures this host can produce, one per line
#   fixtures.sh capture NAME    capture NAME into $LAB_RUN/fixtures/ (needs a running lab)
#   fixtures.sh publish         verify the staged captures, copy them to packet-fixtures/rxe/ and
#                               rewrite packet-fixtures/rxe/MANIFEST.tsv
#
# run.sh --fixtures drives this (one lab case per fixture, then "publish"). Every capture is taken
# with tcpdump on the namespace bridge with the filter "udp port 4791": only RoCEv2 frames, not
# the TCP out-of-band exchange of pingpong/perftest nor the lab's own command traffic. The server
# always runs in vmB (10.99.0.12), the client in vmA (10.99.0.11), or, for the softroce_*
# fixtures, softroce on the host side (10.99.0.1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STAGE=$LAB_RUN/fixtures
OUTDIR=$LAB_REPO/packet-fixtures/rxe
ALL="rc_send_mtu1024 rc_send_mtu4096 rc_send_pad uc_send ud_send rc_write_small rc_write_multi rc_read_multi
rc_atomic_fetch_add rc_atomic_cmp_swap rc_write_imm rc_lossy rdma_cm_rping rc_send_ipv6
softroce_rdma_cm_rping"
# perftest options common to all perftest fixtures: rxe0, IPv4-mapped GID (-x 1), and -F because
# under TCG the CPU frequency check fails; -n is kept small so captures stay small.
PT="-d rxe0 -x 1 -F"

perftest_has_write_imm() { grep -q -- '--write_with_imm' <<<"$(ib_write_bw --help 2>&1)"; }

# fixture_def NAME: sets the F_* variables describing one fixture.
#   F_STEPS   array of "SERVER_CMD|CLIENT_CMD" runs, in order, all in one capture
#   F_MTU     RoCE path MTU 1024 or 4096 (eth0 1500 or 9000 in both guests)
#   F_IP      IP version of the RoCE frames
#   F_CAP     tcpdump -c limit; reaching it counts as a failure (the capture may be truncated)
#   F_OPS     BTH opcodes that must all occur (verify_icrc.py --expect-opcodes)
#   F_PORT    TCP port the server listens on before the client may start ("-": wait 2 s)
#   F_OK      regex each side's output must match (besides both exiting 0)
#   F_LOSS    netem loss % applied to vmA's outgoing RoCE packets ("" = none)
#   F_TRIES   attempts (a random-loss capture may by chance show no NAK/retransmission)
#   F_TIMEOUT seconds each side of a step may take
fixture_def() {
  F_MTU=1024 F_IP=4 F_CAP=400 F_PORT=18515 F_LOSS="" F_TRIES=1 F_OPS="" F_OK="" F_DESC="" F_TIMEOUT=60
  F_STEPS=()
  local pp="iters in [0-9.]+ seconds" pt="^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+"
  case $1 in
    rc_send_mtu1024)
      F_DESC="RC SEND 4096-byte messages at path MTU 1024 (SEND_FIRST/MIDDLE/MIDDLE/LAST + ACK), ibv_rc_pingpong, 5 round trips"
      F_STEPS=("ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 5|ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 5 $VM_B")
      F_OPS=0x00,0x01,0x02,0x11 F_OK=$pp;;
    rc_send_mtu4096)
      F_MTU=4096
      F_DESC="RC SEND 16384-byte messages at path MTU 4096 (eth0 MTU 9000; SEND_FIRST/MIDDLE/MIDDLE/LAST + ACK), ibv_rc_pingpong, 5 round trips"
      F_STEPS=("ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 16384 -n 5|ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 16384 -n 5 $VM_B")
      F_OPS=0x00,0x01,0x02,0x11 F_OK=$pp;;
    rc_send_pad)
      F_DESC="RC SEND 1030-byte messages at path MTU 1024: SEND_FIRST (1024 bytes) + SEND_LAST with 6 payload bytes and BTH PadCnt 2, + ACK, ibv_rc_pingpong, 3 round trips"
      F_STEPS=("ibv_rc_pingpong -d rxe0 -g 1 -s 1030 -n 3|ibv_rc_pingpong -d rxe0 -g 1 -s 1030 -n 3 $VM_B")
      F_OPS=0x00,0x02,0x11 F_OK=$pp;;
    uc_send)
      F_DESC="UC SEND 4096-byte messages at path MTU 1024 (UC SEND_FIRST/MIDDLE/LAST, no ACKs), ibv_uc_pingpong, 5 round trips"
      F_STEPS=("ibv_uc_pingpong -d rxe0 -g 1 -s 4096 -n 5|ibv_uc_pingpong -d rxe0 -g 1 -s 4096 -n 5 $VM_B")
      F_OPS=0x20,0x21,0x22 F_OK=$pp;;
    ud_send)
      F_DESC="UD SEND_ONLY 512-byte messages (DETH with Q_Key), ibv_ud_pingpong, 5 round trips"
      F_STEPS=("ibv_ud_pingpong -d rxe0 -g 1 -s 512 -n 5|ibv_ud_pingpong -d rxe0 -g 1 -s 512 -n 5 $VM_B")
      F_OPS=0x64 F_OK=$pp;;
    rc_write_small)
      F_DESC="RC RDMA WRITE_ONLY 64 bytes + ACK, ib_write_bw, 5 iterations"
      F_STEPS=("ib_write_bw $PT -s 64 -n 5|ib_write_bw $PT -s 64 -n 5 $VM_B")
      F_OPS=0x0a,0x11 F_OK=$pt;;
    rc_write_multi)
      F_DESC="RC RDMA WRITE 8192 bytes at path MTU 1024 (WRITE_FIRST/MIDDLE/LAST + ACK), ib_write_bw, 5 iterations"
      F_STEPS=("ib_write_bw $PT -s 8192 -n 5|ib_write_bw $PT -s 8192 -n 5 $VM_B")
      F_OPS=0x06,0x07,0x08,0x11 F_OK=$pt;;
    rc_read_multi)
      F_DESC="RC RDMA READ 8192 bytes at path MTU 1024 (READ_REQUEST, READ_RESPONSE_FIRST/MIDDLE/LAST), ib_read_bw, 5 iterations"
      F_STEPS=("ib_read_bw $PT -s 8192 -n 5|ib_read_bw $PT -s 8192 -n 5 $VM_B")
      F_OPS=0x0c,0x0d,0x0e,0x0f F_OK=$pt;;
    rc_atomic_fetch_add)
      F_DESC="RC FETCH_ADD + ATOMIC_ACKNOWLEDGE (AtomicETH/AtomicAckETH), ib_atomic_bw, 5 iterations"
      F_STEPS=("ib_atomic_bw $PT -A FETCH_AND_ADD -n 5|ib_atomic_bw $PT -A FETCH_AND_ADD -n 5 $VM_B")
      F_OPS=0x14,0x12 F_OK=$pt;;
    rc_atomic_cmp_swap)
      F_DESC="RC CMP_SWAP + ATOMIC_ACKNOWLEDGE (AtomicETH/AtomicAckETH), ib_atomic_bw, 5 iterations"
      F_STEPS=("ib_atomic_bw $PT -A CMP_AND_SWAP -n 5|ib_atomic_bw $PT -A CMP_AND_SWAP -n 5 $VM_B")
      F_OPS=0x13,0x12 F_OK=$pt;;
    rc_write_imm)
      F_DESC="RC RDMA WRITE with immediate: 64 bytes (WRITE_ONLY_WITH_IMM) then 2048 bytes at MTU 1024 (WRITE_FIRST + WRITE_LAST_WITH_IMM), ib_write_bw --write_with_imm, 5 iterations each"
      F_STEPS=("ib_write_bw $PT --write_with_imm -s 64 -n 5|ib_write_bw $PT --write_with_imm -s 64 -n 5 $VM_B"
               "ib_write_bw $PT --write_with_imm -s 2048 -n 5|ib_write_bw $PT --write_with_imm -s 2048 -n 5 $VM_B")
      F_OPS=0x0b,0x06,0x09,0x11 F_OK=$pt;;
    rc_lossy)
      F_LOSS=10 F_TRIES=4 F_TIMEOUT=30
      F_DESC="RC SEND 4096-byte messages at MTU 1024 with 10% netem loss of the requests vmA (client) sends (its ACKs are spared): NAK (PSN sequence error, AETH syndrome 0x60), go-back-N and timeout retransmissions, duplicate ACKs; ibv_rc_pingpong, 10 round trips"
      F_STEPS=("ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 10|ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 10 $VM_B")
      F_OPS=0x00,0x01,0x02,0x11 F_OK=$pp;;
    rdma_cm_rping)
      F_PORT=-
      F_DESC="RDMA-CM connection setup/teardown (CM MADs as UD SEND_ONLY to QP1) and rping's RC traffic (SEND, RDMA READ, RDMA WRITE), rping -C 3"
      F_STEPS=("rping -s -a $VM_B -C 3 -v|rping -c -a $VM_B -C 3 -v")
      F_OPS=0x64,0x04,0x0c,0x10,0x0a,0x11 F_OK="ping data: rdma-ping-";;
    softroce_rdma_cm_rping)
      F_PORT=-
      F_DESC="softroce's CM against kernel rxe's: softroce rping -c (host side, 10.99.0.1) against rping -s in vmB: REQ, REP, RTU, rping's SEND, READ and WRITE, then softroce's DREQ and rxe's DREP, rping -C 3"
      F_STEPS=("rping -s -a $VM_B -C 3 -v|host:$SOFTROCE_BIN rping -c -a $VM_B -I $LAB_HOST_IP --mtu 1024 -C 3 -v")
      F_OPS=0x64,0x04,0x0c,0x10,0x0a,0x11 F_OK="ping data: rdma-ping-";;
    rc_send_ipv6)
      F_IP=6
      F_DESC="RC SEND 4096-byte messages at path MTU 1024 over IPv6 (GID index 0, link-local), ibv_rc_pingpong -g 0, 5 round trips"
      F_STEPS=("ibv_rc_pingpong -d rxe0 -g 0 -s 4096 -n 5|ibv_rc_pingpong -d rxe0 -g 0 -s 4096 -n 5 $VM_B")
      F_OPS=0x00,0x01,0x02,0x11 F_OK=$pp;;
    *) die "unknown fixture '$1'";;
  esac
}

# netem_setup: the tc commands that make vmA drop F_LOSS % of the RoCE requests it sends. A prio
# qdisc gets a netem child on band 1:3; u32 filters send UDP dport 4791 there, except ACKs (BTH
# opcode 0x11 at offset 28 of rxe's option-less IPv4 header), which stay on the lossless band 1:2
# like all other traffic (the command server's TCP). Why spare the ACKs: when the client's last ACK
# is lost, the client has already exited and destroyed its QP, so the server retries into the void
# and rc_pingpong (and the case) can hang until its timeout. Lost requests still produce NAKs
# (PSN sequence error) and timeout retransmissions, which is what the fixture is for.
netem_setup() {
  echo "$GUEST_TC qdisc add dev eth0 root handle 1: prio;"
  echo "$GUEST_TC qdisc add dev eth0 parent 1:3 handle 30: netem loss $F_LOSS%;"
  echo "$GUEST_TC filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport 4791 0xffff match u8 0x11 0xff at 28 flowid 1:2;"
  echo "$GUEST_TC filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip dport 4791 0xffff flowid 1:3;"
}

fixture_command() {   # the manifest's "command" column
  local s out="" sep=""
  if [ "$F_MTU" = 4096 ]; then out="vmA+vmB: ip link set eth0 mtu 9000" sep=" ; then "; fi
  if [ -n "$F_LOSS" ]; then out="$out${sep}vmA: $(netem_setup | tr '\n' ' ' | sed 's/; *$//')" sep=" ; then "; fi
  for s in "${F_STEPS[@]}"; do
    out="$out${sep}server: ${s%%|*} ; client: ${s#*|}"
    sep=" ; then "
  done
  # a host-side client is softroce, wherever its binary was
  echo "${out//host:$SOFTROCE_BIN/(host side) softroce}"
}

cmd_list() {
  local n
  for n in $ALL; do
    if [ "$n" = rc_write_imm ] && ! perftest_has_write_imm; then
      echo "note: this perftest's ib_write_bw has no --write_with_imm; skipping rc_write_imm" >&2
      continue
    fi
    echo "$n"
  done
}

cmd_capture() {
  local name=$1 pcap try s i ok verify_args
  fixture_def "$name"
  case $name in softroce_*) softroce_build || return 1;; esac
  mkdir -p "$STAGE"
  pcap=$STAGE/$name.pcap
  rm -f "$pcap" "$STAGE/$name.row"
  # whatever happens, leave the guests at MTU 1024 without netem for the next case
  trap 'lab_guest_reset vmA vmB >/dev/null 2>&1 || true; guest_set_mtu 1024 vmA vmB >/dev/null 2>&1 || true' EXIT
  verify_args=(--expect-opcodes "$F_OPS" --expect-ip "$F_IP" --max-frames $((F_CAP - 1)))
  [ -n "$F_LOSS" ] && verify_args+=(--expect-loss-recovery)
  for try in $(seq 1 "$F_TRIES"); do
    echo "==== $name, attempt $try/$F_TRIES"
    lab_guest_reset vmA vmB
    guest_burn_qpn vmB
    guest_set_mtu "$F_MTU" vmA vmB
    echo "rxe0 active_mtu: vmA $(guest_active_mtu vmA), vmB $(guest_active_mtu vmB)"
    if [ -n "$F_LOSS" ]; then
      # only RoCE (UDP dport 4791) goes through netem; the command server's TCP stays loss-free
      gexec vmA 15 "$(netem_setup | sed 's/;$/ \&\&/') $GUEST_TC qdisc show dev eth0"
    fi
    lab_capture_start "$pcap" "$F_CAP" "udp port 4791"
    ok=1 i=0
    for s in "${F_STEPS[@]}"; do
      i=$((i + 1))
      out=$(run_pair "fx_${name}_$i" "${s%%|*}" "${s#*|}" "$F_TIMEOUT" "$F_PORT") || ok=0
      echo "$out"
      if [ "$ok" = 1 ] && [ -n "$F_OK" ]; then
        # both sides must print the success line
        [ "$(echo "$out" | sed -n '/^---- client (/,/^---- client exit/p' | grep -cE "$F_OK")" -ge 1 ] || { echo "client output lacks /$F_OK/"; ok=0; }
        [ "$(echo "$out" | sed -n '/^---- server (/,/^---- server exit/p' | grep -cE "$F_OK")" -ge 1 ] || { echo "server output lacks /$F_OK/"; ok=0; }
      fi
      [ "$ok" = 1 ] || break
    done
    lab_capture_stop || ok=0
    [ -n "$F_LOSS" ] && gexec vmA 15 "$GUEST_TC -s qdisc show dev eth0; $GUEST_TC qdisc del dev eth0 root"
    if [ "$ok" = 1 ] && "$LAB_PY" "$LAB_DIR/verify_icrc.py" "${verify_args[@]}" "$pcap"; then
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name.pcap" "$F_MTU" "$F_IP" "?" "-" "$F_DESC" \
        "$(fixture_command)" >"$STAGE/$name.row"
      echo "staged $pcap ($(pcap_count "$pcap") frames)"
      return 0
    fi
  done
  echo "fixture $name failed"
  return 1
}

cmd_publish() {
  local rows=() f n have new=0 tmp
  mkdir -p "$OUTDIR"
  for f in "$STAGE"/*.row; do [ -e "$f" ] && new=$((new + 1)); done
  [ "$new" -gt 0 ] || die "nothing staged in $STAGE"
  # 1. the staged captures must all verify
  "$LAB_PY" "$LAB_DIR/verify_icrc.py" "$STAGE"/*.pcap
  # 2. copy them in; keep the manifest rows of fixtures not regenerated this time
  tmp=$(mktemp)
  for n in $ALL; do
    if [ -f "$STAGE/$n.row" ]; then
      cp "$STAGE/$n.pcap" "$OUTDIR/$n.pcap"
      cat "$STAGE/$n.row" >>"$tmp"
    elif [ -f "$OUTDIR/MANIFEST.tsv" ] && [ -f "$OUTDIR/$n.pcap" ]; then
      awk -F'\t' -v f="$n.pcap" '$1 == f' "$OUTDIR/MANIFEST.tsv" >>"$tmp"
    fi
  done
  # 3. the packets column always comes from the file itself
  {
    printf 'file\tmtu\tip\tpackets\tcorrupt_frames\tdescription\tcommand\n'
    while IFS=$'\t' read -r file mtu ipv _pk corrupt desc cmd; do
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$file" "$mtu" "$ipv" "$(pcap_count "$OUTDIR/$file")" \
        "$corrupt" "$desc" "$cmd"
    done <"$tmp"
  } >"$OUTDIR/MANIFEST.tsv.new"
  rm -f "$tmp"
  mv "$OUTDIR/MANIFEST.tsv.new" "$OUTDIR/MANIFEST.tsv"
  # 4. final check over what is now in the repository: every pcap listed, every listed pcap ok
  for f in "$OUTDIR"/*.pcap; do
    have=$(basename "$f")
    awk -F'\t' -v f="$have" 'NR > 1 && $1 == f { found = 1 } END { exit !found }' "$OUTDIR/MANIFEST.tsv" \
      || die "$have is not in MANIFEST.tsv"
  done
  "$LAB_PY" "$LAB_DIR/verify_icrc.py" "$OUTDIR"/*.pcap
  echo "published $new fixture(s) to $OUTDIR"
  column -t -s $'\t' "$OUTDIR/MANIFEST.tsv" 2>/dev/null | cut -c1-120 || cat "$OUTDIR/MANIFEST.tsv"
}

case ${1:-} in
  list) cmd_list;;
  capture) [ $# -eq 2 ] || die "usage: fixtures.sh capture NAME"; cmd_capture "$2";;
  publish) cmd_publish;;
  *) echo "usage: fixtures.sh list | capture NAME | publish" >&2; exit 2;;
esac
