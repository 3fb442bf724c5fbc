//! The requester: segmentation and completions in posting order for every transport; for RC
//! also the ACK-request policy, the PSN window, go-back-N retransmission, and READ and atomic
//! responses. UC and UD send each packet once, without AckReq, and complete a request when its
//! last packet is built, for the io layer to send (rxe_req.c: only RC waits for an
//! acknowledgement).
//!
//! Facts from IBTA 9.7 and the kernel's rxe_req.c / rxe_comp.c; the code is our own.

use std::net::IpAddr;
use std::time::Duration;

use super::outgoing::{Source, UnreliableSend};
use super::work_queue::{Place, Placed, WorkQueue};
use super::wr::{Payload, SendOp, SendWr, Sge, SgeList, WcStatus, WorkCompletion};
use super::{on_transport, CqId};
use super::{Ctx, Qp, QpSettings, QpState, QpType, VerbsError};
use crate::memory::{Access, MemoryError, MemoryTable, PdId};
use crate::wire::{
    AckSyndrome, AethRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, IethRepr, ImmDtRepr,
    NakCode, Opcode, PacketRepr, Position, Psn, QKey, Qpn, RethRepr,
};

/// The most PSNs a requester keeps unacknowledged (rxe keeps 128).
pub const MAX_UNACKED_PSNS: u32 = 128;

/// Every this many packets, across messages, at least one asks for an ACK, so that the window
/// keeps moving when the messages themselves do not ask.
pub const ACK_REQ_INTERVAL: u32 = 32;

/// The local ACK timeout: 4.096 µs × 2^timeout (IBTA 9.7.6.1.3); `None` for 0, "forever".
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout != 0).then(|| Duration::from_nanos(4096u64 << timeout))
}

/// Whether the core checks a send request against its QP's type ([`SendWr::check`]) as it
/// queues it, or whether the post did already: the engine's posting queues hold only requests
/// that `QueuePair::post_send` checked at the call, and the QP's type never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendChecks {
    Run,
    DoneAtPost,
}

/// What the requester keeps about a request of the queue.
#[derive(Debug)]
struct SendWqe {
    /// UD: the address handle's destination.
    ud_dest: Option<IpAddr>,
    /// Set when its first packet is sent.
    first_psn: Psn,
    /// The PSNs the message takes: its packets, or for a READ its response packets.
    npsn: u32,
    started: bool,
    /// A READ or an atomic: answered with data, and limited by `max_rd_atomic`.
    read_or_atomic: bool,
    /// A bind or local invalidate, which sends nothing.
    local: bool,
    /// The request's fence flag (`SendWr::fence`).
    fence: bool,
    /// Its final status, once known; completions are still reported in posting order.
    done: Option<WcStatus>,
    /// Where the request lies in the send queue.
    place: Place,
}

impl Placed for SendWqe {
    fn place(&self) -> Place {
        self.place
    }
}

impl SendWqe {
    fn contains(&self, psn: Psn) -> bool {
        self.started && {
            let k = psn - self.first_psn;
            k >= 0 && (k as u32) < self.npsn
        }
    }

    fn last_psn(&self) -> Psn {
        // A local operation takes no PSN: its "last" is the one before its place.
        self.first_psn + self.npsn.wrapping_sub(1)
    }
}

/// The state of `wr`, queued at `place` and not yet started, on a path of MTU `mtu`.
#[inline(always)]
fn queued(wr: &SendWr, ud_dest: Option<IpAddr>, mtu: usize, place: Place) -> SendWqe {
    let npsn = if wr.op.is_local() {
        0
    } else if wr.op.is_atomic() {
        1
    } else {
        wr.payload.len().div_ceil(mtu as u64).max(1) as u32
    };
    SendWqe {
        ud_dest,
        first_psn: Psn::new(0),
        npsn,
        started: false,
        read_or_atomic: wr.op.is_read_or_atomic(),
        local: wr.op.is_local(),
        fence: wr.fence,
        done: None,
        place,
    }
}

/// The state of a request refused after its post returned, queued at `place` when the next PSN
/// was `psn`: done with LOC_QP_OP_ERR, never started, so that a pump passes over it and it
/// completes in its place ([`Qp::refuse`]).
fn refused(place: Place, psn: Psn) -> SendWqe {
    SendWqe {
        ud_dest: None,
        first_psn: psn,
        npsn: 0,
        started: false,
        read_or_atomic: false,
        local: false,
        fence: false,
        done: Some(WcStatus::LocQpOpErr),
        place,
    }
}

/// A QP's send queue: its requests where the posts wrote them, and their states.
type SendQueue = WorkQueue<SendWr, SendWqe>;

/// The requester half of a QP.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    sq: SendQueue,
    /// The next packet to send is packet `send_psn - first_psn` of `sq[send_idx]`.
    send_idx: usize,
    send_psn: Psn,
    /// The oldest PSN not yet acknowledged.
    una: Psn,
    /// One past the highest PSN ever sent: packets below it are retransmissions.
    high_psn: Psn,
    retry_left: u8,
    rnr_left: u8,
    retry_timer: Option<Duration>,
    rnr_until: Option<Duration>,
    /// Set when the requester went back to `una`; cleared by progress. Keeps a burst of
    /// out-of-order responses from rewinding more than once.
    rewound: bool,
    /// Packets sent since the last one that asked for an ACK.
    unasked: u32,
}

