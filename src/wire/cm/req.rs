//! REQ, the connection request (IBTA 12.6.5, table 106): 232 bytes after the MAD header, the
//! offsets of `include/rdma/ibta_vol1_c12.h`.
//!
//! ```text
//!   0..4    local communication ID          4..8    reserved
//!   8..16   service ID                     16..24   local CA GUID
//!  24..28   reserved                       28..32   local Q_Key
//!  32..35   local QPN                      35       responder resources
//!  36..39   local EECN                     39       initiator depth
//!  40..43   remote EECN                    43       remote CM response timeout (5),
//!                                                   transport service type (2), end-to-end
//!                                                   flow control (1)
//!  44..47   starting PSN                   47       local CM response timeout (5), retry
//!                                                   count (3)
//!  48..50   partition key                  50       path MTU (4), RDC exists (1), RNR retry
//!                                                   count (3)
//!  51       max CM retries (4), SRQ (1), extended transport type (3)
//!  52..96   primary path                   96..140  alternate path (byte 139: SAP supported)
//! 140..232  private data (92 bytes)
//! ```

use std::net::Ipv6Addr;

use super::super::field::{
    bits_at, bytes_at, set_bits, set_u16, set_u24, set_u32, set_u64, u16_at, u24_at, u32_at, u64_at,
};
use super::super::{Layer, PKey, Psn, QKey, Qpn, Result};
use super::ServiceId;

mod field {
    pub const LOCAL_COMM_ID: usize = 0;
    pub const SERVICE_ID: usize = 8;
    pub const LOCAL_CA_GUID: usize = 16;
    pub const LOCAL_QKEY: usize = 28;
    pub const LOCAL_QPN: usize = 32;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: usize = 36;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: usize = 40;
    /// Remote CM response timeout, transport service type, end-to-end flow control.
    pub const TIMEOUT_TRANSPORT: usize = 43;
    pub const STARTING_PSN: usize = 44;
    /// Local CM response timeout, retry count.
    pub const TIMEOUT_RETRY: usize = 47;
    pub const PKEY: usize = 48;
    /// Path MTU, RDC exists, RNR retry count.
    pub const MTU_RNR: usize = 50;
    /// Max CM retries, SRQ, extended transport type.
    pub const CM_RETRIES: usize = 51;
    pub const PRIMARY_PATH: usize = 52;
    pub const ALTERNATE_PATH: usize = 96;
    /// In the alternate path's last byte.
    pub const SAP_SUPPORTED: usize = 139;
    pub const PRIVATE_DATA: usize = 140;
}

/// Private data a REQ carries.
pub const REQ_PRIVATE_DATA: usize = 92;

header_view!(
    /// A view of a REQ's 232 bytes.
    CmReq,
    CmReqRepr,
    Layer::CmReq,
    232
);

/// A path (IBTA table 106, the primary and alternate path fields): 44 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmPath {
    /// 0xFFFF, the permissive LID, on RoCE with a hop limit above 1 (cm.c `cm_format_req`).
    pub local_lid: u16,
    /// Remote Port LID: the receiver's LID, also 0xFFFF on routed RoCE.
    pub remote_lid: u16,
    /// The sender's GID and the receiver's: on RoCEv2 their IP addresses (IPv4-mapped).
    pub local_gid: Ipv6Addr,
    /// Remote Port GID: the receiver's GID.
    pub remote_gid: Ipv6Addr,
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits.
    pub packet_rate: u8,
    /// Traffic Class: on RoCEv2 the IP DSCP and ECN byte.
    pub traffic_class: u8,
    /// Hop Limit: on RoCEv2 the IP TTL or hop limit.
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    /// Subnet Local: set when both ends are on one subnet; the kernel clears it on routed RoCE.
    pub subnet_local: bool,
    /// The local ACK timeout the requester will use (5 bits: 4.096 µs × 2^value).
    pub local_ack_timeout: u8,
}

impl Default for CmPath {
    /// All zero: the alternate path of a REQ that has none.
    fn default() -> Self {
        CmPath {
            local_lid: 0,
            remote_lid: 0,
            local_gid: Ipv6Addr::UNSPECIFIED,
            remote_gid: Ipv6Addr::UNSPECIFIED,
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 0,
        }
    }
}

impl CmPath {
    const LOCAL_LID: usize = 0;
    const REMOTE_LID: usize = 2;
    const LOCAL_GID: usize = 4;
    const REMOTE_GID: usize = 20;
    const FLOW_LABEL: usize = 36;
    const PACKET_RATE: usize = 39;
    const TRAFFIC_CLASS: usize = 40;
    const HOP_LIMIT: usize = 41;
    const SL: usize = 42;
    const ACK_TIMEOUT: usize = 43;

