//! The transport core: a deterministic, sans-IO state machine.
//!
//! An [`Endpoint`] owns the protection domains, memory regions, completion queues, shared
//! receive queues, address handles and queue pairs (RC, UC and UD) of one device. It opens no
//! socket and reads no clock. The caller feeds it:
//!
//! - `handle_received(now, datagram)`: a received UDP payload (a RoCE packet) with its
//!   addresses, the IP header if the io layer has it, and what the io layer could verify of its
//!   ICRC (see [`Datagram`]); `handle_datagram(now, src, icrc, bytes)` is the same for a UDP
//!   socket bound to `local_addr`;
//! - `handle_timeout(now)`: when `next_deadline()` has passed;
//! - the verbs: `post_send`, `post_recv`, `modify_qp`, ...
//!
//! and collects `poll_transmit_into(buf)` (the next packet to send, written into a buffer the io
//! layer owns, without its ICRC, which depends on the framing the io layer chooses;
//! `poll_transmit()` gives it as a `Vec`), `poll_cq(cq)` (completions) and `poll_event()`
//! (asynchronous events). `now` is a `Duration` since any epoch the caller likes; only differences
//! matter.

mod congestion;
mod counters;
mod cq;
mod datagram;
mod dcqcn;
mod endpoint;
mod keepalive;
mod lane;
mod outgoing;
mod qp;
mod requester;
mod responder;
mod slots;
mod srq;
mod work_queue;
mod wr;

use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use congestion::{CongestionConfig, CongestionStatus, NpParams};
pub use counters::Counters;
pub use datagram::{Datagram, GRH_LEN};
pub use dcqcn::{RpParams, METER_WINDOW};
pub use endpoint::{Endpoint, EndpointConfig, Resources, DEFAULT_PORT_MTU, MAX_AH_GROWTH};
pub use lane::{Lane, QpnLedger, MAX_LANES};
pub use outgoing::MAX_PACKET_LEN;
pub use qp::{
    check_modify, connect_steps, datagram_steps, AddressVector, AttrName, ConnectOptions,
    ModifyError, PathMtu, QpAttr, QpEndpoint, QpSettings, QpState, QpType, MAX_RD_ATOMIC,
};
pub use requester::MAX_UNACKED_PSNS;
pub(crate) use slots::Line;
pub use slots::QueueSlots;
pub use srq::{SrqAttr, SrqId, SrqModify};
pub use wr::{
    InlineData, Payload, RecvWr, SendOp, SendWr, Sge, SgeList, UdDest, WcOpcode, WcStatus,
    WorkCompletion, INLINE_BYTES, INLINE_SGES,
};

use crate::memory::{DeviceMemory, MemoryError, PdId};
use crate::wire::{AckSyndrome, AethRepr, BthRepr, ExtHeaders, Opcode, PacketRepr, Psn, QKey, Qpn};
use congestion::QpCongestion;
use cq::{CompletionQueue, Pushed};
use outgoing::{Queued, Source};
use requester::Requester;
use responder::Responder;
use responder::{Recv, RecvQueue};
use srq::SharedRq;

/// A packet for the io layer to frame and send. Its last four bytes are the ICRC, left zero:
/// the io layer computes it for the framing it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The IP address to send it to.
    pub dst: IpAddr,
    /// The RoCE packet, from the BTH through the zeroed ICRC.
    pub packet: Vec<u8>,
}

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// An address handle (`ibv_create_ah`): where UD sends go, from [`Endpoint::create_ah`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressHandle(u32);

