//! The UDP backend: a socket bound to `address:4791`.
//!
//! # Framing and the ICRC
//!
//! It sets `IP_PMTUDISC_PROBE` and sends on an unconnected socket, so the kernel frames every
//! IPv4 datagram with DF and IP ID 0, and segment `i` of a segmented send (below) with ID `i`;
//! the ICRC is sealed in advance for exactly that (see `wire::icrc`). PROBE, unlike DO, sizes
//! datagrams by the interface's MTU and ignores the route's learned path MTU, so a forged ICMP
//! "fragmentation needed" cannot shrink what the device may send: the transport's port MTU,
//! taken from the same interface, already bounds every packet. The datagrams leave from port
//! 4791; rxe and ConnectX take any source port.
//!
//! # Errors
//!
//! A send the kernel refuses costs that packet: it is counted by cause (`IoCounters`) and
//! dropped, and a destination nothing can reach is noted for the transport, which fails the
//! QPs connected to it. A failed receive costs that read. Only a dead socket is an error.
//!
//! A UDP socket does not deliver the IP header. What a received packet's
//! [`IcrcStatus`](crate::wire::IcrcStatus) then means:
//!
//! - over IPv6 every covered field is known, and `Ok` is the full CRC-32 check;
//! - over IPv4 the ID is unknown, so it is solved for ([`crate::wire::solve_ipv4_id`]): `Ok`
//!   means some ID makes the ICRC right, assuming DF, no fragment offset and no IP options, as
//!   rxe, ConnectX and softroce send RoCE. That checks every other covered byte, but only 16 bits
//!   strong: random corruption passes once in 65,536 (sparse errors at unlucky positions up to a
//!   few times more often: 1.6 times over the rxe fixtures), where a full check lets one in 2^32
//!   through. `Bad` means no ID fits: the packet is corrupt, or was sent without DF. Whole frames
//!   ([`RawBackend`](super::RawBackend)) are verified fully.
//!
//! # Batching: UDP segmentation offload
//!
//! The transport core builds each packet in place at the end of the queue
//! ([`room`](Backend::room)), and [`commit`](Backend::commit) seals it there and adds it to the
//! queue, with no copy; [`flush`](Backend::flush) (or a full queue) sends the queue. Consecutive
//! packets to one peer, of one traffic class, of one size but the last, go as one "train",
//! whatever their QPs: one `sendmsg` with its segment size in a `UDP_SEGMENT` control message,
//! which the kernel (or the NIC) cuts into datagrams. (A device of several engines, or one
//! told to, cuts its trains per QP as well: see below.) Receiving enables `UDP_GRO`, so a run
//! of datagrams from one peer arrives as one buffer, with its segment size in a control
//! message, and is handed over datagram by datagram.
//!
//! Measured by `cargo bench --bench udp_baseline`: 32 datagrams of 4,112 bytes (a 4 KiB WRITE
//! MIDDLE) sent and then received on one core over 127.0.0.1, Linux 6.18, the 2-core VM of
//! docs/performance.md, two runs, per datagram:
//!
//! | path | send + receive |
//! |---|---|
//! | `sendto` + `recvfrom`, one syscall per datagram | 3.5 – 4.6 µs |
//! | `sendmmsg` + `recvmmsg`, batches of 32 | 3.6 – 4.0 µs |
//! | `UDP_SEGMENT` + `UDP_GRO` | 0.55 – 0.58 µs |
//! | this backend (the above, plus sealing and solving the ICRC and the queue copy) | 0.95 µs |
//! | this backend before, one `sendto` and `recvfrom` per datagram | 4.3 µs |
//!
//! Batching syscalls barely helps: the cost is the per-datagram path through the stack (an skb,
//! a route lookup, a copy), not the syscall. Segmentation cuts that path to one per train: on
//! loopback a train stays one skb all the way into the receiving socket. So this backend
//! segments, and keeps no `mmsg` path. Over a NIC the kernel or the NIC segments, and GRO
//! coalesces what arrives whoever sent it.
//!
//! The price is the IPv4 ID: the kernel numbers a train's segments 0, 1, 2, ..., and the ICRC
//! is sealed for that. That was seen on Linux 6.18 by sending a train out of a tun device, which
//! has no offloads, so the stack segments. A NIC that segments (UDP segmentation offload) is
//! expected to number them the same way, as it does TCP segments, but that is not verified here,
//! and a peer that verifies fully (rxe) would reject a train numbered any other way.
//! [`UdpConfig::segmentation`] off sends one datagram per `sendto`, all with ID 0. It must also
//! be off toward a [`RawBackend`](super::RawBackend) on the same host: on loopback a raw socket
//! sees a train as one oversized datagram, since loopback never segments.
//!
//! # Several engines on one address
//!
//! A device with several engines binds one socket per engine to the same address, with
//! `SO_REUSEPORT`, and [`UdpBackend::steer_by_dest_qp`] gives the group a classic BPF program
//! that picks the socket from the BTH's DestQP, so that each datagram reaches its QP's engine
//! ([`Lane::owner`](crate::transport::Lane::owner)) without passing through another. The
//! program sees the UDP payload, and the kernel runs it once per receive: a coalesced train
//! goes whole to its first datagram's socket. That is why such a device cuts its trains per
//! destination QP as well ([`UdpConfig::trains_per_qp`]): a train it sends to a peer like
//! itself then never mixes QPs. GRO on a receiving host can still merge datagrams of one flow
//! (softroce sends every QP from port 4791), and a peer of one engine mixes QPs in a train
//! unless told not to, so an engine hands a datagram that is not its own to its owner.
//!
//! Mixing QPs is what makes many QPs with a few messages each cheap: 64 QPs with one 64-byte
//! WRITE in flight each took a call per QP when every QP was its own train, and now as few as
//! one a turn (the e2e bench's row `64 B x64, 1 in flight`). The price falls on a peer of
//! several engines: its kernel steers a mixed train whole to one engine, which hands the other
//! QPs' datagrams over (`engine::lanes`).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use mio::net::UdpSocket;
use nix::errno::Errno;
// `sockopt_impl!` expands to `setsockopt_impl!`, which calls `libc::setsockopt` by that path.
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt as nix_sockopt, ControlMessage, ControlMessageOwned,
    MsgFlags, SockaddrStorage,
};
use nix::{libc, setsockopt_impl, sockopt_impl};
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};

