//! MADs from three peers, as a hostile network hands them to QP1, with the application's
//! answers drawn from the input too: the CM never panics, never holds more than its bounds,
//! and answers one MAD with a few at most (no amplification).
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softroce::cm::{CmConfig, CmEndpoint, CmEvent, RepParams, MAX_HELD_REQS, RDMA_UDP_QKEY};
use softroce::wire::cm::{PortSpace, RejReason, ServiceId, MAD_LEN};
use softroce::wire::Qpn;

/// Each record: the sender (one of three), a time step, and up to a MAD's bytes.
const RECORD: usize = 2 + MAD_LEN;

fuzz_target!(|data: &[u8]| {
    let config = CmConfig {
        response_timeout: 8,
        max_retries: 2,
        max_pending: 4,
        max_connections: 8,
        listen_grace: Duration::from_millis(10),
        packet_life_time: 4,
    };
    let mut cm = CmEndpoint::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)), 7, config);
    cm.listen(ServiceId::ip(PortSpace::Tcp, 7174)).unwrap();
    cm.listen(ServiceId::ip(PortSpace::Udp, 7174)).unwrap();
    let mut now = Duration::ZERO;
    for record in data.chunks(RECORD) {
        let (head, mad) = record.split_at(2.min(record.len()));
        let who = head.first().copied().unwrap_or(0);
        let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + who % 3));
        now += Duration::from_micros(u64::from(head.get(1).copied().unwrap_or(0)) << 8);
        // A listener that appears later takes the REQs held for it.
        if who & 0x20 != 0 {
            let _ = cm.listen(ServiceId::ip(PortSpace::Tcp, 7175));
        }
        cm.handle_mad(now, peer, mad);
        cm.handle_timeout(now);
        while let Some(event) = cm.poll_event() {
            match event {
                CmEvent::ConnectRequest { conn, .. } if who & 0x10 == 0 => {
                    let rep = RepParams {
                        local_qpn: Qpn::new(0x100),
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        srq: false,
                        private_data: b"",
                    };
                    cm.accept(now, conn, &rep).unwrap();
                }
                CmEvent::ConnectRequest { conn, .. } => {
                    cm.reject(now, conn, RejReason::CONSUMER_DEFINED, b"no")
                        .unwrap();
                }
                CmEvent::SidrRequest { id, .. } => {
                    cm.sidr_reply(now, id, Ok((Qpn::new(0x200), RDMA_UDP_QKEY)), b"")
                        .unwrap();
                }
                _ => {}
            }
        }
        let mut answers = 0;
        while cm.poll_transmit().is_some() {
            answers += 1;
        }
        // One answer to the MAD, at most one retransmission per timer that fired, and the
        // answers to REQs held for a listener (earlier MADs', each answered once).
        assert!(answers <= 1 + 8 + 4 + MAX_HELD_REQS, "{answers} MADs for one");
        assert!(cm.connections() <= 8 + 4);
    }
});