/// An event not tied to a work request (IBTA 11.6.3). More kinds may come: matches need a
/// wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// The QP met an error and went to the error state (a modify to ERROR raises none).
    QpFatal {
        /// The QP.
        qpn: Qpn,
    },
    /// A remote request broke the QP's or a region's access rules.
    QpAccessError {
        /// The QP the request came to.
        qpn: Qpn,
    },
    /// A completion did not fit its CQ: that completion (of work request `wr_id` on QP `qpn`)
    /// is lost, the CQ is in error, and so is every QP that completes into it.
    CqOverrun {
        /// The CQ that overran.
        cq: CqId,
        /// The QP of the lost completion.
        qpn: Qpn,
        /// The lost completion's work request ID.
        wr_id: u64,
    },
    /// Fewer requests than its armed limit are left on a shared receive queue; the limit is
    /// now disarmed.
    SrqLimitReached {
        /// The SRQ.
        srq: SrqId,
    },
    /// A QP that takes its receive requests from an SRQ went to the error state, by a modify
    /// or an error: it takes no more of them, and the completions of those it held are
    /// already on its CQ. An application drains the CQ and may then destroy the QP (IBTA
    /// 11.6.3.1, Last WQE Reached; rxe_resp.c `flush_recv_queue`). SPDK's NVMe-oF target,
    /// for one, waits for it before it destroys a QP of its SRQ.
    QpLastWqeReached {
        /// The QP.
        qpn: Qpn,
    },
}

/// Why a verb was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// No QP has this number.
    UnknownQp(Qpn),
    /// No live CQ has this handle.
    UnknownCq(CqId),
    /// No SRQ has this handle.
    UnknownSrq(SrqId),
    /// No live address handle has this handle.
    UnknownAh(AddressHandle),
    /// `ibv_modify_qp` refused the transition or an attribute.
    Modify(ModifyError),
    /// A memory verb or memory check failed.
    Memory(MemoryError),
    /// The queue already holds its configured number of requests.
    QueueFull,
    /// The QP's state does not allow this verb.
    WrongState(QpState),
    /// The request itself is malformed; the text says how.
    InvalidRequest(&'static str),
    /// Every number of this kind is taken.
    OutOfResources(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::UnknownQp(q) => write!(f, "no QP {q}"),
            VerbsError::UnknownCq(c) => write!(f, "no CQ {}", c.0),
            VerbsError::UnknownSrq(s) => write!(f, "no SRQ {}", s.0),
            VerbsError::UnknownAh(ah) => write!(f, "no address handle {}", ah.0),
            VerbsError::Modify(e) => e.fmt(f),
            VerbsError::Memory(e) => e.fmt(f),
            VerbsError::QueueFull => f.write_str("the queue is full"),
            VerbsError::WrongState(QpState::Reset) => f.write_str(
                "the QP is in RESET: take it to INIT to post receives (QueuePair::init), and \
                 connect it to send (QueuePair::connect, Connection::connect)",
            ),
            VerbsError::WrongState(s @ (QpState::Init | QpState::Rtr)) => write!(
                f,
                "the QP is in {s:?}: sends wait for RTS, where connecting it takes it \
                 (QueuePair::connect, Connection::connect)"
            ),
            VerbsError::WrongState(s) => write!(f, "not allowed in state {s:?}"),
            VerbsError::InvalidRequest(why) => write!(f, "invalid request: {why}"),
            VerbsError::OutOfResources(what) => write!(f, "out of resources: {what}"),
        }
    }
}

impl std::error::Error for VerbsError {}

impl From<ModifyError> for VerbsError {
    fn from(e: ModifyError) -> Self {
        VerbsError::Modify(e)
    }
}

impl From<MemoryError> for VerbsError {
    fn from(e: MemoryError) -> Self {
        VerbsError::Memory(e)
    }
}

/// How a QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// The transport service: RC, UC or UD.
    pub qp_type: QpType,
    /// The protection domain whose regions and address handles the QP may use.
    pub pd: PdId,
    /// Where send completions go.
    pub send_cq: CqId,
    /// Where receive completions go.
    pub recv_cq: CqId,
    /// The most send requests the QP holds at once (`max_send_wr` of `ibv_qp_cap`).
    pub max_send_wr: usize,
    /// Ignored by [`Endpoint::create_qp_with_srq`].
    pub max_recv_wr: usize,
}

/// QPs noted as handled before the active set is brought up to date anyway, so that a caller
/// that never polls for transmits does not grow the list without bound.
const MAX_TOUCHED: usize = 256;

/// How far back in the transmit queue an ACK looks for an unsent ACK of its QP to replace.
const COALESCE_WINDOW: usize = 64;

