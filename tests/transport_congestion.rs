//! ECN, CNPs and DCQCN in the simulator: the notification point's CNPs on the wire (IBTA
//! Annex A17.9.3), the reaction point's pacing, hostile CNPs, and senders sharing a marking
//! bottleneck, with DCQCN and without.

mod sim;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use sim::rc::{connect, connect_qps, qp_on, sge, Options, Side, ALL, IOVA, LIMIT, MR_LEN};
use sim::red::Red;
use sim::{addr, forge, Bottleneck, Faults, Sim};
use softroce::memory::MemoryRegion;
use softroce::transport::{CongestionConfig, QpInit, QpType, SendOp, SendWr, WcStatus};
use softroce::wire::{BthRepr, Ecn, ExtHeaders, Opcode, PKey, Psn, RocePacket};

const CE: u8 = 3;

/// An 8-byte WRITE ONLY to `to`'s QP at `psn`, as its peer's requester builds it.
fn write_only(to: &Side, psn: u32) -> Vec<u8> {
    let bth = BthRepr::new(Opcode::RcWriteOnly, to.qpn, Psn::new(psn));
    let ext = ExtHeaders {
        reth: Some(softroce::wire::RethRepr {
            virtual_address: IOVA,
            rkey: to.mr.rkey(),
            dma_len: 8,
        }),
        ..Default::default()
    };
    forge(bth, ext, &[7; 8])
}

/// The CNPs on the wire since `seen` started recording: (from node, the packet).
fn cnps(seen: &[(usize, Vec<u8>)]) -> Vec<(usize, Vec<u8>)> {
    seen.iter()
        .filter(|(_, p)| p.first() == Some(&Opcode::Cnp.value()))
        .cloned()
        .collect()
}

/// Every packet on the wire, sealed, with its sender.
type Wire = Rc<RefCell<Vec<(usize, Vec<u8>)>>>;

/// Records every packet on the wire from now on.
fn tap(sim: &mut Sim) -> Wire {
    let log = Wire::default();
    let tap = log.clone();
    sim.filter = Some(Box::new(move |from, bytes| {
        tap.borrow_mut().push((from, bytes.to_vec()));
        true
    }));
    log
}

