//! Connection management through the CM agents of two simulated nodes: a REQ, a REP and an
//! RTU carried on QP1 as UD SENDs, the QPs moved to RTS with what they negotiated, and data
//! over the result. Then what the network does to the handshake: a lost REQ, REP or RTU
//! (IBTA 12.9.6, the timers of each state; IBTA 11.6.2, the communication-established event
//! that stands in for a lost RTU), every MAD duplicated, heavy loss, a REJ, and a DREQ race.

mod sim;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use sim::cm::{config, mad_name, rc_peer, CmSim, Peer};
use sim::{seed, Faults};
use softroce::cm::agent::{active_steps, passive_steps, Accept, Connect, QpMover};
use softroce::cm::{ib_timeout, CmConfig, CmEvent, ConnId, Failure};
use softroce::transport::{
    ConnectOptions, PathMtu, Payload, QpState, RecvWr, SendOp, SendWr, WcStatus,
};
use softroce::wire::cm::{PortSpace, RejReason, ServiceId};

const SERVICE: ServiceId = ServiceId::ip(PortSpace::Tcp, 7174);
const LIMIT: Duration = Duration::from_secs(60);

fn options() -> ConnectOptions {
    ConnectOptions {
        mtu: Some(PathMtu::Mtu1024),
        timeout: 10,
        ..ConnectOptions::default()
    }
}

/// Node 0 sends a REQ for `peer`'s QP to `service` on node 1.
fn connect(cm: &mut CmSim, peer: &Peer, service: ServiceId, data: &[u8]) -> ConnId {
    connect_moved_by(cm, peer, service, data, QpMover::Agent)
}

fn connect_moved_by(
    cm: &mut CmSim,
    peer: &Peer,
    service: ServiceId,
    data: &[u8],
    mover: QpMover,
) -> ConnId {
    let now = cm.sim.now;
    let options = options();
    let connect = Connect {
        qpn: peer.qpn,
        dst: sim::addr(1),
        service_id: service,
        src_port: 40000,
        options: &options,
        private_data: data,
        mover,
    };
    cm.agents[0]
        .connect(now, &mut cm.sim.nodes[0], &connect)
        .unwrap()
}

/// Node 1 accepts its first request with `peer`'s QP.
fn accept(cm: &mut CmSim, peer: &Peer) -> ConnId {
    let (conn, request) = cm.first_request(1).expect("a connection request");
    let now = cm.sim.now;
    let ep = &mut cm.sim.nodes[1];
    let accept = Accept {
        qpn: peer.qpn,
        request: &request,
        options: &options(),
        private_data: b"accepted",
        mover: QpMover::Agent,
    };
    cm.agents[1].accept(now, ep, conn, &accept).unwrap();
    conn
}

fn established(cm: &CmSim, n: usize, conn: ConnId) -> bool {
    cm.saw(n, &CmEvent::Established { conn })
}

/// A whole handshake: node 1 listens, node 0 connects, node 1 accepts when the request comes,
/// and both report the connection.
fn handshake(cm: &mut CmSim) -> ([Peer; 2], [ConnId; 2]) {
    let peers = [rc_peer(&mut cm.sim, 0), rc_peer(&mut cm.sim, 1)];
    cm.agents[1].cm_mut().listen(SERVICE).unwrap();
    let active = connect(cm, &peers[0], SERVICE, b"hello");
    cm.run_until(LIMIT, |cm| cm.first_request(1).is_some());
    let passive = accept(cm, &peers[1]);
    cm.run_until(LIMIT, |cm| {
        established(cm, 0, active) && established(cm, 1, passive)
    });
    (peers, [active, passive])
}

