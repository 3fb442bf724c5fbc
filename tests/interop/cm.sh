# shellcheck shell=bash
# cm.sh: the lab's helpers for softroce's RDMA-CM tools (rping, ucmatose, udaddy, perftest -R)
# against librdmacm's in vmB. Sourced after lib.sh by the cases of cases/8*.sh and by matrix.sh.
# There is no TCP exchange to wait for: a guest server is ready once rdma_cm lists its ID in
# state LISTEN (`rdma resource show cm_id`), a softroce server once it prints its READY line.

# guest_wait_cm_listen GUEST PORT TIMEOUT: wait until an rdma_cm ID in GUEST listens on PORT.
guest_wait_cm_listen() {
  local g=$1 port=$2 to=$3
  gexec "$g" $((to + 5)) "i=0
until rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN .*:$port '; do
  i=\$((i+1)); [ \$i -gt $((to * 10)) ] && { echo 'no rdma_cm ID listens on port $port'; rdma resource show cm_id; exit 1; }; sleep 0.1
done" >/dev/null
}

# softroce_cm_pair ROLE TAG PORT GUEST_CMD SOFTROCE_CMD READY: one run of a softroce CM tool
# against a librdmacm tool in vmB.
#   ROLE client: GUEST_CMD is the server (in vmB, background); once it listens on PORT,
#                SOFTROCE_CMD runs on the host side as its client.
#   ROLE server: SOFTROCE_CMD is the server (host side, background); once its output has a line
#                matching READY (grep), GUEST_CMD runs in vmB as its client.
# Each side is given $SR_TIMEOUT seconds; when one fails, the other is stopped. Prints both
# sides' output and vmB's rxe counters; sets SR_OUT/SR_RC, G_OUT/G_RC, SR_ROLE and
# SR_CNT_BEFORE/SR_CNT_AFTER as softroce_guest_pair does. SR_PREPARE runs after vmB's reset.
softroce_cm_pair() {
  local role=$1 tag=$2 port=$3 gcmd=$4 scmd=$5 ready=$6
  softroce_build || return 1
  lab_guest_reset vmB || { echo "cannot reset vmB"; return 1; }
  if [ -n "$SR_PREPARE" ]; then $SR_PREPARE || { echo "'$SR_PREPARE' failed"; return 1; }; fi
  SR_CNT_BEFORE=$(guest_rxe_counters vmB)
  SR_RC=0 G_RC=0 SR_ROLE=$role
  case $role in
    client)
      guest_bg vmB "cm_$tag" "$SR_TIMEOUT" "$gcmd" || { echo "cannot start '$gcmd' in vmB"; return 1; }
      if ! guest_wait_cm_listen vmB "$port" 15; then
        echo "'$gcmd' does not listen on port $port:"; guest_wait_bg vmB "cm_$tag" 1; return 1
      fi
      SR_OUT=$(lab_ns_exec timeout "$SR_TIMEOUT" $scmd 2>&1) || SR_RC=$?
      [ "$SR_RC" = 0 ] || lab_guest_reset vmB || true
      G_OUT=$(guest_wait_bg vmB "cm_$tag" 30) || G_RC=$?
      gcmd="$gcmd (server)" scmd="$scmd (client)"
      ;;
    server)
      sr_serve_guest_client "$scmd" "$ready" "$gcmd" "$LAB_RUN/softroce-$tag-server.out"
      gcmd="$gcmd (client)" scmd="$scmd (server)"
      ;;
    *) echo "softroce_cm_pair: ROLE is client or server, not '$role'"; return 1;;
  esac
  sr_pair_report "$scmd" "$gcmd"
}

# rping_pair ROLE ARGS [SOFTROCE_ARGS]: softroce rping against rping in vmB, both with ARGS
# (rping's syntax, without -s/-c/-a), over $SR_BIND and $SR_PEER; softroce also with $SR_OPTS
# and --mtu $SR_MTU: the host side's link runs jumbo frames (br0, MTU 9000) whatever vmB's eth0
# has, and a CM client names its own link's MTU in its REQ, which the kernel's server takes.
# With SR_C=1, librdmacm's rping runs on the host side instead, through softroce's C library.
rping_pair() {
  local role=$1 args=$2 sargs=${3:-}
  case $SR_C:$role in
    1:client) softroce_cm_pair client rping 7174 "rping -s -a $SR_PEER -v $args" \
                "$(sr_c_cmd "rping -c -a $SR_PEER -I $SR_BIND -v $args $sargs")" "";;
    1:server) softroce_cm_pair server rping 7174 "rping -c -a $SR_BIND -v $args" \
                "$(sr_c_cmd "rping -s -a $SR_BIND -d -v $args $sargs")" '^rdma_listen$';;
    0:client) softroce_cm_pair client rping 7174 "rping -s -a $SR_PEER -v $args" \
                "$SOFTROCE_BIN rping -c -a $SR_PEER -I $SR_BIND --mtu ${SR_MTU:-1024} $SR_OPTS -v $args $sargs" "";;
    0:server) softroce_cm_pair server rping 7174 "rping -c -a $SR_BIND -v $args" \
                "$SOFTROCE_BIN rping -s -a $SR_BIND -d $SR_OPTS -v $args $sargs" '^rdma_listen$';;
  esac
}

