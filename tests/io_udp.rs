//! The UDP backend on loopback: softroce packets between two backends on 127.0.0.x arrive whole,
//! in order, with their ICRC verified (the IPv4 ID solved), whether they travel as segmented
//! trains or one by one, and whatever the receive budget; corrupt ones are reported bad. IPv6
//! on ::1 when the machine has it. Each test binds its own addresses, so they run in parallel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use softroce::io::{Backend, UdpBackend, UdpConfig};
use softroce::wire::{
    solve_ipv4_id, AckSyndrome, AethRepr, BthRepr, ExtHeaders, IcrcStatus, KernelFraming, Msn,
    Opcode, PacketRepr, Psn, Qpn, RKey, RethRepr, ROCEV2_UDP_PORT,
};

fn packet(opcode: Opcode, psn: u32, ext: ExtHeaders, payload: usize) -> Vec<u8> {
    let repr = PacketRepr::new(
        BthRepr::new(opcode, Qpn::new(0x11), Psn::new(psn)),
        ext,
        payload,
    );
    let mut bytes = vec![0u8; repr.buffer_len()];
    let data: Vec<u8> = (0..payload).map(|i| (i + psn as usize) as u8).collect();
    repr.emit_with_payload(&mut bytes, &data).unwrap();
    bytes
}

/// A 64 KiB RDMA WRITE at MTU 4096 (FIRST, 14 MIDDLE, LAST), then ACKs and a short SEND:
/// trains of equal packets, a bigger first one, shorter last ones, and small packets.
fn traffic() -> Vec<Vec<u8>> {
    let reth = ExtHeaders {
        reth: Some(RethRepr {
            virtual_address: 0x1000,
            rkey: RKey(7),
            dma_len: 65536,
        }),
        ..ExtHeaders::default()
    };
    let mut out = vec![packet(Opcode::RcWriteFirst, 0, reth, 4096)];
    for psn in 1..15 {
        out.push(packet(
            Opcode::RcWriteMiddle,
            psn,
            ExtHeaders::default(),
            4096,
        ));
    }
    out.push(packet(Opcode::RcWriteLast, 15, ExtHeaders::default(), 4096));
    for psn in 0..4 {
        let ack = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: Msn::new(psn),
            }),
            ..ExtHeaders::default()
        };
        out.push(packet(Opcode::RcAck, psn, ack, 0));
    }
    out.push(packet(Opcode::RcSendOnly, 16, ExtHeaders::default(), 33));
    out
}

/// What a receiver got: source, destination, ICRC status and bytes of each datagram.
type Got = Vec<(IpAddr, IpAddr, IcrcStatus, Vec<u8>)>;

