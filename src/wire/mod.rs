//! The RoCEv2 wire format: one module per header, the opcode table, whole packets, the ICRC and
//! whole frames.
//!
//! Every header follows one pattern. A view (`Bth<T>`, `Reth<T>`, ...) borrows a byte buffer and
//! reads or writes its fields in place; `new_checked` verifies the length once, and after it no
//! accessor can panic. Beside each view stands an owned representation (`BthRepr`, `RethRepr`,
//! ...) with `parse` and `emit`. This layer has no state, does no I/O and allocates nothing.

#[macro_use]
mod macros;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod ecn;
mod error;
mod field;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod packet;
pub mod reth;
mod types;

pub use aeth::{AckSyndrome, Aeth, AethRepr, CreditCode, NakCode, RnrTimer};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use cnp::CnpPad;
pub use deth::{Deth, DethRepr};
pub use ecn::Ecn;
pub use error::{Error, Layer, Result};
pub use frame::{Frame, FrameError, FrameRepr, IpRepr, OpaqueRoce, UdpChecksum};
pub use icrc::{solve_ipv4_id, IcrcStatus, KernelFraming};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{ExtHeader, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{ExtHeaders, PacketRepr, RocePacket};
pub use reth::{Reth, RethRepr};
pub use types::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// An owned header representation that lives at a fixed length in a packet.
///
/// The packet layer uses it to walk the extension headers an opcode requires, and the property
/// tests use it to check every header's round trip with one generic function.
pub trait HeaderRepr: Sized {
    /// The header's length on the wire, in bytes.
    const LEN: usize;
    /// The layer named in errors about this header.
    const LAYER: Layer;

    /// Parses the header from the start of `bytes`.
    fn parse_bytes(bytes: &[u8]) -> Result<Self>;

    /// Writes the header to the start of `bytes`.
    fn emit_bytes(&self, bytes: &mut [u8]) -> Result<()>;
}
