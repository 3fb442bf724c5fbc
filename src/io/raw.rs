//! The raw backend: IPv4 RoCE frames written and read whole through a raw socket, so every header
//! field is softroce's to choose and every received ICRC is verified fully.
//!
//! # Why a raw IP socket
//!
//! A raw IPv4 socket (`SOCK_RAW`, `IPPROTO_UDP`, `IP_HDRINCL`) takes the IP header from softroce
//! and leaves routing, neighbour resolution (ARP), the choice of interface and loopback to the
//! kernel. AF_PACKET (pnet) would show the Ethernet header too, which RoCEv2's ICRC does not
//! cover, at the price of doing all of that in softroce. One socket both sends and receives: it
//! is bound to the local address, so the kernel hands it only datagrams to that address, and a
//! classic BPF filter keeps those to UDP port 4791.
//!
//! A UDP socket is bound to `address:4791` as well; without it the kernel would answer every RoCE
//! packet with ICMP port unreachable. A filter drops whatever would queue on it, so the kernel
//! counts those datagrams as UDP receive errors, and they cost no memory.
//!
//! IPv4 only. An IPv6 raw socket does not deliver the IPv6 header, and over IPv6 every field the
//! ICRC covers is known or masked anyway: [`UdpBackend`](super::UdpBackend) verifies IPv6 fully.
//!
//! Opening the socket needs `CAP_NET_RAW`; without it [`RawBackend::bind`] fails with
//! [`RawError::NeedsCapNetRaw`].
//!
//! # What it sends
//!
//! - IPv4 with no options, DF, TTL 64, the configured DSCP and ECN, and the ID that
//!   [`IpIdMode`] says: 0, as a Linux UDP socket with DF sends, or counting up, as ConnectX does.
//!   The kernel fills in the header checksum (which the ICRC masks);
//! - UDP from port `0xC000 | hash_32(qpn, 14)` (the kernel's multiplicative hash) to 4791, with
//!   checksum 0, as rxe sends. For UD, `qpn` is the source QPN from the DETH, and the port is
//!   rxe's own (`ud_send.pcap`, and QP1 in `rdma_cm_rping.pcap`). For RC and UC rxe uses
//!   `rdma_get_udp_sport(flow_label, lqpn, rqpn)`, a hash of both QPNs (`rc_*.pcap`), but the
//!   sending QP's number is not in an RC or UC packet and the core's `Transmit` does not carry
//!   it, so `qpn` is the destination QPN: one port per remote QP, stable for the life of the
//!   connection, which is what ECMP needs, but not rxe's number;
//! - the ICRC, computed over exactly those headers.

use std::io::{self, IoSlice, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;

use mio::unix::SourceFd;
use mio::{event, Interest, Registry, Token};
use socket2::{Domain, Protocol, SockFilter, Socket, Type};

use super::{
    enlarge_socket_buffers, Backend, Failure, IoCounters, TrafficClasses, Unreachable,
    DEFAULT_CNP_DSCP,
};
use crate::transport::Datagram;
use crate::wire::icrc::{icrc_ipv4, ICRC_LEN};
use crate::wire::{DethRepr, Ecn, Frame, IpRepr, RocePacket, ROCEV2_UDP_PORT};

const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
const TTL: u8 = 64;
const IP_PROTO_UDP: u8 = 17;
/// The largest IPv4 datagram, and so the receive buffer.
const MAX_DATAGRAM: usize = 65_535;

/// Classic BPF over a datagram from its IPv4 header: keep UDP destination port 4791.
const PORT_4791: [SockFilter; 5] = [
    // X = the IP header's length (BPF_LDX | BPF_B | BPF_MSH: 4 * (byte 0 & 0xf)).
    SockFilter::new(0xb1, 0, 0, 0),
    // A = the 16 bits at X + 2, the UDP destination port (BPF_LD | BPF_H | BPF_IND).
    SockFilter::new(0x48, 0, 0, 2),
    // A == 4791: on to the next instruction, else skip it (BPF_JMP | BPF_JEQ | BPF_K).
    SockFilter::new(0x15, 0, 1, ROCEV2_UDP_PORT as u32),
    // Keep the whole datagram (BPF_RET | BPF_K), or keep none of it.
    SockFilter::new(0x06, 0, 0, MAX_DATAGRAM as u32),
    SockFilter::new(0x06, 0, 0, 0),
];
/// Classic BPF that keeps nothing.
const DROP_ALL: [SockFilter; 1] = [SockFilter::new(0x06, 0, 0, 0)];

/// The IPv4 identification a [`RawBackend`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpIdMode {
    /// 0 on every packet, as the kernel frames a datagram from an unconnected UDP socket with DF.
    Zero,
    /// One more per packet, wrapping, starting at 1, as ConnectX numbers them.
    Incrementing,
}