/// Whether a queued packet is an ACK with no more than its AETH: not a NAK, not an atomic ACK.
fn is_plain_ack(queued: &Queued) -> bool {
    queued.repr.bth.opcode == Opcode::RcAck
        && queued.repr.ext.atomic_ack_eth.is_none()
        && queued
            .repr
            .ext
            .aeth
            .is_some_and(|aeth| matches!(aeth.syndrome, AckSyndrome::Ack(_)))
}

/// Everything a QP's packet handlers may touch besides the QP itself.
pub(crate) struct Ctx<'a> {
    /// The time of the call being handled.
    pub now: Duration,
    /// Every region and window of the device, for the access checks and data.
    pub memory: &'a DeviceMemory,
    /// Packets queued for the io layer, built when it asks for them.
    pub out: &'a mut VecDeque<Queued>,
    /// Buffers of copied payloads (inline sends, parts of more than two SGEs), reused before
    /// allocating.
    pub pool: &'a mut Vec<Vec<u8>>,
    /// Every completion queue, by [`CqId`].
    pub cqs: &'a mut [CompletionQueue],
    /// Every shared receive queue, by [`SrqId`].
    pub srqs: &'a mut [SharedRq],
    /// Asynchronous events not yet polled.
    pub events: &'a mut VecDeque<AsyncEvent>,
    /// The endpoint's counters.
    pub counters: &'a mut Counters,
    /// CQs that overran since the endpoint last put their QPs in error.
    pub overrun: &'a mut Vec<CqId>,
    /// How QPs take part in congestion control.
    pub congestion: &'a CongestionConfig,
}

impl Ctx<'_> {
    /// Queues a packet, `payload_len` bytes of `payload` after the headers. It is built
    /// when the io layer asks for it ([`Endpoint::poll_transmit_into`]).
    pub fn send(
        &mut self,
        dst: IpAddr,
        bth: BthRepr,
        ext: ExtHeaders,
        payload_len: usize,
        payload: Source,
    ) {
        let repr = PacketRepr::new(bth, ext, payload_len);
        debug_assert!(repr.buffer_len() <= MAX_PACKET_LEN, "a packet past the MTU");
        self.counters.sent_packets += 1;
        self.out.push_back(Queued {
            dst,
            repr,
            payload,
            unreliable: None,
        });
    }

    /// UC or UD QP `qpn`'s packets not yet built: those before PSN `cut` are read out of the
    /// application's memory now, for their requests complete before they are built; the rest
    /// (a request failing part way) are dropped.
    pub fn settle_unbuilt(&mut self, qpn: Qpn, cut: Psn) {
        let (pool, counters) = (&mut *self.pool, &mut *self.counters);
        self.out.retain_mut(|queued| {
            if !queued.unreliable.is_some_and(|u| u.qpn == qpn) {
                return true;
            }
            if !queued.repr.bth.psn.is_before(cut) {
                return false;
            }
            let payload = std::mem::replace(&mut queued.payload, Source::Empty);
            let whole;
            (queued.payload, whole) = payload.read_now(pool);
            if !whole {
                counters.unmapped_accesses += 1;
            }
            queued.unreliable = None;
            true
        });
    }

    /// UC or UD QP `qpn`'s packets not yet built, dropped: their requests were flushed.
    pub fn drop_unbuilt(&mut self, qpn: Qpn) {
        self.out
            .retain(|queued| !queued.unreliable.is_some_and(|u| u.qpn == qpn));
    }

    /// Queues an ACK. An ACK acknowledges every PSN up to its own (IBTA 9.7.5.1.1, coalesced
    /// acknowledges), so one that would follow an unsent ACK of the same QP, with no other
    /// packet of that QP between them, takes that ACK's place instead. The engine sends only
    /// after a batch of receives: a QP's responder sends one ACK per batch, not one a message.
    pub fn send_ack(&mut self, dst: IpAddr, bth: BthRepr, aeth: AethRepr) {
        let ext = ExtHeaders {
            aeth: Some(aeth),
            ..ExtHeaders::default()
        };
        let earlier = self
            .out
            .iter_mut()
            .rev()
            .take(COALESCE_WINDOW)
            .find(|q| q.dst == dst && q.repr.bth.dest_qp == bth.dest_qp);
        if let Some(earlier) = earlier.filter(|q| is_plain_ack(q)) {
            earlier.repr = PacketRepr::new(bth, ext, 0);
            self.counters.coalesced_acks += 1;
            return;
        }
        self.send(dst, bth, ext, 0, Source::Empty);
    }

    /// Queues a completion; an overrun errs the CQ (see [`cq`]) and raises its event, naming
    /// the completion lost, and the endpoint then errs the CQ's QPs.
    pub fn complete(&mut self, cq: CqId, wc: WorkCompletion) {
        match self.cqs[cq.0 as usize].push(wc) {
            Pushed::Queued => {}
            Pushed::Overran(lost) => {
                self.counters.dropped_completions += 1;
                self.events.push_back(AsyncEvent::CqOverrun {
                    cq,
                    qpn: lost.qp_num,
                    wr_id: lost.wr_id,
                });
                self.overrun.push(cq);
            }
            Pushed::Dropped => self.counters.dropped_completions += 1,
        }
    }
}

