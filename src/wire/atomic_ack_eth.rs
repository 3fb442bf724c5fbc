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
    /// The original data (bytes 0 to 7): the 64-bit value at the target address before the atomic.
    pub fn original_data(&self) -> u64 {
        u64_at(self.bytes(), field::ORIG_DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Writes the original data.
    pub fn set_original_data(&mut self, value: u64) {
        set_u64(self.bytes_mut(), field::ORIG_DATA, value);
    }
}

/// The original remote data returned by an atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The 64-bit value the target address held before the atomic ran.
    pub original_data: u64,
}

impl AtomicAckEthRepr {
    /// Reads the field out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(ack: &AtomicAckEth<T>) -> Result<Self> {
        Ok(AtomicAckEthRepr {
            original_data: ack.original_data(),
        })
    }

    /// Writes the field into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ack: &mut AtomicAckEth<T>) {
        ack.set_original_data(self.original_data);
    }
}
