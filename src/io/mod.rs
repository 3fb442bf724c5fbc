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

mod link;
mod raw;
mod recording;
mod udp;

use std::io;
use std::net::IpAddr;

pub use link::{link_of, Link};
pub use raw::{IpIdMode, RawBackend, RawConfig, RawError};
pub use recording::Recording;
pub use udp::{UdpBackend, UdpConfig};

use crate::transport::Datagram;

/// Packets moved and dropped by a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub sent: u64,
    pub received: u64,
    /// Packets the kernel would not take (its send buffer was full). RC retransmits them.
    pub send_dropped: u64,
    /// Received datagrams that are not RoCE packets for this endpoint.
    pub foreign: u64,
}

/// A way onto the network.
pub trait Backend: Send + 'static {
    /// The address peers reach this backend at.
    fn local_addr(&self) -> IpAddr;

    /// Frames `packet` (a RoCE packet whose last four bytes are a zero ICRC) for `dst` and seals
    /// its ICRC for that framing. It may then send it, or queue it for [`flush`](Self::flush),
    /// which a backend does by itself when its queue is full; either way a packet the kernel
    /// will not take is dropped and counted, not returned as an error.
    fn send(&mut self, dst: IpAddr, packet: &mut [u8]) -> io::Result<()>;

    /// The UDP source port [`send`](Self::send) frames `packet` with, which its ICRC covers:
    /// the socket's, 4791, unless the backend writes its own UDP headers.
    fn udp_source_port(&self, _packet: &[u8]) -> u16 {
        crate::wire::ROCEV2_UDP_PORT
    }

    /// Sends whatever [`send`](Self::send) queued. Call it after each burst of sends, before
    /// waiting: a queued packet leaves no sooner.
    fn flush(&mut self) -> io::Result<()>;

    /// Hands up to `budget` waiting datagrams to `deliver`, without blocking, and returns how
    /// many it handed over. The budget keeps a flood of arrivals from starving transmission: a
    /// caller that gets `budget` back must call again before it sleeps, since readiness is
    /// edge-triggered.
    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize>;

    /// What the engine's poll waits on for received datagrams.
    fn source(&mut self) -> &mut dyn mio::event::Source;

    fn counters(&self) -> IoCounters;
}

/// The IPv4 TOS or IPv6 traffic class byte for a DSCP (0 to 63) and ECN codepoint (0 to 3).
/// Both are masked out of the ICRC, so routers may rewrite them.
fn traffic_class(dscp: u8, ecn: u8) -> io::Result<u8> {
    if dscp > 63 || ecn > 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("DSCP {dscp} and ECN {ecn}: DSCP is 0 to 63, ECN 0 to 3"),
        ));
    }
    Ok(dscp << 2 | ecn)
}
