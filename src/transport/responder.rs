//! The responder: validation, SEND and RDMA WRITE into memory, and receive completions for
//! every transport; for RC also the expected PSN, duplicates, RNR, NAKs, READ and atomics.
//!
//! UC and UD have no NAK. A UC or UD message that fails a check is dropped and counted
//! (`dropped_messages`); a UC responder then ignores packets until the next FIRST or ONLY, which
//! starts over whatever its PSN (rxe_resp.c `check_psn`, `drop_msg`). UD checks no PSN. Only a
//! fault in this side's own receive buffers moves a UC or UD QP to the error state.
//!
//! READs and atomics take a responder resource (IBTA 9.7.5.1.3, rxe_resp.c `resources`): a ring
//! of the last `max_dest_rd_atomic` of them. A READ's keeps its request (rkey, range) and no
//! memory: a duplicate is answered from that ring only, within its original range and rkey, and
//! only if that key still grants the range now; one that matches nothing is dropped and
//! counted, one whose key no longer grants it is NAKed as a new READ would be. A new READ or
//! atomic beyond the negotiated depth (more than `max_dest_rd_atomic` still being answered)
//! gets NAK invalid request. RESET and ERROR clear the whole responder, and only a QP in a
//! state that responds builds responses.
//!
//! A READ's response packets are built as the transmit queue drains, and each looks its key
//! up again as it is built (rxe_resp.c `rxe_recheck_mr`): once a deregistration or an
//! invalidation has returned, no packet carries a byte of that memory. The packet whose check
//! fails is replaced by NAK remote access error at its PSN, and the QP fails, as rxe's
//! `RESPST_ERR_RKEY_VIOLATION` does ([`Qp::read_revoked`]).
//!
//! A zero-length RDMA WRITE or READ is executed without looking at its address or rkey (IBTA
//! C9-88, rxe_resp.c `check_rkey`): a zero-byte WRITE with immediate is a common notification.
//!
//! Facts from IBTA 9.7 and 9.8 and the kernel's rxe_resp.c; the code is our own.

use std::collections::VecDeque;

use super::outgoing::{RemoteRead, Source};
use super::requester::scatter;
use super::work_queue::{Place, WorkQueue};
use super::wr::{RecvWr, WcOpcode, WcStatus, WorkCompletion};
use super::{operation, AsyncEvent, Ctx, Datagram, Qp, QpState, QpType, GRH_LEN};
use crate::memory::{Access, MemoryError, MemoryTable, Span};
use crate::wire::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, BthRepr, ExtHeaders, Msn, NakCode, Opcode, PacketRepr,
    Position, Psn, Qpn, RethRepr,
};

/// The message being received, between its first and last packets.
#[derive(Debug)]
enum InMessage {
    Send {
        recv: Recv,
        received: usize,
    },
    /// The RETH stays with the message: each packet's part is checked again as it lands.
    Write {
        reth: RethRepr,
        received: usize,
    },
}

/// The receive request a message lands in.
#[derive(Debug)]
pub(super) enum Recv {
    /// The head of the QP's own receive queue, read where its post wrote it; it leaves the
    /// queue when the message completes.
    Head,
    /// One taken from the QP's SRQ, which other QPs share.
    Shared(RecvWr),
}

impl Recv {
    /// The request, given the QP's own receive queue.
    fn wr<'a>(&'a self, rq: &'a RecvQueue) -> &'a RecvWr {
        match self {
            Recv::Head => rq.wr(0),
            Recv::Shared(wr) => wr,
        }
    }
}

/// A QP's own receive queue: its requests where the posts wrote them, consumed in order.
pub(super) type RecvQueue = WorkQueue<RecvWr, Place>;

/// The responder half of a QP.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// The PSN expected next.
    epsn: Psn,
    /// Completed messages, carried in every AETH.
    msn: Msn,
    /// A NAK (sequence or RNR) was sent; later packets are dropped silently until the expected
    /// PSN arrives, so that one gap costs one NAK.
    nak_sent: bool,
    /// UC: the message in progress was dropped; so is every packet up to the next FIRST or ONLY.
    dropping: bool,
    message: Option<InMessage>,
    /// The responder resources: the last `max_dest_rd_atomic` READs and atomics executed, which
    /// duplicates are answered from.
    resources: VecDeque<Resource>,
    /// Responses not yet sent, in PSN order. RC requires responses in the order of their
    /// requests; a READ's responses are built lazily, so anything decided after it waits here.
    /// It holds at most `max_dest_rd_atomic` first executions (`rd_atomic_room`), as many
    /// replays (`duplicate_read`), and `MAX_QUEUED_REPLIES` replies.
    queue: VecDeque<Response>,
}

/// A READ or atomic the responder executed, kept for its duplicates.
#[derive(Debug, Clone)]
enum Resource {
    Read(ReadResource),
    Atomic { psn: Psn, original: u64 },
}

