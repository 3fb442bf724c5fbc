//! The Base Transport Header (IBTA 9.2), 12 bytes at the start of every RoCE packet.
//!
//! ```text
//!  0       opcode
//!  1       SE | MigReq | PadCnt (2) | TVer (4)
//!  2..4    P_Key
//!  4       FECN | BECN | reserved (6)        <- masked out of the ICRC
//!  5..8    DestQP (24)
//!  8       AckReq | reserved (7)
//!  9..12   PSN (24)
//! ```

use super::field::{set_u16, set_u24, u16_at, u24_at};
use super::{Error, Layer, Opcode, PKey, Psn, Qpn, Result};

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const ECN: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK_REQ: usize = 8;
    pub const PSN: usize = 9;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// The byte of the BTH that the ICRC masks to all ones (FECN, BECN and reserved bits), because
/// switches may set FECN and BECN in flight.
pub const ICRC_MASKED_BYTE: usize = field::ECN;

header_view!(
    /// A view of a BTH.
    Bth,
    BthRepr,
    Layer::Bth,
    12
);

impl<T: AsRef<[u8]>> Bth<T> {
    /// The opcode (byte 0): transport in the top three bits, operation in the low five.
    pub fn opcode(&self) -> Opcode {
        Opcode::from_u8(self.bytes()[field::OPCODE])
    }

    /// SE: the responder should raise a solicited event.
    pub fn solicited(&self) -> bool {
        self.bytes()[field::FLAGS] & SE != 0
    }

    /// MigReq. ConnectX sends 1, rxe sends 0; RoCE has no path migration, so it is carried only.
    pub fn mig_req(&self) -> bool {
        self.bytes()[field::FLAGS] & MIG_REQ != 0
    }

    /// The number of pad bytes (0 to 3) at the end of the payload.
    pub fn pad_count(&self) -> u8 {
        (self.bytes()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// The transport header version; 0 is the only one defined.
    pub fn tver(&self) -> u8 {
        self.bytes()[field::FLAGS] & TVER_MASK
    }

    /// Refuses a TVer other than 0, the only version (IBTA 9.2): receivers drop the packet.
    pub fn check_tver(&self) -> Result<()> {
        match self.tver() {
            0 => Ok(()),
            tver => Err(Error::Field {
                layer: Layer::Bth,
                field: "tver",
                found: tver.into(),
                expected: "0",
            }),
        }
    }

    /// The partition key (bytes 2 and 3).
    pub fn pkey(&self) -> PKey {
        PKey(u16_at(self.bytes(), field::PKEY))
    }

    /// FECN: congestion was met forward of here (set by switches).
    pub fn fecn(&self) -> bool {
        self.bytes()[field::ECN] & FECN != 0
    }

    /// BECN: the receiver saw congestion (CNPs carry it).
    pub fn becn(&self) -> bool {
        self.bytes()[field::ECN] & BECN != 0
    }

    /// The destination QP number (bytes 5 to 7), 24 bits.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(u24_at(self.bytes(), field::DEST_QP))
    }

    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.bytes()[field::ACK_REQ] & ACK_REQ != 0
    }

    /// The packet sequence number (bytes 9 to 11), 24 bits.
    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.bytes(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Writes the opcode byte.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.bytes_mut()[field::OPCODE] = opcode.value();
    }

    /// Writes SE, MigReq, PadCnt and TVer 0 at once: they share a byte.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        let mut byte = (pad_count << PAD_SHIFT) & PAD_MASK;
        if solicited {
            byte |= SE;
        }
        if mig_req {
            byte |= MIG_REQ;
        }
        self.bytes_mut()[field::FLAGS] = byte;
    }

    /// Writes the partition key.
    pub fn set_pkey(&mut self, pkey: PKey) {
        set_u16(self.bytes_mut(), field::PKEY, pkey.0);
    }

    /// Writes FECN and BECN, with the reserved bits zero.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.bytes_mut()[field::ECN] = if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
    }

    /// Writes the 24-bit destination QP number.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        set_u24(self.bytes_mut(), field::DEST_QP, qpn.value());
    }

    /// Writes AckReq, with the reserved bits zero.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.bytes_mut()[field::ACK_REQ] = if ack_req { ACK_REQ } else { 0 };
    }

    /// Writes the 24-bit PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_u24(self.bytes_mut(), field::PSN, psn.value());
    }
}

/// The fields of a BTH. Reserved bits are not kept: they are sent as zero and ignored on receipt
/// (IBTA 9.2, "reserved fields").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// The opcode: transport and operation.
    pub opcode: Opcode,
    /// SE: the responder should raise a solicited event on completion.
    pub solicited: bool,
    /// MigReq: carried only, since RoCE has no path migration.
    pub mig_req: bool,
    /// PadCnt: pad bytes (0 to 3) that bring the payload to a multiple of 4.
    pub pad_count: u8,
    /// The partition key.
    pub pkey: PKey,
    /// FECN: a switch saw congestion on the way here.
    pub fecn: bool,
    /// BECN: the receiver saw congestion; set in CNPs.
    pub becn: bool,
    /// The destination QP number, 24 bits.
    pub dest_qp: Qpn,
    /// AckReq: the requester asks for an acknowledgement.
    pub ack_req: bool,
    /// The packet sequence number, 24 bits.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the default partition and every flag clear; the packet layer sets PadCnt.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads a BTH, refusing a transport header version other than 0: IBTA 9.6.1.1 has the
    /// receiver silently drop a packet whose TVer it does not support.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<Self> {
        bth.check_tver()?;
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Writes every field into a checked view, with TVer 0 and reserved bits zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.set_flags(self.solicited, self.mig_req, self.pad_count);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HeaderRepr;

    // The BTH of scapy's ConnectX-4 Lx CNP capture (test/contrib/roce.uts).
    const CNP_BTH: [u8; 12] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn reads_every_field() {
        let bth = Bth::new_checked(&CNP_BTH[..]).unwrap();
        assert_eq!(bth.opcode(), Opcode::Cnp);
        assert!(bth.becn() && !bth.fecn());
        assert_eq!(bth.pkey(), PKey::DEFAULT);
        assert_eq!(bth.dest_qp(), Qpn::new(0x118));
        assert_eq!(
            (bth.psn(), bth.pad_count(), bth.ack_req()),
            (Psn::new(0), 0, false)
        );
    }

    #[test]
    fn flag_bits_are_where_the_spec_puts_them() {
        let repr = BthRepr {
            opcode: Opcode::RcSendOnly,
            solicited: true,
            mig_req: true,
            pad_count: 3,
            pkey: PKey(0x8001),
            fecn: true,
            becn: false,
            dest_qp: Qpn::new(0xabcdef),
            ack_req: true,
            psn: Psn::new(0x123456),
        };
        let mut bytes = [0u8; 12];
        repr.emit_bytes(&mut bytes).unwrap();
        assert_eq!(
            bytes,
            [0x04, 0xf0, 0x80, 0x01, 0x80, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56]
        );
        assert_eq!(BthRepr::parse_bytes(&bytes), Ok(repr));
    }

    #[test]
    fn refuses_a_nonzero_tver_and_short_buffers() {
        let mut bytes = CNP_BTH;
        bytes[1] = 0x01;
        let err = BthRepr::parse_bytes(&bytes).unwrap_err();
        assert!(matches!(
            err,
            Error::Field {
                field: "tver",
                found: 1,
                ..
            }
        ));
        assert_eq!(
            Bth::new_checked(&bytes[..11]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Bth,
                needed: 12,
                available: 11
            }
        );
    }
}
