//! The raw backend on loopback, which needs CAP_NET_RAW: each such test is ignored by a plain
//! `cargo test`, and `.ci/run` runs them as root with `--include-ignored`, where they must pass. It writes the header fields it is configured for (read off the wire by
//! a second raw socket), verifies every received ICRC fully, and interoperates with the UDP
//! backend both ways; the UDP backend's ID solver meets real non-zero IDs here.

mod common;

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use softroce::io::{Backend, IpIdMode, RawBackend, RawConfig, RawError, UdpBackend, UdpConfig};
use softroce::transport::Datagram;
use softroce::wire::{
    BthRepr, DethRepr, ExtHeaders, Frame, IcrcStatus, IpRepr, KernelFraming, Opcode, PacketRepr,
    Psn, QKey, Qpn, UdpChecksum, ROCEV2_UDP_PORT,
};

fn addr(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// Every raw IPPROTO_UDP socket receives a copy of every UDP datagram on the host, so tests
/// running at once fill each other's receive buffers and lose packets: they take turns.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The raw backend on `config`; a test run without CAP_NET_RAW fails here, saying why.
fn raw(config: RawConfig) -> RawBackend {
    RawBackend::bind(config).unwrap_or_else(|e| panic!("{e}"))
}

fn packet(opcode: Opcode, dest_qp: u32, ext: ExtHeaders, payload: usize) -> Vec<u8> {
    let repr = PacketRepr::new(
        BthRepr::new(opcode, Qpn::new(dest_qp), Psn::new(5)),
        ext,
        payload,
    );
    let mut bytes = vec![0u8; repr.buffer_len()];
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    repr.emit_with_payload(&mut bytes, &data).unwrap();
    bytes
}

/// A UD SEND from QP 0x12 and an RC SEND to QP 0x11.
fn traffic() -> Vec<Vec<u8>> {
    let deth = ExtHeaders {
        deth: Some(DethRepr {
            qkey: QKey(0x1111_1111),
            src_qp: Qpn::new(0x12),
        }),
        ..ExtHeaders::default()
    };
    vec![
        packet(Opcode::UdSendOnly, 0x11, deth, 512),
        packet(Opcode::RcSendOnly, 0x11, ExtHeaders::default(), 4096),
        packet(Opcode::RcSendOnly, 0x11, ExtHeaders::default(), 1),
    ]
}

/// A datagram as a receiver got it.
#[derive(Debug)]
struct Got {
    src: IpAddr,
    dst: IpAddr,
    ip_header: Option<Vec<u8>>,
    icrc: IcrcStatus,
    packet: Vec<u8>,
}

fn receive(backend: &mut dyn Backend, count: usize) -> Vec<Got> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < count && Instant::now() < deadline {
        backend
            .receive(64, &mut |d: Datagram<'_>| {
                got.push(Got {
                    src: d.src,
                    dst: d.dst,
                    ip_header: d.ip_header.map(<[u8]>::to_vec),
                    icrc: d.icrc,
                    packet: d.packet.to_vec(),
                })
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// A second raw socket at `at`, to read frames off the wire.
fn sniffer(at: Ipv4Addr) -> Socket {
    let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).unwrap();
    socket.bind(&SocketAddrV4::new(at, 0).into()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    socket
}

#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn raw_to_raw_writes_the_configured_fields_and_verifies_fully() {
    let _turn = one_at_a_time();
    let config = RawConfig {
        dscp: 26,
        ecn: 2,
        ip_id: IpIdMode::Incrementing,
        ..RawConfig::new(addr(21))
    };
    let mut a = raw(config);
    let mut b = raw(RawConfig::new(addr(22)));
    let mut wire = sniffer(addr(22));
    let mut sent = traffic();
    for p in &mut sent {
        a.send(b.local_addr(), p).unwrap();
    }
    a.flush().unwrap();

    let got = receive(&mut b, sent.len());
    assert_eq!(got.len(), sent.len());
    for (i, (g, sealed)) in got.iter().zip(&sent).enumerate() {
        assert_eq!((g.src, g.dst), (a.local_addr(), b.local_addr()));
        assert_eq!(
            g.icrc,
            IcrcStatus::Ok,
            "packet {i}: verified against the whole frame"
        );
        assert_eq!(&g.packet, sealed);
        let header = g
            .ip_header
            .as_ref()
            .expect("a raw socket sees the IP header");
        assert_eq!(header.len(), 20);
        assert_eq!(u16::from_be_bytes([header[4], header[5]]), 1 + i as u16);
    }

    let mut buf = [0u8; 65536];
    for (i, sealed) in sent.iter().enumerate() {
        let len = wire.read(&mut buf).unwrap();
        let frame = Frame::parse_ip(&buf[..len]).unwrap();
        let IpRepr::V4 {
            dscp,
            ecn,
            identification,
            dont_fragment,
            ttl,
            ..
        } = frame.repr.ip
        else {
            unreachable!()
        };
        assert_eq!((dscp, ecn, identification), (26, 2, 1 + i as u16));
        assert!(dont_fragment);
        assert_eq!(ttl, 64);
        assert_eq!(frame.repr.udp.checksum, UdpChecksum::Zero);
        assert_eq!(frame.repr.udp.dst_port, ROCEV2_UDP_PORT);
        // UD: rxe's port for source QP 0x12 (ud_send.pcap); RC: the hash of the dest QPN 0x11.
        let port = if i == 0 { 0xf806 } else { 0xdf94 };
        assert_eq!(frame.repr.udp.src_port, port, "packet {i}");
        assert_eq!(frame.icrc_status(), IcrcStatus::Ok);
        assert_eq!(frame.packet.as_bytes(), &sealed[..]);
    }
    assert_eq!(a.counters().sent, sent.len() as u64);

    // ID 0 with DF stays 0: the kernel fills in a zero ID only for datagrams that may fragment.
    let mut back = traffic().remove(1);
    b.send(a.local_addr(), &mut back).unwrap();
    let got = receive(&mut a, 1);
    assert_eq!(got[0].icrc, IcrcStatus::Ok);
    assert_eq!(got[0].ip_header.as_ref().unwrap()[4..7], [0, 0, 0x40]);
}

#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn the_udp_backend_solves_the_raw_backends_ids_and_the_raw_one_verifies_the_udp_ones() {
    let _turn = one_at_a_time();
    let config = RawConfig {
        ip_id: IpIdMode::Incrementing,
        ..RawConfig::new(addr(23))
    };
    let mut raw = raw(config);
    // Loopback never segments, so a raw socket would see a train as one datagram.
    let mut udp = UdpBackend::with_config(UdpConfig {
        segmentation: false,
        ..UdpConfig::new(addr(24).into())
    })
    .unwrap();

    let mut sent = traffic();
    for p in &mut sent {
        raw.send(udp.local_addr(), p).unwrap();
    }
    let got = receive(&mut udp, sent.len());
    assert_eq!(got.len(), sent.len());
    for (g, sealed) in got.iter().zip(&sent) {
        // IDs 1, 2, 3 on the wire, which a UDP socket never sees: solved.
        assert_eq!(g.icrc, IcrcStatus::Ok);
        assert!(g.ip_header.is_none());
        assert_eq!(&g.packet, sealed);
    }

    let mut sent = traffic();
    for p in &mut sent {
        udp.send(raw.local_addr(), p).unwrap();
    }
    udp.flush().unwrap();
    let got = receive(&mut raw, sent.len());
    assert_eq!(got.len(), sent.len());
    for (g, sealed) in got.iter().zip(&sent) {
        assert_eq!(g.icrc, IcrcStatus::Ok, "the kernel wrote ID 0, as sealed");
        let header = g.ip_header.as_ref().unwrap();
        assert_eq!((header[4], header[5], header[6]), (0, 0, 0x40));
        assert_eq!(&g.packet, sealed);
    }
}

#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn a_corrupt_packet_is_bad_and_a_foreign_port_is_filtered() {
    let _turn = one_at_a_time();
    let mut raw = raw(RawConfig::new(addr(26)));
    let peer = SocketAddrV4::new(addr(25), ROCEV2_UDP_PORT);
    let socket = UdpSocket::bind(peer).unwrap();
    let framing = KernelFraming::V4 {
        src: peer,
        dst: SocketAddrV4::new(addr(26), ROCEV2_UDP_PORT),
    };
    let mut bad = packet(Opcode::RcSendOnly, 0x11, ExtHeaders::default(), 64);
    framing.seal(&mut bad);
    bad[20] ^= 1;
    socket
        .send_to(&bad, SocketAddr::new(addr(26).into(), 9999))
        .unwrap();
    socket
        .send_to(&bad, SocketAddr::new(addr(26).into(), ROCEV2_UDP_PORT))
        .unwrap();
    let got = receive(&mut raw, 1);
    assert_eq!(got.len(), 1, "port 9999 is filtered out");
    assert!(matches!(got[0].icrc, IcrcStatus::Bad { .. }), "{got:?}");
    assert_eq!(raw.counters().foreign, 0);
}

