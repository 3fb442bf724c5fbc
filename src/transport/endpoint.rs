//! [`Endpoint`]: one device's transport state, the verbs on it, and the turn of the crank the
//! io layer drives (packets in, timers, packets out, completions and events). The types and the
//! per-turn context its queue pairs share are the module's (`transport/mod.rs`).

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use rustc_hash::FxHashSet;
use smallvec::SmallVec;

use super::cq::{self, CompletionQueue};
use super::keepalive::{Keepalive, MIN_INTERVAL as MIN_KEEPALIVE};
use super::outgoing::{Queued, Revoked, UnreliableSend};
use super::requester::{Requester, SendChecks};
use super::responder::RecvQueue;
use super::responder::Responder;
use super::srq::SharedRq;
use super::{
    check_modify, AddressHandle, AddressVector, AsyncEvent, AttrName, CongestionConfig,
    CongestionStatus, Counters, CqId, Ctx, Datagram, Lane, ModifyError, PathMtu, Qp, QpAttr,
    QpInit, QpSettings, QpState, QpType, QpnLedger, QueueSlots, RecvWr, SendWr, SrqAttr, SrqId,
    SrqModify, Transmit, VerbsError, WcOpcode, WcStatus, WorkCompletion, MAX_PACKET_LEN,
    MAX_TOUCHED,
};
use crate::keyed::KeyedTable;
use crate::memory::{Access, DeviceMemory, ForeignMemory, MemoryError, MemoryRegion, MwType, PdId};
use crate::wire::{IcrcStatus, LKey, Opcode, PacketRepr, Psn, Qpn, RKey, RocePacket, Transport};

/// How the core is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The address peers reach this endpoint at.
    pub local_addr: IpAddr,
    /// Seeds the memory keys and the QP numbers. Give each endpoint a different, unpredictable
    /// seed in production.
    pub seed: u64,
    /// Which of the device's engines this endpoint is, and so which QP numbers it draws.
    pub lane: Lane,
    /// CNPs for CE marks, and DCQCN for CNPs: on by default, as on ConnectX.
    pub congestion: CongestionConfig,
}

/// A port's MTU until [`Endpoint::set_port_mtu`]: rxe's active MTU on a 1500-byte Ethernet
/// link, the MTU of every UD fixture here.
pub const DEFAULT_PORT_MTU: PathMtu = PathMtu::Mtu1024;

/// QP numbers are drawn at random from 2 to 0xFFFFFE: 0 and 1 belong to the special QPs and
/// 0xFFFFFF means multicast. A number is kept if its top bits name a free slot of the QP table
/// (`crate::keyed`), other than QP1's (so never one below 2^(24 - the table's slot bits): at
/// first, 1/64 of the range), and the QP is then found by index. A number is free again once its QP is destroyed, so a long-running
/// process never runs out, and a peer cannot guess the next QP's number from its own. A stale
/// packet for a destroyed QP reaches a new one only if the draw repeats its number, one chance
/// in 16 million, and then still needs that QP's peer address, P_Key and expected PSN.
const QPN_RANGE: std::ops::RangeInclusive<u32> = 2..=0xff_fffe;
/// How far past its end [`Endpoint::create_ah_at`] grows the address handle table at once.
pub const MAX_AH_GROWTH: usize = 1 << 16;
/// At most this many draws find a free QP number before the table counts as full.
const QPN_DRAWS: usize = 64;
/// Responses (READ response packets and the replies queued behind them) built per QP each
/// time the transmit queue runs dry.
const READ_RESPONSE_BATCH: usize = 64;

/// The transport core of one device.
pub struct Endpoint {
    config: EndpointConfig,
    memory: DeviceMemory,
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
    /// By number, found by index ([`KeyedTable`]).
    qps: KeyedTable<Qp>,
    /// The QPs with a timer armed or responses left to build, as of their last handling: the
    /// only ones the work of every engine turn (`next_deadline`, `handle_timeout`,
    /// `poll_transmit`) looks at, so that a QP with nothing to do costs nothing a turn.
    active: FxHashSet<Qpn>,
    /// QPs handled since `active` was last brought up to date ([`Endpoint::settle`]).
    touched: Vec<Qpn>,
    /// The [`Summary`] of `active` and `touched` from the last look, `None` once a QP has been
    /// handled since: a turn that handles no QP (most of a poll loop's, or a busy poll's) asks
    /// for its next deadline and for responses to build without walking the set.
    summary: Cell<Option<Summary>>,
    /// The QPs a timeout or `poll_transmit` works on, kept for its capacity: no allocation a
    /// turn.
    due: Vec<Qpn>,
    /// Draws QP numbers; seeded from the endpoint's seed, so the simulator stays repeatable.
    rng: ChaCha20Rng,
    out: VecDeque<Queued>,
    /// Plain ACKs held back from `out` until released ([`Endpoint::hold_acks`]).
    held_acks: VecDeque<Queued>,
    /// Buffers of copied payloads, reused.
    pool: Vec<Vec<u8>>,
    /// The latest time seen, for work done while the io layer drains transmits.
    last_now: Duration,
    events: VecDeque<AsyncEvent>,
    counters: Counters,
    /// CQs that overran, whose QPs are yet to be put in error.
    overrun: Vec<CqId>,
    /// The QPs with keepalive ([`Endpoint::set_keepalive`]), and when they are next looked
    /// at: every quarter of the shortest interval among them.
    kept_alive: Vec<Qpn>,
    next_sweep: Option<Duration>,
    /// Where the QP numbers come from when the device shares its address with other processes
    /// ([`Endpoint::share_address`]).
    ledger: Option<Arc<dyn QpnLedger>>,
}

/// The active QPs' earliest timer, and whether any has responses to build
/// ([`Endpoint::summary`]).
#[derive(Debug, Clone, Copy)]
struct Summary {
    deadline: Option<Duration>,
    responding: bool,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_addr", &self.config.local_addr)
            .field("qps", &self.qps.len())
            .finish()
    }
}

/// Splits the endpoint into one QP and the context its handlers need. The QP counts as
/// touched: whether it is active is looked at again (see [`Endpoint::settle`]).
macro_rules! qp_and_ctx {
    ($self:ident, $qpn:expr, $now:expr) => {{
        $self.last_now = $self.last_now.max($now);
        let qpn: Qpn = $qpn;
        // A QP handled twice in a row (a batch's posts, a train's packets) is noted once.
        if $self.touched.last() != Some(&qpn) {
            if $self.touched.len() >= MAX_TOUCHED {
                $self.settle();
            }
            $self.touched.push(qpn);
        }
        // The QP may change below: its timer, its responses.
        $self.summary.set(None);
        let qp = $self.qps.get_mut(qpn.value());
        let ctx = Ctx {
            now: $now,
            memory: &$self.memory,
            out: &mut $self.out,
            pool: &mut $self.pool,
            cqs: &mut $self.cqs,
            srqs: &mut $self.srqs,
            events: &mut $self.events,
            counters: &mut $self.counters,
            overrun: &mut $self.overrun,
            congestion: &$self.config.congestion,
        };
        (qp, ctx)
    }};
}

impl Endpoint {
    /// An endpoint with no objects yet, and a memory table of its own; `config.seed` seeds its
    /// memory keys and QP numbers.
    pub fn new(config: EndpointConfig) -> Self {
        Endpoint::with_memory(config, DeviceMemory::own(config.seed))
    }