#[test]
fn a_packet_marked_ce_is_answered_by_one_cnp_per_interval() {
    let mut sim = Sim::new(2, sim::seed(1), Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let wire = tap(&mut sim);
    // Three WRITEs from A arrive at B marked, within 4 µs (np_min_time_between_cnps).
    for psn in 100..103 {
        sim.deliver_with_class(0, 1, CE, write_only(&b, psn));
    }
    sim.run_idle(LIMIT);
    let sent = cnps(&wire.borrow());
    assert_eq!(sent.len(), 1, "one CNP for three marks within the interval");
    let counters = sim.nodes[1].counters();
    assert_eq!(
        (counters.np_ecn_marked_roce_packets, counters.np_cnp_sent),
        (3, 1)
    );
    let status = sim.nodes[1].congestion(b.qpn).unwrap();
    assert_eq!((status.ce_marked, status.cnps_sent), (3, 1));

    // IBTA Annex A17.9.3: BTH opcode 0x81, BECN set, P_Key 0xFFFF, PSN 0, DestQP the
    // sender's QP, SE, M, pad, TVer and A clear; then 16 reserved bytes of zero, the ICRC.
    let (from, cnp) = &sent[0];
    assert_eq!(*from, 1);
    assert_eq!(cnp.len(), 12 + 16 + 4);
    let packet = RocePacket::new_checked(&cnp[..]).unwrap();
    let bth = packet.bth();
    assert_eq!(bth.opcode(), Opcode::Cnp);
    assert!(bth.becn() && !bth.fecn() && !bth.ack_req() && !bth.solicited());
    assert_eq!(bth.pkey(), PKey::DEFAULT);
    assert_eq!(bth.psn(), Psn::new(0));
    assert_eq!(bth.dest_qp(), a.qpn);
    assert_eq!(cnp[1], 0, "SE, M, pad and TVer clear");
    assert_eq!(cnp[12..28], [0; 16]);

    // A later mark, past the interval, is answered again.
    sim.now += Duration::from_micros(5);
    sim.deliver_with_class(0, 1, CE, write_only(&b, 103));
    sim.run_idle(LIMIT);
    assert_eq!(cnps(&wire.borrow()).len(), 2);
    // And the CNP reached A's reaction point, which now paces A's QP.
    let status = sim.nodes[0].congestion(a.qpn).unwrap();
    assert_eq!(status.cnps_handled, 2);
    assert!(status.rate_bps.is_some());
    assert_eq!(sim.nodes[0].counters().rp_cnp_handled, 2);
}

#[test]
fn unmarked_and_ect_packets_are_not_answered() {
    let mut sim = Sim::new(2, sim::seed(2), Faults::default());
    let [_a, b] = connect(&mut sim, Options::default());
    let wire = tap(&mut sim);
    sim.deliver_with_class(0, 1, Ecn::Ect0.bits(), write_only(&b, 100));
    sim.deliver_with_class(0, 1, 0, write_only(&b, 101));
    sim.run_idle(LIMIT);
    assert!(cnps(&wire.borrow()).is_empty());
    assert_eq!(sim.nodes[1].counters().np_ecn_marked_roce_packets, 0);
}

#[test]
fn with_congestion_control_off_marks_are_counted_and_cnps_ignored() {
    let mut sim = Sim::with_congestion(2, sim::seed(3), Faults::default(), CongestionConfig::off());
    let [a, b] = connect(&mut sim, Options::default());
    let wire = tap(&mut sim);
    sim.deliver_with_class(0, 1, CE, write_only(&b, 100));
    sim.run_idle(LIMIT);
    assert!(cnps(&wire.borrow()).is_empty());
    assert_eq!(sim.nodes[1].counters().np_ecn_marked_roce_packets, 1);
    // A CNP from the peer is counted and changes nothing.
    let mut bth = BthRepr::new(Opcode::Cnp, a.qpn, Psn::new(0));
    bth.becn = true;
    sim.deliver_now(1, 0, forge(bth, ExtHeaders::default(), &[]));
    assert_eq!(sim.nodes[0].counters().rp_cnp_ignored, 1);
    assert_eq!(sim.nodes[0].congestion(a.qpn).unwrap().rate_bps, None);
}

#[test]
fn a_cnp_from_anyone_but_the_peer_is_dropped() {
    let mut sim = Sim::new(3, sim::seed(4), Faults::default());
    let [a, _b] = connect(&mut sim, Options::default());
    let mut bth = BthRepr::new(Opcode::Cnp, a.qpn, Psn::new(0));
    bth.becn = true;
    // Node 2 is no peer of A's RC QP; 9 is no node at all.
    sim.deliver_now(2, 0, forge(bth, ExtHeaders::default(), &[]));
    sim.deliver_now(9, 0, forge(bth, ExtHeaders::default(), &[]));
    let counters = sim.nodes[0].counters();
    assert_eq!(counters.dropped_wrong_source, 2);
    assert_eq!(counters.rp_cnp_handled, 0);
    assert_eq!(sim.nodes[0].congestion(a.qpn).unwrap().rate_bps, None);
    // A CNP cut short (no reserved bytes) does not parse.
    let mut short = forge(bth, ExtHeaders::default(), &[]);
    short.drain(12..28);
    sim.deliver_now(1, 0, short);
    assert_eq!(sim.nodes[0].counters().dropped_malformed, 1);
}

#[test]
fn a_ud_mark_is_answered_to_the_source_qp_of_the_deth() {
    use softroce::transport::{datagram_steps, AddressVector, Payload, UdDest};
    use softroce::wire::QKey;
    let mut sim = Sim::new(2, sim::seed(5), Faults::default());
    let qkey = QKey(0x1111);
    let mut qps = Vec::new();
    for n in 0..2 {
        let ep = &mut sim.nodes[n];
        let pd = ep.alloc_pd();
        let cq = ep.create_cq(64);
        let qpn = ep
            .create_qp(QpInit {
                qp_type: QpType::Ud,
                pd,
                send_cq: cq,
                recv_cq: cq,
                max_send_wr: 16,
                max_recv_wr: 16,
            })
            .unwrap();
        for step in datagram_steps(qkey) {
            ep.modify_qp(Duration::ZERO, qpn, &step).unwrap();
        }
        let mr = ep.reg_mr(pd, IOVA, 4096, ALL).unwrap();
        qps.push((pd, cq, qpn, mr));
    }
    let (pd0, _, qp0, mr0) = qps[0].clone();
    let (_, _, qp1, mr1) = qps[1].clone();
    sim.nodes[1]
        .post_recv(
            qp1,
            softroce::transport::RecvWr {
                wr_id: 1,
                sges: [softroce::transport::Sge {
                    addr: IOVA,
                    len: 4096,
                    lkey: mr1.lkey(),
                }]
                .into(),
            },
        )
        .unwrap();
    let ah = sim.nodes[0]
        .create_ah(pd0, AddressVector { dest: addr(1) })
        .unwrap();
    let mut wr = SendWr::new(
        7,
        SendOp::Send,
        Payload::Sges(
            [softroce::transport::Sge {
                addr: IOVA,
                len: 64,
                lkey: mr0.lkey(),
            }]
            .into(),
        ),
    );
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: qp1,
        remote_qkey: qkey,
    });
    sim.nodes[0].post_send(Duration::ZERO, qp0, wr).unwrap();
    // The datagram crosses a switch that marks it.
    let (_, datagram) = sim.take(0).unwrap();
    let wire = tap(&mut sim);
    sim.deliver_with_class(0, 1, CE, datagram);
    sim.run_idle(LIMIT);
    let sent = cnps(&wire.borrow());
    assert_eq!(sent.len(), 1);
    let packet = RocePacket::new_checked(&sent[0].1[..]).unwrap();
    assert_eq!(packet.bth().dest_qp(), qp0);
    assert_eq!(sim.nodes[0].congestion(qp0).unwrap().cnps_handled, 1);
}

