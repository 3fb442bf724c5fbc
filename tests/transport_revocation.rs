//! What a peer's READ can reach once the application takes its memory back, in the simulator
//! (`tests/sim`). A region deregistered, or a window invalidated, is reached by no packet that
//! leaves after the call returned: not by a repeated READ, whose responder resource keeps the
//! request and not the memory, and not by the rest of a READ already streaming, whose every
//! packet looks its key up again as it is built (rxe_resp.c `rxe_recheck_mr`, which answers a
//! key that no longer holds with NAK remote access error, `RESPST_ERR_RKEY_VIOLATION`). And a
//! peer that repeats parts of READs cannot make the responder queue a stream per repeat.

mod sim;

use std::cell::RefCell;
use std::rc::Rc;

use sim::rc::{
    bind_type2_window, connect, post_send, read_mr, read_request, sge, Options, Side, IOVA, LIMIT,
};
use sim::{drain, is_read_response, pattern, seed, Faults, Sim};
use softroce::memory::Access;
use softroce::transport::{AsyncEvent, Payload, SendOp, SendWr, WcOpcode, WcStatus};
use softroce::wire::{AckSyndrome, AethRepr, NakCode, Opcode, Psn, RKey, RethRepr, RocePacket};

/// The first PSN node 0 sends (`Options::default().psn[0]`).
const A_PSN: u32 = 100;

/// A packet node 1 put on the wire, as far as these tests look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    opcode: Opcode,
    psn: Psn,
    syndrome: Option<AckSyndrome>,
    payload: Vec<u8>,
}

impl Sent {
    fn of(bytes: &[u8]) -> Sent {
        let p = RocePacket::new_checked(bytes).expect("node 1 sends only packets that parse");
        Sent {
            opcode: p.bth().opcode(),
            psn: p.bth().psn(),
            syndrome: p.ext::<AethRepr>().map(|aeth| aeth.syndrome),
            payload: p.payload().to_vec(),
        }
    }
}

/// Records every packet node 1 puts on the simulator's wire from now on (it replaces the
/// filter).
fn capture(sim: &mut Sim) -> Rc<RefCell<Vec<Sent>>> {
    let sent = Rc::new(RefCell::new(Vec::new()));
    let log = sent.clone();
    sim.filter = Some(Box::new(move |from, bytes| {
        if from == 1 {
            log.borrow_mut().push(Sent::of(bytes));
        }
        true
    }));
    sent
}

/// Moves up to `limit` of the packets node 1 has to send straight to node 0, bypassing the
/// wire, and returns them: a test that wants the rest left unbuilt moves a few at a time.
fn relay(sim: &mut Sim, limit: usize) -> Vec<Sent> {
    let mut sent = Vec::new();
    while sent.len() < limit {
        let Some((_, bytes)) = sim.take(1) else {
            break;
        };
        sent.push(Sent::of(&bytes));
        sim.deliver_now(1, 0, bytes);
    }
    sent
}

const REMOTE_ACCESS_ERROR: Option<AckSyndrome> = Some(AckSyndrome::Nak(NakCode::RemoteAccessError));

/// Node 0 READs `len` bytes at `offset` of node 1's region through `rkey`, into its own region
/// at 0, and the READ completes.
fn read_through(sim: &mut Sim, a: &Side, rkey: RKey, offset: u64, len: u32) {
    let read = SendOp::Read {
        remote_addr: IOVA + offset,
        rkey,
    };
    post_send(sim, 0, a, SendWr::new(1, read, sge(a, 0, len)));
    sim.run_idle(LIMIT);
    let done = drain(sim, 0, a.cq);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].status, WcStatus::Success, "{done:?}");
}

/// Node 1 invalidates `rkey` through its QP, and the invalidation completes.
fn invalidate(sim: &mut Sim, b: &Side, rkey: RKey) {
    let op = SendOp::LocalInv { rkey };
    post_send(
        sim,
        1,
        b,
        SendWr::new(9, op, Payload::Sges(Default::default())),
    );
    let done = drain(sim, 1, b.cq);
    assert_eq!(
        done.len(),
        1,
        "a local operation completes as it is posted: {done:?}"
    );
    assert_eq!(
        (done[0].opcode, done[0].status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
}

/// After the repeat: node 1 sent no READ response and nothing of `after`, only NAK remote access
/// error at the repeat's PSN, and its QP failed with an access error, as rxe's does.
fn refused(sim: &mut Sim, sent: &[Sent], after: &[u8]) {
    assert!(
        !sent.iter().any(|s| is_read_response(s.opcode)),
        "a READ response: {sent:?}"
    );
    assert!(
        !sent
            .iter()
            .any(|s| s.payload.windows(after.len()).any(|w| w == after)),
        "bytes written after the memory was taken back left node 1"
    );
    let naks: Vec<_> = sent.iter().map(|s| (s.opcode, s.psn, s.syndrome)).collect();
    assert_eq!(
        naks,
        [(Opcode::RcAck, Psn::new(A_PSN), REMOTE_ACCESS_ERROR)]
    );
    let events: Vec<_> = std::iter::from_fn(|| sim.nodes[1].poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AsyncEvent::QpAccessError { .. })),
        "{events:?}"
    );
}