/// A SEND and a WRITE from node 0 to node 1 over the connection; their data must land.
fn carry_data(cm: &mut CmSim, peers: &[Peer; 2]) {
    let [a, b] = peers;
    a.mr.write(0, b"sent through a CM connection").unwrap();
    a.mr.write(4096, b"written through it").unwrap();
    let recv = RecvWr {
        wr_id: 7,
        sges: [b.mr.sge(0, 64).unwrap()].into(),
    };
    cm.sim.nodes[1].post_recv(b.qpn, recv).unwrap();
    let now = cm.sim.now;
    let send = SendWr::new(
        1,
        SendOp::Send,
        Payload::Sges([a.mr.sge(0, 28).unwrap()].into()),
    );
    let write_op = SendOp::Write {
        remote_addr: b.mr.iova() + 4096,
        rkey: b.mr.rkey(),
    };
    let write = SendWr::new(
        2,
        write_op,
        Payload::Sges([a.mr.sge(4096, 18).unwrap()].into()),
    );
    cm.sim.nodes[0].post_send(now, a.qpn, send).unwrap();
    cm.sim.nodes[0].post_send(now, a.qpn, write).unwrap();
    let mut done = Vec::new();
    cm.run_until(LIMIT, |cm| {
        done.extend(std::iter::from_fn(|| cm.sim.nodes[0].poll_cq(a.cq)));
        done.len() == 2
    });
    assert!(
        done.iter().all(|wc| wc.status == WcStatus::Success),
        "{done:?}"
    );
    let received = cm.sim.nodes[1].poll_cq(b.cq).expect("the SEND's receive");
    assert_eq!((received.wr_id, received.byte_len), (7, 28));
    assert_eq!(&b.mr.to_vec()[..28], b"sent through a CM connection");
    assert_eq!(&b.mr.to_vec()[4096..4114], b"written through it");
}

/// Drops the first `n` MADs named `name` that cross the wire.
fn lose_first(cm: &mut CmSim, name: &'static str, n: usize) -> Rc<Cell<usize>> {
    let lost = Rc::new(Cell::new(0));
    let count = lost.clone();
    cm.sim.filter = Some(Box::new(move |_, bytes| {
        if mad_name(bytes) == Some(name) && count.get() < n {
            count.set(count.get() + 1);
            return false;
        }
        true
    }));
    lost
}

#[test]
fn a_cm_connection_carries_a_send_and_a_write() {
    let mut cm = CmSim::new(2, seed(1), Faults::default(), config());
    let (peers, [active, passive]) = handshake(&mut cm);
    let reply = cm.events[0].iter().find_map(|e| match e {
        CmEvent::Reply { reply, conn } if *conn == active => Some(reply.clone()),
        _ => None,
    });
    assert_eq!(&reply.expect("a reply").private_data[..8], b"accepted");
    let (_, request) = cm.first_request(1).unwrap();
    assert_eq!(&request.private_data[..5], b"hello");
    assert_eq!(request.peer_qpn, peers[0].qpn);
    for (n, peer) in peers.iter().enumerate() {
        assert_eq!(cm.sim.nodes[n].qp_state(peer.qpn), Some(QpState::Rts));
    }
    carry_data(&mut cm, &peers);
    assert_eq!(cm.agents[0].cm().counters().retransmissions, 0);
    assert!(established(&cm, 1, passive));
}

#[test]
fn a_lost_req_is_sent_again_at_the_response_timeout() {
    let mut cm = CmSim::new(2, seed(2), Faults::default(), config());
    let lost = lose_first(&mut cm, "REQ", 1);
    let (peers, _) = handshake(&mut cm);
    assert_eq!(lost.get(), 1);
    assert!(cm.sim.now >= ib_timeout(config().response_timeout));
    assert_eq!(cm.agents[0].cm().counters().retransmissions, 1);
    carry_data(&mut cm, &peers);
}

#[test]
fn a_lost_rep_is_sent_again_and_answered_once() {
    let mut cm = CmSim::new(2, seed(3), Faults::default(), config());
    let lost = lose_first(&mut cm, "REP", 1);
    let (peers, [active, passive]) = handshake(&mut cm);
    assert_eq!(lost.get(), 1);
    assert_eq!(
        cm.count(0, |e| *e == CmEvent::Established { conn: active }),
        1
    );
    assert_eq!(
        cm.count(1, |e| *e == CmEvent::Established { conn: passive }),
        1
    );
    carry_data(&mut cm, &peers);
}