/// The earlier of two optional deadlines; `None` only if both are.
pub(crate) fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One queue pair.
pub(crate) struct Qp {
    /// Its number, in every BTH sent to it.
    pub qpn: Qpn,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// The protection domain its memory accesses are checked against.
    pub pd: PdId,
    /// Its IBTA 10.3.1 state.
    pub state: QpState,
    /// What its modifies have set.
    pub settings: QpSettings,
    /// Where send completions go.
    pub send_cq: CqId,
    /// Where receive completions go.
    pub recv_cq: CqId,
    /// The most send requests it holds at once.
    pub max_send_wr: usize,
    /// The most receive requests its own queue holds at once.
    pub max_recv_wr: usize,
    /// Its receive queue, oldest first; empty when it takes from an SRQ.
    rq: RecvQueue,
    /// The SRQ it takes receive requests from, if any.
    pub srq: Option<SrqId>,
    /// The send side: segmentation, retries and send completions.
    pub req: Requester,
    /// The receive side: validation, execution, ACKs and receive completions.
    pub resp: Responder,
    /// Packets accepted from the peer: past the P_Key, Q_Key and source checks.
    pub received: u64,
    /// The outstanding requests its handles count ([`Endpoint::share_slots`]); `None` where
    /// the caller of the core counts nothing (the simulator, the CM's QP1).
    pub slots: Option<Arc<QueueSlots>>,
    /// Its CNPs, both ways, and its pacer.
    pub cc: QpCongestion,
    /// Its probes of a silent peer, if it has keepalive ([`Endpoint::set_keepalive`]).
    pub keepalive: Option<keepalive::Keepalive>,
}

