//! The body of a congestion notification packet (RoCEv2, IBTA Annex A17.9.2): after a BTH with
//! opcode 0x81 and BECN set come 16 reserved bytes, then the ICRC.

use super::{Layer, Result};

header_view!(
    /// A view of the 16 reserved bytes of a CNP.
    Cnp,
    CnpPad,
    Layer::Cnp,
    16
);

impl<T: AsRef<[u8]>> Cnp<T> {
    /// The reserved bytes, as received.
    pub fn reserved(&self) -> &[u8] {
        &self.bytes()[..16]
    }
}

/// The reserved bytes of a CNP. They carry nothing: they are sent as zero and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CnpPad;

impl CnpPad {
    /// Accepts any reserved bytes: a receiver ignores them.
    pub fn parse<T: AsRef<[u8]>>(_cnp: &Cnp<T>) -> Result<Self> {
        Ok(CnpPad)
    }

    /// Writes the 16 reserved bytes as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cnp: &mut Cnp<T>) {
        cnp.bytes_mut()[..16].fill(0);
    }
}
