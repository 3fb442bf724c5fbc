//! The ACK Extended Transport Header (IBTA 9.3.6), 4 bytes: the syndrome and the MSN.
//!
//! ```text
//!  0       syndrome: reserved (1) | type (2) | value (5)
//!  1..4    MSN (24)
//! ```
//!
//! The syndrome type selects what the 5-bit value means (IBTA 9.7.5.2, tables 42 to 45): for an
//! ACK, the end-to-end credit code; for an RNR NAK, the timer code; for a NAK, the NAK code.

use core::fmt;

use super::field::{set_u24, u24_at};
use super::{Layer, Msn, Result};

mod field {
    pub const SYNDROME: usize = 0;
    pub const MSN: usize = 1;
}

const TYPE_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1f;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

/// An ACK's credit code (IBTA table 44): how many receive WQEs the responder has posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CreditCode(u8);

/// The credit counts of codes 0 to 30. Code 31 means the responder does not report credits,
/// which is what rxe always sends.
const CREDITS: [u16; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCode {
    /// Code 31: no credit count, end-to-end flow control is not in use.
    pub const INVALID: CreditCode = CreditCode(31);

    /// Keeps the low five bits.
    pub const fn new(code: u8) -> Self {
        CreditCode(code & VALUE_MASK)
    }

    /// The 5-bit code, 0 to 31.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The number of credits, or `None` for code 31.
    pub fn credits(self) -> Option<u16> {
        CREDITS.get(usize::from(self.0)).copied()
    }

    /// The largest code whose credit count does not exceed `credits`.
    pub fn for_credits(credits: u32) -> Self {
        let code = CREDITS
            .iter()
            .rposition(|&c| u32::from(c) <= credits)
            .unwrap_or(0);
        CreditCode(code as u8)
    }
}

/// An RNR NAK's timer code (IBTA table 45): how long the requester waits before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RnrTimer(u8);

/// The delays of timer codes 0 to 31, in microseconds. Code 0 is the longest, 655.36 ms.
const RNR_DELAY_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// Keeps the low five bits.
    pub const fn new(code: u8) -> Self {
        RnrTimer(code & VALUE_MASK)
    }

    /// The 5-bit code, 0 to 31.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay the code stands for, in microseconds.
    pub const fn micros(self) -> u32 {
        RNR_DELAY_US[self.0 as usize]
    }
}

/// A NAK code (IBTA table 43). Reserved codes are kept, so that the requester can decide what a
/// peer's unexpected NAK means instead of the parser dropping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0x60: the PSN was not the one expected.
    PsnSequenceError,
    /// 0x61: an invalid request (bad opcode sequence, length, or unsupported operation).
    InvalidRequest,
    /// 0x62: a remote access error (R_Key, bounds or access rights).
    RemoteAccessError,
    /// 0x63: the responder could not complete the request.
    RemoteOperationalError,
    /// 0x64: an invalid RD request.
    InvalidRdRequest,
    /// Codes 5 to 31, reserved.
    Reserved(u8),
}

impl NakCode {
    /// Decodes the low five bits of a NAK syndrome; codes 5 to 31 become `Reserved`.
    pub const fn from_code(code: u8) -> Self {
        match code & VALUE_MASK {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Reserved(other),
        }
    }

    /// The 5-bit code, as the low bits of the syndrome carry it.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(code) => code & VALUE_MASK,
        }
    }
}

/// The decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckSyndrome {
    /// A positive acknowledgement with its credit code.
    Ack(CreditCode),
    /// Receiver not ready: retry after the timer's delay.
    RnrNak(RnrTimer),
    /// A negative acknowledgement.
    Nak(NakCode),
    /// A syndrome byte with the reserved type (0b10) or the reserved top bit set, kept whole.
    Reserved(u8),
}

impl AckSyndrome {
    /// An ACK without a credit count, as rxe sends it (syndrome 0x1F).
    pub const ACK_NO_CREDITS: AckSyndrome = AckSyndrome::Ack(CreditCode::INVALID);

    /// Decodes a syndrome byte: bits 6..5 give the type, bits 4..0 its value; a set top bit or the
    /// reserved type 0b10 gives `Reserved`.
    pub const fn from_byte(byte: u8) -> Self {
        if byte & 0x80 != 0 {
            return AckSyndrome::Reserved(byte);
        }
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => AckSyndrome::Ack(CreditCode(value)),
            TYPE_RNR_NAK => AckSyndrome::RnrNak(RnrTimer(value)),
            TYPE_NAK => AckSyndrome::Nak(NakCode::from_code(value)),
            _ => AckSyndrome::Reserved(byte),
        }
    }

    /// Encodes the syndrome byte; `from_byte` of the result gives `self` back.
    pub const fn to_byte(self) -> u8 {
        match self {
            AckSyndrome::Ack(credits) => TYPE_ACK | credits.0,
            AckSyndrome::RnrNak(timer) => TYPE_RNR_NAK | timer.0,
            AckSyndrome::Nak(code) => TYPE_NAK | code.code(),
            AckSyndrome::Reserved(byte) => byte,
        }
    }
}