use super::icmp::Refusals;
use super::{
    enlarge_socket_buffers, Backend, Failure, IoCounters, TrafficClasses, Unreachable,
    DEFAULT_CNP_DSCP,
};
use crate::transport::{Datagram, MAX_PACKET_LEN};
use crate::wire::{Ecn, KernelFraming, ROCEV2_UDP_PORT};

/// The largest UDP payload an IPv4 datagram carries: the bound on one train and on one
/// coalesced receive.
const MAX_UDP_PAYLOAD: usize = 65_507;
/// Segments in one train: UDP_MAX_SEGMENTS of the kernels that have UDP_SEGMENT (4.18 on).
const MAX_SEGMENTS: usize = 64;
/// Queued bytes before `room` flushes by itself: a 128-packet window of 4 KiB packets.
const QUEUE_BYTES: usize = 128 * MAX_PACKET_LEN;
/// Queued trains before `room` flushes by itself (small packets to many peers).
const MAX_TRAINS: usize = 64;

sockopt_impl!(
    /// `UDP_NO_CHECK6_RX` (RFC 6936): take UDPv6 datagrams whose checksum is zero. rxe sends
    /// RoCE over IPv6 with a zero UDP checksum (`prepare_udp_hdr` in rxe_net.c), which Linux
    /// otherwise drops as a checksum error (`Udp6InCsumErrors`); the ICRC covers the datagram
    /// instead. nix has no wrapper for it; its macro does the `setsockopt` call, with an `int`
    /// for the `bool`, as the kernel reads the option.
    UdpNoCheck6Rx,
    SetOnly,
    libc::IPPROTO_UDP,
    libc::UDP_NO_CHECK6_RX,
    bool
);

