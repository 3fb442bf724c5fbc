//! The UDP backend in a network namespace of its own, where a test may shape routes and links:
//! a thread that unshares its network namespace gets an empty one, and the `ip` commands it
//! runs act there. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN, so these tests are ignored by a plain
//! `cargo test`; `.ci/run` runs them as root with `--include-ignored`, where they must pass.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::process::Command;

use nix::sched::{unshare, CloneFlags};
use socket2::{Domain, Protocol, Socket, Type};
use softroce::io::{Backend, UdpBackend};
use softroce::wire::{BthRepr, ExtHeaders, Opcode, PacketRepr, Psn, Qpn};

const NEEDS_ROOT: &str = "needs root for a network namespace: .ci/run runs it";

/// Runs `test` on a thread in a fresh network namespace with `lo` up and a veth pair `v0`-`v1`
/// (MTU 9000, 10.77.0.1/24 on `v0`; a send to 10.77.0.2 waits for ARP, which is enough for the
/// socket to size it), and no other route.
fn in_namespace<T: Send>(test: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                unshare(CloneFlags::CLONE_NEWNET).expect(NEEDS_ROOT);
                for args in [
                    "link set lo up",
                    "link add v0 mtu 9000 type veth peer name v1 mtu 9000",
                    "link set v0 up",
                    "link set v1 up",
                    "addr add 10.77.0.1/24 dev v0",
                ] {
                    let status = Command::new("ip")
                        .args(args.split(' '))
                        .status()
                        .expect("iproute2's ip");
                    assert!(status.success(), "ip {args}");
                }
                test()
            })
            .join()
            .expect("the namespace's thread")
    })
}

const HERE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const THERE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// A RoCE packet of `len` bytes in all.
fn packet(len: usize) -> Vec<u8> {
    let bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(0x42), Psn::new(1));
    let repr = PacketRepr::new(bth, ExtHeaders::default(), len - 16);
    let mut bytes = vec![0; repr.buffer_len()];
    repr.emit(&mut bytes).unwrap();
    bytes
}

/// An ICMP "destination unreachable, fragmentation needed" (RFC 1191) with next-hop MTU
/// `mtu`, quoting a UDP datagram from HERE:4791 to THERE:4791, as a router on the path, or
/// anyone who can send to this host, would send it.
fn frag_needed(mtu: u16) -> Vec<u8> {
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&4028u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&HERE.octets());
    ip[16..20].copy_from_slice(&THERE.octets());
    icmp.extend_from_slice(&ip);
    icmp.extend_from_slice(&[0x12, 0xb7, 0x12, 0xb7, 0x0f, 0xb4, 0, 0]);
    let sum: u32 = icmp
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let checksum = !((folded & 0xffff) + (folded >> 16)) as u16;
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    icmp
}

/// Whether a plain socket with `IP_PMTUDISC_DO` may send `len` bytes to THERE now.
fn do_socket_sends(len: usize) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    rustix::net::sockopt::set_ip_mtu_discover(
        &socket,
        rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
    )?;
    socket.bind(&SocketAddrV4::new(HERE, 0).into())?;
    socket
        .send_to(&vec![0; len], &SocketAddrV4::new(THERE, 4791).into())
        .map(drop)
}

/// Under `IP_PMTUDISC_DO` the kernel lowers a route's path MTU on any ICMP "fragmentation
/// needed" that quotes one of the socket's datagrams, and then refuses larger sends with
/// EMSGSIZE: a forged ICMP shrank what a device could send, below its port MTU, and (with
/// `?` on every send error) killed it. The backend's `IP_PMTUDISC_PROBE` sizes datagrams by
/// the interface's MTU and ignores the learned one; DF and IP ID 0 stay, so the ICRC holds
/// (tests/io_raw.rs checks the framing from a raw receiver).
#[test]
#[ignore = "needs root for a network namespace: .ci/run runs it"]
fn a_forged_icmp_fragmentation_needed_does_not_shrink_what_the_device_sends() {
    in_namespace(|| {
        let mut backend = UdpBackend::bind(HERE.into()).unwrap();
        let to: IpAddr = THERE.into();
        let mut big = packet(4000);
        backend.send(to, &mut big).unwrap();
        backend.flush().unwrap();
        assert_eq!(backend.counters().sent, 1);
        do_socket_sends(4000).expect("before the ICMP, 4000 bytes fit the 9000-byte link");

        let icmp = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).unwrap();
        icmp.send_to(&frag_needed(1280), &SocketAddrV4::new(HERE, 0).into())
            .unwrap();
        let lowered = do_socket_sends(4000).unwrap_err();
        assert_eq!(
            lowered.raw_os_error(),
            Some(nix::libc::EMSGSIZE),
            "the forged ICMP lowered the path MTU for DO sockets"
        );

        let mut big = packet(4000);
        backend.send(to, &mut big).unwrap();
        backend.flush().unwrap();
        let counters = backend.counters();
        assert_eq!(
            (counters.sent, counters.send_too_big),
            (2, 0),
            "{counters:?}"
        );
    });
}

/// With no route to the destination the kernel answers ENETUNREACH, which killed the device;
/// the backend now counts the packet and notes the destination for the transport.
#[test]
#[ignore = "needs root for a network namespace: .ci/run runs it"]
fn no_route_costs_the_packet_and_names_the_destination() {
    in_namespace(|| {
        let mut backend = UdpBackend::bind(HERE.into()).unwrap();
        let nowhere: IpAddr = Ipv4Addr::new(10, 99, 0, 1).into();
        let mut p = packet(64);
        backend.send(nowhere, &mut p).unwrap();
        backend.flush().unwrap();
        assert_eq!(backend.counters().send_unreachable, 1);
        let mut named = Vec::new();
        backend.drain_unreachable(&mut |dst| named.push(dst));
        assert_eq!(named, [nowhere]);
        let error = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
            .and_then(|s| {
                s.send_to(
                    b"x",
                    &SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 1), 9).into(),
                )
            })
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::libc::ENETUNREACH));
    });
}
