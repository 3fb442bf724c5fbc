//! The io layer: the only code that makes syscalls. A [`Backend`] carries RoCE packets between
//! the transport core and the network: it frames what the core emits, computes its ICRC for that
//! framing, and tells the core how much of a received packet's ICRC it could verify.
//!
//! Two backends:
//!
//! - [`UdpBackend`], a UDP socket on port 4791, needs no privileges. The kernel writes the IP and
//!   UDP headers; over IPv4 the ICRC of a received packet is checked with the IP ID solved
//!   (a 16-bit check), over IPv6 fully. It batches with UDP segmentation offload both ways;
//! - [`RawBackend`], a raw IPv4 socket, needs `CAP_NET_RAW`. It writes every header field itself
//!   (DSCP, ECN, the IP ID, the per-QP UDP source port) and sees every received header, so it
//!   verifies every ICRC fully.

mod group;
pub(crate) mod holders;
mod icmp;
mod link;
mod raw;
mod recording;
mod udp;

use std::io;
use std::net::IpAddr;

pub use group::{GroupMember, PortBinding};
pub use link::{link_of, Link};
pub use raw::{IpIdMode, RawBackend, RawConfig, RawError};
pub use recording::Recording;
pub use udp::{UdpBackend, UdpConfig};

use crate::transport::Datagram;
use crate::wire::Opcode;

/// Packets moved and dropped by a backend, each drop by its cause, and the calls that sent
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Packets the kernel took for sending.
    pub sent: u64,
    /// The system calls that carried them: one per segmentation train (UDP backend) or per
    /// packet. `sent / sends` is how many packets a call carried.
    pub sends: u64,
    /// Datagrams read off the socket (each GRO segment one), foreign ones included.
    pub received: u64,
    /// Packets the kernel would not take for now: its send buffer was full (EAGAIN, ENOBUFS,
    /// ENOMEM). RC retransmits them.
    pub send_dropped: u64,
    /// Packets larger than the link allows (EMSGSIZE): the link's MTU shrank under the
    /// device's port MTU.
    pub send_too_big: u64,
    /// Packets to a destination the host cannot reach (no route, host or network down) or may
    /// not send to (a broadcast address, a firewall's EPERM, the other address family).
    pub send_unreachable: u64,
    /// Packets lost to any other send error.
    pub send_failed: u64,
    /// Receive calls that failed with an error that leaves the socket usable.
    pub receive_errors: u64,
    /// Received datagrams that are not RoCE packets for this endpoint: empty, cut short, of
    /// another family, or (raw backend) not RoCEv2.
    pub foreign: u64,
    /// ICMP destination unreachable reports for this backend's packets (UDP backend,
    /// `IP_RECVERR`), handed to the CM, which heeds only those for an unanswered REQ.
    pub icmp_unreachable: u64,
    /// Datagrams that reached this engine's socket for a QP of another engine of the device,
    /// handed to that engine (`engine::lanes`).
    pub handed_over: u64,
    /// Datagrams for another engine dropped because that engine had too many waiting.
    pub handover_dropped: u64,
}

/// Sums the counters of a device's engines.
impl std::ops::AddAssign<&IoCounters> for IoCounters {
    fn add_assign(&mut self, other: &IoCounters) {
        // Taken apart, so that a new counter cannot be left out of the sum.
        let IoCounters {
            sent,
            sends,
            received,
            send_dropped,
            send_too_big,
            send_unreachable,
            send_failed,
            receive_errors,
            foreign,
            icmp_unreachable,
            handed_over,
            handover_dropped,
        } = *other;
        self.sent += sent;
        self.sends += sends;
        self.received += received;
        self.send_dropped += send_dropped;
        self.send_too_big += send_too_big;
        self.send_unreachable += send_unreachable;
        self.send_failed += send_failed;
        self.receive_errors += receive_errors;
        self.foreign += foreign;
        self.icmp_unreachable += icmp_unreachable;
        self.handed_over += handed_over;
        self.handover_dropped += handover_dropped;
    }
}

/// What a failed send or receive means for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The socket itself is gone (EBADF, ENOTSOCK, EFAULT): the device stops, and its
    /// application gets this error.
    Dead,
    /// This packet is lost and nothing more; RC retransmits it.
    Dropped,
    /// Too large for the link: lost.
    TooBig,
    /// Nothing can reach the destination: lost, and the transport fails the connected QPs
    /// whose peer it is ([`crate::transport::Endpoint::handle_unreachable`]).
    Unreachable,
}

