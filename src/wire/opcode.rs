//! The BTH opcode table (IBTA 9.2, table 38, and Annex A17 for CNP).
//!
//! The top three bits of an opcode name the transport, the low five the operation. For every
//! opcode softroce implements, the table gives its transport, the extension headers that follow
//! the BTH in order, whether it carries payload, and its position in a message. RD and XRC
//! opcodes are recognised by their transport bits; any other value is kept in `Opcode::Unknown`.

use core::fmt;

/// The transport service an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Reliable Datagram: recognised, not supported.
    Rd,
    /// Unreliable Datagram.
    Ud,
    /// Congestion notification (RoCEv2 Annex A17.9).
    Cnp,
    /// Extended Reliable Connected: recognised, not supported.
    Xrc,
}

impl Transport {
    /// The transport's usual abbreviation, e.g. `RC`.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a packet stands in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first packet of a message of two or more.
    First,
    /// Neither the first nor the last packet.
    Middle,
    /// The last packet of a message of two or more.
    Last,
    /// The only packet of its message.
    Only,
}

/// An extension header that may follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA Extended Transport Header, 16 bytes.
    Reth,
    /// ACK Extended Transport Header, 4 bytes.
    Aeth,
    /// Datagram Extended Transport Header, 8 bytes.
    Deth,
    /// Immediate Data, 4 bytes.
    ImmDt,
    /// Invalidate Extended Transport Header, 4 bytes.
    Ieth,
    /// Atomic Extended Transport Header, 28 bytes.
    AtomicEth,
    /// Atomic Acknowledge Extended Transport Header, 8 bytes.
    AtomicAckEth,
    /// The 16 reserved bytes after a CNP's BTH.
    CnpPad,
}

impl ExtHeader {
    /// The header's bit in a set of headers ([`OpcodeInfo::header_set`]).
    pub const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The header's length on the wire.
    pub const fn wire_len(self) -> usize {
        match self {
            ExtHeader::Reth => 16,
            ExtHeader::Aeth => 4,
            ExtHeader::Deth => 8,
            ExtHeader::ImmDt => 4,
            ExtHeader::Ieth => 4,
            ExtHeader::AtomicEth => 28,
            ExtHeader::AtomicAckEth => 8,
            ExtHeader::CnpPad => 16,
        }
    }

    /// The layer named in errors about this header.
    pub const fn layer(self) -> super::Layer {
        use super::Layer;
        match self {
            ExtHeader::Reth => Layer::Reth,
            ExtHeader::Aeth => Layer::Aeth,
            ExtHeader::Deth => Layer::Deth,
            ExtHeader::ImmDt => Layer::ImmDt,
            ExtHeader::Ieth => Layer::Ieth,
            ExtHeader::AtomicEth => Layer::AtomicEth,
            ExtHeader::AtomicAckEth => Layer::AtomicAckEth,
            ExtHeader::CnpPad => Layer::Cnp,
        }
    }
}

/// What the table says about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The name used by the kernel and by Wireshark, e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    /// The transport the opcode's top three bits name.
    pub transport: Transport,
    /// The extension headers after the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// Whether the packet carries payload (it may still be zero bytes long).
    pub payload: bool,
    /// Where the packet stands in its message.
    pub position: Position,
    /// The sum of `headers`' lengths, summed when the table is built: every packet built or
    /// parsed asks for it.
    ext_len: usize,
    /// `headers` as a set of [`ExtHeader::bit`]s, also built with the table: a packet built
    /// is checked against it in one comparison.
    header_set: u8,
}

impl OpcodeInfo {
    /// The total length of the extension headers.
    pub const fn ext_len(&self) -> usize {
        self.ext_len
    }

    /// `headers` as a set of [`ExtHeader::bit`]s.
    pub const fn header_set(&self) -> u8 {
        self.header_set
    }

    const fn set_of(headers: &[ExtHeader]) -> u8 {
        let mut set = 0;
        let mut i = 0;
        while i < headers.len() {
            set |= headers[i].bit();
            i += 1;
        }
        set
    }

    const fn sum_len(headers: &[ExtHeader]) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < headers.len() {
            total += headers[i].wire_len();
            i += 1;
        }
        total
    }
}