    /// An endpoint with no objects yet, over `memory`, which other endpoints of the device (its
    /// other engines) may share: what one registers, the others find by the same keys.
    pub fn with_memory(config: EndpointConfig, memory: DeviceMemory) -> Self {
        Endpoint {
            config,
            memory,
            port_mtu: DEFAULT_PORT_MTU,
            cqs: Vec::new(),
            free_cqs: Vec::new(),
            srqs: Vec::new(),
            ahs: Vec::new(),
            free_ahs: Vec::new(),
            qps: KeyedTable::new(24),
            active: FxHashSet::default(),
            touched: Vec::new(),
            summary: Cell::new(None),
            due: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(config.seed ^ 0x9b0f_5a1e_c7d3_2e11),
            out: VecDeque::new(),
            held_acks: VecDeque::new(),
            pool: Vec::new(),
            last_now: Duration::ZERO,
            events: VecDeque::new(),
            counters: Counters::default(),
            kept_alive: Vec::new(),
            next_sweep: None,
            ledger: None,
            overrun: Vec::new(),
        }
    }

    /// The address peers reach this endpoint at.
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

    /// The port's MTU ([`set_port_mtu`](Self::set_port_mtu)).
    pub fn port_mtu(&self) -> PathMtu {
        self.port_mtu
    }