/// Every RTU is lost: the passive side learns that the connection is up from the first packet
/// its QP accepts (IBTA 11.6.2's communication-established event; cm.c `ib_cm_notify`).
#[test]
fn with_every_rtu_lost_the_first_packet_establishes_the_passive_side() {
    let mut cm = CmSim::new(2, seed(4), Faults::default(), config());
    lose_first(&mut cm, "RTU", usize::MAX);
    let peers = [rc_peer(&mut cm.sim, 0), rc_peer(&mut cm.sim, 1)];
    cm.agents[1].cm_mut().listen(SERVICE).unwrap();
    let active = connect(&mut cm, &peers[0], SERVICE, b"");
    cm.run_until(LIMIT, |cm| cm.first_request(1).is_some());
    let passive = accept(&mut cm, &peers[1]);
    cm.run_until(LIMIT, |cm| established(cm, 0, active));
    assert!(!established(&cm, 1, passive));
    carry_data(&mut cm, &peers);
    cm.run_until(LIMIT, |cm| established(cm, 1, passive));
    assert_eq!(
        cm.count(1, |e| *e == CmEvent::Established { conn: passive }),
        1
    );
}

/// Every packet arrives twice, MADs included: still one connection each side, and the data
/// once.
#[test]
fn every_mad_twice_makes_one_connection() {
    let faults = Faults {
        duplicate: 1.0,
        ..Faults::default()
    };
    let mut cm = CmSim::new(2, seed(5), faults, config());
    let (peers, [active, passive]) = handshake(&mut cm);
    carry_data(&mut cm, &peers);
    cm.run_idle(LIMIT);
    assert_eq!(
        cm.count(0, |e| *e == CmEvent::Established { conn: active }),
        1
    );
    assert_eq!(
        cm.count(1, |e| *e == CmEvent::Established { conn: passive }),
        1
    );
    let requests = |e: &CmEvent| matches!(e, CmEvent::ConnectRequest { .. });
    assert_eq!(cm.count(1, requests), 1);
    assert!(
        cm.agents[1].cm().counters().duplicates >= 2,
        "the REQ and the RTU came twice"
    );
    assert!(
        cm.agents[0].cm().counters().duplicates >= 1,
        "the REP came twice"
    );
}

/// A quarter of all packets lost, MADs and data alike: every handshake still ends connected,
/// on retransmissions, and the data lands.
#[test]
fn a_quarter_of_the_packets_lost_still_connects() {
    for run in 0..8 {
        let faults = Faults {
            loss: 0.25,
            ..Faults::default()
        };
        let mut cm = CmSim::new(2, seed(100) + run, faults, config());
        let (peers, _) = handshake(&mut cm);
        carry_data(&mut cm, &peers);
    }
}

/// cm.c `cm_issue_rej`: a REQ for a port no one listens on is rejected at once with reason 8
/// (with no listen grace, as the kernel), and the active QP is left in ERROR, as librdmacm
/// leaves it.
#[test]
fn a_req_for_a_port_no_one_listens_on_is_rejected_at_once() {
    let config = CmConfig {
        listen_grace: Duration::ZERO,
        ..config()
    };
    let mut cm = CmSim::new(2, seed(6), Faults::default(), config);
    let peer = rc_peer(&mut cm.sim, 0);
    let active = connect(&mut cm, &peer, ServiceId::ip(PortSpace::Tcp, 9), b"");
    cm.run_until(LIMIT, |cm| {
        cm.count(0, |e| matches!(e, CmEvent::Failed { .. })) == 1
    });
    let failure = cm.events[0].iter().find_map(|e| match e {
        CmEvent::Failed { conn, failure } if *conn == active => Some(failure.clone()),
        _ => None,
    });
    assert!(matches!(
        failure,
        Some(Failure::Rejected {
            reason: RejReason::INVALID_SERVICE_ID,
            ..
        })
    ));
    assert!(
        cm.sim.now < ib_timeout(config.response_timeout),
        "no timer was needed"
    );
    assert_eq!(cm.sim.nodes[0].qp_state(peer.qpn), Some(QpState::Error));
    assert_eq!(cm.agents[1].cm().counters().rejected_no_listener, 1);
}