impl Requester {
    /// The PSN the next new packet will carry (`ibv_query_qp`'s `sq_psn`).
    pub fn next_psn(&self) -> Psn {
        self.high_psn
    }

    /// Starts sending at `sq_psn` (from the modify that sets it), with full retry budgets.
    pub fn start(&mut self, sq_psn: Psn, settings: &QpSettings) {
        self.send_psn = sq_psn;
        self.una = sq_psn;
        self.high_psn = sq_psn;
        self.retry_left = settings.retry_cnt;
        self.rnr_left = settings.rnr_retry;
    }

    /// Posted send requests not yet completed.
    pub fn outstanding_wrs(&self) -> usize {
        self.sq.len()
    }

    /// When the retry timer or the RNR wait ends, whichever comes first.
    pub fn deadline(&self) -> Option<Duration> {
        super::earliest(self.retry_timer, self.rnr_until)
    }

    fn outstanding(&self) -> bool {
        self.una != self.high_psn
    }

    /// Whether requests are posted and not yet completed, or packets sent and not yet
    /// acknowledged: the QP is not idle.
    pub(crate) fn has_outstanding(&self) -> bool {
        self.outstanding() || !self.sq.is_empty()
    }

    /// The oldest PSN not yet acknowledged.
    pub(crate) fn oldest_unacked(&self) -> Psn {
        self.una
    }

    /// Every request left completes with WR_FLUSH_ERR, in order; returns how many there were.
    pub fn flush(&mut self, qpn: Qpn, cq: CqId, ctx: &mut Ctx<'_>) -> usize {
        let flushed = self.sq.len();
        for idx in 0..flushed {
            let (wqe, wr) = self.sq.entry(idx);
            let status = wqe.done.unwrap_or(WcStatus::WrFlushErr);
            if wr.signaled || status != WcStatus::Success {
                ctx.complete(
                    cq,
                    WorkCompletion::new(wr.wr_id, status, wr.op.wc_opcode(), qpn),
                );
            }
        }
        // A flush is no stream: its batches are freed, not kept.
        self.sq.retire_front(flushed, 0);
        self.send_idx = 0;
        self.retry_timer = None;
        self.rnr_until = None;
        flushed
    }
}

/// Copies `data` to offset `at` of the message scattered over `sges`.
/// `Ok(false)` if the SGEs are too short.
pub(crate) fn scatter(
    memory: &MemoryTable,
    pd: PdId,
    sges: &[Sge],
    mut at: usize,
    data: &[u8],
) -> Result<bool, MemoryError> {
    let mut done = 0;
    for sge in sges {
        if done == data.len() {
            break;
        }
        let len = sge.len as usize;
        if at >= len {
            at -= len;
            continue;
        }
        let n = (len - at).min(data.len() - done);
        let span =
            memory.check_local(sge.lkey, pd, sge.addr + at as u64, n, Access::LOCAL_WRITE)?;
        span.write(0, &data[done..done + n])?;
        done += n;
        at = 0;
    }
    Ok(done == data.len())
}

/// The RC opcode of packet `position` of `op`; [`on_transport`] gives the UC or UD one. `None`
/// for a local operation, which sends nothing.
fn opcode_for(op: SendOp, position: Position) -> Option<Opcode> {
    use Position::*;
    Some(match (op, position) {
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, First) => {
            Opcode::RcSendFirst
        }
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, Middle) => {
            Opcode::RcSendMiddle
        }
        (SendOp::Send, Last) => Opcode::RcSendLast,
        (SendOp::Send, Only) => Opcode::RcSendOnly,
        (SendOp::SendWithImm { .. }, Last) => Opcode::RcSendLastImm,
        (SendOp::SendWithImm { .. }, Only) => Opcode::RcSendOnlyImm,
        (SendOp::SendWithInv { .. }, Last) => Opcode::RcSendLastInv,
        (SendOp::SendWithInv { .. }, Only) => Opcode::RcSendOnlyInv,
        (SendOp::Write { .. } | SendOp::WriteWithImm { .. }, First) => Opcode::RcWriteFirst,
        (SendOp::Write { .. } | SendOp::WriteWithImm { .. }, Middle) => Opcode::RcWriteMiddle,
        (SendOp::Write { .. }, Last) => Opcode::RcWriteLast,
        (SendOp::Write { .. }, Only) => Opcode::RcWriteOnly,
        (SendOp::WriteWithImm { .. }, Last) => Opcode::RcWriteLastImm,
        (SendOp::WriteWithImm { .. }, Only) => Opcode::RcWriteOnlyImm,
        (SendOp::Read { .. }, _) => Opcode::RcReadRequest,
        (SendOp::CompareSwap { .. }, _) => Opcode::RcCompareSwap,
        (SendOp::FetchAdd { .. }, _) => Opcode::RcFetchAdd,
        (SendOp::BindMw(_) | SendOp::LocalInv { .. }, _) => return None,
    })
}

