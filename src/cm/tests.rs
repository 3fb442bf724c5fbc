//! The CM state machine between two endpoints, MAD by MAD: the handshake, what loss and
//! repeats do to it, rejection, teardown and its races, SIDR, and what a hostile peer's MADs
//! cost. The rules are cited where they are tested; the simulator tests (`tests/cm_sim.rs`)
//! run the same protocol through the agent and real QPs.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::*;
use crate::wire::cm::{
    rej::REJECTED_REQ, CmDreqRepr, CmMraRepr, CmRejRepr, CmReqRepr, PortSpace, DREQ_PRIVATE_DATA,
};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const RPING: ServiceId = ServiceId::ip(PortSpace::Tcp, 7174);

/// Timers short enough to step through: a 4 ms response timeout, three retries, and a packet
/// life time of 4 µs, so that the active side sends again 4.2 ms apart.
fn config() -> CmConfig {
    CmConfig {
        response_timeout: 10,
        max_retries: 3,
        packet_life_time: 0,
        ..CmConfig::default()
    }
}

/// Two CMs on one wire, and the names of the MADs that crossed it.
struct Pair {
    a: CmEndpoint,
    b: CmEndpoint,
    now: Duration,
    wire: Vec<(IpAddr, &'static str)>,
}

impl Pair {
    fn new(config: CmConfig) -> Pair {
        Pair {
            a: CmEndpoint::new(A, 1, config),
            b: CmEndpoint::new(B, 2, config),
            now: Duration::ZERO,
            wire: Vec::new(),
        }
    }

