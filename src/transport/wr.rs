//! Work requests and work completions, named after their verbs counterparts.

use std::fmt;
use std::net::IpAddr;
use std::ops::Deref;

use smallvec::SmallVec;

use super::{AddressHandle, QpType, VerbsError};
pub use crate::memory::Sge;
use crate::memory::{BindMw, RemoteRegion};
use crate::wire::{QKey, Qpn, RKey};

/// How many SGEs a work request holds without a heap allocation.
pub const INLINE_SGES: usize = 4;

/// A work request's scatter/gather list: up to [`INLINE_SGES`] entries live in the request
/// itself, so that posting one allocates nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SgeList(SmallVec<[Sge; INLINE_SGES]>);

impl SgeList {
    /// An empty list: a zero-length message.
    #[inline]
    pub fn new() -> Self {
        SgeList(SmallVec::new())
    }

    /// Appends `sge`.
    #[inline]
    pub fn push(&mut self, sge: Sge) {
        self.0.push(sge);
    }

    /// The bytes the list covers, summed.
    pub fn total_len(&self) -> u64 {
        self.0.iter().map(|s| u64::from(s.len)).sum()
    }
}

impl fmt::Debug for SgeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl Deref for SgeList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        &self.0
    }
}

impl From<Sge> for SgeList {
    fn from(sge: Sge) -> Self {
        let mut list = SgeList::new();
        list.push(sge);
        list
    }
}

impl<const N: usize> From<[Sge; N]> for SgeList {
    fn from(sges: [Sge; N]) -> Self {
        // A copy of the slice: collecting goes through `extend`'s growth checks, a cost
        // measured on every post of the 64 B WRITE bench.
        Self::from(&sges[..])
    }
}

impl From<&[Sge]> for SgeList {
    fn from(sges: &[Sge]) -> Self {
        SgeList(SmallVec::from_slice(sges))
    }
}

