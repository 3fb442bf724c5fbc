//! The invariant CRC of RoCEv2 (IBTA Annex A17.8), computed and verified.
//!
//! The ICRC is a CRC-32 (the Ethernet polynomial, as `crc32fast` computes it) over:
//!
//! 1. eight bytes of 0xFF, standing in for the InfiniBand LRH that RoCEv2 does not carry;
//! 2. the IP header, with the fields routers may change masked to ones:
//!    IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header, with its checksum masked to ones;
//! 4. the BTH, with byte 4 (FECN, BECN and the reserved bits) masked to ones;
//! 5. the rest of the packet through the pad.
//!
//! It travels least-significant byte first.
//!
//! # What can be verified without the IP header
//!
//! The IPv4 identification and flags are covered and not masked, and a UDP socket does not
//! deliver them. So:
//!
//! - a sender that lets the kernel frame its datagrams must know the ID the kernel will write.
//!   With `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an *unconnected* socket, Linux sends DF with
//!   ID 0 (a connected socket gets a per-socket counter). [`KernelFraming`] computes the ICRC
//!   for that framing;
//! - a receiver on a UDP socket knows, over IPv4, the addresses (with `IP_PKTINFO`), the ports
//!   and the lengths, but not the ID and the flags. rxe writes a hash-based ID and ConnectX an
//!   incrementing one, so their ICRCs cannot be checked against a guessed ID.
//!   [`KernelFraming::verify`] over IPv4 checks only packets framed with ID 0 and DF, as
//!   softroce's own UDP sender frames them, and says `Bad` for any other ID;
//! - over IPv6 every covered field is known or masked, so a UDP receiver verifies fully;
//! - a receiver that sees whole frames (pcap, AF_PACKET, raw sockets) verifies every packet with
//!   [`icrc_ipv4`] and [`icrc_ipv6`], as [`Frame::icrc_status`](super::Frame::icrc_status) does.

use core::net::{SocketAddrV4, SocketAddrV6};

use crc32fast::Hasher;

use super::bth;

/// The ICRC's length on the wire.
pub const ICRC_LEN: usize = 4;

const IPV4_MAX_HEADER: usize = 60;
const IPV6_HEADER: usize = 40;
const UDP_HEADER: usize = 8;
const IP_PROTO_UDP: u8 = 17;

/// The outcome of checking a received packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcStatus {
    Ok,
    Bad {
        computed: u32,
        received: u32,
    },
    /// The covered bytes were not all known, so nothing was checked.
    Unverified,
}

impl IcrcStatus {
    /// Compares a computed ICRC with the one received.
    pub fn check(computed: u32, received: u32) -> Self {
        if computed == received {
            IcrcStatus::Ok
        } else {
            IcrcStatus::Bad { computed, received }
        }
    }

    /// `ok`, `bad` or `unverified`.
    pub fn as_str(self) -> &'static str {
        match self {
            IcrcStatus::Ok => "ok",
            IcrcStatus::Bad { .. } => "bad",
            IcrcStatus::Unverified => "unverified",
        }
    }
}

/// Feeds the masked UDP header and the packet from its BTH on, up to the ICRC.
fn finish(mut hasher: Hasher, udp_header: [u8; UDP_HEADER], covered: &[u8]) -> u32 {
    let mut udp = udp_header;
    udp[6..8].fill(0xff);
    hasher.update(&udp);
    let masked = bth::ICRC_MASKED_BYTE;
    if covered.len() > masked {
        hasher.update(&covered[..masked]);
        hasher.update(&[0xff]);
        hasher.update(&covered[masked + 1..]);
    } else {
        hasher.update(covered);
    }
    hasher.finalize()
}

fn start() -> Hasher {
    let mut hasher = Hasher::new();
    hasher.update(&[0xff; 8]);
    hasher
}

