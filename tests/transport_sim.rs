//! The RC transport in the deterministic simulator (`tests/sim`). Each test names the IBTA rule
//! or rxe behaviour it checks. A failing run prints its seed; `SOFTROCE_SIM_SEED=N` repeats it.

mod sim;

use std::time::Duration;

use sim::rc::{
    bind_type2_window, connect, connect_qps, lose_first, post_recv, post_send, qp_on, read_mr, sge,
    Options, Side, ALL, IOVA, LIMIT, MR_LEN,
};
use sim::{addr, drain, pattern, seed, Faults, Rng, Sim};
use softroce::memory::Access;
use softroce::transport::{
    AsyncEvent, Lane, Payload, QpState, SendOp, SendWr, WcOpcode, WcStatus, MAX_UNACKED_PSNS,
};
use softroce::wire::{Opcode, Psn, Qpn, RKey, RocePacket};

#[test]
fn every_operation_without_loss() {
    let mut sim = Sim::new(2, seed(1), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let data = pattern(7, 3000);
    a.mr.write(0, &data).unwrap();
    b.mr.write(0x8000, &42u64.to_ne_bytes()).unwrap();

    // Five receives: SEND, SEND with immediate, WRITE with immediate, inline SEND, SEND with
    // invalidate.
    for (id, offset) in [
        (1, 0x1000),
        (2, 0x2000),
        (3, 0x3000),
        (4, 0x4000),
        (5, 0x5000),
    ] {
        post_recv(&mut sim, 1, &b, id, offset, 4096);
    }
    // SEND with invalidate needs something invalidatable: a type 2 window over B's region,
    // bound through B's QP (rxe_resp.c `invalidate_rkey`).
    let inv_target = bind_type2_window(&mut sim, 1, &b, 0x60000, 4096);
    let ops = [
        (10, SendOp::Send, sge(&a, 0, 3000)),
        (
            11,
            SendOp::SendWithImm { imm: 0xdead_beef },
            sge(&a, 0, 100),
        ),
        (
            12,
            SendOp::Write {
                remote_addr: IOVA + 0x10000,
                rkey: b.mr.rkey(),
            },
            sge(&a, 0, 3000),
        ),
        (
            13,
            SendOp::WriteWithImm {
                remote_addr: IOVA + 0x20000,
                rkey: b.mr.rkey(),
                imm: 7,
            },
            sge(&a, 0, 10),
        ),
        (
            14,
            SendOp::Read {
                remote_addr: IOVA + 0x10000,
                rkey: b.mr.rkey(),
            },
            sge(&a, 0x40000, 3000),
        ),
        (
            15,
            SendOp::FetchAdd {
                remote_addr: IOVA + 0x8000,
                rkey: b.mr.rkey(),
                add: 8,
            },
            sge(&a, 0x50000, 8),
        ),
        (
            16,
            SendOp::CompareSwap {
                remote_addr: IOVA + 0x8000,
                rkey: b.mr.rkey(),
                compare: 50,
                swap: 1,
            },
            sge(&a, 0x50008, 8),
        ),
        (17, SendOp::Send, Payload::Inline(b"inline bytes".into())),
        (18, SendOp::SendWithInv { rkey: inv_target }, sge(&a, 0, 5)),
    ];
    for (id, op, payload) in ops {
        post_send(&mut sim, 0, &a, SendWr::new(id, op, payload));
    }
    sim.run_idle(LIMIT);

    let sent = drain(&mut sim, 0, a.cq);
    let ids: Vec<u64> = sent.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(
        ids,
        (10..=18).collect::<Vec<_>>(),
        "send completions in posting order"
    );
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    assert_eq!(sent[4].opcode, WcOpcode::RdmaRead);
    assert_eq!(sent[4].byte_len, 3000);
    // ibv_poll_cq(3): READs and atomics report their length on the send queue; an atomic's is
    // its 8-byte word, as rxe_comp.c `make_send_cqe` reports it.
    assert_eq!(
        [
            (sent[5].opcode, sent[5].byte_len),
            (sent[6].opcode, sent[6].byte_len)
        ],
        [(WcOpcode::FetchAdd, 8), (WcOpcode::CompSwap, 8)]
    );

    let recv = drain(&mut sim, 1, b.cq);
    assert_eq!(recv.len(), 5, "{recv:?}");
    assert_eq!(
        (recv[0].wr_id, recv[0].byte_len, recv[0].opcode),
        (1, 3000, WcOpcode::Recv)
    );
    assert_eq!(recv[0].src_qp, Some(a.qpn));
    assert_eq!(
        (recv[1].byte_len, recv[1].imm_data),
        (100, Some(0xdead_beef))
    );
    assert_eq!(
        (recv[2].opcode, recv[2].imm_data, recv[2].wr_id),
        (WcOpcode::RecvRdmaWithImm, Some(7), 3)
    );
    assert_eq!(recv[3].byte_len, 12);
    assert_eq!(recv[4].invalidated_rkey, Some(inv_target));
    // The invalidated rkey no longer reaches the region; the region's own rkey still does.
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            20,
            SendOp::Write {
                remote_addr: IOVA + 0x60000,
                rkey: b.mr.rkey(),
            },
            sge(&a, 0, 8),
        ),
    );
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            19,
            SendOp::Write {
                remote_addr: IOVA + 0x60000,
                rkey: inv_target,
            },
            sge(&a, 0, 8),
        ),
    );
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::RemAccessErr);

    assert_eq!(read_mr(&b, 0x1000, 3000), data);
    assert_eq!(read_mr(&b, 0x10000, 3000), data);
    assert_eq!(read_mr(&b, 0x20000, 10), data[..10]);
    assert_eq!(
        read_mr(&a, 0x40000, 3000),
        data,
        "READ brought the bytes back"
    );
    assert_eq!(
        read_mr(&a, 0x50000, 8),
        42u64.to_ne_bytes(),
        "FETCH_ADD returns the old value"
    );
    assert_eq!(read_mr(&a, 0x50008, 8), 50u64.to_ne_bytes());
    assert_eq!(
        read_mr(&b, 0x8000, 8),
        1u64.to_ne_bytes(),
        "CMP_SWAP stored the swap value"
    );
    assert_eq!(read_mr(&b, 0x4000, 12), b"inline bytes");
    assert_eq!(sim.nodes[0].counters().retransmitted_packets, 0);
    // What B carried out without a completion of its own: the WRITEs without immediate data
    // (12 and 20), the READ and the two atomics; not the SENDs, the WRITE with immediate data,
    // nor the WRITE refused.
    assert_eq!(sim.nodes[1].counters().remote_accesses, 5);
    assert_eq!(sim.nodes[0].counters().remote_accesses, 0);
}

/// A reference of what the peers must end up with: the model applies each operation in order.
#[derive(Default)]
struct Model {
    remote: Vec<u8>,
    local: Vec<u8>,
}

