//! The UDP backend: a socket bound to `address:4791`.
//!
//! It sets `IP_PMTUDISC_DO` and sends with `sendto` on an unconnected socket, so the kernel
//! frames every IPv4 datagram with DF and IP ID 0, and the ICRC computed in advance is right
//! (see `wire::icrc`). A UDP socket does not deliver the IP header, so over IPv4 it can verify
//! only ICRCs framed with ID 0 (softroce's own); others are reported unverified. Over IPv6 every
//! covered field is known, and the ICRC is verified fully.

use std::io;
use std::net::{IpAddr, SocketAddr};

use mio::net::UdpSocket;
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};

use super::{Backend, IoCounters};
use crate::transport::Datagram;
use crate::wire::{IcrcStatus, KernelFraming, ROCEV2_UDP_PORT};

/// The socket buffers asked for; the kernel caps them at net.core.[rw]mem_max.
const SOCKET_BUFFER: usize = 8 << 20;
/// The largest RoCE packet: a 4096-byte MTU plus headers, within a 9000-byte jumbo frame.
const MAX_DATAGRAM: usize = 9000;

#[derive(Debug)]
pub struct UdpBackend {
    socket: UdpSocket,
    local: IpAddr,
    buffer: Box<[u8]>,
    counters: IoCounters,
}

fn framing(src: SocketAddr, dst: SocketAddr) -> Option<KernelFraming> {
    match (src, dst) {
        (SocketAddr::V4(src), SocketAddr::V4(dst)) => Some(KernelFraming::V4 { src, dst }),
        (SocketAddr::V6(src), SocketAddr::V6(dst)) => Some(KernelFraming::V6 { src, dst }),
        _ => None,
    }
}

impl UdpBackend {
    /// Binds `address:4791`.
    pub fn bind(address: IpAddr) -> io::Result<Self> {
        let local = SocketAddr::new(address, ROCEV2_UDP_PORT);
        let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
        match address {
            IpAddr::V4(_) => {
                sockopt::set_ip_mtu_discover(&socket, sockopt::Ipv4PathMtuDiscovery::DO)?
            }
            IpAddr::V6(_) => {
                socket.set_only_v6(true)?;
                sockopt::set_ipv6_mtu_discover(&socket, sockopt::Ipv6PathMtuDiscovery::DO)?
            }
        }
        // Best effort: without privileges the kernel caps these at its limits.
        let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
        socket.set_nonblocking(true)?;
        socket.bind(&local.into()).map_err(|e| {
            io::Error::new(e.kind(), format!("binding UDP {local} for RoCEv2: {e}"))
        })?;
        Ok(UdpBackend {
            socket: UdpSocket::from_std(socket.into()),
            local: address,
            buffer: vec![0u8; MAX_DATAGRAM].into_boxed_slice(),
            counters: IoCounters::default(),
        })
    }

    fn local_socket(&self) -> SocketAddr {
        SocketAddr::new(self.local, ROCEV2_UDP_PORT)
    }
}

impl Backend for UdpBackend {
    fn local_addr(&self) -> IpAddr {
        self.local
    }

    fn send(&mut self, dst: IpAddr, packet: &mut [u8]) -> io::Result<()> {
        let dst = SocketAddr::new(dst, ROCEV2_UDP_PORT);
        let Some(framing) = framing(self.local_socket(), dst) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "IPv4 and IPv6 mixed",
            ));
        };
        framing.seal(packet);
        match self.socket.send_to(packet, dst) {
            Ok(_) => self.counters.sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.counters.send_dropped += 1,
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize> {
        let local = self.local_socket();
        let mut handed = 0;
        while handed < budget {
            let (len, src) = match self.socket.recv_from(&mut self.buffer) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            self.counters.received += 1;
            let packet = &self.buffer[..len];
            let icrc = match framing(src, local) {
                Some(framing @ KernelFraming::V6 { .. }) => framing.verify(packet),
                // Over IPv4 only an ID-0 framing can be checked without the IP header.
                Some(framing @ KernelFraming::V4 { .. }) => match framing.verify(packet) {
                    IcrcStatus::Ok => IcrcStatus::Ok,
                    _ => IcrcStatus::Unverified,
                },
                None => {
                    self.counters.foreign += 1;
                    continue;
                }
            };
            deliver(Datagram {
                src: src.ip(),
                dst: self.local,
                ip_header: None,
                icrc,
                packet,
            });
            handed += 1;
        }
        Ok(handed)
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        &mut self.socket
    }

    fn counters(&self) -> IoCounters {
        self.counters
    }
}