    /// `ibv_alloc_pd`: a new protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        self.memory.write().alloc_pd()
    }

    /// Registers a zeroed region of `len` bytes that peers address from `iova`.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        self.memory.write().register(pd, iova, len, access)
    }

    /// Registers the application's `buffer` as a region that peers address from `iova`, with
    /// no copy; the buffer comes back with the reason if it cannot be.
    pub fn reg_buffer(
        &mut self,
        pd: PdId,
        iova: u64,
        buffer: Vec<u8>,
        access: Access,
    ) -> Result<MemoryRegion, (Vec<u8>, MemoryError)> {
        self.memory
            .write()
            .register_buffer(pd, iova, buffer, access)
    }

    /// Registers a program's `memory` in place as a region that peers address from `iova`.
    pub fn reg_foreign(
        &mut self,
        pd: PdId,
        iova: u64,
        memory: ForeignMemory,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        self.memory
            .write()
            .register_foreign(pd, iova, memory, access)
    }

    /// The region registered as `lkey` with `rkey` lost its last application handle:
    /// deregistered now ([`MemoryTable::release`](crate::memory::MemoryTable::release)).
    pub fn release_mr(&mut self, lkey: LKey, rkey: RKey) {
        self.memory.write().release(lkey, rkey);
    }

    /// `ibv_dereg_mr`: refused while windows are bound over the region.
    pub fn dereg_mr(&mut self, lkey: LKey) -> Result<(), MemoryError> {
        self.memory.write().deregister(lkey)
    }

    /// `ibv_alloc_mw`: a memory window of `pd`, by its rkey; bound by a
    /// [`SendOp::BindMw`](super::SendOp::BindMw) work request. `OutOfKeys` when no key is free.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> Result<RKey, MemoryError> {
        self.memory.write().alloc_mw(pd, kind)
    }

    /// `ibv_dealloc_mw`: the window's rkey reaches nothing from now on.
    pub fn dealloc_mw(&mut self, rkey: RKey) -> Result<(), MemoryError> {
        self.memory.write().dealloc_mw(rkey)
    }

    /// `ibv_create_cq`: a CQ of `capacity` completions; one more overruns it (IBTA 11.4.2.1).
    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        let cq = CompletionQueue::new(capacity);
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
        self.cqs[cq.0 as usize] = CompletionQueue::destroyed();
        self.free_cqs.push(cq);
        Ok(())
    }

    /// Draws QP numbers from `ledger` from now on: the device shares its address with devices
    /// of other processes, and the kernel steers packets among them by a number's low byte.
    pub fn share_address(&mut self, ledger: Arc<dyn QpnLedger>) {
        self.ledger = Some(ledger);
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
        let span = QPN_RANGE.end() - QPN_RANGE.start() + 1;
        let lane = self.config.lane;
        let ledger = self.ledger.clone();
        let qpn = (0..QPN_DRAWS)
            .map(|_| QPN_RANGE.start() + self.rng.next_u32() % span)
            .map(|drawn| match &ledger {
                // The low byte names the device's place in its address group.
                Some(ledger) => Qpn::new((drawn & 0xff_ff00) | u32::from(ledger.place())),
                None => Qpn::new(lane.nearest(drawn, &QPN_RANGE)),
            })
            // Never the slot of QP0 and QP1, so that QP1 may come at any time.
            .find(|qpn| {
                QPN_RANGE.contains(&qpn.value())
                    && self.qps.takes(qpn.value())
                    && !self.qps.same_slot(qpn.value(), Qpn::GSI.value())
                    && ledger.as_ref().is_none_or(|ledger| ledger.claim(*qpn))
            })
            .ok_or(VerbsError::OutOfResources("every QP number is taken"))?;
        self.insert_qp(qpn, init, srq);
        Ok(qpn)
    }

    /// Creates QP1, the general services QP that connection management talks to: a UD QP whose
    /// Q_Key is fixed at 0x80010000, sent whatever the work request says and required of every
    /// packet received (rxe_req.c, rxe_recv.c). There is one per device. QP0, the subnet
    /// management QP, has no use on RoCE and is never created: packets to it are dropped.
    pub fn create_gsi_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        if !self.config.lane.owns(Qpn::GSI) {
            return Err(VerbsError::InvalidRequest(
                "QP1 belongs to the device's first engine",
            ));
        }
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidRequest("the GSI QP is a UD QP"));
        }
        if self.qps.contains_key(Qpn::GSI.value()) {
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
        let inserted = self.qps.insert(
            qpn.value(),
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
                rq: RecvQueue::default(),
                srq,
                req: Requester::default(),
                resp: Responder::default(),
                received: 0,
                slots: None,
                cc: Default::default(),
                keepalive: None,
            },
        );
        // The callers drew a number whose slot is free, or checked QP1's: a QP missing from its
        // table would be a broken invariant, which stops the device rather than go unnoticed.
        assert!(inserted.is_ok(), "QP {qpn:?}'s slot is taken");
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

    /// `ibv_post_srq_recv`: adds a receive request to the SRQ's pool.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), VerbsError> {
        self.srq_mut(srq)?.post(wr)
    }

    /// [`post_srq_recv`](Self::post_srq_recv) of the requests of `wrs`, which the engine's
    /// posting queue filled and whose posts counted them against the SRQ's depth, taken as
    /// the SRQ takes them (`SharedRq::take_posted`); leaves `wrs` empty. Dropped if the SRQ is
    /// unknown (none is ever destroyed).
    pub(crate) fn post_srq_batch(&mut self, srq: SrqId, wrs: &mut Vec<RecvWr>) {
        match self.srq_mut(srq) {
            Ok(srq) => srq.take_posted(wrs),
            Err(_) => wrs.clear(),
        }
    }

    /// Has the SRQ give back a slot of `slots` for each request a QP takes from it, as
    /// [`share_slots`](Self::share_slots) does for a QP's queues.
    pub fn share_srq_slots(
        &mut self,
        srq: SrqId,
        slots: Arc<QueueSlots>,
    ) -> Result<(), VerbsError> {
        self.srq_mut(srq)?.slots = Some(slots);
        Ok(())
    }

    fn srq_mut(&mut self, srq: SrqId) -> Result<&mut SharedRq, VerbsError> {
        self.srqs
            .get_mut(srq.0 as usize)
            .ok_or(VerbsError::UnknownSrq(srq))
    }

    /// `ibv_create_ah`: a destination for UD sends from QPs of `pd`. Refused for a destination
    /// the device cannot send to (see [`AddressVector::resolve`]), as the kernel's
    /// `ib_create_ah` refuses one it cannot resolve.
    pub fn create_ah(&mut self, pd: PdId, av: AddressVector) -> Result<AddressHandle, VerbsError> {
        let av = av
            .resolve(self.config.local_addr)
            .map_err(VerbsError::InvalidRequest)?;
        Ok(match self.free_ahs.pop() {
            Some(ah) => {
                self.ahs[ah.0 as usize] = Some((pd, av));
                ah
            }
            None => {
                self.ahs.push(Some((pd, av)));
                AddressHandle(self.ahs.len() as u32 - 1)
            }
        })
    }

    /// [`create_ah`](Self::create_ah) at a number the caller chose: a device of several engines
    /// gives each engine's endpoint the numbers the first engine's chose, so that a UD send
    /// names its destination alike on every engine. An endpoint takes its numbers one way or
    /// the other, not both. Refused for a number in use, or one that would grow the table by
    /// more than [`MAX_AH_GROWTH`] slots at once.
    pub fn create_ah_at(
        &mut self,
        ah: AddressHandle,
        pd: PdId,
        av: AddressVector,
    ) -> Result<(), VerbsError> {
        let av = av
            .resolve(self.config.local_addr)
            .map_err(VerbsError::InvalidRequest)?;
        let slot = ah.0 as usize;
        if slot >= self.ahs.len() + MAX_AH_GROWTH {
            return Err(VerbsError::InvalidRequest(
                "the address handle's number is too large",
            ));
        }
        if slot >= self.ahs.len() {
            self.ahs.resize(slot + 1, None);
        }
        if self.ahs[slot].is_some() {
            return Err(VerbsError::InvalidRequest(
                "the address handle's number is taken",
            ));
        }
        self.ahs[slot] = Some((pd, av));
        Ok(())
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
        self.qps.get(qpn.value()).map_or(0, |qp| {
            qp.max_send_wr.saturating_sub(qp.req.outstanding_wrs())
        })
    }

    /// Counts the QP's outstanding requests in `slots` from now on: each one that leaves its
    /// queues gives its slot back, so that the application's handles, which take a slot per
    /// post, never hold more than the QP's depths.
    pub fn share_slots(&mut self, qpn: Qpn, slots: Arc<QueueSlots>) -> Result<(), VerbsError> {
        let qp = self
            .qps
            .get_mut(qpn.value())
            .ok_or(VerbsError::UnknownQp(qpn))?;
        qp.slots = Some(slots);
        Ok(())
    }

    /// The same for receive requests.
    pub fn recv_queue_room(&self, qpn: Qpn) -> usize {
        self.qps
            .get(qpn.value())
            .map_or(0, |qp| qp.max_recv_wr.saturating_sub(qp.rq.len()))
    }

    /// Destroys a QP: its outstanding requests complete with WR_FLUSH_ERR, then `unposted`,
    /// the completions of requests that were posted but never reached it (still in the
    /// engine's posting queues), in posting order; and its QPN is free.
    pub fn destroy_qp(
        &mut self,
        now: Duration,
        qpn: Qpn,
        unposted: impl IntoIterator<Item = WorkCompletion>,
    ) -> Result<(), VerbsError> {
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        qp.flush(&mut ctx);
        for wc in unposted {
            ctx.complete(qp.cq_of(wc.opcode), wc);
        }
        self.qps.remove(qpn.value());
        if let Some(ledger) = &self.ledger {
            ledger.release(qpn);
        }
        // Its number may be drawn again: windows bound through it must not serve the next QP.
        self.memory.write().release_qp_windows(qpn);
        // A QP's end is when the regions it used are most likely let go of.
        self.memory.write().release_dropped();
        self.err_overrun_qps(now);
        Ok(())
    }

    /// The send and receive completion queues of a QP.
    pub fn qp_cqs(&self, qpn: Qpn) -> Option<(CqId, CqId)> {
        self.qps.get(qpn.value()).map(|qp| (qp.send_cq, qp.recv_cq))
    }

    /// How many packets QP `qpn` has accepted from its peer (past the P_Key, Q_Key and source
    /// checks): a sign of life that needs no completion, as a WRITE's target has none.
    pub fn qp_received(&self, qpn: Qpn) -> Option<u64> {
        self.qps.get(qpn.value()).map(|qp| qp.received)
    }

    /// What congestion control did for QP `qpn`, and the rate its pacer holds it to.
    pub fn congestion(&self, qpn: Qpn) -> Option<CongestionStatus> {
        self.qps.get(qpn.value()).map(|qp| qp.cc.status())
    }

    /// Each QP that congestion control has touched (a mark, a CNP, a rate), with what it did:
    /// for the daemon's counters.
    pub fn congested(&self) -> impl Iterator<Item = (Qpn, CongestionStatus)> + '_ {
        self.qps
            .values()
            .map(|qp| (qp.qpn, qp.cc.status()))
            .filter(|(_, status)| *status != CongestionStatus::default())
    }

    /// The congestion control parameters QPs run with.
    pub fn congestion_config(&self) -> &CongestionConfig {
        &self.config.congestion
    }

    /// The QP's transport service; `None` if there is no such QP.
    pub fn qp_type(&self, qpn: Qpn) -> Option<QpType> {
        self.qps.get(qpn.value()).map(|qp| qp.qp_type)
    }

    /// `ibv_query_qp`: the QP's state and every attribute a modify sets, as they are now;
    /// `None` if there is no such QP.
    pub fn query_qp(&self, qpn: Qpn) -> Option<QpAttr> {
        let qp = self.qps.get(qpn.value())?;
        let s = &qp.settings;
        Some(QpAttr {
            state: Some(qp.state),
            cur_state: Some(qp.state),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(s.access),
            qkey: Some(s.qkey),
            av: s.av,
            path_mtu: Some(s.path_mtu),
            dest_qpn: Some(s.dest_qpn),
            rq_psn: Some(qp.resp.expected_psn()),
            sq_psn: Some(qp.req.next_psn()),
            max_dest_rd_atomic: Some(s.max_dest_rd_atomic),
            max_rd_atomic: Some(s.max_rd_atomic),
            min_rnr_timer: Some(s.min_rnr_timer),
            timeout: Some(s.timeout),
            retry_cnt: Some(s.retry_cnt),
            rnr_retry: Some(s.rnr_retry),
        })
    }

    /// The QP's state, as `ibv_query_qp` reports it; `None` if there is no such QP.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(qpn.value()).map(|qp| qp.state)
    }

    /// `ibv_modify_qp`: checks the transition and its attributes, then applies them.
    ///
    /// An address vector must be one the device can send to (see [`AddressVector::resolve`]).
    /// A path MTU above the port's is lowered to it: the link carries no more, so a QP that
    /// asked for 4096 on a 1500-byte link would have every full packet refused by the kernel.
    pub fn modify_qp(&mut self, now: Duration, qpn: Qpn, attr: &QpAttr) -> Result<(), VerbsError> {
        let (local, port_mtu) = (self.config.local_addr, self.port_mtu);
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        let to = check_modify(qp.qp_type, qp.state, attr)?;
        let mut attr = attr.clone();
        if let Some(av) = attr.av {
            attr.av = Some(
                av.resolve(local)
                    .map_err(|reason| ModifyError::InvalidValue {
                        name: AttrName::Av,
                        reason,
                    })?,
            );
        }
        attr.path_mtu = attr.path_mtu.map(|mtu| mtu.min(port_mtu));
        let attr = &attr;
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
                // A QP connected again starts unpaced, as a new one does.
                qp.cc = Default::default();
            }
            _ => {
                qp.state = to;
                if to == QpState::Rts {
                    qp.pump(&mut ctx);
                }
            }
        }
        self.err_overrun_qps(now);
        Ok(())
    }

    /// `ibv_post_send` of one request: queued, and sent at once as far as the QP may.
    pub fn post_send(&mut self, now: Duration, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let ud_dest = self.resolve_ud(qpn, &wr);
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        let ud_dest = ud_dest.inspect_err(|_| qp.retire_sends(1))?;
        let posted = qp.post_send(wr, ud_dest, &mut ctx);
        self.err_overrun_qps(now);
        posted
    }

    /// [`post_send`](Self::post_send) of several requests: all are queued before any is sent,
    /// so that a batch goes out as one run and only what waits for it asks for an ACK (the
    /// last packet of the batch and one in 32, not each request's last). A request the QP refuses
    /// completes with LOC_QP_OP_ERR in its place: what was queued before it is sent first.
    pub fn post_send_batch(&mut self, now: Duration, qpn: Qpn, wrs: impl Iterator<Item = SendWr>) {
        self.queue_send_batch(now, qpn, wrs, SendChecks::Run);
    }

    /// [`post_send_batch`](Self::post_send_batch) of requests that were checked against the
    /// QP's type when they were posted ([`SendWr::check`], which `QueuePair::post_send` runs
    /// at the call, with the UD destination's presence): the engine's, from its posting
    /// queues, which hold no others. The state, the depth and the UD destination's address
    /// handle are still checked here, where they are known.
    ///
    /// Takes the first `n` requests of `wrs`. When the QP takes them all as they are (the
    /// usual case), the vector itself becomes part of its send queue, and `wrs` an emptied
    /// one: the requests are read where the posts wrote them.
    pub(crate) fn post_checked_send_batch(
        &mut self,
        now: Duration,
        qpn: Qpn,
        wrs: &mut Vec<SendWr>,
        n: usize,
    ) {
        if n == wrs.len() {
            let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
            let Some(qp) = qp else { return };
            let (ahs, pd) = (&self.ahs, qp.pd);
            if qp.queue_all_checked(wrs, |wr| ud_destination(ahs, pd, wr)) {
                qp.pump(&mut ctx);
                self.err_overrun_qps(now);
                return;
            }
        }
        self.queue_send_batch(now, qpn, wrs.drain(..n), SendChecks::DoneAtPost);
    }

    fn queue_send_batch(
        &mut self,
        now: Duration,
        qpn: Qpn,
        wrs: impl Iterator<Item = SendWr>,
        checks: SendChecks,
    ) {
        for wr in wrs {
            let (wr_id, op) = (wr.wr_id, wr.op);
            let ud_dest = self.resolve_ud(qpn, &wr);
            let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
            let Some(qp) = qp else { return };
            // (A match, not a closure that would take `wr` with it: the request is moved once
            // more for each.)
            let queued = match ud_dest {
                Ok(ud_dest) => qp.enqueue_send(wr, ud_dest, checks, &mut ctx).is_ok(),
                Err(_) => false,
            };
            if !queued {
                qp.pump(&mut ctx);
                qp.refuse(wr_id, op, &mut ctx);
            }
        }
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        if let Some(qp) = qp {
            qp.pump(&mut ctx);
        }
        self.err_overrun_qps(now);
    }

    /// The destination address of a UD send, copied from its address handle when it is posted
    /// (as rxe copies the address vector into the send WQE); `None` for connected QPs.
    fn resolve_ud(&self, qpn: Qpn, wr: &SendWr) -> Result<Option<IpAddr>, VerbsError> {
        let qp = self
            .qps
            .get(qpn.value())
            .ok_or(VerbsError::UnknownQp(qpn))?;
        match (qp.qp_type, wr.ud) {
            (QpType::Ud, _) => ud_destination(&self.ahs, qp.pd, wr),
            (_, Some(_)) => Err(VerbsError::InvalidRequest(
                "only a UD send takes a `ud` destination",
            )),
            (_, None) => Ok(None),
        }
    }

    /// `ibv_post_recv`: queued on the QP's receive queue; in Error it completes flushed at once.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let now = self.last_now;
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        let queued = qp.rq.len();
        let posted = Self::queue_recv(qp, &mut ctx, wr);
        if qp.rq.len() == queued {
            // Refused, or flushed at once: not in the queue, so not outstanding.
            qp.retire_recvs(1);
        }
        self.err_overrun_qps(now);
        posted
    }

    /// Takes the receive requests of `wrs`, which the engine's posting queue filled, leaving it
    /// empty: as they lie, `wrs` becoming part of the QP's receive queue and traded for an
    /// emptied vector, or, for a vector less than half full, moved into the queue's tail
    /// ([`WorkQueue::take_dense`](super::work_queue::WorkQueue::take_dense)).
    /// Only for the first `n` of them being all of `wrs`, on a QP with a queue of its own (no
    /// SRQ), in a state that queues receives (neither RESET nor ERROR): false, with nothing
    /// taken, otherwise, for [`post_recv`](Self::post_recv) to take them one at a time. The
    /// caller keeps `n` within the queue's room (`recv_queue_room`).
    pub(crate) fn take_recv_batch(&mut self, qpn: Qpn, wrs: &mut Vec<RecvWr>, n: usize) -> bool {
        let Some(qp) = self.qps.get_mut(qpn.value()) else {
            return false;
        };
        let takes = n == wrs.len()
            && qp.srq.is_none()
            && !matches!(qp.state, QpState::Reset | QpState::Error)
            && qp.rq.len() + n <= qp.max_recv_wr;
        if takes {
            qp.rq.take_dense(wrs, |_, at| at);
        }
        takes
    }

    /// [`post_recv`](Self::post_recv)'s checks and queueing.
    fn queue_recv(qp: &mut Qp, ctx: &mut Ctx<'_>, wr: RecvWr) -> Result<(), VerbsError> {
        let qpn = qp.qpn;
        if qp.srq.is_some() {
            return Err(VerbsError::InvalidRequest(
                "the QP takes its receive requests from an SRQ",
            ));
        }
        match qp.state {
            QpState::Reset => return Err(VerbsError::WrongState(qp.state)),
            QpState::Error => {
                let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
                ctx.complete(qp.recv_cq, wc);
                return Ok(());
            }
            _ => {}
        }
        if qp.rq.len() >= qp.max_recv_wr {
            return Err(VerbsError::QueueFull);
        }
        qp.rq.push(wr, |_, at| at);
        Ok(())
    }

    /// Completes a work request that could not be posted, with `status`, on the CQ its QP
    /// completes such requests into: the engine's way to report a post it had already
    /// accepted from the application.
    pub fn complete_refused(&mut self, qpn: Qpn, wc: WorkCompletion) {
        let now = self.last_now;
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        let Some(qp) = qp else { return };
        ctx.complete(qp.cq_of(wc.opcode), wc);
        self.err_overrun_qps(now);
    }

    /// Puts every QP that completes into an overrun CQ in the error state (IBTA 11.4.2.1). Their
    /// flushed requests may overrun another CQ in turn, whose QPs follow.
    fn err_overrun_qps(&mut self, now: Duration) {
        while !self.overrun.is_empty() {
            let overrun = std::mem::take(&mut self.overrun);
            let qpns: Vec<Qpn> = self
                .qps
                .values()
                .filter(|qp| cq::uses(qp.send_cq, qp.recv_cq, &overrun))
                .map(|qp| qp.qpn)
                .collect();
            for qpn in qpns {
                let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
                if let Some(qp) = qp {
                    qp.fail(&mut ctx);
                }
            }
        }
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
            traffic_class: 0,
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
        if repr.bth.opcode == Opcode::Cnp {
            qp.on_cnp(datagram.src, &mut ctx);
            return;
        }
        let transport = match qp.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        if packet.info().transport != transport {
            ctx.counters.dropped_unexpected += 1;
            return;
        }
        if !repr.bth.pkey.matches(qp.settings.pkey) {
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
        qp.received += 1;
        if datagram.ecn().is_ce() {
            qp.congestion_marked(datagram.src, &repr, &mut ctx);
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
        self.err_overrun_qps(now);
    }

    /// The io layer could not send to `dst` at all: no route, the host refused (a broadcast
    /// address, a firewall), the wrong family. Each RC or UC QP connected to `dst` that has
    /// requests of its own in flight fails them, as rxe fails a request it cannot route
    /// (rxe_req.c: LOC_QP_OP_ERR), and so only those QPs: the device and its other QPs carry
    /// on. Responses that could not be sent are only lost: the peer's requester retries or
    /// fails by itself. UD requests, and UC ones already handed to the network, completed when
    /// their packets were sent (IBTA 9.8): their loss is counted by the io layer.
    pub fn handle_unreachable(&mut self, now: Duration, dst: IpAddr) {
        let dst = dst.to_canonical();
        let qpns: Vec<Qpn> = self
            .qps
            .values()
            .filter(|qp| qp.qp_type != QpType::Ud && qp.peer() == Some(dst))
            .filter(|qp| qp.req.outstanding_wrs() > 0)
            .map(|qp| qp.qpn)
            .collect();
        for qpn in qpns {
            let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
            if let Some(qp) = qp {
                ctx.counters.unreachable_peers += 1;
                qp.fail_unreachable(&mut ctx);
            }
        }
        self.err_overrun_qps(now);
    }

    /// Gives RC QP `qpn` keepalive: a peer it has heard nothing from for `interval`, while it
    /// has nothing outstanding, is probed, and the QP fails (`QpFatal`) if `retry_cnt` + 1
    /// probes go unanswered (`transport::keepalive`). `None` stops it. Off unless set: a QP of
    /// kernel rxe's or a NIC's sends no probes.
    pub fn set_keepalive(
        &mut self,
        now: Duration,
        qpn: Qpn,
        interval: Option<Duration>,
    ) -> Result<(), VerbsError> {
        // Handled as any QP whose timers may change.
        let (qp, _) = qp_and_ctx!(self, qpn, now);
        let qp = qp.ok_or(VerbsError::UnknownQp(qpn))?;
        if qp.qp_type != QpType::Rc {
            return Err(VerbsError::InvalidRequest(
                "keepalive is for RC QPs: only RC answers a probe",
            ));
        }
        if interval.is_some_and(|i| i < MIN_KEEPALIVE) {
            return Err(VerbsError::InvalidRequest(
                "a keepalive interval under 10 ms: its sweeps would keep the engine busy",
            ));
        }
        qp.keepalive = interval.map(|i| Keepalive::new(i, now, qp.received));
        if interval.is_some() && !self.kept_alive.contains(&qpn) {
            self.kept_alive.push(qpn);
        }
        // Never later than the sweep already due: setting one QP's keepalive must not put off
        // the others'.
        let due = self.sweep_every().map(|every| now + every);
        self.next_sweep = match (self.next_sweep, due) {
            (Some(next), Some(due)) => Some(next.min(due)),
            (_, due) => due,
        };
        Ok(())
    }

    /// How often the QPs with keepalive are looked at: a quarter of their shortest interval.
    fn sweep_every(&self) -> Option<Duration> {
        let intervals = self.kept_alive.iter().filter_map(|qpn| {
            let qp = self.qps.get(qpn.value())?;
            qp.keepalive.map(|k| k.interval())
        });
        intervals.min().map(|shortest| shortest / 4)
    }

    /// Looks at each QP with keepalive: one its peer has been silent to for its interval is
    /// probed, if it is idle.
    fn sweep(&mut self, now: Duration) {
        let mut kept = std::mem::take(&mut self.kept_alive);
        kept.retain(|qpn| {
            let (qp, mut ctx) = qp_and_ctx!(self, *qpn, now);
            match qp.filter(|qp| qp.keepalive.is_some()) {
                Some(qp) => {
                    qp.keepalive_sweep(&mut ctx);
                    true
                }
                // Destroyed, or its number drawn again by a QP without keepalive.
                None => false,
            }
        });
        self.kept_alive = kept;
        self.next_sweep = self.sweep_every().map(|every| now + every);
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.next_sweep.is_some_and(|sweep| sweep <= now) {
            self.sweep(now);
        }
        self.settle();
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        due.extend(self.active.iter().copied().filter(|qpn| {
            let deadline = self.qps.get(qpn.value()).and_then(|qp| qp.deadline());
            deadline.is_some_and(|d| d <= now)
        }));
        for &qpn in &due {
            let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
            if let Some(qp) = qp {
                qp.on_timer(&mut ctx);
                qp.keepalive_timer(&mut ctx);
                qp.pump(&mut ctx);
            }
        }
        self.due = due;
        self.err_overrun_qps(now);
    }

    /// The earliest time `handle_timeout` has work to do.
    pub fn next_deadline(&self) -> Option<Duration> {
        let next = self.summary().deadline;
        debug_assert_eq!(
            next,
            self.qps.values().filter_map(|qp| qp.deadline()).min(),
            "a QP with a timer is missing from the active set"
        );
        super::earliest(next, self.next_sweep)
    }

    /// The earliest timer and whether responses wait to be built, among the
    /// [`candidates`](Self::candidates): kept from the last look until a QP is handled (only
    /// `qp_and_ctx!` lends a QP out to change, and it forgets the summary), since nothing else
    /// changes them. Bringing `active` up to date ([`settle`](Self::settle)) changes neither:
    /// it drops only QPs with no timer and no responses.
    fn summary(&self) -> Summary {
        if let Some(summary) = self.summary.get() {
            return summary;
        }
        let summary = self.candidates().fold(
            Summary {
                deadline: None,
                responding: false,
            },
            |summary, qp| Summary {
                deadline: super::earliest(summary.deadline, qp.deadline()),
                responding: summary.responding || qp.resp.has_pending_responses(),
            },
        );
        self.summary.set(Some(summary));
        summary
    }

    /// The QPs that may have a timer armed or responses to build: the active ones, and those
    /// handled since the set was brought up to date.
    fn candidates(&self) -> impl Iterator<Item = &Qp> {
        self.active
            .iter()
            .chain(&self.touched)
            .filter_map(|qpn| self.qps.get(qpn.value()))
    }

    /// Brings the active set up to date with the QPs handled since: a QP is in it while it has
    /// a timer armed or responses left to build. Every handling of a QP goes through
    /// `qp_and_ctx!`, which notes it.
    fn settle(&mut self) {
        for qpn in self.touched.drain(..) {
            let busy = self
                .qps
                .get(qpn.value())
                .is_some_and(|qp| qp.deadline().is_some() || qp.resp.has_pending_responses());
            if busy {
                self.active.insert(qpn);
            } else {
                self.active.remove(&qpn);
            }
        }
    }

    /// Writes the next packet to send into the start of `buf`, its ICRC left zero for the io
    /// layer to seal, and returns where it goes and its length. Headers are emitted and the
    /// payload copied out of its region here, once, into the caller's buffer: the io layer
    /// passes the free end of the train it sends from.
    ///
    /// READ responses are queued here, a batch at a time, as the queue empties: a peer's
    /// 2 GiB READ costs a batch of queue entries, not 2 GiB of them.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`MAX_PACKET_LEN`].
    pub fn poll_transmit_into(&mut self, buf: &mut [u8]) -> Option<(IpAddr, usize)> {
        assert!(
            buf.len() >= MAX_PACKET_LEN,
            "poll_transmit_into needs a buffer of MAX_PACKET_LEN bytes"
        );
        loop {
            self.queue_responses();
            let Queued {
                dst,
                repr,
                payload,
                unreliable,
            } = self.out.pop_front()?;
            let len = repr.buffer_len();
            let at = repr.payload_offset();
            let packet = &mut buf[..len];
            // The buffer holds an earlier packet's bytes, and nothing zeroes it: `emit` writes
            // every header byte (reserved bits as zero), the pad and the ICRC, and the payload
            // is written whole (tests/proptest_wire.rs, and the simulator builds over junk).
            repr.emit(packet)
                .expect("the core queues only headers its opcode requires");
            let into = &mut packet[at..at + repr.payload_len];
            match payload.write(into, &mut self.pool, &self.memory) {
                Ok(whole) => {
                    if !whole {
                        self.counters.unmapped_accesses += 1;
                    }
                    if let Some(UnreliableSend {
                        qpn,
                        completes: true,
                    }) = unreliable
                    {
                        self.last_packet_built(qpn, repr.bth.psn);
                    }
                    return Some((dst, len));
                }
                Err(revoked) => self.withhold(revoked, repr.bth.psn),
            }
        }
    }

    /// The last packet of QP `qpn`'s UC or UD message `psn` is built: the message completes.
    fn last_packet_built(&mut self, qpn: Qpn, psn: Psn) {
        let now = self.last_now;
        let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
        if let Some(qp) = qp {
            qp.last_packet_built(psn, &mut ctx);
        }
        self.err_overrun_qps(now);
    }

    /// A READ response for `psn` whose key no longer granted its memory when it was built:
    /// nothing of it is sent, and its QP NAKs in its place and fails
    /// ([`Qp::read_revoked`]). The NAK goes first, ahead of anything the QP queued after the
    /// response, as it would have gone in the response's place.
    fn withhold(&mut self, revoked: Revoked, psn: Psn) {
        self.counters.revoked_read_responses += 1;
        self.counters.note_unmapped(&revoked.error);
        let now = self.last_now;
        let (qp, mut ctx) = qp_and_ctx!(self, revoked.qpn, now);
        let naked = qp.is_some_and(|qp| qp.read_revoked(psn, revoked.error, &mut ctx));
        if naked {
            if let Some(nak) = self.out.pop_back() {
                self.out.push_front(nak);
            }
        }
        self.err_overrun_qps(now);
    }

    /// Holds back every packet queued, if all are plain ACKs (no NAK, no atomic ACK) and no
    /// READ response waits to be built: [`poll_transmit_into`] gives none of them until
    /// [`release_held_acks`] queues them again. ACKs held already stay held, but for those of
    /// the QPs whose newer ACKs this holds (an ACK acknowledges every PSN up to its own, IBTA
    /// 9.7.5.1.1). If other packets are queued, it holds nothing and queues the held ACKs
    /// behind them, as `release_held_acks` does: they would not leave alone, and a response of
    /// their QP among those packets must not be overtaken by a stale ACK. Returns whether it
    /// held any.
    ///
    /// For an io layer that runs a turn inside an application's call and then hands the
    /// application what the turn completed: the requests a peer's SENDs and WRITEs answer come
    /// in the application's next calls, and with the ACKs held until then they leave first.
    /// A ping-pong's reply then waits for no ACK's system call (in the lab's emulated guests,
    /// a `sendmsg` of about 15 µs, once each way). A responder may delay and coalesce its ACKs
    /// (IBTA 9.7.5.1.1); the requester's ACK timeout is milliseconds or more. The io layer
    /// bounds how long it holds them.
    ///
    /// [`poll_transmit_into`]: Self::poll_transmit_into
    /// [`release_held_acks`]: Self::release_held_acks
    pub fn hold_acks(&mut self) -> bool {
        if self.out.is_empty() {
            return false;
        }
        if !self.out.iter().all(super::is_plain_ack) || self.summary().responding {
            self.release_held_acks();
            return false;
        }
        self.drop_superseded_held_acks();
        self.held_acks.append(&mut self.out);
        true
    }

    /// Whether ACKs are held back ([`hold_acks`](Self::hold_acks)).
    pub fn holds_acks(&self) -> bool {
        !self.held_acks.is_empty()
    }

    /// Queues the ACKs [`hold_acks`](Self::hold_acks) held behind what was queued since,
    /// except those that a later response of the same QP queued since replaces: an ACK, a NAK
    /// or an atomic ACK acknowledges every PSN before its own as well. Returns whether any
    /// were held.
    pub fn release_held_acks(&mut self) -> bool {
        if self.held_acks.is_empty() {
            return false;
        }
        self.drop_superseded_held_acks();
        self.out.append(&mut self.held_acks);
        true
    }

    /// Drops the held ACKs of the QPs that have an acknowledgement (an ACK, a NAK, an atomic
    /// ACK) of the same PSN or a later one among the last `COALESCE_WINDOW` packets of `out`,
    /// counted as coalesced. A duplicate's answer, of an earlier PSN, replaces nothing. Past
    /// the window a held ACK goes anyway, which a requester takes for the stale ACK it is: the
    /// window bounds the work where many QPs hold ACKs at once.
    fn drop_superseded_held_acks(&mut self) {
        if self.held_acks.is_empty() {
            return;
        }
        let recent = self.out.iter().rev().take(super::COALESCE_WINDOW);
        // Filled in place: a collected one was returned, and copied whole, window and all.
        let mut later: SmallVec<[(IpAddr, Qpn, Psn); super::COALESCE_WINDOW]> = SmallVec::new();
        later.extend(
            recent
                .filter(|queued| {
                    matches!(queued.repr.bth.opcode, Opcode::RcAck | Opcode::RcAtomicAck)
                })
                .map(|queued| (queued.dst, queued.repr.bth.dest_qp, queued.repr.bth.psn)),
        );
        let before = self.held_acks.len();
        self.held_acks.retain(|held| {
            let bth = &held.repr.bth;
            !later.iter().any(|&(dst, qp, psn)| {
                dst == held.dst && qp == bth.dest_qp && !psn.is_before(bth.psn)
            })
        });
        self.counters.coalesced_acks += (before - self.held_acks.len()) as u64;
    }

    /// The next packet to send, in a `Vec` of its own: [`poll_transmit_into`] for callers
    /// that keep packets, such as tests and the simulator. Allocates each time.
    ///
    /// [`poll_transmit_into`]: Self::poll_transmit_into
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut packet = vec![0; MAX_PACKET_LEN];
        let (dst, len) = self.poll_transmit_into(&mut packet)?;
        packet.truncate(len);
        Some(Transmit { dst, packet })
    }

    /// Queues the next batch of READ responses when the transmit queue has run dry.
    fn queue_responses(&mut self) {
        if self.out.is_empty() {
            let now = self.last_now;
            self.settle();
            if !self.summary().responding {
                return;
            }
            let mut responding = std::mem::take(&mut self.due);
            responding.clear();
            responding.extend(self.active.iter().copied().filter(|qpn| {
                self.qps
                    .get(qpn.value())
                    .is_some_and(|qp| qp.resp.has_pending_responses())
            }));
            for &qpn in &responding {
                let (qp, mut ctx) = qp_and_ctx!(self, qpn, now);
                if let Some(qp) = qp {
                    qp.continue_responses(READ_RESPONSE_BATCH, &mut ctx);
                }
            }
            self.due = responding;
        }
    }

    /// Whether packets wait to be sent: queued or READ responses to build, which
    /// `poll_transmit` gives, or ACKs held ([`Endpoint::hold_acks`]), which it gives once
    /// released.
    pub fn has_transmits(&self) -> bool {
        self.has_unheld_transmits() || !self.held_acks.is_empty()
    }

    /// Whether packets other than held ACKs wait to be sent: those `poll_transmit` gives now.
    pub fn has_unheld_transmits(&self) -> bool {
        let pending = self.summary().responding;
        debug_assert_eq!(
            pending,
            self.qps.values().any(|qp| qp.resp.has_pending_responses()),
            "a QP with responses to build is missing from the active set"
        );
        !self.out.is_empty() || pending
    }

    /// `ibv_poll_cq` for one entry: the oldest completion on `cq`, if any.
    pub fn poll_cq(&mut self, cq: CqId) -> Option<WorkCompletion> {
        self.cqs.get_mut(cq.0 as usize)?.pop()
    }

    /// Whether `cq` holds a completion for [`poll_cq`](Self::poll_cq): a look that takes
    /// nothing.
    pub fn has_completions(&self, cq: CqId) -> bool {
        self.cqs.get(cq.0 as usize).is_some_and(|q| !q.is_empty())
    }

    /// `ibv_get_async_event`: the oldest event not yet taken, if any.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// What the endpoint has sent, received and dropped since it was created.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How many objects are alive: a long-running process watches these stay level.
    pub fn resources(&self) -> Resources {
        // One guard: a second read while holding the first waits behind a waiting writer.
        let memory = self.memory.read();
        Resources {
            qps: self.qps.len(),
            cqs: self.cqs.iter().filter(|cq| cq.live).count(),
            regions: memory.regions(),
            windows: memory.window_count(),
            srqs: self.srqs.len(),
            address_handles: self.ahs.iter().flatten().count(),
        }
    }
}

