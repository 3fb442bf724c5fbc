//! A received datagram as the io layer hands it to the core, and the 40 bytes that start every
//! UD receive buffer.
//!
//! Verbs reserve the first 40 bytes of a UD receive buffer for the GRH (`ibv_post_recv(3)`), and
//! rdma-core's `ibv_init_ah_from_wc` reads the sender's address back from them. RoCEv2 carries no
//! GRH; rxe writes the IP header there instead (rxe_resp.c, `execute`): over IPv6 the whole
//! 40-byte IPv6 header, over IPv4 20 zero bytes and then the 20-byte IPv4 header, without options.
//!
//! A raw socket or AF_PACKET sees the IP header, and the core copies it as received. A UDP socket
//! does not, so the core builds the header from what it knows. These fields are known: the
//! version, the addresses (`IP_PKTINFO` gives the destination), the protocol (UDP) and the lengths.
//! These are synthesised, because a UDP socket does not report them:
//!
//! - IPv4: identification 0, flags DF, TTL 64; the checksum is computed over the synthesised
//!   header, so rdma-core's checksum test of the IPv4 header passes;
//! - IPv6: flow label 0, hop limit 64.
//!
//! The DSCP and ECN byte is the one received when the io layer reads it (`IP_RECVTOS`,
//! `IPV6_RECVTCLASS`), else 0.
//!
//! 64 is Linux's default TTL (`net.ipv4.ip_default_ttl`); DF with ID 0 is how Linux frames a
//! datagram from an unconnected `IP_PMTUDISC_DO` socket, as softroce's own sender does.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::{Ecn, IcrcStatus};

/// The bytes reserved for the GRH at the start of a UD receive buffer.
pub const GRH_LEN: usize = 40;

const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
const IP_PROTO_UDP: u8 = 17;
const SYNTHESISED_TTL: u8 = 64;

/// One received RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The sender's address.
    pub src: IpAddr,
    /// The sender's UDP source port. The ICRC covers it, and peers choose it per QP (rxe and
    /// ConnectX derive it from the QPNs), so a capture of the datagram needs it.
    pub src_port: u16,
    /// The address the datagram was sent to.
    pub dst: IpAddr,
    /// The IP header as received (IPv4 from its first byte, options allowed; IPv6 the fixed 40
    /// bytes), when the io layer has it. `None` on a UDP socket: the core then synthesises one.
    pub ip_header: Option<&'a [u8]>,
    /// The IPv4 TOS or IPv6 traffic class byte it arrived with (DSCP and ECN), or 0 where the
    /// io layer cannot read it.
    pub traffic_class: u8,
    /// What the io layer could verify of the ICRC.
    pub icrc: IcrcStatus,
    /// The UDP payload: the RoCE packet, ICRC included.
    pub packet: &'a [u8],
}

impl Datagram<'_> {
    /// Its ECN codepoint: CE where a switch on the way marked it.
    pub fn ecn(&self) -> Ecn {
        Ecn::of_traffic_class(self.traffic_class)
    }

    /// Whether `ip_header`, when given, is long enough for the IP version its first byte names.
    pub(crate) fn ip_header_fits(&self) -> bool {
        match self.ip_header {
            None => true,
            Some(header) => match header.first().map(|b| b >> 4) {
                Some(4) => header.len() >= IPV4_HEADER_LEN,
                Some(6) => header.len() >= IPV6_HEADER_LEN,
                _ => false,
            },
        }
    }

    /// The 40 bytes a UD receive buffer starts with. Only for a datagram whose header fits.
    pub(crate) fn grh(&self) -> [u8; GRH_LEN] {
        let mut grh = [0u8; GRH_LEN];
        let v4_at = GRH_LEN - IPV4_HEADER_LEN;
        match self.ip_header {
            Some(header) if header[0] >> 4 == 4 => {
                grh[v4_at..].copy_from_slice(&header[..IPV4_HEADER_LEN]);
            }
            Some(header) => grh.copy_from_slice(&header[..IPV6_HEADER_LEN]),
            None => match (self.src.to_canonical(), self.dst.to_canonical()) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => {
                    grh[v4_at..].copy_from_slice(&ipv4_header(
                        src,
                        dst,
                        self.traffic_class,
                        self.packet.len(),
                    ));
                }
                (src, dst) => {
                    grh.copy_from_slice(&ipv6_header(
                        v6(src),
                        v6(dst),
                        self.traffic_class,
                        self.packet.len(),
                    ));
                }
            },
        }
        grh
    }
}

fn v6(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// A length field, saturated rather than wrapped for a datagram no IP packet could carry.
fn len16(len: usize) -> [u8; 2] {
    u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes()
}

fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, tos: u8, udp_payload: usize) -> [u8; IPV4_HEADER_LEN] {
    let mut h = [0u8; IPV4_HEADER_LEN];
    h[0] = 0x45; // version 4, 5 words
    h[1] = tos;
    h[2..4].copy_from_slice(&len16(IPV4_HEADER_LEN + UDP_HEADER_LEN + udp_payload));
    h[6] = 0x40; // DF, fragment offset 0
    h[8] = SYNTHESISED_TTL;
    h[9] = IP_PROTO_UDP;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let checksum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&checksum.to_be_bytes());
    h
}

