//! Property tests of the wire layer: every header and every opcode round-trips both ways, and no
//! parser panics on arbitrary bytes.

use proptest::prelude::*;

use softroce::wire::frame::{EthernetRepr, UdpRepr, VlanTag};
use softroce::wire::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpPad, DethRepr, ExtHeader,
    ExtHeaders, Frame, FrameRepr, HeaderRepr, IcrcStatus, IethRepr, ImmDtRepr, IpRepr, Msn, Opcode,
    PKey, PacketRepr, Psn, QKey, Qpn, RKey, RethRepr, RocePacket, UdpChecksum,
};

fn opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::SUPPORTED)
}

prop_compose! {
    fn bth()(opcode in opcode(), solicited: bool, mig_req: bool, pad_count in 0u8..4,
             pkey: u16, fecn: bool, becn: bool, qpn in 0u32..1 << 24, ack_req: bool,
             psn in 0u32..1 << 24) -> BthRepr {
        BthRepr { opcode, solicited, mig_req, pad_count, pkey: PKey(pkey), fecn, becn,
                  dest_qp: Qpn::new(qpn), ack_req, psn: Psn::new(psn) }
    }
}

prop_compose! {
    fn reth()(virtual_address: u64, rkey: u32, dma_len: u32) -> RethRepr {
        RethRepr { virtual_address, rkey: RKey(rkey), dma_len }
    }
}

prop_compose! {
    fn aeth()(syndrome: u8, msn in 0u32..1 << 24) -> AethRepr {
        AethRepr { syndrome: AckSyndrome::from_byte(syndrome), msn: Msn::new(msn) }
    }
}

prop_compose! {
    fn deth()(qkey: u32, qpn in 0u32..1 << 24) -> DethRepr {
        DethRepr { qkey: QKey(qkey), src_qp: Qpn::new(qpn) }
    }
}

prop_compose! {
    fn atomic_eth()(virtual_address: u64, rkey: u32, swap_add: u64, compare: u64)
        -> AtomicEthRepr {
        AtomicEthRepr { virtual_address, rkey: RKey(rkey), swap_add, compare }
    }
}

prop_compose! {
    /// A packet of any supported opcode, with exactly the headers it requires.
    fn packet()(bth in bth(), reth in reth(), aeth in aeth(), deth in deth(), imm: u32,
                ieth: u32, atomic in atomic_eth(), orig: u64,
                payload in prop::collection::vec(any::<u8>(), 0..300)) -> (PacketRepr, Vec<u8>) {
        let info = bth.opcode.info().unwrap();
        let has = |h| info.headers.contains(&h);
        let ext = ExtHeaders {
            reth: has(ExtHeader::Reth).then_some(reth),
            aeth: has(ExtHeader::Aeth).then_some(aeth),
            deth: has(ExtHeader::Deth).then_some(deth),
            immdt: has(ExtHeader::ImmDt).then_some(ImmDtRepr { data: imm }),
            ieth: has(ExtHeader::Ieth).then_some(IethRepr { rkey: RKey(ieth) }),
            atomic_eth: has(ExtHeader::AtomicEth).then_some(atomic),
            atomic_ack_eth: has(ExtHeader::AtomicAckEth)
                .then_some(AtomicAckEthRepr { original_data: orig }),
        };
        let payload = if info.payload { payload } else { Vec::new() };
        (PacketRepr::new(bth, ext, payload.len()), payload)
    }
}

/// `parse(emit(x)) == x`.
fn repr_round_trip<H: HeaderRepr + PartialEq + std::fmt::Debug>(repr: H) {
    let mut bytes = vec![0u8; H::LEN];
    repr.emit_bytes(&mut bytes).unwrap();
    assert_eq!(H::parse_bytes(&bytes).unwrap(), repr);
}

