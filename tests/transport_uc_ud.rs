//! UC and UD queue pairs, shared receive queues and address handles in the deterministic
//! simulator (`tests/sim`), and the packets the core emits for UC and UD compared with kernel
//! rxe's (`packet-fixtures/rxe/`). Each test names the IBTA rule or rxe behaviour it checks. A
//! failing run prints its seed; `SOFTROCE_SIM_SEED=N` repeats it.

mod common;
mod sim;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use common::{fixture_dir, manifest};
use sim::{addr, drain, forge, pattern, seed, Faults, Rng, Sim};
use softroce::capture::Capture;
use softroce::memory::{Access, MemoryRegion, PdId};
use softroce::transport::{
    AddressVector, AsyncEvent, CqId, Datagram, PathMtu, Payload, QpAttr, QpInit, QpState, QpType,
    RecvWr, SendOp, SendWr, Sge, SrqAttr, SrqId, SrqModify, UdDest, VerbsError, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};
use softroce::wire::{
    BthRepr, ExtHeader, ExtHeaders, IcrcStatus, IpRepr, Opcode, PKey, PacketRepr, Position, Psn,
    QKey, Qpn, RKey, RnrTimer, RocePacket,
};

const IOVA: u64 = 0x10_0000;
const MR_LEN: usize = 1 << 20;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);
/// The Q_Key of every UD QP here, the one ibv_ud_pingpong uses in the fixture.
const QKEY: QKey = QKey(0x1111_1111);
/// Both sides start two PSNs before the 2^24 wrap, so multi-packet messages cross it.
const PSN: u32 = 0xff_fffe;
const LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Node {
    pd: PdId,
    cq: CqId,
    mr: MemoryRegion,
}

fn node(sim: &mut Sim, n: usize) -> Node {
    let ep = &mut sim.nodes[n];
    let pd = ep.alloc_pd();
    let cq = ep.create_cq(1 << 16);
    let mr = ep.reg_mr(pd, IOVA, MR_LEN, ALL).unwrap();
    Node { pd, cq, mr }
}

fn init(node: &Node, qp_type: QpType) -> QpInit {
    QpInit {
        qp_type,
        pd: node.pd,
        send_cq: node.cq,
        recv_cq: node.cq,
        max_send_wr: 1024,
        max_recv_wr: 1024,
    }
}

/// Takes a QP through INIT and RTR to RTS: connected to `peer` (node, QPN) for RC and UC, with
/// the Q_Key `QKEY` for UD.
fn bring_up(sim: &mut Sim, n: usize, qpn: Qpn, qp_type: QpType, peer: Option<(usize, Qpn)>) {
    let rc = qp_type == QpType::Rc;
    let ud = qp_type == QpType::Ud;
    let steps = [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: (!ud).then_some(ALL),
            qkey: ud.then_some(QKEY),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            av: peer.map(|(m, _)| AddressVector { dest: addr(m) }),
            path_mtu: peer.map(|_| PathMtu::Mtu1024),
            dest_qpn: peer.map(|(_, qpn)| qpn),
            rq_psn: peer.map(|_| Psn::new(PSN)),
            max_dest_rd_atomic: rc.then_some(1),
            min_rnr_timer: rc.then_some(RnrTimer::new(1)),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(PSN)),
            timeout: rc.then_some(10),
            retry_cnt: rc.then_some(7),
            rnr_retry: rc.then_some(7),
            max_rd_atomic: rc.then_some(1),
            ..Default::default()
        },
    ];
    let now = sim.now;
    for attr in steps {
        sim.nodes[n].modify_qp(now, qpn, &attr).unwrap();
    }
}

/// A QP of `qp_type` on node `n`, taking its receive requests from `srq` if given.
fn create(sim: &mut Sim, n: usize, node: &Node, qp_type: QpType, srq: Option<SrqId>) -> Qpn {
    match srq {
        Some(srq) => sim.nodes[n].create_qp_with_srq(init(node, qp_type), srq),
        None => sim.nodes[n].create_qp(init(node, qp_type)),
    }
    .unwrap()
}

/// Node 0 and node 1 with one QP of `qp_type` each, in RTS; node 1's takes its receive requests
/// from a 64-deep SRQ when `with_srq`.
fn pair(sim: &mut Sim, qp_type: QpType, with_srq: bool) -> ([Node; 2], [Qpn; 2], Option<SrqId>) {
    let nodes = [node(sim, 0), node(sim, 1)];
    let srq = with_srq.then(|| {
        let attr = SrqAttr {
            max_wr: 64,
            srq_limit: 0,
        };
        sim.nodes[1].create_srq(nodes[1].pd, attr).unwrap()
    });
    let q0 = create(sim, 0, &nodes[0], qp_type, None);
    let q1 = create(sim, 1, &nodes[1], qp_type, srq);
    let connected = qp_type != QpType::Ud;
    bring_up(sim, 0, q0, qp_type, connected.then_some((1, q1)));
    bring_up(sim, 1, q1, qp_type, connected.then_some((0, q0)));
    (nodes, [q0, q1], srq)
}

fn sge(node: &Node, offset: usize, len: usize) -> Sge {
    Sge {
        addr: IOVA + offset as u64,
        len: len as u32,
        lkey: node.mr.lkey(),
    }
}

fn send(wr_id: u64, op: SendOp, node: &Node, offset: usize, len: usize) -> SendWr {
    SendWr::new(wr_id, op, Payload::Sges(sge(node, offset, len).into()))
}

fn recv(wr_id: u64, node: &Node, offset: usize, len: usize) -> RecvWr {
    RecvWr::new(wr_id, sge(node, offset, len))
}

/// Posts a receive request on node `n`: to the SRQ if there is one, else to the QP.
fn post_recv(sim: &mut Sim, n: usize, qpn: Qpn, srq: Option<SrqId>, wr: RecvWr) {
    match srq {
        Some(srq) => sim.nodes[n].post_srq_recv(srq, wr),
        None => sim.nodes[n].post_recv(qpn, wr),
    }
    .unwrap();
}

fn post_send(sim: &mut Sim, n: usize, qpn: Qpn, wr: SendWr) {
    let now = sim.now;
    sim.nodes[n].post_send(now, qpn, wr).unwrap();
}