#[test]
fn a_rejection_reaches_the_active_side_with_its_private_data() {
    let mut cm = CmSim::new(2, seed(7), Faults::default(), config());
    let peer = rc_peer(&mut cm.sim, 0);
    cm.agents[1].cm_mut().listen(SERVICE).unwrap();
    let active = connect(&mut cm, &peer, SERVICE, b"");
    cm.run_until(LIMIT, |cm| cm.first_request(1).is_some());
    let (conn, _) = cm.first_request(1).unwrap();
    let now = cm.sim.now;
    let reason = RejReason::CONSUMER_DEFINED;
    cm.agents[1]
        .cm_mut()
        .reject(now, conn, reason, b"full")
        .unwrap();
    cm.run_until(LIMIT, |cm| {
        cm.count(0, |e| matches!(e, CmEvent::Failed { .. })) == 1
    });
    match &cm.events[0][..] {
        [CmEvent::Failed {
            conn,
            failure:
                Failure::Rejected {
                    reason,
                    private_data,
                },
        }] => {
            assert_eq!((*conn, reason.0), (active, 28));
            assert_eq!(&private_data[..4], b"full");
        }
        other => panic!("{other:?}"),
    }
}

/// IBTA 12.9.6's DREQ race: both sides disconnect in the same instant. Each answers the
/// other's DREQ, each reports the end once, and both QPs are in ERROR.
#[test]
fn a_dreq_race_ends_each_side_once() {
    let mut cm = CmSim::new(2, seed(8), Faults::default(), config());
    let (peers, conns) = handshake(&mut cm);
    let now = cm.sim.now;
    for (n, conn) in conns.into_iter().enumerate() {
        let ep = &mut cm.sim.nodes[n];
        cm.agents[n].disconnect(now, ep, conn).unwrap();
    }
    cm.run_idle(LIMIT);
    for (n, conn) in conns.into_iter().enumerate() {
        let ended = CmEvent::Disconnected { conn };
        assert_eq!(cm.count(n, |e| *e == ended), 1, "node {n}");
        assert_eq!(cm.sim.nodes[n].qp_state(peers[n].qpn), Some(QpState::Error));
        assert_eq!(cm.agents[n].cm().counters().retransmissions, 0, "node {n}");
        assert_eq!(
            cm.agents[n].cm().connections(),
            0,
            "timewait over, node {n}"
        );
    }
}

/// A lost DREP: the DREQ goes again, the peer answers from timewait, and the initiator ends.
#[test]
fn a_lost_drep_is_answered_again() {
    let mut cm = CmSim::new(2, seed(9), Faults::default(), config());
    let (_, conns) = handshake(&mut cm);
    lose_first(&mut cm, "DREP", 1);
    let now = cm.sim.now;
    let ep = &mut cm.sim.nodes[0];
    cm.agents[0].disconnect(now, ep, conns[0]).unwrap();
    cm.run_until(LIMIT, |cm| {
        cm.saw(0, &CmEvent::Disconnected { conn: conns[0] })
    });
    assert!(cm.saw(1, &CmEvent::Disconnected { conn: conns[1] }));
    assert_eq!(cm.agents[0].cm().counters().retransmissions, 1);
}

/// Each side's starting PSN is the one its QP expects (cm.c: `rdma_init_qp_attr` sets the
/// RTR `rq_psn` to the ID's own sequence number, which its REQ or REP carries). Kernel rxe's
/// rping fixture shows it: the client's first SEND carries the REP's PSN, the server's first
/// READ the REQ's. Both sides of a softroce pair reading it the other way would still agree.
#[test]
fn each_side_sends_from_the_psn_its_peer_named() {
    let mut cm = CmSim::new(2, seed(10), Faults::default(), config());
    let (peers, [active, _]) = handshake(&mut cm);
    let rep_psn = cm.events[0].iter().find_map(|e| match e {
        CmEvent::Reply { conn, reply } if *conn == active => Some(reply.peer_psn),
        _ => None,
    });
    let (_, request) = cm.first_request(1).unwrap();
    let seen = sim::record(&mut cm.sim);
    carry_data(&mut cm, &peers);
    let first_from = |node| seen.borrow().iter().find(|s| s.from == node).map(|s| s.psn);
    assert_eq!(
        first_from(0),
        rep_psn,
        "the active side sends from the REP's PSN"
    );
    // Node 1 only acknowledges here: an ACK carries the PSN it acknowledges, node 0's.
    let read = SendOp::Read {
        remote_addr: peers[0].mr.iova(),
        rkey: peers[0].mr.rkey(),
    };
    let wr = SendWr::new(
        9,
        read,
        Payload::Sges([(peers[1].mr).sge(8192, 8).unwrap()].into()),
    );
    seen.borrow_mut().clear();
    let now = cm.sim.now;
    cm.sim.nodes[1].post_send(now, peers[1].qpn, wr).unwrap();
    cm.run_until(LIMIT, |cm| cm.sim.nodes[1].poll_cq(peers[1].cq).is_some());
    assert_eq!(
        first_from(1),
        Some(request.peer_psn),
        "the passive side sends from the REQ's PSN"
    );
}

