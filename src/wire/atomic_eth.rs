//! The Atomic Extended Transport Header (IBTA 9.3.3.2), 28 bytes, in CMP_SWAP and FETCH_ADD.
//!
//! ```text
//!  0..8    virtual address (8-byte aligned)
//!  8..12   R_Key
//! 12..20   swap data (CMP_SWAP) or add data (FETCH_ADD)
//! 20..28   compare data (CMP_SWAP only)
//! ```

use super::field::{set_u32, set_u64, u32_at, u64_at};
use super::{Layer, RKey, Result};

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}

header_view!(
    /// A view of an AtomicETH.
    AtomicEth,
    AtomicEthRepr,
    Layer::AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// The virtual address (bytes 0 to 7) of the 64-bit target; 8-byte aligned.
    pub fn virtual_address(&self) -> u64 {
        u64_at(self.bytes(), field::VA)
    }

    /// The R_Key (bytes 8 to 11) that grants access to the target.
    pub fn rkey(&self) -> RKey {
        RKey(u32_at(self.bytes(), field::RKEY))
    }

    /// Swap data (CMP_SWAP) or add data (FETCH_ADD), bytes 12 to 19.
    pub fn swap_add(&self) -> u64 {
        u64_at(self.bytes(), field::SWAP_ADD)
    }

    /// Compare data (bytes 20 to 27), used by CMP_SWAP only.
    pub fn compare(&self) -> u64 {
        u64_at(self.bytes(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Writes the virtual address.
    pub fn set_virtual_address(&mut self, va: u64) {
        set_u64(self.bytes_mut(), field::VA, va);
    }

    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: RKey) {
        set_u32(self.bytes_mut(), field::RKEY, rkey.0);
    }

    /// Writes the swap or add data.
    pub fn set_swap_add(&mut self, value: u64) {
        set_u64(self.bytes_mut(), field::SWAP_ADD, value);
    }

    /// Writes the compare data.
    pub fn set_compare(&mut self, value: u64) {
        set_u64(self.bytes_mut(), field::COMPARE, value);
    }
}

/// The fields of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// The responder's virtual address of the 64-bit target; 8-byte aligned.
    pub virtual_address: u64,
    /// The R_Key that grants access to the target.
    pub rkey: RKey,
    /// The value to store (CMP_SWAP) or to add (FETCH_ADD).
    pub swap_add: u64,
    /// The value to compare with (CMP_SWAP); FETCH_ADD carries it but ignores it.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicEth<T>) -> Result<Self> {
        Ok(AtomicEthRepr {
            virtual_address: eth.virtual_address(),
            rkey: eth.rkey(),
            swap_add: eth.swap_add(),
            compare: eth.compare(),
        })
    }

    /// Writes the fields into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicEth<T>) {
        eth.set_virtual_address(self.virtual_address);
        eth.set_rkey(self.rkey);
        eth.set_swap_add(self.swap_add);
        eth.set_compare(self.compare);
    }
}