/// What one operation of a batch must have left behind, checked once the batch has settled.
enum Expect {
    /// A SEND's bytes, in its own receive slot on node 1.
    Received { slot: usize, bytes: Vec<u8> },
    /// A READ's bytes, as node 1's memory held them at its place in posting order, in node
    /// 0's READ area.
    Read { slot: usize, bytes: Vec<u8> },
}

/// Per batch of operations: each SEND lands in a receive slot of its own, each READ in a slot
/// of its own, so every payload can be checked.
const SLOT: usize = 4096;
const RECV_AREA: usize = 0xa0000;
const READ_AREA: usize = 0x40000;

#[test]
fn ten_thousand_mixed_operations_under_loss_reordering_and_duplication() {
    let seed = seed(0x5eed);
    let faults = Faults {
        loss: 0.10,
        duplicate: 0.02,
        reorder: 0.05,
        jitter: Duration::from_micros(40),
        corrupt: 0.01,
    };
    let mut sim = Sim::new(2, seed, faults);
    let [a, b] = connect(
        &mut sim,
        Options {
            timeout: 8,
            ..Default::default()
        },
    );
    let mut rng = Rng::new(seed);
    const REGION: usize = 64 * 1024;
    const BATCH: usize = 64;
    let mut model = Model {
        remote: vec![0; REGION],
        local: pattern(seed, REGION),
    };
    a.mr.write(0, &model.local).unwrap();
    let mut expected_ids = Vec::new();
    let (mut fetch_adds, mut sends, mut reads) = (0u64, 0u64, 0u64);
    let mut posted = 0u64;
    let mut recv_id = 0u64;
    while posted < 10_000 {
        // Keep a bounded number of requests in flight, as an application would.
        let mut expect = Vec::new();
        // IBTA 9.5 (transaction ordering): an RDMA WRITE posted after a READ may execute before
        // the READ's data is read, on first execution or on a retried READ. An application that
        // needs the READ to see the older bytes fences the WRITE, and so does this test, for
        // the WRITEs that overlap a READ of the batch.
        let mut read_ranges: Vec<std::ops::Range<usize>> = Vec::new();
        for slot in 0..BATCH {
            posted += 1;
            let len = rng.below(3000) as usize + 1;
            let at = rng.below((REGION - len) as u64) as usize;
            let src = rng.below((REGION - len) as u64) as usize;
            let (op, payload) = match rng.below(5) {
                0 => {
                    let recv_at = (RECV_AREA + slot * SLOT) as u64;
                    post_recv(&mut sim, 1, &b, recv_id, recv_at, SLOT as u32);
                    recv_id += 1;
                    sends += 1;
                    let bytes = model.local[src..src + len].to_vec();
                    expect.push(Expect::Received { slot, bytes });
                    (SendOp::Send, sge(&a, src as u64, len as u32))
                }
                1 | 2 => {
                    model.remote[at..at + len].copy_from_slice(&model.local[src..src + len]);
                    let op = SendOp::Write {
                        remote_addr: IOVA + at as u64,
                        rkey: b.mr.rkey(),
                    };
                    (op, sge(&a, src as u64, len as u32))
                }
                3 => {
                    reads += 1;
                    read_ranges.push(at..at + len);
                    let bytes = model.remote[at..at + len].to_vec();
                    expect.push(Expect::Read { slot, bytes });
                    let op = SendOp::Read {
                        remote_addr: IOVA + at as u64,
                        rkey: b.mr.rkey(),
                    };
                    (op, sge(&a, (READ_AREA + slot * SLOT) as u64, len as u32))
                }
                _ => {
                    fetch_adds += 1;
                    let op = SendOp::FetchAdd {
                        remote_addr: IOVA + 0x90000,
                        rkey: b.mr.rkey(),
                        add: 1,
                    };
                    (op, sge(&a, 0x90000 + (posted % 64) * 8, 8))
                }
            };
            let mut wr = SendWr::new(posted, op, payload);
            wr.fence = matches!(op, SendOp::Write { .. })
                && read_ranges.iter().any(|r| r.start < at + len && at < r.end);
            wr.signaled = posted % 3 != 0;
            if wr.signaled {
                expected_ids.push(posted);
            }
            post_send(&mut sim, 0, &a, wr);
        }
        sim.run_idle(LIMIT);
        for e in expect {
            match e {
                Expect::Received { slot, bytes } => assert_eq!(
                    read_mr(&b, RECV_AREA + slot * SLOT, bytes.len()),
                    bytes,
                    "seed {seed}: the SEND of slot {slot} before operation {posted}"
                ),
                Expect::Read { slot, bytes } => assert_eq!(
                    read_mr(&a, READ_AREA + slot * SLOT, bytes.len()),
                    bytes,
                    "seed {seed}: the READ of slot {slot} before operation {posted}"
                ),
            }
        }
    }
    assert!(sends > 1000 && reads > 1000, "{sends} SENDs, {reads} READs");
    let completions = drain(&mut sim, 0, a.cq);
    let failures: Vec<_> = completions
        .iter()
        .filter(|wc| wc.status != WcStatus::Success)
        .collect();
    assert!(
        failures.is_empty(),
        "seed {seed}: {:?}",
        &failures[..failures.len().min(3)]
    );
    let ids: Vec<u64> = completions.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(
        ids, expected_ids,
        "seed {seed}: each completion once, in posting order"
    );
    assert_eq!(
        read_mr(&b, 0, REGION),
        model.remote,
        "seed {seed}: every written byte"
    );
    let counter = u64::from_ne_bytes(read_mr(&b, 0x90000, 8).try_into().unwrap());
    assert_eq!(
        counter, fetch_adds,
        "seed {seed}: each FETCH_ADD ran exactly once"
    );
    let received = drain(&mut sim, 1, b.cq);
    assert_eq!(
        received.len() as u64,
        recv_id,
        "seed {seed}: every SEND received once"
    );

    let c = sim.nodes[0].counters();
    let wire = sim.stats;
    assert!(wire.dropped > 0 && wire.duplicated > 0 && wire.corrupted > 0);
    assert!(
        sim.nodes[1].counters().icrc_errors + c.icrc_errors > 0,
        "corruption was caught"
    );
    eprintln!(
        "requester:\n{c}responder:\n{}net: {:?}",
        sim.nodes[1].counters(),
        sim.stats
    );
    // No storm. Go-back-N resends what was in flight after a loss, so under 10% loss each way
    // retransmissions are several times the original traffic (rxe pays the same). What must
    // hold: at most one go-back per fault the network caused, and at most one window resent
    // per go-back.
    let go_backs = c.naks_received + c.retry_timeouts;
    let faults = wire.dropped + wire.corrupted + wire.reordered + wire.duplicated;
    assert!(
        go_backs <= faults,
        "seed {seed}: {go_backs} go-backs for {faults} faults"
    );
    assert!(
        c.retransmitted_packets <= go_backs * u64::from(MAX_UNACKED_PSNS),
        "seed {seed}: {} retransmissions for {go_backs} go-backs",
        c.retransmitted_packets,
    );
    // The responder NAKs each gap once, not each packet that arrives after it.
    let r = sim.nodes[1].counters();
    assert!(
        r.naks_sent < r.sequence_errors / 10,
        "seed {seed}: {} NAKs for {} out-of-sequence packets",
        r.naks_sent,
        r.sequence_errors
    );
}