    fn side(&mut self, addr: IpAddr) -> &mut CmEndpoint {
        if addr == A {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// Delivers what both sides send until neither sends more; `lose` drops the MADs it
    /// returns true for (by sender and message name).
    fn exchange(&mut self, mut lose: impl FnMut(IpAddr, &str) -> bool) {
        loop {
            let mut moved = false;
            for from in [A, B] {
                while let Some(out) = self.side(from).poll_transmit() {
                    moved = true;
                    let name = CmMessage::parse(&out.mad[..]).unwrap().1.name();
                    self.wire.push((from, name));
                    if !lose(from, name) {
                        let now = self.now;
                        self.side(out.dst).handle_mad(now, from, &out.mad[..]);
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Moves time on by `by` and runs both sides' timers.
    fn advance(&mut self, by: Duration) {
        self.now += by;
        let now = self.now;
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
    }

    fn events(&mut self, side: IpAddr) -> Vec<CmEvent> {
        std::iter::from_fn(|| self.side(side).poll_event()).collect()
    }

    fn sent(&self, from: IpAddr, name: &str) -> usize {
        let same = |(f, n): &&(IpAddr, &str)| *f == from && *n == name;
        self.wire.iter().filter(same).count()
    }

    /// A connects to B's listener with `data`; B has the request.
    fn request(&mut self, data: &[u8]) -> (ConnId, ConnId, ConnectRequest) {
        self.b.listen(RPING).unwrap();
        let active = self.a.connect(self.now, &req_params(data)).unwrap();
        self.exchange(|_, _| false);
        match &self.events(B)[..] {
            [CmEvent::ConnectRequest { conn, request, .. }] => (active, *conn, (**request).clone()),
            other => panic!("B saw {other:?}"),
        }
    }

    /// B accepts; A's reply is taken and established.
    fn accept(&mut self, passive: ConnId, lose: impl FnMut(IpAddr, &str) -> bool) {
        let now = self.now;
        self.b.accept(now, passive, &rep_params()).unwrap();
        self.exchange(lose);
    }

    /// A handshake from nothing to established on both sides, losing nothing.
    fn connected(&mut self) -> (ConnId, ConnId) {
        let (active, passive, _) = self.request(b"");
        self.accept(passive, |_, _| false);
        assert!(matches!(&self.events(A)[..], [CmEvent::Reply { .. }]));
        self.a.establish(self.now, active).unwrap();
        self.exchange(|_, _| false);
        assert_eq!(self.events(A), [CmEvent::Established { conn: active }]);
        assert_eq!(self.events(B), [CmEvent::Established { conn: passive }]);
        (active, passive)
    }
}

fn req_params(data: &[u8]) -> ReqParams<'_> {
    ReqParams {
        src_port: 40000,
        responder_resources: 4,
        initiator_depth: 2,
        rnr_retry_count: 6,
        private_data: data,
        ..ReqParams::rc(B, RPING, Qpn::new(0x11), Psn::new(0x123456))
    }
}

fn rep_params() -> RepParams<'static> {
    RepParams {
        local_qpn: Qpn::new(0x22),
        responder_resources: 2,
        initiator_depth: 4,
        rnr_retry_count: 7,
        srq: false,
        private_data: b"welcome",
    }
}

/// The REQ a CM sends, parsed.
fn parse_req(mad: &[u8]) -> CmReqRepr {
    match CmMessage::parse(mad).unwrap().1 {
        CmMessage::Req(req) => *req,
        other => panic!("not a REQ: {other:?}"),
    }
}

fn parse_rej(mad: &[u8]) -> CmRejRepr {
    match CmMessage::parse(mad).unwrap().1 {
        CmMessage::Rej(rej) => *rej,
        other => panic!("not a REJ: {other:?}"),
    }
}

#[test]
fn req_rep_rtu_connects_both_sides_with_what_each_asked() {
    let mut pair = Pair::new(config());
    let (active, passive, request) = pair.request(b"hello");
    assert_eq!(request.peer, A);
    assert_eq!(
        request.peer_port, 40000,
        "RDMA-CM's header names the source port"
    );
    assert_eq!(request.peer_qpn, Qpn::new(0x11));
    assert_eq!(request.peer_psn, Psn::new(0x123456));
    assert_eq!(request.path_mtu, PathMtu::Mtu1024);
    assert_eq!(
        (request.responder_resources, request.initiator_depth),
        (4, 2)
    );
    assert_eq!((request.retry_count, request.rnr_retry_count), (7, 6));
    assert_eq!(request.local_ack_timeout, 14);
    assert_eq!(
        request.private_data.len(),
        56,
        "92 bytes less the 36 of the header"
    );
    assert_eq!(&request.private_data[..5], b"hello");
    pair.accept(passive, |_, _| false);
    let reply = match &pair.events(A)[..] {
        [CmEvent::Reply { conn, reply }] if *conn == active => reply.clone(),
        other => panic!("A saw {other:?}"),
    };
    assert_eq!(reply.peer_qpn, Qpn::new(0x22));
    assert_eq!(
        reply.peer_psn, request.local_psn,
        "the REP names the PSN the request told the passive side's application"
    );
    assert_eq!(
        reply.local_psn,
        Psn::new(0x123456),
        "the reply recalls the PSN our REQ named"
    );
    assert_eq!((reply.responder_resources, reply.initiator_depth), (2, 4));
    assert_eq!(reply.rnr_retry_count, 7);
    assert_eq!(reply.target_ack_delay, TARGET_ACK_DELAY);
    assert_eq!(&reply.private_data[..7], b"welcome");
    pair.a.establish(pair.now, active).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(A), [CmEvent::Established { conn: active }]);
    assert_eq!(pair.events(B), [CmEvent::Established { conn: passive }]);
    let names: Vec<_> = pair.wire.iter().map(|w| w.1).collect();
    assert_eq!(
        names,
        ["REQ", "REP", "RTU"],
        "no MRA unless a REQ repeats (cm.c)"
    );
    assert_eq!(
        pair.a.next_deadline(),
        None,
        "nothing to wait for once established"
    );
    assert_eq!(pair.b.next_deadline(), None);
}

/// cm.c `cm_issue_rej`: no listener for the service ID is REJ 8, naming only the REQ's
/// sender; softroce's after the listen grace, in which no listener appeared.
#[test]
fn a_req_for_a_service_no_one_listens_on_is_rejected_with_reason_8() {
    let mut pair = Pair::new(config());
    let active = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    let req = pair.a.poll_transmit().unwrap();
    pair.b.handle_mad(pair.now, A, &req.mad[..]);
    let grace = config().listen_grace;
    assert!(
        pair.b.poll_transmit().is_none(),
        "held for the listen grace"
    );
    assert_eq!(pair.b.next_deadline(), Some(pair.now + grace));
    pair.now += grace;
    pair.b.handle_timeout(pair.now);
    let rej = pair.b.poll_transmit().unwrap();
    let parsed = parse_rej(&rej.mad[..]);
    assert_eq!(parsed.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!(parsed.local_comm_id, 0);
    assert_eq!(parsed.remote_comm_id, active.0);
    assert_eq!(parsed.message_rejected, REJECTED_REQ);
    let tid = |mad: &[u8]| u64::from_be_bytes(mad[8..16].try_into().unwrap());
    assert_eq!(
        tid(&rej.mad[..]),
        tid(&req.mad[..]),
        "a reply keeps the REQ's TID"
    );
    pair.a.handle_mad(pair.now, B, &rej.mad[..]);
    let failure = Failure::Rejected {
        reason: RejReason::INVALID_SERVICE_ID,
        private_data: vec![0; REJ_PRIVATE_DATA],
    };
    assert_eq!(
        pair.events(A),
        [CmEvent::Failed {
            conn: active,
            failure
        }]
    );
    assert_eq!(pair.b.counters().rejected_no_listener, 1);
    assert_eq!(
        pair.b.connections(),
        0,
        "nothing kept for a REQ no one wanted"
    );
    assert_eq!(pair.a.connections(), 0);
}

/// A listener that appears within the listen grace takes the REQ that came before it (a
/// client that connects right after a handshake, before its server's listen): the connection
/// is made as if the REQ had come after the listen. With no grace, the REQ is rejected at
/// once, as the kernel does.
#[test]
fn a_listener_within_the_grace_takes_a_req_that_came_first() {
    let mut pair = Pair::new(config());
    let active = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.wire, [(A, "REQ")]);
    pair.advance(config().listen_grace / 2);
    pair.b.listen(RPING).unwrap();
    let events = pair.events(B);
    assert!(
        matches!(events[..], [CmEvent::ConnectRequest { .. }]),
        "{events:?}"
    );
    assert_eq!(pair.b.counters().rejected_no_listener, 0);
    assert_eq!(
        pair.a.connections(),
        1,
        "{active:?} still waits for its answer"
    );

    let mut pair = Pair::new(CmConfig {
        listen_grace: Duration::ZERO,
        ..config()
    });
    pair.a.connect(pair.now, &req_params(b"")).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.wire, [(A, "REQ"), (B, "REJ")]);
}

/// The REQs held for a listener are bounded (`MAX_HELD_REQS`): beyond them a REQ for no
/// listener is rejected at once, so a flood costs a fixed amount; and a repeat of a held REQ
/// (its sender's retry period was shorter than the grace) is answered at once, so that the
/// sender hears the REJ before its retries run out.
#[test]
fn held_reqs_are_bounded_and_a_repeat_is_answered_at_once() {
    let mut a = CmEndpoint::new(A, 1, config());
    let mut b = CmEndpoint::new(B, 2, config());
    let mut reqs = Vec::new();
    for _ in 0..MAX_HELD_REQS + 4 {
        a.connect(Duration::ZERO, &req_params(b"")).unwrap();
        reqs.push(a.poll_transmit().unwrap());
    }
    for req in &reqs {
        b.handle_mad(Duration::ZERO, A, &req.mad[..]);
    }
    b.handle_mad(Duration::ZERO, A, &reqs[0].mad[..]);
    let mut rejs = 0;
    while b.poll_transmit().is_some() {
        rejs += 1;
    }
    assert_eq!(rejs, 5, "the REQs beyond the bound, and the repeat");
    b.handle_timeout(config().listen_grace);
    let mut rejs = 0;
    while b.poll_transmit().is_some() {
        rejs += 1;
    }
    assert_eq!(
        rejs,
        MAX_HELD_REQS - 1,
        "each other held REQ once, after the grace"
    );
    assert_eq!(b.counters().rejected_no_listener, MAX_HELD_REQS as u64 + 4);
}

/// IBTA 12.9.6: a REQ or REP unanswered is sent again at the response timeout; the peer
/// answers a repeat as it answered the first, and each side reports once.
#[test]
fn a_lost_req_rep_and_rtu_are_each_recovered_by_a_retransmission() {
    let period = config().request_period();
    // The REQ is lost once.
    let mut pair = Pair::new(config());
    pair.b.listen(RPING).unwrap();
    let active = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    pair.exchange(|from, name| from == A && name == "REQ");
    assert!(pair.events(B).is_empty());
    pair.advance(period);
    pair.exchange(|_, _| false);
    let passive = match &pair.events(B)[..] {
        [CmEvent::ConnectRequest { conn, .. }] => *conn,
        other => panic!("{other:?}"),
    };
    assert_eq!(pair.a.counters().retransmissions, 1);
    // The REP is lost once: B sends it again at its own timer.
    let mut lost_rep = false;
    pair.accept(passive, |from, name| {
        let lose = from == B && name == "REP" && !lost_rep;
        lost_rep |= lose;
        lose
    });
    assert!(pair.events(A).is_empty());
    pair.advance(period);
    pair.exchange(|_, _| false);
    assert!(matches!(&pair.events(A)[..], [CmEvent::Reply { .. }]));
    // The RTU is lost: B's REP comes again, and A answers it with the RTU again.
    pair.a.establish(pair.now, active).unwrap();
    let mut lost_rtu = false;
    pair.exchange(|from, name| {
        let lose = from == A && name == "RTU" && !lost_rtu;
        lost_rtu |= lose;
        lose
    });
    assert_eq!(pair.events(A), [CmEvent::Established { conn: active }]);
    assert!(pair.events(B).is_empty(), "B still waits for its RTU");
    pair.advance(period);
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(B), [CmEvent::Established { conn: passive }]);
    assert!(pair.events(A).is_empty(), "A reports its connection once");
    assert_eq!(pair.sent(A, "RTU"), 2);
    // The lost one, its retransmission, the answer to A's repeated REQ that crossed it, and
    // the retransmission that asked for the lost RTU; A took the first that came.
    assert_eq!(pair.sent(B, "REP"), 4);
    assert_eq!(pair.a.counters().duplicates, 2, "the repeated REPs");
}

/// cm.c `cm_dup_req_handler`: a REQ repeated while the application decides gets an MRA, which
/// stretches the active side's wait past its retries.
#[test]
fn a_repeated_req_while_the_application_decides_gets_an_mra_that_holds_the_peer() {
    let mut pair = Pair::new(config());
    let (active, passive, _) = pair.request(b"");
    let period = config().request_period();
    pair.advance(period);
    pair.exchange(|_, _| false);
    assert_eq!(pair.sent(A, "REQ"), 2);
    assert_eq!(pair.sent(B, "MRA"), 1);
    assert!(pair.events(B).is_empty(), "the repeat is no new request");
    // Far beyond the REQ's own retries, the active side still waits.
    pair.advance(period * 10);
    pair.exchange(|_, _| false);
    assert!(pair.events(A).is_empty());
    pair.accept(passive, |_, _| false);
    assert!(matches!(&pair.events(A)[..], [CmEvent::Reply { conn, .. }] if *conn == active));
}

/// A request the application ignores (its listen backlog is full) is forgotten with nothing
/// sent, as cm.c forgets one whose listener's handler answered `-ENOMEM`: the active side's
/// next REQ is a new request, and an answer to that one connects.
#[test]
fn an_ignored_request_sends_nothing_and_its_repeat_is_a_new_request() {
    let mut pair = Pair::new(config());
    let (active, ignored, _) = pair.request(b"");
    pair.b.ignore(pair.now, ignored).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.b.counters().ignored, 1);
    assert_eq!(
        (pair.sent(B, "REJ"), pair.sent(B, "MRA")),
        (0, 0),
        "nothing sent"
    );
    assert!(
        pair.b.ignore(pair.now, ignored).is_err(),
        "forgotten: nothing left to ignore"
    );
    pair.advance(config().request_period());
    pair.exchange(|_, _| false);
    assert_eq!(pair.sent(A, "REQ"), 2);
    let again = match &pair.events(B)[..] {
        [CmEvent::ConnectRequest { conn, .. }] => *conn,
        other => panic!("the repeat is a new request: {other:?}"),
    };
    pair.accept(again, |_, _| false);
    assert!(matches!(&pair.events(A)[..], [CmEvent::Reply { conn, .. }] if *conn == active));
}

/// A REQ no one answers is sent 1 + max_retries times, then the attempt fails and the peer
/// hears REJ "timeout" (cm.c `cm_destroy_id` in REQ_SENT).
#[test]
fn an_unanswered_req_times_out_after_its_retries() {
    let mut pair = Pair::new(config());
    let active = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    for _ in 0..10 {
        pair.exchange(|from, _| from == A);
        pair.advance(config().request_period());
    }
    pair.exchange(|from, _| from == A);
    assert_eq!(pair.sent(A, "REQ"), 1 + usize::from(config().max_retries));
    assert_eq!(pair.sent(A, "REJ"), 1);
    assert_eq!(
        pair.events(A),
        [CmEvent::Failed {
            conn: active,
            failure: Failure::TimedOut
        }]
    );
    assert_eq!(pair.a.connections(), 0);
    assert_eq!(pair.a.next_deadline(), None);
}

#[test]
fn a_rejected_request_carries_the_applications_data_and_a_repeat_gets_the_same_rej() {
    let mut pair = Pair::new(config());
    let (active, passive, _) = pair.request(b"");
    let now = pair.now;
    let reason = RejReason::CONSUMER_DEFINED;
    pair.b.reject(now, passive, reason, b"go away").unwrap();
    pair.exchange(|_, _| false);
    let private_data = match &pair.events(A)[..] {
        [CmEvent::Failed {
            conn,
            failure:
                Failure::Rejected {
                    reason,
                    private_data,
                },
        }] if *conn == active && reason.0 == 28 => private_data.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(&private_data[..7], b"go away");
    // The REJ was lost as far as a repeat of the REQ knows: the same REJ again.
    let repeat = {
        let mut c = CmEndpoint::new(A, 1, config());
        c.connect(Duration::ZERO, &req_params(b"")).unwrap();
        c.poll_transmit().unwrap()
    };
    pair.b.handle_mad(pair.now, A, &repeat.mad[..]);
    let again = pair.b.poll_transmit().unwrap();
    assert_eq!(
        parse_rej(&again.mad[..]).reason,
        RejReason::CONSUMER_DEFINED
    );
    assert!(
        pair.events(B).is_empty(),
        "a repeat of a rejected REQ is no new request"
    );
    // And it is forgotten after two of the peer's periods.
    pair.advance(config().request_period() * 2);
    assert_eq!(pair.b.connections(), 0);
}

#[test]
fn dreq_and_drep_end_both_sides_and_timewait_frees_the_ids() {
    let mut pair = Pair::new(config());
    let (active, passive) = pair.connected();
    pair.a.disconnect(pair.now, active).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(B), [CmEvent::Disconnected { conn: passive }]);
    assert_eq!(pair.events(A), [CmEvent::Disconnected { conn: active }]);
    assert_eq!((pair.sent(A, "DREQ"), pair.sent(B, "DREP")), (1, 1));
    assert_eq!(pair.a.connections(), 1, "in timewait");
    pair.advance(ib_timeout(14));
    assert_eq!(pair.a.connections(), 0, "A's timewait is its ACK timeout");
    assert_eq!(
        pair.b.connections(),
        1,
        "B answered a DREQ: it waits for a repeat"
    );
    pair.advance(ib_timeout(14));
    assert_eq!((pair.a.connections(), pair.b.connections()), (0, 0));
}

/// The side that answers a DREQ cannot know that its DREP arrived: it keeps the connection
/// until the peer would have sent its DREQ again (cm.c: the active side's `timeout_ms`, twice
/// the packet life time and the response time its REQ asks of us; the passive side's, the
/// response time our REQ announces), and counts it as lingering until then, so that a process
/// about to exit knows to wait. Our own DREQ lingers until its DREP.
#[test]
fn a_dreq_answered_lingers_until_the_peer_could_have_repeated_it() {
    let mut pair = Pair::new(config());
    let (active, passive) = pair.connected();
    pair.a.disconnect(pair.now, active).unwrap();
    assert_eq!(pair.a.lingering(), 1, "A's DREQ is out");
    pair.exchange(|from, name| from == B && name == "DREP");
    assert_eq!(pair.events(B), [CmEvent::Disconnected { conn: passive }]);
    assert_eq!((pair.a.lingering(), pair.b.lingering()), (1, 1));

    // A sends its DREQ again; B answers from the connection, and waits as long again.
    pair.advance(config().request_period());
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(A), [CmEvent::Disconnected { conn: active }]);
    assert_eq!(pair.sent(B, "DREP"), 2);
    assert_eq!(pair.b.counters().unknown_dreqs_answered, 0);
    assert_eq!((pair.a.lingering(), pair.b.lingering()), (0, 1));

