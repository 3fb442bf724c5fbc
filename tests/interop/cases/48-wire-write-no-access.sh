#!/bin/bash
# Live check: an RDMA WRITE to a QP without remote write access is refused. ibv_rc_pingpong's QP
# has no remote access flags, and rxe_resp.c checks them before the R_Key: the RDMA_WRITE_ONLY
# (raw path) must get RC_ACKNOWLEDGE with syndrome 0x61 (invalid request), its own PSN and MSN 0.
# rxe then moves the QP to the error state and flushes its receive queue, so ibv_rc_pingpong ends
# by itself with "Work Request Flushed Error" and a non-zero status: that is checked too.
# timeout: 300
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

wirecheck_case rc "ibv_rc_pingpong -d rxe0 -g 1 -s 64 -n 1" write-no-access --path raw --size 64
wirecheck_expect "wirecheck write-no-access exited $WC_RC" [ "$WC_RC" = 0 ]
wirecheck_expect "ibv_rc_pingpong exited 0 although its QP must be in the error state" [ "$SRV_RC" != 0 ]
wirecheck_expect "ibv_rc_pingpong did not report a flushed receive" \
  grep -q "Work Request Flushed Error" <<<"$SRV_OUT"
echo "ok: NAK 0x61 for a WRITE without remote access; the guest's QP went to the error state"