macro_rules! opcode_table {
    ($(
        $(#[$meta:meta])*
        $variant:ident = $code:literal, $name:literal, $transport:ident,
            [$($hdr:ident),*], $payload:literal, $pos:ident;
    )*) => {
        /// A BTH opcode. Every byte value maps to a variant, and `value` gives it back.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $(#[doc = concat!("`", $name, "` (", stringify!($code), ").")] $(#[$meta])* $variant,)*
            /// An RD opcode (0x40 to 0x5F).
            Rd(u8),
            /// An XRC opcode (0xA0 to 0xBF).
            Xrc(u8),
            /// A value no transport softroce knows defines.
            Unknown(u8),
        }

        impl Opcode {
            /// Every opcode softroce implements, in table order.
            pub const SUPPORTED: &'static [Opcode] = &[$(Opcode::$variant),*];

            /// Maps a BTH opcode byte to its variant; never fails.
            pub const fn from_u8(value: u8) -> Opcode {
                match value {
                    $($code => Opcode::$variant,)*
                    0x40..=0x5f => Opcode::Rd(value),
                    0xa0..=0xbf => Opcode::Xrc(value),
                    _ => Opcode::Unknown(value),
                }
            }

            /// The BTH opcode byte.
            pub const fn value(self) -> u8 {
                match self {
                    $(Opcode::$variant => $code,)*
                    Opcode::Rd(v) | Opcode::Xrc(v) | Opcode::Unknown(v) => v,
                }
            }

            /// The table entry, for the opcodes softroce implements.
            pub const fn info(self) -> Option<&'static OpcodeInfo> {
                match self {
                    $(Opcode::$variant => Some(&const {
                        let headers: &'static [ExtHeader] = &[$(ExtHeader::$hdr),*];
                        OpcodeInfo {
                            name: $name,
                            transport: Transport::$transport,
                            headers,
                            payload: $payload,
                            position: Position::$pos,
                            ext_len: OpcodeInfo::sum_len(headers),
                            header_set: OpcodeInfo::set_of(headers),
                        }
                    }),)*
                    _ => None,
                }
            }
        }
    };
}

opcode_table! {
    RcSendFirst = 0x00, "RC_SEND_FIRST", Rc, [], true, First;
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Rc, [], true, Middle;
    RcSendLast = 0x02, "RC_SEND_LAST", Rc, [], true, Last;
    RcSendLastImm = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Rc, [ImmDt], true, Last;
    RcSendOnly = 0x04, "RC_SEND_ONLY", Rc, [], true, Only;
    RcSendOnlyImm = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Rc, [ImmDt], true, Only;
    RcWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Rc, [Reth], true, First;
    RcWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Rc, [], true, Middle;
    RcWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Rc, [], true, Last;
    RcWriteLastImm = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rc, [ImmDt], true, Last;
    RcWriteOnly = 0x0a, "RC_RDMA_WRITE_ONLY", Rc, [Reth], true, Only;
    RcWriteOnlyImm = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rc, [Reth, ImmDt], true, Only;
    RcReadRequest = 0x0c, "RC_RDMA_READ_REQUEST", Rc, [Reth], false, Only;
    RcReadResponseFirst = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST", Rc, [Aeth], true, First;
    RcReadResponseMiddle = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", Rc, [], true, Middle;
    RcReadResponseLast = 0x0f, "RC_RDMA_READ_RESPONSE_LAST", Rc, [Aeth], true, Last;
    RcReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", Rc, [Aeth], true, Only;
    RcAck = 0x11, "RC_ACKNOWLEDGE", Rc, [Aeth], false, Only;
    RcAtomicAck = 0x12, "RC_ATOMIC_ACKNOWLEDGE", Rc, [Aeth, AtomicAckEth], false, Only;
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", Rc, [AtomicEth], false, Only;
    RcFetchAdd = 0x14, "RC_FETCH_ADD", Rc, [AtomicEth], false, Only;
    RcSendLastInv = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Rc, [Ieth], true, Last;
    RcSendOnlyInv = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Rc, [Ieth], true, Only;
    UcSendFirst = 0x20, "UC_SEND_FIRST", Uc, [], true, First;
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Uc, [], true, Middle;
    UcSendLast = 0x22, "UC_SEND_LAST", Uc, [], true, Last;
    UcSendLastImm = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Uc, [ImmDt], true, Last;
    UcSendOnly = 0x24, "UC_SEND_ONLY", Uc, [], true, Only;
    UcSendOnlyImm = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Uc, [ImmDt], true, Only;
    UcWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Uc, [Reth], true, First;
    UcWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Uc, [], true, Middle;
    UcWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Uc, [], true, Last;
    UcWriteLastImm = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Uc, [ImmDt], true, Last;
    UcWriteOnly = 0x2a, "UC_RDMA_WRITE_ONLY", Uc, [Reth], true, Only;
    UcWriteOnlyImm = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Uc, [Reth, ImmDt], true, Only;
    UdSendOnly = 0x64, "UD_SEND_ONLY", Ud, [Deth], true, Only;
    UdSendOnlyImm = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Ud, [Deth, ImmDt], true, Only;
    /// Congestion notification: BTH with BECN set, then 16 reserved bytes.
    Cnp = 0x81, "CNP", Cnp, [CnpPad], false, Only;
}

