//! The transport core: a deterministic, sans-IO state machine.
//!
//! An [`Endpoint`] owns the protection domains, memory regions, completion queues and queue
//! pairs of one device. It opens no socket and reads no clock. The caller feeds it:
//!
//! - `handle_datagram(now, src, icrc, bytes)`: a received UDP payload (a RoCE packet), the peer
//!   address, and what the io layer could verify of its ICRC;
//! - `handle_timeout(now)`: when `next_deadline()` has passed;
//! - the verbs: `post_send`, `post_recv`, `modify_qp`, ...
//!
//! and collects `poll_transmit()` (packets to send, without their ICRC, which depends on the
//! framing the io layer chooses), `poll_cq(cq)` (completions) and `poll_event()` (asynchronous
//! events). `now` is a `Duration` since any epoch the caller likes; only differences matter.

mod qp;
mod requester;
mod responder;
mod wr;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

pub use qp::{
    check_modify, AddressVector, AttrName, ModifyError, PathMtu, QpAttr, QpSettings, QpState,
    QpType, MAX_RD_ATOMIC,
};
pub use requester::MAX_UNACKED_PSNS;
pub use wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

use crate::memory::{Access, MemoryError, MemoryRegion, MemoryTable, PdId};
use crate::wire::{BthRepr, ExtHeaders, IcrcStatus, LKey, PacketRepr, Qpn, RocePacket, Transport};
use requester::Requester;
use responder::Responder;

/// A packet for the io layer to frame and send. Its last four bytes are the ICRC, left zero:
/// the io layer computes it for the framing it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dst: IpAddr,
    pub packet: Vec<u8>,
}

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// An event not tied to a work request (IBTA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP went to the error state.
    QpFatal { qpn: Qpn },
    /// A remote request broke the QP's or a region's access rules.
    QpAccessError { qpn: Qpn },
    /// A completion was lost because its queue was full.
    CqOverrun { cq: CqId },
}

/// Like rxe's hw_counters: what happened on the wire, including what was dropped and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub sent_packets: u64,
    pub received_packets: u64,
    pub retransmitted_packets: u64,
    pub retry_timeouts: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub sequence_errors: u64,
    pub rnr_naks_sent: u64,
    pub rnr_waits: u64,
    pub duplicate_requests: u64,
    pub icrc_errors: u64,
    pub rkey_violations: u64,
    /// Responses for PSNs never sent.
    pub ghost_acks: u64,
    /// Responses for PSNs already acknowledged (duplicates, late arrivals).
    pub stale_responses: u64,
    pub dropped_malformed: u64,
    pub dropped_unknown_qp: u64,
    pub dropped_wrong_source: u64,
    pub dropped_wrong_state: u64,
    pub dropped_bad_pkey: u64,
    pub dropped_unexpected: u64,
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = [
            ("sent_packets", self.sent_packets),
            ("received_packets", self.received_packets),
            ("retransmitted_packets", self.retransmitted_packets),
            ("retry_timeouts", self.retry_timeouts),
            ("naks_sent", self.naks_sent),
            ("naks_received", self.naks_received),
            ("sequence_errors", self.sequence_errors),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_waits", self.rnr_waits),
            ("duplicate_requests", self.duplicate_requests),
            ("icrc_errors", self.icrc_errors),
            ("rkey_violations", self.rkey_violations),
            ("ghost_acks", self.ghost_acks),
            ("stale_responses", self.stale_responses),
            ("dropped_malformed", self.dropped_malformed),
            ("dropped_unknown_qp", self.dropped_unknown_qp),
            ("dropped_wrong_source", self.dropped_wrong_source),
            ("dropped_wrong_state", self.dropped_wrong_state),
            ("dropped_bad_pkey", self.dropped_bad_pkey),
            ("dropped_unexpected", self.dropped_unexpected),
        ];
        for (name, value) in rows {
            writeln!(f, "{name:<24}{value}")?;
        }
        Ok(())
    }
}

/// Why a verb was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    UnknownQp(Qpn),
    UnknownCq(CqId),
    Modify(ModifyError),
    Memory(MemoryError),
    /// The queue already holds its configured number of requests.
    QueueFull,
    /// The QP's state does not allow this verb.
    WrongState(QpState),
    /// The request itself is malformed; the text says how.
    InvalidRequest(&'static str),
    /// The operation belongs to a QP type softroce does not run yet.
    Unsupported(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::UnknownQp(q) => write!(f, "no QP {q}"),
            VerbsError::UnknownCq(c) => write!(f, "no CQ {}", c.0),
            VerbsError::Modify(e) => e.fmt(f),
            VerbsError::Memory(e) => e.fmt(f),
            VerbsError::QueueFull => f.write_str("the queue is full"),
            VerbsError::WrongState(s) => write!(f, "not allowed in state {s:?}"),
            VerbsError::InvalidRequest(why) => write!(f, "invalid request: {why}"),
            VerbsError::Unsupported(what) => write!(f, "unsupported: {what}"),
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

/// A completion queue with a fixed capacity.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
}

/// How a QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub max_send_wr: usize,
    pub max_recv_wr: usize,
}