    // A's REQ: response timeout 10, ACK timeout 14, so a packet life time of 13.
    let repeat = ib_timeout(10) + 2 * ib_timeout(13);
    pair.advance(repeat);
    assert_eq!(pair.b.lingering(), 1, "A could still be about to ask again");
    pair.advance(repeat / 8);
    assert_eq!((pair.b.lingering(), pair.b.connections()), (0, 0));

    // The other way round: the passive side's DREQ, which the active side answers, may come
    // again after the response time the active side's REQ announced.
    let mut pair = Pair::new(config());
    let (_, passive) = pair.connected();
    pair.b.disconnect(pair.now, passive).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!((pair.a.lingering(), pair.b.lingering()), (1, 0));
    // Here that is shorter than A's timewait, its ACK timeout, which it waits out all the same.
    let repeat = config().request_period();
    pair.advance(repeat + repeat / 8);
    assert_eq!(pair.a.lingering(), 1);
    pair.advance(ib_timeout(14) - repeat - repeat / 8);
    assert_eq!((pair.a.lingering(), pair.a.connections()), (0, 0));
}

/// IBTA 12.9.6, DREQ race: both sides send a DREQ at once; each answers the other's, and each
/// reports the end once.
#[test]
fn a_dreq_race_ends_each_side_once() {
    let mut pair = Pair::new(config());
    let (active, passive) = pair.connected();
    pair.a.disconnect(pair.now, active).unwrap();
    pair.b.disconnect(pair.now, passive).unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(A), [CmEvent::Disconnected { conn: active }]);
    assert_eq!(pair.events(B), [CmEvent::Disconnected { conn: passive }]);
    assert_eq!((pair.sent(A, "DREP"), pair.sent(B, "DREP")), (1, 1));
    pair.advance(config().request_period());
    pair.exchange(|_, _| false);
    assert_eq!(
        (pair.sent(A, "DREQ"), pair.sent(B, "DREQ")),
        (1, 1),
        "no retransmission"
    );
    assert!(pair.events(A).is_empty() && pair.events(B).is_empty());
}