/// A UD destination on node `to`, through an address handle of node `n`'s protection domain.
fn ud_dest(sim: &mut Sim, n: usize, pd: PdId, to: usize, qpn: Qpn, qkey: QKey) -> UdDest {
    let ah = sim.nodes[n]
        .create_ah(pd, AddressVector { dest: addr(to) })
        .unwrap();
    UdDest {
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

fn read_mr(node: &Node, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    node.mr.read(offset, &mut out).unwrap();
    out
}

/// Every packet put on the wire, with the node that sent it.
type Wire = Rc<RefCell<Vec<(usize, Vec<u8>)>>>;

/// Records every packet sent, and loses those `lose` picks.
fn tap(sim: &mut Sim, mut lose: impl FnMut(usize, &[u8]) -> bool + 'static) -> Wire {
    let wire = Wire::default();
    let seen = wire.clone();
    sim.filter = Some(Box::new(move |from, bytes| {
        seen.borrow_mut().push((from, bytes.to_vec()));
        !lose(from, bytes)
    }));
    wire
}

fn sent_by(wire: &Wire, n: usize) -> Vec<PacketRepr> {
    wire.borrow()
        .iter()
        .filter(|(from, _)| *from == n)
        .map(|(_, bytes)| PacketRepr::parse(&RocePacket::new_checked(&bytes[..]).unwrap()).unwrap())
        .collect()
}

/// Posts two 4096-byte UC SENDs at MTU 1024 (four packets each) and loses packet `lost` of the
/// first. rxe_resp.c `check_psn` drops the rest of the damaged message and starts over at the
/// next FIRST; no part of it completes. Its receive request is used again for the next message
/// when it is the QP's own (class D1), and completes with REM_INV_REQ_ERR when it came from an
/// SRQ (class E, `do_class_d1e_error`).
fn uc_send_with_one_loss(lost: usize, with_srq: bool) {
    let mut sim = Sim::new(2, seed(20), Faults::default());
    let mut from_0 = 0;
    let wire = tap(&mut sim, move |from, _| {
        from_0 += usize::from(from == 0);
        from == 0 && from_0 == lost + 1
    });
    let ([a, b], [qa, qb], srq) = pair(&mut sim, QpType::Uc, with_srq);
    for (i, data) in [pattern(1, 4096), pattern(2, 4096), pattern(3, 4096)]
        .iter()
        .enumerate()
    {
        a.mr.write(i * 0x2000, data).unwrap();
    }
    for id in 1..=3 {
        post_recv(
            &mut sim,
            1,
            qb,
            srq,
            recv(id, &b, 0x1_0000 * id as usize, 8192),
        );
    }
    for id in 0..2 {
        post_send(
            &mut sim,
            0,
            qa,
            send(id, SendOp::Send, &a, id as usize * 0x2000, 4096),
        );
    }
    // UC keeps no retransmission state: the requester completes each request once its last
    // packet is built (rxe_req.c), loss or not, and has no timer to run.
    assert!(
        drain(&mut sim, 0, a.cq).is_empty(),
        "no packet is built yet"
    );
    assert_eq!(sim.nodes[0].next_deadline(), None);
    sim.run_idle(LIMIT);
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );

    let got = drain(&mut sim, 1, b.cq);
    let first_took_a_request = lost > 0;
    let (whole_into, expected): (u64, _) = match (with_srq, first_took_a_request) {
        (true, true) => (2, vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::Success)]),
        _ => (1, vec![(1, WcStatus::Success)]),
    };
    assert_eq!(
        statuses(&got),
        expected,
        "lost packet {lost}, SRQ {with_srq}"
    );
    let whole = got.last().unwrap();
    assert_eq!((whole.byte_len, whole.opcode), (4096, WcOpcode::Recv));
    assert_eq!(
        read_mr(&b, 0x1_0000 * whole_into as usize, 4096),
        pattern(2, 4096),
        "the second message arrived whole"
    );
    let c = sim.nodes[1].counters();
    assert_eq!((c.sequence_errors, c.dropped_messages), (1, 1), "{c}");
    // No ACKs, no NAKs, and the requester never asks for one.
    assert!(sent_by(&wire, 1).is_empty());
    assert!(sent_by(&wire, 0).iter().all(|p| !p.bth.ack_req));

    // The connection carries on.
    post_send(&mut sim, 0, qa, send(2, SendOp::Send, &a, 0x4000, 4096));
    sim.run_idle(LIMIT);
    let next = drain(&mut sim, 1, b.cq);
    assert_eq!(statuses(&next), [(whole_into + 1, WcStatus::Success)]);
    assert_eq!(
        read_mr(&b, 0x1_0000 * (whole_into as usize + 1), 4096),
        pattern(3, 4096)
    );
}

#[test]
fn a_uc_send_cut_by_loss_is_never_completed_and_the_next_arrives_whole() {
    for lost in 0..4 {
        uc_send_with_one_loss(lost, false);
    }
}

#[test]
fn a_uc_send_cut_by_loss_completes_its_srq_request_in_error() {
    for lost in 0..4 {
        uc_send_with_one_loss(lost, true);
    }
}

#[test]
fn uc_under_random_loss_delivers_exactly_the_whole_messages() {
    // With 10% of the packets lost, a message arrives if and only if none of its packets was
    // lost, in order, byte for byte, each into the next receive request (damaged messages give
    // theirs back).
    const MESSAGES: usize = 150;
    const SLOT: usize = 5120;
    let seed = seed(21);
    let mut sim = Sim::new(2, seed, Faults::default());
    let lost = Rc::new(RefCell::new(BTreeSet::new()));
    let record = lost.clone();
    let mut rng = Rng::new(seed);
    tap(&mut sim, move |_, bytes| {
        let lose = rng.chance(0.10);
        if lose {
            let psn = RocePacket::new_checked(bytes).unwrap().bth().psn();
            record.borrow_mut().insert(psn.value());
        }
        lose
    });
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Uc, false);
    let mut rng = Rng::new(seed ^ 1);
    let lens: Vec<usize> = (0..MESSAGES)
        .map(|_| rng.below(5000) as usize + 1)
        .collect();
    let mut whole = Vec::new();
    let mut psn = Psn::new(PSN);
    for (i, &len) in lens.iter().enumerate() {
        a.mr.write(i * SLOT, &pattern(i as u64, len)).unwrap();
        post_recv(&mut sim, 1, qb, None, recv(i as u64, &b, i * SLOT, SLOT));
        post_send(
            &mut sim,
            0,
            qa,
            send(i as u64, SendOp::Send, &a, i * SLOT, len),
        );
        let packets = len.div_ceil(1024) as u32;
        let psns: Vec<u32> = (0..packets).map(|k| (psn + k).value()).collect();
        whole.push(psns);
        psn = psn + packets;
    }
    sim.run_idle(LIMIT);
    let lost = lost.borrow();
    let arrived: Vec<usize> = (0..MESSAGES)
        .filter(|&i| whole[i].iter().all(|p| !lost.contains(p)))
        .collect();
    assert!(
        arrived.len() > MESSAGES / 3 && arrived.len() < MESSAGES,
        "seed {seed}: {} of {MESSAGES} messages intact",
        arrived.len()
    );
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(got.len(), arrived.len(), "seed {seed}");
    for (slot, (wc, &i)) in got.iter().zip(&arrived).enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (slot as u64, WcStatus::Success, lens[i]),
            "seed {seed}: message {i}"
        );
        assert_eq!(
            read_mr(&b, slot * SLOT, lens[i]),
            pattern(i as u64, lens[i]),
            "seed {seed}: message {i}"
        );
    }
    assert!(sim.nodes[1].counters().dropped_messages > 0);
}

