#!/usr/bin/python3
"""budget.py TRACE: what a datagram costs a guest, from a guest's ftrace (perf.sh budget).

TRACE is /sys/kernel/tracing/trace of one guest, recorded with the events raw_syscalls,
sched:sched_switch, net:netif_receive_skb and net:net_dev_queue while a latency program ran
there. For each arrival of a datagram larger than a plain ACK (a request, a response, or an
answer with the ACK in its train) it follows the trace to the next transmission larger than a
plain ACK (the answer that arrival allows: a WRITE, a SEND, a READ response, or the next
request) and counts what came between: the system calls of the program's threads (its own,
and softroce's engine thread, `sr...`), the context switches, and the time. An arrival that
another follows before any such transmission (an ACK's datagram, a second packet of a train)
is not a sample. Prints one line of JSON: the samples, the median time, and the mean count of
each call, over the middle 80% of the arrivals (the start and the end of a run are not
steady).
"""
import collections
import json
import re
import statistics
import sys

# x86-64 system call numbers of the calls the programs and the library make on this path.
NAMES = {0: "read", 1: "write", 7: "poll", 14: "rt_sigprocmask", 16: "ioctl", 24: "sched_yield",
         46: "sendmsg", 47: "recvmsg", 72: "fcntl", 157: "prctl", 202: "futex",
         228: "clock_gettime", 232: "epoll_wait", 271: "ppoll", 281: "epoll_pwait",
         299: "recvmmsg", 307: "sendmmsg"}
# A plain ACK: its IP datagram (20 + 8 + BTH 12 + AETH 4 + ICRC 4), and as queued to the
# device, with its Ethernet header.
ACK_RECEIVED = 48
ACK_SENT = ACK_RECEIVED + 14
LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\S+): (.*)$")


def events(path):
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        comm, _tid, at, event, rest = m.groups()
        at = float(at)
        ours = comm.startswith(("ib_", "ibv_", "sr"))
        if event == "netif_receive_skb":
            length = int(re.search(r"len=(\d+)", rest).group(1))
            if length > ACK_RECEIVED:
                yield at, "arrival", None
        elif event == "net_dev_queue":
            length = int(re.search(r"len=(\d+)", rest).group(1))
            if length > ACK_SENT:
                yield at, "send", None
        elif event == "sys_enter" and ours:
            number = int(rest.split()[1])
            yield at, "call", NAMES.get(number, str(number))
        elif event == "sched_switch":
            yield at, "switch", None


def main(path):
    trace = list(events(path))
    arrivals = [i for i, (_, kind, _) in enumerate(trace) if kind == "arrival"]
    middle = arrivals[len(arrivals) // 10: len(arrivals) * 9 // 10]
    samples = []
    for i in middle:
        calls, switches = collections.Counter(), 0
        for at, kind, name in trace[i + 1:]:
            if kind == "arrival":
                break
            if kind == "switch":
                switches += 1
            elif kind == "call":
                calls[name] += 1
            elif kind == "send":
                samples.append((calls, switches, (at - trace[i][0]) * 1e6))
                break
    out = {"arrivals": len(middle), "samples": len(samples)}
    if samples:
        names = sorted({name for calls, _, _ in samples for name in calls})
        out["median_us"] = round(statistics.median(s[2] for s in samples))
        out["switches"] = round(statistics.mean(s[1] for s in samples), 2)
        out["calls"] = round(statistics.mean(sum(s[0].values()) for s in samples), 2)
        out["by_call"] = {n: round(statistics.mean(s[0][n] for s in samples), 2) for n in names}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