/// A READ as it was accepted: its request, not its memory, which a duplicate must be granted
/// again.
#[derive(Debug, Clone)]
struct ReadResource {
    first: Psn,
    /// Its response packets, cut at `mtu`.
    count: u32,
    mtu: usize,
    /// The request: address, rkey and length.
    reth: RethRepr,
    msn: Msn,
}

/// Whether `psn` is one of the `count` PSNs from `first`.
fn within_psns(psn: Psn, first: Psn, count: u32) -> bool {
    let k = psn - first;
    k >= 0 && (k as u32) < count
}

impl ReadResource {
    fn contains(&self, psn: Psn) -> bool {
        within_psns(psn, self.first, self.count)
    }

    /// The responses to `repeated`, a duplicate of this READ from `psn`: if it names this
    /// READ's rkey, lies within its range, and its responses end within its PSNs. Whether the
    /// key still grants that range is for the caller to ask the memory table.
    fn replay(&self, psn: Psn, repeated: &RethRepr) -> Option<ReadStream> {
        if repeated.rkey != self.reth.rkey {
            return None;
        }
        let offset = repeated
            .virtual_address
            .checked_sub(self.reth.virtual_address)?;
        let end = offset.checked_add(repeated.dma_len.into())?;
        if end > self.reth.dma_len.into() {
            return None;
        }
        let count = repeated.dma_len.div_ceil(self.mtu as u32).max(1);
        let k = (psn - self.first) as u32;
        if k + count > self.count {
            return None;
        }
        Some(ReadStream {
            first: psn,
            reth: *repeated,
            mtu: self.mtu,
            next: 0,
            count,
            msn: self.msn,
            fresh: false,
        })
    }
}

/// A response the responder has decided on.
#[derive(Debug, Clone)]
enum Response {
    /// An ACK, NAK or atomic ACK.
    Reply {
        opcode: Opcode,
        psn: Psn,
        aeth: AethRepr,
        atomic: Option<u64>,
        /// See [`ReadStream::fresh`].
        fresh: bool,
    },
    /// A READ's response stream.
    Read(ReadStream),
}

impl Response {
    /// Whether it answers the first execution of a READ or an atomic, and so holds one of the
    /// `max_dest_rd_atomic` responder resources until it is sent.
    fn holds_resource(&self) -> bool {
        match self {
            Response::Read(read) => read.fresh,
            Response::Reply { atomic, fresh, .. } => atomic.is_some() && *fresh,
        }
    }
}

/// A READ being answered: its responses are built as the transmit queue drains, at the MTU of
/// the moment it was accepted, each from the range of its request, through its rkey, checked
/// again as the packet is built ([`Source::Remote`]). It holds no memory: a deregistration or
/// invalidation cuts it short at the next packet.
#[derive(Debug, Clone)]
struct ReadStream {
    first: Psn,
    /// What it reads: address, rkey and length.
    reth: RethRepr,
    mtu: usize,
    /// The next response packet to build, and how many there are.
    next: u32,
    count: u32,
    /// The MSN the responses carry.
    msn: Msn,
    /// The request's first execution, not the replay of a duplicate: a requester that re-asks
    /// for responses it lost still counts the request as one of its outstanding READs, while a
    /// network duplicate of a request it has completed is not outstanding at all, so only first
    /// executions count against the negotiated depth.
    fresh: bool,
}

/// Replies queued behind READ responses. A peer that keeps asking for ACKs while a long READ is
/// answered loses the excess; ACKs are cumulative, so the next one covers it.
const MAX_QUEUED_REPLIES: usize = 1024;

impl Responder {
    /// Whether READ responses, or replies queued behind them, are left to build.
    pub fn has_pending_responses(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The PSN expected next (`ibv_query_qp`'s `rq_psn`).
    pub fn expected_psn(&self) -> Psn {
        self.epsn
    }

    /// Expects `rq_psn` next (from the modify that sets it).
    pub fn start(&mut self, rq_psn: Psn) {
        self.epsn = rq_psn;
    }

    /// Forgets everything: the message in progress, the expected PSN and MSN, the responder
    /// resources and the responses not yet sent (RESET and ERROR, IBTA 10.3.1). Returns the
    /// receive request of a message half received if it took one from an SRQ; one of the QP's
    /// own queue is still that queue's head, and flushed with it.
    pub fn reset(&mut self) -> Option<RecvWr> {
        match std::mem::take(self).message {
            Some(InMessage::Send {
                recv: Recv::Shared(wr),
                ..
            }) => Some(wr),
            // One from the QP's own queue is still its head, flushed with the queue.
            _ => None,
        }
    }
}

/// What a failed request asks of the responder.
struct Failure {
    nak: NakCode,
    /// The receive request consumed by the failed message, and its status.
    recv_status: WcStatus,
    access_event: bool,
    /// The fault is in this side's own receive buffers, not in the request: fatal to the QP on
    /// every transport, where a bad UC or UD request only loses its message.
    local: bool,
}

/// `op` is an RC opcode, or the RC opcode of a UC or UD operation ([`operation`]).
fn is_send(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcSendFirst
            | Opcode::RcSendMiddle
            | Opcode::RcSendLast
            | Opcode::RcSendLastImm
            | Opcode::RcSendLastInv
            | Opcode::RcSendOnly
            | Opcode::RcSendOnlyImm
            | Opcode::RcSendOnlyInv
    )
}

fn is_write(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcWriteFirst
            | Opcode::RcWriteMiddle
            | Opcode::RcWriteLast
            | Opcode::RcWriteLastImm
            | Opcode::RcWriteOnly
            | Opcode::RcWriteOnlyImm
    )
}

