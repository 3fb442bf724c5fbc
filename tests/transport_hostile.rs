//! A peer that breaks the rules, in the simulator (`tests/sim`). Each test is one way a hostile
//! or broken peer could reach memory its rights do not grant, kill a QP that should live, or
//! make the responder answer what it must not; each names the IBTA rule or rxe behaviour that
//! decides it. Packets are forged with [`sim::forge`] and put on the wire with `Sim::inject`,
//! or a node's own packets are rewritten on their way out (`Sim::rewrite`).

mod sim;

use std::time::Duration;

use sim::rc::{
    bind_type2_window, connect, connect_qps, post_recv, post_send, qp_on, read_mr, read_request,
    sge, Options, Side, ALL, IOVA, LIMIT, MR_LEN,
};
use sim::{drain, forge, is_read_response, pattern, record, seed, Faults, Sim};
use softroce::memory::Access;
use softroce::transport::{
    AsyncEvent, PathMtu, Payload, QpAttr, QpState, RecvWr, SendOp, SendWr, Sge, SgeList, WcOpcode,
    WcStatus,
};
use softroce::wire::{
    AckSyndrome, AethRepr, BthRepr, ExtHeaders, Msn, NakCode, Opcode, PKey, Psn, RKey, RethRepr,
};

/// The first PSN node 0 sends (`Options::default().psn[0]`).
const A_PSN: u32 = 100;

fn rdma(op: SendOp, payload: Payload) -> SendWr {
    SendWr::new(1, op, payload)
}

/// READ responses node 1 put on the wire.
fn read_responses(seen: &[sim::Seen]) -> Vec<sim::Seen> {
    seen.iter()
        .filter(|s| s.from == 1 && is_read_response(s.opcode))
        .copied()
        .collect()
}

