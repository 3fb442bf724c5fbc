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
//! and collects `poll_transmit()` (packets to send, without their ICRC, which depends on the
//! framing the io layer chooses), `poll_cq(cq)` (completions) and `poll_event()` (asynchronous
//! events). `now` is a `Duration` since any epoch the caller likes; only differences matter.

mod datagram;
mod qp;
mod requester;
mod responder;
mod srq;
mod wr;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

pub use datagram::{Datagram, GRH_LEN};
pub use qp::{
    check_modify, connect_steps, AddressVector, AttrName, ConnectOptions, ModifyError, PathMtu,
    QpAttr, QpSettings, QpState, QpType, Remote, MAX_RD_ATOMIC,
};
pub use requester::MAX_UNACKED_PSNS;
pub use srq::{SrqAttr, SrqId, SrqModify};
pub use wr::{Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion};

use crate::memory::{Access, MemoryError, MemoryRegion, MemoryTable, PdId};
use crate::wire::{
    BthRepr, ExtHeaders, IcrcStatus, LKey, Opcode, PacketRepr, QKey, Qpn, RocePacket, Transport,
};
use requester::Requester;
use responder::Responder;
use srq::SharedRq;

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

/// An address handle (`ibv_create_ah`): where UD sends go, from [`Endpoint::create_ah`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressHandle(u32);

/// An event not tied to a work request (IBTA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP went to the error state.
    QpFatal { qpn: Qpn },
    /// A remote request broke the QP's or a region's access rules.
    QpAccessError { qpn: Qpn },
    /// A completion was lost because its queue was full.
    CqOverrun { cq: CqId },
    /// Fewer requests than its armed limit are left on a shared receive queue; the limit is
    /// now disarmed.
    SrqLimitReached { srq: SrqId },
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
    /// UD packets whose DETH Q_Key is not the QP's (rxe: the port's qkey_viol_cntr).
    pub qkey_violations: u64,
    pub dropped_unexpected: u64,
    /// UC and UD messages the responder dropped without a word, having no NAK: a PSN gap, no
    /// receive request, or a failed length, rkey or access check.
    pub dropped_messages: u64,
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
            ("qkey_violations", self.qkey_violations),
            ("dropped_unexpected", self.dropped_unexpected),
            ("dropped_messages", self.dropped_messages),
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
    UnknownSrq(SrqId),
    UnknownAh(AddressHandle),
    Modify(ModifyError),
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

/// A completion queue with a fixed capacity.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    /// False once destroyed: the slot waits in `free_cqs` for the next CQ.
    live: bool,
}

/// How a QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub max_send_wr: usize,
    /// Ignored by [`Endpoint::create_qp_with_srq`].
    pub max_recv_wr: usize,
}

/// Everything a QP's packet handlers may touch besides the QP itself.
pub(crate) struct Ctx<'a> {
    pub now: Duration,
    pub memory: &'a mut MemoryTable,
    pub out: &'a mut VecDeque<Transmit>,
    /// Packet buffers the io layer has handed back, reused before allocating.
    pub pool: &'a mut Vec<Vec<u8>>,
    pub cqs: &'a mut [CompletionQueue],
    pub srqs: &'a mut [SharedRq],
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
        let mut packet = self.pool.pop().unwrap_or_default();
        packet.clear();
        packet.resize(repr.buffer_len(), 0);
        repr.emit(&mut packet)
            .expect("the core builds only headers its opcode requires");
        let mut view =
            RocePacket::new_checked(&mut packet[..]).expect("an emitted packet is well formed");
        if let Err(e) = fill(self.memory, view.payload_mut()) {
            self.pool.push(packet);
            return Err(e);
        }
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
    pub srq: Option<SrqId>,
    pub req: Requester,
    pub resp: Responder,
}

