//! REJ, a rejection (IBTA 12.6.7, table 108), with the reasons of table 112 that matter here.
//!
//! ```text
//!   0..4    local communication ID         4..8    remote communication ID
//!   8       message rejected (2)           9       rejected info length (7)
//!  10..12   reason                        12..84   additional rejection information
//!  84..232  private data (148 bytes)
//! ```

use super::super::field::{bits_at, bytes_at, set_bits, set_u16, set_u32, u16_at, u32_at};
use super::super::{Layer, Result};

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub const MESSAGE_REJECTED: usize = 8;
    pub const INFO_LENGTH: usize = 9;
    pub const REASON: usize = 10;
    pub const ARI: usize = 12;
    pub const PRIVATE_DATA: usize = 84;
}

/// Private data a REJ carries.
pub const REJ_PRIVATE_DATA: usize = 148;
/// Additional rejection information a REJ carries.
pub const REJ_ARI: usize = 72;

/// Which message a REJ rejects (2 bits).
/// 0: the REJ rejects a REQ.
pub const REJECTED_REQ: u8 = 0;
/// 1: the REJ rejects a REP.
pub const REJECTED_REP: u8 = 1;
/// 2: the REJ answers no REQ or REP, or a message other than them.
pub const REJECTED_OTHER: u8 = 2;

/// A rejection reason (IBTA table 112; `enum ib_cm_rej_reason` in the kernel), kept whatever
/// its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    /// 1: the QPN could not be set up.
    pub const NO_QP: RejReason = RejReason(1);
    /// 3: the passive side is out of resources.
    pub const NO_RESOURCES: RejReason = RejReason(3);
    /// 4: the requester gave up waiting (a destroyed connection in REQ_SENT).
    pub const TIMEOUT: RejReason = RejReason(4);
    /// 8: no listener for the service ID (cm.c `cm_req_handler` answers so).
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// 9: the transport service type is not supported.
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    /// 10: a message for a connection that is gone, or a REQ duplicating one in timewait.
    pub const STALE_CONN: RejReason = RejReason(10);
    /// 12: the REQ's primary path GIDs are not this side's.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// 26: the requested path MTU is not supported.
    pub const INVALID_MTU: RejReason = RejReason(26);
    /// 28: the application said no (`rdma_reject`), or the RDMA-CM found no matching listener
    /// address; may carry private data.
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    /// 35: the application does not take the options the other side's REQ or REP offered
    /// (enhanced connection establishment: `rdma_reject_ece`).
    pub const VENDOR_OPTION_NOT_SUPPORTED: RejReason = RejReason(35);

    /// The name IBTA table 112 (and the kernel's `ib_cm_rej_reason`) gives the reason.
    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid communication ID",
            7 => "invalid communication instance",
            8 => "invalid service ID",
            9 => "invalid transport service type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            18..=23 => "invalid alternate path",
            24 => "port CM redirect",
            25 => "port redirect",
            26 => "invalid path MTU",
            27 => "insufficient responder resources",
            28 => "consumer defined",
            29 => "invalid RNR retry count",
            30 => "duplicate local communication ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            33 => "invalid alternate flow label",
            35 => "vendor option not supported",
            _ => "reserved",
        }
    }
}

header_view!(
    /// A view of a REJ's 232 bytes.
    CmRej,
    CmRejRepr,
    Layer::CmRej,
    232
);

/// The fields of a REJ. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRejRepr {
    /// Local Communication ID: the rejecter's ID for the connection.
    pub local_comm_id: u32,
    /// Zero when rejecting a REQ whose sender's ID is all one knows.
    pub remote_comm_id: u32,
    /// [`REJECTED_REQ`], [`REJECTED_REP`] or [`REJECTED_OTHER`].
    pub message_rejected: u8,
    /// 7 bits: how much of the additional rejection information is set.
    pub info_length: u8,
    /// Reason, as IBTA table 112 numbers it.
    pub reason: RejReason,
    /// Additional Rejection Information: 72 bytes whose meaning the reason sets.
    pub ari: [u8; REJ_ARI],
    /// Private Data: 148 bytes for the application.
    pub private_data: [u8; REJ_PRIVATE_DATA],
}

impl CmRejRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(rej: &CmRej<T>) -> Result<Self> {
        let b = rej.bytes();
        Ok(CmRejRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            message_rejected: bits_at(b, field::MESSAGE_REJECTED, 0, 2),
            info_length: bits_at(b, field::INFO_LENGTH, 0, 7),
            reason: RejReason(u16_at(b, field::REASON)),
            ari: bytes_at(b, field::ARI),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rej: &mut CmRej<T>) {
        let b = &mut rej.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        set_bits(b, field::MESSAGE_REJECTED, 0, 2, self.message_rejected);
        set_bits(b, field::INFO_LENGTH, 0, 7, self.info_length);
        set_u16(b, field::REASON, self.reason.0);
        b[field::ARI..field::PRIVATE_DATA].copy_from_slice(&self.ari);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
