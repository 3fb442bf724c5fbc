//! Protection domains, memory regions and memory windows, with the one check every memory
//! access goes through.
//!
//! - `region`: a region's storage and the two handles onto it, [`MemoryRegion`] for the
//!   application and [`Span`] and [`HeldSpan`] for the transport, and why concurrent remote
//!   writes are sound;
//! - `table`: [`MemoryTable`], every region and window of a device by its keys, and the
//!   checks of remote and local access;
//! - `shared`: [`DeviceMemory`], the table as one engine's endpoint sees it: its own, or
//!   shared with the device's other engines;
//! - `window`: memory windows (IBTA 10.6.7), type 1 and type 2, bound over a region and
//!   invalidated locally or by a peer's SEND with Invalidate;
//! - `foreign`: [`ForeignMemory`], a C program's memory at its own address, registered in
//!   place (`ibv_reg_mr` through softroce's libibverbs).
//!
//! # Keys
//!
//! A key is 32 bits: all of them random, drawn from a ChaCha20 stream seeded by the caller, and
//! kept if its top bits name a free slot of the table, where it is then found by index
//! (`crate::keyed`). One valid rkey says nothing about any other (rxe keeps 24 bits of index
//! and 8 random ones). A window's rkey keeps its upper 24 bits for life; each bind chooses the low 8, as
//! `ibv_inc_rkey` does, so that a peer holding an rkey of an earlier binding reaches nothing.

mod bulk;
mod foreign;
mod lent;
mod region;
mod shared;
mod table;
mod window;

use std::fmt;

pub(crate) use foreign::take_faults_here;
pub use foreign::ForeignMemory;
pub use region::{HeldSpan, MemoryRegion, RemoteRegion, Sge, Span};
pub use shared::{DeviceMemory, MemoryRead, MemoryWrite};
pub use table::MemoryTable;
pub use window::{inc_rkey, BindMw, MwType};

/// Access rights of a memory region or window (the `ibv_access_flags` that matter on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No rights: local read only, which every region has.
    pub const NONE: Access = Access(0);
    /// The local side may write: receive buffers, READ responses, atomic results.
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA WRITE into it (`IBV_ACCESS_REMOTE_WRITE`).
    pub const REMOTE_WRITE: Access = Access(2);
    /// A peer may RDMA READ from it (`IBV_ACCESS_REMOTE_READ`).
    pub const REMOTE_READ: Access = Access(4);
    /// A peer may run atomics on it (`IBV_ACCESS_REMOTE_ATOMIC`).
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Memory windows may be bound over the region (`IBV_ACCESS_MW_BIND`, IBTA C10-73).
    pub const MW_BIND: Access = Access(16);

    /// The rights of both; the same as `self | other`.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Whether every one of `other`'s rights is here.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any of `other`'s rights is here.
    pub const fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, other: Access) -> Access {
        self.union(other)
    }
}

/// A protection domain: regions and queue pairs of one PD may be used together only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// Why a memory access or a memory verb was refused. Each failure has its own variant, so the
/// transport can choose the right NAK or completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryError {
    /// No registered region or bound window has this key (never had one, it was
    /// deregistered, or the window was invalidated).
    UnknownKey {
        /// The key presented.
        key: u32,
    },
    /// The key belongs to a region or window of another protection domain.
    WrongPd {
        /// The key presented.
        key: u32,
    },
    /// The key is a type 2 window bound to another queue pair (IBTA 10.6.7.2.2).
    WrongQp {
        /// The window's rkey.
        key: u32,
    },
    /// The range leaves the region or window, or its end overflows 64 bits.
    OutOfBounds {
        /// The first address of the range.
        addr: u64,
        /// The range's length, in bytes.
        len: u64,
    },
    /// The region or window does not grant the access asked for.
    AccessDenied {
        /// The rights the access needs.
        needed: Access,
    },
    /// An address that must be 8-byte aligned is not: an atomic's, a region's iova, or the
    /// allocation of a buffer handed to `register_buffer`.
    Misaligned {
        /// The address that is not a multiple of 8.
        addr: u64,
    },
    /// The host could not allocate a region this large: an error, not an abort.
    NoMemory {
        /// The region's length, in bytes.
        len: u64,
    },
    /// A region with windows bound over it cannot be deregistered (rxe: `num_mw`).
    WindowsBound {
        /// The region's lkey.
        lkey: u32,
    },
    /// The key cannot be invalidated: a plain region, or a type 1 window (rxe_mw.c,
    /// `rxe_invalidate_mr`: only windows and fast-register regions can).
    NotInvalidatable {
        /// The key presented.
        key: u32,
    },
    /// A window bind broke one of IBTA's rules; the text names it.
    Bind(&'static str),
    /// No key was free: the device holds about 3.3 million regions, or as many regions and
    /// windows together, already (its key tables find keys by index in at most 2^22 slots).
    OutOfKeys,
    /// The program took away the memory of a region over its own memory
    /// ([`ForeignMemory`]) after registering it: unmapped it, or removed the right the access
    /// needs. The access failed there, rather than kill the process.
    Unmapped {
        /// The program's address of the first byte of the access.
        addr: u64,
    },
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryError::UnknownKey { key } => write!(f, "key {key:#010x}: no such region"),
            MemoryError::WrongPd { key } => {
                write!(
                    f,
                    "key {key:#010x}: the region belongs to another protection domain"
                )
            }
            MemoryError::WrongQp { key } => {
                write!(f, "key {key:#010x}: the window is bound to another QP")
            }
            MemoryError::OutOfBounds { addr, len } => {
                write!(f, "{len} bytes at {addr:#x} leave the region")
            }
            MemoryError::AccessDenied { needed } => {
                write!(f, "the region does not grant access {:#x}", needed.0)
            }
            MemoryError::Misaligned { addr } => {
                write!(f, "{addr:#x} is not 8-byte aligned (an atomic's address, a region's iova, or a buffer to register)")
            }
            MemoryError::OutOfKeys => {
                f.write_str("no memory key is free: too many regions and windows")
            }
            MemoryError::NoMemory { len } => {
                write!(f, "cannot allocate {len} bytes for a region")
            }
            MemoryError::WindowsBound { lkey } => {
                write!(f, "region {lkey:#010x} has memory windows bound over it")
            }
            MemoryError::NotInvalidatable { key } => write!(
                f,
                "key {key:#010x}: only a type 2 memory window can be invalidated"
            ),
            MemoryError::Bind(why) => write!(f, "memory window bind: {why}"),
            MemoryError::Unmapped { addr } => write!(
                f,
                "the program took away its registered memory at {addr:#x} (unmapped, or \
                 protected) before deregistering it"
            ),
        }
    }
}

impl std::error::Error for MemoryError {}
