//! Errors of the wire layer.
//!
//! Every error names the layer (which header) and, where a value was wrong, the field and what was
//! expected, so that a dropped packet can be explained from a counter or a log line alone.

use core::fmt;

use super::opcode::Transport;

/// The header a wire error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// The Ethernet II header.
    Ethernet,
    /// An 802.1Q VLAN tag.
    Vlan,
    /// The IPv4 header.
    Ipv4,
    /// The IPv6 header.
    Ipv6,
    /// The UDP header.
    Udp,
    /// The Base Transport Header.
    Bth,
    /// The RDMA Extended Transport Header.
    Reth,
    /// The ACK Extended Transport Header.
    Aeth,
    /// The Datagram Extended Transport Header.
    Deth,
    /// The Immediate Data header.
    ImmDt,
    /// The Invalidate Extended Transport Header.
    Ieth,
    /// The Atomic Extended Transport Header.
    AtomicEth,
    /// The Atomic Acknowledge Extended Transport Header.
    AtomicAckEth,
    /// The 16 reserved bytes of a congestion notification packet.
    Cnp,
    /// The payload and its pad bytes.
    Payload,
    /// The 4-byte invariant CRC at the end of the packet.
    Icrc,
    /// The 24-byte header of a management datagram (IBTA 13.4.3).
    Mad,
    /// A CM REQ message.
    CmReq,
    /// A CM MRA message.
    CmMra,
    /// A CM REJ message.
    CmRej,
    /// A CM REP message.
    CmRep,
    /// A CM RTU message.
    CmRtu,
    /// A CM DREQ message.
    CmDreq,
    /// A CM DREP message.
    CmDrep,
    /// A CM SIDR_REQ message.
    CmSidrReq,
    /// A CM SIDR_REP message.
    CmSidrRep,
    /// RDMA-CM's IP addressing header at the start of a REQ's or SIDR_REQ's private data.
    CmaHeader,
}

impl Layer {
    /// The name the IBTA specification (or the IETF, for layers 2 to 4) gives the header.
    pub const fn name(self) -> &'static str {
        match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::Reth => "RETH",
            Layer::Aeth => "AETH",
            Layer::Deth => "DETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::Cnp => "CNP",
            Layer::Payload => "payload",
            Layer::Icrc => "ICRC",
            Layer::Mad => "MAD",
            Layer::CmReq => "CM REQ",
            Layer::CmMra => "CM MRA",
            Layer::CmRej => "CM REJ",
            Layer::CmRep => "CM REP",
            Layer::CmRtu => "CM RTU",
            Layer::CmDreq => "CM DREQ",
            Layer::CmDrep => "CM DREP",
            Layer::CmSidrReq => "CM SIDR_REQ",
            Layer::CmSidrRep => "CM SIDR_REP",
            Layer::CmaHeader => "RDMA-CM IP header",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes are not a valid RoCEv2 packet, or why a packet cannot be emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the header does.
    Truncated {
        /// The header that does not fit.
        layer: Layer,
        /// The buffer length, in bytes, that would hold the header.
        needed: usize,
        /// The buffer length, in bytes.
        available: usize,
    },
    /// A field holds a value that is not allowed here.
    Field {
        /// The header that holds the field.
        layer: Layer,
        /// The field's name.
        field: &'static str,
        /// The value found.
        found: u64,
        /// What the field may hold, in words.
        expected: &'static str,
    },
    /// The BTH opcode is not one the IBTA defines for RC, UC, RD, UD, CNP or XRC.
    UnknownOpcode {
        /// The opcode byte.
        value: u8,
    },
    /// The opcode belongs to a transport that softroce recognises but does not implement.
    UnsupportedTransport {
        /// The opcode byte.
        opcode: u8,
        /// The transport its top three bits name.
        transport: Transport,
    },
    /// An emitted packet lacks a header its opcode requires, or has one it forbids.
    HeaderMismatch {
        /// The opcode of the packet being emitted.
        opcode: u8,
        /// The header that is missing or extra.
        layer: Layer,
        /// Whether the opcode requires the header (true) or forbids it (false).
        required: bool,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated {
                layer,
                needed,
                available,
            } => write!(
                f,
                "{layer}: truncated, expected at least {needed} bytes, found {available}"
            ),
            Error::Field {
                layer,
                field,
                found,
                expected,
            } => write!(
                f,
                "{layer}.{field}: found {found} (0x{found:x}), expected {expected}"
            ),
            Error::UnknownOpcode { value } => {
                write!(f, "BTH.opcode: unknown opcode 0x{value:02x}")
            }
            Error::UnsupportedTransport { opcode, transport } => write!(
                f,
                "BTH.opcode: 0x{opcode:02x} is a {transport} opcode, and {transport} is not supported"
            ),
            Error::HeaderMismatch {
                opcode,
                layer,
                required,
            } => {
                let verb = if required {
                    "requires"
                } else {
                    "does not carry"
                };
                write!(f, "{layer}: opcode 0x{opcode:02x} {verb} this header")
            }
        }
    }
}

impl std::error::Error for Error {}

/// The result type of the wire layer.
pub type Result<T> = core::result::Result<T, Error>;