/// The ICRC of a packet carried over IPv4.
///
/// `ip_header` is the whole IPv4 header as sent (20 to 60 bytes, options included),
/// `udp_header` the UDP header, and `covered` the RoCE packet from the BTH through the pad,
/// without the ICRC. A longer `ip_header` is cut at 60 bytes.
pub fn icrc_ipv4(ip_header: &[u8], udp_header: [u8; UDP_HEADER], covered: &[u8]) -> u32 {
    let len = ip_header.len().min(IPV4_MAX_HEADER);
    let mut ip = [0u8; IPV4_MAX_HEADER];
    ip[..len].copy_from_slice(&ip_header[..len]);
    for masked in [1, 8, 10, 11] {
        ip[masked] = 0xff;
    }
    let mut hasher = start();
    hasher.update(&ip[..len]);
    finish(hasher, udp_header, covered)
}

/// The ICRC of a packet carried over IPv6: `ip_header` is the fixed 40-byte header.
pub fn icrc_ipv6(
    ip_header: &[u8; IPV6_HEADER],
    udp_header: [u8; UDP_HEADER],
    covered: &[u8],
) -> u32 {
    let mut ip = *ip_header;
    // Version stays; traffic class and flow label (the rest of the first word) are masked.
    ip[0] |= 0x0f;
    ip[1..4].fill(0xff);
    ip[7] = 0xff;
    let mut hasher = start();
    hasher.update(&ip);
    finish(hasher, udp_header, covered)
}

/// The IP and UDP framing the kernel gives a datagram sent through a UDP socket with
/// `IP_PMTUDISC_DO` (unconnected): IPv4 with DF and ID 0, or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFraming {
    V4 {
        src: SocketAddrV4,
        dst: SocketAddrV4,
    },
    V6 {
        src: SocketAddrV6,
        dst: SocketAddrV6,
    },
}

impl KernelFraming {
    fn udp_header(src_port: u16, dst_port: u16, roce_len: usize) -> [u8; UDP_HEADER] {
        let mut udp = [0u8; UDP_HEADER];
        udp[0..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&((UDP_HEADER + roce_len) as u16).to_be_bytes());
        udp
    }

    /// The ICRC of `covered` (the RoCE packet without its ICRC) as the kernel will frame it.
    pub fn icrc(&self, covered: &[u8]) -> u32 {
        let roce_len = covered.len() + ICRC_LEN;
        match self {
            KernelFraming::V4 { src, dst } => {
                let mut ip = [0u8; 20];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&((20 + UDP_HEADER + roce_len) as u16).to_be_bytes());
                // ID 0 (bytes 4..6), then DF and fragment offset 0.
                ip[6] = 0x40;
                ip[9] = IP_PROTO_UDP;
                ip[12..16].copy_from_slice(&src.ip().octets());
                ip[16..20].copy_from_slice(&dst.ip().octets());
                let udp = Self::udp_header(src.port(), dst.port(), roce_len);
                icrc_ipv4(&ip, udp, covered)
            }
            KernelFraming::V6 { src, dst } => {
                let mut ip = [0u8; IPV6_HEADER];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&((UDP_HEADER + roce_len) as u16).to_be_bytes());
                ip[6] = IP_PROTO_UDP;
                ip[8..24].copy_from_slice(&src.ip().octets());
                ip[24..40].copy_from_slice(&dst.ip().octets());
                let udp = Self::udp_header(src.port(), dst.port(), roce_len);
                icrc_ipv6(&ip, udp, covered)
            }
        }
    }

    /// Writes the ICRC into the last four bytes of `packet`, a whole RoCE packet.
    /// Does nothing to a buffer shorter than an ICRC.
    pub fn seal(&self, packet: &mut [u8]) {
        let Some(split) = packet.len().checked_sub(ICRC_LEN) else {
            return;
        };
        let icrc = self.icrc(&packet[..split]);
        packet[split..].copy_from_slice(&icrc.to_le_bytes());
    }

    /// Checks a received packet's ICRC, assuming this framing: fully meaningful over IPv6; over
    /// IPv4 only for senders that frame with ID 0 and DF (see the module documentation).
    pub fn verify(&self, packet: &[u8]) -> IcrcStatus {
        let Some(split) = packet.len().checked_sub(ICRC_LEN) else {
            return IcrcStatus::Unverified;
        };
        let (covered, icrc) = packet.split_at(split);
        let received = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
        IcrcStatus::check(self.icrc(covered), received)
    }
}