/// Every datagram the raw socket takes counts against the receive budget, foreign ones
/// included: they were skipped without counting, so a flood kept the engine receiving.
#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn a_flood_of_foreign_datagrams_counts_against_the_budget() {
    let _turn = one_at_a_time();
    let mut raw = raw(RawConfig::new(addr(29)));
    let flood = UdpSocket::bind((addr(30), 0)).unwrap();
    for _ in 0..200 {
        flood
            .send_to(b"not a RoCE packet", (addr(29), ROCEV2_UDP_PORT))
            .unwrap();
    }
    let mut delivered = 0;
    let taken = raw.receive(64, &mut |_| delivered += 1).unwrap();
    assert_eq!((taken, delivered), (64, 0));
    let mut total = taken;
    while total < 200 {
        let taken = raw.receive(64, &mut |_| delivered += 1).unwrap();
        assert!(taken > 0, "{total} of 200 taken");
        total += taken;
    }
    assert_eq!((total, delivered, raw.counters().foreign), (200, 0, 200));
}

/// A burst of full-MTU datagrams that arrives before the engine reads any is kept whole: UD has
/// no window to hold a peer back, and the raw socket's default receive buffer (about 25 such
/// packets) lost udaddy's datagrams in the lab whenever the engine thread was not scheduled.
#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn a_burst_that_arrives_while_the_engine_is_away_is_kept() {
    let _turn = one_at_a_time();
    const BURST: usize = 300;
    let mut raw = raw(RawConfig::new(addr(31)));
    let peer = UdpSocket::bind((addr(32), ROCEV2_UDP_PORT)).unwrap();
    let datagram = &traffic()[1]; // an RC SEND of 4096 bytes
    for _ in 0..BURST {
        peer.send_to(datagram, (addr(31), ROCEV2_UDP_PORT)).unwrap();
    }
    let mut total = 0;
    loop {
        let taken = raw.receive(64, &mut |_| {}).unwrap();
        if taken == 0 {
            break;
        }
        total += taken;
    }
    assert_eq!(
        total, BURST,
        "the kernel dropped what the socket had no room for"
    );
}