#[test]
fn psn_wrap_at_2_pow_24() {
    let mut sim = Sim::new(
        2,
        seed(3),
        Faults {
            loss: 0.05,
            ..Default::default()
        },
    );
    let near_wrap = (1 << 24) - 7;
    let [a, b] = connect(
        &mut sim,
        Options {
            psn: [near_wrap, near_wrap - 1],
            ..Default::default()
        },
    );
    let data = pattern(9, 4000);
    a.mr.write(0, &data).unwrap();
    for i in 0..10 {
        post_recv(&mut sim, 1, &b, i, 0x10000 * i, 4096);
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(i, SendOp::Send, sge(&a, 0, 4000)),
        );
    }
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    assert_eq!(sent.len(), 10);
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    for i in 0..10 {
        assert_eq!(read_mr(&b, 0x10000 * i, 4000), data);
    }
}

#[test]
fn retry_exhaustion_then_flush() {
    // IBTA 9.7.6.1.3: after retry_cnt timeouts the request fails with RETRY_EXC_ERR, and the QP
    // moves to the error state, flushing the rest.
    let mut sim = Sim::new(
        2,
        seed(4),
        Faults {
            loss: 1.0,
            ..Default::default()
        },
    );
    let [a, _b] = connect(
        &mut sim,
        Options {
            retry_cnt: 2,
            timeout: 4,
            ..Default::default()
        },
    );
    for i in 0..3 {
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(
                i,
                SendOp::Write {
                    remote_addr: IOVA,
                    rkey: RKey(1),
                },
                sge(&a, 0, 10),
            ),
        );
    }
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    let statuses: Vec<_> = wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(
        statuses,
        [
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(sim.nodes[0].qp_state(a.qpn), Some(QpState::Error));
    assert_eq!(
        sim.nodes[0].counters().retry_timeouts,
        3,
        "two retries, then the failing timeout"
    );
    assert_eq!(
        sim.nodes[0].poll_event(),
        Some(AsyncEvent::QpFatal { qpn: a.qpn })
    );
}

#[test]
fn rnr_wait_then_success() {
    // No receive posted: the responder sends RNR NAKs with min_rnr_timer; the requester waits
    // that long and retries (IBTA 9.7.5.2.8).
    let mut sim = Sim::new(2, seed(5), Faults::default());
    let [a, b] = connect(
        &mut sim,
        Options {
            min_rnr_timer: 14,
            ..Default::default()
        },
    ); // 1.28 ms
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(1, SendOp::Send, sge(&a, 0, 2000)),
    );
    sim.run_until(LIMIT, |s| s.nodes[0].counters().rnr_waits >= 3);
    assert!(
        sim.now >= Duration::from_micros(2 * 1280),
        "waited the RNR timer between tries"
    );
    post_recv(&mut sim, 1, &b, 9, 0, 4096);
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(drain(&mut sim, 1, b.cq)[0].byte_len, 2000);
}

#[test]
fn rnr_retry_exhaustion() {
    let mut sim = Sim::new(2, seed(6), Faults::default());
    let [a, _b] = connect(
        &mut sim,
        Options {
            rnr_retry: 2,
            ..Default::default()
        },
    );
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(1, SendOp::Send, sge(&a, 0, 10)),
    );
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(2, SendOp::Send, sge(&a, 0, 10)),
    );
    sim.run_idle(LIMIT);
    let statuses: Vec<_> = drain(&mut sim, 0, a.cq)
        .iter()
        .map(|wc| wc.status)
        .collect();
    assert_eq!(statuses, [WcStatus::RnrRetryExcErr, WcStatus::WrFlushErr]);
    assert_eq!(
        sim.nodes[0].counters().rnr_waits,
        3,
        "the first RNR NAK, then two retries"
    );
}

/// Runs one request that the responder must refuse; returns the requester's status, the NAK
/// syndrome seen on the wire, and the responder's final state.
fn refused(
    options: Options,
    op: impl FnOnce(&Side) -> SendOp,
    len: u32,
) -> (WcStatus, u8, QpState) {
    let mut sim = Sim::new(2, seed(8), Faults::default());
    let naks = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = naks.clone();
    sim.filter = Some(Box::new(move |from, bytes| {
        if let Ok(p) = RocePacket::new_checked(bytes) {
            if from == 1 && p.bth().opcode() == Opcode::RcAck {
                if let Some(aeth) = p.ext::<softroce::wire::AethRepr>() {
                    seen.borrow_mut().push(aeth.syndrome.to_byte());
                }
            }
        }
        true
    }));
    let [a, b] = connect(&mut sim, options);
    post_send(&mut sim, 0, &a, SendWr::new(1, op(&b), sge(&a, 0, len)));
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    let syndrome = naks.borrow().last().copied().unwrap_or(0);
    (
        wcs[0].status,
        syndrome,
        sim.nodes[1].qp_state(b.qpn).unwrap(),
    )
}

#[test]
fn remote_access_errors_of_each_kind() {
    use WcStatus::*;
    let write = |b: &Side| SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    // An unknown rkey: NAK 0x62, remote access error (rxe_resp.c check_rkey).
    let bad_key = |b: &Side| SendOp::Write {
        remote_addr: IOVA,
        rkey: RKey(b.mr.rkey().0 ^ 0x10),
    };
    assert_eq!(
        refused(Options::default(), bad_key, 8),
        (RemAccessErr, 0x62, QpState::Error)
    );
    // Beyond the region: NAK 0x62.
    let beyond = |b: &Side| SendOp::Write {
        remote_addr: IOVA + MR_LEN as u64 - 4,
        rkey: b.mr.rkey(),
    };
    assert_eq!(
        refused(Options::default(), beyond, 8),
        (RemAccessErr, 0x62, QpState::Error)
    );
    // A region without remote write: NAK 0x62.
    let read_only_mr = Options {
        mr_access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..Default::default()
    };
    assert_eq!(
        refused(read_only_mr, write, 8),
        (RemAccessErr, 0x62, QpState::Error)
    );
    // A QP without remote write: NAK 0x61, invalid request, as rxe answers it.
    let no_qp_write = Options {
        qp_access: Access::LOCAL_WRITE,
        ..Default::default()
    };
    assert_eq!(
        refused(no_qp_write, write, 8),
        (RemInvReqErr, 0x61, QpState::Error)
    );
    // A misaligned atomic: NAK 0x61.
    let misaligned = |b: &Side| SendOp::FetchAdd {
        remote_addr: IOVA + 4,
        rkey: b.mr.rkey(),
        add: 1,
    };
    assert_eq!(
        refused(Options::default(), misaligned, 8),
        (RemInvReqErr, 0x61, QpState::Error)
    );
    // A READ past the region: NAK 0x62.
    let read_beyond = |b: &Side| SendOp::Read {
        remote_addr: IOVA + MR_LEN as u64 - 100,
        rkey: b.mr.rkey(),
    };
    assert_eq!(
        refused(Options::default(), read_beyond, 200),
        (RemAccessErr, 0x62, QpState::Error)
    );
}