/// `emit(parse(b)) == b` for bytes whose reserved bits are zero, and no panic on any bytes.
fn bytes_round_trip<H: HeaderRepr>(bytes: &[u8]) {
    if let Ok(repr) = H::parse_bytes(bytes) {
        let mut out = vec![0u8; H::LEN];
        repr.emit_bytes(&mut out).unwrap();
        assert_eq!(out, bytes[..H::LEN]);
    }
}

proptest! {
    #[test]
    fn headers_parse_what_they_emit(bth in bth(), reth in reth(), aeth in aeth(),
                                    deth in deth(), atomic in atomic_eth(), imm: u32,
                                    rkey: u32, orig: u64) {
        repr_round_trip(bth);
        repr_round_trip(reth);
        repr_round_trip(aeth);
        repr_round_trip(deth);
        repr_round_trip(atomic);
        repr_round_trip(ImmDtRepr { data: imm });
        repr_round_trip(IethRepr { rkey: RKey(rkey) });
        repr_round_trip(AtomicAckEthRepr { original_data: orig });
        repr_round_trip(CnpPad);
    }

    #[test]
    fn headers_emit_what_they_parse(mut bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        // Fields without reserved bits take any bytes.
        bytes_round_trip::<RethRepr>(&bytes);
        bytes_round_trip::<AethRepr>(&bytes);
        bytes_round_trip::<ImmDtRepr>(&bytes);
        bytes_round_trip::<IethRepr>(&bytes);
        bytes_round_trip::<AtomicEthRepr>(&bytes);
        bytes_round_trip::<AtomicAckEthRepr>(&bytes);
        // Reserved bits are sent as zero and not kept (IBTA 9.2, 9.3.2).
        if bytes.len() >= 12 {
            bytes[1] &= 0xf0; // TVer 0
            bytes[4] &= 0xc0; // FECN, BECN, reserved
            bytes[8] &= 0x80; // AckReq, reserved
        }
        bytes_round_trip::<BthRepr>(&bytes);
        if bytes.len() >= 8 {
            bytes[4] = 0;
        }
        bytes_round_trip::<DethRepr>(&bytes);
        bytes_round_trip::<CnpPad>(&vec![0u8; bytes.len()]);
    }

    #[test]
    fn every_opcode_round_trips((repr, payload) in packet()) {
        let mut bytes = vec![0u8; repr.buffer_len()];
        let n = repr.emit_with_payload(&mut bytes, &payload).unwrap();
        prop_assert_eq!(n, bytes.len());
        let packet = RocePacket::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(packet.payload(), &payload[..]);
        prop_assert_eq!(PacketRepr::parse(&packet).unwrap(), repr);
    }

    #[test]
    fn emit_writes_every_byte_over_whatever_the_buffer_held((repr, payload) in packet(), junk: u8) {
        // The transport builds each packet in the io layer's train, over an earlier packet's
        // bytes, and zeroes nothing first: every header byte, reserved bits included, the pad
        // and the ICRC must come from `emit` alone.
        let mut clean = vec![0u8; repr.buffer_len()];
        repr.emit_with_payload(&mut clean, &payload).unwrap();
        let mut reused = vec![junk; repr.buffer_len()];
        repr.emit_with_payload(&mut reused, &payload).unwrap();
        prop_assert_eq!(reused, clean);
    }

    #[test]
    fn packets_emit_what_they_parse((repr, payload) in packet(), icrc: u32) {
        // Build valid bytes, then check that parse-then-emit reproduces them, ICRC included.
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit_with_payload(&mut bytes, &payload).unwrap();
        RocePacket::new_checked(&mut bytes[..]).unwrap().set_icrc(icrc);
        let packet = RocePacket::new_checked(&bytes[..]).unwrap();
        let parsed = PacketRepr::parse(&packet).unwrap();
        let mut out = vec![0u8; parsed.buffer_len()];
        parsed.emit_with_payload(&mut out, packet.payload()).unwrap();
        RocePacket::new_checked(&mut out[..]).unwrap().set_icrc(packet.icrc());
        prop_assert_eq!(out, bytes);
    }

    #[test]
    fn frames_round_trip_with_a_valid_icrc((repr, payload) in packet(), v6: bool,
                                           vlan in prop::option::of((0u8..8, any::<bool>(), 0u16..4096)),
                                           ethernet: bool, src_port: u16, dscp in 0u8..64,
                                           ecn in 0u8..4, id: u16, df: bool, ttl: u8,
                                           flow in 0u32..1 << 20, a: [u8; 16], b: [u8; 16],
                                           udp_checksum: bool) {
        let ip = if v6 {
            IpRepr::V6 { src: a.into(), dst: b.into(), dscp, ecn, flow_label: flow, hop_limit: ttl }
        } else {
            IpRepr::V4 { src: [a[0], a[1], a[2], a[3]].into(), dst: [b[0], b[1], b[2], b[3]].into(),
                         dscp, ecn, identification: id, dont_fragment: df, ttl }
        };
        let frame = FrameRepr {
            ethernet: ethernet.then_some(EthernetRepr {
                src: [2, 0, 0, 0, 0, 1],
                dst: [2, 0, 0, 0, 0, 2],
                vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
            }),
            ip,
            udp: UdpRepr {
                src_port,
                dst_port: 4791,
                checksum: if udp_checksum { UdpChecksum::Computed } else { UdpChecksum::Zero },
            },
        };
        let mut bytes = vec![0u8; frame.buffer_len(&repr)];
        let n = frame.emit(&repr, &payload, &mut bytes).unwrap();
        let parsed = if ethernet { Frame::parse_ethernet(&bytes[..n]) } else { Frame::parse_ip(&bytes[..n]) }
            .unwrap();
        prop_assert_eq!(parsed.icrc_status(), IcrcStatus::Ok);
        // A computed UDP checksum that happens to be zero is sent as 0xffff (RFC 768), never 0.
        prop_assert_eq!(parsed.repr.udp.checksum == UdpChecksum::Zero, !udp_checksum);
        prop_assert_eq!(parsed.repr, frame);
        let parsed_packet = PacketRepr::parse(&parsed.packet).unwrap();
        prop_assert_eq!(parsed_packet, repr);
        let mut again = vec![0u8; n];
        parsed.repr.emit(&parsed_packet, parsed.packet.payload(), &mut again).unwrap();
        prop_assert_eq!(again, &bytes[..n]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(packet) = RocePacket::new_checked(&bytes[..]) {
            let _ = (packet.payload(), packet.pad(), packet.icrc(), packet.ext::<RethRepr>());
            let _ = PacketRepr::parse(&packet);
        }
        for parsed in [Frame::parse_ethernet(&bytes), Frame::parse_ip(&bytes),
                       Frame::parse_linux_sll(&bytes)].into_iter().flatten() {
            let _ = parsed.icrc_status();
        }
        #[cfg(feature = "cli")]
        if let Ok(capture) = softroce::capture::Capture::new(&bytes) {
            for record in capture.flatten() {
                let _ = softroce::decode::decode_record(&record, std::time::Duration::ZERO);
            }
        }
    }

    #[test]
    fn mutated_frames_never_panic((repr, payload) in packet(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>()) {
        let frame = FrameRepr {
            ethernet: Some(EthernetRepr { src: [2; 6], dst: [4; 6], vlan: None }),
            ip: IpRepr::V4 { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), dscp: 0,
                             ecn: 0, identification: 0, dont_fragment: true, ttl: 64 },
            udp: UdpRepr { src_port: 0xc000, dst_port: 4791, checksum: UdpChecksum::Zero },
        };
        let mut bytes = vec![0u8; frame.buffer_len(&repr)];
        frame.emit(&repr, &payload, &mut bytes).unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let len = cut.index(bytes.len() + 1);
        if let Ok(parsed) = Frame::parse_ethernet(&bytes[..len]) {
            let _ = parsed.icrc_status();
            let _ = PacketRepr::parse(&parsed.packet);
        }
    }
}
