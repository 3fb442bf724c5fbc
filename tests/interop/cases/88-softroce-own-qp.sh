#!/bin/bash
# softroce against librdmacm: a program that moves its own QP, as UCX does
# (src/capi/tests/own_qp.c: IDs without a QP, the QP named by conn_param.qp_num and moved with
# rdma_init_qp_attr, the client's rdma_establish after CONNECT_RESPONSE). Built once on the host
# side against Debian's librdmacm, it runs in vmB on kernel rxe and on the host side through
# softroce's libibverbs.so.1 and librdmacm.so.1 (`softroce run`), softroce as the client, then
# as the server. So the program's expectations of librdmacm are checked against the real one,
# and softroce's CM against the kernel's for a QP it does not move.
# The client WRITEs into the server's buffer and SENDs to it; both sides must exit 0 and print
# their line.
# timeout: 240
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

softroce_build || exit 1
prog=$LAB_RUN/own_qp
# After c/common.h (CHECK), as the C library's tests compile it.
cc -O1 -include "$LAB_REPO/src/capi/tests/c/common.h" -o "$prog" \
  "$LAB_REPO/src/capi/tests/own_qp.c" -lrdmacm -libverbs || {
  echo "FAIL: cannot build own_qp.c (libibverbs-dev, librdmacm-dev)"; exit 1; }
lab_guest_fetch "$prog" /tmp/own_qp vmB || { echo "FAIL: cannot copy own_qp into vmB"; exit 1; }

own_qp_ok() {
  wirecheck_expect "softroce's side exited $SR_RC" [ "$SR_RC" = 0 ]
  wirecheck_expect "the guest's side exited $G_RC" [ "$G_RC" = 0 ]
  local server=$SR_OUT client=$G_OUT
  [ "$SR_ROLE" = client ] && server=$G_OUT client=$SR_OUT
  wirecheck_expect "the server did not get both messages" \
    grep -q 'server: received "ping" and "written"' <<<"$server"
  wirecheck_expect "the client did not finish" grep -q 'client: wrote and sent' <<<"$client"
  echo "ok: own_qp, softroce $SR_ROLE"
}

port=7176
softroce_cm_pair client own_qp "$port" "/tmp/own_qp server $VM_B $port" \
  "$(sr_c_cmd "$prog" client "$VM_B" "$port")" ""
own_qp_ok
softroce_cm_pair server own_qp "$port" "/tmp/own_qp client $LAB_HOST_IP $port" \
  "$(sr_c_cmd "$prog" server "$LAB_HOST_IP" "$port")" "server: listening"
own_qp_ok