/// The destination of a send `wr` on a UD QP of protection domain `pd`, from its address
/// handle among `ahs`: refused if it names none, or one destroyed or of another domain.
fn ud_destination(
    ahs: &[Option<(PdId, AddressVector)>],
    pd: PdId,
    wr: &SendWr,
) -> Result<Option<IpAddr>, VerbsError> {
    let ud = wr.ud.ok_or(VerbsError::InvalidRequest(
        "a UD send names its destination in `ud`",
    ))?;
    let &(ah_pd, av) = ahs
        .get(ud.ah.0 as usize)
        .and_then(Option::as_ref)
        .ok_or(VerbsError::UnknownAh(ud.ah))?;
    if ah_pd != pd {
        return Err(VerbsError::InvalidRequest(
            "the address handle belongs to another protection domain",
        ));
    }
    Ok(Some(av.dest))
}

/// The objects an [`Endpoint`] holds at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Queue pairs, QP1 included.
    pub qps: usize,
    /// Completion queues not destroyed.
    pub cqs: usize,
    /// Registered memory regions.
    pub regions: usize,
    /// Allocated memory windows, bound or not.
    pub windows: usize,
    /// SRQs live as long as the endpoint: they have no destroy verb yet.
    pub srqs: usize,
    /// Address handles not destroyed.
    pub address_handles: usize,
}