impl From<u8> for Opcode {
    fn from(value: u8) -> Self {
        Opcode::from_u8(value)
    }
}

impl From<Opcode> for u8 {
    fn from(opcode: Opcode) -> u8 {
        opcode.value()
    }
}

/// The RD opcodes' names (IBTA 9.2, table 38), by their low five bits. ConnectX's Dynamically
/// Connected transport reuses these values on the wire.
const RD_NAMES: [&str; 32] = [
    "RD_SEND_FIRST",
    "RD_SEND_MIDDLE",
    "RD_SEND_LAST",
    "RD_SEND_LAST_WITH_IMMEDIATE",
    "RD_SEND_ONLY",
    "RD_SEND_ONLY_WITH_IMMEDIATE",
    "RD_RDMA_WRITE_FIRST",
    "RD_RDMA_WRITE_MIDDLE",
    "RD_RDMA_WRITE_LAST",
    "RD_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "RD_RDMA_WRITE_ONLY",
    "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "RD_RDMA_READ_REQUEST",
    "RD_RDMA_READ_RESPONSE_FIRST",
    "RD_RDMA_READ_RESPONSE_MIDDLE",
    "RD_RDMA_READ_RESPONSE_LAST",
    "RD_RDMA_READ_RESPONSE_ONLY",
    "RD_ACKNOWLEDGE",
    "RD_ATOMIC_ACKNOWLEDGE",
    "RD_COMPARE_SWAP",
    "RD_FETCH_ADD",
    "RD_RESYNC",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
    "RD_RESERVED",
];

/// The XRC opcodes' names (IBTA 9.2, table 38 and Annex A14), by their low five bits.
const XRC_NAMES: [&str; 32] = [
    "XRC_SEND_FIRST",
    "XRC_SEND_MIDDLE",
    "XRC_SEND_LAST",
    "XRC_SEND_LAST_WITH_IMMEDIATE",
    "XRC_SEND_ONLY",
    "XRC_SEND_ONLY_WITH_IMMEDIATE",
    "XRC_RDMA_WRITE_FIRST",
    "XRC_RDMA_WRITE_MIDDLE",
    "XRC_RDMA_WRITE_LAST",
    "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "XRC_RDMA_WRITE_ONLY",
    "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "XRC_RDMA_READ_REQUEST",
    "XRC_RDMA_READ_RESPONSE_FIRST",
    "XRC_RDMA_READ_RESPONSE_MIDDLE",
    "XRC_RDMA_READ_RESPONSE_LAST",
    "XRC_RDMA_READ_RESPONSE_ONLY",
    "XRC_ACKNOWLEDGE",
    "XRC_ATOMIC_ACKNOWLEDGE",
    "XRC_COMPARE_SWAP",
    "XRC_FETCH_ADD",
    "XRC_RESERVED",
    "XRC_SEND_LAST_WITH_INVALIDATE",
    "XRC_SEND_ONLY_WITH_INVALIDATE",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
    "XRC_RESERVED",
];

