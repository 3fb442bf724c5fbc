//! Published ICRC test vectors: scapy's `test/contrib/roce.uts` holds a UC SEND_ONLY built from
//! fields, whose ICRC is 78 f3 53 f3 on the wire, and a CNP captured from a ConnectX-4 Lx, whose
//! ICRC is 82 fd 00 2a.

use std::net::{Ipv4Addr, SocketAddrV4};

use softroce::wire::frame::{EthernetRepr, UdpRepr};
use softroce::wire::{
    BthRepr, ExtHeaders, Frame, FrameRepr, IcrcStatus, IpRepr, KernelFraming, Opcode, PacketRepr,
    Psn, Qpn, UdpChecksum,
};

fn hex_fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/packet-fixtures/vectors/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let digits: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn connectx_cnp_parses_verifies_and_re_emits() {
    let bytes = hex_fixture("connectx4lx_cnp.hex");
    assert_eq!(bytes.len(), 74);
    let frame = Frame::parse_ethernet(&bytes).unwrap();
    let bth = frame.packet.bth();
    assert_eq!(bth.opcode(), Opcode::Cnp);
    assert!(bth.becn());
    assert_eq!(bth.dest_qp(), Qpn::new(0x118));
    assert_eq!(frame.packet.icrc().to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(frame.icrc_status(), IcrcStatus::Ok);
    assert_eq!(frame.repr.udp.checksum, UdpChecksum::Zero);

    let repr = PacketRepr::parse(&frame.packet).unwrap();
    let mut out = vec![0u8; frame.repr.buffer_len(&repr)];
    let n = frame
        .repr
        .emit(&repr, frame.packet.payload(), &mut out)
        .unwrap();
    assert_eq!(&out[..n], &bytes[..]);
}

#[test]
fn a_flipped_bit_fails_the_icrc_but_a_masked_field_does_not() {
    let mut bytes = hex_fixture("connectx4lx_cnp.hex");
    // TTL (IPv4 byte 8) is masked: a router may decrement it. Its header checksum is masked too.
    bytes[14 + 8] = 1;
    assert_eq!(
        Frame::parse_ethernet(&bytes).unwrap().icrc_status(),
        IcrcStatus::Ok
    );
    // The IPv4 identification is covered.
    bytes[14 + 5] ^= 1;
    let status = Frame::parse_ethernet(&bytes).unwrap().icrc_status();
    assert!(
        matches!(
            status,
            IcrcStatus::Bad {
                received: 0x2a00_fd82,
                ..
            }
        ),
        "{status:?}"
    );
}

fn scapy_uc_send_only() -> (FrameRepr, PacketRepr, Vec<u8>) {
    let payload = b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P".to_vec();
    let bth = BthRepr {
        mig_req: true,
        ..BthRepr::new(Opcode::UcSendOnly, Qpn::new(211), Psn::new(13_571_856))
    };
    let packet = PacketRepr::new(bth, ExtHeaders::default(), payload.len());
    let mac = [0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22];
    let frame = FrameRepr {
        ethernet: Some(EthernetRepr {
            src: mac,
            dst: mac,
            vlan: None,
        }),
        ip: IpRepr::V4 {
            src: Ipv4Addr::new(192, 168, 0, 7),
            dst: Ipv4Addr::new(192, 168, 0, 7),
            dscp: 0,
            ecn: 1,
            identification: 1144,
            dont_fragment: true,
            ttl: 64,
        },
        udp: UdpRepr {
            src_port: 49152,
            dst_port: 4791,
            checksum: UdpChecksum::Zero,
        },
    };
    (frame, packet, payload)
}

#[test]
fn scapy_uc_send_only_icrc() {
    let (frame, packet, payload) = scapy_uc_send_only();
    assert_eq!(packet.bth.pad_count, 2, "18 payload bytes take 2 pad bytes");
    let mut out = vec![0u8; frame.buffer_len(&packet)];
    let n = frame.emit(&packet, &payload, &mut out).unwrap();
    assert_eq!(n, 14 + 64, "scapy's IPv4 total length is 64");
    assert_eq!(&out[n - 4..n], [0x78, 0xf3, 0x53, 0xf3]);
    assert_eq!(
        u16::from_be_bytes([out[24], out[25]]),
        0xb4d5,
        "scapy's IPv4 checksum"
    );
    let parsed = Frame::parse_ethernet(&out[..n]).unwrap();
    assert_eq!(parsed.icrc_status(), IcrcStatus::Ok);
    assert!(parsed.packet.bth().mig_req());
}

#[test]
fn kernel_framing_matches_a_frame_with_id_zero_and_df() {
    // A datagram sent through an unconnected UDP socket with IP_PMTUDISC_DO: ID 0, DF.
    let (mut frame, packet, payload) = scapy_uc_send_only();
    frame.ethernet = None;
    let IpRepr::V4 { identification, .. } = &mut frame.ip else {
        unreachable!()
    };
    *identification = 0;
    let mut out = vec![0u8; frame.buffer_len(&packet)];
    let n = frame.emit(&packet, &payload, &mut out).unwrap();
    let roce = &out[28..n];

    let framing = KernelFraming::V4 {
        src: SocketAddrV4::new(Ipv4Addr::new(192, 168, 0, 7), 49152),
        dst: SocketAddrV4::new(Ipv4Addr::new(192, 168, 0, 7), 4791),
    };
    assert_eq!(framing.verify(roce), IcrcStatus::Ok);
    let mut sealed = roce.to_vec();
    sealed[roce.len() - 4..].fill(0);
    framing.seal(&mut sealed);
    assert_eq!(sealed, roce);
}
