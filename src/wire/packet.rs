//! A whole RoCE packet: the BTH, the extension headers its opcode requires, the payload, the pad
//! and the ICRC. This is the UDP payload of a RoCEv2 datagram.
//!
//! `RocePacket::new_checked` validates everything that can be checked without the IP header (the
//! ICRC needs it; see [`icrc`](super::icrc)): TVer 0, a known and supported opcode, every header
//! its opcode requires, no payload on opcodes that carry none, and a pad that fits in the payload.

use super::icrc::ICRC_LEN;
use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, Bth, BthRepr, CnpPad, DethRepr, Error, ExtHeader,
    HeaderRepr, IethRepr, ImmDtRepr, Layer, Opcode, OpcodeInfo, Result, RethRepr,
};

/// The length of the BTH.
pub const BTH_LEN: usize = 12;

/// The number of pad bytes that bring `payload_len` to a multiple of four (IBTA 9.2: PadCnt).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

/// Looks an opcode up in the table, with the error RoCE receivers drop the packet for.
fn opcode_info(opcode: Opcode) -> Result<&'static OpcodeInfo> {
    match opcode {
        Opcode::Rd(value) => Err(Error::UnsupportedTransport {
            opcode: value,
            transport: super::Transport::Rd,
        }),
        Opcode::Xrc(value) => Err(Error::UnsupportedTransport {
            opcode: value,
            transport: super::Transport::Xrc,
        }),
        other => other.info().ok_or(Error::UnknownOpcode {
            value: other.value(),
        }),
    }
}