/// Receives until `count` datagrams are in, `budget` at a time, for at most two seconds.
fn receive(backend: &mut UdpBackend, count: usize, budget: usize) -> Got {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < count && Instant::now() < deadline {
        let handed = backend
            .receive(budget, &mut |d| {
                assert!(d.ip_header.is_none(), "a UDP socket has no IP header");
                got.push((d.src, d.dst, d.icrc, d.packet.to_vec()))
            })
            .unwrap();
        assert!(handed <= budget);
        if handed == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Sends `traffic()` from `a` to `b` in one burst and checks what arrives.
fn exchange(a: &mut UdpBackend, b: &mut UdpBackend, budget: usize) {
    let before = a.counters();
    let mut sent = traffic();
    for p in &mut sent {
        a.send(b.local_addr(), p).unwrap();
    }
    a.flush().unwrap();
    let got = receive(b, sent.len(), budget);
    assert_eq!(got.len(), sent.len());
    for (i, ((src, dst, icrc, bytes), sealed)) in got.iter().zip(&sent).enumerate() {
        assert_eq!((*src, *dst), (a.local_addr(), b.local_addr()), "packet {i}");
        assert_eq!(*icrc, IcrcStatus::Ok, "packet {i}");
        assert_eq!(bytes, sealed, "packet {i}");
    }
    assert_eq!(a.counters().sent - before.sent, sent.len() as u64);
    assert_eq!(a.counters().send_dropped, 0);
}

fn v4(last: u8) -> IpAddr {
    Ipv4Addr::new(127, 0, 0, last).into()
}

#[test]
fn segmented_trains_arrive_whole_in_order_and_verified() {
    let mut a = UdpBackend::bind(v4(3)).unwrap();
    let mut b = UdpBackend::bind(v4(4)).unwrap();
    for budget in [64, 3, 1] {
        exchange(&mut a, &mut b, budget);
        exchange(&mut b, &mut a, budget);
    }
    assert_eq!(b.counters().received, 3 * traffic().len() as u64);
    assert_eq!(b.counters().foreign, 0);
}

/// The receive budget bounds every datagram taken off the socket, not only the RoCE packets
/// handed over: empty and foreign datagrams were skipped without counting, so a flood of them
/// kept the engine receiving and starved transmission, timers and commands.
#[test]
fn a_flood_of_empty_datagrams_counts_against_the_budget() {
    let mut a = UdpBackend::bind(v4(40)).unwrap();
    let mut b = UdpBackend::bind(v4(41)).unwrap();
    let flood = std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 42), 0)).unwrap();
    for _ in 0..200 {
        flood
            .send_to(&[], (Ipv4Addr::new(127, 0, 0, 41), 4791))
            .unwrap();
    }
    let mut real = packet(Opcode::RcSendOnly, 1, ExtHeaders::default(), 16);
    a.send(b.local_addr(), &mut real).unwrap();
    a.flush().unwrap();
    let mut delivered = 0;
    let taken = b.receive(64, &mut |_| delivered += 1).unwrap();
    assert_eq!(
        (taken, delivered),
        (64, 0),
        "the first turn is spent on the flood"
    );
    let mut turns = 1;
    while delivered == 0 {
        assert!(turns < 10, "the real packet never came");
        b.receive(64, &mut |_| delivered += 1).unwrap();
        turns += 1;
    }
    assert_eq!(
        turns, 4,
        "200 empty datagrams, then the packet: four turns of 64"
    );
    assert_eq!(b.counters().foreign, 200);
}

#[test]
fn one_datagram_per_send_when_segmentation_is_off() {
    let config = |last| UdpConfig {
        segmentation: false,
        ..UdpConfig::new(v4(last))
    };
    let mut a = UdpBackend::with_config(config(5)).unwrap();
    let mut b = UdpBackend::with_config(config(6)).unwrap();
    exchange(&mut a, &mut b, 64);
}

#[test]
fn a_full_queue_is_sent_without_waiting_for_flush() {
    let mut a = UdpBackend::bind(v4(7)).unwrap();
    let mut b = UdpBackend::bind(v4(8)).unwrap();
    // Far more than the queue holds: send must push the queue out by itself. Loopback delivers
    // during the send, so what was pushed out is waiting at once.
    let mut sent = Vec::new();
    let mut got = Vec::new();
    let take = |b: &mut UdpBackend, got: &mut Got| {
        b.receive(1000, &mut |d| {
            got.push((d.src, d.dst, d.icrc, d.packet.to_vec()))
        })
        .unwrap()
    };
    for psn in 0..400 {
        let mut p = packet(Opcode::RcSendMiddle, psn, ExtHeaders::default(), 4096);
        a.send(b.local_addr(), &mut p).unwrap();
        sent.push(p);
        if psn % 50 == 49 {
            // Drain as we go, so the receive buffer never overflows.
            take(&mut b, &mut got);
        }
    }
    let before_flush = got.len();
    assert!(before_flush >= 300, "{before_flush} arrived before flush");
    a.flush().unwrap();
    take(&mut b, &mut got);
    assert_eq!(got.len(), sent.len());
    for ((_, _, icrc, bytes), sealed) in got.iter().zip(&sent) {
        assert_eq!(*icrc, IcrcStatus::Ok);
        assert_eq!(bytes, sealed);
    }
}

