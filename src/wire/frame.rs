//! Whole RoCEv2 frames: Ethernet (optionally one 802.1Q tag) / IPv4 or IPv6 / UDP 4791 / RoCE.
//!
//! Layers 2 to 4 are read and written with `etherparse`. Parsing accepts what real senders vary:
//! any UDP source port (rxe and ConnectX derive it per QP), ECN bits, a zero or non-zero UDP
//! checksum, MigReq 0 or 1. It keeps the raw IP and UDP headers, so the ICRC of every frame can
//! be verified.

use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, IpDscp, IpEcn, IpFragOffset, IpNumber, Ipv4Header, Ipv6FlowLabel,
    Ipv6Header, LinkExtSlice, LinkSlice, NetSlice, SingleVlanHeader, SlicedPacket, TransportSlice,
    UdpHeader, VlanId, VlanPcp,
};

use super::icrc::{icrc_ipv4, icrc_ipv6, IcrcStatus, ICRC_LEN};
use super::packet::BTH_LEN;
use super::{Bth, BthRepr, Error, Layer, PacketRepr, RocePacket, ROCEV2_UDP_PORT};

/// Why a frame is not a RoCEv2 packet softroce can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Layers 2 to 4 are malformed; etherparse's error names the header and the field.
    Lower(etherparse::err::packet::SliceError),
    /// A well-formed frame that is not RoCEv2 (not IP, not UDP, not to port 4791, a fragment).
    NotRoce(&'static str),
    /// RoCEv2, framed in a way softroce does not handle.
    Unsupported {
        /// The header whose framing is not handled.
        layer: Layer,
        /// What is not handled.
        reason: &'static str,
    },
    /// The RoCE packet, or a field of an emitted frame, is invalid.
    Wire(Error),
    /// A RoCEv2 packet whose opcode softroce does not parse: its BTH and ICRC are read.
    Opaque(Box<OpaqueRoce>),
}

/// A RoCEv2 frame whose opcode softroce does not parse (RD, which ConnectX's Dynamically
/// Connected transport reuses; XRC; manufacturer-specific; reserved). Its extension headers
/// are unknown, but the ICRC covers the packet whatever they are, so it is still checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpaqueRoce {
    /// Where the packet sits: the Ethernet, IP and UDP headers in front of it.
    pub repr: FrameRepr,
    /// The packet's BTH, which parses whatever the opcode.
    pub bth: BthRepr,
    /// The RoCE packet's length, from the BTH through the ICRC.
    pub len: usize,
    /// Whether the packet's last four bytes hold the ICRC of the rest.
    pub icrc: IcrcStatus,
    /// Why softroce does not parse it.
    pub reason: Error,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Lower(e) => write!(f, "layers 2-4: {e}"),
            FrameError::NotRoce(why) => write!(f, "not RoCEv2: {why}"),
            FrameError::Unsupported { layer, reason } => {
                write!(f, "{layer}: unsupported: {reason}")
            }
            FrameError::Wire(e) => e.fmt(f),
            FrameError::Opaque(o) => write!(
                f,
                "{}: not parsed ({}); ICRC {}",
                o.bth.opcode.name(),
                o.reason,
                o.icrc.as_str()
            ),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<Error> for FrameError {
    fn from(e: Error) -> Self {
        FrameError::Wire(e)
    }
}

/// An 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point, 0 to 7.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier, 12 bits (0 to 4095).
    pub vid: u16,
}

/// The Ethernet header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source MAC address.
    pub src: [u8; 6],
    /// Destination MAC address.
    pub dst: [u8; 6],
    /// The 802.1Q tag between the MAC addresses and the EtherType, if any.
    pub vlan: Option<VlanTag>,
}

impl EthernetRepr {
    fn len(&self) -> usize {
        Ethernet2Header::LEN + self.vlan.map_or(0, |_| SingleVlanHeader::LEN)
    }
}

