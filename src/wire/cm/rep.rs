//! REP, the connection reply (IBTA 12.6.8, table 110).
//!
//! ```text
//!   0..4    local communication ID         4..8    remote communication ID
//!   8..12   local Q_Key                   12..15   local QPN
//!  16..19   local EE context number       20..23   starting PSN
//!  24       responder resources           25       initiator depth
//!  26       target ACK delay (5), failover accepted (2), end-to-end flow control (1)
//!  27       RNR retry count (3), SRQ (1)
//!  28..36   local CA GUID                 36..232  private data (196 bytes)
//! ```

use super::super::field::{
    bits_at, bytes_at, set_bits, set_u24, set_u32, set_u64, u24_at, u32_at, u64_at,
};
use super::super::{Layer, Psn, QKey, Qpn, Result};

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub const LOCAL_QKEY: usize = 8;
    pub const LOCAL_QPN: usize = 12;
    pub const LOCAL_EECN: usize = 16;
    pub const STARTING_PSN: usize = 20;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    /// Target ACK delay, failover accepted, end-to-end flow control.
    pub const ACK_DELAY: usize = 26;
    /// RNR retry count, SRQ.
    pub const RNR_SRQ: usize = 27;
    pub const LOCAL_CA_GUID: usize = 28;
    pub const PRIVATE_DATA: usize = 36;
}

/// Private data a REP carries.
pub const REP_PRIVATE_DATA: usize = 196;

header_view!(
    /// A view of a REP's 232 bytes.
    CmRep,
    CmRepRepr,
    Layer::CmRep,
    232
);

/// The fields of a REP. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRepRepr {
    /// Local Communication ID: the replier's ID for this connection.
    pub local_comm_id: u32,
    /// Remote Communication ID: the REQ's Local Communication ID, echoed.
    pub remote_comm_id: u32,
    /// Local Q_Key: UD and RD only; zero for RC.
    pub local_qkey: QKey,
    /// Local QPN: the replier's QP, 24 bits.
    pub local_qpn: Qpn,
    /// Local EE Context Number: RD only (24 bits).
    pub local_eecn: u32,
    /// Starting PSN, 24 bits: the PSN the replier's QP expects first, from which the active side
    /// sends (as Linux's CM uses it).
    pub starting_psn: Psn,
    /// Responder Resources: READs and atomics the replier answers at once.
    pub responder_resources: u8,
    /// Initiator Depth: READs and atomics the replier keeps outstanding.
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    /// End-to-End Flow Control: whether the replier's ACKs carry real credit counts.
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// SRQ: the replier's QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// Local CA GUID: the replier's channel adapter GUID.
    pub local_ca_guid: u64,
    /// Private Data: 196 bytes for the application.
    pub private_data: [u8; REP_PRIVATE_DATA],
}

impl CmRepRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(rep: &CmRep<T>) -> Result<Self> {
        let b = rep.bytes();
        Ok(CmRepRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            local_qkey: QKey(u32_at(b, field::LOCAL_QKEY)),
            local_qpn: Qpn::new(u24_at(b, field::LOCAL_QPN)),
            local_eecn: u24_at(b, field::LOCAL_EECN),
            starting_psn: Psn::new(u24_at(b, field::STARTING_PSN)),
            responder_resources: b[field::RESPONDER_RESOURCES],
            initiator_depth: b[field::INITIATOR_DEPTH],
            target_ack_delay: bits_at(b, field::ACK_DELAY, 0, 5),
            failover_accepted: bits_at(b, field::ACK_DELAY, 5, 2),
            end_to_end_flow_control: bits_at(b, field::ACK_DELAY, 7, 1) == 1,
            rnr_retry_count: bits_at(b, field::RNR_SRQ, 0, 3),
            srq: bits_at(b, field::RNR_SRQ, 3, 1) == 1,
            local_ca_guid: u64_at(b, field::LOCAL_CA_GUID),
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rep: &mut CmRep<T>) {
        let b = &mut rep.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        set_u32(b, field::LOCAL_QKEY, self.local_qkey.0);
        set_u24(b, field::LOCAL_QPN, self.local_qpn.value());
        set_u24(b, field::LOCAL_EECN, self.local_eecn);
        set_u24(b, field::STARTING_PSN, self.starting_psn.value());
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        set_bits(b, field::ACK_DELAY, 0, 5, self.target_ack_delay);
        set_bits(b, field::ACK_DELAY, 5, 2, self.failover_accepted);
        set_bits(
            b,
            field::ACK_DELAY,
            7,
            1,
            self.end_to_end_flow_control.into(),
        );
        set_bits(b, field::RNR_SRQ, 0, 3, self.rnr_retry_count);
        set_bits(b, field::RNR_SRQ, 3, 1, self.srq.into());
        set_u64(b, field::LOCAL_CA_GUID, self.local_ca_guid);
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