/// `senders` nodes, each with an RC QP writing to its own QP on the last node, through a
/// bottleneck in front of it: each sender's link 8 Gb/s, the bottleneck's 4 Gb/s; RED marks
/// as `RED` says and the queue holds `LIMIT_BYTES`. Without congestion control, two flows'
/// windows alone (about 120 KiB each in flight) outgrow that queue.
struct Incast {
    sim: Sim,
    senders: Vec<Side>,
    receivers: Vec<Side>,
}

const MESSAGE: u32 = 64 << 10;
/// RED's Kmin, Kmax and Pmax: marking from 10 KB, certain at 100 KB. The DCQCN paper's
/// (5 KB, 200 KB, 1%) suit 40 Gb/s; at 4 Gb/s the queue must be heard from sooner.
const RED: Red = Red {
    kmin: 10_000,
    kmax: 100_000,
    pmax: 0.2,
};
/// A shallow switch buffer for one port.
const LIMIT_BYTES: usize = 192 << 10;
/// Nanoseconds per byte: 8 Gb/s senders, a 4 Gb/s bottleneck.
const SENDER_NS: u64 = 1;
const BOTTLENECK_NS: u64 = 2;
/// Flows start one after another, as flows do: each new one's first window lands on the
/// queue the others left.
const STAGGER: Duration = Duration::from_millis(1);
/// What is measured: from when the last flow has settled to 100 ms later.
const WINDOW: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(120));

