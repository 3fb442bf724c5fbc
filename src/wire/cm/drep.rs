//! DREP, the disconnection reply (IBTA 12.6.11): sent once the QP has left the connection.
//!
//! ```text
//!  0..4    local communication ID         4..8   remote communication ID
//!  8..232  private data (224 bytes)
//! ```

use super::super::field::{bytes_at, set_u32, u32_at};
use super::super::{Layer, Result};

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub const PRIVATE_DATA: usize = 8;
}

/// Private data a DREP carries.
pub const DREP_PRIVATE_DATA: usize = 224;

header_view!(
    /// A view of a DREP's 232 bytes.
    CmDrep,
    CmDrepRepr,
    Layer::CmDrep,
    232
);

/// The fields of a DREP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDrepRepr {
    /// Local Communication ID: the sender's ID for the connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's ID for the connection.
    pub remote_comm_id: u32,
    /// Private Data: 224 bytes for the application.
    pub private_data: [u8; DREP_PRIVATE_DATA],
}

impl CmDrepRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(message: &CmDrep<T>) -> Result<Self> {
        let b = message.bytes();
        Ok(CmDrepRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, message: &mut CmDrep<T>) {
        let b = &mut message.bytes_mut()[..232];
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