/// How a [`RawBackend`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawConfig {
    /// The address to send from and receive at: a specific one, since the ICRC covers it.
    pub address: Ipv4Addr,
    /// Differentiated services codepoint, 0 to 63.
    pub dscp: u8,
    /// ECN codepoint, 0 to 3; ECT(0) by default, as ConnectX sends RoCE.
    pub ecn: u8,
    /// The DSCP of the CNPs sent (mlx5's `np_cnp_dscp`); their ECN is `ecn`.
    pub cnp_dscp: u8,
    /// The IPv4 identification to write.
    pub ip_id: IpIdMode,
}

impl RawConfig {
    /// `address`, DSCP 0, ECN ECT(0), CNPs with DSCP 48, ID 0.
    pub fn new(address: Ipv4Addr) -> Self {
        RawConfig {
            address,
            dscp: 0,
            ecn: Ecn::Ect0.bits(),
            cnp_dscp: DEFAULT_CNP_DSCP,
            ip_id: IpIdMode::Zero,
        }
    }
}

/// Why a [`RawBackend`] could not be opened.
#[derive(Debug)]
pub enum RawError {
    /// The process may not open raw sockets.
    NeedsCapNetRaw,
    /// Any other failure: an invalid configuration, or a socket call that failed.
    Io(io::Error),
}

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawError::NeedsCapNetRaw => f.write_str(
                "the raw backend needs CAP_NET_RAW: run as root, or grant it with \
                 `setcap cap_net_raw+ep` on the binary; the UDP backend needs no privileges",
            ),
            RawError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RawError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RawError::NeedsCapNetRaw => None,
            RawError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for RawError {
    fn from(e: io::Error) -> Self {
        RawError::Io(e)
    }
}

impl From<RawError> for io::Error {
    fn from(e: RawError) -> Self {
        match e {
            RawError::Io(e) => e,
            RawError::NeedsCapNetRaw => io::Error::new(io::ErrorKind::PermissionDenied, e),
        }
    }
}

/// The raw socket, registered with mio by its descriptor.
#[derive(Debug)]
struct RawSocket(Socket);

impl event::Source for RawSocket {
    fn register(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        SourceFd(&self.0.as_raw_fd()).register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        SourceFd(&self.0.as_raw_fd()).reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        SourceFd(&self.0.as_raw_fd()).deregister(registry)
    }
}

/// A [`Backend`] over a raw IPv4 socket: it writes every header itself and verifies
/// every received ICRC fully. Opening it needs `CAP_NET_RAW`.
#[derive(Debug)]
pub struct RawBackend {
    raw: RawSocket,
    /// Held only to own port 4791 (see the module documentation).
    _port: Socket,
    local: Ipv4Addr,
    classes: TrafficClasses,
    ip_id: IpIdMode,
    next_id: u16,
    buffer: Box<[u8]>,
    /// Where the next packet to send is built ([`Backend::room`]): as long as a UDP payload
    /// can be behind an IPv4 header.
    outgoing: Box<[u8]>,
    counters: IoCounters,
    unreachable: Unreachable,
}

/// The kernel's `hash_32(value, 14)` (include/linux/hash.h), which rxe spreads source ports with.
fn hash_32_14(value: u32) -> u16 {
    (value.wrapping_mul(0x61c8_8647) >> (32 - 14)) as u16
}

/// The UDP source port for `packet` (see the module documentation).
fn source_port<T: AsRef<[u8]>>(packet: &RocePacket<T>) -> u16 {
    let qpn = match packet.ext::<DethRepr>() {
        Some(deth) => deth.src_qp,
        None => packet.bth().dest_qp(),
    };
    0xc000 | hash_32_14(qpn.value())
}