#[test]
fn uc_rdma_write_with_immediate_and_silently_dropped_bad_messages() {
    let mut sim = Sim::new(2, seed(22), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Uc, false);
    let data = pattern(5, 3000);
    a.mr.write(0, &data).unwrap();
    post_recv(&mut sim, 1, qb, None, recv(7, &b, 0x8_0000, 64));
    let write_imm = SendOp::WriteWithImm {
        remote_addr: IOVA + 0x1_0000,
        rkey: b.mr.rkey(),
        imm: 0xfeed_f00d,
    };
    post_send(&mut sim, 0, qa, send(1, write_imm, &a, 0, 3000));
    sim.run_idle(LIMIT);
    let opcodes: Vec<&str> = sent_by(&wire, 0)
        .iter()
        .map(|p| p.bth.opcode.name())
        .collect();
    assert_eq!(
        opcodes,
        [
            "UC_RDMA_WRITE_FIRST",
            "UC_RDMA_WRITE_MIDDLE",
            "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE"
        ]
    );
    let wc = &drain(&mut sim, 1, b.cq)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data),
        (7, WcOpcode::RecvRdmaWithImm, 3000, Some(0xfeed_f00d))
    );
    assert_eq!((wc.src_qp, wc.src_addr), (Some(qa), Some(addr(0))));
    // Only a UD receive's buffer holds a GRH. rxe's do_complete flags every receive on a user
    // CQ, RC and UC too, where no GRH is in the buffer; softroce flags what is there.
    assert!(!wc.grh, "only UD receives carry a GRH");
    assert_eq!(read_mr(&b, 0x1_0000, 3000), data);

    // A bad rkey and a range past the region: rxe_resp.c check_rkey fails, and UC, having no
    // NAK, drops the message and counts it. The requester cannot know and reports success.
    let bad = [
        (IOVA, b.mr.rkey().0 ^ 1),
        (IOVA + MR_LEN as u64 - 100, b.mr.rkey().0),
    ];
    for (i, (remote_addr, rkey)) in bad.into_iter().enumerate() {
        let op = SendOp::Write {
            remote_addr,
            rkey: softroce::wire::RKey(rkey),
        };
        post_send(&mut sim, 0, qa, send(2 + i as u64, op, &a, 0, 2000));
    }
    sim.run_idle(LIMIT);
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    let c = sim.nodes[1].counters();
    assert_eq!((c.rkey_violations, c.dropped_messages), (2, 2), "{c}");
    assert_eq!(sim.nodes[1].qp_state(qb), Some(QpState::Rts));
    assert!(sent_by(&wire, 1).is_empty(), "no NAK");
    assert!(sim.nodes[1].poll_event().is_none(), "no access error event");
    // A WRITE after them lands: the MIDDLE and LAST of the bad ones were ignored.
    let good = SendOp::Write {
        remote_addr: IOVA + 0x2_0000,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, qa, send(4, good, &a, 0, 3000));
    sim.run_idle(LIMIT);
    assert_eq!(read_mr(&b, 0x2_0000, 3000), data);

    // A SEND longer than its receive buffer is dropped, and the request serves the next SEND.
    // A WRITE to a QP that no longer grants REMOTE_WRITE is dropped (rxe_resp.c
    // check_op_valid).
    post_recv(&mut sim, 1, qb, None, recv(8, &b, 0x8_0000, 64));
    post_send(&mut sim, 0, qa, send(5, SendOp::Send, &a, 0, 3000));
    post_send(&mut sim, 0, qa, send(6, SendOp::Send, &a, 0, 64));
    let no_remote_write = QpAttr {
        state: Some(QpState::Rts),
        access: Some(Access::LOCAL_WRITE),
        ..Default::default()
    };
    sim.nodes[1]
        .modify_qp(sim.now, qb, &no_remote_write)
        .unwrap();
    let denied = SendOp::Write {
        remote_addr: IOVA + 0x3_0000,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, qa, send(7, denied, &a, 0, 100));
    sim.run_idle(LIMIT);
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(statuses(&got), [(8, WcStatus::Success)]);
    assert_eq!(got[0].byte_len, 64);
    assert_eq!(read_mr(&b, 0x8_0000, 64), data[..64]);
    assert_eq!(read_mr(&b, 0x3_0000, 100), [0; 100]);
    let c = sim.nodes[1].counters();
    assert_eq!((c.rkey_violations, c.dropped_messages), (2, 4), "{c}");
    assert!(sent_by(&wire, 1).is_empty(), "still no NAK");
}

/// A UC or UD send completes when its last packet is built, as rxe completes it once the
/// packet is sent (rxe_req.c: no ACK to wait for), and not before: the payload is read from the
/// application's buffer once, into the packet, so the buffer is not the application's again
/// until then. Written after the completion, it changes nothing on the wire; written before
/// any packet is built, the packet carries the new bytes.
#[test]
fn a_uc_or_ud_send_completes_once_its_last_packet_is_built() {
    for qp_type in [QpType::Uc, QpType::Ud] {
        let mut sim = Sim::new(2, seed(29), Faults::default());
        let ([a, b], [qa, qb], _) = pair(&mut sim, qp_type, false);
        post_recv(&mut sim, 1, qb, None, recv(1, &b, 0x1000, 0x1000));
        a.mr.write(0, &[0x11; 64]).unwrap();
        let mut wr = send(7, SendOp::Send, &a, 0, 64);
        if qp_type == QpType::Ud {
            wr.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY));
        }
        post_send(&mut sim, 0, qa, wr);
        assert!(
            drain(&mut sim, 0, a.cq).is_empty(),
            "{qp_type:?}: complete before its packet was built"
        );
        a.mr.write(0, &[0x22; 64]).unwrap();
        let packet = sim.nodes[0].poll_transmit().expect("the SEND");
        assert!(sim.nodes[0].poll_transmit().is_none(), "{qp_type:?}");
        assert_eq!(
            statuses(&drain(&mut sim, 0, a.cq)),
            [(7, WcStatus::Success)],
            "{qp_type:?}"
        );
        a.mr.write(0, &[0x33; 64]).unwrap();
        sim.deliver_now(0, 1, packet.packet);
        sim.run_idle(LIMIT);
        let got = drain(&mut sim, 1, b.cq);
        assert_eq!(statuses(&got), [(1, WcStatus::Success)], "{qp_type:?}");
        let at = if qp_type == QpType::Ud {
            0x1000 + GRH_LEN
        } else {
            0x1000
        };
        assert_eq!(read_mr(&b, at, 64), [0x22; 64], "{qp_type:?}");
    }
}