/// `room` promises only `MAX_PACKET_LEN` bytes; a caller's longer packet (a UDP payload may be
/// up to 65,507 bytes) must still go out however full the queue is, not be counted too big
/// because the queue happened to be nearly full.
#[test]
fn a_packet_longer_than_the_room_is_sent_after_a_flush() {
    let mut a = UdpBackend::bind(v4(12)).unwrap();
    let b = UdpBackend::bind(v4(13)).unwrap();
    // 128 packets of 4,112 bytes leave 6,144 of the queue: more than MAX_PACKET_LEN, less
    // than the long packet.
    for psn in 0..128 {
        let mut p = packet(Opcode::RcSendMiddle, psn, ExtHeaders::default(), 4096);
        a.send(b.local_addr(), &mut p).unwrap();
    }
    let mut long = packet(Opcode::RcSendMiddle, 128, ExtHeaders::default(), 6400);
    a.send(b.local_addr(), &mut long).unwrap();
    a.flush().unwrap();
    let counters = a.counters();
    assert_eq!(
        (counters.sent, counters.send_too_big),
        (129, 0),
        "{counters:?}"
    );
}

/// A packet to `qpn`, numbered `psn`.
fn to_qp(qpn: u32, psn: u32) -> Vec<u8> {
    let repr = PacketRepr::new(
        BthRepr::new(Opcode::RcSendOnly, Qpn::new(qpn), Psn::new(psn)),
        ExtHeaders::default(),
        64,
    );
    let mut bytes = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut bytes, &[psn as u8; 64])
        .unwrap();
    bytes
}

/// Three sockets bound to one address in a reuse-port group, with the steering program: each
/// datagram reaches the socket of its DestQP's engine (`Lane::owner`: QP1 the first, the rest
/// by number modulo 3). The packets go in one flush, QPs interleaved, from a sender that cuts
/// its trains per QP (`UdpConfig::trains_per_qp`, as a device of several engines does), so
/// this also shows why it must: the kernel steers a train whole, by its first datagram. A
/// datagram too short to hold a DestQP goes to the first socket, whose endpoint drops and
/// counts it.
#[test]
fn a_reuse_port_group_steers_each_datagram_to_its_qps_engine() {
    use softroce::transport::Lane;

    let config = UdpConfig {
        reuse_port: true,
        ..UdpConfig::new(v4(130))
    };
    let mut engines: Vec<UdpBackend> = (0..3)
        .map(|_| UdpBackend::with_config(config).unwrap())
        .collect();
    engines[0].steer_by_dest_qp(3).unwrap();
    let mut sender = UdpBackend::with_config(UdpConfig {
        trains_per_qp: true,
        ..UdpConfig::new(v4(131))
    })
    .unwrap();
    let qpns = [1, 0x12, 0x12, 0x13, 0x14, 0x14, 0x14, 0x13, 0xff_fffe, 1];
    for (psn, &qpn) in qpns.iter().enumerate() {
        sender.send(v4(130), &mut to_qp(qpn, psn as u32)).unwrap();
    }
    sender.flush().unwrap();
    for (index, engine) in engines.iter_mut().enumerate() {
        let expected: Vec<(u32, u32)> = (qpns.iter().enumerate())
            .filter(|&(_, &qpn)| Lane::owner(Qpn::new(qpn), 3) as usize == index)
            .map(|(psn, &qpn)| (qpn, psn as u32))
            .collect();
        let got: Vec<(u32, u32)> = receive(engine, expected.len(), 64)
            .iter()
            .map(|(_, _, icrc, bytes)| {
                assert_eq!(*icrc, IcrcStatus::Ok);
                let bth = softroce::wire::Bth::new_checked(&bytes[..]).unwrap();
                (bth.dest_qp().value(), bth.psn().value())
            })
            .collect();
        assert_eq!(got, expected, "engine {index}");
    }
    let runt = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 131), 0)).unwrap();
    let to = (Ipv4Addr::new(127, 0, 0, 130), ROCEV2_UDP_PORT);
    runt.send_to(&[0x64, 0, 0, 0, 0], to).unwrap();
    let got = receive(&mut engines[0], 1, 64);
    assert_eq!(got.len(), 1, "the runt went to the first engine");
    assert_eq!(got[0].3, [0x64, 0, 0, 0, 0]);
}