/// How a [`UdpBackend`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpConfig {
    /// The address to bind port 4791 on: a specific one, since the ICRC covers it.
    pub address: IpAddr,
    /// Differentiated services codepoint, 0 to 63 (`IP_TOS` or `IPV6_TCLASS`).
    pub dscp: u8,
    /// ECN codepoint, 0 to 3: 0 not ECN-capable, 1 or 2 ECN-capable (ECT), 3 congestion seen.
    /// ECT(0) by default, as ConnectX sends RoCE: a congested switch then marks rather than
    /// drops, and the receiver answers with CNPs (`transport::congestion`).
    pub ecn: u8,
    /// The DSCP of the CNPs sent (mlx5's `np_cnp_dscp`), 0 to 63; their ECN is `ecn`.
    pub cnp_dscp: u8,
    /// Send runs of packets to one peer as one `UDP_SEGMENT` send (see the module
    /// documentation). On by default; a kernel without `UDP_SEGMENT` turns it off.
    pub segmentation: bool,
    /// Cut segmentation trains where the destination QP changes, as well as where the peer,
    /// the size or the traffic class does. A receiver of several engines needs it: its kernel
    /// steers a whole coalesced train to its first datagram's QP's socket
    /// ([`UdpBackend::steer_by_dest_qp`]), and that engine hands the rest over, a copy each. Off
    /// by default, so that equal packets to one peer share a train whatever their QPs; a
    /// device of several engines sets it, for peers like itself, and so does one whose
    /// `BackendKind::Udp` says so.
    pub trains_per_qp: bool,
    /// Bind with `SO_REUSEPORT`, so that the device's other engines bind the same address
    /// ([`UdpBackend::steer_by_dest_qp`]). Off by default: a second device on one address is
    /// then refused, as it should be. The kernel lets only sockets of the same user join a
    /// reuse-port group.
    pub reuse_port: bool,
}

impl UdpConfig {
    /// `address`, DSCP 0, ECN ECT(0), CNPs with DSCP 48, and segmentation on, with trains
    /// not cut per QP.
    pub fn new(address: IpAddr) -> Self {
        UdpConfig {
            address,
            dscp: 0,
            ecn: Ecn::Ect0.bits(),
            cnp_dscp: DEFAULT_CNP_DSCP,
            segmentation: true,
            trains_per_qp: false,
            reuse_port: false,
        }
    }
}

/// Queued datagrams to one peer that go out as one send: `count` of them, each `segment` bytes
/// but the last, which may be shorter and then closes the train.
#[derive(Debug)]
struct Train {
    dst: SocketAddr,
    /// The TOS or traffic class byte of every packet in it.
    class: u8,
    /// The BTH's DestQP bytes of every packet in it when trains are cut per QP, else only its
    /// low byte (the rest zero).
    dest_qp: [u8; 3],
    start: usize,
    len: usize,
    segment: usize,
    count: usize,
    open: bool,
}

impl Train {
    fn takes(
        &self,
        dst: SocketAddr,
        class: u8,
        dest_qp: [u8; 3],
        len: usize,
        max_segments: usize,
    ) -> bool {
        self.open
            && self.dst == dst
            && self.class == class
            && self.dest_qp == dest_qp
            && len <= self.segment
            && self.count < max_segments
            && self.len + len <= MAX_UDP_PAYLOAD
    }
}

/// What is left of the last receive: datagrams of `segment` bytes (the last may be shorter)
/// from `at` to `len` in the receive buffer. Empty when `at == len`.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    src: SocketAddr,
    /// The TOS or traffic class byte it arrived with (`IP_RECVTOS`, `IPV6_RECVTCLASS`); GRO
    /// merges only datagrams whose bytes agree.
    class: u8,
    at: usize,
    len: usize,
    segment: usize,
}

/// A [`Backend`] over a UDP socket bound to port 4791, with segmentation offload both ways;
/// the kernel writes the IP and UDP headers. Needs no privileges.
#[derive(Debug)]
pub struct UdpBackend {
    socket: UdpSocket,
    local: SocketAddr,
    /// What each packet's IP header carries in its TOS or traffic class byte.
    classes: TrafficClasses,
    /// 1 when segmentation is off.
    max_segments: usize,
    /// [`UdpConfig::trains_per_qp`].
    trains_per_qp: bool,
    queue: Box<[u8]>,
    queued: usize,
    trains: Vec<Train>,
    buffer: Box<[u8]>,
    /// Room for the `UDP_GRO` control message.
    control: Box<[u8]>,
    arrival: Arrival,
    counters: IoCounters,
    unreachable: Unreachable,
    /// ICMP destination unreachable reports off the error queue.
    refusals: Refusals,
}