/// A UD request that fails before its packet is built (here over the port MTU: C10-93.1.1)
/// stops the send queue, and the requests ahead of it, whose packets wait to be built, still
/// complete successfully, in order, and go out carrying what their buffer held then: they are
/// read at the failure, not flushed (IBTA 10.3.1 flushes only what follows the failed request).
#[test]
fn the_requests_ahead_of_a_failing_ud_send_complete_and_go_out_as_posted() {
    let mut sim = Sim::new(2, seed(46), Faults::default());
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    let to_b = ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY);
    post_recv(&mut sim, 1, qb, None, recv(1, &b, 0x1000, 0x1000));
    a.mr.write(0, &[0x11; 64]).unwrap();
    let ud_send = |id: u64, len: usize| {
        let mut wr = send(id, SendOp::Send, &a, 0, len);
        wr.ud = Some(to_b);
        wr
    };
    let now = sim.now;
    let batch = [ud_send(1, 64), ud_send(2, 1025), ud_send(3, 64)];
    sim.nodes[0].post_send_batch(now, qa, batch.into_iter());
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocLenErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    a.mr.write(0, &[0x22; 64]).unwrap();
    sim.run_idle(LIMIT);
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(statuses(&got), [(1, WcStatus::Success)]);
    assert_eq!(read_mr(&b, 0x1000 + GRH_LEN, 64), [0x11; 64]);
}

/// A UC or UD request flushed before its packets are built (its QP moved to ERROR) puts
/// nothing on the wire: the packets leave the queue with it, so none can be sent after its
/// WR_FLUSH_ERR, and none completes a request posted after the QP is reset and connected again
/// from the same PSN.
#[test]
fn a_flushed_uc_or_ud_request_sends_nothing() {
    for qp_type in [QpType::Uc, QpType::Ud] {
        let mut sim = Sim::new(2, seed(47), Faults::default());
        let wire = tap(&mut sim, |_, _| false);
        let ([a, _b], [qa, qb], _) = pair(&mut sim, qp_type, false);
        let mut wr = send(1, SendOp::Send, &a, 0, 3000);
        if qp_type == QpType::Ud {
            wr = send(1, SendOp::Send, &a, 0, 64);
            wr.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY));
        }
        post_send(&mut sim, 0, qa, wr);
        let error = QpAttr {
            state: Some(QpState::Error),
            ..Default::default()
        };
        let now = sim.now;
        sim.nodes[0].modify_qp(now, qa, &error).unwrap();
        assert_eq!(
            statuses(&drain(&mut sim, 0, a.cq)),
            [(1, WcStatus::WrFlushErr)],
            "{qp_type:?}"
        );
        assert!(sim.nodes[0].poll_transmit().is_none(), "{qp_type:?}");
        sim.run_idle(LIMIT);
        assert!(
            wire.borrow().is_empty(),
            "{qp_type:?}: a flushed request was sent"
        );
    }
}

/// A UC message that DCQCN's pacer stopped part way is not wholly queued: when a later request
/// fails (its peer unreachable), that message is flushed, not reported sent, and what was queued
/// of it never goes out; a message sent whole before it still completes successfully.
#[test]
fn a_uc_message_the_pacer_cut_is_flushed_when_a_later_request_fails() {
    let mut sim = Sim::new(2, seed(48), Faults::default());
    let ([a, _b], [qa, _qb], _) = pair(&mut sim, QpType::Uc, false);
    // A CNP from the peer slows the QP (DCQCN's reaction point paces UC too).
    let mut cnp = BthRepr::new(Opcode::Cnp, qa, Psn::new(0));
    cnp.becn = true;
    sim.deliver_now(1, 0, forge(cnp, ExtHeaders::default(), &[]));
    post_send(&mut sim, 0, qa, send(1, SendOp::Send, &a, 0, 1000));
    post_send(&mut sim, 0, qa, send(2, SendOp::Send, &a, 0, 60_000));
    post_send(&mut sim, 0, qa, send(3, SendOp::Send, &a, 0, 1000));
    // The pacer releases packets at its deadlines: run them until message 2 has started.
    let mut now = sim.now;
    let mut sent = 0;
    while sent < 4 {
        sent += std::iter::from_fn(|| sim.nodes[0].poll_transmit()).count();
        now = sim.nodes[0]
            .next_deadline()
            .expect("the pacer's next release");
        sim.nodes[0].handle_timeout(now);
    }
    assert!(
        sent < 40,
        "the pacer let {sent} packets out: the test needs message 2 cut"
    );
    sim.nodes[0].handle_unreachable(now, addr(1));
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [
            (1, WcStatus::Success),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::LocQpOpErr)
        ]
    );
    assert!(
        sim.nodes[0].poll_transmit().is_none(),
        "nothing more of message 2"
    );
}

#[test]
fn ud_q_key_rules() {
    let mut sim = Sim::new(2, seed(23), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    for id in 0..3 {
        post_recv(
            &mut sim,
            1,
            qb,
            None,
            recv(id, &b, id as usize * 0x1000, 0x1000),
        );
    }
    // IBTA 10.2.4.1: a work request's Q_Key with the high bit set sends the QP's own Q_Key.
    // rxe sends the work request's unchanged; ConnectX substitutes, as softroce does.
    let qkeys = [QKey(0x8000_0000), QKEY, QKey(0x2222_2222)];
    for (id, qkey) in qkeys.into_iter().enumerate() {
        let mut wr = send(id as u64, SendOp::Send, &a, 0, 64);
        wr.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, qb, qkey));
        post_send(&mut sim, 0, qa, wr);
    }
    sim.run_idle(LIMIT);
    let on_wire: Vec<(QKey, Qpn, Qpn)> = sent_by(&wire, 0)
        .iter()
        .map(|p| {
            let deth = p.ext.deth.unwrap();
            (deth.qkey, deth.src_qp, p.bth.dest_qp)
        })
        .collect();
    assert_eq!(
        on_wire,
        [(QKEY, qa, qb), (QKEY, qa, qb), (QKey(0x2222_2222), qa, qb)]
    );
    assert_eq!(drain(&mut sim, 0, a.cq).len(), 3, "UD completes when sent");
    // rxe_recv.c check_keys: a DETH Q_Key other than the QP's is dropped and counted.
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(
        statuses(&got),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    for wc in &got {
        // UD is not connected: the sender is whoever the DETH and the IP header say.
        assert_eq!((wc.src_qp, wc.src_addr), (Some(qa), Some(addr(0))));
        assert_eq!(wc.byte_len, GRH_LEN as u32 + 64);
        // The flag verbs call IBV_WC_GRH: the buffer starts with the GRH.
        assert!(wc.grh);
    }
    assert_eq!(sim.nodes[1].counters().qkey_violations, 1);
    // The receive the dropped message did not take is flushed without a GRH, as rxe's
    // `flush_recv_wqe` leaves the flags empty.
    let error = QpAttr {
        state: Some(QpState::Error),
        ..Default::default()
    };
    let now = sim.now;
    sim.nodes[1].modify_qp(now, qb, &error).unwrap();
    let flushed = drain(&mut sim, 1, b.cq);
    assert_eq!(statuses(&flushed), [(2, WcStatus::WrFlushErr)]);
    assert!(!flushed[0].grh);
}

