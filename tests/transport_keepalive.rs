//! Keepalive (`transport::keepalive`), in the simulator: an idle RC QP whose peer has gone
//! silent notices it and fails, where it waited for ever (a QP that only waits for a SEND sent
//! nothing that could go unanswered); a peer that answers costs only the probes, which leave
//! the connection as it was; traffic that flows costs none.

mod sim;

use std::time::Duration;

use sim::rc::{connect, post_recv, post_send, sge, Options, Side, IOVA};
use sim::{drain, forge, seed, Faults, Sim};
use softroce::transport::{AsyncEvent, QpInit, QpState, QpType, SendOp, SendWr, WcStatus};
use softroce::wire::{AckSyndrome, AethRepr, BthRepr, ExtHeaders, Msn, NakCode, Opcode, Psn};

const INTERVAL: Duration = Duration::from_secs(1);

/// Two connected RC QPs, node 0's with keepalive every [`INTERVAL`].
fn kept_alive(seed: u64) -> (Sim, Side, Side) {
    let mut sim = Sim::new(2, seed, Faults::default());
    let [a, b] = connect(&mut sim, Options::default());
    let now = sim.now;
    sim.nodes[0]
        .set_keepalive(now, a.qpn, Some(INTERVAL))
        .unwrap();
    (sim, a, b)
}

/// Runs the simulation until `until` of virtual time, and no further: a timer due later is
/// not run.
fn run_to(sim: &mut Sim, until: Duration) {
    while sim.now < until {
        sim.step_with(Some(until));
    }
}

fn write(a: &Side, b: &Side, wr_id: u64) -> SendWr {
    let op = SendOp::Write {
        remote_addr: IOVA,
        rkey: b.mr.rkey(),
    };
    SendWr::new(wr_id, op, sge(a, 0, 8))
}

/// A peer that stops answering (its host died, or the path to it) is probed once the QP has
/// heard nothing for the interval, and after `retry_cnt` + 1 unanswered probes the QP fails:
/// `QpFatal` and ERROR, as a request whose retries ran out. Without keepalive it stayed in
/// RTS for ever.
#[test]
fn a_silent_peer_of_an_idle_qp_is_probed_and_the_qp_fails() {
    let (mut sim, a, _b) = kept_alive(seed(71));
    let start = sim.now;
    // The peer is gone: nothing of node 1's arrives from now on.
    sim.filter = Some(Box::new(|from, _| from != 1));
    let limit = start + Duration::from_secs(10);
    sim.run_until(limit, |s| {
        s.nodes[0].qp_state(a.qpn) == Some(QpState::Error)
    });
    let took = sim.now - start;
    // The interval and a sweep's quarter of it, then 8 probes 250 ms apart.
    let probes = Duration::from_millis(250) * 8;
    assert!(took >= INTERVAL + probes, "failed after {took:?}");
    assert!(
        took <= INTERVAL + INTERVAL / 4 + probes,
        "failed after {took:?}"
    );
    assert_eq!(
        sim.nodes[0].poll_event(),
        Some(AsyncEvent::QpFatal { qpn: a.qpn })
    );
    let counters = sim.nodes[0].counters();
    assert_eq!(
        (counters.keepalive_probes, counters.keepalive_failures),
        (8, 1)
    );
    // No request of the application's was involved: nothing completes.
    assert!(drain(&mut sim, 0, a.cq).is_empty());
}

/// A peer that answers: probes go out after each interval of silence, its duplicate-request
/// ACKs count as hearing from it, and the connection is as it was: the QP in RTS, no event,
/// no completion, and the next WRITE lands at the PSNs that follow.
#[test]
fn an_answering_peer_costs_only_the_probes() {
    let (mut sim, a, b) = kept_alive(seed(72));
    let start = sim.now;
    run_to(&mut sim, start + INTERVAL * 10);
    let probes = sim.nodes[0].counters().keepalive_probes;
    assert!(
        (6..=10).contains(&probes),
        "{probes} probes in 10 intervals"
    );
    assert_eq!(sim.nodes[1].counters().duplicate_requests, probes);
    assert_eq!(sim.nodes[0].counters().keepalive_failures, 0);
    assert_eq!(sim.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    assert_eq!(sim.nodes[0].poll_event(), None);
    assert!(drain(&mut sim, 0, a.cq).is_empty() && drain(&mut sim, 1, b.cq).is_empty());

    post_send(&mut sim, 0, &a, write(&a, &b, 1));
    let now = sim.now;
    run_to(&mut sim, now + Duration::from_millis(100));
    let done = drain(&mut sim, 0, a.cq);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, WcStatus::Success);
}

/// While the peer is heard from, nothing is probed: a SEND every 300 ms (under a third of the
/// interval) for 10 intervals sends no probe, and neither does a side that only receives them.
#[test]
fn traffic_that_flows_sends_no_probe() {
    let (mut sim, a, b) = kept_alive(seed(73));
    let now = sim.now;
    sim.nodes[1]
        .set_keepalive(now, b.qpn, Some(INTERVAL))
        .unwrap();
    for wr_id in 0..33 {
        post_recv(&mut sim, 1, &b, wr_id, 0, 64);
        post_send(
            &mut sim,
            0,
            &a,
            SendWr::new(wr_id, SendOp::Send, sge(&a, 0, 8)),
        );
        let now = sim.now;
        run_to(&mut sim, now + Duration::from_millis(300));
    }
    assert_eq!(drain(&mut sim, 1, b.cq).len(), 33);
    for node in 0..2 {
        assert_eq!(
            sim.nodes[node].counters().keepalive_probes,
            0,
            "node {node}"
        );
    }
}