impl Qp {
    /// The CQ a completion of `opcode` goes to: the receive CQ for receives, else the send CQ.
    fn cq_of(&self, opcode: WcOpcode) -> CqId {
        match opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv_cq,
            _ => self.send_cq,
        }
    }

    fn peer(&self) -> Option<IpAddr> {
        self.settings.av.map(|av| av.dest)
    }

    /// When its timers (retry, RNR wait) or its pacer next want it.
    fn deadline(&self) -> Option<Duration> {
        let probe = self.keepalive.and_then(|k| k.deadline());
        earliest(earliest(self.req.deadline(), self.cc.deadline()), probe)
    }

    /// The path MTU; for UD, whose modify takes none, the port's (rxe_req.c `get_mtu`), which
    /// the endpoint keeps up to date.
    fn mtu(&self) -> usize {
        self.settings.path_mtu.bytes()
    }

    /// The Q_Key a UD QP accepts: QP1's is fixed (rxe_recv.c `check_keys`).
    fn qkey(&self) -> QKey {
        if self.qpn == Qpn::GSI {
            QKey::GSI
        } else {
            self.settings.qkey
        }
    }

    /// Whether a receive request is there for the next message.
    fn has_recv(&self, ctx: &Ctx<'_>) -> bool {
        match self.srq {
            Some(id) => !ctx.srqs[id.0 as usize].is_empty(),
            None => !self.rq.is_empty(),
        }
    }

    /// `n` send requests left the send queue, or were refused before entering it.
    pub(crate) fn retire_sends(&self, n: usize) {
        if let Some(slots) = &self.slots {
            slots.retire_sends(n);
        }
    }

    /// `n` receive requests of the QP's own queue completed, or were refused before entering
    /// it. Requests taken from an SRQ are the SRQ's to count.
    pub(crate) fn retire_recvs(&self, n: usize) {
        if let (Some(slots), None) = (&self.slots, self.srq) {
            slots.retire_recvs(n);
        }
    }

    /// The receive request for the next message: its own queue's head stays there until the
    /// message completes ([`recv_done`](Self::recv_done)); one from an SRQ is taken from it.
    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<Recv> {
        match self.srq {
            Some(id) => ctx.srqs[id.0 as usize]
                .take(id, ctx.events)
                .map(Recv::Shared),
            None => (!self.rq.is_empty()).then_some(Recv::Head),
        }
    }

    /// The message that `recv` took completed: its own queue's head leaves the queue.
    fn recv_done(&mut self, recv: Recv) {
        if let Recv::Head = recv {
            self.rq.retire_front(1, self.max_recv_wr);
        }
        self.retire_recvs(1);
    }

    /// Moves to the error state on an error the QP met (a request that failed for good, a
    /// peer's request it must refuse, a CQ that overran): [`AsyncEvent::QpFatal`], then as
    /// [`enter_error`](Self::enter_error).
    pub fn fail(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Error {
            return;
        }
        ctx.events.push_back(AsyncEvent::QpFatal { qpn: self.qpn });
        self.enter_error(ctx);
    }

    /// Moves to the error state: every outstanding request completes with WR_FLUSH_ERR, and
    /// a QP on an SRQ says that it takes no more of the SRQ's requests. A modify to ERROR
    /// comes here without [`AsyncEvent::QpFatal`], which reports errors, not requests (rxe's
    /// `rxe_qp_error` raises none either).
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        self.flush(ctx);
        if self.srq.is_some() {
            ctx.events
                .push_back(AsyncEvent::QpLastWqeReached { qpn: self.qpn });
        }
    }

    /// UC and UD: a send completed in error stops the send queue only (IBTA 10.3.1, the SQE
    /// state): the rest of it is flushed, the receive side carries on, and a modify to RTS
    /// resumes sending.
    pub fn enter_sq_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Sqe;
        let flushed = self.req.flush(self.qpn, self.send_cq, ctx);
        self.retire_sends(flushed);
        ctx.drop_unbuilt(self.qpn);
    }

    /// Completes every request with WR_FLUSH_ERR: the send queue, the receive request of a
    /// message half received (even one taken from an SRQ, as rxe_resp.c `check_resource`
    /// does), then the QP's own receive queue. An SRQ's requests stay for its other QPs.
    /// READ responses and UC and UD packets queued but not yet built go too: nothing more of
    /// a flushed request leaves a QP in ERROR or RESET, or one destroyed, whose number a new
    /// QP may draw.
    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        let flushed = self.req.flush(self.qpn, self.send_cq, ctx);
        self.retire_sends(flushed);
        let qpn = self.qpn;
        ctx.out
            .retain(|queued| !queued.payload.is_read_response_of(qpn));
        ctx.drop_unbuilt(qpn);
        let half_received = self.resp.reset();
        let queued = (0..self.rq.len()).map(|idx| self.rq.wr(idx));
        let mut receives = 0;
        for wr in half_received.iter().chain(queued) {
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.recv_cq, wc);
            receives += 1;
        }
        // A flush is no stream: the queue's batches are freed, not kept.
        self.rq.retire_front(self.rq.len(), 0);
        self.retire_recvs(receives);
    }
}

/// The opcode of an RC operation on a QP of `qp_type`. IBTA 9.2, table 38: an opcode's top three
/// bits name the transport and its low five the operation, numbered alike in RC, UC and UD
/// (SEND_ONLY is 0x04, 0x24 and 0x64).
fn on_transport(rc: Opcode, qp_type: QpType) -> Opcode {
    let transport = match qp_type {
        QpType::Rc => 0x00,
        QpType::Uc => 0x20,
        QpType::Ud => 0x60,
    };
    Opcode::from_u8(transport | rc.value())
}

/// The RC opcode of the same operation, so that one responder serves the three transports.
fn operation(opcode: Opcode) -> Opcode {
    Opcode::from_u8(opcode.value() & 0x1f)
}