#[test]
fn the_gsi_qp_sends_and_requires_the_well_known_q_key() {
    let mut sim = Sim::new(2, seed(24), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let nodes = [node(&mut sim, 0), node(&mut sim, 1)];
    for (n, node) in nodes.iter().enumerate() {
        let gsi = sim.nodes[n].create_gsi_qp(init(node, QpType::Ud)).unwrap();
        assert_eq!(gsi, Qpn::GSI);
        bring_up(&mut sim, n, gsi, QpType::Ud, None);
    }
    let [a, b] = &nodes;
    let ud = sim.nodes[0].create_qp(init(a, QpType::Ud)).unwrap();
    assert!(ud.value() > 1, "regular QPs never get QPN 0 or 1");
    bring_up(&mut sim, 0, ud, QpType::Ud, None);
    for id in 0..2 {
        post_recv(
            &mut sim,
            1,
            Qpn::GSI,
            None,
            recv(id, b, id as usize * 0x1000, 0x1000),
        );
    }
    // From QP1 the Q_Key is 0x80010000 whatever the request says (rxe_req.c); from another
    // QP to QP1, a Q_Key other than that is dropped (rxe_recv.c check_keys).
    for (id, from) in [(0, Qpn::GSI), (1, ud)] {
        let mut wr = send(id, SendOp::Send, a, 0, 256);
        wr.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, Qpn::GSI, QKey(0x1234)));
        post_send(&mut sim, 0, from, wr);
    }
    sim.run_idle(LIMIT);
    let deths: Vec<_> = sent_by(&wire, 0)
        .iter()
        .map(|p| p.ext.deth.unwrap())
        .collect();
    assert_eq!(
        deths.iter().map(|d| (d.qkey, d.src_qp)).collect::<Vec<_>>(),
        [(QKey::GSI, Qpn::GSI), (QKey(0x1234), ud)]
    );
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(statuses(&got), [(0, WcStatus::Success)]);
    assert_eq!(got[0].src_qp, Some(Qpn::GSI));
    assert_eq!(sim.nodes[1].counters().qkey_violations, 1);
    // QP0 does not exist on RoCE.
    assert_eq!(sim.nodes[1].qp_state(Qpn::new(0)), None);
}

#[test]
fn a_ud_message_over_the_port_mtu_fails_locally() {
    let mut sim = Sim::new(2, seed(25), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    let to_b = ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY);
    let ud_send = |id: u64, len: usize| {
        let mut wr = send(id, SendOp::Send, &a, 0, len);
        wr.ud = Some(to_b);
        wr
    };
    // C10-93.1.1: no packet for a UD message over the port MTU. rxe then reports success;
    // softroce completes the request with LOC_LEN_ERR, and, as IBTA 10.3.1 has a UD send error
    // do, stops the send queue (SQE) and flushes the rest.
    post_send(&mut sim, 0, qa, ud_send(1, 1025));
    post_send(&mut sim, 0, qa, ud_send(2, 100));
    assert_eq!(sim.nodes[0].qp_state(qa), Some(QpState::Sqe));
    post_send(&mut sim, 0, qa, ud_send(3, 100));
    sim.run_idle(LIMIT);
    assert!(wire.borrow().is_empty(), "nothing was sent");
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [
            (1, WcStatus::LocLenErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );

    // In SQE the receive side still works.
    post_recv(&mut sim, 0, qa, None, recv(10, &a, 0x1_0000, 0x2000));
    let mut back = send(20, SendOp::Send, &b, 0, 1024);
    back.ud = Some(ud_dest(&mut sim, 1, b.pd, 0, qa, QKEY));
    post_send(&mut sim, 1, qb, back);
    sim.run_idle(LIMIT);
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [(10, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&drain(&mut sim, 1, b.cq)),
        [(20, WcStatus::Success)]
    );

    // SQE -> RTS restarts the send queue; a message of exactly the MTU goes.
    let rts = QpAttr {
        state: Some(QpState::Rts),
        ..Default::default()
    };
    sim.nodes[0].modify_qp(sim.now, qa, &rts).unwrap();
    post_recv(&mut sim, 1, qb, None, recv(30, &b, 0x1_0000, 0x2000));
    post_send(&mut sim, 0, qa, ud_send(4, 1024));
    sim.run_idle(LIMIT);
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [(4, WcStatus::Success)]
    );
    assert_eq!(drain(&mut sim, 1, b.cq)[0].byte_len, GRH_LEN as u32 + 1024);

    // The port MTU follows the link: at 4096 on both ends, 4096 bytes go in one packet.
    for n in 0..2 {
        sim.nodes[n].set_port_mtu(PathMtu::Mtu4096);
    }
    post_recv(&mut sim, 1, qb, None, recv(31, &b, 0x1_0000, 0x2000));
    post_send(&mut sim, 0, qa, ud_send(5, 4096));
    sim.run_idle(LIMIT);
    assert_eq!(
        statuses(&drain(&mut sim, 0, a.cq)),
        [(5, WcStatus::Success)]
    );
    assert_eq!(drain(&mut sim, 1, b.cq)[0].byte_len, GRH_LEN as u32 + 4096);
}