/// Another QP's keepalive set again and again (a server accepting a connection every 200 ms)
/// put off the sweep that looks at every QP: a QP whose peer had died was never probed. The
/// sweep already due stays due.
#[test]
fn setting_another_qps_keepalive_does_not_put_off_the_sweep() {
    let (mut sim, a, _b) = kept_alive(seed(76));
    let start = sim.now;
    sim.filter = Some(Box::new(|from, _| from != 1));
    let pd = sim.nodes[0].alloc_pd();
    let other = sim.nodes[0].create_qp(sim::rc::rc_init(pd, a.cq)).unwrap();
    while sim.nodes[0].qp_state(a.qpn) == Some(QpState::Rts) {
        let now = sim.now;
        assert!(now < start + Duration::from_secs(10), "never failed");
        sim.nodes[0]
            .set_keepalive(now, other, Some(INTERVAL))
            .unwrap();
        run_to(&mut sim, now + Duration::from_millis(200));
    }
    assert!(
        sim.now - start <= INTERVAL * 4,
        "failed after {:?}",
        sim.now - start
    );
}

/// A request posted while the QP probes ends the probing: its own retries decide, and it
/// completes with RETRY_EXC_ERR, as without keepalive. Probing went on before, and failed the
/// QP first, flushing the request: here with an ACK timeout of 4.3 s, whose probes are as far
/// apart, a WRITE posted after the sixth probe was flushed at the eighth's timeout.
#[test]
fn a_request_posted_while_probing_is_left_to_its_own_retries() {
    let mut sim = Sim::new(2, seed(77), Faults::default());
    let options = Options {
        timeout: 20, // 4.3 s
        ..Options::default()
    };
    let [a, b] = connect(&mut sim, options);
    let start = sim.now;
    sim.nodes[0]
        .set_keepalive(start, a.qpn, Some(INTERVAL))
        .unwrap();
    sim.filter = Some(Box::new(|from, _| from != 1));
    while sim.nodes[0].counters().keepalive_probes < 6 {
        let now = sim.now;
        run_to(&mut sim, now + Duration::from_millis(100));
    }
    post_send(&mut sim, 0, &a, write(&a, &b, 9));
    sim.run_until(start + Duration::from_secs(120), |s| {
        s.nodes[0].qp_state(a.qpn) == Some(QpState::Error)
    });
    let done = drain(&mut sim, 0, a.cq);
    assert_eq!((done[0].wr_id, done[0].status), (9, WcStatus::RetryExcErr));
    assert_eq!(sim.nodes[0].counters().keepalive_failures, 0);
}

/// A peer may refuse a probe (a duplicate WRITE at a PSN an earlier READ took) with a NAK: a
/// sign of life, with nothing outstanding to fail, not a reason to kill a healthy QP.
#[test]
fn a_nak_answering_a_probe_is_a_sign_of_life() {
    let (mut sim, a, _b) = kept_alive(seed(78));
    let start = sim.now;
    // The peer's answers are held back, and a NAK at the probe's PSN answers each instead.
    sim.filter = Some(Box::new(|from, _| from != 1));
    let probe_psn = Options::default().psn[0] - 1;
    let nak = || {
        let bth = BthRepr::new(Opcode::RcAck, a.qpn, Psn::new(probe_psn));
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::Nak(NakCode::InvalidRequest),
                msn: Msn::new(0),
            }),
            ..Default::default()
        };
        forge(bth, ext, &[])
    };
    let mut naked = 0;
    while sim.now < start + INTERVAL * 8 {
        let probes = sim.nodes[0].counters().keepalive_probes;
        let now = sim.now;
        run_to(&mut sim, now + Duration::from_millis(100));
        if sim.nodes[0].counters().keepalive_probes > probes {
            sim.inject(1, 0, nak());
            naked += 1;
        }
    }
    assert!(naked >= 4, "{naked} probes");
    assert_eq!(sim.nodes[0].qp_state(a.qpn), Some(QpState::Rts));
    assert_eq!(sim.nodes[0].poll_event(), None);
}

/// Only RC has a peer that answers: keepalive is refused for a UC QP, and so is an interval
/// under 10 ms, whose sweeps would keep the engine busy.
#[test]
fn keepalive_is_for_rc_qps_and_a_real_interval() {
    let (mut sim, a, _b) = kept_alive(seed(74));
    let now = sim.now;
    for short in [Duration::ZERO, Duration::from_millis(9)] {
        assert!(sim.nodes[0].set_keepalive(now, a.qpn, Some(short)).is_err());
    }
    let (pd, cq) = (sim.nodes[0].alloc_pd(), a.cq);
    let uc = sim.nodes[0]
        .create_qp(QpInit {
            qp_type: QpType::Uc,
            ..sim::rc::rc_init(pd, cq)
        })
        .unwrap();
    assert!(sim.nodes[0].set_keepalive(now, uc, Some(INTERVAL)).is_err());
}