#[test]
fn a_lost_atomic_ack_does_not_run_the_atomic_twice() {
    let mut sim = Sim::new(2, seed(10), Faults::default());
    lose_first(&mut sim, Opcode::RcAtomicAck);
    let [a, b] = connect(
        &mut sim,
        Options {
            timeout: 6,
            ..Default::default()
        },
    );
    b.mr.write(0, &100u64.to_ne_bytes()).unwrap();
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote_addr: IOVA,
                rkey: b.mr.rkey(),
                add: 5,
            },
            sge(&a, 0x100, 8),
        ),
    );
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(read_mr(&b, 0, 8), 105u64.to_ne_bytes(), "added once");
    assert_eq!(
        read_mr(&a, 0x100, 8),
        100u64.to_ne_bytes(),
        "the cached original value"
    );
    assert_eq!(sim.nodes[1].counters().duplicate_requests, 1);
    assert_eq!(
        sim.nodes[1].counters().remote_accesses,
        1,
        "the duplicate answered from the ring is no second access"
    );
}

#[test]
fn a_lost_read_response_in_the_middle_resumes_the_read() {
    let mut sim = Sim::new(2, seed(11), Faults::default());
    let mut middles = 0;
    let resumed_at = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let seen = resumed_at.clone();
    sim.filter = Some(Box::new(move |_, bytes| {
        let Ok(p) = RocePacket::new_checked(bytes) else {
            return true;
        };
        match p.bth().opcode() {
            Opcode::RcReadResponseMiddle => {
                middles += 1;
                middles != 2 // lose the second MIDDLE response once
            }
            Opcode::RcReadRequest => {
                let reth = p.ext::<softroce::wire::RethRepr>().unwrap();
                seen.set(reth.virtual_address);
                true
            }
            _ => true,
        }
    }));
    let [a, b] = connect(
        &mut sim,
        Options {
            timeout: 6,
            ..Default::default()
        },
    );
    let data = pattern(12, 5 * 1024);
    b.mr.write(0, &data).unwrap();
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            1,
            SendOp::Read {
                remote_addr: IOVA,
                rkey: b.mr.rkey(),
            },
            sge(&a, 0x2000, 5 * 1024),
        ),
    );
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    assert_eq!(
        (wcs[0].status, wcs[0].byte_len),
        (WcStatus::Success, 5 * 1024)
    );
    assert_eq!(read_mr(&a, 0x2000, 5 * 1024), data);
    // The second request asked for the responses from the lost one (the third packet) on.
    assert_eq!(
        resumed_at.get(),
        IOVA + 2 * 1024,
        "the READ resumed mid-stream"
    );
}

#[test]
fn roce_sim_checklist_ghost_ack_and_far_psn() {
    // datenlord/roce-sim error cases: an ACK for a PSN never sent is dropped; a request PSN far
    // out of the window gets one sequence NAK and does not disturb the connection.
    let mut sim = Sim::new(2, seed(13), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    use softroce::wire::{AckSyndrome, AethRepr, BthRepr, ExtHeaders, IcrcStatus, Msn, PacketRepr};
    let forge = |opcode, dest: Qpn, psn: u32, ext: ExtHeaders, len: usize| {
        let repr = PacketRepr::new(
            BthRepr {
                ack_req: true,
                ..BthRepr::new(opcode, dest, Psn::new(psn))
            },
            ext,
            len,
        );
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        buf
    };
    let ghost = forge(
        Opcode::RcAck,
        a.qpn,
        777_777,
        ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: Msn::new(9),
            }),
            ..Default::default()
        },
        0,
    );
    sim.nodes[0].handle_datagram(sim.now, addr(1), IcrcStatus::Ok, &ghost);
    assert_eq!(sim.nodes[0].counters().ghost_acks, 1);
    assert!(sim.nodes[0].poll_cq(a.cq).is_none());

    let far = forge(
        Opcode::RcSendOnly,
        b.qpn,
        100 + (1 << 22),
        ExtHeaders::default(),
        4,
    );
    for _ in 0..3 {
        sim.nodes[1].handle_datagram(sim.now, addr(0), IcrcStatus::Ok, &far);
    }
    assert_eq!(sim.nodes[1].counters().sequence_errors, 3);
    assert_eq!(sim.nodes[1].counters().naks_sent, 1, "one NAK per gap");
    // A packet from an address that is not the peer is dropped (rxe_recv.c check_addr).
    sim.nodes[1].handle_datagram(sim.now, addr(5), IcrcStatus::Ok, &far);
    assert_eq!(sim.nodes[1].counters().dropped_wrong_source, 1);
    // A bad ICRC is counted and nothing else is looked at.
    sim.nodes[1].handle_datagram(
        sim.now,
        addr(0),
        IcrcStatus::Bad {
            computed: 1,
            received: 2,
        },
        &far,
    );
    assert_eq!(sim.nodes[1].counters().icrc_errors, 1);

    // The connection still works: the requester ignores the NAK for a PSN it never sent... and
    // a normal SEND completes.
    post_recv(&mut sim, 1, &b, 1, 0, 64);
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(1, SendOp::Send, sge(&a, 0, 64)),
    );
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn deregistration_fails_an_operation_in_flight() {
    // The responder checks the rkey on every WRITE; once the region is deregistered, the rest
    // of the message gets NAK 0x62.
    let mut sim = Sim::new(2, seed(14), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    sim.nodes[1].dereg_mr(b.mr.lkey()).unwrap();
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: IOVA,
                rkey: b.mr.rkey(),
            },
            sge(&a, 0, 100),
        ),
    );
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::RemAccessErr);
    // Locally: a send whose SGE's region is gone fails with LOC_PROT_ERR.
    let mut sim = Sim::new(2, seed(15), Faults::default());
    let [a, _b] = connect(&mut sim, Options::default());
    sim.nodes[0].dereg_mr(a.mr.lkey()).unwrap();
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(
            1,
            SendOp::Write {
                remote_addr: IOVA,
                rkey: RKey(1),
            },
            sge(&a, 0, 100),
        ),
    );
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::LocProtErr);
}