#[test]
fn a_ud_receive_buffer_starts_with_the_grh() {
    let mut sim = Sim::new(2, seed(26), Faults::default());
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    let data = pattern(6, 100);
    a.mr.write(0, &data).unwrap();
    for id in 0..2 {
        post_recv(
            &mut sim,
            1,
            qb,
            None,
            recv(id, &b, id as usize * 0x1000, 256),
        );
    }
    let to_b = ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY);
    let mut wr = send(1, SendOp::SendWithImm { imm: 0x0102_0304 }, &a, 0, 100);
    wr.ud = Some(to_b);
    post_send(&mut sim, 0, qa, wr.clone());
    sim.run_idle(LIMIT);
    let wc = &drain(&mut sim, 1, b.cq)[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (WcStatus::Success, WcOpcode::Recv, 140, Some(0x0102_0304))
    );
    assert_eq!((wc.src_qp, wc.src_addr), (Some(qa), Some(addr(0))));
    // Over IPv4, 20 zero bytes, then the IPv4 header (rxe_resp.c execute). The sim's UDP
    // socket gives no header, so the core synthesised it from the addresses and the length:
    // BTH 12 + DETH 8 + ImmDt 4 + 100 bytes + ICRC 4 behind 20 of IPv4 and 8 of UDP.
    let grh = read_mr(&b, 0, GRH_LEN);
    assert_eq!(grh[..20], [0; 20]);
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45);
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 128);
    assert_eq!(ip[9], 17, "UDP");
    let octets = |n| match addr(n) {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    assert_eq!(ip[12..16], octets(0), "source address");
    assert_eq!(ip[16..20], octets(1), "destination address");
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    assert_eq!(
        (sum & 0xffff) + (sum >> 16),
        0xffff,
        "a valid header checksum"
    );
    assert_eq!(read_mr(&b, GRH_LEN, 100), data);

    // An io layer that sees the IP header (a raw socket) passes it in, and it is copied as is.
    post_send(&mut sim, 0, qa, wr);
    let (_, packet) = sim.take(0).unwrap();
    let mut header = [0u8; 20];
    header[..10].copy_from_slice(&[0x45, 0x02, 0, 156, 0x12, 0x34, 0x40, 0, 3, 17]);
    header[12..16].copy_from_slice(&octets(0));
    header[16..20].copy_from_slice(&octets(1));
    let datagram = Datagram {
        src: addr(0),
        src_port: 4791,
        dst: addr(1),
        ip_header: Some(&header),
        traffic_class: 0,
        icrc: IcrcStatus::Ok,
        packet: &packet,
    };
    sim.nodes[1].handle_received(sim.now, datagram);
    assert_eq!(drain(&mut sim, 1, b.cq)[0].wr_id, 1);
    assert_eq!(read_mr(&b, 0x1000 + 20, 20), header);
    // A header the io layer got wrong is refused, not half used.
    let bad = Datagram {
        ip_header: Some(&header[..19]),
        ..datagram
    };
    sim.nodes[1].handle_received(sim.now, bad);
    assert_eq!(sim.nodes[1].counters().dropped_malformed, 1);
}

#[test]
fn an_srq_feeds_rc_and_ud_qps() {
    let mut sim = Sim::new(2, seed(27), Faults::default());
    let [a, b] = [node(&mut sim, 0), node(&mut sim, 1)];
    let srq = sim.nodes[1]
        .create_srq(
            b.pd,
            SrqAttr {
                max_wr: 16,
                srq_limit: 0,
            },
        )
        .unwrap();
    let rc = [
        create(&mut sim, 0, &a, QpType::Rc, None),
        create(&mut sim, 1, &b, QpType::Rc, Some(srq)),
    ];
    let ud = [
        create(&mut sim, 0, &a, QpType::Ud, None),
        create(&mut sim, 1, &b, QpType::Ud, Some(srq)),
    ];
    for n in 0..2 {
        bring_up(&mut sim, n, rc[n], QpType::Rc, Some((1 - n, rc[1 - n])));
        bring_up(&mut sim, n, ud[n], QpType::Ud, None);
    }
    // A QP with an SRQ has no receive queue of its own.
    assert!(matches!(
        sim.nodes[1].post_recv(rc[1], recv(0, &b, 0, 64)),
        Err(VerbsError::InvalidRequest(_))
    ));
    for id in 0..6 {
        sim.nodes[1]
            .post_srq_recv(srq, recv(100 + id, &b, 0x1_0000 * id as usize, 0x1_0000))
            .unwrap();
    }
    let to_b = ud_dest(&mut sim, 0, a.pd, 1, ud[1], QKEY);
    for i in 0..6u64 {
        let len = 500 + i as usize;
        a.mr.write(0x1000 * i as usize, &pattern(i, len)).unwrap();
        let mut wr = send(i, SendOp::Send, &a, 0x1000 * i as usize, len);
        let qp = if i % 2 == 0 {
            rc[0]
        } else {
            wr.ud = Some(to_b);
            ud[0]
        };
        post_send(&mut sim, 0, qp, wr);
        sim.run_idle(LIMIT);
    }
    // Each message took the SRQ's next request, whichever QP it came to.
    let got = drain(&mut sim, 1, b.cq);
    for (i, wc) in got.iter().enumerate() {
        let ud_msg = i % 2 == 1;
        let at = if ud_msg { GRH_LEN } else { 0 };
        assert_eq!(wc.wr_id, 100 + i as u64);
        assert_eq!(wc.qp_num, if ud_msg { ud[1] } else { rc[1] });
        assert_eq!(wc.byte_len as usize, at + 500 + i);
        assert_eq!(
            read_mr(&b, 0x1_0000 * i + at, 500 + i),
            pattern(i as u64, 500 + i)
        );
    }
    assert_eq!(got.len(), 6);

    // With the SRQ empty, the RC QP answers RNR NAK until a request is posted to the SRQ.
    post_send(&mut sim, 0, rc[0], send(9, SendOp::Send, &a, 0, 64));
    sim.run_until(LIMIT, |s| s.nodes[0].counters().rnr_waits >= 2);
    sim.nodes[1]
        .post_srq_recv(srq, recv(109, &b, 0, 64))
        .unwrap();
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 1, b.cq)[0].wr_id, 109);

    // An SRQ serves QPs of its own protection domain; unknown SRQs are refused.
    let other_pd = QpInit {
        pd: sim.nodes[1].alloc_pd(),
        ..init(&b, QpType::Rc)
    };
    assert!(matches!(
        sim.nodes[1].create_qp_with_srq(other_pd, srq),
        Err(VerbsError::InvalidRequest(_))
    ));
    assert_eq!(
        sim.nodes[1].create_qp_with_srq(init(&b, QpType::Rc), SrqId(9)),
        Err(VerbsError::UnknownSrq(SrqId(9)))
    );
}