/// rxe answers a duplicate READ only from its responder resources, and a duplicate is not
/// checked against the QP's access flags again. softroce's responder answered any READ whose
/// PSN was in the past, from its own RETH, without asking whether the QP grants remote read:
/// a peer whose QP has no remote read could read any region that grants it.
#[test]
fn a_duplicate_read_on_a_qp_without_remote_read_reads_nothing() {
    let mut sim = Sim::new(2, seed(11), Faults::default());
    let [a, b] = connect(
        &mut sim,
        Options {
            qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..Default::default()
        },
    );
    b.mr.write(0, b"secret").unwrap();
    // One WRITE moves the responder past PSN 100, which a READ then claims as a duplicate.
    let write = SendOp::Write {
        remote_addr: IOVA + 0x1000,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, rdma(write, sge(&a, 0, 8)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);

    let seen = record(&mut sim);
    let reth = RethRepr {
        virtual_address: IOVA,
        rkey: b.mr.rkey(),
        dma_len: 4096,
    };
    sim.inject(0, 1, read_request(&b, A_PSN, reth));
    sim.run_idle(LIMIT);
    assert_eq!(read_responses(&seen.borrow()), vec![], "nothing was read");
    assert_eq!(sim.nodes[1].counters().unmatched_duplicates, 1);
    assert_eq!(sim.nodes[1].qp_state(b.qpn), Some(QpState::Rts));
}

/// A duplicate READ may only repeat what its original was granted (rxe_resp.c
/// `duplicate_request`: the same rkey, a range within the original's). softroce re-executed a
/// duplicate from its own RETH, so a peer could replay an old PSN with a RETH for any other
/// region of the PD, or a larger range.
#[test]
fn a_duplicate_read_reaches_only_what_its_original_was_granted() {
    let mut sim = Sim::new(2, seed(12), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let secret = sim.nodes[1]
        .reg_mr(b.mr.pd(), 0x4000_0000, 4096, Access::REMOTE_READ)
        .unwrap();
    secret.write(0, b"the other region").unwrap();
    b.mr.write(0x100, &pattern(3, 64)).unwrap();
    let read = SendOp::Read {
        remote_addr: IOVA + 0x100,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, rdma(read, sge(&a, 0x2000, 64)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);

    let seen = record(&mut sim);
    let outside = [
        // Another region of the same PD.
        (0x4000_0000, secret.rkey(), 16),
        // The same region, more than was granted.
        (IOVA + 0x100, b.mr.rkey(), 4096),
        // The same region, a range that starts before the original's.
        (IOVA, b.mr.rkey(), 64),
    ];
    for (virtual_address, rkey, dma_len) in outside {
        let reth = RethRepr {
            virtual_address,
            rkey,
            dma_len,
        };
        sim.inject(0, 1, read_request(&b, A_PSN, reth));
        sim.run_idle(LIMIT);
    }
    assert_eq!(read_responses(&seen.borrow()), vec![]);
    assert_eq!(sim.nodes[1].counters().unmatched_duplicates, 3);

    // Part of the original is answered again, from the memory the original was granted.
    let within = RethRepr {
        virtual_address: IOVA + 0x110,
        rkey: b.mr.rkey(),
        dma_len: 32,
    };
    sim.inject(0, 1, read_request(&b, A_PSN, within));
    sim.run_idle(LIMIT);
    let answered = read_responses(&seen.borrow());
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(
        (answered[0].opcode, answered[0].psn, answered[0].payload_len),
        (Opcode::RcReadResponseOnly, Psn::new(A_PSN), 32)
    );
}

/// Two QPs of node 1 share a region; node 0 is connected to the first, node 2 to the second.
fn two_peers_of_one_pd(sim: &mut Sim) -> (Side, Side, Side, Side) {
    let [a, b] = connect(sim, Options::default());
    let c_pd = sim.nodes[2].alloc_pd();
    let c_cq = sim.nodes[2].create_cq(1 << 10);
    let c_mr = sim.nodes[2].reg_mr(c_pd, IOVA, MR_LEN, ALL).unwrap();
    let c = Side {
        qpn: qp_on(sim, 2, c_pd, c_cq),
        cq: c_cq,
        mr: c_mr,
    };
    let b2 = Side {
        qpn: qp_on(sim, 1, b.mr.pd(), b.cq),
        ..b.clone()
    };
    connect_qps(sim, [(2, c.qpn), (1, b2.qpn)], &Options::default());
    (a, b, c, b2)
}

/// rxe refuses to invalidate anything but a memory window or a fast-register region
/// (rxe_mr.c `rxe_invalidate_mr`): SEND with Invalidate naming an ordinary region gets NAK
/// invalid request. softroce revoked the region's rkey for good, so one connected peer could
/// cut every other QP off a shared buffer.
#[test]
fn send_with_invalidate_cannot_revoke_a_region_another_qp_uses() {
    let mut sim = Sim::new(3, seed(13), Faults::default());
    let (a, b, c, b2) = two_peers_of_one_pd(&mut sim);
    post_recv(&mut sim, 1, &b, 7, 0x1000, 64);
    let inv = SendOp::SendWithInv { rkey: b.mr.rkey() };
    post_send(&mut sim, 0, &a, rdma(inv, sge(&a, 0, 8)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::RemInvReqErr);

    // Node 2 still writes through the region's rkey.
    let write = SendOp::Write {
        remote_addr: IOVA + 0x3000,
        rkey: b.mr.rkey(),
    };
    c.mr.write(0, b"still mine").unwrap();
    post_send(&mut sim, 2, &c, rdma(write, sge(&c, 0, 10)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 2, c.cq)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&b2, 0x3000, 10), b"still mine");
}

/// A type 2 window belongs to the QP it was bound through (IBTA 10.6.7.2.2): another QP's peer
/// can neither use it nor invalidate it; its own peer can.
#[test]
fn send_with_invalidate_reaches_only_a_window_of_the_receiving_qp() {
    let mut sim = Sim::new(3, seed(14), Faults::default());
    let (a, b, c, b2) = two_peers_of_one_pd(&mut sim);
    let window = bind_type2_window(&mut sim, 1, &b2, 0x8000, 256);
    post_recv(&mut sim, 1, &b, 7, 0x1000, 64);
    let inv = SendOp::SendWithInv { rkey: window };
    post_send(&mut sim, 0, &a, rdma(inv, sge(&a, 0, 8)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::RemInvReqErr);
    let write_through = |sim: &mut Sim, side: &Side, node: usize| {
        let op = SendOp::Write {
            remote_addr: IOVA + 0x8000,
            rkey: window,
        };
        post_send(sim, node, side, rdma(op, sge(side, 0, 16)));
        sim.run_idle(LIMIT);
        drain(sim, node, side.cq)[0].status
    };
    assert_eq!(write_through(&mut sim, &c, 2), WcStatus::Success);
    // Its own peer invalidates it; from then on it reaches nothing.
    post_recv(&mut sim, 1, &b2, 8, 0x1000, 64);
    post_send(&mut sim, 2, &c, rdma(inv, sge(&c, 0, 8)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 2, c.cq)[0].status, WcStatus::Success);
    let received = drain(&mut sim, 1, b.cq);
    assert_eq!(received.last().unwrap().invalidated_rkey, Some(window));
    assert_eq!(write_through(&mut sim, &c, 2), WcStatus::RemAccessErr);
}

/// IBTA C9-88 and rxe_resp.c `check_rkey`: a zero-length RDMA WRITE or READ need not carry a
/// valid address or rkey, and is executed without looking at them. softroce answered NAK 0x62
/// and the QP died, so a zero-byte WRITE with immediate, a common notification, never arrived.
#[test]
fn zero_length_write_and_read_with_rkey_0_are_executed() {
    let mut sim = Sim::new(2, seed(15), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    post_recv(&mut sim, 1, &b, 9, 0x1000, 64);
    let none = || Payload::Sges(Default::default());
    let notify = SendOp::WriteWithImm {
        remote_addr: 0,
        rkey: RKey(0),
        imm: 0xfeed,
    };
    let read = SendOp::Read {
        remote_addr: 0,
        rkey: RKey(0),
    };
    let write = SendOp::Write {
        remote_addr: 0xdead_0000,
        rkey: RKey(0x1234_5678),
    };
    for (id, op) in [(1, notify), (2, read), (3, write)] {
        post_send(&mut sim, 0, &a, SendWr::new(id, op, none()));
    }
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    let statuses: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(
        statuses,
        [1, 2, 3].map(|id| (id, WcStatus::Success)),
        "{sent:?}"
    );
    let got = drain(&mut sim, 1, b.cq);
    assert_eq!(
        (got[0].opcode, got[0].imm_data, got[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(0xfeed), 0)
    );
    assert_eq!(sim.nodes[1].counters().rkey_violations, 0);
}

/// RESET and ERROR clear the whole responder (IBTA 10.3.1): softroce's kept its queued READ
/// responses, atomic results, MSN and expected PSN. READ responses went on streaming from a QP
/// in ERROR; after a reset and reconnect the old peer's READ data went to the new peer, and a
/// larger new MTU tripped an assertion in `Span::read` on the engine thread.
#[test]
fn a_qp_in_error_or_reset_sends_no_more_read_responses() {
    let mut sim = Sim::new(3, seed(16), Faults::default());
    sim.nodes[1].set_port_mtu(PathMtu::Mtu4096);
    sim.nodes[2].set_port_mtu(PathMtu::Mtu4096);
    let [a, b] = connect(&mut sim, Options::default());
    b.mr.write(0, &pattern(4, 256 * 1024)).unwrap();
    let read = SendOp::Read {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, rdma(read, sge(&a, 0, 256 * 1024)));
    // The request reaches node 1, which answers 20 of its 256 responses, and no more yet.
    assert_eq!(sim.hand_over(0, 1, 1), 1);
    assert_eq!(sim.hand_over(1, 0, 20), 20);
    let now = sim.now;
    let to = |state| QpAttr {
        state: Some(state),
        ..Default::default()
    };
    sim.nodes[1]
        .modify_qp(now, b.qpn, &to(QpState::Error))
        .unwrap();
    // Responses are built a batch of 64 at a time; what was built before the error is on its
    // way, like packets on a NIC's ring. Nothing more is built.
    let after = sim.hand_over(1, 0, 1000);
    assert!(
        20 + after <= 64,
        "{after} more: a QP in ERROR answers nothing"
    );
    assert_eq!(sim.hand_over(1, 0, 1000), 0);

    // RESET, then connected to node 2 with a larger MTU: node 2 gets only its own answers.
    sim.nodes[1]
        .modify_qp(now, b.qpn, &to(QpState::Reset))
        .unwrap();
    assert_eq!(
        sim.hand_over(1, 2, 1000),
        0,
        "a QP in RESET answers nothing"
    );
    let c_pd = sim.nodes[2].alloc_pd();
    let c_cq = sim.nodes[2].create_cq(64);
    let c_mr = sim.nodes[2].reg_mr(c_pd, IOVA, MR_LEN, ALL).unwrap();
    let c = Side {
        qpn: qp_on(&mut sim, 2, c_pd, c_cq),
        cq: c_cq,
        mr: c_mr,
    };
    let big = Options {
        mtu: PathMtu::Mtu4096,
        ..Default::default()
    };
    connect_qps(&mut sim, [(2, c.qpn), (1, b.qpn)], &big);
    assert_eq!(
        sim.hand_over(1, 2, 1000),
        0,
        "none of node 0's READ reaches node 2"
    );
    let read = SendOp::Read {
        remote_addr: IOVA + 0x100,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 2, &c, rdma(read, sge(&c, 0, 10_000)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 2, c.cq)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&c, 0, 10_000), read_mr(&b, 0x100, 10_000));
}

/// RESET straight from RTS, READ responses still unbuilt, then a connection to another peer
/// with a larger MTU: the old peer's stream went on, to the new peer, cut at the new MTU from a
/// span sized for the old one, and tripped `Span::read`'s assertion (a panic on the engine
/// thread).
#[test]
fn a_reset_and_reconnect_with_a_larger_mtu_sends_nothing_of_the_old_read() {
    let mut sim = Sim::new(3, seed(24), Faults::default());
    sim.nodes[1].set_port_mtu(PathMtu::Mtu4096);
    sim.nodes[2].set_port_mtu(PathMtu::Mtu4096);
    let [a, b] = connect(&mut sim, Options::default());
    let read = SendOp::Read {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    // 100 KiB: 100 responses at MTU 1024, the last one short.
    post_send(&mut sim, 0, &a, rdma(read, sge(&a, 0, 100 * 1024 - 100)));
    assert_eq!(sim.hand_over(0, 1, 1), 1);
    let now = sim.now;
    let reset = QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    };
    sim.nodes[1].modify_qp(now, b.qpn, &reset).unwrap();
    let c_pd = sim.nodes[2].alloc_pd();
    let c_cq = sim.nodes[2].create_cq(64);
    let c_mr = sim.nodes[2].reg_mr(c_pd, IOVA, MR_LEN, ALL).unwrap();
    let c = Side {
        qpn: qp_on(&mut sim, 2, c_pd, c_cq),
        cq: c_cq,
        mr: c_mr,
    };
    let big = Options {
        mtu: PathMtu::Mtu4096,
        ..Default::default()
    };
    connect_qps(&mut sim, [(2, c.qpn), (1, b.qpn)], &big);
    assert_eq!(sim.hand_over(1, 2, 1000), 0, "nothing of node 0's READ");
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 2, &c, rdma(write, sge(&c, 0, 8192)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 2, c.cq)[0].status, WcStatus::Success);
}

/// A responder keeps `max_dest_rd_atomic` resources; a requester keeps at most as many READs
/// and atomics outstanding (IBTA 9.7.5.1.3 and o9-??? through the negotiated depths). One that
/// sends more gets NAK invalid request (rxe_resp.c `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`);
/// softroce's responder ignored the depth and answered up to 16.
#[test]
fn a_read_beyond_the_negotiated_depth_gets_nak_invalid_request() {
    let mut sim = Sim::new(2, seed(17), Faults::default());
    let [a, b] = connect(
        &mut sim,
        Options {
            // Node 0 keeps 16 outstanding; node 1 said it answers one at a time.
            rd_atomic: [16, 1],
            ..Default::default()
        },
    );
    for id in [1, 2] {
        let read = SendOp::Read {
            remote_addr: IOVA,
            rkey: b.mr.rkey(),
        };
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(id, read, sge(&a, 0, 64 * 1024)),
        );
    }
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    let statuses: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(
        statuses,
        [(1, WcStatus::WrFlushErr), (2, WcStatus::RemInvReqErr)]
    );
    assert_eq!(sim.nodes[1].qp_state(b.qpn), Some(QpState::Error));
}

/// An RNR NAK says the peer is there but has no receive posted; IBTA 9.7.5.2.8 counts it
/// against rnr_retry only, and an rnr_retry of 7 waits for ever. softroce kept the transport
/// timer running through RNR waits, so a SEND that arrived half a second before its receive
/// failed with RETRY_EXC_ERR.
#[test]
fn rnr_waits_do_not_use_up_the_transport_retries() {
    let mut sim = Sim::new(2, seed(18), Faults::default());
    let [a, b] = connect(
        &mut sim,
        Options {
            timeout: 10,       // 4.2 ms
            min_rnr_timer: 14, // 1.28 ms
            ..Default::default()
        },
    );
    post_send(&mut sim, 0, &a, rdma(SendOp::Send, sge(&a, 0, 100)));
    sim.run_until(LIMIT, |sim| sim.now >= Duration::from_secs(1));
    assert!(drain(&mut sim, 0, a.cq).is_empty(), "still waiting");
    post_recv(&mut sim, 1, &b, 1, 0, 128);
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
    let c = sim.nodes[0].counters();
    assert!(c.rnr_waits > 100, "{c}");
    assert_eq!(c.retry_timeouts, 0, "{c}");
}

/// IBTA 10.9.3 and rxe_recv.c `pkey_match`: a limited member (0x7FFF) may talk to a full
/// member (0xFFFF) of the same partition. softroce compared P_Keys for equality and dropped it.
#[test]
fn a_limited_member_p_key_reaches_the_default_partition_and_another_does_not() {
    for (pkey, lands) in [(0x7fff, true), (0x8001, false), (0x0000, false)] {
        let mut sim = Sim::new(2, seed(19), Faults::default());
        let [a, b] = connect(
            &mut sim,
            Options {
                retry_cnt: 1,
                ..Default::default()
            },
        );
        sim.rewrite = Some(Box::new(move |from, packet| {
            if from == 0 {
                packet[2..4].copy_from_slice(&u16::to_be_bytes(pkey));
            }
        }));
        a.mr.write(0, b"partitioned").unwrap();
        let write = SendOp::Write {
            remote_addr: IOVA + 0x100,
            rkey: b.mr.rkey(),
        };
        post_send(&mut sim, 0, &a, rdma(write, sge(&a, 0, 11)));
        sim.run_idle(LIMIT);
        let status = drain(&mut sim, 0, a.cq)[0].status;
        let dropped = sim.nodes[1].counters().dropped_bad_pkey;
        if lands {
            assert_eq!((status, dropped), (WcStatus::Success, 0), "{pkey:#x}");
            assert_eq!(read_mr(&b, 0x100, 11), b"partitioned");
        } else {
            assert_eq!(status, WcStatus::RetryExcErr, "{pkey:#x}");
            assert!(dropped > 0, "{pkey:#x}");
        }
    }
    assert!(PKey(0x7fff).matches(PKey::DEFAULT));
}

/// IBTA 11.4.2.1: a CQ overrun puts the CQ in error, and the QPs that complete into it, each
/// with its event. softroce dropped the completion without a trace of which it was.
#[test]
fn a_cq_overrun_names_the_lost_completion_and_errs_its_qps() {
    let mut sim = Sim::new(2, seed(20), Faults::default());
    let [_, b] = connect(&mut sim, Options::default());
    let pd = sim.nodes[0].alloc_pd();
    let small = sim.nodes[0].create_cq(2);
    let mr = sim.nodes[0].reg_mr(pd, IOVA, MR_LEN, ALL).unwrap();
    let a = Side {
        qpn: qp_on(&mut sim, 0, pd, small),
        cq: small,
        mr,
    };
    let b2 = Side {
        qpn: qp_on(&mut sim, 1, b.mr.pd(), b.cq),
        ..b.clone()
    };
    connect_qps(&mut sim, [(0, a.qpn), (1, b2.qpn)], &Options::default());
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    for id in 1..=3 {
        post_send(&mut sim, 0, &a, SendWr::new(id, write, sge(&a, 0, 8)));
    }
    sim.run_idle(LIMIT);
    let events: Vec<_> = std::iter::from_fn(|| sim.nodes[0].poll_event()).collect();
    assert!(
        events.contains(&AsyncEvent::CqOverrun {
            cq: small,
            qpn: a.qpn,
            wr_id: 3
        }),
        "{events:?}"
    );
    assert!(events.contains(&AsyncEvent::QpFatal { qpn: a.qpn }));
    assert_eq!(sim.nodes[0].qp_state(a.qpn), Some(QpState::Error));
    let kept: Vec<u64> = drain(&mut sim, 0, small)
        .iter()
        .map(|wc| wc.wr_id)
        .collect();
    assert_eq!(kept, [1, 2]);
    assert!(sim.nodes[0].counters().dropped_completions >= 1);
}

/// The path MTU is clamped to the port's: the link carries no more. softroce took the 4096 of
/// `ConnectOptions::default()` whatever the port, so on a 1500-byte link the kernel refused
/// every full packet with EMSGSIZE.
#[test]
fn a_path_mtu_above_the_ports_is_lowered_to_it() {
    let mut sim = Sim::new(2, seed(21), Faults::default());
    let [a, b] = connect(
        &mut sim,
        Options {
            mtu: PathMtu::Mtu4096,
            ..Default::default()
        },
    );
    let seen = record(&mut sim);
    let data = pattern(5, 10_000);
    a.mr.write(0, &data).unwrap();
    let write = SendOp::Write {
        remote_addr: IOVA + 0x10000,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, rdma(write, sge(&a, 0, 10_000)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&b, 0x10000, 10_000), data);
    let largest = seen.borrow().iter().map(|s| s.payload_len).max().unwrap();
    assert_eq!(largest, 1024, "the simulator's ports are 1024");
}

/// NAKs that are not the peer's answer to a request are dropped: from a stranger (rxe_recv.c
/// `check_addr`), or for a PSN never sent (a ghost, roce-sim's case). A real sequence NAK
/// resends, and the operation completes.
#[test]
fn forged_naks_are_dropped_and_a_sequence_nak_only_resends() {
    let mut sim = Sim::new(2, seed(22), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let nak = |code: NakCode, psn: u32| {
        let bth = BthRepr::new(Opcode::RcAck, a.qpn, Psn::new(psn));
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::Nak(code),
                msn: Msn::new(0),
            }),
            ..Default::default()
        };
        forge(bth, ext, &[])
    };
    // Hold node 1's answers back so the WRITE is outstanding when the NAKs land.
    sim.filter = Some(Box::new(|from, _| from != 1));
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, rdma(write, sge(&a, 0, 8)));
    sim.step();
    sim.inject(7, 0, nak(NakCode::RemoteAccessError, A_PSN));
    sim.inject(1, 0, nak(NakCode::RemoteAccessError, A_PSN + 1000));
    sim.inject(1, 0, nak(NakCode::PsnSequenceError, A_PSN));
    sim.step();
    sim.step();
    sim.filter = None;
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
    let c = sim.nodes[0].counters();
    assert_eq!(c.dropped_wrong_source, 1, "{c}");
    assert_eq!(c.ghost_acks, 1, "{c}");
    assert_eq!(c.naks_received, 1, "{c}");
    assert!(c.retransmitted_packets >= 1, "{c}");
}