# rping_ok COUNT: the last rping_pair passed: both sides exited 0; the client printed COUNT
# "ping data:" lines and the server COUNT "server ping data:" lines, every one rping's text;
# the server saw the client's disconnect (its "server DISCONNECT EVENT..." line, which rping
# writes to standard error while its standard output is still buffered: anywhere in the text).
rping_ok() {
  local count=$1 client server
  if [ "$SR_ROLE" = client ]; then client=$SR_OUT server=$G_OUT; else client=$G_OUT server=$SR_OUT; fi
  wirecheck_expect "softroce exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest's rping exited $G_RC" [ "$G_RC" = 0 ]
  wirecheck_expect "the client printed $(grep -c '^ping data: rdma-ping-' <<<"$client") ping lines, not $count" \
    [ "$(grep -cE '^ping data: rdma-ping-[0-9]+: [A-z]+' <<<"$client")" = "$count" ]
  wirecheck_expect "the server printed $(grep -c '^server ping data: ' <<<"$server") ping lines, not $count" \
    [ "$(grep -cE '^server ping data: rdma-ping-[0-9]+: [A-z]+' <<<"$server")" = "$count" ]
  wirecheck_expect "the server did not see the client's disconnect" \
    grep -qF 'server DISCONNECT EVENT...' <<<"$server"
  echo "ok: rping, softroce $SR_ROLE: $count pings each way checked (-V), disconnect seen"
}

# cm_tool_pair ROLE TOOL PORT ARGS: softroce ucmatose or udaddy (TOOL) against the same tool in
# vmB, both with ARGS; the server binds its address (-b), the client names the server (-s).
# With SR_C=1, librdmacm's TOOL runs on the host side instead, through softroce's C library.
cm_tool_pair() {
  local role=$1 tool=$2 port=$3 args=$4 ready
  ready="^$([ "$tool" = ucmatose ] && echo cmatose || echo udaddy): starting server\$"
  case $SR_C:$role in
    1:client) softroce_cm_pair client "$tool" "$port" "$tool -b $SR_PEER $args" \
                "$(sr_c_cmd "$tool -s $SR_PEER -b $SR_BIND $args")" "";;
    1:server) softroce_cm_pair server "$tool" "$port" "$tool -s $SR_BIND $args" \
                "$(sr_c_cmd "$tool -b $SR_BIND $args")" "$ready";;
    0:client) softroce_cm_pair client "$tool" "$port" "$tool -b $SR_PEER $args" \
                "$SOFTROCE_BIN $tool -s $SR_PEER -b $SR_BIND $(cm_client_mtu "$tool") $SR_OPTS $args" "";;
    0:server) softroce_cm_pair server "$tool" "$port" "$tool -s $SR_BIND $args" \
                "$SOFTROCE_BIN $tool -b $SR_BIND $SR_OPTS $args" "$ready";;
  esac
}

# cm_client_mtu TOOL: the --mtu a softroce CM client of TOOL takes, $SR_MTU (see rping_pair);
# udaddy's UD datagrams follow the port MTU and have no path to negotiate.
cm_client_mtu() { [ "$1" = udaddy ] || echo "--mtu ${SR_MTU:-1024}"; }

# cm_tool_lines TOOL SIDE: the lines rdma-core 44's TOOL prints as SIDE (server or client), in
# order (cmatose.c, udaddy.c); ucmatose's server says "disconnected" once all its connections
# have ended.
cm_tool_lines() {
  local tool=$1 side=$2
  case $tool:$side in
    ucmatose:server)
      printf '%s\n' "cmatose: starting server" "initiating data transfers" "completing sends" \
        "receiving data transfers" "data transfers complete" "cmatose: disconnecting" disconnected;;
    ucmatose:client)
      printf '%s\n' "cmatose: starting client" "cmatose: connecting" "receiving data transfers" \
        "sending replies" "data transfers complete";;
    udaddy:server)
      printf '%s\n' "udaddy: starting server" "receiving data transfers" "sending replies" \
        "data transfers complete";;
    udaddy:client)
      printf '%s\n' "udaddy: starting client" "udaddy: connecting" "initiating data transfers" \
        "receiving data transfers" "data transfers complete";;
  esac
  printf '%s\n' "test complete" "return status 0"
}

# cm_tool_ok TOOL: the last cm_tool_pair passed: both sides exited 0 and printed exactly their
# tool's lines (for ucmatose, the server's "disconnected": its DREQs were answered).
cm_tool_ok() {
  local tool=$1 s_side=client g_side=server
  [ "$SR_ROLE" = server ] && s_side=server g_side=client
  wirecheck_expect "softroce exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest's $tool exited $G_RC" [ "$G_RC" = 0 ]
  wirecheck_expect "softroce's lines are not $tool's as $s_side (above)" \
    [ "$(grep -v '^$' <<<"$SR_OUT")" = "$(cm_tool_lines "$tool" "$s_side")" ]
  wirecheck_expect "the guest's lines are not $tool's as $g_side (above)" \
    [ "$(grep -v '^$' <<<"$G_OUT")" = "$(cm_tool_lines "$tool" "$g_side")" ]
  echo "ok: $tool, softroce $SR_ROLE: both sides printed $tool's lines"
}

# perftest_cm_pair ROLE TEST ARGS: softroce's TEST (write-bw, ..., read-lat) against perftest's
# ib_TEST in vmB, both with ARGS (which hold -R) and -x $SR_GID; the exchange and the QPs are
# on RDMA-CM, on perftest's port 18515. A softroce server is ready once it prints perftest's
# "Waiting for client to connect" banner, which it does once it listens.
perftest_cm_pair() {
  local role=$1 test=$2 args=$3 gcmd scmd
  gcmd="ib_${test//-/_} -d rxe0 -x $SR_GID $args"
  scmd="$SOFTROCE_BIN $test --bind $SR_BIND -x $SR_GID $SR_OPTS $args"
  case $role in
    client) scmd+=" $SR_PEER";;
    server) gcmd+=" $SR_BIND";;
  esac
  softroce_cm_pair "$role" "cm_${test//-/_}" 18515 "$gcmd" "$scmd" 'Waiting for client to connect'
}