impl FromIterator<Sge> for SgeList {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Self {
        SgeList(iter.into_iter().collect())
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: the payload lands in the peer's next receive.
    Send,
    /// SEND with immediate data, which the peer's receive completion carries.
    SendWithImm {
        /// The immediate data (host order here; big-endian on the wire).
        imm: u32,
    },
    /// Asks the responder to invalidate `rkey` once the message has landed.
    SendWithInv {
        /// The key the responder invalidates.
        rkey: RKey,
    },
    /// RDMA WRITE of the payload to `remote_addr` in the peer's region `rkey`.
    Write {
        /// Where the first byte lands, in the peer's address space.
        remote_addr: u64,
        /// The peer's key for that memory.
        rkey: RKey,
    },
    /// RDMA WRITE with immediate: as `Write`, and it consumes a receive at the peer, whose
    /// completion carries `imm` (IBTA 9.4.3).
    WriteWithImm {
        /// Where the first byte lands, in the peer's address space.
        remote_addr: u64,
        /// The peer's key for that memory.
        rkey: RKey,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` into the request's SGEs.
    Read {
        /// Where the first byte is read from, in the peer's address space.
        remote_addr: u64,
        /// The peer's key for that memory.
        rkey: RKey,
    },
    /// Atomic compare and swap of the 8-byte word at `remote_addr` (8-byte aligned): if it
    /// equals `compare` it becomes `swap`. The word's earlier value lands in the request's
    /// SGE. Words are in the responder's native byte order (little-endian on x86 and Arm),
    /// as on rxe and ConnectX.
    CompareSwap {
        /// The word's address, in the peer's address space.
        remote_addr: u64,
        /// The peer's key for that memory.
        rkey: RKey,
        /// The value the word must hold for the swap.
        compare: u64,
        /// The value it takes then.
        swap: u64,
    },
    /// Atomic fetch and add on the 8-byte word at `remote_addr` (8-byte aligned, native byte
    /// order at the responder); the word's earlier value lands in the request's SGE.
    FetchAdd {
        /// The word's address, in the peer's address space.
        remote_addr: u64,
        /// The peer's key for that memory.
        rkey: RKey,
        /// What is added, wrapping.
        add: u64,
    },
    /// Binds a memory window (`IBV_WR_BIND_MW`; `ibv_bind_mw` for a type 1 window). A local
    /// operation: no packet, no payload; RC and UC only.
    BindMw(BindMw),
    /// Invalidates a type 2 memory window (`IBV_WR_LOCAL_INV`). Local, RC and UC only.
    LocalInv {
        /// The window's rkey.
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

    /// Compare and swap, and fetch and add.
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

/// How many bytes an inline send holds without a heap allocation: as many as an [`SgeList`]
/// holds of SGEs, so that a request is no larger for them.
pub const INLINE_BYTES: usize = INLINE_SGES * std::mem::size_of::<Sge>();

/// The bytes of an inline send (`IBV_SEND_INLINE`), copied when it is posted: up to
/// [`INLINE_BYTES`] live in the request itself, so that posting one allocates nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct InlineData(SmallVec<[u8; INLINE_BYTES]>);

impl InlineData {
    /// No bytes.
    pub fn new() -> Self {
        InlineData(SmallVec::new())
    }

    /// No bytes, with room for `len` (on the heap only past [`INLINE_BYTES`]).
    pub fn with_capacity(len: usize) -> Self {
        InlineData(SmallVec::with_capacity(len))
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InlineData({} bytes)", self.0.len())
    }
}

impl Deref for InlineData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for InlineData {
    fn from(bytes: &[u8]) -> Self {
        InlineData(SmallVec::from_slice(bytes))
    }
}

impl<const N: usize> From<&[u8; N]> for InlineData {
    fn from(bytes: &[u8; N]) -> Self {
        Self::from(&bytes[..])
    }
}

impl From<Vec<u8>> for InlineData {
    /// Keeps the vector's buffer if its capacity is larger than [`INLINE_BYTES`], and
    /// otherwise copies the bytes in place.
    fn from(bytes: Vec<u8>) -> Self {
        InlineData(SmallVec::from_vec(bytes))
    }
}

/// Where the payload of a send comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Read from registered memory: each packet's part is checked when the packet is queued,
    /// and read when the packet is built, before the request completes (on RC at its ACK, on
    /// UC and UD as its last packet is built).
    Sges(SgeList),
    /// Copied when the request is posted (`IBV_SEND_INLINE`).
    Inline(InlineData),
}

impl Payload {
    /// The message's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sges(sges) => sges.total_len(),
            Payload::Inline(bytes) => bytes.len() as u64,
        }
    }

    /// Whether the message has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a UD send goes: `ibv_send_wr.wr.ud`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The destination address: from `ProtectionDomain::create_ah` in the verbs API
    /// (`softroce::verbs`), or [`Endpoint::create_ah`](super::Endpoint::create_ah) on the
    /// sans-IO core. [`DatagramPeer::dest`](crate::verbs::DatagramPeer::dest) makes the whole
    /// destination from a service resolution's answer.
    pub ah: AddressHandle,
    /// The destination QP.
    pub remote_qpn: Qpn,
    /// The Q_Key to send. With its high bit set, the sending QP's own Q_Key is sent instead
    /// (IBTA 10.2.4.1).
    pub remote_qkey: QKey,
}

/// A send work request. The builders ([`send`](Self::send), [`write`](Self::write),
/// [`read`](Self::read), ...) make the common ones, signalled and without flags; the flag
/// methods ([`unsignaled`](Self::unsignaled), [`fenced`](Self::fenced),
/// [`solicited`](Self::solicited), [`to`](Self::to)) adjust them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The application's tag, returned in the completion.
    pub wr_id: u64,
    /// What to do.
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

    /// SEND of the bytes `sges` name.
    pub fn send(wr_id: u64, sges: impl Into<SgeList>) -> Self {
        Self::new(wr_id, SendOp::Send, Payload::Sges(sges.into()))
    }

    /// SEND with immediate data `imm`.
    pub fn send_imm(wr_id: u64, sges: impl Into<SgeList>, imm: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::SendWithImm { imm },
            Payload::Sges(sges.into()),
        )
    }

    /// SEND of `bytes`, copied into the request now (`IBV_SEND_INLINE`): the application may
    /// reuse its buffer at once, and no region is needed.
    pub fn send_inline(wr_id: u64, bytes: &[u8]) -> Self {
        Self::new(wr_id, SendOp::Send, Payload::Inline(bytes.into()))
    }

    /// RDMA WRITE of the bytes `sges` name to the start of `remote` (use
    /// [`RemoteRegion::at`] for an offset). The peer's responder checks that they fit.
    pub fn write(wr_id: u64, sges: impl Into<SgeList>, remote: RemoteRegion) -> Self {
        let op = SendOp::Write {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        Self::new(wr_id, op, Payload::Sges(sges.into()))
    }

    /// RDMA WRITE with immediate: as [`write`](Self::write), and the peer's next receive
    /// completes with `imm` (it consumes a receive request, with no bytes scattered to it).
    pub fn write_imm(wr_id: u64, sges: impl Into<SgeList>, remote: RemoteRegion, imm: u32) -> Self {
        let op = SendOp::WriteWithImm {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            imm,
        };
        Self::new(wr_id, op, Payload::Sges(sges.into()))
    }

    /// RDMA READ from the start of `remote` into the bytes `sges` name; as many bytes as they
    /// cover.
    pub fn read(wr_id: u64, sges: impl Into<SgeList>, remote: RemoteRegion) -> Self {
        let op = SendOp::Read {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        Self::new(wr_id, op, Payload::Sges(sges.into()))
    }

    /// Atomic fetch and add of `add` to the word at the start of `remote`; the word's earlier
    /// value lands in `result` (8 bytes). See [`SendOp::FetchAdd`] for alignment and byte order.
    pub fn fetch_add(wr_id: u64, result: Sge, remote: RemoteRegion, add: u64) -> Self {
        let op = SendOp::FetchAdd {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            add,
        };
        Self::new(wr_id, op, Payload::Sges(result.into()))
    }

    /// Atomic compare and swap on the word at the start of `remote`: `swap` replaces it if it
    /// holds `compare`; its earlier value lands in `result` (8 bytes).
    pub fn compare_swap(
        wr_id: u64,
        result: Sge,
        remote: RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Self {
        let op = SendOp::CompareSwap {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            compare,
            swap,
        };
        Self::new(wr_id, op, Payload::Sges(result.into()))
    }

    /// Completes without a work completion when it succeeds (`IBV_SEND_SIGNALED` unset).
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// Starts only once earlier READs and atomics have completed (`IBV_SEND_FENCE`).
    pub fn fenced(mut self) -> Self {
        self.fence = true;
        self
    }

    /// Asks the peer for a solicited event (`IBV_SEND_SOLICITED`).
    pub fn solicited(mut self) -> Self {
        self.solicited = true;
        self
    }

    /// Sends to `dest`: required on a UD QP, refused on the others.
    pub fn to(mut self, dest: UdDest) -> Self {
        self.ud = Some(dest);
        self
    }
}

impl SendWr {
    /// What can be known of a request from itself and its QP's type, checked where it is
    /// posted (at the call, by the verbs) and again where the core queues it.
    pub(crate) fn check(&self, qp_type: QpType) -> Result<(), VerbsError> {
        let carried = match qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                self.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::Write { .. }
                    | SendOp::WriteWithImm { .. }
                    | SendOp::BindMw(_)
                    | SendOp::LocalInv { .. }
            ),
            QpType::Ud => matches!(self.op, SendOp::Send | SendOp::SendWithImm { .. }),
        };
        if !carried {
            // IBTA 9.2, table 38: UC has no READ, atomics or invalidate; UD only SEND. Windows
            // are bound and invalidated on RC and UC QPs (rxe_opcode.c, `IB_WR_BIND_MW`).
            return Err(VerbsError::InvalidRequest(
                "UC carries SEND, RDMA WRITE (with immediate) and window binds only, UD SEND only",
            ));
        }
        let len = self.payload.len();
        if self.op.is_atomic() && len != 8 {
            return Err(VerbsError::InvalidRequest(
                "an atomic's result buffer is 8 bytes",
            ));
        }
        if len > (1 << 31) {
            return Err(VerbsError::InvalidRequest("a message is at most 2 GiB"));
        }
        if self.op.is_read_or_atomic() && matches!(self.payload, Payload::Inline(_)) {
            return Err(VerbsError::InvalidRequest(
                "READ and atomics need SGEs for their result",
            ));
        }
        Ok(())
    }
}

/// A receive work request. (The default receives a zero-length message, with a `wr_id` of 0.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecvWr {
    /// The application's tag, returned in the completion.
    pub wr_id: u64,
    /// Where a received message's bytes go, in order.
    pub sges: SgeList,
}

impl RecvWr {
    /// A receive into the bytes `sges` name.
    pub fn new(wr_id: u64, sges: impl Into<SgeList>) -> Self {
        RecvWr {
            wr_id,
            sges: sges.into(),
        }
    }
}

/// `ibv_wc_status`: how a work request ended. Displays as libibverbs' `ibv_wc_status_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// It completed.
    Success,
    /// A message was longer than the receive's SGEs, or than the QP allows.
    LocLenErr,
    /// The QP could not carry the request out: an operation its type does not allow, a UD
    /// destination missing or unreachable, a message beyond the port's MTU on UD.
    LocQpOpErr,
    /// An SGE's key, protection domain, bounds or access refused the local access.
    LocProtErr,
    /// The QP went to the error state (or was destroyed) before the request completed.
    WrFlushErr,
    /// The responder refused the request as invalid (NAK Invalid Request): an operation
    /// the QP does not allow, or more READs and atomics than it accepts.
    RemInvReqErr,
    /// The responder refused the access: its key, bounds or rights (NAK Remote Access Error).
    RemAccessErr,
    /// The responder could not complete the operation (NAK Remote Operational Error).
    RemOpErr,
    /// The peer did not acknowledge after the QP's retry count of timeouts.
    RetryExcErr,
    /// The peer answered Receiver Not Ready more times than the RNR retry count allows.
    RnrRetryExcErr,
    /// A memory window bind broke a rule (`IBV_WC_MW_BIND_ERR`).
    MwBindErr,
}

impl fmt::Display for WcStatus {
    /// libibverbs' `ibv_wc_status_str` text, so that logs read as other verbs programs' do.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        })
    }
}

/// `ibv_wc_opcode`: what a completed work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (with or without immediate or invalidate).
    Send,
    /// An RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// An atomic compare and swap.
    CompSwap,
    /// An atomic fetch and add.
    FetchAdd,
    /// A receive that a SEND consumed.
    Recv,
    /// A receive that an RDMA WRITE with immediate consumed.
    RecvRdmaWithImm,
    /// A memory window bind.
    BindMw,
    /// A local invalidate.
    LocalInv,
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// The QP it was posted to.
    pub qp_num: Qpn,
    /// Bytes received (receives), or transferred by a READ or an atomic (8).
    pub byte_len: u32,
    /// The immediate data of a SEND or WRITE with immediate, on the receive completion.
    pub imm_data: Option<u32>,
    /// The rkey a SEND with Invalidate invalidated, on the receive completion.
    pub invalidated_rkey: Option<RKey>,
    /// A receive completion whose message asked for a solicited event (the SE bit of its last
    /// packet, IBTA 9.2.2): what wakes a CQ armed for solicited completions only.
    pub solicited: bool,
    /// The sender's QPN (from the DETH on UD) and address, on receive completions.
    pub src_qp: Option<Qpn>,
    /// The sender's IP address, on receive completions.
    pub src_addr: Option<IpAddr>,
    /// A UD receive that succeeded: the buffer's first 40 bytes hold the GRH (verbs'
    /// `IBV_WC_GRH`). Flushed receives carry no GRH, as with rxe (rxe_resp.c
    /// `flush_recv_wqe` leaves the flags empty).
    pub grh: bool,
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
            solicited: false,
            src_qp: None,
            src_addr: None,
            grh: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LKey;

