#!/usr/bin/env bash
# Two RDMA WRITE flows and a SEND ping-pong share one bottleneck that marks CE, between network
# namespaces, with softroce's congestion control on (the default: ECT(0), CNPs, DCQCN) and off
# (`--cc off`, as kernel rxe). Prints docs/congestion-control.md's congestion table: each flow's
# goodput, the ping-pong's typical latency (the queue's delay), and what the bottleneck marked and
# dropped.
# Needs root (namespaces, packet sockets) and ethtool. Takes about a minute.
#
# The bottleneck: host A's veth leads to a namespace where `examples/ecn_switch.rs` forwards
# frames to host B's veth at RATE_MBPS (default 200), through a queue that marks as RED with ECN
# (from 10 KB, certainly at 100 KB, as the simulator's) and drops past 150 KB: a switch port
# of the DCQCN paper, scaled down. This host's kernel has no marking qdisc (RED, fq_codel and
# netem are not built), hence a switch in user space. The way back (ACKs, CNPs) is not limited.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE_MBPS=${RATE_MBPS:-200}
DURATION=${DURATION:-8}
# What `--cc` says in the run with congestion control: the defaults unless told.
CC_ON=${CC_ON:-on}
A=sr-cc-a
S=sr-cc-s
B=sr-cc-b
MAC_A=02:00:00:00:cc:0a
MAC_B=02:00:00:00:cc:0b

cargo build --release --quiet --bin softroce --example ecn_switch
BIN=$PWD/target/release/softroce
SWITCH=$PWD/target/release/examples/ecn_switch

cleanup() {
    for ns in "$A" "$S" "$B"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    done
    sleep 0.2
    for ns in "$A" "$S" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup

for ns in "$A" "$S" "$B"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip link add veth-cc-a netns "$A" address "$MAC_A" type veth peer name s-a netns "$S"
ip link add veth-cc-b netns "$B" address "$MAC_B" type veth peer name s-b netns "$S"
for n in 1 3 5; do ip -n "$A" addr add 10.77.0.$n/24 dev veth-cc-a; done
for n in 2 4 6; do ip -n "$B" addr add 10.77.0.$n/24 dev veth-cc-b; done
for link in "$A veth-cc-a" "$B veth-cc-b" "$S s-a" "$S s-b"; do
    set -- $link
    ip -n "$1" link set "$2" up
    # Frames of at most the MTU, as a switch sees them (no segmentation offload trains), with
    # their checksums filled in: a packet socket forwards what a veth left to "hardware".
    ip netns exec "$1" ethtool -K "$2" tx off rx off tso off gso off gro off >/dev/null
done

echo "<!-- $(date -u +%F), $(nproc) cores, bottleneck ${RATE_MBPS} Mb/s, RED ECN 10-100 KB, limit 150 KB, ${DURATION} s per run -->"
echo "| congestion control | flow 1 MB/s | flow 2 MB/s | SEND 8 B latency, typical | marked CE | dropped | deepest queue |"
echo "|---|---|---|---|---|---|---|"
for cc in "$CC_ON" off; do
    out=$(mktemp -d)
    ip netns exec "$S" "$SWITCH" s-a "$MAC_A" s-b "$MAC_B" "$RATE_MBPS" 10000 100000 0.2 \
        150000 "$out/switch" &
    sleep 0.5
    for n in 1 2; do
        ip netns exec "$B" "$BIN" write-bw --cc "$cc" --bind 10.77.0.$((2 * n)) -p 1860$n \
            -D "$DURATION" >/dev/null 2>&1 &
    done
    ip netns exec "$B" "$BIN" send-lat --cc "$cc" --bind 10.77.0.6 -p 18603 -n 2000 \
        >/dev/null 2>&1 &
    sleep 1
    flows=()
    for n in 1 2; do
        ip netns exec "$A" "$BIN" write-bw --cc "$cc" --bind 10.77.0.$((2 * n - 1)) \
            -p 1860$n -D "$DURATION" --json 10.77.0.$((2 * n)) >"$out/flow$n" 2>&1 &
        flows+=($!)
    done
    # The ping-pong runs in the middle of the flows: its SENDs queue behind theirs.
    sleep $((DURATION / 3))
    ip netns exec "$A" "$BIN" send-lat --cc "$cc" --bind 10.77.0.5 -p 18603 -n 2000 --json \
        10.77.0.6 >"$out/lat" 2>&1 || true
    wait "${flows[@]}" || true
    sleep 0.3
    read -r _ _ _ marked _ dropped _ deepest <"$out/switch"
    ip netns pids "$S" | xargs -r kill
    ip netns pids "$B" | xargs -r kill 2>/dev/null || true
    wait 2>/dev/null || true
    number() { grep -o "\"$1\": *[0-9.]*" "$2" | head -1 | sed 's/.*: *//'; }
    printf '| %s | %s | %s | %s µs | %s | %s | %s B |\n' "$cc" \
        "$(number BW_average "$out/flow1")" "$(number BW_average "$out/flow2")" \
        "$(number t_typical "$out/lat")" "$marked" "$dropped" "$deepest"
    rm -rf "$out"
done