fn incast(senders: usize, congestion: CongestionConfig, seed: u64) -> Incast {
    let mut sim = Sim::with_congestion(senders + 1, sim::seed(seed), Faults::default(), congestion);
    sim.byte_time = Duration::from_nanos(SENDER_NS);
    sim.bottleneck = Some(Bottleneck::new(
        senders,
        Duration::from_nanos(BOTTLENECK_NS),
        RED,
        LIMIT_BYTES,
    ));
    let o = Options {
        mtu: softroce::transport::PathMtu::Mtu4096,
        ..Options::default()
    };
    let target = senders;
    let (pd, cq) = {
        let ep = &mut sim.nodes[target];
        let pd = ep.alloc_pd();
        (pd, ep.create_cq(1 << 20))
    };
    let mr: MemoryRegion = sim.nodes[target].reg_mr(pd, IOVA, MR_LEN, ALL).unwrap();
    let mut s = Vec::new();
    let mut r = Vec::new();
    for n in 0..senders {
        let ep = &mut sim.nodes[n];
        let spd = ep.alloc_pd();
        let scq = ep.create_cq(1 << 20);
        let smr = ep.reg_mr(spd, IOVA, MR_LEN, ALL).unwrap();
        let sqpn = qp_on(&mut sim, n, spd, scq);
        let rqpn = qp_on(&mut sim, target, pd, cq);
        connect_qps(&mut sim, [(n, sqpn), (target, rqpn)], &o);
        s.push(Side {
            qpn: sqpn,
            cq: scq,
            mr: smr,
        });
        r.push(Side {
            qpn: rqpn,
            cq,
            mr: mr.clone(),
        });
    }
    Incast {
        sim,
        senders: s,
        receivers: r,
    }
}

impl Incast {
    /// Sender `n` posts `count` WRITEs of 64 KiB.
    fn post(&mut self, n: usize, count: u64) {
        let (s, r) = (&self.senders[n], &self.receivers[n]);
        {
            for i in 0..count {
                let mut wr = SendWr::new(
                    i,
                    SendOp::Write {
                        remote_addr: IOVA,
                        rkey: r.mr.rkey(),
                    },
                    sge(s, 0, MESSAGE),
                );
                wr.signaled = true;
                let now = self.sim.now;
                self.sim.nodes[n].post_send(now, s.qpn, wr).unwrap();
            }
        }
    }

    fn bottleneck(&self) -> &Bottleneck {
        self.sim.bottleneck.as_ref().unwrap()
    }

    fn delivered(&self) -> Vec<u64> {
        let mut d = self.bottleneck().delivered.clone();
        d.resize(self.senders.len(), 0);
        d
    }

    fn run_until(&mut self, at: Duration) {
        self.sim.run_until(LIMIT, |s| s.now >= at);
    }

    /// Each sender's completions: how many succeeded, and the statuses of those that did
    /// not.
    fn completed(&mut self) -> Vec<(usize, Vec<WcStatus>)> {
        (0..self.senders.len())
            .map(|n| {
                let cq = self.senders[n].cq;
                let done = sim::drain(&mut self.sim, n, cq);
                let failed: Vec<WcStatus> = done
                    .iter()
                    .map(|wc| wc.status)
                    .filter(|&status| status != WcStatus::Success)
                    .collect();
                (done.len() - failed.len(), failed)
            })
            .collect()
    }
}

/// What one scene gave over `WINDOW`.
struct Outcome {
    scene: Incast,
    /// Bytes each flow got through the bottleneck.
    moved: Vec<u64>,
}

impl Outcome {
    fn mean(&self) -> f64 {
        self.moved.iter().sum::<u64>() as f64 / self.moved.len() as f64
    }

    /// The farthest any flow is from the fair share, as a fraction of it.
    fn worst_deviation(&self) -> f64 {
        let mean = self.mean();
        self.moved
            .iter()
            .map(|&m| (m as f64 - mean).abs() / mean)
            .fold(0.0, f64::max)
    }

    /// Jain's fairness index: 1 when every flow gets the same, 1/n when one gets all.
    fn jain(&self) -> f64 {
        let sum: f64 = self.moved.iter().map(|&m| m as f64).sum();
        let squares: f64 = self.moved.iter().map(|&m| (m as f64).powi(2)).sum();
        sum * sum / (self.moved.len() as f64 * squares)
    }