    fn parse_at(b: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: u16_at(b, at + Self::LOCAL_LID),
            remote_lid: u16_at(b, at + Self::REMOTE_LID),
            local_gid: Ipv6Addr::from(bytes_at::<16>(b, at + Self::LOCAL_GID)),
            remote_gid: Ipv6Addr::from(bytes_at::<16>(b, at + Self::REMOTE_GID)),
            flow_label: u32_at(b, at + Self::FLOW_LABEL) >> 12,
            packet_rate: bits_at(b, at + Self::PACKET_RATE, 2, 6),
            traffic_class: b[at + Self::TRAFFIC_CLASS],
            hop_limit: b[at + Self::HOP_LIMIT],
            sl: bits_at(b, at + Self::SL, 0, 4),
            subnet_local: bits_at(b, at + Self::SL, 4, 1) == 1,
            local_ack_timeout: bits_at(b, at + Self::ACK_TIMEOUT, 0, 5),
        }
    }

    /// Writes the path's 44 bytes into a zeroed message, reserved bits untouched (the alternate
    /// path's last byte also holds SAP supported).
    fn emit_at(&self, b: &mut [u8], at: usize) {
        set_u16(b, at + Self::LOCAL_LID, self.local_lid);
        set_u16(b, at + Self::REMOTE_LID, self.remote_lid);
        b[at + Self::LOCAL_GID..at + Self::LOCAL_GID + 16]
            .copy_from_slice(&self.local_gid.octets());
        b[at + Self::REMOTE_GID..at + Self::REMOTE_GID + 16]
            .copy_from_slice(&self.remote_gid.octets());
        set_u32(b, at + Self::FLOW_LABEL, (self.flow_label & 0xf_ffff) << 12);
        set_bits(b, at + Self::PACKET_RATE, 2, 6, self.packet_rate);
        b[at + Self::TRAFFIC_CLASS] = self.traffic_class;
        b[at + Self::HOP_LIMIT] = self.hop_limit;
        set_bits(b, at + Self::SL, 0, 4, self.sl);
        set_bits(b, at + Self::SL, 4, 1, self.subnet_local.into());
        set_bits(b, at + Self::ACK_TIMEOUT, 0, 5, self.local_ack_timeout);
    }
}

/// The fields of a REQ. Reserved fields are sent as zero and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmReqRepr {
    /// Local Communication ID: the sender's ID for this connection, echoed back in replies.
    pub local_comm_id: u32,
    /// Service ID: the service the sender asks to connect to.
    pub service_id: ServiceId,
    /// Local CA GUID: the sender's channel adapter GUID.
    pub local_ca_guid: u64,
    /// UD and RD only; zero for RC.
    pub local_qkey: QKey,
    /// Local QPN: the sender's QP, 24 bits.
    pub local_qpn: Qpn,
    /// READs and atomics the sender answers at once (its `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// Local EECN: the sender's end-to-end context, RD only (24 bits).
    pub local_eecn: u32,
    /// READs and atomics the sender keeps outstanding (its `max_rd_atomic`).
    pub initiator_depth: u8,
    /// Remote EECN: the receiver's end-to-end context, RD only (24 bits).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer (5 bits: 4.096 µs × 2^value).
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 2 RD (2 bits).
    pub transport_service_type: u8,
    /// End-to-End Flow Control: whether the sender's ACKs carry real credit counts.
    pub end_to_end_flow_control: bool,
    /// Starting PSN, 24 bits: the PSN the sender's QP expects first, from which the receiver sends
    /// (as Linux's CM uses it).
    pub starting_psn: Psn,
    /// Local CM Response Timeout: how long the sender takes to answer
    /// (5 bits: 4.096 µs × 2^value).
    pub local_cm_response_timeout: u8,
    /// The transport retry count the receiver is to use (3 bits).
    pub retry_count: u8,
    /// Partition Key of the connection.
    pub pkey: PKey,
    /// `enum ibv_mtu`, 1 (256) to 5 (4096) (4 bits).
    pub path_mtu: u8,
    /// RDC Exists: RD only.
    pub rdc_exists: bool,
    /// RNR Retry Count the receiver is to use (3 bits; 7 means no limit).
    pub rnr_retry_count: u8,
    /// How many times the sender retransmits (4 bits).
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// Extended Transport Type (3 bits): 0, or 1 for XRC.
    pub extended_transport_type: u8,
    /// The primary path (bytes 52 to 95).
    pub primary_path: CmPath,
    /// All zero when there is none, as on RoCE.
    pub alternate_path: CmPath,
    /// SAP Supported: one bit in the alternate path's last byte.
    pub sap_supported: bool,
    /// Private Data: 92 bytes for the application; RDMA-CM puts its IP header first.
    pub private_data: [u8; REQ_PRIVATE_DATA],
}

