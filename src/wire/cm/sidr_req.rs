//! SIDR_REQ, service ID resolution request (IBTA 12.11.1, table 119): what UD (RDMA-CM's UDP port
//! space) sends instead of a REQ, to learn the QPN and Q_Key serving a service ID.
//!
//! ```text
//!  0..4    request ID                      4..6   partition key
//!  8..16   service ID                     16..232 private data (216 bytes; RDMA-CM's IP header
//!                                                  first)
//! ```

use super::super::field::{bytes_at, set_u16, set_u32, set_u64, u16_at, u32_at, u64_at};
use super::super::{Layer, PKey, Result};
use super::ServiceId;

mod field {
    pub const REQUEST_ID: usize = 0;
    pub const PKEY: usize = 4;
    pub const SERVICE_ID: usize = 8;
    pub const PRIVATE_DATA: usize = 16;
}

/// Private data a SIDR_REQ carries.
pub const SIDR_REQ_PRIVATE_DATA: usize = 216;

header_view!(
    /// A view of a SIDR_REQ's 232 bytes.
    CmSidrReq,
    CmSidrReqRepr,
    Layer::CmSidrReq,
    232
);

/// The fields of a SIDR_REQ. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrReqRepr {
    /// The requester's ID for this request, which the reply echoes.
    pub request_id: u32,
    /// Partition Key the requester uses.
    pub pkey: PKey,
    /// Service ID: the service to resolve.
    pub service_id: ServiceId,
    /// Private Data: 216 bytes; RDMA-CM puts its IP header first.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA],
}

impl CmSidrReqRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(req: &CmSidrReq<T>) -> Result<Self> {
        let b = req.bytes();
        Ok(CmSidrReqRepr {
            request_id: u32_at(b, field::REQUEST_ID),
            pkey: PKey(u16_at(b, field::PKEY)),
            service_id: ServiceId(u64_at(b, field::SERVICE_ID)),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, req: &mut CmSidrReq<T>) {
        let b = &mut req.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::REQUEST_ID, self.request_id);
        set_u16(b, field::PKEY, self.pkey.0);
        set_u64(b, field::SERVICE_ID, self.service_id.0);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