fn from_memory(e: MemoryError) -> Failure {
    let nak = match e {
        // A misaligned atomic is an invalid request; everything else an access error.
        MemoryError::Misaligned { .. } => NakCode::InvalidRequest,
        _ => NakCode::RemoteAccessError,
    };
    Failure {
        nak,
        recv_status: WcStatus::LocProtErr,
        access_event: true,
        local: false,
    }
}

/// The message does not fit its receive buffers.
fn too_long() -> Failure {
    Failure {
        nak: NakCode::InvalidRequest,
        recv_status: WcStatus::LocLenErr,
        access_event: false,
        local: false,
    }
}

/// A receive buffer names memory this side cannot write (rxe_resp.c: class A, fatal).
fn local_memory() -> Failure {
    Failure {
        nak: NakCode::RemoteOperationalError,
        recv_status: WcStatus::LocProtErr,
        access_event: false,
        local: true,
    }
}

fn invalid_request() -> Failure {
    Failure {
        nak: NakCode::InvalidRequest,
        recv_status: WcStatus::RemInvReqErr,
        access_event: false,
        local: false,
    }
}

impl Qp {
    /// Sends an ACK, NAK or atomic ACK now, or queues it behind READ responses still to go.
    fn reply(
        &mut self,
        ctx: &mut Ctx<'_>,
        opcode: Opcode,
        psn: Psn,
        syndrome: AckSyndrome,
        atomic: Option<u64>,
        fresh: bool,
    ) {
        let aeth = AethRepr {
            syndrome,
            msn: self.resp.msn,
        };
        if self.resp.queue.is_empty() {
            self.emit_reply(ctx, opcode, psn, aeth, atomic);
        } else if self.resp.queue.len() < MAX_QUEUED_REPLIES + usize::from(super::MAX_RD_ATOMIC) {
            self.resp.queue.push_back(Response::Reply {
                opcode,
                psn,
                aeth,
                atomic,
                fresh,
            });
        }
    }

    fn emit_reply(
        &self,
        ctx: &mut Ctx<'_>,
        opcode: Opcode,
        psn: Psn,
        aeth: AethRepr,
        atomic: Option<u64>,
    ) {
        let Some(dst) = self.peer() else { return };
        let mut bth = BthRepr::new(opcode, self.settings.dest_qpn, psn);
        bth.pkey = self.settings.pkey;
        if opcode == Opcode::RcAck && matches!(aeth.syndrome, AckSyndrome::Ack(_)) {
            ctx.send_ack(dst, bth, aeth);
            return;
        }
        let ext = ExtHeaders {
            aeth: Some(aeth),
            atomic_ack_eth: atomic.map(|original_data| AtomicAckEthRepr { original_data }),
            ..Default::default()
        };
        ctx.send(dst, bth, ext, 0, Source::Empty);
    }

    fn ack(&mut self, ctx: &mut Ctx<'_>, psn: Psn) {
        self.reply(
            ctx,
            Opcode::RcAck,
            psn,
            AckSyndrome::ACK_NO_CREDITS,
            None,
            false,
        );
    }

