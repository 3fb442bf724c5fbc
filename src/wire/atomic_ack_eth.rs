//! The Atomic Acknowledge Extended Transport Header (IBTA 9.5.3), 8 bytes: the value the
//! target held before an atomic operation ran.

use super::field::{set_u64, u64_at};
use super::{Layer, Result};

mod field {
    pub const ORIG_DATA: usize = 0;
}

header_view!(
    /// A view of an AtomicAckETH.
    AtomicAckEth,
    AtomicAckEthRepr,
    Layer::AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    pub fn original_data(&self) -> u64 {
        u64_at(self.bytes(), field::ORIG_DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    pub fn set_original_data(&mut self, value: u64) {
        set_u64(self.bytes_mut(), field::ORIG_DATA, value);
    }
}

/// The original remote data returned by an atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    pub original_data: u64,
}

impl AtomicAckEthRepr {
    pub fn parse<T: AsRef<[u8]>>(ack: &AtomicAckEth<T>) -> Result<Self> {
        Ok(AtomicAckEthRepr {
            original_data: ack.original_data(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ack: &mut AtomicAckEth<T>) {
        ack.set_original_data(self.original_data);
    }
}