#[test]
fn deregistration_stops_a_write_in_flight() {
    // The responder checks each WRITE packet's part as it lands: a region deregistered between
    // the FIRST and the LAST packet fails the rest of the message with NAK 0x62.
    let mut sim = Sim::new(2, seed(16), Faults::default());
    lose_first(&mut sim, Opcode::RcWriteLast);
    let [a, b] = connect(
        &mut sim,
        Options {
            timeout: 6,
            ..Default::default()
        },
    );
    a.mr.write(0, &[0x77; 3000]).unwrap();
    let op = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, SendWr::new(1, op, sge(&a, 0, 3000)));
    // FIRST and MIDDLE land; the LAST is lost on the way.
    sim.run_until(LIMIT, |s| s.nodes[1].counters().received_packets >= 2);
    sim.nodes[1].dereg_mr(b.mr.lkey()).unwrap();
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::RemAccessErr);
    assert_eq!(sim.nodes[1].counters().rkey_violations, 1);
    assert_eq!(
        read_mr(&b, 0, 2048),
        vec![0x77; 2048],
        "the packets before it landed"
    );
    assert_eq!(
        read_mr(&b, 2048, 952),
        vec![0; 952],
        "nothing after the deregistration"
    );
}

/// A requester that has asked a READ again waits while the old answer drains: each stale
/// response, one for the request it replaced, pushes its retry timer back by an ack timeout. So
/// does rxe_comp.c (Linux drivers/infiniband/sw/rxe): rxe_completer re-arms retrans_timer after
/// every response it handles, whether it used it or discarded it. Here one lost response makes
/// the requester ask again early in a 1 MiB READ over a slow link, and the new answer queues
/// behind the rest of the old one; without the push back each ack timeout meanwhile asked
/// again, until the retries ran out.
#[test]
fn stale_read_responses_push_the_retry_timer_back() {
    let mut sim = Sim::new(2, seed(17), Faults::default());
    // 100 Mbit/s: the answer takes 85 ms, twenty ack timeouts of 4.2 ms.
    sim.byte_time = Duration::from_nanos(80);
    lose_first(&mut sim, Opcode::RcReadResponseMiddle);
    let [a, b] = connect(
        &mut sim,
        Options {
            retry_cnt: 3,
            ..Default::default()
        },
    );
    let data = pattern(18, MR_LEN);
    b.mr.write(0, &data).unwrap();
    let read = SendOp::Read {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    let wr = SendWr::new(1, read, sge(&a, 0, MR_LEN as u32));
    post_send(&mut sim, 0, &a, wr);
    sim.run_idle(LIMIT);
    let wcs = drain(&mut sim, 0, a.cq);
    let c = sim.nodes[0].counters();
    eprintln!("after {:?}:\n{c}", sim.now);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(read_mr(&a, 0, MR_LEN), data);
    assert!(
        c.stale_responses > 1000,
        "the old answer kept arriving after the retry"
    );
    assert_eq!(
        (c.retry_timeouts, c.retransmitted_packets),
        (0, 1),
        "asked again once, for the lost response, and never timed out"
    );
}

/// A loss pattern in step with go-back-N defeats any finite retry count (IBTA 9.7.6.1.3: 7
/// retries, counted, as `retry` in requester.rs does), which is why tests/engine_loopback.rs
/// drops packets at random rather than every 50th. Pipelined 64-PSN READs keep two or three READs
/// outstanding. When a response is lost with 150 PSNs left (the rest of one READ and the two
/// behind it), each retry asks for those 150 responses again and the responder sends
/// exactly those: 3 × 50 packets, so the first, the one the requester waits for, falls on a
/// dropped slot every time and no retry makes progress. rxe's "7 retries for ever" only hides
/// this until a dropped re-request shifts the phase. Under random loss each retry is an
/// independent chance, and the same budget suffices. retry_cnt 3 is counted whatever 7 means.
#[test]
fn periodic_loss_in_step_with_go_back_n_exhausts_the_retries() {
    use std::cell::RefCell;
    use std::rc::Rc;

    const READ: usize = 64 * 1024;
    let run = |sim: &mut Sim| {
        let [a, b] = connect(
            sim,
            Options {
                retry_cnt: 3,
                ..Default::default()
            },
        );
        let data = pattern(19, MR_LEN);
        b.mr.write(0, &data).unwrap();
        for i in 0..MR_LEN / READ {
            let at = (i * READ) as u64;
            let read = SendOp::Read {
                remote_addr: IOVA + at,
                rkey: b.mr.rkey(),
            };
            post_send(
                sim,
                0,
                &a,
                SendWr::new(i as u64, read, sge(&a, at, READ as u32)),
            );
        }
        sim.run_idle(LIMIT);
        drain(sim, 0, a.cq)
    };

    let mut sim = Sim::new(2, seed(19), Faults::default());
    let lost_responses = Rc::new(RefCell::new(Vec::new()));
    let lost = lost_responses.clone();
    let mut sent = [0u64; 2];
    sim.filter = Some(Box::new(move |from, bytes| {
        sent[from] += 1;
        if sent[from] % 50 != 0 {
            return true;
        }
        if from == 1 {
            let psn = RocePacket::new_checked(bytes).map(|p| p.bth().psn().value());
            lost.borrow_mut().extend(psn.ok());
        }
        false
    }));
    let wcs = run(&mut sim);
    let failed = wcs.iter().find(|wc| wc.status != WcStatus::Success);
    assert_eq!(failed.map(|wc| wc.status), Some(WcStatus::RetryExcErr));
    let c = sim.nodes[0].counters();
    // The awaited response was lost in the first answer and in the answers to all three
    // retries: a gap started the first retry, timeouts the other two, and the timeout after
    // the third failed the READ.
    let lost = lost_responses.borrow();
    let stuck = *lost.last().unwrap();
    assert_eq!(
        lost.iter().filter(|&&psn| psn == stuck).count(),
        4,
        "{lost:?}"
    );
    assert_eq!(c.retry_timeouts, 3);

    let random = Faults {
        loss: 0.02,
        ..Default::default()
    };
    let mut sim = Sim::new(2, seed(19), random);
    let wcs = run(&mut sim);
    assert!(
        wcs.iter().all(|wc| wc.status == WcStatus::Success),
        "{wcs:?}"
    );
    assert!(sim.stats.dropped > 0);
}

/// An ACK acknowledges every PSN up to its own (IBTA 9.7.5.1.1, coalesced acknowledges): of
/// the requests that arrive in one batch, the responder ACKs only the last of each run, and
/// never across a READ response, which must reach the requester before any ACK of a later PSN
/// (an ACK past an unanswered READ tells the requester the response was lost, IBTA 9.7.5.1.2).
#[test]
fn acks_of_one_batch_are_coalesced_but_not_across_a_read_response() {
    let mut sim = Sim::new(2, seed(31), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let seen = sim::record(&mut sim);
    let write = |i: u64| SendOp::Write {
        remote_addr: IOVA + 0x1000 + 64 * i,
        rkey: b.mr.rkey(),
    };
    let read = SendOp::Read {
        remote_addr: IOVA + 0x2000,
        rkey: b.mr.rkey(),
    };
    let ops = [
        write(0),
        write(1),
        write(2),
        write(3),
        read,
        write(4),
        write(5),
        write(6),
    ];
    // Posted at one instant and sent without a link delay, they arrive in one batch.
    for (i, op) in ops.into_iter().enumerate() {
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(i as u64, op, sge(&a, 64 * i as u64, 64)),
        );
    }
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    assert_eq!(sent.len(), 8, "{sent:?}");
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    let psn = |k: u32| Psn::new(Options::default().psn[0] + k);
    let responses: Vec<_> = seen
        .borrow()
        .iter()
        .filter(|s| s.from == 1)
        .map(|s| (s.opcode, s.psn))
        .collect();
    assert_eq!(
        responses,
        [
            (Opcode::RcAck, psn(3)),
            (Opcode::RcReadResponseOnly, psn(4)),
            (Opcode::RcAck, psn(7)),
        ]
    );
    assert_eq!(sim.nodes[1].counters().coalesced_acks, 5);
}

/// A responder may delay and coalesce its ACKs (IBTA 9.7.5.1.1). An io layer that runs a turn
/// in an application's poll holds them back (`Endpoint::hold_acks`): nothing is given out until
/// it releases them, and then they leave behind the request the application posted in answer;
/// an ACK or a NAK of the same QP held or queued meanwhile takes a held one's place; and
/// nothing is held while a packet other than a plain ACK waits (a READ response, a NAK), the
/// ACKs held already going behind it.
#[test]
fn held_acks_leave_behind_the_answer_and_give_way_to_a_later_ack() {
    let mut sim = Sim::new(2, seed(37), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    // What `b` sends, in order, as it hands it to `a`.
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = sent.clone();
    sim.observe = Some(Box::new(move |from, bytes| {
        let packet = RocePacket::new_checked(bytes).unwrap();
        if from == 1 {
            log.borrow_mut()
                .push((packet.bth().opcode(), packet.bth().psn()));
        }
    }));
    let opcodes = |sim: &mut Sim, from: usize| {
        sim.hand_over(from, 0, 8);
        std::mem::take(&mut *sent.borrow_mut())
    };
    let psn = |k: u32| Psn::new(Options::default().psn[0] + k);
    let send = |wr_id, side: &Side| SendWr::new(wr_id, SendOp::Send, sge(side, 0, 8));
    for k in 0..4 {
        post_recv(&mut sim, 1, &b, k, 64 * k, 64);
    }
    post_recv(&mut sim, 0, &a, 9, 0x2000, 64);
    post_send(&mut sim, 0, &a, send(1, &a));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    assert!(sim.nodes[1].hold_acks());
    assert_eq!(opcodes(&mut sim, 1), [], "a held ACK went out");
    assert!(sim.nodes[1].has_transmits());
    post_send(&mut sim, 1, &b, send(2, &b));
    assert!(sim.nodes[1].release_held_acks());
    let b_psn = |k: u32| Psn::new(Options::default().psn[1] + k);
    assert_eq!(
        opcodes(&mut sim, 1),
        [(Opcode::RcSendOnly, b_psn(0)), (Opcode::RcAck, psn(0))]
    );
    // A later ACK of the QP replaces the held one, held too or not.
    let coalesced = sim.nodes[1].counters().coalesced_acks;
    post_send(&mut sim, 0, &a, send(3, &a));
    // With `a`'s ACK of `b`'s SEND.
    assert_eq!(sim.hand_over(0, 1, 8), 2);
    assert!(sim.nodes[1].hold_acks());
    for k in [4, 5] {
        post_send(&mut sim, 0, &a, send(k, &a));
        assert_eq!(sim.hand_over(0, 1, 8), 1);
        if k == 4 {
            assert!(sim.nodes[1].hold_acks());
        }
    }
    assert!(sim.nodes[1].release_held_acks());
    assert!(!sim.nodes[1].release_held_acks(), "released twice");
    assert!(!sim.nodes[1].holds_acks());
    assert_eq!(opcodes(&mut sim, 1), [(Opcode::RcAck, psn(3))]);
    assert_eq!(sim.nodes[1].counters().coalesced_acks, coalesced + 2);
    // A READ response waiting to be built holds nothing back.
    let read = SendOp::Read {
        remote_addr: IOVA + 0x1000,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, SendWr::new(6, read, sge(&a, 0x1000, 64)));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    assert!(!sim.nodes[1].hold_acks());
    assert_eq!(opcodes(&mut sim, 1), [(Opcode::RcReadResponseOnly, psn(4))]);
    // A NAK queued after a held ACK replaces it too: a NAK acknowledges every PSN before its
    // own. Here an RNR NAK, for a SEND that finds no receive request (IBTA 9.7.5.2.8).
    post_recv(&mut sim, 1, &b, 4, 64 * 4, 64);
    post_send(&mut sim, 0, &a, send(7, &a));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    assert!(sim.nodes[1].hold_acks());
    post_send(&mut sim, 0, &a, send(8, &a));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    // A NAK is no ACK to hold: the held ACK goes behind it, or rather gives way to it.
    assert!(!sim.nodes[1].hold_acks());
    assert!(!sim.nodes[1].holds_acks());
    assert_eq!(
        opcodes(&mut sim, 1),
        [(Opcode::RcAck, psn(6))],
        "the RNR NAK alone"
    );
    post_recv(&mut sim, 1, &b, 5, 64 * 5, 64);
    // Nothing was lost: every request completes, the SEND that drew the NAK once retried.
    sim.run_idle(LIMIT);
    let completed = drain(&mut sim, 0, a.cq).len() + drain(&mut sim, 1, b.cq).len();
    assert_eq!(completed, 5 + 1 + 4 + 1 + 4);
}

/// Which acknowledgements replace a held ACK (`Endpoint::hold_acks`): only one of the same QP
/// for the same PSN or a later one, among the last COALESCE_WINDOW (64) packets queued. An ACK
/// acknowledges every PSN up to its own (IBTA 9.7.5.1.1), so an earlier one does not: the answer
/// to a duplicate atomic, its first result for its own PSN (9.7.5.1.3), goes out and the held
/// ACK of the later SEND behind it. The answer to a duplicate SEND, an ACK of the last PSN
/// received, the held ACK's own, does replace it. And an ACK further back than the window is
/// not looked for: the held one then goes too, stale but harmless, and the work stays bounded.
#[test]
fn a_held_ack_gives_way_only_to_a_later_ack_within_the_window() {
    let mut sim = Sim::new(2, seed(38), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    // `a`'s last request, to be sent again as a duplicate.
    let last_request = std::rc::Rc::new(std::cell::RefCell::new(None));
    let (log, request) = (sent.clone(), last_request.clone());
    sim.observe = Some(Box::new(move |from, bytes| {
        let packet = RocePacket::new_checked(bytes).unwrap();
        let opcode = packet.bth().opcode();
        if from == 1 {
            log.borrow_mut().push((opcode, packet.bth().psn()));
        } else if opcode != Opcode::RcAck {
            *request.borrow_mut() = Some(bytes.to_vec());
        }
    }));
    // Everything `b` has queued, handed to `a`, as (opcode, PSN).
    let b_sent = |sim: &mut Sim| {
        sim.hand_over(1, 0, 200);
        std::mem::take(&mut *sent.borrow_mut())
    };
    let psn = |k: u32| Psn::new(Options::default().psn[0] + k);
    let send = |wr_id| SendWr::new(wr_id, SendOp::Send, sge(&a, 0, 8));
    for k in 0..6 {
        post_recv(&mut sim, 1, &b, k, 64 * k, 64);
    }
    let add = SendOp::FetchAdd {
        remote_addr: IOVA + 0x8000,
        rkey: b.mr.rkey(),
        add: 1,
    };
    post_send(&mut sim, 0, &a, SendWr::new(1, add, sge(&a, 0x100, 8)));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    let fetch_add = last_request
        .borrow_mut()
        .take()
        .expect("the FetchAdd was sent");
    assert_eq!(b_sent(&mut sim), [(Opcode::RcAtomicAck, psn(0))]);
    post_send(&mut sim, 0, &a, send(2));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    assert!(sim.nodes[1].hold_acks());
    // The FetchAdd again, as a requester that lost its answer sends it.
    sim.deliver_now(0, 1, fetch_add);
    assert!(!sim.nodes[1].hold_acks(), "an atomic ACK was held");
    assert_eq!(
        b_sent(&mut sim),
        [(Opcode::RcAtomicAck, psn(0)), (Opcode::RcAck, psn(1))],
        "the duplicate's answer replaced the held ACK of a later PSN"
    );
    // An ACK of the QP queued behind the held one, then `writes` WRITEs of `b`'s own.
    let write = |wr_id| {
        let op = SendOp::Write {
            remote_addr: IOVA + 0x1000,
            rkey: a.mr.rkey(),
        };
        let mut wr = SendWr::new(wr_id, op, sge(&b, 0x1000, 8));
        wr.signaled = false;
        wr
    };
    let b_psn = |k: u32| Psn::new(Options::default().psn[1] + k);
    let mut wr_id = 10;
    let mut b_writes = 0;
    for (k, writes, replaced) in [(2, 63u32, true), (4, 64, false)] {
        let coalesced = sim.nodes[1].counters().coalesced_acks;
        // Posted one at a time, so that each asks for its ACK.
        post_send(&mut sim, 0, &a, send(wr_id));
        assert_eq!(sim.hand_over(0, 1, 8), 1);
        assert!(sim.nodes[1].hold_acks());
        post_send(&mut sim, 0, &a, send(wr_id + 1));
        assert_eq!(sim.hand_over(0, 1, 8), 1);
        wr_id += 2;
        let now = sim.now;
        sim.nodes[1].post_send_batch(now, b.qpn, (0..writes).map(|i| write(1000 + u64::from(i))));
        assert!(sim.nodes[1].release_held_acks());
        let mut expected = vec![(Opcode::RcAck, psn(k + 1))];
        expected.extend((0..writes).map(|i| (Opcode::RcWriteOnly, b_psn(b_writes + i))));
        if !replaced {
            expected.push((Opcode::RcAck, psn(k)));
        }
        b_writes += writes;
        assert_eq!(b_sent(&mut sim), expected, "{writes} WRITEs");
        let coalesced_now = sim.nodes[1].counters().coalesced_acks;
        assert_eq!(
            coalesced_now - coalesced,
            u64::from(replaced),
            "{writes} WRITEs"
        );
        // `a`'s ACK of the WRITEs.
        assert_eq!(sim.hand_over(0, 1, 8), 1);
    }
    // A duplicate SEND is answered with an ACK of the last PSN received (9.7.5.1.3), the held
    // ACK's own: it replaces it.
    post_send(&mut sim, 0, &a, send(wr_id));
    assert_eq!(sim.hand_over(0, 1, 8), 1);
    assert!(sim.nodes[1].hold_acks());
    let coalesced = sim.nodes[1].counters().coalesced_acks;
    let duplicate = last_request.borrow_mut().take().expect("the SEND was sent");
    sim.deliver_now(0, 1, duplicate);
    assert!(sim.nodes[1].hold_acks());
    assert!(sim.nodes[1].release_held_acks());
    assert_eq!(b_sent(&mut sim), [(Opcode::RcAck, psn(6))]);
    assert_eq!(sim.nodes[1].counters().coalesced_acks, coalesced + 1);
    // Nothing was lost: every request of `a` completes (`b`'s WRITEs are unsignalled).
    sim.run_idle(LIMIT);
    let completed = drain(&mut sim, 0, a.cq);
    assert_eq!(completed.len(), 1 + 1 + 4 + 1);
    assert!(completed.iter().all(|wc| wc.status == WcStatus::Success));
}

/// Only the packets whose acknowledgement someone waits for ask for one (BTH AckReq): in a
/// batch of WRITEs, the batch's last packet, and one in every ACK_REQ_INTERVAL (32) packets
/// so that the window moves. A signalled WRITE inside the batch (PSN 110) does not ask: the
/// next ACK, of PSN 131 in the same run, covers every PSN before its own (IBTA 9.7.5.1.1), so
/// it completes with it.
#[test]
fn in_a_batch_only_its_end_and_every_32nd_packet_ask_for_an_ack() {
    let mut sim = Sim::new(2, seed(32), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let seen = sim::record(&mut sim);
    let wrs = (0..40u64).map(|i| {
        let op = SendOp::Write {
            remote_addr: IOVA + 64 * i,
            rkey: b.mr.rkey(),
        };
        let mut wr = SendWr::new(i, op, sge(&a, 64 * i, 64));
        wr.signaled = i == 10 || i == 39;
        wr
    });
    let now = sim.now;
    sim.nodes[0].post_send_batch(now, a.qpn, wrs);
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    let ids: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(ids, [(10, WcStatus::Success), (39, WcStatus::Success)]);
    let asking: Vec<_> = seen
        .borrow()
        .iter()
        .filter(|s| s.from == 0 && s.ack_req)
        .map(|s| s.psn)
        .collect();
    let psn = |k: u32| Psn::new(Options::default().psn[0] + k);
    assert_eq!(asking, [psn(31), psn(39)]);
    // Posted one at a time, each is the last queued when it is sent, and asks.
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(&mut sim, 0, &a, SendWr::new(40, write, sge(&a, 0, 64)));
    sim.run_idle(LIMIT);
    assert_eq!(
        seen.borrow()
            .iter()
            .rfind(|s| s.from == 0)
            .map(|s| s.ack_req),
        Some(true)
    );
}

/// An unsignalled WRITE followed by a signalled local operation (here a local invalidate, as
/// iSER and NVMe over Fabrics post after a transfer) in one batch: the local operation takes
/// no packet, so the WRITE's packet is the last the requester sends and asks for the ACK that
/// lets the invalidate complete, with no retry timeout.
#[test]
fn a_local_operation_after_an_unsignalled_write_completes_without_a_timeout() {
    let mut sim = Sim::new(2, seed(33), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let rkey = bind_type2_window(&mut sim, 0, &a, 0x1000, 64);
    let write = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    let mut invalidate = SendWr::new(
        2,
        SendOp::LocalInv { rkey },
        Payload::Sges(Default::default()),
    );
    invalidate.signaled = true;
    let mut unsignalled = SendWr::new(1, write, sge(&a, 0, 64));
    unsignalled.signaled = false;
    let now = sim.now;
    sim.nodes[0].post_send_batch(now, a.qpn, [unsignalled, invalidate].into_iter());
    sim.run_idle(LIMIT);
    let sent = drain(&mut sim, 0, a.cq);
    let got: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(got, [(2, WcStatus::Success)]);
    assert_eq!(sim.nodes[0].counters().retry_timeouts, 0);
}

/// A device of two engines (ARCHITECTURE.md, "Several engines") in the simulator: two
/// endpoints per node over one memory table, each datagram delivered to the endpoint of its
/// DestQP's lane, as the kernel's reuse-port steering does. Each node registers its region
/// through lane 0 alone; QPs on both lanes are connected crosswise (lane 0 to the peer's lane
/// 1, lane 1 to its lane 0), so every request, response and ACK crosses from one lane to the
/// other. Each QP WRITEs into the peer's region through the key the peer's other lane
/// registered, READs it back and SENDs, under loss, duplication and reordering.
#[test]
fn two_engines_per_node_under_loss_duplication_and_reordering() {
    let faults = Faults {
        loss: 0.05,
        duplicate: 0.03,
        reorder: 0.05,
        jitter: Duration::from_micros(30),
        corrupt: 0.002,
    };
    let mut sim = Sim::with_lanes(2, 2, seed(11), faults);
    // Endpoint `n * 2 + l` is node `n`'s lane `l`.
    let regions: Vec<_> = (0..2)
        .map(|node| {
            let ep = &mut sim.nodes[node * 2];
            let pd = ep.alloc_pd();
            (pd, ep.reg_mr(pd, IOVA, MR_LEN, ALL).unwrap())
        })
        .collect();
    let sides: Vec<Side> = (0..4)
        .map(|e| {
            let (pd, mr) = regions[e / 2].clone();
            let cq = sim.nodes[e].create_cq(1 << 16);
            let qpn = qp_on(&mut sim, e, pd, cq);
            assert_eq!(
                Lane::owner(qpn, 2),
                (e % 2) as u32,
                "a lane draws its own QPNs"
            );
            Side { qpn, cq, mr }
        })
        .collect();
    let peer_of = [3, 2, 1, 0];
    let o = Options::default();
    connect_qps(&mut sim, [(0, sides[0].qpn), (3, sides[3].qpn)], &o);
    connect_qps(&mut sim, [(1, sides[1].qpn), (2, sides[2].qpn)], &o);

    // Each endpoint writes its own stretch of its peer's region, so all four run at once.
    let len = 20_000u32;
    // Within each region: sources at `at(e)`, WRITE targets 0x4_0000 above, READ results
    // 0x8_0000 above, received SENDs 0xc_0000 above.
    let at = |e: usize| 0x1_0000 * e as u64;
    for e in 0..4 {
        sides[e]
            .mr
            .write(at(e) as usize, &pattern(e as u64, len as usize))
            .unwrap();
        post_recv(
            &mut sim,
            peer_of[e],
            &sides[peer_of[e]],
            1,
            0xc_0000 + at(e),
            4096,
        );
    }
    for e in 0..4 {
        let peer = &sides[peer_of[e]];
        let write = SendOp::Write {
            remote_addr: IOVA + 0x4_0000 + at(e),
            rkey: peer.mr.rkey(),
        };
        post_send(
            &mut sim,
            e,
            &sides[e],
            SendWr::new(1, write, sge(&sides[e], at(e), len)),
        );
        let read = SendOp::Read {
            remote_addr: IOVA + 0x4_0000 + at(e),
            rkey: peer.mr.rkey(),
        };
        let back = sge(&sides[e], 0x8_0000 + at(e), len);
        post_send(&mut sim, e, &sides[e], SendWr::new(2, read, back));
        let send = sge(&sides[e], at(e), 100);
        post_send(&mut sim, e, &sides[e], SendWr::new(3, SendOp::Send, send));
    }
    sim.run_idle(LIMIT);

    for e in 0..4 {
        let wcs = drain(&mut sim, e, sides[e].cq);
        let sent: Vec<_> = wcs
            .iter()
            .filter(|wc| wc.opcode != WcOpcode::Recv)
            .collect();
        assert_eq!(
            sent.iter()
                .map(|wc| (wc.wr_id, wc.status))
                .collect::<Vec<_>>(),
            [1, 2, 3].map(|id| (id, WcStatus::Success)),
            "endpoint {e}"
        );
        let recv: Vec<_> = wcs
            .iter()
            .filter(|wc| wc.opcode == WcOpcode::Recv)
            .collect();
        assert_eq!(recv.len(), 1, "endpoint {e} received its peer's SEND");
        assert_eq!((recv[0].status, recv[0].byte_len), (WcStatus::Success, 100));
        let written = pattern(e as u64, len as usize);
        let peer = &sides[peer_of[e]];
        let landed = read_mr(peer, (0x4_0000 + at(e)) as usize, len as usize);
        assert!(
            landed == written,
            "endpoint {e}'s WRITE landed in its peer's region"
        );
        let read_back = read_mr(&sides[e], (0x8_0000 + at(e)) as usize, len as usize);
        assert!(read_back == written, "endpoint {e}'s READ brought it back");
        let sent_bytes = read_mr(peer, (0xc_0000 + at(e)) as usize, 100);
        assert_eq!(sent_bytes, written[..100]);
    }
    assert!(sim.stats.dropped > 0 && sim.stats.duplicated > 0 && sim.stats.reordered > 0);
    // The lanes shared the work: every endpoint sent and received.
    for (e, ep) in sim.nodes.iter().enumerate() {
        let c = ep.counters();
        assert!(
            c.sent_packets > 0 && c.received_packets > 0,
            "endpoint {e}: {c:?}"
        );
    }
}