    /// Inline bytes held in place take no more room than the SGEs a request holds in place,
    /// so that no request is larger for them; more spill to the heap, and stay whole.
    #[test]
    fn inline_data_costs_a_request_no_room_and_keeps_every_byte() {
        use std::mem::size_of;
        // A `Payload` is as large as its largest variant, and its tag.
        assert!(size_of::<InlineData>() <= size_of::<SgeList>());
        let small = InlineData::from(&[7u8; INLINE_BYTES][..]);
        assert!(!small.0.spilled());
        let mut large = InlineData::new();
        large.extend_from_slice(&[1; INLINE_BYTES]);
        large.extend_from_slice(&[2; 3]);
        assert_eq!(large.len(), INLINE_BYTES + 3);
        assert_eq!(&large[INLINE_BYTES..], [2, 2, 2]);
        assert_eq!(InlineData::from(vec![5; 300]).len(), 300);
    }

    fn sge(addr: u64) -> Sge {
        Sge {
            addr,
            len: 8,
            lkey: LKey(1),
        }
    }

    #[test]
    fn short_sge_lists_live_in_the_request() {
        let list: SgeList = [sge(0), sge(8), sge(16), sge(24)].into();
        assert!(!list.0.spilled(), "four SGEs need no heap allocation");
        assert_eq!(list.total_len(), 32);
        let mut longer = list.clone();
        longer.push(sge(32));
        assert!(longer.0.spilled(), "a fifth goes to the heap, and is kept");
        assert_eq!(&longer[4..], &[sge(32)]);
        assert!(!SgeList::from(sge(0)).0.spilled());
    }

