#!/usr/bin/python3
"""gexec.py [-t TIMEOUT] IP SCRIPT: run a shell script in a lab guest and relay its exit status.

Must run inside the lab namespace:
    ip netns exec softroce-lab tests/interop/gexec.py 10.99.0.11 'ibv_devinfo -d rxe0'

The guest's init runs `nc -ll -p 5000 -e /bin/sh` (busybox): every TCP connection gets a fresh
shell whose stdin/stdout is the socket. We send a small wrapper that stores SCRIPT in a file,
runs it with a watchdog, then prints a status marker that we strip and turn into our own exit
status. So:
  * a command that hangs in the guest is killed there, with all its children, after TIMEOUT s
    (status 137);
  * if the guest itself stops answering we give up after TIMEOUT + 5 s (status 124);
  * a connection that ends without the marker (guest shell died) gives status 125.
Connection refused is retried for a few seconds: right after boot the nc loop may not listen yet.
"""
import argparse
import socket
import sys
import time

MARK = "__GEXEC_RC_5e1c="
EOF_TAG = "__GEXEC_EOF_5e1c__"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--timeout", type=float, default=60.0, help="seconds (default 60)")
    ap.add_argument("ip")
    ap.add_argument("script")
    a = ap.parse_args()
    if EOF_TAG in a.script:
        sys.exit("gexec: script contains the heredoc terminator")

    # The script runs as the leader of its own session/process group (setsid), so that on timeout
    # the watchdog kills it *and* everything it started (kill -KILL -PGID); busybox `timeout`
    # would only kill the top shell and leave e.g. a hung ibv_rc_pingpong behind. The watchdog's
    # own output goes to /dev/null so its sleep does not keep the connection open.
    t = max(1, int(a.timeout))
    wrapper = (
        "exec 2>&1\n"
        "f=/tmp/gexec.$$\n"
        f"cat >$f <<'{EOF_TAG}'\n{a.script}\n{EOF_TAG}\n"
        "setsid sh $f </dev/null &\n"
        "p=$!\n"
        f"( exec >/dev/null 2>&1; sleep {t}; kill -KILL -$p ) &\n"
        "w=$!\n"
        "wait $p; rc=$?\n"
        "kill $w 2>/dev/null\n"
        f"echo \"{MARK}$rc\"\n"
        "rm -f $f\n"
        "exit\n"
    )
    connect_by = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection((a.ip, 5000), timeout=5)
            break
        except OSError as e:
            if time.monotonic() > connect_by:
                sys.stderr.write(f"gexec: cannot connect to {a.ip}:5000: {e}\n")
                sys.exit(124)
            time.sleep(0.5)
    deadline = time.monotonic() + a.timeout + 5
    s.sendall(wrapper.encode())
    s.shutdown(socket.SHUT_WR)
    # Stream the output line by line (so a case log shows how far a hung command got), holding
    # back the status line. Stop at the status line: a background process the script left
    # running may still hold the connection open (e.g. a server started without redirecting
    # its output).
    out = sys.stdout.buffer
    buf = bytearray()
    rc = None
    mark = MARK.encode()
    try:
        while rc is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            s.settimeout(left)
            d = s.recv(65536)
            if not d:
                break
            buf += d
            while rc is None and b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf = bytearray(rest)
                m = line.find(mark)
                if m >= 0:
                    # (mid-line if the script's output did not end with a newline)
                    out.write(line[:m])
                    try:
                        rc = int(line[m + len(mark):])
                    except ValueError:
                        rc = 125
                else:
                    out.write(line + b"\n")
                    out.flush()
    except socket.timeout:
        out.write(bytes(buf))
        out.flush()
        sys.stderr.write(f"gexec: timeout after {a.timeout:.0f}+5 s waiting for {a.ip}\n")
        sys.exit(124)
    finally:
        s.close()
    if rc is None:
        out.write(bytes(buf))
        out.flush()
        sys.stderr.write(f"gexec: no exit status from {a.ip} (guest shell died?)\n")
        rc = 125
    sys.exit(rc)


if __name__ == "__main__":
    main()