/// A lost DREP: the DREQ is sent again, and the peer, in timewait, answers it again.
#[test]
fn a_lost_drep_is_answered_again_from_timewait() {
    let mut pair = Pair::new(config());
    let (active, passive) = pair.connected();
    pair.a.disconnect(pair.now, active).unwrap();
    pair.exchange(|from, name| from == B && name == "DREP");
    assert_eq!(pair.events(B), [CmEvent::Disconnected { conn: passive }]);
    assert!(pair.events(A).is_empty());
    pair.advance(config().request_period());
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(A), [CmEvent::Disconnected { conn: active }]);
    assert_eq!(pair.sent(B, "DREP"), 2);
    assert!(pair.events(B).is_empty(), "B ended once");
}

/// cm.c `cm_issue_drep`: a DREQ for no connection is answered, so that a peer that lost its
/// state is not left retrying.
#[test]
fn a_dreq_for_no_connection_gets_a_drep() {
    let mut b = CmEndpoint::new(B, 2, config());
    let dreq = CmDreqRepr {
        local_comm_id: 7,
        remote_comm_id: 9,
        remote_qpn: Qpn::new(0x33),
        private_data: [0; DREQ_PRIVATE_DATA],
    };
    let mut mad = [0; MAD_LEN];
    CmMessage::Dreq(Box::new(dreq)).emit(5, 0, &mut mad);
    b.handle_mad(Duration::ZERO, A, &mad);
    let drep = b.poll_transmit().unwrap();
    match CmMessage::parse(&drep.mad[..]).unwrap() {
        (header, CmMessage::Drep(d)) => {
            assert_eq!((d.local_comm_id, d.remote_comm_id, header.tid), (9, 7, 5));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(b.counters().unknown_dreqs_answered, 1);
    assert_eq!(b.connections(), 0);
}

/// A REQ whose fields do not hold together is rejected with the reason, and nothing is kept:
/// another transport (9), an unknown MTU (26), GIDs that are not the packet's ends (12), an
/// RDMA-CM header that names another source (28, as cma.c refuses it).
#[test]
fn a_req_that_does_not_hold_together_is_rejected_with_its_reason() {
    type Spoil = fn(&mut CmReqRepr);
    let cases: [(&str, Spoil, u16); 5] = [
        ("transport RD", |r| r.transport_service_type = 2, 9),
        ("MTU 6", |r| r.path_mtu = 6, 26),
        (
            "GID",
            |r| r.primary_path.local_gid = gid_of("10.0.0.9".parse().unwrap()),
            12,
        ),
        ("header source", |r| r.private_data[15] = 9, 28),
        ("QPN 1", |r| r.local_qpn = Qpn::GSI, 28),
    ];
    for (what, spoil, reason) in cases {
        let mut a = CmEndpoint::new(A, 1, config());
        let mut b = CmEndpoint::new(B, 2, config());
        b.listen(RPING).unwrap();
        a.connect(Duration::ZERO, &req_params(b"")).unwrap();
        let mut req = parse_req(&a.poll_transmit().unwrap().mad[..]);
        spoil(&mut req);
        let mut mad = [0; MAD_LEN];
        CmMessage::Req(Box::new(req)).emit(1, 0, &mut mad);
        b.handle_mad(Duration::ZERO, A, &mad);
        let rej = parse_rej(&b.poll_transmit().expect(what).mad[..]);
        assert_eq!(rej.reason.0, reason, "{what}");
        assert!(b.poll_event().is_none(), "{what}");
        assert_eq!(b.counters().rejected_invalid, 1, "{what}");
        assert_eq!(b.connections(), 0, "{what}");
    }
}

/// A flood of REQs fills at most `max_pending` entries; the rest get REJ 3 and cost nothing.
#[test]
fn a_flood_of_reqs_is_bounded_by_max_pending() {
    let config = CmConfig {
        max_pending: 8,
        ..config()
    };
    let mut b = CmEndpoint::new(B, 2, config);
    b.listen(RPING).unwrap();
    let mut a = CmEndpoint::new(A, 1, config);
    for n in 0..100 {
        // Each from a QP of its own: a second REQ from one QP would be stale.
        let p = ReqParams {
            local_qpn: Qpn::new(0x100 + n),
            ..req_params(b"")
        };
        let _ = a.connect(Duration::ZERO, &p);
    }
    while let Some(out) = a.poll_transmit() {
        b.handle_mad(Duration::ZERO, A, &out.mad[..]);
    }
    assert_eq!(b.connections(), 8);
    assert_eq!(b.counters().rejected_no_resources, 92);
    let rejs = std::iter::from_fn(|| b.poll_transmit())
        .filter(|o| matches!(CmMessage::parse(&o.mad[..]), Ok((_, CmMessage::Rej(_)))))
        .count();
    assert_eq!(rejs, 92);
    // The application never answers: each request expires with the MRA's promise.
    b.handle_timeout(ib_timeout(MRA_SERVICE_TIMEOUT));
    assert_eq!(b.connections(), 0);
}

/// A MAD from a stranger, or naming a connection that is not the sender's, changes nothing.
#[test]
fn messages_from_anyone_but_the_peer_are_dropped_and_counted() {
    let mut pair = Pair::new(config());
    let (active, passive) = pair.connected();
    let stranger: IpAddr = "10.0.0.66".parse().unwrap();
    let dreq = CmDreqRepr {
        local_comm_id: 1,
        remote_comm_id: passive.0,
        remote_qpn: Qpn::new(0x22),
        private_data: [0; DREQ_PRIVATE_DATA],
    };
    let mut mad = [0; MAD_LEN];
    CmMessage::Dreq(Box::new(dreq)).emit(1, 0, &mut mad);
    // From a stranger, and from the peer with the wrong sender ID: no connection of theirs.
    pair.b.handle_mad(pair.now, stranger, &mad);
    pair.b.handle_mad(pair.now, A, &mad);
    assert_eq!(pair.b.counters().unknown_dreqs_answered, 2);
    assert!(pair.events(B).is_empty(), "the connection stands");
    let mra = CmMraRepr {
        local_comm_id: 1,
        remote_comm_id: active.0,
        message_mraed: 0,
        service_timeout: 31,
        private_data: [0; crate::wire::cm::MRA_PRIVATE_DATA],
    };
    CmMessage::Mra(Box::new(mra)).emit(1, 0, &mut mad);
    pair.a.handle_mad(pair.now, stranger, &mad);
    pair.a.handle_mad(pair.now, B, &mad);
    assert_eq!(pair.a.counters().dropped_unexpected, 2);
    for garbage in [&[0u8; 10][..], &[0xff; MAD_LEN][..], &[0; MAD_LEN][..]] {
        pair.a.handle_mad(pair.now, B, garbage);
    }
    assert_eq!(pair.a.counters().dropped_malformed, 3);
    assert_eq!(pair.a.next_deadline(), None);
}

#[test]
fn sidr_resolves_a_ud_service_or_says_no_one_serves_it() {
    let mut pair = Pair::new(config());
    let udp = ServiceId::ip(PortSpace::Udp, 7174);
    let now = pair.now;
    let unserved = pair.a.sidr_resolve(now, B, udp, 1234, b"").unwrap();
    pair.exchange(|_, _| false);
    assert_eq!(
        pair.events(A),
        [CmEvent::SidrResolved {
            id: unserved,
            result: Err(SidrStatus::UNSUPPORTED),
            private_data: vec![0; 136],
        }]
    );
    let listener = pair.b.listen(udp).unwrap();
    let id = pair.a.sidr_resolve(now, B, udp, 1234, b"ud?").unwrap();
    pair.exchange(|_, _| false);
    let asked = match &pair.events(B)[..] {
        [CmEvent::SidrRequest {
            id,
            listener: l,
            peer_port: 1234,
            private_data,
            ..
        }] if *l == listener && &private_data[..3] == b"ud?" => *id,
        other => panic!("{other:?}"),
    };
    let answer = Ok((Qpn::new(0x44), RDMA_UDP_QKEY));
    pair.b.sidr_reply(now, asked, answer, b"").unwrap();
    pair.exchange(|_, _| false);
    match &pair.events(A)[..] {
        [CmEvent::SidrResolved {
            id: got, result, ..
        }] => {
            assert_eq!((*got, *result), (id, answer));
        }
        other => panic!("{other:?}"),
    }
    // Unanswered: sent 1 + retries times, then given up.
    let lost = pair.a.sidr_resolve(now, B, udp, 1, b"").unwrap();
    for _ in 0..10 {
        pair.exchange(|from, _| from == A);
        pair.advance(config().request_period());
    }
    assert_eq!(pair.events(A), [CmEvent::SidrTimedOut { id: lost }]);
    assert_eq!(
        pair.sent(A, "SIDR_REQ"),
        2 + 1 + usize::from(config().max_retries)
    );
}

/// The REQ softroce sends for rping's parameters is the REQ kernel rxe sent in
/// `packet-fixtures/rxe/rdma_cm_rping.pcap`, byte for byte, once the values each side draws
/// for itself (communication ID, transaction ID, GUID, QPN, PSN) are the fixture's.
#[test]
fn our_req_for_rpings_parameters_is_the_kernels_byte_for_byte() {
    let fixture = crate::wire::cm::tests_support::rping_mads();
    let theirs = parse_req(&fixture[0]);
    let client: IpAddr = "10.99.0.11".parse().unwrap();
    let server: IpAddr = "10.99.0.12".parse().unwrap();
    let mut cm = CmEndpoint::new(client, 1, CmConfig::default());
    let params = ReqParams {
        src_port: 0xe482,
        local_ack_timeout: 19,
        ..ReqParams::rc(server, RPING, theirs.local_qpn, theirs.starting_psn)
    };
    cm.connect(Duration::ZERO, &params).unwrap();
    let ours = cm.poll_transmit().unwrap();
    let mut mine = parse_req(&ours.mad[..]);
    mine.local_comm_id = theirs.local_comm_id;
    mine.local_ca_guid = theirs.local_ca_guid;
    let mut mad = [0; MAD_LEN];
    let (header, _) = CmMessage::parse(&fixture[0]).unwrap();
    CmMessage::Req(Box::new(mine)).emit(header.tid, 0, &mut mad);
    assert_eq!(mad[..], fixture[0][..]);
}

/// The io layer could not reach the peer (a local route failure on send): attempts toward it
/// end at once, a DREQ counts as answered, a SIDR request times out; an established
/// connection stands, as its QP learns of it from its own packets.
#[test]
fn an_unreachable_peer_ends_what_waits_on_it() {
    let mut pair = Pair::new(config());
    let (established, _) = pair.connected();
    let attempt = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    let udp = ServiceId::ip(PortSpace::Udp, 1);
    let sidr = pair.a.sidr_resolve(pair.now, B, udp, 1, b"").unwrap();
    pair.a.peer_unreachable(pair.now, B);
    let events = pair.events(A);
    assert!(events.contains(&CmEvent::Failed {
        conn: attempt,
        failure: Failure::Unreachable
    }));
    assert!(events.contains(&CmEvent::SidrTimedOut { id: sidr }));
    assert_eq!(
        events.len(),
        2,
        "the established connection stands: {events:?}"
    );
    pair.a.disconnect(pair.now, established).unwrap();
    pair.a.peer_unreachable(pair.now, B);
    assert_eq!(
        pair.events(A),
        [CmEvent::Disconnected { conn: established }]
    );
}

/// `packet-fixtures/rxe/softroce_rdma_cm_rping.pcap`: softroce's rping client against kernel
/// rxe's rping server, captured on the lab's bridge. rxe took softroce's REQ (its REP names
/// softroce's communication ID), and softroce's QP sends from the PSN the REP names.
#[test]
fn softroce_and_rxe_agree_in_the_captured_handshake() {
    let mads = crate::wire::cm::tests_support::fixture_mads("softroce_rdma_cm_rping.pcap");
    let softroce: IpAddr = "10.99.0.1".parse().unwrap();
    let rxe: IpAddr = "10.99.0.12".parse().unwrap();
    let parsed: Vec<(IpAddr, CmMessage)> = mads
        .iter()
        .map(|(src, mad)| (*src, CmMessage::parse(mad).unwrap().1))
        .collect();
    let names: Vec<_> = parsed.iter().map(|(src, m)| (*src, m.name())).collect();
    assert_eq!(
        names,
        [
            (softroce, "REQ"),
            (rxe, "REP"),
            (softroce, "RTU"),
            (softroce, "DREQ"),
            (rxe, "DREP")
        ]
    );
    let (CmMessage::Req(req), CmMessage::Rep(rep)) = (&parsed[0].1, &parsed[1].1) else {
        panic!("{parsed:?}")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    // softroce's own check of a REQ, as a server at rxe's address, takes it too.
    let mut server = CmEndpoint::new(rxe, 3, CmConfig::default());
    server.listen(RPING).unwrap();
    server.handle_mad(Duration::ZERO, softroce, &mads[0].1);
    assert!(matches!(
        server.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    // The first RC packet softroce sent is its first SEND, from the REP's PSN.
    let path = format!(
        "{}/packet-fixtures/rxe/softroce_rdma_cm_rping.pcap",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(path).unwrap();
    let first_send = crate::capture::Capture::new(&bytes)
        .unwrap()
        .map(|r| r.unwrap())
        .find_map(|record| {
            let frame = record.frame().unwrap();
            let from_softroce = matches!(frame.repr.ip, crate::wire::IpRepr::V4 { src, .. } if IpAddr::from(src) == softroce);
            let bth = crate::wire::BthRepr::parse(&frame.packet.bth()).unwrap();
            (from_softroce && bth.dest_qp == rep.local_qpn).then_some(bth.psn)
        });
    assert_eq!(first_send, Some(rep.starting_psn));
}

/// cm.c `cm_match_req`: a REQ from a QP that is already connected (the same QPN at the same
/// address, under a new communication ID, as from a peer that lost the old connection) is
/// rejected with reason 10, stale connection, and the old connection, established, is sent a
/// DREQ; B's application hears that it ended.
#[test]
fn a_req_from_a_connected_qp_is_rejected_as_stale_and_ends_the_old_connection() {
    let mut pair = Pair::new(config());
    let (_, passive) = pair.connected();
    // A forgets the connection (no DREQ) and asks again for the same QP.
    let again = pair.a.connect(pair.now, &req_params(b"")).unwrap();
    let req = pair.a.poll_transmit().unwrap();
    pair.b.handle_mad(pair.now, A, &req.mad[..]);
    let rej = pair.b.poll_transmit().expect("an answer to the REQ");
    let rej = parse_rej(&rej.mad[..]);
    assert_eq!(rej.reason, RejReason::STALE_CONN);
    assert_eq!(rej.remote_comm_id, again.0);
    assert_eq!(rej.message_rejected, REJECTED_REQ);
    let dreq = pair
        .b
        .poll_transmit()
        .expect("a DREQ for the old connection");
    assert_eq!(CmMessage::parse(&dreq.mad[..]).unwrap().1.name(), "DREQ");
    assert_eq!(pair.b.counters().rejected_stale, 1);
    assert!(
        pair.events(B).is_empty(),
        "no request reaches the application"
    );
    pair.a.handle_mad(pair.now, B, &dreq.mad[..]);
    pair.exchange(|_, _| false);
    assert_eq!(pair.events(B), [CmEvent::Disconnected { conn: passive }]);
}

/// cm.c `cm_enter_timewait` takes a connection out of the table of the peers' QPs that
/// `cm_match_req` checks: once the old connection has ended, a REQ from the same QP number (a
/// process that destroyed its QP and drew the number again) is a new connection, not a stale
/// one, though the old one still waits out its timewait.
#[test]
fn a_req_from_a_qp_whose_old_connection_ended_is_a_new_request() {
    let mut pair = Pair::new(config());
    let (active, _) = pair.connected();
    pair.a.disconnect(pair.now, active).unwrap();
    pair.exchange(|_, _| false);
    pair.events(A);
    pair.events(B);
    assert_eq!(pair.b.connections(), 1, "B's old connection is in timewait");
    pair.a.connect(pair.now, &req_params(b"")).unwrap();
    pair.exchange(|_, _| false);
    assert!(matches!(
        &pair.events(B)[..],
        [CmEvent::ConnectRequest { .. }]
    ));
    assert_eq!(pair.b.counters().rejected_stale, 0);
}

/// cm.c `ib_send_cm_req`: the active side waits the response time it asks of the peer plus
/// twice the path's packet life time before it sends its REQ again; RDMA-CM's on RoCE is 18
/// (`CMA_IBOE_PACKET_LIFETIME`), so with librdmacm's defaults the REQ comes again after
/// 4.3 s + 2 × 1.07 s. Kernel rxe's REQs to a host that answered nothing came 6.2 to 6.4 s
/// apart in the lab (a guest's rping, captured on the host side).
#[test]
fn with_librdmacms_defaults_a_req_is_sent_again_after_6_4_s() {
    let defaults = CmConfig::default();
    let period = defaults.request_period();
    assert_eq!(period, ib_timeout(20) + 2 * ib_timeout(18));
    assert!(period > Duration::from_millis(6_400) && period < Duration::from_millis(6_500));
    let mut pair = Pair::new(defaults);
    pair.a.connect(pair.now, &req_params(b"")).unwrap();
    pair.exchange(|from, _| from == A);
    pair.advance(period - Duration::from_millis(1));
    pair.exchange(|from, _| from == A);
    assert_eq!(pair.sent(A, "REQ"), 1, "not yet");
    pair.advance(Duration::from_millis(1));
    pair.exchange(|from, _| from == A);
    assert_eq!(pair.sent(A, "REQ"), 2);
}

/// The start of a UD packet to QP `qpn` carrying `mad`, as an ICMP report quotes it: BTH
/// (DestQP at bytes 5 to 7), DETH, then the MAD's first `mad_len` bytes.
fn quote(qpn: u32, mad: &[u8], mad_len: usize) -> Vec<u8> {
    let mut quoted = vec![0x64, 0, 0xff, 0xff, 0];
    quoted.extend_from_slice(&qpn.to_be_bytes()[1..]);
    quoted.extend_from_slice(&[0; 4 + 8]);
    quoted.extend_from_slice(&mad[..mad_len]);
    quoted
}

/// RFC 5927 section 4.1 (TCP's rule for ICMP while a connection opens): an ICMP destination
/// unreachable ends only an attempt whose REQ is unanswered, toward the destination it names,
/// and, when it quotes the REQ, only the attempt whose communication ID it quotes. A report
/// quoting another attempt's REQ, a data packet, or reaching an established connection is
/// ignored and counted.
#[test]
fn an_icmp_report_ends_only_the_unanswered_req_it_names() {
    let mut pair = Pair::new(config());
    pair.connected();
    pair.a.peer_refused(pair.now, B, &[]);
    assert!(
        pair.events(A).is_empty(),
        "an established connection stands"
    );
    assert_eq!(pair.a.counters().icmp_ignored, 1);

    let attempt = pair.a.connect(
        pair.now,
        &ReqParams {
            local_qpn: Qpn::new(0x33),
            ..req_params(b"")
        },
    );
    let attempt = attempt.unwrap();
    let req = pair.a.poll_transmit().unwrap();
    let mut other = *req.mad;
    other[24..28].copy_from_slice(&(attempt.0 ^ 1).to_be_bytes());
    pair.a.peer_refused(pair.now, B, &quote(1, &other[..], 28));
    pair.a
        .peer_refused(pair.now, B, &quote(0x22, &req.mad[..], 28));
    pair.a.peer_refused(
        pair.now,
        "10.0.0.3".parse().unwrap(),
        &quote(1, &req.mad[..], 28),
    );
    assert!(
        pair.events(A).is_empty(),
        "another REQ, a data packet, another host"
    );
    assert_eq!(pair.a.counters().icmp_ignored, 4);
    pair.a
        .peer_refused(pair.now, B, &quote(1, &req.mad[..], 28));
    assert_eq!(
        pair.events(A),
        [CmEvent::Failed {
            conn: attempt,
            failure: Failure::Unreachable
        }]
    );
    assert_eq!(pair.a.counters().icmp_accepted, 1);

    // A router's report may quote only the UDP header: the destination alone then decides.
    let again = pair.a.connect(
        pair.now,
        &ReqParams {
            local_qpn: Qpn::new(0x44),
            ..req_params(b"")
        },
    );
    let again = again.unwrap();
    pair.a.peer_refused(pair.now, B, &[]);
    assert_eq!(
        pair.events(A),
        [CmEvent::Failed {
            conn: again,
            failure: Failure::Unreachable
        }]
    );
}