#[test]
fn without_cap_net_raw_the_error_says_so() {
    let _turn = one_at_a_time();
    const CHILD: &str = "SOFTROCE_TEST_WITHOUT_CAP_NET_RAW";
    let result = RawBackend::bind(RawConfig::new(addr(27)));
    if std::env::var_os(CHILD).is_some() {
        let err = result.unwrap_err();
        assert!(matches!(err, RawError::NeedsCapNetRaw), "{err}");
        assert!(err.to_string().contains("CAP_NET_RAW"), "{err}");
        let io: std::io::Error = err.into();
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        return;
    }
    match result {
        Err(RawError::NeedsCapNetRaw) => return, // checked above, in this very process
        Err(e) => panic!("{e}"),
        Ok(backend) => drop(backend),
    }
    // Privileged: run this test again in a child with CAP_NET_RAW out of its bounding set.
    let child = Command::new("setpriv")
        .args(["--bounding-set", "-net_raw", "--inh-caps", "-net_raw", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "without_cap_net_raw_the_error_says_so"])
        .env(CHILD, "1")
        .output();
    match child {
        Ok(out) => assert!(
            out.status.success(),
            "the child without CAP_NET_RAW failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("the unprivileged half needs util-linux's setpriv: {e}"),
    }
}

/// A capture of what the raw backend sent shows the ICRCs it sealed as good: the record has the
/// UDP source port the backend chose (a hash of the QPN, which the ICRC covers), not the
/// socket's 4791, and its IPv4 IDs solved.
#[test]
#[ignore = "needs CAP_NET_RAW: .ci/run runs it as root"]
fn a_recording_of_the_raw_backend_verifies() {
    use softroce::io::Recording;

    let _turn = one_at_a_time();
    let config = RawConfig {
        ip_id: IpIdMode::Incrementing,
        ..RawConfig::new(addr(27))
    };
    let raw = raw(config);
    let path = std::env::temp_dir().join(format!("softroce-{}-raw.pcap", std::process::id()));
    let mut recorded = Recording::new(raw, &path).unwrap();
    let mut sent = traffic();
    for p in &mut sent {
        recorded.send(addr(28).into(), p).unwrap();
    }
    drop(recorded);
    let ports = common::recorded_source_ports(&path);
    assert!(
        ports.iter().all(|&port| port != ROCEV2_UDP_PORT),
        "{ports:?}"
    );
    assert_eq!(ports.len(), sent.len());
}