/// The IP header fields of a RoCEv2 frame. Lengths, the protocol and checksums are derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// An IPv4 header without options.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Differentiated services code point, 6 bits (0 to 63).
        dscp: u8,
        /// Explicit congestion notification, 2 bits (0 to 3).
        ecn: u8,
        /// Covered by the ICRC: rxe sends a hash, ConnectX a counter, a DF UDP socket 0.
        identification: u16,
        /// The DF flag.
        dont_fragment: bool,
        /// Time to live.
        ttl: u8,
    },
    /// An IPv6 header without extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Differentiated services code point: the top 6 bits of the traffic class (0 to 63).
        dscp: u8,
        /// Explicit congestion notification: the low 2 bits of the traffic class (0 to 3).
        ecn: u8,
        /// Flow label, 20 bits.
        flow_label: u32,
        /// Hop limit.
        hop_limit: u8,
    },
}

/// An IP header ready to write, with its length and checksum filled in.
enum BuiltIp {
    V4(Ipv4Header),
    V6(Ipv6Header),
}

impl IpRepr {
    fn header_len(&self) -> usize {
        match self {
            IpRepr::V4 { .. } => Ipv4Header::MIN_LEN,
            IpRepr::V6 { .. } => Ipv6Header::LEN,
        }
    }

    /// The header in front of a UDP datagram of `udp_len` bytes.
    fn build(&self, udp_len: u16) -> Result<BuiltIp, Error> {
        let (dscp, ecn, layer) = match *self {
            IpRepr::V4 { dscp, ecn, .. } => (dscp, ecn, Layer::Ipv4),
            IpRepr::V6 { dscp, ecn, .. } => (dscp, ecn, Layer::Ipv6),
        };
        let dscp = IpDscp::try_new(dscp)
            .map_err(|_| field_error(layer, "dscp", dscp.into(), "0 to 63"))?;
        let ecn =
            IpEcn::try_new(ecn).map_err(|_| field_error(layer, "ecn", ecn.into(), "0 to 3"))?;
        Ok(match *self {
            IpRepr::V4 {
                src,
                dst,
                identification,
                dont_fragment,
                ttl,
                ..
            } => {
                let mut ip = Ipv4Header {
                    dscp,
                    ecn,
                    total_len: Ipv4Header::MIN_LEN_U16 + udp_len,
                    identification,
                    dont_fragment,
                    more_fragments: false,
                    fragment_offset: IpFragOffset::ZERO,
                    time_to_live: ttl,
                    protocol: IpNumber::UDP,
                    header_checksum: 0,
                    source: src.octets(),
                    destination: dst.octets(),
                    options: Default::default(),
                };
                ip.header_checksum = ip.calc_header_checksum();
                BuiltIp::V4(ip)
            }
            IpRepr::V6 {
                src,
                dst,
                flow_label,
                hop_limit,
                ..
            } => BuiltIp::V6(Ipv6Header {
                traffic_class: (dscp.value() << 2) | ecn.value(),
                flow_label: Ipv6FlowLabel::try_new(flow_label).map_err(|_| {
                    field_error(
                        Layer::Ipv6,
                        "flow_label",
                        flow_label.into(),
                        "a 20-bit value",
                    )
                })?,
                payload_length: udp_len,
                next_header: IpNumber::UDP,
                hop_limit,
                source: src.octets(),
                destination: dst.octets(),
            }),
        })
    }
}

/// How the UDP checksum of an emitted frame is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UdpChecksum {
    /// Zero, "not computed": what rxe sends, and what the ICRC makes redundant.
    Zero,
    /// Computed over the pseudo-header and the datagram, ICRC included.
    Computed,
}

/// The UDP header fields of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port; RoCEv2 senders vary it per QP for ECMP entropy.
    pub src_port: u16,
    /// Destination port, 4791 for RoCEv2.
    pub dst_port: u16,
    /// Whether the UDP checksum is zero or computed.
    pub checksum: UdpChecksum,
}

/// The framing of a RoCE packet: everything in front of the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// `None` for a frame that starts at the IP header.
    pub ethernet: Option<EthernetRepr>,
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: UdpRepr,
}

/// A parsed frame, borrowing its bytes.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    /// The framing in front of the BTH.
    pub repr: FrameRepr,
    ip_header: &'a [u8],
    udp_header: [u8; 8],
    /// The RoCE packet: the UDP payload, from the BTH through the ICRC.
    pub packet: RocePacket<&'a [u8]>,
}