    /// What crossed the bottleneck, as a fraction of what it could carry in the window.
    fn utilisation(&self) -> f64 {
        let capacity = (WINDOW.1 - WINDOW.0).as_nanos() as f64 / BOTTLENECK_NS as f64;
        self.moved.iter().sum::<u64>() as f64 / capacity
    }
}

fn run_incast(senders: usize, congestion: CongestionConfig, seed: u64) -> Outcome {
    let mut scene = incast(senders, congestion, seed);
    // Enough 64 KiB WRITEs that every flow is still sending at the end of the window.
    let per_flow = 10 * 512 / senders as u64;
    for n in 0..senders {
        scene.run_until(STAGGER * n as u32);
        scene.post(n, per_flow);
    }
    scene.run_until(WINDOW.0);
    let before = scene.delivered();
    scene.run_until(WINDOW.1);
    let moved = scene
        .delivered()
        .iter()
        .zip(&before)
        .map(|(after, before)| after - before)
        .collect();
    let outcome = Outcome { scene, moved };
    let b = outcome.scene.bottleneck();
    eprintln!(
        "{senders} senders: moved {:?}, worst {:.3}, Jain {:.4}, utilisation {:.3}, \
         max queue {} B, marked {}, dropped {}",
        outcome.moved,
        outcome.worst_deviation(),
        outcome.jain(),
        outcome.utilisation(),
        b.max_queue,
        b.marked,
        b.dropped
    );
    outcome
}

#[test]
fn dcqcn_shares_a_marking_bottleneck_fairly_without_loss() {
    for senders in [2, 8] {
        let outcome = run_incast(senders, CongestionConfig::default(), 10 + senders as u64);
        let b = outcome.scene.bottleneck().clone();
        assert_eq!(b.dropped, 0, "{senders} senders");
        assert!(b.marked > 0);
        assert!(b.max_queue < LIMIT_BYTES);
        // The bottleneck stays busy.
        assert!(outcome.utilisation() > 0.95, "{:?}", outcome.moved);
        if senders == 2 {
            // Each of two flows within 10% of its fair share.
            assert!(outcome.worst_deviation() < 0.10, "{:?}", outcome.moved);
        } else {
            // Eight flows: close to fair as a whole, none far off.
            assert!(outcome.jain() > 0.98, "{:?}", outcome.moved);
            assert!(outcome.worst_deviation() < 0.25, "{:?}", outcome.moved);
        }
        let mut scene = outcome.scene;
        scene.sim.run_idle(LIMIT);
        let per_flow = scene.completed();
        assert!(
            per_flow
                .iter()
                .all(|(ok, failed)| *ok == per_flow[0].0 && failed.is_empty()),
            "{per_flow:?}"
        );
        for n in 0..senders {
            let counters = scene.sim.nodes[n].counters();
            assert_eq!(counters.retransmitted_packets, 0);
            assert!(counters.rp_cnp_handled > 0);
        }
    }
}

#[test]
fn without_dcqcn_the_same_bottleneck_drops_and_retransmits() {
    for senders in [2, 8] {
        let outcome = run_incast(senders, CongestionConfig::off(), 20 + senders as u64);
        let mut scene = outcome.scene;
        let b = scene.bottleneck().clone();
        assert!(b.dropped > 0, "{senders} senders");
        assert_eq!(b.marked, 0, "nothing is ECN-capable");
        scene.sim.run_idle(LIMIT);
        let retransmitted: u64 = (0..senders)
            .map(|n| scene.sim.nodes[n].counters().retransmitted_packets)
            .sum();
        assert!(retransmitted > 0);
        // Every WRITE completes. Those of a flow the others starve may run out of retries
        // (RETRY_EXC_ERR) and flush the rest of its queue: losses a sender sees, where with
        // DCQCN there are none.
        let per_flow = scene.completed();
        for (ok, failed) in &per_flow {
            assert_eq!(ok + failed.len(), per_flow[0].0 + per_flow[0].1.len());
            assert!(failed
                .iter()
                .all(|s| matches!(s, WcStatus::RetryExcErr | WcStatus::WrFlushErr)));
        }
    }
}