/// Equal packets to several QPs of one peer process (QP numbers of one low byte, its place in
/// its address's group) leave in one segmentation train, one system call, and arrive whole, in
/// order, verified (the kernel numbers the IPv4 IDs across the train, whatever the QPs); a
/// shorter one closes the train. A train ends where the low byte changes (another process on
/// the peer's address: the kernel steers a train whole), and with `trains_per_qp` where the QP
/// changes. (`io::udp`, "Batching" and "Several engines"; `io::group`.)
#[test]
fn equal_packets_to_several_qps_share_a_train_unless_cut_per_qp() {
    let mut b = UdpBackend::bind(v4(133)).unwrap();
    // (cut per QP, the sender's address, the step between QP numbers, the calls for 10).
    for (per_qp, last, step, calls) in [
        (false, 134, 0x100, 2),
        (true, 135, 0x100, 10),
        (false, 136, 1, 10),
    ] {
        let mut a = UdpBackend::with_config(UdpConfig {
            trains_per_qp: per_qp,
            ..UdpConfig::new(v4(last))
        })
        .unwrap();
        // Eight QPs, one packet each; a shorter one, which ends the train; one more.
        let mut sent: Vec<Vec<u8>> = (0..8).map(|k| to_qp(0x11 + k * step, k)).collect();
        sent.push(packet(Opcode::RcSendOnly, 8, ExtHeaders::default(), 4));
        sent.push(to_qp(0x11, 9));
        for p in &mut sent {
            a.send(b.local_addr(), p).unwrap();
        }
        a.flush().unwrap();
        let counters = a.counters();
        assert_eq!(
            (counters.sent, counters.sends),
            (10, calls),
            "per QP: {per_qp}, step {step}"
        );
        let got = receive(&mut b, sent.len(), 64);
        assert_eq!(got.len(), sent.len(), "per QP: {per_qp}");
        for (i, ((src, _, icrc, bytes), sealed)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(*src, a.local_addr());
            assert_eq!(*icrc, IcrcStatus::Ok, "packet {i}, per QP: {per_qp}");
            assert_eq!(bytes, sealed, "packet {i}, per QP: {per_qp}");
        }
        // Each packet is sealed for the IPv4 ID the kernel gives its place in its train (the
        // ID its ICRC solves for): 0 to 8 in the first train, 0 in the next; 0 for every
        // packet when each is a train of its own.
        let at = |ip: IpAddr| match ip {
            IpAddr::V4(ip) => SocketAddrV4::new(ip, ROCEV2_UDP_PORT),
            IpAddr::V6(_) => unreachable!(),
        };
        let ids: Vec<Option<u16>> = (got.iter())
            .map(|(src, dst, _, bytes)| solve_ipv4_id(at(*src), at(*dst), bytes))
            .collect();
        let expected: Vec<Option<u16>> = if calls == 10 {
            vec![Some(0); 10]
        } else {
            (0..9).chain([0]).map(Some).collect()
        };
        assert_eq!(ids, expected, "per QP: {per_qp}, step {step}");
    }
}

#[test]
fn corruption_is_bad_and_any_id_is_ok() {
    let mut b = UdpBackend::bind(v4(10)).unwrap();
    // A plain UDP socket on 4791, as another RoCE stack would send from.
    let peer = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), ROCEV2_UDP_PORT);
    let socket = UdpSocket::bind(peer).unwrap();
    let to = SocketAddr::new(b.local_addr(), ROCEV2_UDP_PORT);
    let framing = KernelFraming::V4 {
        src: peer,
        dst: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 10), ROCEV2_UDP_PORT),
    };
    let mut good = packet(Opcode::RcSendOnly, 1, ExtHeaders::default(), 200);
    framing.seal(&mut good);
    let mut bad = good.clone();
    bad[40] ^= 0x10;
    // Sealed for an ID the kernel does not write: the solver cannot tell which ID was on the
    // wire, only that one ID makes the ICRC right.
    let mut other_id = packet(Opcode::RcSendOnly, 2, ExtHeaders::default(), 200);
    framing.seal_with_ipv4_id(&mut other_id, 0x4d2);
    for p in [&good, &bad, &other_id] {
        socket.send_to(p, to).unwrap();
    }
    let got = receive(&mut b, 3, 64);
    let statuses: Vec<_> = got.iter().map(|g| g.2.as_str()).collect();
    assert_eq!(statuses, ["ok", "bad", "ok"]);
}