impl fmt::Display for AckSyndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AckSyndrome::Ack(c) => match c.credits() {
                Some(n) => write!(f, "ACK credits={n}"),
                None => f.write_str("ACK"),
            },
            AckSyndrome::RnrNak(t) => write!(f, "RNR-NAK timer={}us", t.micros()),
            AckSyndrome::Nak(code) => {
                let what = match code {
                    NakCode::PsnSequenceError => "PSN sequence error",
                    NakCode::InvalidRequest => "invalid request",
                    NakCode::RemoteAccessError => "remote access error",
                    NakCode::RemoteOperationalError => "remote operational error",
                    NakCode::InvalidRdRequest => "invalid RD request",
                    NakCode::Reserved(_) => "reserved",
                };
                write!(f, "NAK 0x{:02x} ({what})", self.to_byte())
            }
            AckSyndrome::Reserved(b) => write!(f, "reserved syndrome 0x{b:02x}"),
        }
    }
}

header_view!(
    /// A view of an AETH.
    Aeth,
    AethRepr,
    Layer::Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The syndrome byte (byte 0): ACK, RNR NAK or NAK, with its 5-bit value.
    pub fn syndrome(&self) -> AckSyndrome {
        AckSyndrome::from_byte(self.bytes()[field::SYNDROME])
    }

    /// The MSN (bytes 1 to 3): the responder's message sequence number, 24 bits.
    pub fn msn(&self) -> Msn {
        Msn::new(u24_at(self.bytes(), field::MSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Writes the syndrome byte.
    pub fn set_syndrome(&mut self, syndrome: AckSyndrome) {
        self.bytes_mut()[field::SYNDROME] = syndrome.to_byte();
    }

    /// Writes the 24-bit MSN.
    pub fn set_msn(&mut self, msn: Msn) {
        set_u24(self.bytes_mut(), field::MSN, msn.value());
    }
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// The syndrome: ACK with credits, RNR NAK with timer, or NAK with code.
    pub syndrome: AckSyndrome,
    /// The responder's message sequence number, 24 bits.
    pub msn: Msn,
}

impl AethRepr {
    /// Reads the fields out of a checked view; never fails, every syndrome byte decodes.
    pub fn parse<T: AsRef<[u8]>>(aeth: &Aeth<T>) -> Result<Self> {
        Ok(AethRepr {
            syndrome: aeth.syndrome(),
            msn: aeth.msn(),
        })
    }

    /// Writes the fields into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, aeth: &mut Aeth<T>) {
        aeth.set_syndrome(self.syndrome);
        aeth.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syndrome_byte_round_trips() {
        for byte in 0..=u8::MAX {
            assert_eq!(AckSyndrome::from_byte(byte).to_byte(), byte, "0x{byte:02x}");
        }
    }

    #[test]
    fn nak_codes_0x60_to_0x64() {
        let codes = [
            (0x60, NakCode::PsnSequenceError),
            (0x61, NakCode::InvalidRequest),
            (0x62, NakCode::RemoteAccessError),
            (0x63, NakCode::RemoteOperationalError),
            (0x64, NakCode::InvalidRdRequest),
            (0x65, NakCode::Reserved(5)),
        ];
        for (byte, code) in codes {
            assert_eq!(AckSyndrome::from_byte(byte), AckSyndrome::Nak(code));
            assert_eq!(AckSyndrome::Nak(code).to_byte(), byte);
        }
        assert_eq!(AckSyndrome::from_byte(0x45), AckSyndrome::Reserved(0x45));
    }

    #[test]
    fn rxe_acks_carry_no_credit_count() {
        // rxe_resp.c sends AETH_ACK_UNLIMITED (0x1f) in every ACK.
        let syn = AckSyndrome::from_byte(0x1f);
        assert_eq!(syn, AckSyndrome::ACK_NO_CREDITS);
        assert_eq!(CreditCode::INVALID.credits(), None);
    }

    #[test]
    fn credit_table() {
        // IBTA table 44: codes double every two steps, 1, 1.5, 2, 3, 4, 6, ...
        assert_eq!(CreditCode::new(0).credits(), Some(0));
        assert_eq!(CreditCode::new(5).credits(), Some(6));
        assert_eq!(CreditCode::new(30).credits(), Some(32768));
        assert_eq!(CreditCode::for_credits(7), CreditCode::new(5));
        assert_eq!(CreditCode::for_credits(100_000), CreditCode::new(30));
    }

    #[test]
    fn rnr_timer_table() {
        // IBTA table 45; rxe_comp.c keeps the same table as rnrnak_usec.
        assert_eq!(RnrTimer::new(0).micros(), 655_360);
        assert_eq!(RnrTimer::new(1).micros(), 10);
        assert_eq!(RnrTimer::new(12).micros(), 640);
        assert_eq!(RnrTimer::new(31).micros(), 491_520);
        assert_eq!(
            AckSyndrome::from_byte(0x2c),
            AckSyndrome::RnrNak(RnrTimer::new(12))
        );
    }
}
