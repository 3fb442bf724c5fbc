#!/bin/bash
# softroce against librdmacm: `udaddy` on kernel rxe in vmB (the client) against `softroce udaddy`
# (host side, the server).
# UD service resolution (SIDR_REQ and SIDR_REP on QP1, Q_Key 0x01234567), then 100 SEND_WITH_IMMs
# of 1000 bytes each way: the server answers to an address handle made from the first datagram and
# the QPN its immediate data names.
# Both sides must exit 0 and print exactly their tool's lines.
# timeout: 120
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../cm.sh"

cm_tool_pair server udaddy 7174 "-C 100 -S 1000"
cm_tool_ok udaddy