#[test]
fn dscp_and_ecn_are_checked_and_set() {
    let bad = UdpConfig {
        dscp: 64,
        ..UdpConfig::new(v4(11))
    };
    let err = UdpBackend::with_config(bad).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let unspecified = UdpBackend::bind(Ipv4Addr::UNSPECIFIED.into()).unwrap_err();
    assert_eq!(unspecified.kind(), std::io::ErrorKind::InvalidInput);
    // ECT(0) and DSCP 26 (AF31): TOS and ECN are masked out of the ICRC, so traffic still
    // verifies; the raw backend's test reads the byte off the wire.
    let marked = |last| UdpConfig {
        dscp: 26,
        ecn: 2,
        ..UdpConfig::new(v4(last))
    };
    let mut a = UdpBackend::with_config(marked(11)).unwrap();
    let mut b = UdpBackend::with_config(marked(12)).unwrap();
    exchange(&mut a, &mut b, 64);
}

/// Held by each test that binds RoCEv2's port on `::1`, IPv6's only loopback address: run
/// together, two of them raced for it, and one failed with "address already in use".
static IPV6_LOOPBACK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// IPv6 on `::1`. A host with no IPv6 loopback fails this test, with the reason, rather than
/// passing it unrun.
#[test]
fn ipv6_on_the_loopback() {
    let _port = IPV6_LOOPBACK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // ::1 is IPv6's only loopback address: the backend talks to itself.
    let mut a = UdpBackend::bind(Ipv6Addr::LOCALHOST.into())
        .expect("this test needs an IPv6 loopback address (::1)");
    let mut sent = traffic();
    for p in &mut sent {
        a.send(Ipv6Addr::LOCALHOST.into(), p).unwrap();
    }
    a.flush().unwrap();
    let got = receive(&mut a, sent.len(), 7);
    assert_eq!(got.len(), sent.len());
    for ((src, _, icrc, bytes), sealed) in got.iter().zip(&sent) {
        assert_eq!(*src, IpAddr::from(Ipv6Addr::LOCALHOST));
        assert_eq!(*icrc, IcrcStatus::Ok);
        assert_eq!(bytes, sealed);
    }
}

/// rxe sends RoCE over IPv6 with a UDP checksum of 0 (rxe_net.c, `prepare_udp_hdr`), which
/// Linux drops unless the socket sets `UDP_NO_CHECK6_RX`: the backend must take them. Sent
/// through a raw socket, which writes the UDP header as given, and so needs CAP_NET_RAW.
#[test]
#[ignore = "needs CAP_NET_RAW for a raw IPv6 socket: .ci/run runs it as root"]
fn zero_checksum_ipv6_datagrams_arrive() {
    use socket2::{Domain, Protocol, Socket, Type};

    let _port = IPV6_LOOPBACK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut backend = UdpBackend::bind(Ipv6Addr::LOCALHOST.into())
        .expect("this test needs an IPv6 loopback address (::1)");
    let raw = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::UDP))
        .expect("this test needs CAP_NET_RAW: run it as root");
    let source_port = 0xc011;
    let mut roce = packet(Opcode::RcSendOnly, 99, ExtHeaders::default(), 64);
    let framing = KernelFraming::V6 {
        src: SocketAddrV6::new(Ipv6Addr::LOCALHOST, source_port, 0, 0),
        dst: SocketAddrV6::new(Ipv6Addr::LOCALHOST, ROCEV2_UDP_PORT, 0, 0),
    };
    framing.seal(&mut roce);
    let mut datagram = Vec::new();
    datagram.extend_from_slice(&source_port.to_be_bytes());
    datagram.extend_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
    datagram.extend_from_slice(&(8 + roce.len() as u16).to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(&roce);
    let to = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
    raw.send_to(&datagram, &to.into()).unwrap();
    let got = receive(&mut backend, 1, 7);
    assert_eq!(got.len(), 1, "the zero-checksum datagram was dropped");
    assert_eq!((got[0].2, &got[0].3), (IcrcStatus::Ok, &roce));
}