#[test]
fn the_srq_limit_event_fires_once_then_disarms() {
    // IBTA 11.5.2.4, rxe_resp.c get_srq_wqe: armed by a non-zero srq_limit, fired when taking a
    // request leaves fewer than the limit posted, then disarmed (the limit reads 0).
    let mut sim = Sim::new(2, seed(28), Faults::default());
    let ([a, b], [qa, qb], srq) = pair(&mut sim, QpType::Ud, true);
    let srq = srq.unwrap();
    for id in 0..6 {
        post_recv(
            &mut sim,
            1,
            qb,
            Some(srq),
            recv(id, &b, id as usize * 0x1000, 0x1000),
        );
    }
    let arm = |limit| SrqModify {
        srq_limit: Some(limit),
        ..Default::default()
    };
    sim.nodes[1].modify_srq(srq, &arm(3)).unwrap();
    assert_eq!(
        sim.nodes[1].query_srq(srq),
        Ok(SrqAttr {
            max_wr: 64,
            srq_limit: 3
        })
    );
    let to_b = ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY);
    let reached = AsyncEvent::SrqLimitReached { srq };
    let mut events_after = Vec::new();
    for id in 0..6 {
        if id == 5 {
            sim.nodes[1].modify_srq(srq, &arm(1)).unwrap();
        }
        let mut wr = send(id, SendOp::Send, &a, 0, 32);
        wr.ud = Some(to_b);
        post_send(&mut sim, 0, qa, wr);
        sim.run_idle(LIMIT);
        let events: Vec<_> = std::iter::from_fn(|| sim.nodes[1].poll_event()).collect();
        assert!(events.iter().all(|e| *e == reached), "{events:?}");
        let limit = sim.nodes[1].query_srq(srq).unwrap().srq_limit;
        events_after.push((6 - id - 1, events.len(), limit));
    }
    assert_eq!(
        events_after,
        [
            // (requests left, events, limit)
            (5, 0, 3),
            (4, 0, 3),
            (3, 0, 3),
            (2, 1, 0), // fewer than 3 left: fired and disarmed
            (1, 0, 0),
            (0, 1, 0), // re-armed at 1 before the last one
        ]
    );
    assert_eq!(drain(&mut sim, 1, b.cq).len(), 6);

    // rxe_srq.c rxe_srq_chk_attr: the limit fits in the queue, the queue holds what is posted.
    let too_high = sim.nodes[1].modify_srq(srq, &arm(65));
    assert!(matches!(too_high, Err(VerbsError::InvalidRequest(_))));
    for id in 0..4 {
        post_recv(&mut sim, 1, qb, Some(srq), recv(id, &b, 0, 64));
    }
    let shrink = |max_wr| SrqModify {
        max_wr: Some(max_wr),
        ..Default::default()
    };
    assert!(sim.nodes[1].modify_srq(srq, &shrink(3)).is_err());
    sim.nodes[1].modify_srq(srq, &shrink(4)).unwrap();
    assert_eq!(
        sim.nodes[1].post_srq_recv(srq, recv(9, &b, 0, 64)),
        Err(VerbsError::QueueFull)
    );
    // As in rxe, a limit given at creation arms the event at once.
    let armed = SrqAttr {
        max_wr: 8,
        srq_limit: 2,
    };
    let srq2 = sim.nodes[1].create_srq(b.pd, armed).unwrap();
    assert_eq!(sim.nodes[1].query_srq(srq2), Ok(armed));
    let empty = SrqAttr {
        max_wr: 0,
        srq_limit: 0,
    };
    assert!(sim.nodes[1].create_srq(b.pd, empty).is_err());
}

#[test]
fn verbs_refuse_what_uc_and_ud_do_not_carry() {
    let mut sim = Sim::new(2, seed(29), Faults::default());
    let ([a, _], [uc, _], _) = pair(&mut sim, QpType::Uc, false);
    let ud = sim.nodes[0].create_qp(init(&a, QpType::Ud)).unwrap();
    bring_up(&mut sim, 0, ud, QpType::Ud, None);
    let now = sim.now;
    let read = SendOp::Read {
        remote_addr: IOVA,
        rkey: a.mr.rkey(),
    };
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: a.mr.rkey(),
    };
    let refused = |e: Result<(), VerbsError>| matches!(e, Err(VerbsError::InvalidRequest(_)));
    // IBTA 9.2, table 38: no READ (nor atomics) on UC, no WRITE on UD.
    assert!(refused(sim.nodes[0].post_send(
        now,
        uc,
        send(1, read, &a, 0, 8)
    )));
    let mut to_self = send(2, write, &a, 0, 8);
    to_self.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, Qpn::new(0x99), QKEY));
    assert!(refused(sim.nodes[0].post_send(now, ud, to_self)));
    // A UD send names its destination; a connected QP's does not.
    assert!(refused(sim.nodes[0].post_send(
        now,
        ud,
        send(3, SendOp::Send, &a, 0, 8)
    )));
    let mut connected = send(4, SendOp::Send, &a, 0, 8);
    connected.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, Qpn::new(0x99), QKEY));
    assert!(refused(sim.nodes[0].post_send(now, uc, connected)));
    // An address handle serves QPs of its own protection domain.
    let other_pd = sim.nodes[0].alloc_pd();
    let mut foreign = send(5, SendOp::Send, &a, 0, 8);
    foreign.ud = Some(ud_dest(&mut sim, 0, other_pd, 1, Qpn::new(0x99), QKEY));
    assert!(refused(sim.nodes[0].post_send(now, ud, foreign)));
}

/// What the fixture comparison looks at in one packet: everything but QPNs, PSNs and keys.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    opcode: &'static str,
    solicited: bool,
    mig_req: bool,
    pad_count: u8,
    pkey: PKey,
    fecn: bool,
    becn: bool,
    ack_req: bool,
    headers: &'static [ExtHeader],
    header_len: usize,
    payload_len: usize,
    packet_len: usize,
    /// The UD Q_Key: the fixture's is the one both sides here use.
    qkey: Option<QKey>,
}

fn shape(packet: &RocePacket<&[u8]>) -> Shape {
    let repr = PacketRepr::parse(packet).unwrap();
    let info = packet.info();
    Shape {
        opcode: info.name,
        solicited: repr.bth.solicited,
        mig_req: repr.bth.mig_req,
        pad_count: repr.bth.pad_count,
        pkey: repr.bth.pkey,
        fecn: repr.bth.fecn,
        becn: repr.bth.becn,
        ack_req: repr.bth.ack_req,
        headers: info.headers,
        header_len: info.ext_len(),
        payload_len: repr.payload_len,
        packet_len: packet.as_bytes().len(),
        qkey: repr.ext.deth.map(|d| d.qkey),
    }
}

