//! Work requests and work completions, named after their verbs counterparts.

use std::net::IpAddr;

use super::AddressHandle;
use crate::memory::BindMw;
use crate::wire::{LKey, QKey, Qpn, RKey};

/// A scatter/gather element: `len` bytes at `addr` in the region `lkey` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: LKey,
}

impl Sge {
    /// `len` bytes at `offset` into `region`.
    pub fn new(region: &crate::memory::MemoryRegion, offset: usize, len: usize) -> Self {
        Sge {
            addr: region.iova() + offset as u64,
            len: len as u32,
            lkey: region.lkey(),
        }
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    /// Asks the responder to invalidate `rkey` once the message has landed.
    SendWithInv {
        rkey: RKey,
    },
    Write {
        remote_addr: u64,
        rkey: RKey,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: RKey,
        imm: u32,
    },
    Read {
        remote_addr: u64,
        rkey: RKey,
    },
    CompareSwap {
        remote_addr: u64,
        rkey: RKey,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: RKey,
        add: u64,
    },
    /// Binds a memory window (`IBV_WR_BIND_MW`; `ibv_bind_mw` for a type 1 window). A local
    /// operation: no packet, no payload; RC and UC only.
    BindMw(BindMw),
    /// Invalidates a type 2 memory window (`IBV_WR_LOCAL_INV`). Local, RC and UC only.
    LocalInv {
        rkey: RKey,
    },
}

impl SendOp {
    /// READ and the atomics: their data comes back, and max_rd_atomic bounds them.
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    pub fn is_atomic(self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// A local operation: executed by this side when the send queue reaches it, with no packet
    /// (rxe_req.c `rxe_do_local_ops`).
    pub fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv { .. })
    }

    pub(crate) fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

/// Where the payload of a send comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Read from registered memory as each packet is built.
    Sges(Vec<Sge>),
    /// Copied when the request is posted (`IBV_SEND_INLINE`).
    Inline(Vec<u8>),
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sges(sges) => sges.iter().map(|s| u64::from(s.len)).sum(),
            Payload::Inline(bytes) => bytes.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a UD send goes: `ibv_send_wr.wr.ud`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The destination address, from [`Endpoint::create_ah`](super::Endpoint::create_ah).
    pub ah: AddressHandle,
    pub remote_qpn: Qpn,
    /// The Q_Key to send. With its high bit set, the sending QP's own Q_Key is sent instead
    /// (IBTA 10.2.4.1).
    pub remote_qkey: QKey,
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    /// The data sent, or, for READ and atomics, where the result goes.
    pub payload: Payload,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
    /// Wait for earlier READs and atomics to complete before starting.
    pub fence: bool,
    /// Ask the responder for a solicited event.
    pub solicited: bool,
    /// The destination of a send on a UD QP; `None` on connected QPs.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signalled request with `payload` and no flags.
    pub fn new(wr_id: u64, op: SendOp, payload: Payload) -> Self {
        SendWr {
            wr_id,
            op,
            payload,
            signaled: true,
            fence: false,
            solicited: false,
            ud: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
}

/// `ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    /// A memory window bind broke a rule (`IBV_WC_MW_BIND_ERR`).
    MwBindErr,
}

/// `ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
    BindMw,
    LocalInv,
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub qp_num: Qpn,
    /// Bytes received (receives) or transferred (READ).
    pub byte_len: u32,
    pub imm_data: Option<u32>,
    pub invalidated_rkey: Option<RKey>,
    /// The sender's QPN (from the DETH on UD) and address, on receive completions.
    pub src_qp: Option<Qpn>,
    pub src_addr: Option<IpAddr>,
}

impl WorkCompletion {
    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            qp_num,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            src_qp: None,
            src_addr: None,
        }
    }
}