impl Failure {
    /// What a failed `sendto` or `recvmsg` means, by its errno.
    pub(crate) fn of(error: &io::Error) -> Failure {
        use nix::libc::*;
        match error.raw_os_error() {
            Some(EBADF | ENOTSOCK | EFAULT) => Failure::Dead,
            Some(EMSGSIZE) => Failure::TooBig,
            Some(
                EHOSTUNREACH | ENETUNREACH | EHOSTDOWN | ENETDOWN | EADDRNOTAVAIL | EACCES | EPERM
                | EAFNOSUPPORT | EINVAL | EDESTADDRREQ | ECONNREFUSED,
            ) => Failure::Unreachable,
            _ => Failure::Dropped,
        }
    }
}

impl IoCounters {
    /// Counts a packet that could not be sent for `failure` (which is not `Dead`).
    pub(crate) fn count_send_failure(&mut self, failure: Failure, error: &io::Error) {
        match failure {
            Failure::TooBig => self.send_too_big += 1,
            Failure::Unreachable => self.send_unreachable += 1,
            Failure::Dropped if is_congestion(error) => self.send_dropped += 1,
            Failure::Dropped | Failure::Dead => self.send_failed += 1,
        }
    }
}

/// The kernel is out of room for now, as opposed to refusing the packet.
fn is_congestion(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::WouldBlock
        || matches!(
            error.raw_os_error(),
            Some(nix::libc::ENOBUFS | nix::libc::ENOMEM)
        )
}

/// Destinations the last sends could not reach, each once, for the engine to hand to the
/// transport. Bounded: a flood of failures to many addresses keeps the first few.
#[derive(Debug, Default)]
pub(crate) struct Unreachable {
    destinations: Vec<IpAddr>,
}

/// Destinations kept between two drains.
const UNREACHABLE_KEPT: usize = 64;

impl Unreachable {
    /// Remembers `dst`, once; beyond the first 64 destinations, drops it.
    pub fn note(&mut self, dst: IpAddr) {
        if self.destinations.len() < UNREACHABLE_KEPT && !self.destinations.contains(&dst) {
            self.destinations.push(dst);
        }
    }

    /// Hands each remembered destination to `each`, and forgets them all.
    pub fn drain(&mut self, each: &mut dyn FnMut(IpAddr)) {
        for dst in self.destinations.drain(..) {
            each(dst);
        }
    }
}

/// A way onto the network.
///
/// One packet costs one packet: a backend never returns an error for a packet it could not
/// send or a datagram it could not read. It counts them ([`IoCounters`], by cause) and drops
/// them, and remembers destinations nothing can reach for
/// [`drain_unreachable`](Backend::drain_unreachable). Its methods return an error only when
/// the socket itself is gone, which ends the device.
pub trait Backend: Send + 'static {
    /// The address peers reach this backend at.
    fn local_addr(&self) -> IpAddr;

    /// Where the next packet is to be built: at least
    /// [`MAX_PACKET_LEN`](crate::transport::MAX_PACKET_LEN) bytes, in the buffer
    /// the backend sends from, so that the transport core writes each packet there once
    /// ([`Endpoint::poll_transmit_into`](crate::transport::Endpoint::poll_transmit_into)).
    /// It may flush what is queued to make room. What is written there without a
    /// [`commit`](Self::commit) is overwritten by the next packet.
    fn room(&mut self) -> io::Result<&mut [u8]>;

    /// Takes the first `len` bytes of [`room`](Self::room), a RoCE packet whose last four
    /// bytes are a zero ICRC, frames it for `dst` and seals its ICRC for that framing. It may
    /// then send it, or queue it for [`flush`](Self::flush), which a backend does by itself
    /// when its queue is full. Returns the packet as sealed, or nothing if it was dropped
    /// (counted: a `len` longer than the room is too big).
    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]>;

    /// Sends a copy of `packet`, through [`room`](Self::room) and [`commit`](Self::commit),
    /// and seals `packet` as the copy was. For callers that hold packets of their own; the
    /// engine builds in the room instead.
    fn send(&mut self, dst: IpAddr, packet: &mut [u8]) -> io::Result<()> {
        let len = packet.len();
        // `room` promises only `MAX_PACKET_LEN`: a longer packet gets the whole queue's room
        // after a flush, and is too big only if it outgrows even that.
        if self.room()?.len() < len {
            self.flush()?;
        }
        if let Some(room) = self.room()?.get_mut(..len) {
            room.copy_from_slice(packet);
        }
        let sealed = self.commit(dst, len)?;
        if sealed.len() == len {
            packet.copy_from_slice(sealed);
        }
        Ok(())
    }

    /// The UDP source port [`commit`](Self::commit) frames `packet` with, which its ICRC
    /// covers: the socket's, 4791, unless the backend writes its own UDP headers.
    fn udp_source_port(&self, _packet: &[u8]) -> u16 {
        crate::wire::ROCEV2_UDP_PORT
    }

    /// The IPv4 TOS or IPv6 traffic class byte [`commit`](Self::commit) sends `packet` with.
    fn traffic_class(&self, _packet: &[u8]) -> u8 {
        0
    }

    /// Sends whatever [`commit`](Self::commit) queued. Call it after each burst of sends, before
    /// waiting: a queued packet leaves no sooner.
    fn flush(&mut self) -> io::Result<()>;

    /// Hands each destination that a send since the last call could not reach at all (no
    /// route, refused, the wrong family) to `each`, once.
    fn drain_unreachable(&mut self, each: &mut dyn FnMut(IpAddr));

    /// Hands each ICMP destination unreachable that came back for this backend's packets
    /// since the last call to `each`: the destination the packet went to, and the start of
    /// the packet as the report quotes it (from the BTH on). A backend that hears none (the
    /// default) hands none.
    fn drain_refusals(&mut self, _each: &mut dyn FnMut(IpAddr, &[u8])) {}

    /// Takes up to `budget` datagrams off the socket without blocking, hands those that are
    /// RoCE packets to `deliver`, and returns how many it took, dropped ones (foreign, cut
    /// short, a failed read) included. The budget keeps a flood of arrivals, whatever they
    /// are, from starving transmission: a caller that gets `budget` back must call again
    /// before it sleeps, since readiness is edge-triggered. Otherwise it reads until the
    /// socket has nothing more. The engine calls it in every turn that does not sleep, with
    /// or without readiness (a read that finds nothing costs what asking epoll would), and
    /// after a sleep only once [`source`] has been readable (or in error) since.
    ///
    /// [`source`]: Backend::source
    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize>;

    /// What the engine's poll waits on for received datagrams.
    fn source(&mut self) -> &mut dyn mio::event::Source;

    /// The backend's counters so far.
    fn counters(&self) -> IoCounters;
}