/// Everything a QP's packet handlers may touch besides the QP itself.
pub(crate) struct Ctx<'a> {
    pub now: Duration,
    pub memory: &'a mut MemoryTable,
    pub out: &'a mut VecDeque<Transmit>,
    pub cqs: &'a mut [CompletionQueue],
    pub events: &'a mut VecDeque<AsyncEvent>,
    pub counters: &'a mut Counters,
}

impl Ctx<'_> {
    /// Builds a packet and queues it; `fill` writes the payload in place.
    pub fn send<E>(
        &mut self,
        dst: IpAddr,
        bth: BthRepr,
        ext: ExtHeaders,
        payload_len: usize,
        fill: impl FnOnce(&MemoryTable, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let repr = PacketRepr::new(bth, ext, payload_len);
        let mut packet = vec![0u8; repr.buffer_len()];
        repr.emit(&mut packet)
            .expect("the core builds only headers its opcode requires");
        let mut view =
            RocePacket::new_checked(&mut packet[..]).expect("an emitted packet is well formed");
        fill(self.memory, view.payload_mut())?;
        self.counters.sent_packets += 1;
        self.out.push_back(Transmit { dst, packet });
        Ok(())
    }

    pub fn complete(&mut self, cq: CqId, wc: WorkCompletion) {
        let queue = &mut self.cqs[cq.0 as usize];
        if queue.entries.len() >= queue.capacity {
            self.events.push_back(AsyncEvent::CqOverrun { cq });
            return;
        }
        queue.entries.push_back(wc);
    }
}

/// One queue pair.
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub pd: PdId,
    pub state: QpState,
    pub settings: QpSettings,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub max_send_wr: usize,
    pub max_recv_wr: usize,
    pub rq: VecDeque<RecvWr>,
    pub req: Requester,
    pub resp: Responder,
}

impl Qp {
    fn peer(&self) -> Option<IpAddr> {
        self.settings.av.map(|av| av.dest)
    }

    fn mtu(&self) -> usize {
        self.settings.path_mtu.bytes()
    }

    /// Moves to the error state: every outstanding request completes with WR_FLUSH_ERR.
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        ctx.events.push_back(AsyncEvent::QpFatal { qpn: self.qpn });
        self.flush(ctx);
    }

    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        self.req.flush(self.qpn, self.send_cq, ctx);
        while let Some(wr) = self.rq.pop_front() {
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.recv_cq, wc);
        }
        self.resp.reset();
    }
}

/// How the core is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The address peers reach this endpoint at.
    pub local_addr: IpAddr,
    /// Seeds the memory keys. Give each endpoint a different, unpredictable seed in production.
    pub seed: u64,
}

/// The transport core of one device.
pub struct Endpoint {
    config: EndpointConfig,
    memory: MemoryTable,
    cqs: Vec<CompletionQueue>,
    qps: HashMap<Qpn, Qp>,
    next_qpn: u32,
    out: VecDeque<Transmit>,
    events: VecDeque<AsyncEvent>,
    counters: Counters,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_addr", &self.config.local_addr)
            .field("qps", &self.qps.len())
            .finish()
    }
}

/// Splits the endpoint into one QP and the context its handlers need.
macro_rules! qp_and_ctx {
    ($self:ident, $qpn:expr, $now:expr) => {{
        let qp = $self.qps.get_mut(&$qpn);
        let ctx = Ctx {
            now: $now,
            memory: &mut $self.memory,
            out: &mut $self.out,
            cqs: &mut $self.cqs,
            events: &mut $self.events,
            counters: &mut $self.counters,
        };
        (qp, ctx)
    }};
}