    #[test]
    fn builders_make_what_their_names_say() {
        let remote = RemoteRegion {
            addr: 0x1000,
            len: 64,
            rkey: RKey(9),
        };
        let wr = SendWr::write(1, sge(0), remote.at(16).unwrap())
            .unsignaled()
            .fenced();
        assert_eq!(
            wr.op,
            SendOp::Write {
                remote_addr: 0x1010,
                rkey: RKey(9)
            }
        );
        assert!(!wr.signaled && wr.fence && !wr.solicited);
        assert_eq!(wr.payload.len(), 8);
        let atomic = SendWr::compare_swap(2, sge(0), remote, 1, 2);
        assert!(atomic.op.is_atomic() && atomic.signaled);
        assert_eq!(RecvWr::new(3, [sge(0), sge(8)]).sges.total_len(), 16);
        assert_eq!(remote.at(64).map(|r| r.len), Some(0));
        assert_eq!(remote.at(65), None, "an offset past the end is refused");
    }

    /// Statuses print as libibverbs' `ibv_wc_status_str` (libibverbs/verbs.c), so that a log
    /// reads as other verbs programs' logs do.
    #[test]
    fn statuses_display_as_libibverbs_names_them() {
        assert_eq!(WcStatus::Success.to_string(), "success");
        assert_eq!(
            WcStatus::RetryExcErr.to_string(),
            "transport retry counter exceeded"
        );
        assert_eq!(
            WcStatus::WrFlushErr.to_string(),
            "Work Request Flushed Error"
        );
        assert_eq!(WcStatus::RemAccessErr.to_string(), "remote access error");
    }
}