/// The first case, on bb27b60: node 1 answered the repeat from the span its resource
/// kept, with what it wrote through its handle after `dereg_mr` had returned.
#[test]
fn a_read_repeated_after_deregistration_carries_nothing_of_the_region() {
    let mut sim = Sim::new(2, seed(61), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    b.mr.write(0x100, &pattern(61, 64)).unwrap();
    read_through(&mut sim, &a, b.mr.rkey(), 0x100, 64);
    assert_eq!(read_mr(&a, 0, 64), pattern(61, 64));

    let regions = sim.nodes[1].resources().regions;
    sim.nodes[1].dereg_mr(b.mr.lkey()).unwrap();
    assert_eq!(sim.nodes[1].resources().regions, regions - 1);
    let after = b"written after deregistration....";
    b.mr.write(0x100, after).unwrap();
    b.mr.write(0x120, after).unwrap();

    let sent = capture(&mut sim);
    let reth = RethRepr {
        virtual_address: IOVA + 0x100,
        rkey: b.mr.rkey(),
        dma_len: 64,
    };
    sim.inject(0, 1, read_request(&b, A_PSN, reth));
    sim.run_idle(LIMIT);
    refused(&mut sim, &sent.borrow(), after);
    assert_eq!(sim.nodes[1].counters().rkey_violations, 1);
}

/// The same through a type 2 window: on bb27b60, after a LocalInv that completed with
/// Success, the repeat was answered with what was written after the invalidation.
#[test]
fn a_read_repeated_after_its_window_is_invalidated_carries_nothing() {
    let mut sim = Sim::new(2, seed(62), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let window = bind_type2_window(&mut sim, 1, &b, 0x1000, 64);
    b.mr.write(0x1000, &pattern(62, 64)).unwrap();
    read_through(&mut sim, &a, window, 0x1000, 64);
    assert_eq!(read_mr(&a, 0, 64), pattern(62, 64));

    invalidate(&mut sim, &b, window);
    let after = b"written after invalidation.......";
    b.mr.write(0x1000, after).unwrap();

    let sent = capture(&mut sim);
    let reth = RethRepr {
        virtual_address: IOVA + 0x1000,
        rkey: window,
        dma_len: 64,
    };
    sim.inject(0, 1, read_request(&b, A_PSN, reth));
    sim.run_idle(LIMIT);
    refused(&mut sim, &sent.borrow(), after);
}

/// On bb27b60 the responder resource of a completed READ kept the region's storage: after
/// deregistration, with nothing in flight, the last handle's `into_buffer` gave the handle back,
/// and the application could not have its own `Vec` while the QP lived.
#[test]
fn a_buffer_read_by_a_peer_comes_back_after_deregistration() {
    let mut sim = Sim::new(2, seed(63), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let buffer = pattern(63, 4096);
    let lent = sim.nodes[1]
        .reg_buffer(b.mr.pd(), 0x7000_0000, buffer.clone(), Access::REMOTE_READ)
        .unwrap();
    let read = SendOp::Read {
        remote_addr: 0x7000_0000,
        rkey: lent.rkey(),
    };
    post_send(&mut sim, 0, &a, SendWr::new(1, read, sge(&a, 0, 4096)));
    sim.run_idle(LIMIT);
    assert_eq!(drain(&mut sim, 0, a.cq)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&a, 0, 4096), buffer);

    sim.nodes[1].dereg_mr(lent.lkey()).unwrap();
    let back = lent
        .into_buffer()
        .expect("deregistered, nothing in flight, and the last handle");
    assert_eq!(back, buffer);
}

/// How node 1 takes back the memory a READ is streaming from.
#[derive(Debug, Clone, Copy)]
enum TakeBack {
    Deregister,
    Invalidate,
}

/// A 256 KiB READ, 256 responses at MTU 1024: node 1 has sent 20, and built the rest of its
/// first batch of 64 ready for the wire, when the memory is taken back. On bb27b60 the other
/// 236 followed, from the span the READ was granted. Now not one more leaves: the next packet
/// is withheld as it is built, a NAK remote access error goes in its place, and node 0's READ
/// completes with REM_ACCESS_ERR at once, without a retry.
#[test]
fn taking_memory_back_cuts_a_read_stream_short() {
    for (take_back, run) in [(TakeBack::Deregister, 64), (TakeBack::Invalidate, 65)] {
        let mut sim = Sim::new(2, seed(run), Faults::default());
        let [a, b] = connect(&mut sim, Options::default());
        let len = 256 * 1024;
        b.mr.write(0, &pattern(run, len)).unwrap();
        let rkey = match take_back {
            TakeBack::Deregister => b.mr.rkey(),
            TakeBack::Invalidate => bind_type2_window(&mut sim, 1, &b, 0, len as u64),
        };
        let read = SendOp::Read {
            remote_addr: IOVA,
            rkey,
        };
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(1, read, sge(&a, 0, len as u32)),
        );
        assert_eq!(sim.hand_over(0, 1, 1), 1, "the request");
        let before = relay(&mut sim, 20);
        assert!(before.iter().all(|s| is_read_response(s.opcode)));
        assert_eq!(before.len(), 20);

        match take_back {
            TakeBack::Deregister => sim.nodes[1].dereg_mr(b.mr.lkey()).unwrap(),
            TakeBack::Invalidate => invalidate(&mut sim, &b, rkey),
        }
        let after = b"written after it was taken back.";
        for at in (0..len).step_by(1024) {
            b.mr.write(at, after).unwrap();
        }
        let rest = relay(&mut sim, 1000);
        let later = capture(&mut sim);
        sim.run_idle(LIMIT);

        let rest: Vec<_> = rest.iter().map(|s| (s.opcode, s.psn, s.syndrome)).collect();
        assert_eq!(
            rest,
            [(Opcode::RcAck, Psn::new(A_PSN + 20), REMOTE_ACCESS_ERROR)],
            "{take_back:?}: the NAK in the 21st response's place, and nothing after it"
        );
        assert_eq!(*later.borrow(), [], "{take_back:?}");
        assert_eq!(sim.nodes[1].counters().revoked_read_responses, 1);
        let done = drain(&mut sim, 0, a.cq);
        assert_eq!(done[0].status, WcStatus::RemAccessErr, "{take_back:?}");
        assert_eq!(sim.nodes[0].counters().retry_timeouts, 0, "{take_back:?}");
        assert_eq!(read_mr(&a, 0, 20 * 1024), pattern(run, 20 * 1024));
        assert!(read_mr(&a, 20 * 1024, len - 20 * 1024)
            .iter()
            .all(|&b| b == 0));
    }
}

/// A peer repeats one packet's worth of a 1 MiB READ at each of 500 rising PSNs before the
/// responder answers any. On bb27b60 each repeat queued a stream of its own beside the others,
/// and node 1 sent 500 responses; now each repeat replaces the stream of the READ it repeats,
/// and the one left is answered. The requester, which asked for none of this, then asks again
/// for what it lacks, and its READ completes.
#[test]
fn repeats_of_parts_of_one_read_replace_each_other() {
    let mut sim = Sim::new(2, seed(66), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let len = 1 << 20;
    b.mr.write(0, &pattern(66, len)).unwrap();
    let read = SendOp::Read {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    post_send(
        &mut sim,
        0,
        &a,
        SendWr::new(1, read, sge(&a, 0, len as u32)),
    );
    assert_eq!(sim.hand_over(0, 1, 1), 1, "the request");
    for k in 1..=500 {
        let reth = RethRepr {
            virtual_address: IOVA + k * 1024,
            rkey: b.mr.rkey(),
            dma_len: 1024,
        };
        sim.deliver_now(0, 1, read_request(&b, A_PSN + k as u32, reth));
    }
    let answered = relay(&mut sim, usize::MAX);
    let answered: Vec<_> = answered.iter().map(|s| (s.opcode, s.psn)).collect();
    assert_eq!(
        answered,
        [(Opcode::RcReadResponseOnly, Psn::new(A_PSN + 500))],
        "the last repeat's one packet"
    );

    sim.run_idle(LIMIT);
    let done = drain(&mut sim, 0, a.cq);
    assert_eq!(done[0].status, WcStatus::Success, "{done:?}");
    assert_eq!(read_mr(&a, 0, len), pattern(66, len));
}

/// With a depth of one READ, a peer alternates new READs with repeats of them, 200 of each,
/// before the responder answers any: each repeat replaces its READ's own stream, but the
/// replays of READs that have left the resource ring stay queued. On bb27b60 node 1 then sent
/// 200 responses; now it queues at most `max_dest_rd_atomic` replays and drops the rest,
/// counted.
#[test]
fn replays_queued_on_a_qp_are_capped() {
    let mut sim = Sim::new(2, seed(67), Faults::default());
    let o = Options {
        rd_atomic: [1, 1],
        ..Default::default()
    };
    let [_a, b] = connect(&mut sim, o);
    for k in 0..200u32 {
        let reth = RethRepr {
            virtual_address: IOVA + u64::from(k) * 1024,
            rkey: b.mr.rkey(),
            dma_len: 1024,
        };
        let fresh = read_request(&b, A_PSN + k, reth);
        sim.deliver_now(0, 1, fresh.clone());
        sim.deliver_now(0, 1, fresh);
    }
    let counters = sim.nodes[1].counters();
    assert_eq!(counters.duplicate_requests, 200);
    assert_eq!(counters.dropped_read_replays, 199);
    assert_eq!(counters.naks_sent, 0);
    let answered = relay(&mut sim, usize::MAX);
    let answered: Vec<_> = answered.iter().map(|s| (s.opcode, s.psn)).collect();
    assert_eq!(
        answered,
        [(Opcode::RcReadResponseOnly, Psn::new(A_PSN))],
        "one replay, of the first READ"
    );
}