/// The socket buffers asked for; the kernel caps them at `net.core.{r,w}mem_max`.
const SOCKET_BUFFER: usize = 8 << 20;

/// Asks for large socket buffers, best effort. A burst of full-MTU packets that no window holds
/// back (UD datagrams, the responses of many READs) can arrive while the engine thread is not
/// running, and with the default receive buffer (net.core.rmem_default, about 25 packets of
/// 4 KiB on a raw socket) the kernel drops the rest: for UD, lost messages. A process with
/// CAP_NET_ADMIN is not held to net.core.rmem_max (`SO_RCVBUFFORCE`); any other gets at most that.
fn enlarge_socket_buffers(socket: &socket2::Socket) {
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(socket, SOCKET_BUFFER).is_err() {
        let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    }
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
}

/// The IPv4 TOS or IPv6 traffic class byte each packet leaves with. Both are masked out of the
/// ICRC, so switches may rewrite them, and mark CE.
///
/// RoCE packets carry the configured DSCP and ECN codepoint (ECT(0) by default, as ConnectX
/// sends them, so that a congested switch marks rather than drops). CNPs carry their own DSCP
/// (mlx5's `np_cnp_dscp`, 48 by default) and the same ECN codepoint, as a ConnectX-4 Lx's CNP
/// does (TOS 0xc2: `packet-fixtures/vectors/connectx4lx_cnp.hex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TrafficClasses {
    data: u8,
    cnp: u8,
}

impl TrafficClasses {
    /// From a DSCP (0 to 63), an ECN codepoint (0 to 3) and the CNPs' DSCP.
    pub fn new(dscp: u8, ecn: u8, cnp_dscp: u8) -> io::Result<Self> {
        if dscp > 63 || ecn > 3 || cnp_dscp > 63 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "DSCP {dscp}, ECN {ecn} and CNP DSCP {cnp_dscp}: a DSCP is 0 to 63, ECN 0 to 3"
                ),
            ));
        }
        Ok(TrafficClasses {
            data: dscp << 2 | ecn,
            cnp: cnp_dscp << 2 | ecn,
        })
    }

    /// What every packet but a CNP carries.
    pub fn data(&self) -> u8 {
        self.data
    }

    /// The byte for `packet`, a RoCE packet from its BTH on.
    pub fn of(&self, packet: &[u8]) -> u8 {
        if packet.first() == Some(&Opcode::Cnp.value()) {
            self.cnp
        } else {
            self.data
        }
    }
}

/// The DSCP mlx5 sends CNPs with (`np_cnp_dscp`).
pub const DEFAULT_CNP_DSCP: u8 = 48;
