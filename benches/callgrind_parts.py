#!/usr/bin/env python3
"""The instructions of a latency iteration through softroce's C library, by part, from two
callgrind profiles of one program and side: a run of SHORT iterations and one of LONG
(`latency_budget.sh --instructions`). Each figure is the difference between the two runs, so
the set-up and the teardown fall out.

    callgrind_parts.py SHORT_OUT LONG_OUT ITERATIONS_BETWEEN

prints one markdown row's cells (after the program, progress and side), `|`-separated:
- turns an iteration, and a turn's own instructions: what is left of a turn once the parts
  below are taken out of it (its clock reading, commands, timers, the CM's pump, handing out
  completions, the hold of its ACKs);
- datagrams received an iteration, and the instructions each takes: the socket's reads (the
  empty read that ends a receive included), the ICRC's check, the parse and the transport's
  handling;
- datagrams sent an iteration, and the instructions each takes: the packet built, its ICRC,
  the send;
- posts an iteration (ibv_post_send and ibv_post_recv), and the instructions each takes: the
  C call and the engine's taking of it;
- the budget from a datagram's arrival to the send it allows (see `main`).
Each is counted in every thread of the process (callgrind runs them one at a time).
"""
import collections
import re
import sys

# The functions whose inclusive cost is a part, by the name callgrind gives them (a suffix of
# it: the generic engine's names carry their type parameters).
TURN = "softroce::engine::Engine<B>::step_or_stop"
RECEIVED = "softroce::transport::endpoint::Endpoint::handle_received"
RECEIVE = "<softroce::io::udp::UdpBackend as softroce::io::Backend>::receive"
SENT = "<softroce::io::udp::UdpBackend as softroce::io::Backend>::commit"
TRANSMIT = "softroce::engine::Engine<B>::transmit"
TAKEN = "softroce::engine::Engine<B>::posts"
POSTS = ("softroce_capi::post::post_send", "softroce_capi::post::post_recv")
POLL = "softroce_capi::cq::poll_cq"
POLL_TURNS = "softroce::engine::drive::<impl softroce::engine::EngineHandle>::help_poll"


def profile(path):
    """Inclusive instructions and calls per function name: a function's own costs, and the
    costs of the calls it makes (but to itself)."""
    names = {"ob": {}, "fn": {}}

    def name(kind, rest):
        # Callgrind compresses names: "(id) name" defines id, "(id)" refers to it.
        m = re.match(r"\((\d+)\)(?: (.*))?", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?")

    fn = cfn = None
    inclusive, calls = collections.Counter(), collections.Counter()
    after_calls = False
    with open(path) as lines:
        for line in lines:
            line = line.rstrip("\n")
            if not line:
                continue
            if line[0].isdigit() or line[0] in "+-*":
                cost = line.split()
                # The line after `calls=` is the call's inclusive cost, charged to the caller.
                if len(cost) >= 2 and not (after_calls and cfn == fn):
                    inclusive[fn] += int(cost[1])
                after_calls = False
                continue
            key, _, rest = line.partition("=")
            if key == "fn":
                fn = name("fn", rest)
            elif key == "cfn":
                cfn = name("fn", rest)
            elif key == "calls":
                calls[cfn] += int(rest.split()[0])
                after_calls = True
            elif key in ("ob", "cob"):
                name("ob", rest)
    return inclusive, calls


def difference(short, long):
    (inc_a, calls_a), (inc_b, calls_b) = profile(short), profile(long)
    return ({k: inc_b[k] - inc_a.get(k, 0) for k in inc_b},
            {k: calls_b[k] - calls_a.get(k, 0) for k in calls_b})


def per(total, count):
    return total / count if count > 0 else 0.0


def main():
    short, long, between = sys.argv[1], sys.argv[2], int(sys.argv[3])
    inc, calls = difference(short, long)
    turns = calls.get(TURN, 0)
    received, sent = calls.get(RECEIVED, 0), calls.get(SENT, 0)
    posts = sum(calls.get(p, 0) for p in POSTS)
    post_cost = sum(inc.get(p, 0) for p in POSTS) + inc.get(TAKEN, 0)
    # The receive's and the transmit's calls count once a datagram, those that find nothing
    # included; a turn's own is what is left of it.
    receiving, sending = inc.get(RECEIVE, 0), inc.get(TRANSMIT, 0)
    own = per(inc.get(TURN, 0) - receiving - sending - inc.get(TAKEN, 0), turns)
    polls = calls.get(POLL, 0)
    poll_own = per(inc.get(POLL, 0) - inc.get(POLL_TURNS, 0), polls) if polls else 0.0
    # The budget from a datagram's arrival to the send it allows: the own part of the turn
    # that receives and of the one that sends (one turn where the program posts nothing: the
    # passive side of a READ, which the engine answers by itself), the iteration's received and
    # sent datagrams, its posts, and, where the program polls, the C part of the poll that takes
    # the completion. The own part of turns that find nothing (a spinning poll's) is left out:
    # how many there are depends on how long the peer takes, under callgrind more than
    # natively. Their empty reads are in the received datagrams' figure.
    carrying = 1 if posts == 0 else 2
    budget = (carrying * own + per(receiving, between) + per(sending, between)
              + per(post_cost, between) + (poll_own if polls else 0))
    cells = [
        f"{per(turns, between):.1f}", f"{own / 1000:.1f}k",
        f"{per(received, between):.1f}", f"{per(receiving, received) / 1000:.1f}k",
        f"{per(sent, between):.1f}", f"{per(sending, sent) / 1000:.1f}k",
        f"{per(posts, between):.1f}", f"{per(post_cost, posts) / 1000:.1f}k",
        f"{budget / 1000:.1f}k",
    ]
    print(" | ".join(cells))


if __name__ == "__main__":
    main()
