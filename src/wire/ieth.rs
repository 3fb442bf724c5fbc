//! The Invalidate Extended Transport Header (IBTA 9.3.5), 4 bytes: the R_Key that a
//! `SEND_..._WITH_INVALIDATE` asks the responder to invalidate.

use super::field::{set_u32, u32_at};
use super::{Layer, RKey, Result};

mod field {
    pub const RKEY: usize = 0;
}

header_view!(
    /// A view of an IETH.
    Ieth,
    IethRepr,
    Layer::Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key (bytes 0 to 3) the responder is asked to invalidate.
    pub fn rkey(&self) -> RKey {
        RKey(u32_at(self.bytes(), field::RKEY))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: RKey) {
        set_u32(self.bytes_mut(), field::RKEY, rkey.0);
    }
}

/// The R_Key to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// The R_Key the responder is asked to invalidate.
    pub rkey: RKey,
}

impl IethRepr {
    /// Reads the field out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(ieth: &Ieth<T>) -> Result<Self> {
        Ok(IethRepr { rkey: ieth.rkey() })
    }

    /// Writes the field into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ieth: &mut Ieth<T>) {
        ieth.set_rkey(self.rkey);
    }
}
