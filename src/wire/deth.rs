//! The Datagram Extended Transport Header (IBTA 9.3.2), 8 bytes, in every UD packet.
//!
//! ```text
//!  0..4    Q_Key
//!  4       reserved
//!  5..8    source QP (24)
//! ```

use super::field::{set_u24, set_u32, u24_at, u32_at};
use super::{Layer, QKey, Qpn, Result};

mod field {
    pub const QKEY: usize = 0;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: usize = 5;
}

header_view!(
    /// A view of a DETH.
    Deth,
    DethRepr,
    Layer::Deth,
    8
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// The Q_Key (bytes 0 to 3) the receiving UD QP checks before it accepts the packet.
    pub fn qkey(&self) -> QKey {
        QKey(u32_at(self.bytes(), field::QKEY))
    }

    /// The source QP number (bytes 5 to 7), 24 bits: the sender's UD QP, where replies go.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(u24_at(self.bytes(), field::SRC_QP))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Writes the Q_Key.
    pub fn set_qkey(&mut self, qkey: QKey) {
        set_u32(self.bytes_mut(), field::QKEY, qkey.0);
    }

    /// Writes the source QP, with the reserved byte before it zero.
    pub fn set_src_qp(&mut self, qpn: Qpn) {
        self.bytes_mut()[field::RESERVED] = 0;
        set_u24(self.bytes_mut(), field::SRC_QP, qpn.value());
    }
}

/// The fields of a DETH. The reserved byte is sent as zero and ignored on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// The Q_Key the destination QP must hold.
    pub qkey: QKey,
    /// The sender's QP number, 24 bits.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(deth: &Deth<T>) -> Result<Self> {
        Ok(DethRepr {
            qkey: deth.qkey(),
            src_qp: deth.src_qp(),
        })
    }

    /// Writes the fields into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, deth: &mut Deth<T>) {
        deth.set_qkey(self.qkey);
        deth.set_src_qp(self.src_qp);
    }
}
