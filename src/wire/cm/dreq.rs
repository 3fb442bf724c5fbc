//! DREQ, the disconnection request (IBTA 12.6.10, table 112 of the 1.4 numbering: `cm_msgs.h`).
//!
//! ```text
//!  0..4    local communication ID         4..8   remote communication ID
//!  8..11   remote QPN (the receiver checks it against its own)
//! 12..232  private data (220 bytes)
//! ```

use super::super::field::{bytes_at, set_u24, set_u32, u24_at, u32_at};
use super::super::{Layer, Qpn, Result};

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub const REMOTE_QPN: usize = 8;
    pub const PRIVATE_DATA: usize = 12;
}

/// Private data a DREQ carries.
pub const DREQ_PRIVATE_DATA: usize = 220;

header_view!(
    /// A view of a DREQ's 232 bytes.
    CmDreq,
    CmDreqRepr,
    Layer::CmDreq,
    232
);

/// The fields of a DREQ. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDreqRepr {
    /// Local Communication ID: the sender's ID for the connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's ID for the connection.
    pub remote_comm_id: u32,
    /// The receiver's QPN, as the sender knows it.
    pub remote_qpn: Qpn,
    /// Private Data: 220 bytes for the application.
    pub private_data: [u8; DREQ_PRIVATE_DATA],
}

impl CmDreqRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(dreq: &CmDreq<T>) -> Result<Self> {
        let b = dreq.bytes();
        Ok(CmDreqRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            remote_qpn: Qpn::new(u24_at(b, field::REMOTE_QPN)),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, dreq: &mut CmDreq<T>) {
        let b = &mut dreq.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        set_u24(b, field::REMOTE_QPN, self.remote_qpn.value());
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