/// librdmacm's IDs without a QP (`rdma_init_qp_attr`, `rdma_establish`; cma.c
/// `rdma_init_qp_attr`, which gives each side the PSN its own REQ or REP named as `rq_psn`):
/// the agents exchange REQ, REP and RTU but leave the QPs alone; each side moves its QP
/// itself with the attributes the CM negotiated, the passive side before its REP, the active
/// side between the REP and the RTU, which it sends only when told. Data then flows both ways,
/// and a disconnect leaves the QPs as they are, for their application to move.
#[test]
fn an_application_that_moves_its_own_qps_connects_with_the_negotiated_attributes() {
    let mut cm = CmSim::new(2, seed(7), Faults::default(), config());
    let peers = [rc_peer(&mut cm.sim, 0), rc_peer(&mut cm.sim, 1)];
    let mover = QpMover::Application(softroce::transport::QpType::Rc);
    cm.agents[1].cm_mut().listen(SERVICE).unwrap();
    let active = connect_moved_by(&mut cm, &peers[0], SERVICE, b"mine", mover);
    assert_eq!(
        cm.sim.nodes[0].qp_state(peers[0].qpn),
        Some(QpState::Reset),
        "the agent leaves the QP alone"
    );
    cm.run_until(LIMIT, |cm| cm.first_request(1).is_some());
    let (passive, request) = cm.first_request(1).unwrap();
    let now = cm.sim.now;
    let steps = passive_steps(&request, &options()).steps;
    for step in &steps {
        cm.sim.nodes[1].modify_qp(now, peers[1].qpn, step).unwrap();
    }
    let accept = Accept {
        qpn: peers[1].qpn,
        request: &request,
        options: &options(),
        private_data: b"accepted",
        mover,
    };
    cm.agents[1]
        .accept(now, &mut cm.sim.nodes[1], passive, &accept)
        .unwrap();
    let reply = |cm: &CmSim| {
        cm.events[0].iter().find_map(|e| match e {
            CmEvent::Reply { conn, reply } if *conn == active => Some(reply.clone()),
            _ => None,
        })
    };
    cm.run_until(LIMIT, |cm| reply(cm).is_some());
    let reply = reply(&cm).unwrap();
    // A while after the REP's arrival, the RTU still waits for the application.
    for _ in 0..10 {
        cm.step();
    }
    assert!(!established(&cm, 0, active) && !established(&cm, 1, passive));
    assert_eq!(cm.sim.nodes[0].qp_state(peers[0].qpn), Some(QpState::Reset));
    let now = cm.sim.now;
    let port_mtu = cm.sim.nodes[0].port_mtu();
    let steps = active_steps(
        softroce::transport::QpType::Rc,
        sim::addr(1),
        &reply,
        &options(),
        port_mtu,
    );
    for step in &steps {
        cm.sim.nodes[0].modify_qp(now, peers[0].qpn, step).unwrap();
    }
    cm.agents[0].establish(now, active).unwrap();
    cm.run_until(LIMIT, |cm| {
        established(cm, 0, active) && established(cm, 1, passive)
    });
    carry_data(&mut cm, &peers);
    let now = cm.sim.now;
    cm.agents[0]
        .disconnect(now, &mut cm.sim.nodes[0], active)
        .unwrap();
    cm.run_until(LIMIT, |cm| {
        cm.saw(1, &CmEvent::Disconnected { conn: passive })
    });
    for (n, peer) in peers.iter().enumerate() {
        assert_eq!(
            cm.sim.nodes[n].qp_state(peer.qpn),
            Some(QpState::Rts),
            "node {n}'s QP is its application's to move"
        );
    }
}
