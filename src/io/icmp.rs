//! What the network says back about our packets: ICMP destination unreachable (no host, no
//! port, no route, prohibited), which the kernel hands a UDP socket that asked for it
//! (`IP_RECVERR`, `IPV6_RECVERR`; ip(7)) on its error queue, with the destination the packet
//! went to and the part of it the ICMP message quotes. A packet whose destination has no
//! RoCE device gets one at once on loopback, and from most hosts.
//!
//! Nothing here decides what a report means: ICMP is easily forged, and the CM weighs it
//! ([`CmEndpoint::peer_refused`](crate::cm::CmEndpoint::peer_refused)).

use std::io::IoSliceMut;
use std::net::IpAddr;
use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::libc;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};

use super::IoCounters;

/// How much of a quoted packet is kept: the BTH, the DETH and the start of a MAD up to a
/// CM message's first field, which names the request.
pub(crate) const QUOTE_KEPT: usize = 12 + 8 + 24 + 4;
/// Reports kept between two drains; beyond them, reports are counted and dropped.
const KEPT: usize = 64;
/// ICMP's and ICMPv6's "destination unreachable" types.
const ICMP_DEST_UNREACH: u8 = 3;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMP_FRAG_NEEDED: u8 = 4;

/// One report: where the packet went and the start of it.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    dst: IpAddr,
    quoted: [u8; QUOTE_KEPT],
    len: usize,
}

/// Destination-unreachable reports read off a socket's error queue, for the engine.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    kept: Vec<Refusal>,
}

impl Refusals {
    /// Reads every report waiting on `fd`'s error queue (the kernel sets the socket's error
    /// too, which a failed call said: the caller's cue), and returns how many there were.
    /// Counts each: as `icmp_unreachable`, or, if it is not a destination unreachable,
    /// `receive_errors`.
    pub(crate) fn read(&mut self, fd: RawFd, counters: &mut IoCounters) -> usize {
        let mut read = 0;
        let mut quoted = [0u8; QUOTE_KEPT];
        let mut control = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
        loop {
            let mut iov = [IoSliceMut::new(&mut quoted)];
            let msg = match recvmsg::<SockaddrStorage>(
                fd,
                &mut iov,
                Some(&mut control),
                MsgFlags::MSG_ERRQUEUE,
            ) {
                Ok(msg) => msg,
                Err(Errno::EINTR) => continue,
                Err(_) => return read, // EAGAIN: the queue is empty
            };
            read += 1;
            let unreachable = msg.cmsgs().is_ok_and(|mut cmsgs| {
                cmsgs.any(|cmsg| match cmsg {
                    // (Code 4, fragmentation needed, is path MTU discovery's, which the
                    // socket ignores: IP_PMTUDISC_PROBE.)
                    ControlMessageOwned::Ipv4RecvErr(e, _) => {
                        e.ee_origin == libc::SO_EE_ORIGIN_ICMP
                            && e.ee_type == ICMP_DEST_UNREACH
                            && e.ee_code != ICMP_FRAG_NEEDED
                    }
                    ControlMessageOwned::Ipv6RecvErr(e, _) => {
                        e.ee_origin == libc::SO_EE_ORIGIN_ICMP6 && e.ee_type == ICMPV6_DEST_UNREACH
                    }
                    _ => false,
                })
            });
            let dst = msg.address.as_ref().and_then(|a| {
                (a.as_sockaddr_in().map(|a| IpAddr::from(a.ip())))
                    .or_else(|| a.as_sockaddr_in6().map(|a| IpAddr::from(a.ip())))
            });
            let len = msg.bytes.min(QUOTE_KEPT);
            match dst {
                Some(dst) if unreachable => {
                    counters.icmp_unreachable += 1;
                    if self.kept.len() < KEPT {
                        self.kept.push(Refusal { dst, quoted, len });
                    }
                }
                _ => counters.receive_errors += 1,
            }
        }
    }

    /// Hands each report to `each`, and forgets them.
    pub(crate) fn drain(&mut self, each: &mut dyn FnMut(IpAddr, &[u8])) {
        for r in self.kept.drain(..) {
            each(r.dst, &r.quoted[..r.len]);
        }
    }
}
