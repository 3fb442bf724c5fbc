#!/usr/bin/python3
"""gexec.py [-t TIMEOUT] IP SCRIPT: run a shell script in a lab guest and relay its exit status.

Must run inside the lab namespace:
    ip netns exec softroce-lab tests/interop/gexec.py 10.99.0.11 'ibv_devinfo -d rxe0'

The guest's init runs `nc -ll -p 5000 -e /bin/sh` (busybox): every TCP connection gets a fresh
shell whose stdin/stdout is the socket. We send a small wrapper that stores SCRIPT in a file and
runs it under the guest's `timeout -s KILL`, then prints a status marker that we strip and turn
into our own exit status. So:
  * a command that hangs in the guest is killed there after TIMEOUT s (status 137);
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

    wrapper = (
        "exec 2>&1\n"
        f"f=/tmp/gexec.$$\n"
        f"cat >$f <<'{EOF_TAG}'\n{a.script}\n{EOF_TAG}\n"
        f"timeout -s KILL {int(a.timeout)} sh $f </dev/null\n"
        f"echo \"{MARK}$?\"\n"
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
    out = bytearray()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            s.settimeout(left)
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        sys.stdout.write(out.decode(errors="replace"))
        sys.stderr.write(f"gexec: timeout after {a.timeout:.0f}+5 s waiting for {a.ip}\n")
        sys.exit(124)
    finally:
        s.close()
    text = out.decode(errors="replace")
    rc = 125
    lines = text.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(MARK):
            try:
                rc = int(lines[i][len(MARK):])
            except ValueError:
                pass
            del lines[i]
            break
    else:
        sys.stderr.write(f"gexec: no exit status from {a.ip} (guest shell died?)\n")
    sys.stdout.write("\n".join(lines))
    sys.stdout.flush()
    sys.exit(rc)


if __name__ == "__main__":
    main()