impl<'a> Frame<'a> {
    /// Parses a frame that starts with an Ethernet header.
    pub fn parse_ethernet(bytes: &'a [u8]) -> Result<Self, FrameError> {
        Self::from_sliced(
            bytes,
            SlicedPacket::from_ethernet(bytes).map_err(FrameError::Lower)?,
        )
    }

    /// Parses a frame that starts with an IPv4 or IPv6 header (a raw IP socket, pcap `RAW`).
    pub fn parse_ip(bytes: &'a [u8]) -> Result<Self, FrameError> {
        Self::from_sliced(
            bytes,
            SlicedPacket::from_ip(bytes).map_err(FrameError::Lower)?,
        )
    }

    /// Parses a Linux cooked capture (`tcpdump -i any`).
    pub fn parse_linux_sll(bytes: &'a [u8]) -> Result<Self, FrameError> {
        Self::from_sliced(
            bytes,
            SlicedPacket::from_linux_sll(bytes).map_err(FrameError::Lower)?,
        )
    }

    /// Re-borrows a header that etherparse found inside `frame` for the frame's lifetime.
    fn within(frame: &'a [u8], header: &[u8]) -> &'a [u8] {
        let start = (header.as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
        &frame[start..start + header.len()]
    }

    fn from_sliced(bytes: &'a [u8], sliced: SlicedPacket<'a>) -> Result<Self, FrameError> {
        let vlan = match sliced.link_exts.as_slice() {
            [] => None,
            [LinkExtSlice::Vlan(tag)] => Some(VlanTag {
                pcp: tag.priority_code_point().value(),
                dei: tag.drop_eligible_indicator(),
                vid: tag.vlan_identifier().value(),
            }),
            _ => {
                return Err(FrameError::Unsupported {
                    layer: Layer::Vlan,
                    reason: "stacked VLAN tags or MACsec",
                })
            }
        };
        let ethernet = match &sliced.link {
            Some(LinkSlice::Ethernet2(eth)) => Some(EthernetRepr {
                src: eth.source(),
                dst: eth.destination(),
                vlan,
            }),
            _ => None,
        };
        let (ip, ip_header) = match &sliced.net {
            Some(NetSlice::Ipv4(v4)) => {
                let h = v4.header();
                if v4.is_payload_fragmented() {
                    return Err(FrameError::NotRoce("an IPv4 fragment"));
                }
                let ip = IpRepr::V4 {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    dscp: h.dcp().value(),
                    ecn: h.ecn().value(),
                    identification: h.identification(),
                    dont_fragment: h.dont_fragment(),
                    ttl: h.ttl(),
                };
                (ip, Self::within(bytes, h.slice()))
            }
            Some(NetSlice::Ipv6(v6)) => {
                if !v6.extensions().is_empty() {
                    return Err(FrameError::Unsupported {
                        layer: Layer::Ipv6,
                        reason: "extension headers",
                    });
                }
                let h = v6.header();
                let ip = IpRepr::V6 {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    dscp: h.dscp().value(),
                    ecn: h.ecn().value(),
                    flow_label: h.flow_label().value(),
                    hop_limit: h.hop_limit(),
                };
                (ip, Self::within(bytes, h.slice()))
            }
            _ => return Err(FrameError::NotRoce("not IP")),
        };
        let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
            return Err(FrameError::NotRoce("not UDP"));
        };
        if udp.destination_port() != ROCEV2_UDP_PORT {
            return Err(FrameError::NotRoce("UDP destination port is not 4791"));
        }
        let mut udp_header = [0u8; 8];
        udp_header.copy_from_slice(udp.header_slice());
        let repr = FrameRepr {
            ethernet,
            ip,
            udp: UdpRepr {
                src_port: udp.source_port(),
                dst_port: udp.destination_port(),
                checksum: if udp.checksum() == 0 {
                    UdpChecksum::Zero
                } else {
                    UdpChecksum::Computed
                },
            },
        };
        let packet = match RocePacket::new_checked(udp.payload()) {
            Ok(packet) => packet,
            Err(reason @ (Error::UnsupportedTransport { .. } | Error::UnknownOpcode { .. })) => {
                return Err(opaque(repr, (ip_header, udp_header), udp.payload(), reason));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Frame {
            repr,
            ip_header,
            udp_header,
            packet,
        })
    }

    /// The ICRC the frame's headers call for.
    pub fn computed_icrc(&self) -> u32 {
        icrc_over(
            &self.repr.ip,
            self.ip_header,
            self.udp_header,
            self.packet.covered(),
        )
    }

    /// Verifies the ICRC: a whole frame shows every covered byte, so the check is complete.
    pub fn icrc_status(&self) -> IcrcStatus {
        IcrcStatus::check(self.computed_icrc(), self.packet.icrc())
    }

    /// The UDP checksum as received.
    pub fn udp_checksum(&self) -> u16 {
        u16::from_be_bytes([self.udp_header[6], self.udp_header[7]])
    }
}

/// The ICRC of `covered` (a RoCE packet without its ICRC) in the frame whose headers these are.
fn icrc_over(ip: &IpRepr, ip_header: &[u8], udp_header: [u8; 8], covered: &[u8]) -> u32 {
    match ip {
        IpRepr::V4 { .. } => icrc_ipv4(ip_header, udp_header, covered),
        IpRepr::V6 { .. } => {
            let mut header = [0u8; 40];
            header.copy_from_slice(&ip_header[..40]);
            icrc_ipv6(&header, udp_header, covered)
        }
    }
}

/// What can be read of a packet whose opcode is not parsed: its BTH, and its ICRC checked over
/// the whole packet, whose last four bytes it is (least significant first).
fn opaque(
    repr: FrameRepr,
    (ip_header, udp_header): (&[u8], [u8; 8]),
    packet: &[u8],
    reason: Error,
) -> FrameError {
    let bth = match Bth::new_checked(packet).and_then(|bth| BthRepr::parse(&bth)) {
        Ok(bth) => bth,
        Err(e) => return e.into(),
    };
    let Some(icrc_at) = packet
        .len()
        .checked_sub(ICRC_LEN)
        .filter(|&at| at >= BTH_LEN)
    else {
        return Error::Truncated {
            layer: Layer::Icrc,
            needed: BTH_LEN + ICRC_LEN,
            available: packet.len(),
        }
        .into();
    };
    let (covered, received) = packet.split_at(icrc_at);
    let received = u32::from_le_bytes([received[0], received[1], received[2], received[3]]);
    let computed = icrc_over(&repr.ip, ip_header, udp_header, covered);
    FrameError::Opaque(Box::new(OpaqueRoce {
        repr,
        bth,
        len: packet.len(),
        icrc: IcrcStatus::check(computed, received),
        reason,
    }))
}

fn field_error(layer: Layer, field: &'static str, found: u64, expected: &'static str) -> Error {
    Error::Field {
        layer,
        field,
        found,
        expected,
    }
}

impl FrameRepr {
    /// The length of everything in front of the BTH.
    pub fn header_len(&self) -> usize {
        self.ethernet.map_or(0, |e| e.len()) + self.ip.header_len() + UdpHeader::LEN
    }

    /// The length of the whole frame around `packet`.
    pub fn buffer_len(&self, packet: &PacketRepr) -> usize {
        self.header_len() + packet.buffer_len()
    }

    /// Writes the whole frame into `buffer`: headers with correct lengths and IPv4 checksum,
    /// the RoCE packet with `payload`, its ICRC, and the UDP checksum as `self.udp` asks.
    /// Returns the frame's length.
    pub fn emit(
        &self,
        packet: &PacketRepr,
        payload: &[u8],
        buffer: &mut [u8],
    ) -> Result<usize, FrameError> {
        let (headers, roce) = self.split(packet.buffer_len(), buffer)?;
        packet.emit_with_payload(roce, payload)?;
        self.write_headers(headers, roce, true)
    }

    /// Frames a RoCE packet that already exists, its ICRC kept as it is (right or wrong):
    /// what a capture of traffic seen through a UDP socket needs. Returns the frame's length.
    pub fn frame(&self, packet: &[u8], buffer: &mut [u8]) -> Result<usize, FrameError> {
        let (headers, roce) = self.split(packet.len(), buffer)?;
        roce.copy_from_slice(packet);
        self.write_headers(headers, roce, false)
    }

    /// The header area and the RoCE area of a frame of `roce_len` bytes of packet.
    fn split<'b>(
        &self,
        roce_len: usize,
        buffer: &'b mut [u8],
    ) -> Result<(&'b mut [u8], &'b mut [u8]), FrameError> {
        let header_len = self.header_len();
        let total = header_len + roce_len;
        if buffer.len() < total {
            return Err(Error::Truncated {
                layer: Layer::Ethernet,
                needed: total,
                available: buffer.len(),
            }
            .into());
        }
        let (headers, rest) = buffer[..total].split_at_mut(header_len);
        Ok((headers, rest))
    }

    /// Writes Ethernet, IP and UDP in front of `roce`; seals its ICRC if `seal`, and computes
    /// the UDP checksum if `self.udp` asks. Returns the frame's length.
    fn write_headers(
        &self,
        headers: &mut [u8],
        roce: &mut [u8],
        seal: bool,
    ) -> Result<usize, FrameError> {
        let roce_len = roce.len();
        let total = headers.len() + roce_len;
        let ip_type = match self.ip {
            IpRepr::V4 { .. } => EtherType::IPV4,
            IpRepr::V6 { .. } => EtherType::IPV6,
        };
        let mut at = 0;
        if let Some(eth) = self.ethernet {
            let ether_type = if eth.vlan.is_some() {
                EtherType::VLAN_TAGGED_FRAME
            } else {
                ip_type
            };
            let header = Ethernet2Header {
                source: eth.src,
                destination: eth.dst,
                ether_type,
            };
            headers[..Ethernet2Header::LEN].copy_from_slice(&header.to_bytes());
            at += Ethernet2Header::LEN;
            if let Some(tag) = eth.vlan {
                let vlan = SingleVlanHeader {
                    pcp: VlanPcp::try_new(tag.pcp)
                        .map_err(|_| field_error(Layer::Vlan, "pcp", tag.pcp.into(), "0 to 7"))?,
                    drop_eligible_indicator: tag.dei,
                    vlan_id: VlanId::try_new(tag.vid).map_err(|_| {
                        field_error(Layer::Vlan, "vid", tag.vid.into(), "0 to 4095")
                    })?,
                    ether_type: ip_type,
                };
                headers[at..at + SingleVlanHeader::LEN].copy_from_slice(&vlan.to_bytes());
                at += SingleVlanHeader::LEN;
            }
        }

        let udp_len = (UdpHeader::LEN + roce_len) as u16;
        let mut udp = UdpHeader {
            source_port: self.udp.src_port,
            destination_port: self.udp.dst_port,
            length: udp_len,
            checksum: 0,
        };
        let ip_at = at;
        let udp_at = ip_at + self.ip.header_len();
        let ip = self.ip.build(udp_len)?;
        let ip_bytes = &mut headers[ip_at..udp_at];
        match &ip {
            BuiltIp::V4(h) => ip_bytes.copy_from_slice(&h.to_bytes()),
            BuiltIp::V6(h) => ip_bytes.copy_from_slice(&h.to_bytes()),
        }
        if seal {
            let covered = &roce[..roce_len.saturating_sub(ICRC_LEN)];
            let icrc = match &ip {
                BuiltIp::V4(_) => icrc_ipv4(ip_bytes, udp.to_bytes(), covered),
                BuiltIp::V6(h) => icrc_ipv6(&h.to_bytes(), udp.to_bytes(), covered),
            };
            RocePacket::new_checked(&mut *roce)?.set_icrc(icrc);
        }
        if self.udp.checksum == UdpChecksum::Computed {
            let checksum = match &ip {
                BuiltIp::V4(h) => udp.calc_checksum_ipv4(h, roce),
                BuiltIp::V6(h) => udp.calc_checksum_ipv6(h, roce),
            };
            udp.checksum = checksum.map_err(|_| {
                field_error(
                    Layer::Udp,
                    "length",
                    udp_len.into(),
                    "a datagram under 64 KiB",
                )
            })?;
        }
        headers[udp_at..].copy_from_slice(&udp.to_bytes());
        Ok(total)
    }
}
