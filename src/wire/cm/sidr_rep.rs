//! SIDR_REP, service ID resolution reply (IBTA 12.11.2, table 120): the QPN and Q_Key that serve
//! the requested service ID, or why not.
//!
//! ```text
//!  0..4    request ID                      4      status
//!  5       additional information length   8..11  QPN
//! 12..20   service ID                     20..24  Q_Key
//! 24..96   additional information         96..232 private data (136 bytes)
//! ```

use super::super::field::{bytes_at, set_u24, set_u32, set_u64, u24_at, u32_at, u64_at};
use super::super::{Layer, QKey, Qpn, Result};
use super::ServiceId;

mod field {
    pub const REQUEST_ID: usize = 0;
    pub const STATUS: usize = 4;
    pub const INFO_LENGTH: usize = 5;
    pub const QPN: usize = 8;
    pub const SERVICE_ID: usize = 12;
    pub const QKEY: usize = 20;
    pub const INFO: usize = 24;
    pub const PRIVATE_DATA: usize = 96;
}

/// Private data a SIDR_REP carries.
pub const SIDR_REP_PRIVATE_DATA: usize = 136;
/// Additional information a SIDR_REP carries.
pub const SIDR_REP_INFO: usize = 72;

/// A SIDR_REP's status (IBTA table 121, `enum ib_cm_sidr_status`), kept whatever its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// 0: the service is found; QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// No one serves the service ID.
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// The service refused.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// 3: the service has no QP to offer.
    pub const NO_QP: SidrStatus = SidrStatus(3);

    /// The status's name in IBTA table 121, or "reserved".
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "success",
            1 => "service ID not supported",
            2 => "rejected",
            3 => "no QP",
            4 => "redirect",
            5 => "unsupported class version",
            _ => "reserved",
        }
    }
}

header_view!(
    /// A view of a SIDR_REP's 232 bytes.
    CmSidrRep,
    CmSidrRepRepr,
    Layer::CmSidrRep,
    232
);

/// The fields of a SIDR_REP. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrRepRepr {
    /// Request ID: the SIDR_REQ's, echoed.
    pub request_id: u32,
    /// Status: whether the service ID was resolved.
    pub status: SidrStatus,
    /// Additional Information Length: how many bytes of `info` are set.
    pub info_length: u8,
    /// QPN of the UD QP serving the service, 24 bits.
    pub qpn: Qpn,
    /// Service ID: the SIDR_REQ's, echoed.
    pub service_id: ServiceId,
    /// Q_Key the serving QP expects.
    pub qkey: QKey,
    /// Additional Information: 72 bytes whose meaning the status sets.
    pub info: [u8; SIDR_REP_INFO],
    /// Private Data: 136 bytes for the application.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA],
}

impl CmSidrRepRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(rep: &CmSidrRep<T>) -> Result<Self> {
        let b = rep.bytes();
        Ok(CmSidrRepRepr {
            request_id: u32_at(b, field::REQUEST_ID),
            status: SidrStatus(b[field::STATUS]),
            info_length: b[field::INFO_LENGTH],
            qpn: Qpn::new(u24_at(b, field::QPN)),
            service_id: ServiceId(u64_at(b, field::SERVICE_ID)),
            qkey: QKey(u32_at(b, field::QKEY)),
            info: bytes_at(b, field::INFO),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rep: &mut CmSidrRep<T>) {
        let b = &mut rep.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::REQUEST_ID, self.request_id);
        b[field::STATUS] = self.status.0;
        b[field::INFO_LENGTH] = self.info_length;
        set_u24(b, field::QPN, self.qpn.value());
        set_u64(b, field::SERVICE_ID, self.service_id.0);
        set_u32(b, field::QKEY, self.qkey.0);
        b[field::INFO..field::PRIVATE_DATA].copy_from_slice(&self.info);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
