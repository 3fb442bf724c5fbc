//! Property tests of the CM wire layer (`softroce::wire::cm`): a REQ, the most packed message,
//! round-trips field by field; every message parsed from arbitrary bytes emits back to bytes
//! that parse to the same message; and no parser panics on arbitrary input. And of the CM
//! state machine: a hostile peer's MADs, valid ones with any field changed among them, never
//! panic it, never grow it past its bounds, and are counted.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use proptest::prelude::*;

use softroce::cm::{CmConfig, CmEndpoint, ReqParams};
use softroce::wire::cm::{
    attr, CmMessage, CmPath, CmReq, CmReqRepr, CmaHeader, CmaHeaderRepr, PortSpace, ServiceId,
    MAD_LEN,
};
use softroce::wire::{PKey, Psn, QKey, Qpn};

prop_compose! {
    fn path()(local_lid: u16, remote_lid: u16, local_gid: u128, remote_gid: u128,
              flow_label in 0u32..1 << 20, packet_rate in 0u8..64, traffic_class: u8,
              hop_limit: u8, sl in 0u8..16, subnet_local: bool, local_ack_timeout in 0u8..32)
        -> CmPath {
        CmPath { local_lid, remote_lid, local_gid: Ipv6Addr::from(local_gid),
                 remote_gid: Ipv6Addr::from(remote_gid), flow_label, packet_rate, traffic_class,
                 hop_limit, sl, subnet_local, local_ack_timeout }
    }
}

prop_compose! {
    fn req()(ids in (any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>()),
             qpn in 0u32..1 << 24, depths in (any::<u8>(), any::<u8>()),
             eecns in (0u32..1 << 24, 0u32..1 << 24),
             timeouts in (0u8..32, 0u8..32), transport in 0u8..4, flags in any::<[bool; 4]>(),
             psn in 0u32..1 << 24, counts in (0u8..8, 0u8..8, 0u8..16, 0u8..8),
             pkey: u16, mtu in 0u8..16, primary_path in path(), alternate_path in path(),
             private_data in any::<[u8; 92]>()) -> CmReqRepr {
        let (local_comm_id, service_id, local_ca_guid, local_qkey) = ids;
        let (retry_count, rnr_retry_count, max_cm_retries, extended_transport_type) = counts;
        CmReqRepr {
            local_comm_id, service_id: ServiceId(service_id), local_ca_guid,
            local_qkey: QKey(local_qkey), local_qpn: Qpn::new(qpn),
            responder_resources: depths.0, local_eecn: eecns.0, initiator_depth: depths.1,
            remote_eecn: eecns.1, remote_cm_response_timeout: timeouts.0,
            transport_service_type: transport, end_to_end_flow_control: flags[0],
            starting_psn: Psn::new(psn), local_cm_response_timeout: timeouts.1, retry_count,
            pkey: PKey(pkey), path_mtu: mtu, rdc_exists: flags[1], rnr_retry_count,
            max_cm_retries, srq: flags[2], extended_transport_type, primary_path,
            alternate_path, sap_supported: flags[3], private_data,
        }
    }
}

/// A MAD with a CM header and one of the CM attributes, and any body.
fn cm_mad() -> impl Strategy<Value = [u8; MAD_LEN]> {
    let attrs = prop::sample::select(vec![
        attr::REQ,
        attr::MRA,
        attr::REJ,
        attr::REP,
        attr::RTU,
        attr::DREQ,
        attr::DREP,
        attr::SIDR_REQ,
        attr::SIDR_REP,
        attr::LAP,
    ]);
    (any::<[u8; MAD_LEN]>(), attrs).prop_map(|(mut mad, attr_id)| {
        mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        mad[16..18].copy_from_slice(&attr_id.to_be_bytes());
        mad
    })
}

proptest! {
    #[test]
    fn a_req_round_trips_every_field(req in req()) {
        let mut bytes = [0u8; 232];
        req.emit(&mut CmReq::new_unchecked(&mut bytes[..]));
        prop_assert_eq!(CmReqRepr::parse(&CmReq::new_checked(&bytes[..]).unwrap()).unwrap(), req);
    }

    /// Reserved bits are dropped on parse and written as zero, so the message a MAD holds, not
    /// its bytes, is what survives a round trip.
    #[test]
    fn every_message_reparses_to_itself(mad in cm_mad()) {
        let (header, message) = CmMessage::parse(&mad).unwrap();
        let mut out = [0u8; MAD_LEN];
        message.emit(header.tid, header.attr_mod, &mut out);
        let (again_header, again) = CmMessage::parse(&out).unwrap();
        prop_assert_eq!(again, message);
        prop_assert_eq!(again_header.tid, header.tid);
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMessage::parse(&bytes);
        if let Ok(view) = CmaHeader::new_checked(&bytes[..]) {
            let _ = CmaHeaderRepr::parse(&view);
        }
    }

    /// A listening CM fed a stream of MADs, each a REQ or another message from a real
    /// handshake with a few bytes changed, or noise with a CM header: no panic, never more
    /// connections than its bounds, and every MAD counted.
    #[test]
    fn a_hostile_peer_cannot_panic_or_grow_the_cm(
        changes in prop::collection::vec(
            (0usize..4, prop::collection::vec((0usize..MAD_LEN, any::<u8>()), 0..6), cm_mad(),
             0u64..10_000_000),
            1..60),
    ) {
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let config = CmConfig { max_pending: 8, max_connections: 16, ..CmConfig::default() };
        let mut server = CmEndpoint::new("10.0.0.2".parse().unwrap(), 2, config);
        server.listen(ServiceId::ip(PortSpace::Tcp, 7174)).unwrap();
        let mut client = CmEndpoint::new(peer, 1, CmConfig::default());
        let mut now = Duration::ZERO;
        for (kind, edits, noise, step) in &changes {
            now += Duration::from_micros(*step);
            let mut mad = match kind {
                0 => *noise,
                _ => {
                    let params = ReqParams::rc(
                        "10.0.0.2".parse().unwrap(),
                        ServiceId::ip(PortSpace::Tcp, 7174),
                        Qpn::new(0x100),
                        Psn::new(1),
                    );
                    let _ = client.connect(now, &params);
                    match client.poll_transmit() {
                        Some(out) => *out.mad,
                        None => *noise,
                    }
                }
            };
            for (at, value) in edits {
                mad[*at] = *value;
            }
            server.handle_mad(now, peer, &mad);
            server.handle_timeout(now);
            while let Some(out) = server.poll_transmit() {
                client.handle_mad(now, out.dst, &out.mad[..]);
            }
            while server.poll_event().is_some() {}
            prop_assert!(server.connections() <= 16 + 8);
        }
        prop_assert_eq!(server.counters().mads_received, changes.len() as u64);
    }
}