fn framing(src: SocketAddr, dst: SocketAddr) -> Option<KernelFraming> {
    match (src, dst) {
        (SocketAddr::V4(src), SocketAddr::V4(dst)) => Some(KernelFraming::V4 { src, dst }),
        (SocketAddr::V6(src), SocketAddr::V6(dst)) => Some(KernelFraming::V6 { src, dst }),
        _ => None,
    }
}

/// The DestQP bytes of a packet's BTH (bytes 5 to 7; the transport only builds whole packets).
fn dest_qp_bytes(packet: &[u8]) -> [u8; 3] {
    let mut qp = [0; 3];
    if let Some(bytes) = packet.get(5..8) {
        qp.copy_from_slice(bytes);
    }
    qp
}

/// A classic BPF program for a reuse-port group of `count` sockets, the Nth of which is engine
/// N's: it returns [`Lane::owner`](crate::transport::Lane::owner) of the datagram's DestQP.
/// The kernel runs it with the data starting at the UDP payload (`reuseport_select_sock`). A
/// datagram too short for the load ends the program with 0, the first engine's socket, whose
/// endpoint drops and counts it.
fn steering_program(count: u32) -> [libc::sock_filter; 6] {
    let op = |code: u32| code as u16;
    let insn = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    [
        // A = BTH bytes 4 to 7: a reserved byte, then DestQP.
        insn(op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS), 0, 0, 4),
        insn(
            op(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K),
            0,
            0,
            0x00ff_ffff,
        ),
        // QP0 and QP1 belong to the first engine (the device's CM): skip to the modulo only
        // above 1.
        insn(op(libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K), 1, 0, 1),
        insn(op(libc::BPF_RET | libc::BPF_K), 0, 0, 0),
        insn(op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K), 0, 0, count),
        insn(op(libc::BPF_RET | libc::BPF_A), 0, 0, 0),
    ]
}

fn std_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    addr.as_sockaddr_in()
        .map(|a| SocketAddr::V4((*a).into()))
        .or_else(|| addr.as_sockaddr_in6().map(|a| SocketAddr::V6((*a).into())))
}

impl UdpBackend {
    /// Gives this socket's reuse-port group (bound with [`UdpConfig::reuse_port`]) the program
    /// that steers each datagram to the socket of its QP's engine: of `count` sockets bound in
    /// engine order, the Nth is engine N's. Set once, on any of them.
    pub fn steer_by_dest_qp(&self, count: u32) -> io::Result<()> {
        let mut program = steering_program(count);
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        // The kernel copies the program during the call, while `program` lives.
        setsockopt(&self.socket, nix_sockopt::AttachReusePortCbpf, &fprog)?;
        Ok(())
    }

    /// Binds `address:4791` with the defaults of [`UdpConfig::new`].
    pub fn bind(address: IpAddr) -> io::Result<Self> {
        Self::with_config(UdpConfig::new(address))
    }

    /// Binds `config.address:4791`.
    pub fn with_config(config: UdpConfig) -> io::Result<Self> {
        Self::configure(None, config)
    }

    /// Takes `socket`, a UDP socket bound to `config.address:4791` already (by another member
    /// of its address group, `io::group`), with `config`'s options.
    pub(crate) fn adopt(socket: std::os::fd::OwnedFd, config: UdpConfig) -> io::Result<Self> {
        Self::configure(Some(Socket::from(socket)), config)
    }