impl Resources {
    /// What is left once `other`'s are taken away: the application's, once the device's own
    /// (QP1 and what the CM holds) are.
    pub fn less(&self, other: &Resources) -> Resources {
        Resources {
            qps: self.qps.saturating_sub(other.qps),
            cqs: self.cqs.saturating_sub(other.cqs),
            regions: self.regions.saturating_sub(other.regions),
            windows: self.windows.saturating_sub(other.windows),
            srqs: self.srqs.saturating_sub(other.srqs),
            address_handles: self.address_handles.saturating_sub(other.address_handles),
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "qps {} cqs {} regions {} windows {} srqs {} address_handles {}",
            self.qps, self.cqs, self.regions, self.windows, self.srqs, self.address_handles
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{
        connect_steps, datagram_steps, on_transport, operation, AddressHandle, InlineData, Payload,
        QpEndpoint, SendOp, UdDest,
    };
    use crate::wire::QKey;
    use std::net::Ipv4Addr;

    fn endpoint() -> (Endpoint, QpInit) {
        let mut ep = Endpoint::new(EndpointConfig {
            local_addr: Ipv4Addr::LOCALHOST.into(),
            seed: 1,
            lane: Lane::SOLE,
            congestion: Default::default(),
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

    /// What a batch of six WRITEs, of one to three packets each, gives when the engine posts
    /// it to an RC QP in `state` (RTS, or Error, where they flush): the packets sent, and the
    /// completions. With `stray`, the fourth names a UD destination, which a connected QP
    /// refuses. `whole` takes the engine's path, and checks that the one-pass path takes the
    /// batch exactly when it should; otherwise the batch goes a request at a time.
    fn post_writes(
        whole: bool,
        state: QpState,
        stray: bool,
    ) -> (Vec<Vec<u8>>, Vec<WorkCompletion>) {
        let (mut ep, init) = endpoint();
        let init = QpInit {
            qp_type: QpType::Rc,
            send_cq: ep.create_cq(8),
            max_send_wr: 8,
            ..init
        };
        let qpn = ep.create_qp(init).unwrap();
        let mr = ep
            .reg_mr(init.pd, 0x1000, 8192, Access::LOCAL_WRITE)
            .unwrap();
        let remote = QpEndpoint {
            addr: Ipv4Addr::new(10, 0, 0, 2).into(),
            qpn: Qpn::new(0x42),
            psn: Psn::new(7),
            mtu: PathMtu::Mtu1024,
            qkey: QKey(0),
        };
        let now = Duration::ZERO;
        for step in connect_steps(QpType::Rc, &remote, Psn::new(100), &Default::default()) {
            ep.modify_qp(now, qpn, &step).unwrap();
        }
        if state != QpState::Rts {
            let attr = QpAttr {
                state: Some(state),
                ..Default::default()
            };
            ep.modify_qp(now, qpn, &attr).unwrap();
        }
        let wrs: Vec<SendWr> = (0..6u64)
            .map(|i| {
                let op = SendOp::Write {
                    remote_addr: 0x9000 + 4096 * i,
                    rkey: RKey(0x77),
                };
                let sge = mr.sge(0, 700 * (i as usize % 3 + 1)).unwrap();
                let mut wr = SendWr::new(i, op, Payload::Sges(sge.into()));
                wr.signaled = i % 2 == 1;
                wr.ud = (stray && i == 3).then_some(UdDest {
                    ah: AddressHandle(0),
                    remote_qpn: Qpn::new(0x43),
                    remote_qkey: QKey(0),
                });
                wr
            })
            .collect();
        // The one-pass path takes the batch in RTS, and declines it in Error or with a stray
        // destination.
        let one_pass = whole.then_some(state == QpState::Rts && !stray);
        post_batch(&mut ep, qpn, init.send_cq, wrs, one_pass)
    }

    /// Posts `wrs` to `qpn` as the engine does, when `one_pass` says whether the one-pass path
    /// takes the batch (checked), or else a request at a time; gives the packets sent and the
    /// completions of `cq`.
    fn post_batch(
        ep: &mut Endpoint,
        qpn: Qpn,
        cq: CqId,
        mut wrs: Vec<SendWr>,
        one_pass: Option<bool>,
    ) -> (Vec<Vec<u8>>, Vec<WorkCompletion>) {
        let now = Duration::ZERO;
        if let Some(one_pass) = one_pass {
            let ahs = &ep.ahs;
            let qp = ep.qps.get_mut(qpn.value()).unwrap();
            let pd = qp.pd;
            let mut batch = wrs.clone();
            let resolve = |wr: &SendWr| ud_destination(ahs, pd, wr);
            assert_eq!(qp.queue_all_checked(&mut batch, resolve), one_pass);
            if one_pass {
                assert!(batch.is_empty());
                // Taken into the send queue above; the engine's call then pumps it.
                wrs.clear();
            }
            let n = wrs.len();
            ep.post_checked_send_batch(now, qpn, &mut wrs, n);
        } else {
            ep.queue_send_batch(now, qpn, wrs.drain(..), SendChecks::DoneAtPost);
        }
        assert!(wrs.is_empty(), "every request is taken");
        let mut buf = vec![0; MAX_PACKET_LEN];
        let mut packets = Vec::new();
        while let Some((_, len)) = ep.poll_transmit_into(&mut buf) {
            packets.push(buf[..len].to_vec());
        }
        let completions = std::iter::from_fn(|| ep.poll_cq(cq)).collect();
        (packets, completions)
    }

    /// What a batch of five UD SENDs gives, taken whole (`whole`) or a request at a time, when
    /// the third names an address handle destroyed since its post: the packets sent, and the
    /// completions, the refused one's in its place.
    fn post_datagrams(whole: bool) -> (Vec<Vec<u8>>, Vec<WorkCompletion>) {
        let (mut ep, init) = endpoint();
        let init = QpInit {
            send_cq: ep.create_cq(8),
            max_send_wr: 8,
            ..init
        };
        let qpn = ep.create_qp(init).unwrap();
        let now = Duration::ZERO;
        for step in datagram_steps(QKey(0x11)) {
            ep.modify_qp(now, qpn, &step).unwrap();
        }
        let av = |last| AddressVector {
            dest: Ipv4Addr::new(10, 0, 0, last).into(),
        };
        let kept = ep.create_ah(init.pd, av(2)).unwrap();
        let gone = ep.create_ah(init.pd, av(3)).unwrap();
        ep.destroy_ah(gone).unwrap();
        let wrs = (0..5u64)
            .map(|i| {
                let payload = Payload::Inline(InlineData::from(&[i as u8; 16]));
                let mut wr = SendWr::new(i, SendOp::Send, payload);
                wr.ud = Some(UdDest {
                    ah: if i == 2 { gone } else { kept },
                    remote_qpn: Qpn::new(0x43),
                    remote_qkey: QKey(0x11),
                });
                wr
            })
            .collect();
        post_batch(&mut ep, qpn, init.send_cq, wrs, whole.then_some(true))
    }

    /// A UD QP's batch is taken whole too, its destinations resolved in place: a request whose
    /// address handle is gone completes with LOC_QP_OP_ERR in its place, after the ones before
    /// it and before the ones after it (UD completes a request as its packet is built), as
    /// the request-at-a-time path has it.
    #[test]
    fn a_ud_batch_taken_whole_refuses_a_gone_address_handle_in_its_place() {
        let (packets, completions) = post_datagrams(true);
        assert_eq!(packets.len(), 4, "all but the refused request's");
        let statuses: Vec<_> = completions.iter().map(|wc| (wc.wr_id, wc.status)).collect();
        use WcStatus::{LocQpOpErr, Success};
        assert_eq!(
            statuses,
            [
                (0, Success),
                (1, Success),
                (2, LocQpOpErr),
                (3, Success),
                (4, Success)
            ]
        );
        assert_eq!((packets, completions), post_datagrams(false));
    }

    /// The engine's batch taken whole, in one pass (`Qp::queue_all_checked`), sends and
    /// completes exactly what the request-at-a-time path does. Where the QP does not send
    /// (Error: every request flushes), or a request names a UD destination on a connected QP
    /// (refused in its place, the others sent), the whole batch takes that path.
    #[test]
    fn a_batch_taken_whole_gives_what_it_gives_taken_a_request_at_a_time() {
        let (packets, completions) = post_writes(true, QpState::Rts, false);
        assert_eq!(packets.len(), 12, "1, 2 and 3 packets, twice");
        assert!(completions.is_empty(), "RC completes at the ACK");
        assert_eq!(
            (packets, completions),
            post_writes(false, QpState::Rts, false)
        );
        let (packets, flushed) = post_writes(true, QpState::Error, false);
        assert!(packets.is_empty());
        assert_eq!(flushed.len(), 6, "a flush reports every request");
        assert!(flushed.iter().all(|wc| wc.status == WcStatus::WrFlushErr));
        assert_eq!(
            (packets, flushed),
            post_writes(false, QpState::Error, false)
        );
        let (packets, refused) = post_writes(true, QpState::Rts, true);
        assert_eq!(
            packets.len(),
            11,
            "all but the refused request's one packet"
        );
        let refused_ids: Vec<_> = refused.iter().map(|wc| (wc.wr_id, wc.status)).collect();
        assert_eq!(refused_ids, [(3, WcStatus::LocQpOpErr)]);
        assert_eq!((packets, refused), post_writes(false, QpState::Rts, true));
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
    fn qp_numbers_are_random_never_special_and_reused() {
        let (mut ep, init) = endpoint();
        let qpns: Vec<Qpn> = (0..256).map(|_| ep.create_qp(init).unwrap()).collect();
        assert!(qpns.iter().all(|q| QPN_RANGE.contains(&q.value())));
        // Sequential numbers would give a peer the next QP's number.
        let neighbours = qpns
            .windows(2)
            .filter(|w| w[1].value().abs_diff(w[0].value()) < 256)
            .count();
        assert!(neighbours <= 2, "{neighbours} of 255 pairs are neighbours");
        assert_eq!(ep.create_gsi_qp(init), Ok(Qpn::GSI));
        assert!(ep.create_gsi_qp(init).is_err(), "one GSI QP per device");
        let rc = QpInit {
            qp_type: QpType::Rc,
            ..init
        };
        assert!(ep.create_gsi_qp(rc).is_err(), "the GSI QP is a UD QP");
        // A long-running process creates and destroys QPs without end: numbers come back.
        for _ in 0..20_000 {
            let qpn = ep.create_qp(init).unwrap();
            ep.destroy_qp(Duration::ZERO, qpn, []).unwrap();
        }
        assert_eq!(ep.resources().qps, 257);
    }

    /// A ledger of one place, whose numbers an earlier device of the place held: the set.
    #[derive(Debug)]
    struct Ledger {
        place: u8,
        held: std::sync::Mutex<std::collections::BTreeSet<u32>>,
    }

    impl QpnLedger for Ledger {
        fn place(&self) -> u8 {
            self.place
        }

        fn claim(&self, qpn: Qpn) -> bool {
            self.held.lock().unwrap().insert(qpn.value())
        }

        fn release(&self, qpn: Qpn) {
            self.held.lock().unwrap().remove(&qpn.value());
        }
    }

    /// On a shared address every QP number ends in the device's place, and none is one the
    /// ledger holds (a device of the place before held it when it ended); a destroyed QP's
    /// number goes back to the ledger.
    #[test]
    fn on_a_shared_address_numbers_end_in_the_place_and_skip_the_ledgers() {
        let (mut ep, init) = endpoint();
        // A third of the place's numbers were a dead device's.
        let dead: std::collections::BTreeSet<u32> = (0..0x1_00_00)
            .filter(|high| high % 3 == 0)
            .map(|high| (high << 8) | 0x2a)
            .collect();
        let ledger = Arc::new(Ledger {
            place: 0x2a,
            held: std::sync::Mutex::new(dead.clone()),
        });
        ep.share_address(ledger.clone());
        let qpns: Vec<Qpn> = (0..300).map(|_| ep.create_qp(init).unwrap()).collect();
        for qpn in &qpns {
            assert_eq!(qpn.value() & 0xff, 0x2a, "{qpn:?}");
            assert!(!dead.contains(&qpn.value()), "{qpn:?} was a dead device's");
        }
        ep.destroy_qp(Duration::ZERO, qpns[0], []).unwrap();
        assert!(!ledger.held.lock().unwrap().contains(&qpns[0].value()));
        assert_eq!(ledger.held.lock().unwrap().len(), dead.len() + 299);
    }

    #[test]
    fn a_cq_outlives_its_qps_and_its_slot_is_reused() {
        let (mut ep, init) = endpoint();
        let qpn = ep.create_qp(init).unwrap();
        // libibverbs' EBUSY: a CQ a QP completes into stays.
        assert!(ep.destroy_cq(init.send_cq).is_err());
        ep.destroy_qp(Duration::ZERO, qpn, []).unwrap();
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
        let ah = ep.create_ah(init.pd, av).unwrap();
        ep.destroy_ah(ah).unwrap();
        assert_eq!(ep.destroy_ah(ah), Err(VerbsError::UnknownAh(ah)));
        assert_eq!(ep.resources().address_handles, 0);
        assert_eq!(
            ep.create_ah(init.pd, av),
            Ok(ah),
            "the free slot is taken first"
        );
        assert_eq!(ep.resources().address_handles, 1);
    }
}