fn position(k: u32, n: u32) -> Position {
    match (k == 0, k + 1 == n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl Qp {
    pub(crate) fn post_send(
        &mut self,
        wr: SendWr,
        ud_dest: Option<IpAddr>,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), VerbsError> {
        self.enqueue_send(wr, ud_dest, SendChecks::Run, ctx)
            .inspect_err(|_| self.retire_sends(1))?;
        self.pump(ctx);
        Ok(())
    }

    /// Checks and queues a send request, without sending: `pump` sends what a batch queued.
    /// One flushed at once gives its slot back; one refused keeps it, for the caller to give
    /// back or to [`refuse`](Self::refuse) it.
    // Inlined, with `check_and_queue`, into `Endpoint::queue_send_batch`'s loop: a request then
    // moves from the posting queue into the send queue with fewer copies on the way (20
    // instructions a 64-byte WRITE fewer, callgrind).
    #[inline]
    pub(crate) fn enqueue_send(
        &mut self,
        wr: SendWr,
        ud_dest: Option<IpAddr>,
        checks: SendChecks,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), VerbsError> {
        let queued = self.req.sq.len();
        self.check_and_queue(wr, ud_dest, checks, ctx)?;
        if self.req.sq.len() == queued {
            self.retire_sends(1);
        }
        Ok(())
    }

    /// Completes with LOC_QP_OP_ERR a request refused after its post returned, in its place
    /// among the QP's completions. On RC and on an idle QP that is now. On UC and UD, whose
    /// requests complete as their last packet is built, the refusal waits in the send queue
    /// behind those still unbuilt, holding its slot until it is reported.
    pub(crate) fn refuse(&mut self, wr_id: u64, op: SendOp, ctx: &mut Ctx<'_>) {
        let waits = self.qp_type != QpType::Rc
            && self.req.sq.len() < self.max_send_wr
            && self.req.sq.iter().any(|w| w.done.is_none());
        if waits {
            let placeholder = SendWr::new(wr_id, op, Payload::Sges(SgeList::new()));
            let psn = self.req.send_psn;
            self.req.sq.push(placeholder, |_, at| refused(at, psn));
        } else {
            self.retire_sends(1);
            let wc = WorkCompletion::new(wr_id, WcStatus::LocQpOpErr, op.wc_opcode(), self.qpn);
            ctx.complete(self.send_cq, wc);
        }
    }

    #[inline(always)]
    fn check_and_queue(
        &mut self,
        wr: SendWr,
        ud_dest: Option<IpAddr>,
        checks: SendChecks,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), VerbsError> {
        match checks {
            SendChecks::Run => wr.check(self.qp_type)?,
            SendChecks::DoneAtPost => debug_assert!(
                wr.check(self.qp_type).is_ok(),
                "a request from a posting queue that its post did not check"
            ),
        }
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            // A stopped send queue flushes what is posted to it until a modify restarts it.
            QpState::Error | QpState::Sqe => {
                let wc = WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    wr.op.wc_opcode(),
                    self.qpn,
                );
                ctx.complete(self.send_cq, wc);
                return Ok(());
            }
            other => return Err(VerbsError::WrongState(other)),
        }
        if self.req.sq.len() >= self.max_send_wr {
            return Err(VerbsError::QueueFull);
        }
        let mtu = self.mtu();
        self.req.sq.push(wr, |wr, at| queued(wr, ud_dest, mtu, at));
        Ok(())
    }

    /// Queues every request of `wrs`, which their posts checked against this QP's type
    /// ([`SendChecks::DoneAtPost`]), leaving `wrs` empty, if the QP sends (RTS or SQD), has
    /// room for them all and, unless it is UD (which it takes in RTS only), none names a UD
    /// destination: what
    /// `check_and_queue` would do with each, taking the vector itself: the requests stay
    /// where the posts wrote them, and `wrs` is traded for an emptied batch of the send queue
    /// (the request-at-a-time path moves each request three times). On UD, `ud_dest` gives
    /// each request's destination from its address handle; one it refuses (a handle destroyed
    /// since the post) completes with LOC_QP_OP_ERR in its place, as [`refuse`] has it.
    /// False, with nothing taken, otherwise: the request-at-a-time path then refuses what it
    /// must (a destination on a connected QP, which the post refuses at the call too,
    /// completes with LOC_QP_OP_ERR in its place).
    ///
    /// [`refuse`]: Self::refuse
    pub(crate) fn queue_all_checked(
        &mut self,
        wrs: &mut Vec<SendWr>,
        ud_dest: impl Fn(&SendWr) -> Result<Option<IpAddr>, VerbsError>,
    ) -> bool {
        let sends = matches!(self.state, QpState::Rts | QpState::Sqd);
        let ud = self.qp_type == QpType::Ud;
        // UD only in RTS: in SQD a pump completes nothing, where a refusal at the head of an
        // idle queue completes at once.
        if !sends
            || self.req.sq.len() + wrs.len() > self.max_send_wr
            || (ud && self.state != QpState::Rts)
            || (!ud && wrs.iter().any(|wr| wr.ud.is_some()))
        {
            return false;
        }
        debug_assert!(
            wrs.iter().all(|wr| wr.check(self.qp_type).is_ok()),
            "a request from a posting queue that its post did not check"
        );
        let (mtu, psn) = (self.mtu(), self.req.send_psn);
        self.req.sq.take_batch(wrs, |wr, at| {
            let dest = if ud { ud_dest(wr) } else { Ok(None) };
            dest.map_or_else(|_| refused(at, psn), |dest| queued(wr, dest, mtu, at))
        });
        true
    }

    /// Sends what the window, the READ/atomic limit, fences and RNR waits allow. On RC, the
    /// last packet a pump sends asks for an ACK, whatever stopped it (the end of the queue, the
    /// window, a fence, the READ/atomic limit, a local operation, the QP's state): nothing sent
    /// then waits on a later request for its acknowledgement. The packet is still in the
    /// transmit queue, not yet built, so its AckReq bit can be set in place.
    pub(crate) fn pump(&mut self, ctx: &mut Ctx<'_>) {
        let queued = ctx.out.len();
        self.pump_packets(ctx);
        if self.qp_type != QpType::Rc || ctx.out.len() == queued {
            return;
        }
        if let Some(last) = ctx.out.back_mut() {
            if !last.repr.bth.ack_req {
                last.repr.bth.ack_req = true;
                self.req.unasked = 0;
            }
        }
    }

    fn pump_packets(&mut self, ctx: &mut Ctx<'_>) {
        self.cc.unhold();
        if self.state != QpState::Rts {
            return;
        }
        if self.req.rnr_until.is_some_and(|t| t > ctx.now) {
            return;
        }
        self.req.rnr_until = None;
        let reliable = self.qp_type == QpType::Rc;
        while self.req.send_idx < self.req.sq.len() {
            if reliable && (self.req.send_psn - self.req.una) as u32 >= MAX_UNACKED_PSNS {
                break;
            }
            let idx = self.req.send_idx;
            // The request's own fields, not the request: it is read only to build a packet.
            let SendWqe {
                done,
                started,
                local,
                fence,
                read_or_atomic,
                ..
            } = self.req.sq[idx];
            if done.is_some() && !started {
                // A refusal waiting its turn to complete (`refuse`): nothing to send.
                self.req.send_idx += 1;
                continue;
            }
            if local {
                // Executed once, when first reached; a go-back passes over it.
                if done.is_none() {
                    let status = self.local_op(idx, ctx);
                    let wqe = &mut self.req.sq[idx];
                    wqe.started = true;
                    wqe.first_psn = self.req.send_psn;
                    if status != WcStatus::Success {
                        self.fail_wqe(idx, status, ctx);
                        return;
                    }
                    wqe.done = Some(status);
                }
                self.req.send_idx += 1;
                continue;
            }
            // DCQCN's pacer: a QP slowed by CNPs waits for its turn (`Qp::deadline`).
            if !self.cc.rate.may_send(&ctx.congestion.rp, ctx.now) {
                self.cc.hold(&ctx.congestion.rp);
                break;
            }
            if !started {
                // Only a fenced request, a READ or an atomic waits for the READs and atomics
                // ahead of it: the others (a stream of WRITEs or SENDs) do not count them.
                if fence || read_or_atomic {
                    let limit = if fence {
                        1
                    } else {
                        usize::from(self.settings.max_rd_atomic.max(1))
                    };
                    let in_flight = self
                        .req
                        .sq
                        .iter()
                        .take(idx)
                        .filter(|w| w.read_or_atomic && w.done.is_none())
                        .take(limit)
                        .count();
                    if in_flight >= limit {
                        break;
                    }
                }
                let wqe = &mut self.req.sq[idx];
                wqe.started = true;
                wqe.first_psn = self.req.send_psn;
            }
            let psn = self.req.send_psn;
            if let Err(status) = self.send_packet(idx, psn, ctx) {
                self.fail_wqe(idx, status, ctx);
                return;
            }
            let bytes = ctx.out.back().map_or(0, |queued| queued.repr.buffer_len());
            self.cc.rate.sent(&ctx.congestion.rp, ctx.now, bytes);
            let wqe = &mut self.req.sq[idx];
            let k = (psn - wqe.first_psn) as u32;
            if wqe.read_or_atomic || k + 1 == wqe.npsn {
                self.req.send_psn = wqe.first_psn + wqe.npsn;
                self.req.send_idx += 1;
            } else {
                self.req.send_psn = psn + 1;
            }
            if !reliable {
                continue;
            }
            if psn.is_before(self.req.high_psn) {
                ctx.counters.retransmitted_packets += 1;
            }
            if self.req.high_psn.is_before(self.req.send_psn) {
                self.req.high_psn = self.req.send_psn;
            }
            if self.req.retry_timer.is_none() {
                self.req.retry_timer = ack_timeout(self.settings.timeout).map(|t| ctx.now + t);
            }
        }
        // Local operations on any QP are done once reached; UC and UD requests once their
        // last packet is built.
        self.complete_in_order(ctx);
    }

    /// Runs the bind or local invalidate of `sq[idx]` against memory, through this QP.
    fn local_op(&self, idx: usize, ctx: &mut Ctx<'_>) -> WcStatus {
        let me = (self.pd, self.qpn);
        match self.req.sq.wr(idx).op {
            SendOp::BindMw(bind) => {
                let bound = ctx.memory.write().bind_mw(&bind, me);
                bound.map_or(WcStatus::MwBindErr, |()| WcStatus::Success)
            }
            // rxe_req.c: a failed local invalidate completes with LOC_QP_OP_ERR.
            SendOp::LocalInv { rkey } => {
                let invalidated = ctx.memory.write().invalidate(rkey, me, false);
                invalidated.map_or(WcStatus::LocQpOpErr, |()| WcStatus::Success)
            }
            _ => WcStatus::LocQpOpErr,
        }
    }

    /// Whether the next packet, of `wqe`, asks for an ACK (BTH AckReq). An ACK
    /// acknowledges every PSN before its own (IBTA 9.7.5.1.1), so only the packets whose
    /// acknowledgement someone waits for ask: the last of a fenced message, a READ or atomic
    /// request (answered in any case), one in every ACK_REQ_INTERVAL, so that the window
    /// moves, and the last a pump sends ([`pump`]), so that every request of a run completes
    /// without a retry timeout. A signalled message inside a run does not ask: the run's next
    /// ACK, at most 31 packets later, covers it. Asking there made the responder build and
    /// coalesce an ACK for every message of a stream of signalled WRITEs (2.6% of the 64-byte
    /// WRITE bench's instructions). Under loss it costs something: if a run's last packet is
    /// lost, a signalled message earlier in it completes at the retransmission (after the
    /// retry timeout) rather than at an ACK of its own. rxe asks on the last packet of every message and every 64
    /// packets (rxe_req.c); ConnectX, from its traffic, on the last of every signalled one.
    ///
    /// [`pump`]: Self::pump
    fn asks_for_ack(&self, wqe: &SendWqe, last: bool) -> bool {
        wqe.read_or_atomic || (last && wqe.fence) || self.req.unasked + 1 >= ACK_REQ_INTERVAL
    }

    /// The Q_Key a UD send carries: QP1 always sends its own (rxe_req.c), and a work request's
    /// Q_Key with the high bit set stands for the QP's (IBTA 10.2.4.1; rxe sends it unchanged).
    fn send_qkey(&self, requested: QKey) -> QKey {
        if self.qpn == Qpn::GSI {
            QKey::GSI
        } else if requested.is_controlled() {
            self.settings.qkey
        } else {
            requested
        }
    }

    /// Builds and queues packet `psn` of `sq[idx]`: for a READ, the request for the responses
    /// from `psn` on, so that a READ resumes in the middle of its response stream.
    fn send_packet(&mut self, idx: usize, psn: Psn, ctx: &mut Ctx<'_>) -> Result<(), WcStatus> {
        let mtu = self.mtu();
        let (wqe, wr) = self.req.sq.entry(idx);
        let k = (psn - wqe.first_psn) as u32;
        let len = wr.payload.len() as usize;
        if self.qp_type == QpType::Ud && len > mtu {
            // C10-93.1.1 asks for no packet; rxe then reports success, softroce says why not.
            return Err(WcStatus::LocLenErr);
        }
        let op = wr.op;
        let pos = if wqe.read_or_atomic {
            Position::Only
        } else {
            position(k, wqe.npsn)
        };
        let last = matches!(pos, Position::Last | Position::Only);
        let opcode = opcode_for(op, pos).ok_or(WcStatus::LocQpOpErr)?;
        let opcode = on_transport(opcode, self.qp_type);
        let mut bth = BthRepr::new(opcode, self.settings.dest_qpn, psn);
        bth.pkey = self.settings.pkey;
        bth.solicited = last && wr.solicited;
        bth.ack_req = self.qp_type == QpType::Rc && self.asks_for_ack(wqe, last);
        let mut ext = ExtHeaders::default();
        let dst = match wr.ud {
            Some(ud) => {
                bth.dest_qp = ud.remote_qpn;
                ext.deth = Some(DethRepr {
                    qkey: self.send_qkey(ud.remote_qkey),
                    src_qp: self.qpn,
                });
                wqe.ud_dest
            }
            None => self.peer(),
        };
        // Never `None`: RTR requires an address vector of RC and UC QPs, and posting a UD send
        // resolves its address handle.
        let dst = dst.ok_or(WcStatus::LocQpOpErr)?;
        let offset = k as usize * mtu;
        let mut payload_len = 0;
        match op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. } => {
                payload_len = (len - offset).min(mtu);
                if let (
                    SendOp::Write { remote_addr, rkey }
                    | SendOp::WriteWithImm {
                        remote_addr, rkey, ..
                    },
                    Position::First | Position::Only,
                ) = (op, pos)
                {
                    ext.reth = Some(RethRepr {
                        virtual_address: remote_addr,
                        rkey,
                        dma_len: len as u32,
                    });
                }
                if last {
                    match op {
                        SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } => {
                            ext.immdt = Some(ImmDtRepr { data: imm });
                        }
                        SendOp::SendWithInv { rkey } => ext.ieth = Some(IethRepr { rkey }),
                        _ => {}
                    }
                }
            }
            SendOp::Read { remote_addr, rkey } => {
                ext.reth = Some(RethRepr {
                    virtual_address: remote_addr + offset as u64,
                    rkey,
                    dma_len: (len - offset) as u32,
                });
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
            }
            // Refused by `opcode_for` above.
            SendOp::BindMw(_) | SendOp::LocalInv { .. } => return Err(WcStatus::LocQpOpErr),
        }
        let pd = self.pd;
        let source = match &wr.payload {
            Payload::Inline(bytes) => {
                Source::copied(&bytes[offset..offset + payload_len], ctx.pool)
            }
            Payload::Sges(sges) => {
                // Read when the packet is built, which comes before the request completes: on
                // RC at its ACK, on UC and UD as its last packet is built.
                let gathered =
                    Source::gather(&ctx.memory.read(), pd, sges, offset, payload_len, ctx.pool);
                let (source, whole) = gathered.map_err(|_: MemoryError| WcStatus::LocProtErr)?;
                if !whole {
                    ctx.counters.unmapped_accesses += 1;
                }
                source
            }
        };
        ctx.send(dst, bth, ext, payload_len, source);
        if self.qp_type != QpType::Rc {
            // Done once its last packet is built ([`Qp::last_packet_built`]).
            if let Some(queued) = ctx.out.back_mut() {
                queued.unreliable = Some(UnreliableSend {
                    qpn: self.qpn,
                    completes: last,
                });
            }
        }
        self.req.unasked = if bth.ack_req {
            0
        } else {
            self.req.unasked.saturating_add(1)
        };
        Ok(())
    }
}