    /// A descriptor of the backend's socket, for its address group's other members.
    pub(crate) fn socket(&self) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.socket.as_fd().try_clone_to_owned()
    }

    /// Sets `config`'s options on `bound`, or on a new socket that it then binds.
    fn configure(bound: Option<Socket>, config: UdpConfig) -> io::Result<Self> {
        let address = config.address;
        if address.is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a RoCEv2 backend binds a specific address: the ICRC covers it",
            ));
        }
        let classes = TrafficClasses::new(config.dscp, config.ecn, config.cnp_dscp)?;
        let class = classes.data();
        let local = SocketAddr::new(address, ROCEV2_UDP_PORT);
        let adopted = bound.is_some();
        let socket = match bound {
            Some(socket) => socket,
            None => Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?,
        };
        match address {
            IpAddr::V4(_) => {
                sockopt::set_ip_mtu_discover(&socket, sockopt::Ipv4PathMtuDiscovery::PROBE)?;
                socket.set_tos_v4(class.into())?;
                // ICMP errors for our packets, with their destination (icmp.rs).
                setsockopt(&socket, nix_sockopt::Ipv4RecvErr, &true)?;
                // Each datagram's TOS, for its ECN codepoint.
                setsockopt(&socket, nix_sockopt::IpRecvTos, &true)?;
            }
            IpAddr::V6(_) => {
                if !adopted {
                    socket.set_only_v6(true)?;
                }
                sockopt::set_ipv6_mtu_discover(&socket, sockopt::Ipv6PathMtuDiscovery::PROBE)?;
                socket.set_tclass_v6(class.into())?;
                setsockopt(&socket, UdpNoCheck6Rx, &true)?;
                setsockopt(&socket, nix_sockopt::Ipv6RecvErr, &true)?;
                setsockopt(&socket, nix_sockopt::Ipv6RecvTClass, &true)?;
            }
        }
        enlarge_socket_buffers(&socket);
        // Coalesced receives are safe whoever sends. Best effort: before Linux 5.0 there is no
        // UDP_GRO, no control message comes, and each receive is one datagram.
        let _ = setsockopt(&socket, nix_sockopt::UdpGroSegment, &true);
        // Before Linux 4.18 there is no UDP_SEGMENT, and each datagram is sent alone.
        let segments =
            config.segmentation && setsockopt(&socket, nix_sockopt::UdpGsoSegment, &0).is_ok();
        socket.set_nonblocking(true)?;
        if !adopted {
            socket.set_reuse_port(config.reuse_port)?;
            socket.bind(&local.into()).map_err(|e| {
                io::Error::new(e.kind(), format!("binding UDP {local} for RoCEv2: {e}"))
            })?;
        }
        Ok(UdpBackend {
            socket: UdpSocket::from_std(socket.into()),
            local,
            classes,
            max_segments: if segments { MAX_SEGMENTS } else { 1 },
            trains_per_qp: config.trains_per_qp,
            queue: vec![0u8; QUEUE_BYTES].into_boxed_slice(),
            queued: 0,
            trains: Vec::with_capacity(MAX_TRAINS),
            buffer: vec![0u8; MAX_UDP_PAYLOAD].into_boxed_slice(),
            // UDP_GRO's segment size, and the TOS or traffic class.
            control: nix::cmsg_space!(i32, i32).into_boxed_slice(),
            arrival: Arrival {
                src: local,
                class: 0,
                at: 0,
                len: 0,
                segment: 1,
            },
            counters: IoCounters::default(),
            unreachable: Unreachable::default(),
            refusals: Refusals::default(),
        })
    }

    /// Sends the queued trains, each with the `UDP_SEGMENT` size it needs. A train the kernel
    /// refuses is counted and dropped; only a dead socket is an error.
    fn send_trains(&mut self) -> io::Result<()> {
        let fd = self.socket.as_raw_fd();
        for train in &self.trains {
            let bytes = [IoSlice::new(
                &self.queue[train.start..train.start + train.len],
            )];
            // The segment size goes with each send, as a control message: the socket keeps no
            // size, so trains of different sizes cost no setsockopt between them. So does a
            // TOS other than the socket's (a CNP's).
            let segment = u16::try_from(train.segment).unwrap_or(u16::MAX);
            let class_v6 = i32::from(train.class);
            let class = if self.local.is_ipv4() {
                ControlMessage::Ipv4Tos(&train.class)
            } else {
                ControlMessage::Ipv6TClass(&class_v6)
            };
            let both = [ControlMessage::UdpGsoSegments(&segment), class];
            let control: &[ControlMessage<'_>] =
                match (train.count > 1, train.class != self.classes.data()) {
                    (true, true) => &both,
                    (true, false) => &both[..1],
                    (false, true) => &both[1..],
                    (false, false) => &[],
                };
            let to = SockaddrStorage::from(train.dst);
            let mut retried = false;
            let sent = loop {
                match sendmsg(fd, &bytes, control, MsgFlags::empty(), Some(&to)) {
                    Err(Errno::EINTR) => continue,
                    // The socket's error may be an ICMP report for an earlier packet, to any
                    // destination (IP_RECVERR sets it; a forged fragmentation-needed sets
                    // EMSGSIZE), which the kernel returns from the next call: if the error
                    // queue holds one, the error was its; send again, once.
                    Err(
                        e @ (Errno::ECONNREFUSED
                        | Errno::EHOSTUNREACH
                        | Errno::ENETUNREACH
                        | Errno::EMSGSIZE),
                    ) if !retried => {
                        retried = true;
                        if self.refusals.read(fd, &mut self.counters) > 0 {
                            continue;
                        }
                        break Err(io::Error::from(e));
                    }
                    sent => break sent.map_err(io::Error::from),
                }
            };
            let error = match sent {
                Ok(_) => {
                    self.counters.sent += train.count as u64;
                    self.counters.sends += 1;
                    continue;
                }
                Err(error) => error,
            };
            let failure = Failure::of(&error);
            if failure == Failure::Dead {
                return Err(error);
            }
            for _ in 0..train.count {
                self.counters.count_send_failure(failure, &error);
            }
            if failure == Failure::Unreachable {
                self.unreachable.note(train.dst.ip());
            }
        }
        Ok(())
    }

    /// Receives the next datagram, or coalesced run of them, into the buffer.
    fn next_arrival(&mut self) -> io::Result<Taken> {
        let mut iov = [IoSliceMut::new(&mut self.buffer)];
        let fd = self.socket.as_raw_fd();
        let msg = loop {
            match recvmsg::<SockaddrStorage>(
                fd,
                &mut iov,
                Some(&mut self.control),
                MsgFlags::empty(),
            ) {
                Ok(msg) => break msg,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(Taken::Nothing),
                Err(e) => {
                    let error = io::Error::from(e);
                    if Failure::of(&error) == Failure::Dead {
                        return Err(error);
                    }
                    // An ICMP error for one of our packets (ECONNREFUSED, EHOSTUNREACH, ...):
                    // the report itself waits on the error queue.
                    if self.refusals.read(fd, &mut self.counters) == 0 {
                        self.counters.receive_errors += 1;
                    }
                    return Ok(Taken::Dropped);
                }
            }
        };
        let len = msg.bytes;
        let mut segment = len;
        let mut class = 0;
        for cmsg in msg.cmsgs().into_iter().flatten() {
            match cmsg {
                ControlMessageOwned::UdpGroSegments(size) => {
                    segment = usize::try_from(size)
                        .ok()
                        .filter(|&size| size > 0)
                        .unwrap_or(len);
                }
                ControlMessageOwned::Ipv4Tos(tos) => class = tos,
                ControlMessageOwned::Ipv6TClass(tclass) => class = tclass as u8,
                _ => {}
            }
        }
        let src = msg.address.as_ref().and_then(std_addr);
        match src {
            Some(src) if len > 0 && !msg.flags.contains(MsgFlags::MSG_TRUNC) => {
                self.arrival = Arrival {
                    src,
                    class,
                    at: 0,
                    len,
                    segment,
                };
                Ok(Taken::Arrived)
            }
            // Empty, cut short or from nowhere: not a RoCE packet.
            _ => {
                self.counters.foreign += 1;
                Ok(Taken::Dropped)
            }
        }
    }
}

