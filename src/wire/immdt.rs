//! The Immediate Data Extended Transport Header (IBTA 9.3.4), 4 bytes carried by the
//! `..._WITH_IMMEDIATE` opcodes and handed to the receiver in its completion.

use super::field::{set_u32, u32_at};
use super::{Layer, Result};

mod field {
    pub const DATA: usize = 0;
}

header_view!(
    /// A view of an ImmDt header.
    ImmDt,
    ImmDtRepr,
    Layer::ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate data, read big-endian. Verbs hands it to applications in network order
    /// (`__be32 imm_data`): `to_be_bytes` of this value gives those bytes.
    pub fn data(&self) -> u32 {
        u32_at(self.bytes(), field::DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Writes the immediate data, big-endian.
    pub fn set_data(&mut self, data: u32) {
        set_u32(self.bytes_mut(), field::DATA, data);
    }
}

/// The immediate data of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// The 32-bit immediate data, as a big-endian read of its 4 bytes.
    pub data: u32,
}

impl ImmDtRepr {
    /// Reads the field out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(imm: &ImmDt<T>) -> Result<Self> {
        Ok(ImmDtRepr { data: imm.data() })
    }

    /// Writes the field into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, imm: &mut ImmDt<T>) {
        imm.set_data(self.data);
    }
}