impl CmReqRepr {
    /// Reads the fields out of a checked view.
    pub fn parse<T: AsRef<[u8]>>(req: &CmReq<T>) -> Result<Self> {
        let b = req.bytes();
        Ok(CmReqRepr {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            service_id: ServiceId(u64_at(b, field::SERVICE_ID)),
            local_ca_guid: u64_at(b, field::LOCAL_CA_GUID),
            local_qkey: QKey(u32_at(b, field::LOCAL_QKEY)),
            local_qpn: Qpn::new(u24_at(b, field::LOCAL_QPN)),
            responder_resources: b[field::RESPONDER_RESOURCES],
            local_eecn: u24_at(b, field::LOCAL_EECN),
            initiator_depth: b[field::INITIATOR_DEPTH],
            remote_eecn: u24_at(b, field::REMOTE_EECN),
            remote_cm_response_timeout: bits_at(b, field::TIMEOUT_TRANSPORT, 0, 5),
            transport_service_type: bits_at(b, field::TIMEOUT_TRANSPORT, 5, 2),
            end_to_end_flow_control: bits_at(b, field::TIMEOUT_TRANSPORT, 7, 1) == 1,
            starting_psn: Psn::new(u24_at(b, field::STARTING_PSN)),
            local_cm_response_timeout: bits_at(b, field::TIMEOUT_RETRY, 0, 5),
            retry_count: bits_at(b, field::TIMEOUT_RETRY, 5, 3),
            pkey: PKey(u16_at(b, field::PKEY)),
            path_mtu: bits_at(b, field::MTU_RNR, 0, 4),
            rdc_exists: bits_at(b, field::MTU_RNR, 4, 1) == 1,
            rnr_retry_count: bits_at(b, field::MTU_RNR, 5, 3),
            max_cm_retries: bits_at(b, field::CM_RETRIES, 0, 4),
            srq: bits_at(b, field::CM_RETRIES, 4, 1) == 1,
            extended_transport_type: bits_at(b, field::CM_RETRIES, 5, 3),
            primary_path: CmPath::parse_at(b, field::PRIMARY_PATH),
            alternate_path: CmPath::parse_at(b, field::ALTERNATE_PATH),
            sap_supported: bits_at(b, field::SAP_SUPPORTED, 5, 1) == 1,
            private_data: bytes_at(b, field::PRIVATE_DATA),
        })
    }

    /// Writes all 232 bytes into a checked view, reserved fields zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, req: &mut CmReq<T>) {
        let b = &mut req.bytes_mut()[..232];
        b.fill(0);
        set_u32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        set_u64(b, field::SERVICE_ID, self.service_id.0);
        set_u64(b, field::LOCAL_CA_GUID, self.local_ca_guid);
        set_u32(b, field::LOCAL_QKEY, self.local_qkey.0);
        set_u24(b, field::LOCAL_QPN, self.local_qpn.value());
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        set_u24(b, field::LOCAL_EECN, self.local_eecn);
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        set_u24(b, field::REMOTE_EECN, self.remote_eecn);
        set_bits(
            b,
            field::TIMEOUT_TRANSPORT,
            0,
            5,
            self.remote_cm_response_timeout,
        );
        set_bits(
            b,
            field::TIMEOUT_TRANSPORT,
            5,
            2,
            self.transport_service_type,
        );
        set_bits(
            b,
            field::TIMEOUT_TRANSPORT,
            7,
            1,
            self.end_to_end_flow_control.into(),
        );
        set_u24(b, field::STARTING_PSN, self.starting_psn.value());
        set_bits(
            b,
            field::TIMEOUT_RETRY,
            0,
            5,
            self.local_cm_response_timeout,
        );
        set_bits(b, field::TIMEOUT_RETRY, 5, 3, self.retry_count);
        set_u16(b, field::PKEY, self.pkey.0);
        set_bits(b, field::MTU_RNR, 0, 4, self.path_mtu);
        set_bits(b, field::MTU_RNR, 4, 1, self.rdc_exists.into());
        set_bits(b, field::MTU_RNR, 5, 3, self.rnr_retry_count);
        set_bits(b, field::CM_RETRIES, 0, 4, self.max_cm_retries);
        set_bits(b, field::CM_RETRIES, 4, 1, self.srq.into());
        set_bits(b, field::CM_RETRIES, 5, 3, self.extended_transport_type);
        self.primary_path.emit_at(b, field::PRIMARY_PATH);
        self.alternate_path.emit_at(b, field::ALTERNATE_PATH);
        set_bits(b, field::SAP_SUPPORTED, 5, 1, self.sap_supported.into());
        b[field::PRIVATE_DATA..].copy_from_slice(&self.private_data);
    }
}