impl Qp {
    fn peer(&self) -> Option<IpAddr> {
        self.settings.av.map(|av| av.dest)
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

    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWr> {
        match self.srq {
            Some(id) => ctx.srqs[id.0 as usize].take(id, ctx.events),
            None => self.rq.pop_front(),
        }
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

    /// UC and UD: a send completed in error stops the send queue only (IBTA 10.3.1, the SQE
    /// state): the rest of it is flushed, the receive side carries on, and a modify to RTS
    /// resumes sending.
    pub fn enter_sq_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Sqe;
        self.req.flush(self.qpn, self.send_cq, ctx);
    }

    /// Completes every request with WR_FLUSH_ERR: the send queue, the receive request of a
    /// message half received (even one taken from an SRQ, as rxe_resp.c `check_resource`
    /// does), then the QP's own receive queue. An SRQ's requests stay for its other QPs.
    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        self.req.flush(self.qpn, self.send_cq, ctx);
        let half_received = self.resp.reset();
        for wr in half_received.into_iter().chain(self.rq.drain(..)) {
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            ctx.complete(self.recv_cq, wc);
        }
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

/// How the core is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The address peers reach this endpoint at.
    pub local_addr: IpAddr,
    /// Seeds the memory keys. Give each endpoint a different, unpredictable seed in production.
    pub seed: u64,
}

/// A port's MTU until [`Endpoint::set_port_mtu`]: rxe's active MTU on a 1500-byte Ethernet
/// link, the MTU of every UD fixture here.
pub const DEFAULT_PORT_MTU: PathMtu = PathMtu::Mtu1024;

/// The first QP number handed out, as in rxe (its fixtures here show QPs 0x11 and 0x12). QPNs 0
/// and 1 belong to the special QPs and 0xFFFFFF means multicast, so regular QPs never get them;
/// numbers are not reused, as no QP is destroyed yet.
const FIRST_QPN: u32 = 0x11;
/// Responses (READ response packets and the replies queued behind them) built per QP each
/// time the transmit queue runs dry.
const READ_RESPONSE_BATCH: usize = 64;
/// Packet buffers kept for reuse.
const PACKET_POOL: usize = 1024;

/// The transport core of one device.
pub struct Endpoint {
    config: EndpointConfig,
    memory: MemoryTable,
    /// The largest UD message (IBTA C10-93.1.1).
    port_mtu: PathMtu,
    cqs: Vec<CompletionQueue>,
    /// Slots of destroyed CQs, reused first.
    free_cqs: Vec<CqId>,
    srqs: Vec<SharedRq>,
    /// Each address handle's protection domain and destination.
    /// Indexed by handle; `None` where one was destroyed, its slot in `free_ahs`.
    ahs: Vec<Option<(PdId, AddressVector)>>,
    free_ahs: Vec<AddressHandle>,
    qps: HashMap<Qpn, Qp>,
    next_qpn: u32,
    out: VecDeque<Transmit>,
    pool: Vec<Vec<u8>>,
    /// The latest time seen, for work done while the io layer drains transmits.
    last_now: Duration,
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
        $self.last_now = $self.last_now.max($now);
        let qp = $self.qps.get_mut(&$qpn);
        let ctx = Ctx {
            now: $now,
            memory: &mut $self.memory,
            out: &mut $self.out,
            pool: &mut $self.pool,
            cqs: &mut $self.cqs,
            srqs: &mut $self.srqs,
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
            port_mtu: DEFAULT_PORT_MTU,
            cqs: Vec::new(),
            free_cqs: Vec::new(),
            srqs: Vec::new(),
            ahs: Vec::new(),
            free_ahs: Vec::new(),
            qps: HashMap::new(),
            next_qpn: FIRST_QPN,
            out: VecDeque::new(),
            pool: Vec::new(),
            last_now: Duration::ZERO,
            events: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    pub fn local_addr(&self) -> IpAddr {
        self.config.local_addr
    }

    /// Sets the port's MTU, which bounds UD messages; 1024 until set. The engine sets it when
    /// the device opens, from the link under its address by default (`PathMtu::of_link`), as
    /// rxe follows its netdev's MTU (rxe_net.c, `NETDEV_CHANGEMTU`).
    pub fn set_port_mtu(&mut self, mtu: PathMtu) {
        self.port_mtu = mtu;
        for qp in self.qps.values_mut().filter(|qp| qp.qp_type == QpType::Ud) {
            qp.settings.path_mtu = mtu;
        }
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
        let cq = CompletionQueue {
            entries: VecDeque::new(),
            capacity,
            live: true,
        };
        // A long-running process creates and destroys CQs without end: slots are reused, so
        // that the table stays as large as the most CQs alive at once.
        match self.free_cqs.pop() {
            Some(id) => {
                self.cqs[id.0 as usize] = cq;
                id
            }
            None => {
                self.cqs.push(cq);
                CqId(self.cqs.len() as u32 - 1)
            }
        }
    }

    /// `ibv_destroy_cq`: refused while a QP still completes into it, as libibverbs refuses
    /// with EBUSY. Completions not yet polled are discarded.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !self.cqs.get(cq.0 as usize).is_some_and(|q| q.live) {
            return Err(VerbsError::UnknownCq(cq));
        }
        if self
            .qps
            .values()
            .any(|qp| qp.send_cq == cq || qp.recv_cq == cq)
        {
            return Err(VerbsError::InvalidRequest("a QP still uses the CQ"));
        }
        self.cqs[cq.0 as usize] = CompletionQueue {
            entries: VecDeque::new(),
            capacity: 0,
            live: false,
        };
        self.free_cqs.push(cq);
        Ok(())
    }