/// What one read of the socket gave.
enum Taken {
    /// Nothing was waiting.
    Nothing,
    /// A datagram that is lost: foreign, cut short, or a failed read.
    Dropped,
    /// A datagram, or a coalesced run of them, now in the buffer.
    Arrived,
}

impl Backend for UdpBackend {
    fn local_addr(&self) -> IpAddr {
        self.local.ip()
    }

    fn room(&mut self) -> io::Result<&mut [u8]> {
        if self.queue.len() - self.queued < MAX_PACKET_LEN || self.trains.len() == MAX_TRAINS {
            self.flush()?;
        }
        Ok(&mut self.queue[self.queued..])
    }

    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]> {
        let dst = SocketAddr::new(dst, ROCEV2_UDP_PORT);
        let Some(framing) = framing(self.local, dst) else {
            // The transport refuses such destinations; one that slips through costs a packet.
            self.counters.send_unreachable += 1;
            self.unreachable.note(dst.ip());
            return Ok(&[]);
        };
        let start = self.queued;
        if len > MAX_UDP_PAYLOAD || start + len > self.queue.len() {
            self.counters.send_too_big += 1;
            return Ok(&[]);
        }
        let max_segments = self.max_segments;
        let packet = &self.queue[start..start + len];
        // A train never mixes the processes of an address group: its QP numbers' low bytes
        // (`io::group`); per QP, if told.
        let dest_qp = dest_qp_bytes(packet);
        // A MAD for QP0 or QP1 goes alone: the peer's kernel steers it by its content, to the
        // process that listens on its port or owns its connection, which a train would not
        // let it do.
        let alone = dest_qp[..2] == [0, 0] && dest_qp[2] <= 1;
        let dest_qp = if self.trains_per_qp {
            dest_qp
        } else {
            [0, 0, dest_qp[2]]
        };
        let class = self.classes.of(packet);
        let joins = !alone
            && self
                .trains
                .last()
                .is_some_and(|t| t.takes(dst, class, dest_qp, len, max_segments));
        if !joins {
            // `room` flushed if the trains were full. A new train starts where the packet was
            // built, right after the last one: the queue stays one run of trains.
            self.trains.push(Train {
                dst,
                class,
                dest_qp,
                start,
                len: 0,
                segment: len,
                count: 0,
                open: true,
            });
        }
        let last = self.trains.len() - 1;
        let train = &mut self.trains[last];
        let packet = &mut self.queue[start..start + len];
        // The kernel numbers a train's segments from ID 0 (see the module documentation).
        framing.seal_with_ipv4_id(packet, train.count as u16);
        self.queued += len;
        train.len += len;
        train.count += 1;
        train.open = len == train.segment && !alone;
        Ok(&self.queue[start..start + len])
    }

    fn flush(&mut self) -> io::Result<()> {
        let sent = self.send_trains();
        // Sent, dropped, or failed with the error returned: none is sent twice.
        self.trains.clear();
        self.queued = 0;
        sent
    }

    fn traffic_class(&self, packet: &[u8]) -> u8 {
        self.classes.of(packet)
    }

    fn drain_unreachable(&mut self, each: &mut dyn FnMut(IpAddr)) {
        self.unreachable.drain(each);
    }

    fn drain_refusals(&mut self, each: &mut dyn FnMut(IpAddr, &[u8])) {
        self.refusals.drain(each);
    }

    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize> {
        // Every datagram taken counts against the budget, whether delivered or dropped.
        let mut taken = 0;
        while taken < budget {
            let Arrival {
                src,
                class,
                at,
                len,
                segment,
            } = self.arrival;
            if at == len {
                match self.next_arrival()? {
                    Taken::Nothing => break,
                    Taken::Dropped => taken += 1,
                    Taken::Arrived => {}
                }
                continue;
            }
            let end = len.min(at + segment);
            self.arrival.at = end;
            self.counters.received += 1;
            taken += 1;
            let Some(framing) = framing(src, self.local) else {
                self.counters.foreign += 1;
                continue;
            };
            let packet = &self.buffer[at..end];
            deliver(Datagram {
                src: src.ip(),
                src_port: src.port(),
                dst: self.local.ip(),
                ip_header: None,
                traffic_class: class,
                icrc: framing.verify_received(packet),
                packet,
            });
        }
        Ok(taken)
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        &mut self.socket
    }

    fn counters(&self) -> IoCounters {
        self.counters
    }
}