impl Qp {
    /// An ACK, atomic ACK or READ response from the responder.
    pub(crate) fn on_response(
        &mut self,
        repr: &PacketRepr,
        pos: Position,
        payload: &[u8],
        ctx: &mut Ctx<'_>,
    ) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            ctx.counters.dropped_wrong_state += 1;
            return;
        }
        let psn = repr.bth.psn;
        // An answer to a PSN never sent (a "ghost" ACK) is dropped, and so is one for a PSN
        // acknowledged long ago, which the window no longer covers.
        if !psn.is_before(self.req.high_psn) {
            ctx.counters.ghost_acks += 1;
            return;
        }
        if psn - self.req.una < -(MAX_UNACKED_PSNS as i32) {
            ctx.counters.stale_responses += 1;
            return;
        }
        if !self.req.has_outstanding() {
            // Nothing to acknowledge or refuse: a late duplicate, or the answer to a keepalive
            // probe, an ACK or a NAK, which counts only as a sign of life
            // (`transport::keepalive`), never as a reason to fail.
            ctx.counters.stale_responses += 1;
            return;
        }
        let Some(aeth) = repr.ext.aeth.or_else(|| {
            // READ_RESPONSE_MIDDLE carries no AETH: it is an ACK of its own PSN.
            (repr.bth.opcode == Opcode::RcReadResponseMiddle).then_some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: Default::default(),
            })
        }) else {
            ctx.counters.dropped_malformed += 1;
            return;
        };
        match (repr.bth.opcode, aeth.syndrome) {
            (Opcode::RcAck, AckSyndrome::Ack(_)) => self.ack_through(psn, ctx),
            (Opcode::RcAck, AckSyndrome::RnrNak(timer)) => {
                ctx.counters.rnr_waits += 1;
                self.ack_through(psn - 1, ctx);
                if self.req.rnr_left == 0 {
                    self.fail_at(psn, WcStatus::RnrRetryExcErr, ctx);
                    return;
                }
                if self.settings.rnr_retry != 7 {
                    self.req.rnr_left -= 1;
                }
                self.req.rnr_until = Some(ctx.now + Duration::from_micros(timer.micros().into()));
                // The peer answered: its receive queue is empty, the connection is fine. The
                // transport timer stops for the wait (IBTA 9.7.5.2.8: an RNR NAK is not a
                // retry), and starts again with the resend; otherwise waits longer than the
                // ACK timeout would use up retry_cnt and end in RETRY_EXC_ERR.
                self.req.retry_timer = None;
                self.go_back(psn);
            }
            (Opcode::RcAck, AckSyndrome::Nak(NakCode::PsnSequenceError)) => {
                ctx.counters.naks_received += 1;
                self.ack_through(psn - 1, ctx);
                if psn == self.req.una {
                    self.retry(ctx);
                }
            }
            (Opcode::RcAck, AckSyndrome::Nak(code)) => {
                ctx.counters.naks_received += 1;
                self.ack_through(psn - 1, ctx);
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_at(psn, status, ctx);
            }
            (Opcode::RcAck, AckSyndrome::Reserved(_)) => self.fail_at(psn, WcStatus::RemOpErr, ctx),
            (Opcode::RcAtomicAck, _) => {
                let Some(orig) = repr.ext.atomic_ack_eth else {
                    return;
                };
                self.on_data_response(psn, pos, &orig.original_data.to_ne_bytes(), true, ctx);
            }
            _ => self.on_data_response(psn, pos, payload, false, ctx),
        }
        self.complete_in_order(ctx);
    }

    /// A READ response or an atomic ACK for `psn`.
    fn on_data_response(
        &mut self,
        psn: Psn,
        pos: Position,
        data: &[u8],
        atomic: bool,
        ctx: &mut Ctx<'_>,
    ) {
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            ctx.counters.ghost_acks += 1;
            return;
        };
        let wqe = &self.req.sq[idx];
        if self.req.sq.wr(idx).op.is_atomic() != atomic || !wqe.read_or_atomic {
            ctx.counters.dropped_unexpected += 1;
            return;
        }
        // A response acknowledges every packet before its request (IBTA 9.7.5.1.2).
        let first = wqe.first_psn;
        self.ack_through(first - 1, ctx);
        if psn != self.req.una {
            if self.req.una.is_before(psn) && !self.req.rewound {
                // Responses are missing: ask again from the first one not received.
                self.retry(ctx);
            } else {
                ctx.counters.stale_responses += 1;
                // The responder is still answering an earlier request, and the answer to the
                // latest may queue behind these: wait a timeout more, as rxe_comp.c pushes its
                // retry timer back on every response. Without this, a large READ from rxe over
                // a lossy link retried forever (found in the lab with read-lat -s 8M).
                self.req.retry_timer = ack_timeout(self.settings.timeout).map(|t| ctx.now + t);
            }
            return;
        }
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        let wqe = &self.req.sq[idx];
        let k = (psn - wqe.first_psn) as u32;
        let mtu = self.mtu();
        let wr = self.req.sq.wr(idx);
        let total = wr.payload.len() as usize;
        // Only the length is checked, not the position: a resumed READ is a new request whose
        // responses start again at FIRST, and a late response of the first request may still
        // arrive. Both carry the same bytes for the same PSN, since a resumed READ moves its
        // address by whole MTUs; and LAST can only fall on the final PSN either way.
        let expected_len = if atomic {
            8
        } else {
            (total - k as usize * mtu).min(mtu)
        };
        let last_ok = matches!(pos, Position::Last | Position::Only) == (k + 1 == wqe.npsn);
        if !last_ok || data.len() != expected_len {
            self.fail_wqe(idx, WcStatus::LocLenErr, ctx);
            return;
        }
        let Payload::Sges(sges) = &wr.payload else {
            return;
        };
        // Bound first, so that the table's guard is gone before the arms run.
        let scattered = scatter(&ctx.memory.read(), self.pd, sges, k as usize * mtu, data);
        match scattered {
            Ok(true) => {}
            Ok(false) => {
                self.fail_wqe(idx, WcStatus::LocLenErr, ctx);
                return;
            }
            Err(e) => {
                ctx.counters.note_unmapped(&e);
                self.fail_wqe(idx, WcStatus::LocProtErr, ctx);
                return;
            }
        }
        self.progress(psn + 1, ctx);
        let wqe = &mut self.req.sq[idx];
        if k + 1 == wqe.npsn {
            wqe.done = Some(WcStatus::Success);
        }
    }

    /// Everything up to and including `psn` is acknowledged. A READ or atomic whose PSNs are
    /// all covered without its response means the response was lost: go back to it.
    fn ack_through(&mut self, psn: Psn, ctx: &mut Ctx<'_>) {
        let mut una = self.req.una;
        let mut lost_response = false;
        for wqe in self.req.sq.iter_mut().filter(|w| w.done.is_none()) {
            if !wqe.started || psn.is_before(wqe.first_psn) {
                break;
            }
            if psn.is_before(wqe.last_psn()) {
                // Acknowledged in the middle of a multi-packet SEND or WRITE.
                if !wqe.read_or_atomic {
                    una = psn + 1;
                }
                break;
            }
            if wqe.read_or_atomic {
                lost_response = true;
                break;
            }
            wqe.done = Some(WcStatus::Success);
            una = wqe.last_psn() + 1;
        }
        if self.req.una.is_before(una) {
            self.progress(una, ctx);
        }
        if lost_response && !self.req.rewound {
            self.req.rewound = true;
            let una = self.req.una;
            self.go_back(una);
        }
    }

    /// Forward progress to `una`: the retry counters and the timer start over.
    fn progress(&mut self, una: Psn, ctx: &mut Ctx<'_>) {
        self.req.una = una;
        self.req.rewound = false;
        self.req.retry_left = self.settings.retry_cnt;
        self.req.rnr_left = self.settings.rnr_retry;
        self.req.retry_timer = if self.req.outstanding() {
            ack_timeout(self.settings.timeout).map(|t| ctx.now + t)
        } else {
            None
        };
    }

    /// Go-back-N from the oldest unacknowledged PSN, counting one retry.
    fn retry(&mut self, ctx: &mut Ctx<'_>) {
        if self.req.retry_left == 0 {
            let una = self.req.una;
            self.fail_at(una, WcStatus::RetryExcErr, ctx);
            return;
        }
        // IBTA 9.7.6.1.3: retry_cnt counts retries, 7 as well; only an rnr_retry of 7 means
        // "for ever". rxe_comp.c retries for ever at 7, so that its QPs, and those of the
        // rdma-core and perftest tools, which all ask for 7, never notice a vanished peer;
        // ConnectX gives up after 7, and so does softroce. A gap, a sequence NAK and a timeout
        // each count one, as hfi1/qib's restart_rc counts them.
        self.req.retry_left -= 1;
        self.req.rewound = true;
        let una = self.req.una;
        self.go_back(una);
        self.req.retry_timer = ack_timeout(self.settings.timeout).map(|t| ctx.now + t);
    }

    /// Points the sender at `psn`. Started requests keep their PSNs, so resending is building
    /// the same packets again; for a READ it is a new request for the responses from `psn` on.
    fn go_back(&mut self, psn: Psn) {
        let req = &mut self.req;
        match req
            .sq
            .iter()
            .position(|w| w.done.is_none() && w.contains(psn))
        {
            Some(idx) => {
                req.send_idx = idx;
                req.send_psn = psn;
            }
            None => {
                req.send_idx = req
                    .sq
                    .iter()
                    .position(|w| !w.started)
                    .unwrap_or(req.sq.len());
                req.send_psn = req.high_psn;
            }
        }
    }

    pub(crate) fn on_timer(&mut self, ctx: &mut Ctx<'_>) {
        if self.req.rnr_until.is_some_and(|t| t <= ctx.now) {
            self.req.rnr_until = None;
        }
        if self.req.retry_timer.is_some_and(|t| t <= ctx.now) {
            self.req.retry_timer = None;
            if self.req.outstanding() && self.state == QpState::Rts {
                ctx.counters.retry_timeouts += 1;
                self.retry(ctx);
            }
        }
    }

    /// The peer cannot be reached: the oldest request still outstanding fails with
    /// LOC_QP_OP_ERR, and the QP (RC) or its send queue (UC) stops.
    pub(crate) fn fail_unreachable(&mut self, ctx: &mut Ctx<'_>) {
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            let una = self.req.una;
            self.fail_at(una, WcStatus::LocQpOpErr, ctx);
        }
    }

    /// The request holding `psn` failed with `status`.
    fn fail_at(&mut self, psn: Psn, status: WcStatus, ctx: &mut Ctx<'_>) {
        let idx = self
            .req
            .sq
            .iter()
            .position(|w| w.done.is_none() && (w.contains(psn) || !w.started))
            .unwrap_or(0);
        self.fail_wqe(idx, status, ctx);
    }

    /// `sq[idx]` completes with `status`, the QP (RC) or its send queue (UC, UD) stops, and
    /// every later request is flushed.
    fn fail_wqe(&mut self, idx: usize, status: WcStatus, ctx: &mut Ctx<'_>) {
        if self.qp_type != QpType::Rc {
            self.settle_ahead_of(idx, ctx);
        }
        if let Some(wqe) = self.req.sq.get_mut(idx) {
            wqe.done = Some(status);
        }
        self.complete_in_order(ctx);
        if self.qp_type == QpType::Rc {
            self.fail(ctx);
        } else {
            self.enter_sq_error(ctx);
        }
    }

    /// UC and UD, before `sq[idx]` fails: the requests ahead of it whose packets are all
    /// queued, waiting to be built, complete now, in order, with their payload read now. The
    /// first one not wholly queued (one the pacer stopped part way, when a failure comes from
    /// elsewhere; or the failing request itself) and everything after it complete in error or
    /// flushed, and nothing of theirs is sent: a message cut short is no message.
    fn settle_ahead_of(&mut self, idx: usize, ctx: &mut Ctx<'_>) {
        let send_psn = self.req.send_psn;
        let whole = |w: &SendWqe| w.started && w.last_psn().is_before(send_psn);
        let cut = self
            .req
            .sq
            .iter()
            .take(idx)
            .find(|w| w.done.is_none() && !whole(w))
            .or(self.req.sq.get(idx))
            .filter(|w| w.started)
            .map_or(send_psn, |w| w.first_psn);
        ctx.settle_unbuilt(self.qpn, cut);
        for wqe in self.req.sq.iter_mut().take(idx) {
            if wqe.done.is_none() && whole(wqe) && wqe.last_psn().is_before(cut) {
                wqe.done = Some(WcStatus::Success);
            }
        }
    }

    /// UC and UD: the last packet of message `psn` was built, so the message is done: the
    /// oldest one started and not done, since a QP's packets are built in the order they were
    /// queued. A packet built after its QP flushed the message (a modify to ERR in between)
    /// finds a message that does not end at `psn`, and completes nothing.
    pub(crate) fn last_packet_built(&mut self, psn: Psn, ctx: &mut Ctx<'_>) {
        let sent = self
            .req
            .sq
            .iter_mut()
            .find(|w| w.started && w.done.is_none());
        if let Some(wqe) = sent.filter(|w| w.last_psn() == psn) {
            wqe.done = Some(WcStatus::Success);
            self.complete_in_order(ctx);
        }
    }

    /// Reports the finished requests at the head of the queue, in posting order.
    fn complete_in_order(&mut self, ctx: &mut Ctx<'_>) {
        // Read where they lie, then dropped there: a request is not moved out to be reported.
        let mut finished = 0;
        while finished < self.req.sq.len() {
            let (wqe, wr) = self.req.sq.entry(finished);
            let Some(status) = wqe.done else { break };
            finished += 1;
            if wr.signaled || status != WcStatus::Success {
                let mut wc = WorkCompletion::new(wr.wr_id, status, wr.op.wc_opcode(), self.qpn);
                // ibv_poll_cq(3): the send queue reports a length for READs and atomics (an
                // atomic's 8 bytes, as rxe_comp.c `make_send_cqe` does).
                if wqe.read_or_atomic {
                    wc.byte_len = wr.payload.len() as u32;
                }
                ctx.complete(self.send_cq, wc);
            }
        }
        if finished == 0 {
            return;
        }
        self.req.sq.retire_front(finished, self.max_send_wr);
        self.req.send_idx = self.req.send_idx.saturating_sub(finished);
        // One give-back for all that an ACK completed: the slots' line is shared with the
        // application's thread.
        self.retire_sends(finished);
    }
}