/// The source port of a RoCE packet's datagram, `None` if it is not one.
fn packet_source_port(packet: &[u8]) -> Option<u16> {
    RocePacket::new_checked(packet)
        .ok()
        .map(|roce| source_port(&roce))
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

impl RawBackend {
    /// Opens the raw socket on `config.address` and binds UDP `config.address:4791`.
    pub fn bind(config: RawConfig) -> Result<Self, RawError> {
        let address = config.address;
        if address.is_unspecified() {
            return Err(
                invalid("a RoCEv2 backend binds a specific address: the ICRC covers it").into(),
            );
        }
        let classes = TrafficClasses::new(config.dscp, config.ecn, config.cnp_dscp)?;
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).map_err(|e| match e
            .kind()
        {
            io::ErrorKind::PermissionDenied => RawError::NeedsCapNetRaw,
            _ => RawError::Io(e),
        })?;
        raw.set_header_included_v4(true)?;
        raw.attach_filter(&PORT_4791)?;
        raw.bind(&SocketAddrV4::new(address, 0).into())?;
        raw.set_nonblocking(true)?;
        enlarge_socket_buffers(&raw);

        let local = SocketAddrV4::new(address, ROCEV2_UDP_PORT);
        let port = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        port.attach_filter(&DROP_ALL)?;
        port.bind(&local.into()).map_err(|e| {
            io::Error::new(e.kind(), format!("binding UDP {local} for RoCEv2: {e}"))
        })?;
        Ok(RawBackend {
            raw: RawSocket(raw),
            _port: port,
            local: address,
            classes,
            ip_id: config.ip_id,
            next_id: 1,
            buffer: vec![0u8; MAX_DATAGRAM].into_boxed_slice(),
            outgoing: vec![0u8; usize::from(u16::MAX) - IPV4_HEADER - UDP_HEADER]
                .into_boxed_slice(),
            counters: IoCounters::default(),
            unreachable: Unreachable::default(),
        })
    }

    /// Frames `packet` for `dst`, seals its ICRC and sends it. `Ok(false)` if it was dropped
    /// before it could be sealed (counted); a refused send is counted too, after sealing.
    fn frame_and_send(&mut self, dst: IpAddr, packet: &mut [u8]) -> io::Result<bool> {
        let IpAddr::V4(dst) = dst.to_canonical() else {
            // IPv4 only: the transport refuses IPv6 destinations on an IPv4 device.
            self.counters.send_unreachable += 1;
            self.unreachable.note(dst);
            return Ok(false);
        };
        let Some(source_port) = packet_source_port(packet) else {
            // The core emits only RoCE packets; a caller's other bytes are not sent.
            self.counters.send_failed += 1;
            return Ok(false);
        };
        let udp_len = UDP_HEADER + packet.len();
        let Ok(total) = u16::try_from(IPV4_HEADER + udp_len) else {
            self.counters.send_too_big += 1;
            return Ok(false);
        };
        let mut headers = [0u8; IPV4_HEADER + UDP_HEADER];
        let (ip, udp) = headers.split_at_mut(IPV4_HEADER);
        ip[0] = 0x45;
        ip[1] = self.classes.of(packet);
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[4..6].copy_from_slice(&self.next_ip_id().to_be_bytes());
        ip[6] = 0x40; // DF, fragment offset 0
        ip[8] = TTL;
        ip[9] = IP_PROTO_UDP;
        ip[12..16].copy_from_slice(&self.local.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        udp[0..2].copy_from_slice(&source_port.to_be_bytes());
        udp[2..4].copy_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        let split = packet.len() - ICRC_LEN;
        let udp_header = [udp[0], udp[1], udp[2], udp[3], udp[4], udp[5], 0, 0];
        let icrc = icrc_ipv4(ip, udp_header, &packet[..split]);
        packet[split..].copy_from_slice(&icrc.to_le_bytes());

        let to = SocketAddr::from(SocketAddrV4::new(dst, 0));
        let pieces = [IoSlice::new(&headers), IoSlice::new(packet)];
        let error = match self.raw.0.send_to_vectored(&pieces, &to.into()) {
            Ok(_) => {
                self.counters.sent += 1;
                self.counters.sends += 1;
                return Ok(true);
            }
            Err(error) => error,
        };
        match Failure::of(&error) {
            Failure::Dead => return Err(error),
            Failure::Unreachable => {
                self.counters.send_unreachable += 1;
                self.unreachable.note(dst.into());
            }
            failure => self.counters.count_send_failure(failure, &error),
        }
        Ok(true)
    }

    fn next_ip_id(&mut self) -> u16 {
        match self.ip_id {
            IpIdMode::Zero => 0,
            IpIdMode::Incrementing => {
                let id = self.next_id;
                self.next_id = id.wrapping_add(1);
                id
            }
        }
    }
}

impl Backend for RawBackend {
    fn local_addr(&self) -> IpAddr {
        self.local.into()
    }

    fn udp_source_port(&self, packet: &[u8]) -> u16 {
        packet_source_port(packet).unwrap_or(ROCEV2_UDP_PORT)
    }

    fn traffic_class(&self, packet: &[u8]) -> u8 {
        self.classes.of(packet)
    }

    fn room(&mut self) -> io::Result<&mut [u8]> {
        Ok(&mut self.outgoing)
    }

    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]> {
        if len > self.outgoing.len() {
            self.counters.send_too_big += 1;
            return Ok(&[]);
        }
        // Out of `self` while it is framed, so that the counters and the IP ID stay reachable;
        // an empty box takes its place, which allocates nothing.
        let mut outgoing = std::mem::take(&mut self.outgoing);
        let framed = self.frame_and_send(dst, &mut outgoing[..len]);
        self.outgoing = outgoing;
        Ok(if framed? { &self.outgoing[..len] } else { &[] })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn drain_unreachable(&mut self, each: &mut dyn FnMut(IpAddr)) {
        self.unreachable.drain(each);
    }

    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize> {
        // Every datagram taken counts against the budget, whether delivered or dropped.
        let mut taken = 0;
        while taken < budget {
            let len = match (&self.raw.0).read(&mut self.buffer) {
                Ok(len) => len,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if Failure::of(&e) == Failure::Dead => return Err(e),
                Err(_) => {
                    self.counters.receive_errors += 1;
                    taken += 1;
                    continue;
                }
            };
            taken += 1;
            self.counters.received += 1;
            let bytes = &self.buffer[..len];
            let frame = match Frame::parse_ip(bytes) {
                Ok(frame) => frame,
                Err(_) => {
                    self.counters.foreign += 1;
                    continue;
                }
            };
            let IpRepr::V4 { src, dst, .. } = frame.repr.ip else {
                self.counters.foreign += 1;
                continue;
            };
            // Frame::parse_ip has checked the header length against the bytes.
            let header_len = usize::from(bytes[0] & 0x0f) * 4;
            deliver(Datagram {
                src: src.into(),
                src_port: frame.repr.udp.src_port,
                dst: dst.into(),
                ip_header: Some(&bytes[..header_len]),
                traffic_class: bytes[1],
                icrc: frame.icrc_status(),
                packet: frame.packet.as_bytes(),
            });
        }
        Ok(taken)
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        &mut self.raw
    }

    fn counters(&self) -> IoCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Capture;

    #[test]
    fn ud_source_ports_are_rxes() {
        // Both pingpong QPs in one, QP1 on both sides in the other.
        for file in ["ud_send.pcap", "rdma_cm_rping.pcap"] {
            let path = format!("{}/packet-fixtures/rxe/{file}", env!("CARGO_MANIFEST_DIR"));
            let bytes = std::fs::read(path).unwrap();
            let mut checked = 0;
            for record in Capture::new(&bytes).unwrap() {
                let record = record.unwrap();
                let frame = record.frame().unwrap();
                if frame.packet.ext::<DethRepr>().is_some() {
                    assert_eq!(source_port(&frame.packet), frame.repr.udp.src_port);
                    checked += 1;
                }
            }
            assert!(checked >= 4, "{file}: {checked} UD packets");
        }
    }
}