/// Receives until `count` datagrams are in, for at most two seconds: each one's opcode and
/// the TOS or traffic class byte it arrived with.
fn receive_classes(backend: &mut UdpBackend, count: usize) -> Vec<(Opcode, u8)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < count && Instant::now() < deadline {
        let handed = backend
            .receive(64, &mut |d| {
                got.push((Opcode::from_u8(d.packet[0]), d.traffic_class));
            })
            .unwrap();
        if handed == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// A CNP to QP 0x11, its ICRC left zero.
fn cnp() -> Vec<u8> {
    let mut bth = BthRepr::new(Opcode::Cnp, Qpn::new(0x11), Psn::new(0));
    bth.becn = true;
    let repr = PacketRepr::new(bth, ExtHeaders::default(), 0);
    let mut bytes = vec![0u8; repr.buffer_len()];
    repr.emit(&mut bytes).unwrap();
    bytes
}

/// RoCE packets leave ECT(0) by default, CNPs with DSCP 48 and ECT(0), TOS 0xc2 as a
/// ConnectX-4 Lx sends them (a train of their own, with the class in a control message), and each datagram's byte is read on
/// arrival (`IP_RECVTOS`, `IPV6_RECVTCLASS`): a CE mark shows. IPv4 and IPv6.
#[test]
fn ecn_is_sent_and_the_traffic_class_read() {
    for (a_addr, b_addr) in [
        (v4(13), v4(14)),
        (Ipv6Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()),
    ] {
        let _port = a_addr.is_ipv6().then(|| {
            IPV6_LOOPBACK
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        let mut a = UdpBackend::bind(a_addr).unwrap();
        let mut b = if a_addr == b_addr {
            None
        } else {
            Some(UdpBackend::bind(b_addr).unwrap())
        };
        let mut sent = vec![
            packet(Opcode::RcSendOnly, 1, ExtHeaders::default(), 64),
            cnp(),
            packet(Opcode::RcSendOnly, 2, ExtHeaders::default(), 64),
        ];
        for p in &mut sent {
            a.send(b_addr, p).unwrap();
        }
        a.flush().unwrap();
        let receiver = b.as_mut().unwrap_or(&mut a);
        let got = receive_classes(receiver, 3);
        assert_eq!(
            got,
            [
                (Opcode::RcSendOnly, 0b10),
                (Opcode::Cnp, 0xc2),
                (Opcode::RcSendOnly, 0b10),
            ],
            "{a_addr}"
        );
    }
    // A switch's CE mark, as a plain socket sends it.
    let mut b = UdpBackend::bind(v4(16)).unwrap();
    let peer = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 15), ROCEV2_UDP_PORT);
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    socket.set_tos_v4(26 << 2 | 3).unwrap();
    socket.bind(&peer.into()).unwrap();
    let mut marked = packet(Opcode::RcSendOnly, 3, ExtHeaders::default(), 64);
    KernelFraming::V4 {
        src: peer,
        dst: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 16), ROCEV2_UDP_PORT),
    }
    .seal(&mut marked);
    let to = SocketAddr::new(b.local_addr(), ROCEV2_UDP_PORT);
    socket.send_to(&marked, &to.into()).unwrap();
    assert_eq!(
        receive_classes(&mut b, 1),
        [(Opcode::RcSendOnly, 26 << 2 | 3)]
    );
}
