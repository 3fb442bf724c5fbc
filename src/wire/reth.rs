//! The RDMA Extended Transport Header (IBTA 9.3.3), 16 bytes: where an RDMA READ or WRITE goes.
//!
//! ```text
//!  0..8    virtual address
//!  8..12   R_Key
//! 12..16   DMA length (of the whole message)
//! ```

use super::field::{set_u32, set_u64, u32_at, u64_at};
use super::{Layer, RKey, Result};

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}

header_view!(
    /// A view of a RETH.
    Reth,
    RethRepr,
    Layer::Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// The virtual address (bytes 0 to 7) where the message starts in the responder's memory.
    pub fn virtual_address(&self) -> u64 {
        u64_at(self.bytes(), field::VA)
    }

    /// The R_Key (bytes 8 to 11) that grants access to the responder's region.
    pub fn rkey(&self) -> RKey {
        RKey(u32_at(self.bytes(), field::RKEY))
    }

    /// The DMA length (bytes 12 to 15): the whole message's length in bytes.
    pub fn dma_len(&self) -> u32 {
        u32_at(self.bytes(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Writes the virtual address.
    pub fn set_virtual_address(&mut self, va: u64) {
        set_u64(self.bytes_mut(), field::VA, va);
    }

    /// Writes the R_Key.
    pub fn set_rkey(&mut self, rkey: RKey) {
        set_u32(self.bytes_mut(), field::RKEY, rkey.0);
    }

    /// Writes the DMA length.
    pub fn set_dma_len(&mut self, len: u32) {
        set_u32(self.bytes_mut(), field::DMA_LEN, len);
    }
}

/// The fields of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// The responder's virtual address where the message starts.
    pub virtual_address: u64,
    /// The R_Key that grants access to the responder's region.
    pub rkey: RKey,
    /// The whole message's length in bytes, not this packet's.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<Self> {
        Ok(RethRepr {
            virtual_address: reth.virtual_address(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// Writes the fields into a checked view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) {
        reth.set_virtual_address(self.virtual_address);
        reth.set_rkey(self.rkey);
        reth.set_dma_len(self.dma_len);
    }
}