impl Endpoint {
    pub fn new(config: EndpointConfig) -> Self {
        Endpoint {
            config,
            memory: MemoryTable::new(config.seed),
            cqs: Vec::new(),
            qps: HashMap::new(),
            // QP0 and QP1 are the special QPs; connected QPs start above them.
            next_qpn: 0x11,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    pub fn local_addr(&self) -> IpAddr {
        self.config.local_addr
    }

    pub fn alloc_pd(&mut self) -> PdId {
        self.memory.alloc_pd()
    }

    /// Registers a zeroed region of `len` bytes that peers address from `iova`.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        self.memory.register(pd, iova, len, access)
    }

    pub fn dereg_mr(&mut self, lkey: LKey) -> Result<(), MemoryError> {
        self.memory.deregister(lkey)
    }

    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        self.cqs.push(CompletionQueue {
            entries: VecDeque::new(),
            capacity,
        });
        CqId(self.cqs.len() as u32 - 1)
    }

    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        for cq in [init.send_cq, init.recv_cq] {
            if cq.0 as usize >= self.cqs.len() {
                return Err(VerbsError::UnknownCq(cq));
            }
        }
        if init.qp_type != QpType::Rc {
            return Err(VerbsError::Unsupported("UC and UD queue pairs"));
        }
        let qpn = Qpn::new(self.next_qpn);
        self.next_qpn += 1;
        self.qps.insert(
            qpn,
            Qp {
                qpn,
                qp_type: init.qp_type,
                pd: init.pd,
                state: QpState::Reset,
                settings: QpSettings::default(),
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                max_send_wr: init.max_send_wr,
                max_recv_wr: init.max_recv_wr,
                rq: VecDeque::new(),
                req: Requester::default(),
                resp: Responder::default(),
            },
        );
        Ok(qpn)
    }

    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn).map(|qp| qp.state)
    }

    /// `ibv_modify_qp`: checks the transition and its attributes, then applies them.
    pub fn modify_qp(&mut self, now: Duration, qpn: Qpn, attr: &QpAttr) -> Result<(), VerbsError> {
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        let to = check_modify(qp.qp_type, qp.state, attr)?;
        qp.settings.apply(attr);
        if let Some(psn) = attr.rq_psn {
            qp.resp.start(psn);
        }
        if let Some(psn) = attr.sq_psn {
            qp.req.start(psn, &qp.settings);
        }
        match to {
            QpState::Error => qp.enter_error(&mut ctx),
            QpState::Reset => {
                qp.flush(&mut ctx);
                qp.state = QpState::Reset;
            }
            _ => {
                qp.state = to;
                if to == QpState::Rts {
                    qp.pump(&mut ctx);
                }
            }
        }
        Ok(())
    }

    pub fn post_send(&mut self, now: Duration, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        qp.post_send(wr, &mut ctx)
    }

    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::UnknownQp(qpn))?;
        match qp.state {
            QpState::Reset => return Err(VerbsError::WrongState(qp.state)),
            QpState::Error => {
                let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
                let queue = &mut self.cqs[qp.recv_cq.0 as usize];
                queue.entries.push_back(wc);
                return Ok(());
            }
            _ => {}
        }
        if qp.rq.len() >= qp.max_recv_wr {
            return Err(VerbsError::QueueFull);
        }
        qp.rq.push_back(wr);
        Ok(())
    }

    /// A received RoCE packet (the UDP payload) from `src`.
    pub fn handle_datagram(&mut self, now: Duration, src: IpAddr, icrc: IcrcStatus, bytes: &[u8]) {
        self.counters.received_packets += 1;
        if let IcrcStatus::Bad { .. } = icrc {
            // The ICRC is the only integrity check: nothing of a bad packet is looked at.
            self.counters.icrc_errors += 1;
            return;
        }
        let Ok(packet) = RocePacket::new_checked(bytes) else {
            self.counters.dropped_malformed += 1;
            return;
        };
        let Ok(repr) = PacketRepr::parse(&packet) else {
            self.counters.dropped_malformed += 1;
            return;
        };
        let qpn = repr.bth.dest_qp;
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let Some(qp) = qp else {
            ctx.counters.dropped_unknown_qp += 1;
            return;
        };
        if packet.info().transport != Transport::Rc || qp.qp_type != QpType::Rc {
            ctx.counters.dropped_unexpected += 1;
            return;
        }
        if repr.bth.pkey != qp.settings.pkey {
            ctx.counters.dropped_bad_pkey += 1;
            return;
        }
        // rxe drops RC packets whose source is not the connected peer (rxe_recv.c check_addr).
        if qp.peer() != Some(src) {
            ctx.counters.dropped_wrong_source += 1;
            return;
        }
        let payload = packet.payload();
        if matches!(
            repr.bth.opcode,
            crate::wire::Opcode::RcAck
                | crate::wire::Opcode::RcAtomicAck
                | crate::wire::Opcode::RcReadResponseFirst
                | crate::wire::Opcode::RcReadResponseMiddle
                | crate::wire::Opcode::RcReadResponseLast
                | crate::wire::Opcode::RcReadResponseOnly
        ) {
            qp.on_response(&repr, packet.info().position, payload, &mut ctx);
        } else {
            qp.on_request(src, &repr, packet.info().position, payload, &mut ctx);
        }
        qp.pump(&mut ctx);
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        let qpns: Vec<Qpn> = self.qps.keys().copied().collect();
        for qpn in qpns {
            let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
            if let Some(qp) = qp {
                qp.on_timer(&mut ctx);
                qp.pump(&mut ctx);
            }
        }
    }

    /// The earliest time `handle_timeout` has work to do.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.qps.values().filter_map(|qp| qp.req.deadline()).min()
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    pub fn poll_cq(&mut self, cq: CqId) -> Option<WorkCompletion> {
        self.cqs.get_mut(cq.0 as usize)?.entries.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}
