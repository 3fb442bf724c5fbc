//! Keepalive (`transport::keepalive`), in the simulator: an idle RC QP whose peer has gone
//! silent notices it and fails, where it waited for ever (a QP that only waits for a SEND sent
//! nothing that could go unanswered); a peer that answers costs only the probes, which leave
//! the connection as it was; traffic that flows costs none.

mod sim;

use std::time::Duration;

use sim::rc::{connect, post_recv, post_send, sge, Options, Side, IOVA};
use sim::{drain, seed, Faults, Sim};
use softroce::transport::{AsyncEvent, QpInit, QpState, QpType, SendOp, SendWr, WcStatus};

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

/// Runs the simulation until `until` of virtual time.
fn run_to(sim: &mut Sim, until: Duration) {
    sim.run_until(until + Duration::from_secs(1), |s| s.now >= until);
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

/// Only RC has a peer that answers: keepalive is refused for a UC QP, and so is an interval of
/// zero.
#[test]
fn keepalive_is_for_rc_qps_and_a_real_interval() {
    let (mut sim, a, _b) = kept_alive(seed(74));
    let now = sim.now;
    assert!(sim.nodes[0]
        .set_keepalive(now, a.qpn, Some(Duration::ZERO))
        .is_err());
    let (pd, cq) = (sim.nodes[0].alloc_pd(), a.cq);
    let uc = sim.nodes[0]
        .create_qp(QpInit {
            qp_type: QpType::Uc,
            ..sim::rc::rc_init(pd, cq)
        })
        .unwrap();
    assert!(sim.nodes[0].set_keepalive(now, uc, Some(INTERVAL)).is_err());
}