/// The packets of the first message in an rxe capture, and the capture's path MTU.
fn rxe_first_message(file: &str) -> (PathMtu, Vec<Shape>) {
    let dir = fixture_dir("rxe");
    let entry = manifest(&dir).into_iter().find(|e| e.file == file).unwrap();
    let mtu = match entry.mtu {
        1024 => PathMtu::Mtu1024,
        4096 => PathMtu::Mtu4096,
        other => panic!("{file}: MTU {other}"),
    };
    let bytes = std::fs::read(dir.join(file)).unwrap();
    let mut shapes = Vec::new();
    for record in Capture::new(&bytes).unwrap() {
        let record = record.unwrap();
        let frame = record.frame().unwrap();
        assert!(
            matches!(frame.repr.ip, IpRepr::V4 { .. }),
            "{file} is over IPv4"
        );
        shapes.push(shape(&frame.packet));
        if matches!(
            frame.packet.info().position,
            Position::Last | Position::Only
        ) {
            break;
        }
    }
    (mtu, shapes)
}

fn our_packets(wire: &Wire) -> Vec<Shape> {
    wire.borrow()
        .iter()
        .map(|(_, bytes)| shape(&RocePacket::new_checked(&bytes[..]).unwrap()))
        .collect()
}

#[test]
fn uc_send_packets_match_rxe() {
    // uc_send.pcap: ibv_uc_pingpong, 4096 bytes at MTU 1024: UC SEND_FIRST, MIDDLE, MIDDLE,
    // LAST, none asking for an ACK.
    let (mtu, rxe) = rxe_first_message("uc_send.pcap");
    assert_eq!(mtu, PathMtu::Mtu1024, "the MTU bring_up sets");
    let mut sim = Sim::new(2, seed(30), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Uc, false);
    post_recv(&mut sim, 1, qb, None, recv(1, &b, 0, 4096));
    post_send(&mut sim, 0, qa, send(1, SendOp::Send, &a, 0, 4096));
    sim.run_idle(LIMIT);
    assert_eq!(our_packets(&wire), rxe);
    assert_eq!(rxe.len(), 4);
}

#[test]
fn ud_send_packets_match_rxe() {
    // ud_send.pcap: ibv_ud_pingpong, 512 bytes: UD SEND_ONLY with a DETH, Q_Key 0x11111111.
    let (_, rxe) = rxe_first_message("ud_send.pcap");
    let mut sim = Sim::new(2, seed(31), Faults::default());
    let wire = tap(&mut sim, |_, _| false);
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    post_recv(&mut sim, 1, qb, None, recv(1, &b, 0, 4096));
    let mut wr = send(1, SendOp::Send, &a, 0, 512);
    wr.ud = Some(ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY));
    post_send(&mut sim, 0, qa, wr);
    sim.run_idle(LIMIT);
    assert_eq!(our_packets(&wire), rxe);
    assert_eq!(rxe[0].qkey, Some(QKEY));
}

/// A batch posted at once (what the engine takes in one turn, `Endpoint::post_send_batch`)
/// completes in posting order, a request the QP refuses included: a WRITE on UD (IBTA 9.2,
/// UD carries SEND only) completes with LOC_QP_OP_ERR between the two SENDs around it, which
/// complete as their packets go out.
#[test]
fn a_batch_with_a_refused_request_completes_in_posting_order() {
    let mut sim = Sim::new(2, seed(44), Faults::default());
    let ([a, b], [qa, qb], _) = pair(&mut sim, QpType::Ud, false);
    let dest = ud_dest(&mut sim, 0, a.pd, 1, qb, QKEY);
    for i in 0..2 {
        post_recv(
            &mut sim,
            1,
            qb,
            None,
            recv(i, &b, 0x1000 * i as usize, 64 + GRH_LEN),
        );
    }
    let datagram = |wr_id, op| {
        let mut wr = send(wr_id, op, &a, 0, 64);
        wr.ud = Some(dest);
        wr
    };
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    let batch = [
        datagram(1, SendOp::Send),
        datagram(2, write),
        datagram(3, SendOp::Send),
    ];
    let now = sim.now;
    sim.nodes[0].post_send_batch(now, qa, batch.into_iter());
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    assert_eq!(
        statuses(&sent),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocQpOpErr),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(drain(&mut sim, 1, b.cq).len(), 2);
}

/// IBTA 11.6.3.1 (Last WQE Reached), rxe_resp.c `flush_recv_queue`: a QP that takes its
/// receive requests from an SRQ and goes to ERROR says so once, after the completions of what
/// it held, whether a modify took it there or an error did. A QP with a receive queue of its own says nothing, and a modify is no error: it
/// raises no QP fatal event.
#[test]
fn a_qp_on_an_srq_in_error_says_it_takes_no_more_of_its_requests() {
    let to_error = QpAttr {
        state: Some(QpState::Error),
        ..Default::default()
    };
    let events = |sim: &mut Sim, n: usize| -> Vec<AsyncEvent> {
        std::iter::from_fn(|| sim.nodes[n].poll_event()).collect()
    };

    // By a modify, twice: one event.
    let mut sim = Sim::new(2, seed(29), Faults::default());
    let ([_, b], [qa, qb], srq) = pair(&mut sim, QpType::Rc, true);
    let srq = srq.unwrap();
    for id in 0..2 {
        post_recv(&mut sim, 1, qb, Some(srq), recv(id, &b, 0, 64));
    }
    let now = sim.now;
    sim.nodes[1].modify_qp(now, qb, &to_error).unwrap();
    sim.nodes[1].modify_qp(now, qb, &to_error).unwrap();
    assert_eq!(
        events(&mut sim, 1),
        [AsyncEvent::QpLastWqeReached { qpn: qb }]
    );
    sim.nodes[0].modify_qp(now, qa, &to_error).unwrap();
    assert_eq!(
        events(&mut sim, 0),
        [],
        "no SRQ, no event; a modify, no fatal"
    );

    // By an error: a WRITE whose rkey node 1 does not know breaks the QP.
    let mut sim = Sim::new(2, seed(30), Faults::default());
    let ([a, b], [qa, qb], srq) = pair(&mut sim, QpType::Rc, true);
    post_recv(&mut sim, 1, qb, srq, recv(0, &b, 0, 64));
    let bad_rkey = SendOp::Write {
        remote_addr: IOVA,
        rkey: RKey(b.mr.rkey().0 ^ 0x100),
    };
    post_send(&mut sim, 0, qa, send(1, bad_rkey, &a, 0, 8));
    sim.run_idle(LIMIT);
    assert_eq!(sim.nodes[1].qp_state(qb), Some(QpState::Error));
    let said = events(&mut sim, 1);
    assert_eq!(
        said[said.len() - 2..],
        [
            AsyncEvent::QpFatal { qpn: qb },
            AsyncEvent::QpLastWqeReached { qpn: qb }
        ],
        "{said:?}"
    );
}
