#!/bin/bash
# Lab self-test, and the template for live checks of a host-side program (e.g. the softroce test
# binary) against a guest: the namespace has no route out, a host-side program run with
# lab_ns_exec reaches a guest server started with guest_bg, and the server's output comes back
# through guest_wait_bg. Here the "server" is busybox nc and the "program" a python one-liner.
# timeout: 60
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

# 1. isolation: only the lab subnet is routable inside the namespace
routes=$(lab_ns_exec ip -4 route show; lab_ns_exec ip -6 route show)
echo "$routes"
if echo "$routes" | grep -q '^default'; then echo "netns $LAB_NS has a default route"; exit 1; fi

# 2. host-side program <-> guest server
lab_guest_reset vmB
guest_bg vmB hostside 20 "nc -l -p 7000"
guest_wait_tcp_listen vmB 7000 10
lab_ns_exec "$LAB_PY" -c '
import socket, sys
s = socket.create_connection((sys.argv[1], 7000), timeout=10)
print("host side bound to", s.getsockname()[0])
s.sendall(b"hello from the host side of the lab\n"); s.close()' "$VM_B"
out=$(guest_wait_bg vmB hostside 20)
echo "server output: $out"
[ "$out" = "hello from the host side of the lab" ] || { echo "guest server did not receive the line"; exit 1; }
echo "host side ($LAB_HOST_IP) <-> vmB ($VM_B) ok"
