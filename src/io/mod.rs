//! The io layer: the only code that makes syscalls. A [`Backend`] carries RoCE packets between
//! the transport core and the network: it frames what the core emits, computes its ICRC for that
//! framing, and tells the core how much of a received packet's ICRC it could verify.

mod udp;

use std::io;
use std::net::IpAddr;

pub use udp::UdpBackend;

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

    /// Frames `packet` (a RoCE packet whose last four bytes are a zero ICRC) for `dst`, seals
    /// its ICRC for that framing, and sends it, or drops and counts it if the kernel is full.
    fn send(&mut self, dst: IpAddr, packet: &mut [u8]) -> io::Result<()>;

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