/// Scatter/gather lists of several elements, each way: a SEND gathered from three SGEs into a
/// receive of four, a WRITE from two, a READ scattered into three (IBTA 10.7.2.3: the message
/// is the SGEs' bytes in order).
#[test]
fn multi_sge_gather_and_scatter() {
    let mut sim = Sim::new(2, seed(23), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let local = pattern(6, 0x10000);
    a.mr.write(0, &local).unwrap();
    b.mr.write(0x40000, &pattern(7, 0x10000)).unwrap();
    let sges = |side: &Side, parts: &[(u64, u32)]| -> SgeList {
        parts
            .iter()
            .map(|&(offset, len)| Sge {
                addr: IOVA + offset,
                len,
                lkey: side.mr.lkey(),
            })
            .collect()
    };
    let gathered = [(0x10, 100), (0x5001, 1), (0x8003, 2900)];
    let message: Vec<u8> = gathered
        .iter()
        .flat_map(|&(o, l)| local[o as usize..o as usize + l as usize].to_vec())
        .collect();
    let scattered = [(0x1001, 7), (0x2000, 1000), (0x3003, 1), (0x4000, 3000)];
    sim.nodes[1]
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 1,
                sges: sges(&b, &scattered),
            },
        )
        .unwrap();
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(1, SendOp::Send, Payload::Sges(sges(&a, &gathered))),
    );
    let write = SendOp::Write {
        remote_addr: IOVA + 0x20000,
        rkey: b.mr.rkey(),
    };
    let two = [(0x7, 2047), (0x9000, 2050)];
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(2, write, Payload::Sges(sges(&a, &two))),
    );
    let read = SendOp::Read {
        remote_addr: IOVA + 0x40000,
        rkey: b.mr.rkey(),
    };
    let three = [(0x30001, 1500), (0x32000, 1), (0x33005, 3000)];
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(3, read, Payload::Sges(sges(&a, &three))),
    );
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    assert_eq!(drain(&mut sim, 1, b.cq)[0].byte_len, 3001);

    let landed: Vec<u8> = scattered
        .iter()
        .flat_map(|&(o, l)| read_mr(&b, o as usize, l as usize))
        .collect();
    assert_eq!(landed[..3001], message[..]);
    let written: Vec<u8> = two
        .iter()
        .flat_map(|&(o, l)| local[o as usize..o as usize + l as usize].to_vec())
        .collect();
    assert_eq!(read_mr(&b, 0x20000, written.len()), written);
    let read_back: Vec<u8> = three
        .iter()
        .flat_map(|&(o, l)| read_mr(&a, o as usize, l as usize))
        .collect();
    assert_eq!(read_back, read_mr(&b, 0x40000, 4501));
}