fn ipv6_header(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    class: u8,
    udp_payload: usize,
) -> [u8; IPV6_HEADER_LEN] {
    let mut h = [0u8; IPV6_HEADER_LEN];
    // Version 6, then the traffic class across the next two nibbles.
    h[0] = 0x60 | class >> 4;
    h[1] = class << 4;
    h[4..6].copy_from_slice(&len16(UDP_HEADER_LEN + udp_payload));
    h[6] = IP_PROTO_UDP;
    h[7] = SYNTHESISED_TTL;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h
}

/// The RFC 791 header checksum: the ones' complement of the ones' complement sum of the 16-bit
/// words, with the checksum field itself zero.
fn ipv4_checksum(header: &[u8; IPV4_HEADER_LEN]) -> u16 {
    let sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    // Ten words sum to under 2^20: two folds bring the carries back in.
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    !(folded as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(src: IpAddr, dst: IpAddr, header: Option<&[u8]>) -> Datagram<'_> {
        Datagram {
            src,
            src_port: 4791,
            dst,
            ip_header: header,
            traffic_class: 0,
            icrc: IcrcStatus::Ok,
            packet: &[0; 100],
        }
    }

    #[test]
    fn the_ipv4_checksum_of_a_known_header() {
        // The worked example of Wikipedia's "IPv4 header checksum" article: 0xb861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(
            ipv4_checksum(&h),
            0,
            "a header with its checksum sums to zero"
        );
    }

    #[test]
    fn a_synthesised_ipv4_grh() {
        let src = Ipv4Addr::new(10, 0, 0, 1);
        let dst = Ipv4Addr::new(10, 0, 0, 2);
        let grh = datagram(src.into(), dst.into(), None).grh();
        assert_eq!(grh[..20], [0; 20]);
        let ip: [u8; 20] = grh[20..].try_into().unwrap();
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 100);
        assert_eq!((ip[6], ip[8], ip[9]), (0x40, 64, 17));
        assert_eq!(ip[12..16], src.octets());
        assert_eq!(ip[16..20], dst.octets());
        assert_eq!(ipv4_checksum(&ip), 0);
        // The received DSCP and ECN byte goes in, and the checksum covers it.
        let mut marked = datagram(src.into(), dst.into(), None);
        marked.traffic_class = 26 << 2 | 3;
        assert_eq!(marked.ecn(), Ecn::Ce);
        let grh = marked.grh();
        assert_eq!(grh[21], 26 << 2 | 3);
        assert_eq!(ipv4_checksum(&grh[20..].try_into().unwrap()), 0);
    }

    #[test]
    fn a_synthesised_ipv6_grh_and_mixed_families() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst = Ipv4Addr::new(10, 0, 0, 2);
        let grh = datagram(src.into(), dst.into(), None).grh();
        assert_eq!(grh[0] >> 4, 6);
        assert_eq!(u16::from_be_bytes([grh[4], grh[5]]), 8 + 100);
        assert_eq!((grh[6], grh[7]), (17, 64));
        assert_eq!(grh[8..24], src.octets());
        assert_eq!(grh[24..40], dst.to_ipv6_mapped().octets());
        let mut marked = datagram(src.into(), dst.into(), None);
        marked.traffic_class = 0xab;
        let grh = marked.grh();
        assert_eq!((grh[0], grh[1] & 0xf0), (0x6a, 0xb0));
        // An IPv4-mapped IPv6 pair, as a dual-stack socket reports IPv4 peers, is IPv4.
        let mapped = |a: Ipv4Addr| IpAddr::V6(a.to_ipv6_mapped());
        let grh = datagram(mapped(Ipv4Addr::LOCALHOST), mapped(dst), None).grh();
        assert_eq!(grh[20], 0x45);
    }

    #[test]
    fn a_received_header_is_copied_as_is() {
        let mut v4 = [0u8; 24]; // with one option word, which the GRH leaves out
        v4[0] = 0x46;
        v4[8] = 3; // TTL
        v4[4] = 0xab; // identification
        let d = datagram(
            Ipv4Addr::LOCALHOST.into(),
            Ipv4Addr::LOCALHOST.into(),
            Some(&v4),
        );
        assert!(d.ip_header_fits());
        assert_eq!(d.grh()[20..], v4[..20]);
        let mut v6 = [7u8; 40];
        v6[0] = 0x60;
        let d = datagram(
            Ipv6Addr::LOCALHOST.into(),
            Ipv6Addr::LOCALHOST.into(),
            Some(&v6),
        );
        assert_eq!(d.grh(), v6);
        for bad in [&[][..], &[0x45; 19][..], &[0x60; 39][..], &[0x50; 40][..]] {
            let d = datagram(
                Ipv4Addr::LOCALHOST.into(),
                Ipv4Addr::LOCALHOST.into(),
                Some(bad),
            );
            assert!(!d.ip_header_fits(), "{bad:?}");
        }
    }
}