/// A checked view of a whole RoCE packet, ICRC included.
#[derive(Debug, Clone, Copy)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Validates the packet's structure. After this, no accessor panics.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let bytes = buffer.as_ref();
        let bth = Bth::new_checked(bytes)?;
        // Three fields, not the whole repr: `PacketRepr::parse` reads the BTH once more, and
        // every received packet takes both.
        bth.check_tver()?;
        let info = opcode_info(bth.opcode())?;

        let mut offset = BTH_LEN;
        for header in info.headers {
            offset += header.wire_len();
            if bytes.len() < offset {
                return Err(Error::Truncated {
                    layer: header.layer(),
                    needed: offset,
                    available: bytes.len(),
                });
            }
        }
        if bytes.len() < offset + ICRC_LEN {
            return Err(Error::Truncated {
                layer: Layer::Icrc,
                needed: offset + ICRC_LEN,
                available: bytes.len(),
            });
        }
        let padded_payload = bytes.len() - offset - ICRC_LEN;
        if !info.payload && padded_payload != 0 {
            return Err(Error::Field {
                layer: Layer::Payload,
                field: "length",
                found: padded_payload as u64,
                expected: "0: this opcode carries no payload",
            });
        }
        if usize::from(bth.pad_count()) > padded_payload {
            return Err(Error::Field {
                layer: Layer::Bth,
                field: "pad_count",
                found: bth.pad_count().into(),
                expected: "no more pad bytes than the payload holds",
            });
        }
        Ok(RocePacket { buffer, info })
    }

    /// The opcode's table entry.
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// A view of the packet's BTH, its first 12 bytes.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(self.buffer.as_ref())
    }

    /// Where the extension header `kind` starts, if the opcode carries it.
    fn ext_offset(&self, kind: ExtHeader) -> Option<usize> {
        let mut offset = BTH_LEN;
        for &header in self.info.headers {
            if header == kind {
                return Some(offset);
            }
            offset += header.wire_len();
        }
        None
    }

    /// The bytes of the extension header `kind`, if the opcode carries it.
    pub fn ext_bytes(&self, kind: ExtHeader) -> Option<&[u8]> {
        let at = self.ext_offset(kind)?;
        Some(&self.buffer.as_ref()[at..at + kind.wire_len()])
    }

    /// Parses the extension header whose representation is `H`, if the opcode carries it.
    pub fn ext<H: HeaderRepr>(&self) -> Option<H> {
        let kind = self
            .info
            .headers
            .iter()
            .copied()
            .find(|h| h.layer() == H::LAYER)?;
        H::parse_bytes(self.ext_bytes(kind)?).ok()
    }

    fn payload_start(&self) -> usize {
        BTH_LEN + self.info.ext_len()
    }

    fn pad_start(&self) -> usize {
        self.icrc_start() - usize::from(self.bth().pad_count())
    }

    fn icrc_start(&self) -> usize {
        self.buffer.as_ref().len() - ICRC_LEN
    }

    /// The payload, without the pad.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_start()..self.pad_start()]
    }

    /// The pad bytes (0 to 3).
    pub fn pad(&self) -> &[u8] {
        &self.buffer.as_ref()[self.pad_start()..self.icrc_start()]
    }

    /// Everything the ICRC covers from the BTH on: the packet without its ICRC.
    pub fn covered(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.icrc_start()]
    }

    /// The ICRC as received. It travels least-significant byte first.
    pub fn icrc(&self) -> u32 {
        let b = &self.buffer.as_ref()[self.icrc_start()..];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The whole packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RocePacket<T> {
    /// The payload, to fill in place after [`PacketRepr::emit`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.payload_start()..self.pad_start();
        &mut self.buffer.as_mut()[range]
    }

    /// Writes the ICRC into the last four bytes, least-significant byte first.
    pub fn set_icrc(&mut self, icrc: u32) {
        let at = self.icrc_start();
        self.buffer.as_mut()[at..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// The extension headers of a packet. Which are present is set by the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// The RETH, in RDMA WRITE FIRST and ONLY and in RDMA READ requests.
    pub reth: Option<RethRepr>,
    /// The AETH, in ACKs, atomic ACKs and the READ responses that carry one.
    pub aeth: Option<AethRepr>,
    /// The DETH, in every UD packet.
    pub deth: Option<DethRepr>,
    /// The immediate data, in the `..._WITH_IMMEDIATE` opcodes.
    pub immdt: Option<ImmDtRepr>,
    /// The IETH, in the `SEND_..._WITH_INVALIDATE` opcodes.
    pub ieth: Option<IethRepr>,
    /// The AtomicETH, in CMP_SWAP and FETCH_ADD.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// The AtomicAckETH, in atomic ACKs.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
}

impl ExtHeaders {
    /// The headers present, as a set of [`ExtHeader::bit`]s; a CNP's pad is not among them.
    fn present_set(&self) -> u8 {
        ALL_EXT_HEADERS.into_iter().fold(0, |set, kind| {
            set | (u8::from(self.is_present(kind)) * kind.bit())
        })
    }

    fn is_present(&self, kind: ExtHeader) -> bool {
        match kind {
            ExtHeader::Reth => self.reth.is_some(),
            ExtHeader::Aeth => self.aeth.is_some(),
            ExtHeader::Deth => self.deth.is_some(),
            ExtHeader::ImmDt => self.immdt.is_some(),
            ExtHeader::Ieth => self.ieth.is_some(),
            ExtHeader::AtomicEth => self.atomic_eth.is_some(),
            ExtHeader::AtomicAckEth => self.atomic_ack_eth.is_some(),
            // A CNP's reserved bytes carry nothing, so they are always "present".
            ExtHeader::CnpPad => true,
        }
    }

    fn parse_one(&mut self, kind: ExtHeader, bytes: &[u8]) -> Result<()> {
        match kind {
            ExtHeader::Reth => self.reth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::Aeth => self.aeth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::Deth => self.deth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::ImmDt => self.immdt = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::Ieth => self.ieth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::AtomicEth => self.atomic_eth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::AtomicAckEth => self.atomic_ack_eth = Some(HeaderRepr::parse_bytes(bytes)?),
            ExtHeader::CnpPad => {
                CnpPad::parse_bytes(bytes)?;
            }
        }
        Ok(())
    }

    fn emit_one(&self, kind: ExtHeader, bytes: &mut [u8]) -> Result<()> {
        fn emit<H: HeaderRepr>(header: &Option<H>, bytes: &mut [u8]) -> Result<()> {
            match header {
                Some(h) => h.emit_bytes(bytes),
                None => Ok(()),
            }
        }
        match kind {
            ExtHeader::Reth => emit(&self.reth, bytes),
            ExtHeader::Aeth => emit(&self.aeth, bytes),
            ExtHeader::Deth => emit(&self.deth, bytes),
            ExtHeader::ImmDt => emit(&self.immdt, bytes),
            ExtHeader::Ieth => emit(&self.ieth, bytes),
            ExtHeader::AtomicEth => emit(&self.atomic_eth, bytes),
            ExtHeader::AtomicAckEth => emit(&self.atomic_ack_eth, bytes),
            ExtHeader::CnpPad => CnpPad.emit_bytes(bytes),
        }
    }
}

const ALL_EXT_HEADERS: [ExtHeader; 7] = [
    ExtHeader::Reth,
    ExtHeader::Aeth,
    ExtHeader::Deth,
    ExtHeader::ImmDt,
    ExtHeader::Ieth,
    ExtHeader::AtomicEth,
    ExtHeader::AtomicAckEth,
];

/// The owned representation of a whole packet, except the payload bytes and the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// The BTH; [`PacketRepr::new`] sets its PadCnt from `payload_len`.
    pub bth: BthRepr,
    /// The extension headers, present as the opcode requires.
    pub ext: ExtHeaders,
    /// The payload length, without the pad.
    pub payload_len: usize,
}

impl PacketRepr {
    /// A packet with the pad count that `payload_len` needs.
    pub fn new(mut bth: BthRepr, ext: ExtHeaders, payload_len: usize) -> Self {
        bth.pad_count = pad_for(payload_len);
        PacketRepr {
            bth,
            ext,
            payload_len,
        }
    }

    /// Reads the BTH and the extension headers of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &RocePacket<T>) -> Result<Self> {
        let bth = BthRepr::parse(&packet.bth())?;
        let mut ext = ExtHeaders::default();
        let mut offset = BTH_LEN;
        let bytes = packet.as_bytes();
        for &kind in packet.info().headers {
            ext.parse_one(kind, &bytes[offset..offset + kind.wire_len()])?;
            offset += kind.wire_len();
        }
        Ok(PacketRepr {
            bth,
            ext,
            payload_len: packet.payload().len(),
        })
    }

    /// Checks that the extension headers present are exactly those the opcode requires.
    pub fn check(&self) -> Result<&'static OpcodeInfo> {
        let info = opcode_info(self.bth.opcode)?;
        let opcode = self.bth.opcode.value();
        // Every packet the core builds passes with one comparison of the two sets; the walk
        // names the header that is wrong.
        if info.header_set() & !ExtHeader::CnpPad.bit() != self.ext.present_set() {
            for kind in ALL_EXT_HEADERS {
                let required = info.headers.contains(&kind);
                if required != self.ext.is_present(kind) {
                    return Err(Error::HeaderMismatch {
                        opcode,
                        layer: kind.layer(),
                        required,
                    });
                }
            }
        }
        if !info.payload && self.payload_len + usize::from(self.bth.pad_count) != 0 {
            return Err(Error::Field {
                layer: Layer::Payload,
                field: "length",
                found: self.payload_len as u64,
                expected: "0: this opcode carries no payload",
            });
        }
        Ok(info)
    }

    /// The length of the whole packet, ICRC included.
    pub fn buffer_len(&self) -> usize {
        let ext_len = self.bth.opcode.info().map_or(0, |i| i.ext_len());
        BTH_LEN + ext_len + self.payload_len + usize::from(self.bth.pad_count) + ICRC_LEN
    }

    /// Writes the headers, zero pad bytes and a zero ICRC into the start of `buffer`, and
    /// returns the packet's length. The payload area is left for the caller to fill, through
    /// [`RocePacket::payload_mut`], so that payload can be copied straight from memory.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<usize> {
        let info = self.check()?;
        let len = self.buffer_len();
        if buffer.len() < len {
            return Err(Error::Truncated {
                layer: Layer::Payload,
                needed: len,
                available: buffer.len(),
            });
        }
        let buffer = &mut buffer[..len];
        self.bth.emit(&mut Bth::new_unchecked(&mut *buffer));
        let mut offset = BTH_LEN;
        for &kind in info.headers {
            self.ext
                .emit_one(kind, &mut buffer[offset..offset + kind.wire_len()])?;
            offset += kind.wire_len();
        }
        let pad_start = offset + self.payload_len;
        buffer[pad_start..].fill(0);
        Ok(len)
    }

    /// Where the payload starts in the packet [`emit`](Self::emit) writes.
    pub fn payload_offset(&self) -> usize {
        self.buffer_len() - ICRC_LEN - usize::from(self.bth.pad_count) - self.payload_len
    }

    /// [`emit`](Self::emit), then copies `payload` in. Its length must be `payload_len`.
    pub fn emit_with_payload(&self, buffer: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::Field {
                layer: Layer::Payload,
                field: "length",
                found: payload.len() as u64,
                expected: "the length the PacketRepr declares",
            });
        }
        let len = self.emit(buffer)?;
        let offset = self.payload_offset();
        buffer[offset..offset + payload.len()].copy_from_slice(payload);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AckSyndrome, Msn, Psn, Qpn, RKey};

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            ack_req: true,
            ..BthRepr::new(opcode, Qpn::new(0x11), Psn::new(100))
        }
    }

    fn write_only(payload: &[u8]) -> (PacketRepr, Vec<u8>) {
        let ext = ExtHeaders {
            reth: Some(RethRepr {
                virtual_address: 0x1000,
                rkey: RKey(0xabcd),
                dma_len: payload.len() as u32,
            }),
            ..Default::default()
        };
        let repr = PacketRepr::new(bth(Opcode::RcWriteOnly), ext, payload.len());
        let mut buf = vec![0xee; repr.buffer_len()];
        repr.emit_with_payload(&mut buf, payload).unwrap();
        (repr, buf)
    }

    #[test]
    fn emit_then_parse() {
        let (repr, buf) = write_only(b"hello");
        assert_eq!(buf.len(), 12 + 16 + 5 + 3 + 4);
        let packet = RocePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.payload(), b"hello");
        assert_eq!(packet.pad(), [0, 0, 0]);
        assert_eq!(packet.ext::<RethRepr>(), repr.ext.reth);
        assert_eq!(packet.ext::<AethRepr>(), None);
        assert_eq!(PacketRepr::parse(&packet), Ok(repr));
    }

    #[test]
    fn rejects_payload_on_an_ack() {
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: Msn::new(1),
            }),
            ..Default::default()
        };
        let repr = PacketRepr::new(bth(Opcode::RcAck), ext, 0);
        let mut buf = vec![0; repr.buffer_len() + 4];
        repr.emit(&mut buf).unwrap();
        let err = RocePacket::new_checked(&buf[..]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Field {
                    layer: Layer::Payload,
                    found: 4,
                    ..
                }
            ),
            "{err}"
        );
        assert!(RocePacket::new_checked(&buf[..20]).is_ok());
    }

    #[test]
    fn rejects_a_pad_larger_than_the_payload() {
        let (_, mut buf) = write_only(b"a");
        // Cut the payload to nothing but keep PadCnt 3: 0 payload bytes cannot hold 3 pad bytes.
        buf.drain(28..31);
        let err = RocePacket::new_checked(&buf[..]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Field {
                    field: "pad_count",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn names_the_missing_header() {
        let (_, buf) = write_only(b"");
        let err = RocePacket::new_checked(&buf[..20]).unwrap_err();
        assert_eq!(
            err,
            Error::Truncated {
                layer: Layer::Reth,
                needed: 28,
                available: 20
            }
        );
        let err = RocePacket::new_checked(&buf[..30]).unwrap_err();
        assert_eq!(
            err,
            Error::Truncated {
                layer: Layer::Icrc,
                needed: 32,
                available: 30
            }
        );
    }

    #[test]
    fn rejects_rd_xrc_and_unknown_opcodes() {
        let (_, mut buf) = write_only(b"");
        buf[0] = 0x44;
        assert!(matches!(
            RocePacket::new_checked(&buf[..]),
            Err(Error::UnsupportedTransport {
                opcode: 0x44,
                transport: crate::wire::Transport::Rd
            })
        ));
        buf[0] = 0xb0;
        assert!(matches!(
            RocePacket::new_checked(&buf[..]),
            Err(Error::UnsupportedTransport {
                transport: crate::wire::Transport::Xrc,
                ..
            })
        ));
        buf[0] = 0x1a;
        assert_eq!(
            RocePacket::new_checked(&buf[..]).unwrap_err(),
            Error::UnknownOpcode { value: 0x1a }
        );
    }

    /// `check`'s comparison of header sets agrees with the table, header by header: every
    /// implemented opcode with every subset of the seven extension headers passes exactly when
    /// the subset is the opcode's.
    #[test]
    fn check_passes_exactly_the_headers_each_opcode_requires() {
        for &opcode in Opcode::SUPPORTED {
            let info = opcode.info().unwrap();
            for subset in 0u8..1 << ALL_EXT_HEADERS.len() {
                let mut ext = ExtHeaders::default();
                let chosen = ALL_EXT_HEADERS
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| subset & (1 << i) != 0);
                for (_, kind) in chosen {
                    ext.parse_one(kind, &[0u8; 28][..kind.wire_len()]).unwrap();
                }
                let repr = PacketRepr::new(BthRepr::new(opcode, Qpn::new(1), Psn::new(0)), ext, 0);
                let wanted = ALL_EXT_HEADERS
                    .into_iter()
                    .all(|kind| info.headers.contains(&kind) == ext.is_present(kind));
                assert_eq!(repr.check().is_ok(), wanted, "{opcode:?} with {ext:?}");
            }
        }
    }

    #[test]
    fn emit_refuses_a_missing_or_extra_header() {
        let mut repr = PacketRepr::new(bth(Opcode::RcWriteOnly), ExtHeaders::default(), 0);
        let mut buf = [0u8; 64];
        assert_eq!(
            repr.emit(&mut buf),
            Err(Error::HeaderMismatch {
                opcode: 0x0a,
                layer: Layer::Reth,
                required: true
            })
        );
        repr.bth.opcode = Opcode::RcSendOnly;
        repr.ext.immdt = Some(ImmDtRepr { data: 1 });
        assert_eq!(
            repr.emit(&mut buf),
            Err(Error::HeaderMismatch {
                opcode: 0x04,
                layer: Layer::ImmDt,
                required: false
            })
        );
    }
}