    /// Creates an RC, UC or UD QP. Its number is never 0 or 1, the special QPs' (see
    /// [`create_gsi_qp`](Self::create_gsi_qp)).
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        self.create(init, None)
    }

    /// `ibv_create_qp` with an SRQ: the QP takes its receive requests from `srq`, which must
    /// belong to the same protection domain, and has no receive queue of its own.
    pub fn create_qp_with_srq(&mut self, init: QpInit, srq: SrqId) -> Result<Qpn, VerbsError> {
        self.create(init, Some(srq))
    }

    fn create(&mut self, init: QpInit, srq: Option<SrqId>) -> Result<Qpn, VerbsError> {
        self.check_init(&init, srq)?;
        let qpn = Qpn::try_new(self.next_qpn)
            .ok()
            .filter(|&q| q != Qpn::MULTICAST)
            .ok_or(VerbsError::OutOfResources("every QP number is taken"))?;
        self.next_qpn += 1;
        self.insert_qp(qpn, init, srq);
        Ok(qpn)
    }

    /// Creates QP1, the general services QP that connection management talks to: a UD QP whose
    /// Q_Key is fixed at 0x80010000, sent whatever the work request says and required of every
    /// packet received (rxe_req.c, rxe_recv.c). There is one per device. QP0, the subnet
    /// management QP, has no use on RoCE and is never created: packets to it are dropped.
    pub fn create_gsi_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidRequest("the GSI QP is a UD QP"));
        }
        if self.qps.contains_key(&Qpn::GSI) {
            return Err(VerbsError::InvalidRequest("the GSI QP exists already"));
        }
        self.check_init(&init, None)?;
        self.insert_qp(Qpn::GSI, init, None);
        Ok(Qpn::GSI)
    }

    fn check_init(&self, init: &QpInit, srq: Option<SrqId>) -> Result<(), VerbsError> {
        for cq in [init.send_cq, init.recv_cq] {
            if !self.cqs.get(cq.0 as usize).is_some_and(|q| q.live) {
                return Err(VerbsError::UnknownCq(cq));
            }
        }
        if let Some(id) = srq {
            let srq = self
                .srqs
                .get(id.0 as usize)
                .ok_or(VerbsError::UnknownSrq(id))?;
            // The scatter of a message checks its receive buffers against one protection domain,
            // which is then both the QP's (as rxe does) and the SRQ's (as IBTA has it).
            if srq.pd != init.pd {
                return Err(VerbsError::InvalidRequest(
                    "an SRQ serves QPs of its own protection domain",
                ));
            }
        }
        Ok(())
    }

    fn insert_qp(&mut self, qpn: Qpn, init: QpInit, srq: Option<SrqId>) {
        let mut settings = QpSettings::default();
        if init.qp_type == QpType::Ud {
            settings.path_mtu = self.port_mtu;
        }
        self.qps.insert(
            qpn,
            Qp {
                qpn,
                qp_type: init.qp_type,
                pd: init.pd,
                state: QpState::Reset,
                settings,
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                max_send_wr: init.max_send_wr,
                max_recv_wr: init.max_recv_wr,
                rq: VecDeque::new(),
                srq,
                req: Requester::default(),
                resp: Responder::default(),
            },
        );
    }

    /// `ibv_create_srq`. A non-zero `srq_limit` arms the limit event at once, as in rxe.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId, VerbsError> {
        self.srqs.push(SharedRq::new(pd, attr)?);
        Ok(SrqId(self.srqs.len() as u32 - 1))
    }

    /// `ibv_modify_srq`: resizes the queue or arms its limit.
    pub fn modify_srq(&mut self, srq: SrqId, change: &SrqModify) -> Result<(), VerbsError> {
        self.srq_mut(srq)?.modify(change)
    }

    /// `ibv_query_srq`: the limit reads 0 once the event has fired.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, VerbsError> {
        self.srqs
            .get(srq.0 as usize)
            .map(SharedRq::attr)
            .ok_or(VerbsError::UnknownSrq(srq))
    }

    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), VerbsError> {
        self.srq_mut(srq)?.post(wr)
    }

    fn srq_mut(&mut self, srq: SrqId) -> Result<&mut SharedRq, VerbsError> {
        self.srqs
            .get_mut(srq.0 as usize)
            .ok_or(VerbsError::UnknownSrq(srq))
    }

    /// `ibv_create_ah`: a destination for UD sends from QPs of `pd`.
    pub fn create_ah(&mut self, pd: PdId, av: AddressVector) -> AddressHandle {
        match self.free_ahs.pop() {
            Some(ah) => {
                self.ahs[ah.0 as usize] = Some((pd, av));
                ah
            }
            None => {
                self.ahs.push(Some((pd, av)));
                AddressHandle(self.ahs.len() as u32 - 1)
            }
        }
    }

    /// `ibv_destroy_ah`. A UD send already posted keeps its destination: it was copied then.
    pub fn destroy_ah(&mut self, ah: AddressHandle) -> Result<(), VerbsError> {
        let slot = self
            .ahs
            .get_mut(ah.0 as usize)
            .filter(|slot| slot.is_some())
            .ok_or(VerbsError::UnknownAh(ah))?;
        *slot = None;
        self.free_ahs.push(ah);
        Ok(())
    }

    /// How many more send requests the QP takes now, so that a caller queueing posts can hand
    /// over only what fits instead of losing a request to `QueueFull`.
    pub fn send_queue_room(&self, qpn: Qpn) -> usize {
        self.qps.get(&qpn).map_or(0, |qp| {
            qp.max_send_wr.saturating_sub(qp.req.outstanding_wrs())
        })
    }

    /// The same for receive requests.
    pub fn recv_queue_room(&self, qpn: Qpn) -> usize {
        self.qps
            .get(&qpn)
            .map_or(0, |qp| qp.max_recv_wr.saturating_sub(qp.rq.len()))
    }

    /// Destroys a QP: its outstanding requests complete with WR_FLUSH_ERR, and its QPN is free.
    pub fn destroy_qp(&mut self, now: Duration, qpn: Qpn) -> Result<(), VerbsError> {
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        qp.flush(&mut ctx);
        self.qps.remove(&qpn);
        // A QP's end is when the regions it used are most likely let go of.
        self.memory.release_dropped();
        Ok(())
    }

    /// The send and receive completion queues of a QP.
    pub fn qp_cqs(&self, qpn: Qpn) -> Option<(CqId, CqId)> {
        self.qps.get(&qpn).map(|qp| (qp.send_cq, qp.recv_cq))
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
        let ud_dest = self.resolve_ud(qpn, &wr)?;
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        qp.post_send(wr, ud_dest, &mut ctx)
    }

    /// The destination address of a UD send, copied from its address handle when it is posted
    /// (as rxe copies the address vector into the send WQE); `None` for connected QPs.
    fn resolve_ud(&self, qpn: Qpn, wr: &SendWr) -> Result<Option<IpAddr>, VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::UnknownQp(qpn))?;
        match (qp.qp_type, wr.ud) {
            (QpType::Ud, Some(ud)) => {
                let &(pd, av) = self
                    .ahs
                    .get(ud.ah.0 as usize)
                    .and_then(Option::as_ref)
                    .ok_or(VerbsError::UnknownAh(ud.ah))?;
                if pd != qp.pd {
                    return Err(VerbsError::InvalidRequest(
                        "the address handle belongs to another protection domain",
                    ));
                }
                Ok(Some(av.dest))
            }
            (QpType::Ud, None) => Err(VerbsError::InvalidRequest(
                "a UD send names its destination in `ud`",
            )),
            (_, Some(_)) => Err(VerbsError::InvalidRequest(
                "only a UD send takes a `ud` destination",
            )),
            (_, None) => Ok(None),
        }
    }

    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::UnknownQp(qpn))?;
        if qp.srq.is_some() {
            return Err(VerbsError::InvalidRequest(
                "the QP takes its receive requests from an SRQ",
            ));
        }
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

    /// A RoCE packet (the UDP payload) from `src`, received on a UDP socket bound to
    /// `local_addr`: the IP header UD receivers see is synthesised (see [`Datagram`]), and the
    /// source port is taken to be 4791.
    pub fn handle_datagram(&mut self, now: Duration, src: IpAddr, icrc: IcrcStatus, bytes: &[u8]) {
        let datagram = Datagram {
            src,
            src_port: crate::wire::ROCEV2_UDP_PORT,
            dst: self.config.local_addr,
            ip_header: None,
            icrc,
            packet: bytes,
        };
        self.handle_received(now, datagram);
    }

    /// A received datagram, with what the io layer knows of it. Every drop is counted in
    /// [`Counters`].
    pub fn handle_received(&mut self, now: Duration, datagram: Datagram<'_>) {
        self.counters.received_packets += 1;
        if let IcrcStatus::Bad { .. } = datagram.icrc {
            // The ICRC is the only integrity check: nothing of a bad packet is looked at.
            self.counters.icrc_errors += 1;
            return;
        }
        if !datagram.ip_header_fits() {
            self.counters.dropped_malformed += 1;
            return;
        }
        let Ok(packet) = RocePacket::new_checked(datagram.packet) else {
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
        let transport = match qp.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        if packet.info().transport != transport {
            ctx.counters.dropped_unexpected += 1;
            return;
        }
        if repr.bth.pkey != qp.settings.pkey {
            ctx.counters.dropped_bad_pkey += 1;
            return;
        }
        if qp.qp_type == QpType::Ud {
            // rxe_recv.c check_keys. UD is not connected: any source may send.
            if repr.ext.deth.map(|d| d.qkey) != Some(qp.qkey()) {
                ctx.counters.qkey_violations += 1;
                return;
            }
        } else if qp.peer() != Some(datagram.src) {
            // rxe drops RC and UC packets whose source is not the connected peer (rxe_recv.c
            // check_addr).
            ctx.counters.dropped_wrong_source += 1;
            return;
        }
        let payload = packet.payload();
        if matches!(
            repr.bth.opcode,
            Opcode::RcAck
                | Opcode::RcAtomicAck
                | Opcode::RcReadResponseFirst
                | Opcode::RcReadResponseMiddle
                | Opcode::RcReadResponseLast
                | Opcode::RcReadResponseOnly
        ) {
            qp.on_response(&repr, packet.info().position, payload, &mut ctx);
        } else {
            qp.on_request(&datagram, &repr, packet.info().position, payload, &mut ctx);
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

    /// The next packet to send. READ responses are built here, a batch at a time, as the
    /// queue empties: a peer's 2 GiB READ costs a batch of buffers, not 2 GiB of them.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.out.is_empty() {
            let now = self.last_now;
            let qpns: Vec<Qpn> = self
                .qps
                .iter()
                .filter(|(_, qp)| qp.resp.has_pending_responses())
                .map(|(&qpn, _)| qpn)
                .collect();
            for qpn in qpns {
                let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
                if let Some(qp) = qp {
                    qp.continue_responses(READ_RESPONSE_BATCH, &mut ctx);
                }
            }
        }
        self.out.pop_front()
    }

    /// Whether `poll_transmit` has more to give: packets queued or READ responses to build.
    pub fn has_transmits(&self) -> bool {
        !self.out.is_empty() || self.qps.values().any(|qp| qp.resp.has_pending_responses())
    }

    /// Hands a sent packet's buffer back for reuse, so that the hot path does not allocate.
    pub fn recycle(&mut self, packet: Vec<u8>) {
        if self.pool.len() < PACKET_POOL {
            self.pool.push(packet);
        }
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

    /// How many objects are alive: a long-running process watches these stay level.
    pub fn resources(&self) -> Resources {
        Resources {
            qps: self.qps.len(),
            cqs: self.cqs.iter().filter(|cq| cq.live).count(),
            regions: self.memory.regions(),
            srqs: self.srqs.len(),
            address_handles: self.ahs.iter().flatten().count(),
        }
    }
}

/// The objects an [`Endpoint`] holds at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub qps: usize,
    pub cqs: usize,
    pub regions: usize,
    /// SRQs live as long as the endpoint: they have no destroy verb yet.
    pub srqs: usize,
    pub address_handles: usize,
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "qps {} cqs {} regions {} srqs {} address_handles {}",
            self.qps, self.cqs, self.regions, self.srqs, self.address_handles
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn endpoint() -> (Endpoint, QpInit) {
        let mut ep = Endpoint::new(EndpointConfig {
            local_addr: Ipv4Addr::LOCALHOST.into(),
            seed: 1,
        });
        let init = QpInit {
            qp_type: QpType::Ud,
            pd: ep.alloc_pd(),
            send_cq: ep.create_cq(4),
            recv_cq: ep.create_cq(4),
            max_send_wr: 4,
            max_recv_wr: 4,
        };
        (ep, init)
    }

    #[test]
    fn uc_and_ud_opcodes_name_the_rc_operation() {
        for &op in Opcode::SUPPORTED {
            let qp_type = match op.info().unwrap().transport {
                Transport::Uc => QpType::Uc,
                Transport::Ud => QpType::Ud,
                _ => continue,
            };
            let rc = operation(op);
            // "UC_SEND_FIRST" and "RC_SEND_FIRST": the same operation after the prefix.
            assert_eq!(rc.name()[3..], op.name()[3..], "{op}");
            assert_eq!(on_transport(rc, qp_type), op);
        }
    }

    #[test]
    fn qp_numbers_skip_the_special_qps_and_run_out_before_multicast() {
        let (mut ep, init) = endpoint();
        let first = ep.create_qp(init).unwrap();
        assert!(first.value() > 1, "{first}");
        assert_eq!(ep.create_gsi_qp(init), Ok(Qpn::GSI));
        assert!(ep.create_gsi_qp(init).is_err(), "one GSI QP per device");
        let rc = QpInit {
            qp_type: QpType::Rc,
            ..init
        };
        assert!(ep.create_gsi_qp(rc).is_err(), "the GSI QP is a UD QP");
        ep.next_qpn = Qpn::MULTICAST.value() - 1;
        assert_eq!(ep.create_qp(init), Ok(Qpn::new(0xff_fffe)));
        assert_eq!(
            ep.create_qp(init),
            Err(VerbsError::OutOfResources("every QP number is taken"))
        );
    }

    #[test]
    fn a_cq_outlives_its_qps_and_its_slot_is_reused() {
        let (mut ep, init) = endpoint();
        let qpn = ep.create_qp(init).unwrap();
        // libibverbs' EBUSY: a CQ a QP completes into stays.
        assert!(ep.destroy_cq(init.send_cq).is_err());
        ep.destroy_qp(Duration::ZERO, qpn).unwrap();
        ep.destroy_cq(init.send_cq).unwrap();
        assert_eq!(
            ep.destroy_cq(init.send_cq),
            Err(VerbsError::UnknownCq(init.send_cq))
        );
        assert_eq!(
            ep.create_qp(init),
            Err(VerbsError::UnknownCq(init.send_cq)),
            "a QP cannot complete into a destroyed CQ"
        );
        assert_eq!(ep.resources().cqs, 1);
        assert_eq!(
            ep.create_cq(8),
            init.send_cq,
            "the free slot is taken first"
        );
        assert_eq!(ep.resources().cqs, 2);
    }

    #[test]
    fn a_destroyed_address_handle_names_nothing_and_its_slot_is_reused() {
        let (mut ep, init) = endpoint();
        let av = AddressVector {
            dest: Ipv4Addr::new(10, 0, 0, 2).into(),
        };
        let ah = ep.create_ah(init.pd, av);
        ep.destroy_ah(ah).unwrap();
        assert_eq!(ep.destroy_ah(ah), Err(VerbsError::UnknownAh(ah)));
        assert_eq!(ep.resources().address_handles, 0);
        assert_eq!(
            ep.create_ah(init.pd, av),
            ah,
            "the free slot is taken first"
        );
        assert_eq!(ep.resources().address_handles, 1);
    }
}
