//! MRA, "message received, acknowledged" (IBTA 12.6.6, table 107): the receiver needs longer
//! than the sender's CM response timeout, and says so.
//!
//! ```text
//!  0..4   local communication ID          4..8   remote communication ID
//!  8      message MRAed (2): 0 REQ, 1 REP, 2 LAP
//!  9      service timeout (5): 4.096 µs × 2^value more to wait
//! 10..232 private data (222 bytes)
//! ```

use super::super::field::{bits_at, bytes_at, set_bits, set_u32, u32_at};
use super::super::{Layer, Result};

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub const MESSAGE_MRAED: usize = 8;
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: usize = 10;
}

/// Private data an MRA carries.
pub const MRA_PRIVATE_DATA: usize = 222;

header_view!(
    /// A view of an MRA's 232 bytes.
    CmMra,
    CmMraRepr,
    Layer::CmMra,
    232
);

/// The fields of an MRA. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmMraRepr {
    /// Local Communication ID: the sender's ID for the connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the ID the receiver's REQ, REP or LAP gave.
    pub remote_comm_id: u32,
    /// Which message is acknowledged: 0 REQ, 1 REP, 2 LAP.
    pub message_mraed: u8,
    /// Service Timeout: how much longer to wait (5 bits: 4.096 µs × 2^value).
    pub service_timeout: u8,
    /// Private Data: 222 bytes for the application.
    pub private_data: [u8; MRA_PRIVATE_DATA],
}

impl CmMraRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(mra: &CmMra<T>) -> Result<Self> {
        let b = mra.bytes();
        Ok(CmMraRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            message_mraed: bits_at(b, field::MESSAGE_MRAED, 0, 2),
            service_timeout: bits_at(b, field::SERVICE_TIMEOUT, 0, 5),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mra: &mut CmMra<T>) {
        let b = &mut mra.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        set_bits(b, field::MESSAGE_MRAED, 0, 2, self.message_mraed);
        set_bits(b, field::SERVICE_TIMEOUT, 0, 5, self.service_timeout);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