    fn nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, syndrome: AckSyndrome) {
        ctx.counters.naks_sent += 1;
        self.reply(ctx, Opcode::RcAck, psn, syndrome, None, false);
    }

    /// A request packet.
    pub(crate) fn on_request(
        &mut self,
        datagram: &Datagram<'_>,
        repr: &PacketRepr,
        pos: Position,
        payload: &[u8],
        ctx: &mut Ctx<'_>,
    ) {
        // IBTA 10.3.1: the receive side works from RTR on, and on through SQD and SQE.
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.dropped_wrong_state += 1;
            return;
        }
        if self.qp_type == QpType::Rc {
            self.on_rc_request(datagram, repr, pos, payload, ctx);
            return;
        }
        if self.qp_type == QpType::Uc && !self.uc_in_sequence(repr.bth.psn, pos, ctx) {
            return;
        }
        match self.execute(datagram, repr, pos, payload, ctx) {
            Ok(()) => {}
            Err(failure) if failure.local => self.fail_request(repr.bth.psn, failure, ctx),
            Err(failure) => self.drop_message(failure.recv_status, ctx),
        }
    }

    /// UC's PSN rule (rxe_resp.c `check_psn`): a gap loses the message it cuts, and a FIRST or
    /// ONLY packet starts over at its own PSN. Returns whether the packet is to be executed.
    ///
    /// The FIRST or ONLY that ends a damaged message is executed: rxe's `do_class_d1e_error`
    /// says "this packet may be the start of a new message and could be valid", but then drops
    /// it, and so loses the next message as well; softroce delivers it.
    fn uc_in_sequence(&mut self, psn: Psn, pos: Position, ctx: &mut Ctx<'_>) -> bool {
        if psn != self.resp.epsn && !self.resp.dropping {
            ctx.counters.sequence_errors += 1;
            self.drop_message(WcStatus::RemInvReqErr, ctx);
        }
        if self.resp.dropping {
            if !matches!(pos, Position::First | Position::Only) {
                return false;
            }
            self.resp.dropping = false;
        }
        true
    }

    fn on_rc_request(
        &mut self,
        datagram: &Datagram<'_>,
        repr: &PacketRepr,
        pos: Position,
        payload: &[u8],
        ctx: &mut Ctx<'_>,
    ) {
        let psn = repr.bth.psn;
        let distance = psn - self.resp.epsn;
        if distance < 0 {
            ctx.counters.duplicate_requests += 1;
            self.on_duplicate(repr, ctx);
            return;
        }
        if distance > 0 {
            ctx.counters.sequence_errors += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let epsn = self.resp.epsn;
                self.nak(ctx, epsn, AckSyndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        self.resp.nak_sent = false;
        if let Err(failure) = self.execute(datagram, repr, pos, payload, ctx) {
            self.fail_request(psn, failure, ctx);
        }
    }

    /// UC and UD: drops the message in progress, and counts it. Its receive request is used
    /// again for the next message when it came from the QP's own queue (rxe_resp.c
    /// `do_class_d1e_error`, class D1: "reset the recv wr to its original state"); one taken
    /// from an SRQ completes with `status` (class E), since others may have taken requests
    /// posted after it.
    fn drop_message(&mut self, status: WcStatus, ctx: &mut Ctx<'_>) {
        ctx.counters.dropped_messages += 1;
        self.resp.dropping = self.qp_type == QpType::Uc;
        // One from the QP's own queue stays its head, for the next message.
        if let Some(InMessage::Send {
            recv: Recv::Shared(wr),
            ..
        }) = self.resp.message.take()
        {
            let wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, self.qpn);
            ctx.complete(self.recv_cq, wc);
        }
    }

    /// Runs an in-sequence request.
    fn execute(
        &mut self,
        datagram: &Datagram<'_>,
        repr: &PacketRepr,
        pos: Position,
        payload: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Failure> {
        let op = operation(repr.bth.opcode);
        let psn = repr.bth.psn;
        let mtu = self.mtu();
        // The opcode sequence (IBTA 9.7.5.1.1): FIRST opens a message, MIDDLE and LAST continue
        // one of the same kind, ONLY and the single-packet requests stand alone.
        let continues = matches!(pos, Position::Middle | Position::Last);
        let sequence_ok = match (&self.resp.message, continues) {
            (None, false) => true,
            (Some(InMessage::Send { .. }), true) => is_send(op),
            (Some(InMessage::Write { .. }), true) => is_write(op),
            _ => false,
        };
        // FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one (IBTA C9-88, C9-89).
        let length_ok = match pos {
            Position::First | Position::Middle => payload.len() == mtu,
            Position::Last | Position::Only => payload.len() <= mtu,
        };
        if !sequence_ok || !length_ok {
            return Err(invalid_request());
        }
        let needs = |access: Access| {
            if self.settings.access.contains(access) {
                Ok(())
            } else {
                // rxe_resp.c answers an operation the QP does not allow with NAK 0x61.
                Err(invalid_request())
            }
        };
        // A SEND takes a receive request at its first packet, a WRITE with immediate at its
        // last; without one the responder is not ready: RC answers RNR NAK (IBTA 9.7.5.2.8),
        // UC and UD drop the message (rxe_resp.c: class D).
        let takes_recv = (is_send(op) && !continues)
            || op == Opcode::RcWriteOnlyImm
            || op == Opcode::RcWriteLastImm;
        if takes_recv && !self.has_recv(ctx) {
            return match self.qp_type {
                QpType::Rc => self.rnr(psn, ctx),
                QpType::Uc | QpType::Ud => Err(invalid_request()),
            };
        }
        if is_send(op) {
            if !continues {
                let recv = self.take_recv(ctx).expect("checked above");
                self.resp.message = Some(InMessage::Send { recv, received: 0 });
            }
            let Some(InMessage::Send { recv, received }) = &mut self.resp.message else {
                unreachable!("a SEND continues a SEND")
            };
            let wr = recv.wr(&self.rq);
            if self.qp_type == QpType::Ud {
                // The buffer starts with the 40 bytes verbs reserve for the GRH (see
                // `datagram`); they count in the completion's byte_len.
                // Bound first, so that the table's guard is gone before the arms run.
                let grh = scatter(&ctx.memory.read(), self.pd, &wr.sges, 0, &datagram.grh());
                match grh {
                    Ok(true) => *received = GRH_LEN,
                    Ok(false) => return Err(too_long()),
                    Err(e) => {
                        ctx.counters.note_unmapped(&e);
                        return Err(local_memory());
                    }
                }
            }
            let scattered = scatter(&ctx.memory.read(), self.pd, &wr.sges, *received, payload);
            match scattered {
                Ok(true) => *received += payload.len(),
                Ok(false) => return Err(too_long()),
                Err(e) => {
                    ctx.counters.note_unmapped(&e);
                    return Err(local_memory());
                }
            }
            if matches!(pos, Position::Last | Position::Only) {
                let Some(InMessage::Send { recv, received }) = self.resp.message.take() else {
                    unreachable!()
                };
                let wr_id = recv.wr(&self.rq).wr_id;
                let mut wc =
                    WorkCompletion::new(wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
                wc.byte_len = received as u32;
                wc.grh = self.qp_type == QpType::Ud;
                wc.imm_data = repr.ext.immdt.map(|i| i.data);
                wc.solicited = repr.bth.solicited;
                if let Some(ieth) = repr.ext.ieth {
                    // Only a type 2 window bound through this QP can be invalidated by its peer
                    // (rxe_resp.c `invalidate_rkey`): a region, or another QP's window, gets
                    // NAK invalid request and stays as it was.
                    let me = (self.pd, self.qpn);
                    if ctx.memory.write().invalidate(ieth.rkey, me, true).is_err() {
                        self.resp.message = Some(InMessage::Send { recv, received });
                        return Err(invalid_request());
                    }
                    wc.invalidated_rkey = Some(ieth.rkey);
                }
                wc.src_qp = Some(self.source_qpn(repr));
                wc.src_addr = Some(datagram.src);
                self.finish_message();
                ctx.complete(self.recv_cq, wc);
                self.recv_done(recv);
            }
            self.advance(repr, ctx);
            return Ok(());
        }
        if is_write(op) {
            needs(Access::REMOTE_WRITE)?;
            // The packet's bytes land under the same look at the table as its check, so that a
            // deregistration (or invalidation) that has returned keeps every byte out.
            let table = ctx.memory.read();
            let violations = &mut ctx.counters.rkey_violations;
            let (reth, received, whole) = match repr.ext.reth {
                // The whole range is checked when the message starts; a zero-length WRITE
                // names no memory, so neither its address nor its rkey is looked at (C9-88)...
                Some(reth) => {
                    let whole = match reth.dma_len {
                        0 => None,
                        len => {
                            Some(self.check_write(&table, violations, &reth, 0, len as usize)?)
                        }
                    };
                    self.resp.message = Some(InMessage::Write { reth, received: 0 });
                    (reth, 0, whole)
                }
                None => match self.resp.message {
                    Some(InMessage::Write { reth, received }) => (reth, received, None),
                    _ => return Err(invalid_request()),
                },
            };
            if received + payload.len() > reth.dma_len as usize {
                return Err(invalid_request());
            }
            // ...and each later packet's part again, so that deregistering the region (or
            // invalidating its rkey) stops a message already in flight. The first packet's
            // part lies in the range just checked.
            if !payload.is_empty() {
                let len = payload.len();
                let part = match whole {
                    // Within the range: `received` is 0 and the length was bounded above.
                    Some(whole) => whole.slice(0, len).ok_or_else(invalid_request)?,
                    None => self.check_write(&table, violations, &reth, received, len)?,
                };
                let written = part.write(0, payload);
                written
                    .inspect_err(|e| ctx.counters.note_unmapped(e))
                    .map_err(from_memory)?;
            }
            drop(table);
            let received = received + payload.len();
            self.resp.message = Some(InMessage::Write { reth, received });
            if matches!(pos, Position::Last | Position::Only) {
                self.resp.message = None;
                if received != reth.dma_len as usize {
                    // The message carried less than its RETH announced.
                    return Err(invalid_request());
                }
                if let Some(imm) = repr.ext.immdt {
                    let recv = self.take_recv(ctx).expect("checked above");
                    let mut wc = WorkCompletion::new(
                        recv.wr(&self.rq).wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        self.qpn,
                    );
                    wc.byte_len = received as u32;
                    wc.imm_data = Some(imm.data);
                    wc.solicited = repr.bth.solicited;
                    wc.src_qp = Some(self.source_qpn(repr));
                    wc.src_addr = Some(datagram.src);
                    self.finish_message();
                    ctx.complete(self.recv_cq, wc);
                    self.recv_done(recv);
                } else {
                    ctx.counters.remote_accesses += 1;
                    self.finish_message();
                }
            }
            self.advance(repr, ctx);
            return Ok(());
        }
        match op {
            Opcode::RcReadRequest => {
                needs(Access::REMOTE_READ)?;
                let reth = repr.ext.reth.ok_or_else(invalid_request)?;
                self.rd_atomic_room()?;
                self.check_read(ctx, &reth)?;
                self.finish_message();
                let count = reth.dma_len.div_ceil(mtu as u32).max(1);
                let read = ReadResource {
                    first: psn,
                    count,
                    mtu,
                    reth,
                    msn: self.resp.msn,
                };
                self.resp.queue.push_back(Response::Read(ReadStream {
                    first: psn,
                    reth,
                    mtu,
                    next: 0,
                    count,
                    msn: read.msn,
                    fresh: true,
                }));
                self.remember(Resource::Read(read));
                self.resp.epsn = psn + count;
                ctx.counters.remote_accesses += 1;
                Ok(())
            }
            Opcode::RcCompareSwap | Opcode::RcFetchAdd => {
                needs(Access::REMOTE_ATOMIC)?;
                let eth = repr.ext.atomic_eth.ok_or_else(invalid_request)?;
                self.rd_atomic_room()?;
                let table = ctx.memory.read();
                let span = table
                    .check_atomic(eth.rkey, (self.pd, self.qpn), eth.virtual_address)
                    .inspect_err(|_| ctx.counters.rkey_violations += 1)
                    .map_err(from_memory)?;
                let original = if op == Opcode::RcFetchAdd {
                    span.fetch_add(eth.swap_add)
                } else {
                    span.compare_swap(eth.compare, eth.swap_add)
                };
                drop(table);
                let original = original
                    .inspect_err(|e| ctx.counters.note_unmapped(e))
                    .map_err(from_memory)?;
                self.remember(Resource::Atomic { psn, original });
                self.finish_message();
                self.atomic_ack(psn, original, true, ctx);
                self.resp.epsn = psn + 1;
                ctx.counters.remote_accesses += 1;
                Ok(())
            }
            _ => Err(invalid_request()),
        }
    }

    /// Whether a new READ or atomic may start: fewer than `max_dest_rd_atomic` are still being
    /// answered. A requester keeps at most its `max_rd_atomic` outstanding, which may not exceed
    /// the responder's, so one that sends more breaks the negotiated depth: NAK invalid request
    /// (IBTA 9.7.5.1.3; rxe_resp.c `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`).
    fn rd_atomic_room(&self) -> Result<(), Failure> {
        let depth = usize::from(self.settings.max_dest_rd_atomic);
        let answering = self
            .resp
            .queue
            .iter()
            .filter(|r| r.holds_resource())
            .count();
        if answering >= depth {
            return Err(invalid_request());
        }
        Ok(())
    }

    /// Keeps a READ or atomic in the resource ring, forgetting the oldest beyond its depth.
    fn remember(&mut self, resource: Resource) {
        let depth = usize::from(self.settings.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= depth {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(resource);
    }

    /// Checks `len` bytes at `offset` into a WRITE's RETH range for remote write in `table`;
    /// a refusal counts in `violations`.
    fn check_write<'t>(
        &self,
        table: &'t MemoryTable,
        violations: &mut u64,
        reth: &RethRepr,
        offset: usize,
        len: usize,
    ) -> Result<Span<'t>, Failure> {
        let addr = reth.virtual_address.wrapping_add(offset as u64);
        table
            .check_remote(
                reth.rkey,
                (self.pd, self.qpn),
                addr,
                len,
                Access::REMOTE_WRITE,
            )
            .inspect_err(|_| *violations += 1)
            .map_err(from_memory)
    }

    fn rnr(&mut self, psn: Psn, ctx: &mut Ctx<'_>) -> Result<(), Failure> {
        ctx.counters.rnr_naks_sent += 1;
        self.resp.nak_sent = true;
        let timer = self.settings.min_rnr_timer;
        self.nak(ctx, psn, AckSyndrome::RnrNak(timer));
        Ok(())
    }

    fn finish_message(&mut self) {
        self.resp.msn = self.resp.msn.next();
    }

    /// The sender's QPN: the DETH's on UD, the connected peer's otherwise.
    fn source_qpn(&self, repr: &PacketRepr) -> Qpn {
        repr.ext
            .deth
            .map_or(self.settings.dest_qpn, |deth| deth.src_qp)
    }

    /// The next PSN is expected; on RC, ACK if the requester asked (only RC acknowledges).
    fn advance(&mut self, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        self.resp.epsn = repr.bth.psn + 1;
        if repr.bth.ack_req && self.qp_type == QpType::Rc {
            self.ack(ctx, repr.bth.psn);
        }
    }

    fn atomic_ack(&mut self, psn: Psn, orig: u64, fresh: bool, ctx: &mut Ctx<'_>) {
        let ack = AckSyndrome::ACK_NO_CREDITS;
        self.reply(ctx, Opcode::RcAtomicAck, psn, ack, Some(orig), fresh);
    }

    /// Whether `reth`'s rkey grants its whole range for remote read now. A zero-length READ
    /// names no memory, and is granted without a look at its address or rkey (C9-88).
    fn check_read(&self, ctx: &mut Ctx<'_>, reth: &RethRepr) -> Result<(), Failure> {
        if reth.dma_len == 0 {
            return Ok(());
        }
        ctx.memory
            .read()
            .check_remote(
                reth.rkey,
                (self.pd, self.qpn),
                reth.virtual_address,
                reth.dma_len as usize,
                Access::REMOTE_READ,
            )
            .inspect_err(|_| ctx.counters.rkey_violations += 1)
            .map(drop)
            .map_err(from_memory)
    }

    /// Whether the QP's state lets its responder send: RTR on, through SQD and SQE (IBTA
    /// 10.3.1). In RESET and ERROR nothing is answered, and nothing queued goes out.
    fn responds(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Sends up to `budget` queued responses, in order: replies as they were decided, and READ
    /// response packets built now.
    pub(crate) fn continue_responses(&mut self, budget: usize, ctx: &mut Ctx<'_>) {
        if !self.responds() {
            self.resp.queue.clear();
            return;
        }
        for _ in 0..budget {
            match self.resp.queue.front_mut() {
                None => return,
                Some(Response::Read(read)) if read.next + 1 < read.count => {
                    let k = read.next;
                    read.next += 1;
                    let read = read.clone();
                    self.read_response(&read, k, ctx);
                }
                Some(_) => match self.resp.queue.pop_front() {
                    Some(Response::Read(read)) => {
                        let k = read.next;
                        self.read_response(&read, k, ctx);
                    }
                    Some(Response::Reply {
                        opcode,
                        psn,
                        aeth,
                        atomic,
                        ..
                    }) => self.emit_reply(ctx, opcode, psn, aeth, atomic),
                    None => return,
                },
            }
        }
    }

    /// Queues response packet `k` of `read`, cut at the MTU the READ was accepted at; its
    /// payload is read, if its key still grants it, when the packet is built.
    fn read_response(&self, read: &ReadStream, k: u32, ctx: &mut Ctx<'_>) {
        let Some(dst) = self.peer() else { return };
        let at = k as usize * read.mtu;
        let len = read.reth.dma_len as usize;
        let chunk = len.saturating_sub(at).min(read.mtu);
        let opcode = match (k == 0, k + 1 == read.count) {
            (true, true) => Opcode::RcReadResponseOnly,
            (true, false) => Opcode::RcReadResponseFirst,
            (false, true) => Opcode::RcReadResponseLast,
            (false, false) => Opcode::RcReadResponseMiddle,
        };
        let ext = ExtHeaders {
            aeth: (opcode != Opcode::RcReadResponseMiddle).then_some(AethRepr {
                syndrome: AckSyndrome::ACK_NO_CREDITS,
                msn: read.msn,
            }),
            ..Default::default()
        };
        let mut bth = BthRepr::new(opcode, self.settings.dest_qpn, read.first + k);
        bth.pkey = self.settings.pkey;
        let payload = match chunk {
            0 => Source::Empty,
            _ => Source::Remote(RemoteRead {
                rkey: read.reth.rkey,
                pd: self.pd,
                qpn: self.qpn,
                addr: read.reth.virtual_address.wrapping_add(at as u64),
                len: chunk,
            }),
        };
        ctx.send(dst, bth, ext, chunk, payload);
    }

    /// A response packet of this QP, for `psn`, was withheld as it was built: its rkey no
    /// longer grants the memory (`error`), deregistered or invalidated since the READ was
    /// accepted. As rxe answers a failed `rxe_recheck_mr` (`RESPST_ERR_RKEY_VIOLATION`, class
    /// C): NAK remote access error at that PSN, in the withheld packet's place, and the QP
    /// fails. The requester's READ completes with REM_ACCESS_ERR at once rather than after
    /// its retries run out. Returns whether it did: the NAK is then the last packet queued.
    pub(crate) fn read_revoked(&mut self, psn: Psn, error: MemoryError, ctx: &mut Ctx<'_>) -> bool {
        // Memory the program took away is counted where it was found (`withhold`).
        if !matches!(error, MemoryError::Unmapped { .. }) {
            ctx.counters.rkey_violations += 1;
        }
        let responds = self.responds();
        if responds {
            self.nak_and_fail(psn, &from_memory(error), ctx);
        }
        responds
    }

    /// A request whose PSN was already executed (IBTA 9.7.5.1.3).
    fn on_duplicate(&mut self, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        let psn = repr.bth.psn;
        match repr.bth.opcode {
            // Read the memory again, as granted the first time: the response went missing.
            Opcode::RcReadRequest => {
                if let Some(reth) = repr.ext.reth {
                    self.duplicate_read(psn, reth, ctx);
                }
            }
            // Never execute an atomic twice: answer with its first result.
            Opcode::RcCompareSwap | Opcode::RcFetchAdd => {
                let original = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, original } if p == psn => Some(original),
                    _ => None,
                });
                match original {
                    Some(original) => self.atomic_ack(psn, original, false, ctx),
                    None => ctx.counters.unmatched_duplicates += 1,
                }
            }
            // SEND and WRITE: acknowledge everything received so far.
            _ => {
                let last = self.resp.epsn - 1;
                self.ack(ctx, last);
            }
        }
    }

    /// A duplicate READ from `psn`: answered only if a READ in the resource ring holds `psn`,
    /// the QP still grants remote read, and the repeated request asks for part of what the
    /// original was granted, with its rkey (rxe_resp.c `duplicate_request`). Anything else is
    /// dropped and counted: a "duplicate" may not reach memory its original did not.
    ///
    /// The key is then checked again, as for a new READ: a region deregistered or a window
    /// invalidated since is NAKed with remote access error and the QP fails, as rxe's
    /// `rxe_recheck_mr` does; dropping it instead would leave the requester to retry until
    /// its retries ran out and report RETRY_EXC_ERR for what is an access error.
    ///
    /// Its responses replace those of the same READ still queued, and whatever was queued from
    /// `psn` on; at most `max_dest_rd_atomic` replays are queued at once, and one more is
    /// dropped and counted, so a peer that repeats parts of a large READ at rising PSNs adds
    /// no stream per repeat.
    fn duplicate_read(&mut self, psn: Psn, reth: RethRepr, ctx: &mut Ctx<'_>) {
        let found = self
            .settings
            .access
            .contains(Access::REMOTE_READ)
            .then(|| {
                self.resp.resources.iter().find_map(|r| match r {
                    Resource::Read(read) if read.contains(psn) => {
                        Some((read.first, read.count, read.replay(psn, &reth)?))
                    }
                    _ => None,
                })
            })
            .flatten();
        let Some((first, count, stream)) = found else {
            ctx.counters.unmatched_duplicates += 1;
            return;
        };
        if let Err(failure) = self.check_read(ctx, &stream.reth) {
            self.nak_and_fail(psn, &failure, ctx);
            return;
        }
        self.resp.queue.retain(|r| match r {
            Response::Read(read) => !within_psns(read.first, first, count) && read.first - psn < 0,
            Response::Reply { .. } => true,
        });
        let replays = self
            .resp
            .queue
            .iter()
            .filter(|r| matches!(r, Response::Read(read) if !read.fresh))
            .count();
        if replays >= usize::from(self.settings.max_dest_rd_atomic.max(1)) {
            ctx.counters.dropped_read_replays += 1;
            return;
        }
        self.resp.queue.push_back(Response::Read(stream));
    }

    /// NAKs a failed request (RC only: UC and UD have no NAK), completes its receive request in
    /// error, and moves to the error state (IBTA 9.7.5.2.3 onwards: these errors are fatal to
    /// the QP).
    ///
    /// The NAK goes out at once: the QP is about to stop answering, and responses still queued
    /// for earlier READs and atomics are dropped with it. The requester then sees the NAK
    /// acknowledge those requests without their data, and its QP fails in turn.
    fn fail_request(&mut self, psn: Psn, failure: Failure, ctx: &mut Ctx<'_>) {
        if let Some(InMessage::Send { recv, .. }) = self.resp.message.take() {
            let wr_id = recv.wr(&self.rq).wr_id;
            let wc = WorkCompletion::new(wr_id, failure.recv_status, WcOpcode::Recv, self.qpn);
            ctx.complete(self.recv_cq, wc);
            self.recv_done(recv);
        }
        self.nak_and_fail(psn, &failure, ctx);
    }

    /// The part of [`fail_request`](Self::fail_request) for a READ, which takes no receive
    /// request (a repeated one, or one whose responses are being built): a SEND half received
    /// meanwhile is not at fault, and is flushed with the QP.
    fn nak_and_fail(&mut self, psn: Psn, failure: &Failure, ctx: &mut Ctx<'_>) {
        if self.qp_type == QpType::Rc {
            self.resp.queue.clear();
            self.nak(ctx, psn, AckSyndrome::Nak(failure.nak));
        }
        if failure.access_event {
            ctx.events
                .push_back(AsyncEvent::QpAccessError { qpn: self.qpn });
        }
        self.fail(ctx);
    }
}