impl Opcode {
    /// IBTA's name for every value: the table's for the opcodes softroce implements, RD's and
    /// XRC's for theirs, `MANUFACTURER_SPECIFIC` for 0xC0 to 0xFF (IBTA's vendor range), and
    /// `RESERVED` for the rest.
    pub fn name(self) -> &'static str {
        match (self, self.info()) {
            (_, Some(info)) => info.name,
            (Opcode::Rd(v), None) => RD_NAMES[usize::from(v & 0x1f)],
            (Opcode::Xrc(v), None) => XRC_NAMES[usize::from(v & 0x1f)],
            (Opcode::Unknown(0xc0..=0xff), None) => "MANUFACTURER_SPECIFIC",
            _ => "RESERVED",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for v in 0..=u8::MAX {
            assert_eq!(Opcode::from_u8(v).value(), v);
        }
    }

    #[test]
    fn transport_bits_match_the_table() {
        // IBTA 9.2: the top three bits of the opcode select the transport.
        for &op in Opcode::SUPPORTED {
            let info = op.info().unwrap();
            let expected = match op.value() >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                other => panic!("opcode {op:?} in transport group {other}"),
            };
            assert_eq!(info.transport, expected, "{}", info.name);
            assert!(info.name.starts_with(expected.name()), "{}", info.name);
        }
        assert_eq!(Opcode::SUPPORTED.len(), 38);
    }

    #[test]
    fn every_value_has_ibtas_name() {
        assert_eq!(Opcode::from_u8(0x40).name(), "RD_SEND_FIRST");
        assert_eq!(Opcode::from_u8(0x4c).name(), "RD_RDMA_READ_REQUEST");
        assert_eq!(Opcode::from_u8(0x55).name(), "RD_RESYNC");
        assert_eq!(Opcode::from_u8(0xa4).name(), "XRC_SEND_ONLY");
        assert_eq!(
            Opcode::from_u8(0xb7).name(),
            "XRC_SEND_ONLY_WITH_INVALIDATE"
        );
        assert_eq!(Opcode::from_u8(0xc3).name(), "MANUFACTURER_SPECIFIC");
        assert_eq!(Opcode::from_u8(0x1f).name(), "RESERVED");
        // The implemented opcodes' names and the RD/XRC tables agree on every suffix.
        for &op in Opcode::SUPPORTED {
            let name = op.name();
            if let Some(suffix) = name.strip_prefix("RC_") {
                let rd = Opcode::from_u8(0x40 | (op.value() & 0x1f)).name();
                let xrc = Opcode::from_u8(0xa0 | (op.value() & 0x1f)).name();
                assert_eq!(xrc.strip_prefix("XRC_"), Some(suffix));
                if op.value() < 0x15 {
                    assert_eq!(rd.strip_prefix("RD_"), Some(suffix));
                }
            }
        }
    }

    #[test]
    fn rd_and_xrc_are_recognised_and_unknown_values_kept() {
        assert_eq!(Opcode::from_u8(0x44), Opcode::Rd(0x44));
        assert_eq!(Opcode::from_u8(0xa5), Opcode::Xrc(0xa5));
        assert_eq!(Opcode::from_u8(0x15), Opcode::Unknown(0x15));
        assert_eq!(Opcode::from_u8(0xff), Opcode::Unknown(0xff));
        assert!(Opcode::Rd(0x44).info().is_none());
    }

    #[test]
    fn payload_free_opcodes() {
        let no_payload: Vec<_> = Opcode::SUPPORTED
            .iter()
            .filter(|op| !op.info().unwrap().payload)
            .map(|op| op.value())
            .collect();
        assert_eq!(no_payload, [0x0c, 0x11, 0x12, 0x13, 0x14, 0x81]);
    }

    #[test]
    fn extension_header_lengths() {
        assert_eq!(Opcode::RcWriteOnlyImm.info().unwrap().ext_len(), 20);
        assert_eq!(Opcode::RcAtomicAck.info().unwrap().ext_len(), 12);
        assert_eq!(Opcode::RcFetchAdd.info().unwrap().ext_len(), 28);
        assert_eq!(Opcode::UdSendOnlyImm.info().unwrap().ext_len(), 12);
    }
}
