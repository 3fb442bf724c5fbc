//! The CM agent: a [`CmEndpoint`] bound to a transport [`Endpoint`], as the kernel's ib_cm and
//! rdma_cm are bound to a device.
//!
//! It owns QP1 (the GSI QP, with its own CQ and receive buffers in a region of its own), takes
//! the MADs that arrive there, sends the CM's MADs as UD SENDs to the peers' QP1 (Q_Key
//! 0x80010000, P_Key 0xFFFF), and moves the application's QPs through the states a REQ and a
//! REP negotiate, with librdmacm's order: the passive side goes to RTS before it sends the REP
//! (`rdma_accept`), the active side when the REP comes, before it sends the RTU
//! (`ucma_process_conn_resp`). Like the CM, it is sans-IO: the engine or the simulator calls
//! [`pump`](Agent::pump) after feeding the endpoint, and at the agent's deadline.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::{
    CmConfig, CmEndpoint, CmError, CmEvent, ConnId, ConnectRequest, Outgoing, RepParams, Reply,
    ReqParams,
};
use crate::memory::{Access, MemoryRegion, PdId};
use crate::transport::{
    connect_steps, datagram_steps, AddressHandle, AddressVector, ConnectOptions, CqId, Endpoint,
    PathMtu, Payload, QpAttr, QpEndpoint, QpInit, QpState, QpType, RecvWr, Resources, SendOp,
    SendWr, UdDest, VerbsError, WcOpcode, WcStatus, GRH_LEN,
};
use crate::wire::cm::{RejReason, ServiceId, MAD_LEN};
use crate::wire::{QKey, Qpn};

/// Receive buffers posted on QP1: MADs that may arrive between two pumps.
const RECV_SLOTS: usize = 64;
/// A receive buffer: the GRH verbs put first, then the MAD.
const SLOT: usize = GRH_LEN + MAD_LEN;
/// Sends QP1 may have outstanding. A UD send is outstanding until its packet is built, which
/// can wait behind a turn's worth of other packets: room for a burst of MADs (a daemon
/// answering many connection requests at once) beyond what one turn sends. The queue grows
/// only as far as it is used.
const SEND_DEPTH: usize = 1024;
/// Address handles kept for the peers MADs go to; beyond them the cache starts over.
const MAX_AHS: usize = 256;

/// What the agent itself dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentCounters {
    /// Receives on QP1 that were no MAD: in error, of another length, or not from a QP1.
    pub receives_dropped: u64,
    /// MADs that could not be posted: QP1's send queue full, or no address handle for the
    /// destination. The CM sends again on its timers.
    pub sends_dropped: u64,
    /// Sends on QP1 that completed in error.
    pub sends_failed: u64,
}

/// A connection's QP, and what the agent still has to do with it.
#[derive(Debug)]
struct Bound {
    qpn: Qpn,
    peer: IpAddr,
    /// The active side's options, for the transitions when the REP comes.
    active: Option<ConnectOptions>,
    /// Who moves the QP.
    mover: QpMover,
    established: bool,
}

/// Who moves a connection's QP through INIT, RTR and RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpMover {
    /// The agent, as the REQ and the REP negotiate: librdmacm's IDs with a QP
    /// (`rdma_create_qp`).
    Agent,
    /// The application, with the attributes the CM negotiated ([`active_steps`],
    /// [`passive_steps`]): librdmacm's IDs without a QP, which learn them by
    /// `rdma_init_qp_attr` and end the active side's handshake by `rdma_establish`
    /// ([`Agent::establish`]). The QP, of this type, may be one the agent never sees (UCX
    /// names a placeholder QP and connects its own out of band); the agent neither checks nor
    /// moves it, not even to ERROR when the connection ends (cma.c moves only `id->qp`).
    Application(QpType),
}

/// A connection attempt, as [`Agent::connect`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Connect<'a> {
    /// An RC or UC QP in RESET or INIT.
    pub qpn: Qpn,
    /// The passive side's address.
    pub dst: IpAddr,
    /// The service to connect to.
    pub service_id: ServiceId,
    /// RDMA-CM's source port, for its header.
    pub src_port: u16,
    /// The QP's attributes: its access flags, path MTU, ACK timeout and RNR timer, the retry
    /// counts asked of the peer, and the READ/atomic depth offered both ways.
    pub options: &'a ConnectOptions,
    /// Private data for the REQ: up to 56 bytes in RDMA-CM's IP port spaces, 92 otherwise.
    pub private_data: &'a [u8],
    /// Who moves the QP.
    pub mover: QpMover,
}

/// An answer to a connection request, as [`Agent::accept`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Accept<'a> {
    /// An RC or UC QP of the type the request asks for, in RESET or INIT.
    pub qpn: Qpn,
    /// The request, as [`CmEvent::ConnectRequest`] gave it.
    pub request: &'a ConnectRequest,
    /// The access the QP grants, its RNR timer, the RNR retry count the peer is to use, and
    /// the READ/atomic depth offered both ways.
    pub options: &'a ConnectOptions,
    /// Private data for the REP: up to 196 bytes.
    pub private_data: &'a [u8],
    /// Who moves the QP.
    pub mover: QpMover,
}

/// The INIT, RTR and RTS attributes of the active side's QP once `reply` came from `peer`,
/// for a connection asked with `options` on a port of `port_mtu`: what the agent applies, or
/// what an application that moves its QP applies itself.
pub fn active_steps(
    qp_type: QpType,
    peer: IpAddr,
    reply: &Reply,
    options: &ConnectOptions,
    port_mtu: PathMtu,
) -> [QpAttr; 3] {
    let mtu = options.mtu.map_or(port_mtu, |mtu| mtu.min(port_mtu));
    let negotiated = ConnectOptions {
        mtu: Some(mtu),
        rnr_retry: reply.rnr_retry_count,
        ..*options
    };
    let remote = QpEndpoint {
        addr: peer,
        qpn: reply.peer_qpn,
        psn: reply.local_psn,
        mtu,
        qkey: QKey(0),
    };
    let mut steps = connect_steps(qp_type, &remote, reply.peer_psn, &negotiated);
    if qp_type == QpType::Rc {
        steps[2].max_rd_atomic = Some(options.max_rd_atomic.min(reply.responder_resources));
    }
    steps
}

/// What accepting a request takes: the passive side's INIT, RTR and RTS attributes, and the
/// READ/atomic depths its REP names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassiveSteps {
    /// INIT, RTR and RTS.
    pub steps: [QpAttr; 3],
    /// Our `max_dest_rd_atomic`: the smaller of the peer's initiator depth and ours.
    pub responder_resources: u8,
    /// Our `max_rd_atomic`: the smaller of the peer's responder resources and ours.
    pub initiator_depth: u8,
}

/// The passive side's attributes for `request` accepted with `options`: the path MTU, the ACK
/// timeout and the retry counts the REQ asked (cm.c `cm_init_qp_rts_attr`), the PSNs each side
/// named, and the READ/atomic depths both sides allow.
pub fn passive_steps(request: &ConnectRequest, options: &ConnectOptions) -> PassiveSteps {
    let rc = request.qp_type == QpType::Rc;
    let depth = |ours: u8, theirs: u8| if rc { ours.min(theirs) } else { 0 };
    let responder_resources = depth(options.max_rd_atomic, request.initiator_depth);
    let initiator_depth = depth(options.max_rd_atomic, request.responder_resources);
    let negotiated = ConnectOptions {
        mtu: Some(request.path_mtu),
        access: options.access,
        timeout: request.local_ack_timeout,
        retry_cnt: request.retry_count,
        rnr_retry: request.rnr_retry_count,
        min_rnr_timer: options.min_rnr_timer,
        max_rd_atomic: 0,
    };
    // Our QP sends from the PSN the REQ names and expects the one our REP names.
    let remote = QpEndpoint {
        addr: request.peer,
        qpn: request.peer_qpn,
        psn: request.local_psn,
        mtu: request.path_mtu,
        qkey: QKey(0),
    };
    let mut steps = connect_steps(request.qp_type, &remote, request.peer_psn, &negotiated);
    if rc {
        steps[1].max_dest_rd_atomic = Some(responder_resources);
        steps[2].max_rd_atomic = Some(initiator_depth);
    }
    PassiveSteps {
        steps,
        responder_resources,
        initiator_depth,
    }
}

/// The application's QPs, as the agent moves them through their states. On a device of one
/// engine they are all on the agent's own endpoint ([`OwnQps`]); on a device of several, each
/// is on its engine's, which the engine layer reaches. QP1 is always on the agent's endpoint.
pub trait AppQps: fmt::Debug + Send {
    /// The type of `qpn`, if it exists.
    fn qp_type(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpType>;
    /// The state of `qpn`, if it exists.
    fn qp_state(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpState>;
    /// The packets `qpn` has accepted from its peer, if it exists; an answer up to a
    /// millisecond old may do (it tells the CM that a connection is up before its RTU).
    fn qp_received(&mut self, ep: &Endpoint, now: Duration, qpn: Qpn) -> Option<u64>;
    /// `ibv_modify_qp` of `qpn`.
    fn modify_qp(
        &mut self,
        ep: &mut Endpoint,
        now: Duration,
        qpn: Qpn,
        attr: &QpAttr,
    ) -> Result<(), VerbsError>;
}

/// Every QP on the agent's own endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnQps;

impl AppQps for OwnQps {
    fn qp_type(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpType> {
        ep.qp_type(qpn)
    }

    fn qp_state(&mut self, ep: &Endpoint, qpn: Qpn) -> Option<QpState> {
        ep.qp_state(qpn)
    }

    fn qp_received(&mut self, ep: &Endpoint, _: Duration, qpn: Qpn) -> Option<u64> {
        ep.qp_received(qpn)
    }

    fn modify_qp(
        &mut self,
        ep: &mut Endpoint,
        now: Duration,
        qpn: Qpn,
        attr: &QpAttr,
    ) -> Result<(), VerbsError> {
        ep.modify_qp(now, qpn, attr)
    }
}

/// The CM of a device, bound to its transport endpoint.
#[derive(Debug)]
pub struct Agent {
    cm: CmEndpoint,
    pd: PdId,
    cq: CqId,
    buffers: MemoryRegion,
    ahs: HashMap<IpAddr, AddressHandle>,
    bound: HashMap<ConnId, Bound>,
    events: VecDeque<CmEvent>,
    counters: AgentCounters,
    /// Where the application's QPs are.
    qps: Box<dyn AppQps>,
}

impl Agent {
    /// Creates QP1 on `ep`, with a CQ and a region of receive buffers at `iova` (an address no
    /// other region of the endpoint uses), and the CM.
    pub fn new(
        ep: &mut Endpoint,
        now: Duration,
        seed: u64,
        config: CmConfig,
        iova: u64,
    ) -> Result<Agent, CmError> {
        let pd = ep.alloc_pd();
        // Room for every receive and every send that could complete in error, so that QP1's
        // CQ cannot overrun between two pumps.
        let cq = ep.create_cq(RECV_SLOTS + SEND_DEPTH);
        let buffers = ep
            .reg_mr(pd, iova, RECV_SLOTS * SLOT, Access::LOCAL_WRITE)
            .map_err(|e| CmError::Qp(VerbsError::Memory(e)))?;
        let init = QpInit {
            qp_type: QpType::Ud,
            pd,
            send_cq: cq,
            recv_cq: cq,
            max_send_wr: SEND_DEPTH,
            max_recv_wr: RECV_SLOTS,
        };
        let gsi = ep.create_gsi_qp(init)?;
        let steps = datagram_steps(QKey::GSI);
        for step in &steps {
            ep.modify_qp(now, gsi, step)?;
        }
        let mut agent = Agent {
            cm: CmEndpoint::new(ep.local_addr(), seed, config),
            pd,
            cq,
            buffers,
            ahs: HashMap::new(),
            bound: HashMap::new(),
            events: VecDeque::new(),
            counters: AgentCounters::default(),
            qps: Box::new(OwnQps),
        };
        for slot in 0..RECV_SLOTS {
            agent.post_buffer(ep, slot)?;
        }
        Ok(agent)
    }

    /// The agent, moving the application's QPs through `qps` rather than on its own endpoint.
    pub fn with_app_qps(mut self, qps: Box<dyn AppQps>) -> Agent {
        self.qps = qps;
        self
    }

    /// The CM the agent drives.
    pub fn cm(&self) -> &CmEndpoint {
        &self.cm
    }

    /// The CM, for the calls that move no QP: listening, rejecting, SIDR.
    pub fn cm_mut(&mut self) -> &mut CmEndpoint {
        &mut self.cm
    }

    /// What the agent itself dropped so far.
    pub fn counters(&self) -> &AgentCounters {
        &self.counters
    }

    /// What the agent holds of the endpoint's resources: QP1, its CQ and buffers, and the
    /// address handles of the peers it talked to.
    pub fn resources(&self) -> Resources {
        Resources {
            qps: 1,
            cqs: 1,
            regions: 1,
            windows: 0,
            srqs: 0,
            address_handles: self.ahs.len(),
        }
    }

    /// Sends a REQ for `c.qpn`. A QP the agent moves goes to INIT first if it is in RESET (as
    /// `rdma_create_qp` leaves it), so that receives can be posted before the peer sends.
    pub fn connect(
        &mut self,
        now: Duration,
        ep: &mut Endpoint,
        c: &Connect<'_>,
    ) -> Result<ConnId, CmError> {
        let o = c.options;
        let qp_type = match c.mover {
            QpMover::Agent => {
                let qp_type = self.qps.qp_type(ep, c.qpn);
                let qp_type = qp_type.ok_or(VerbsError::UnknownQp(c.qpn))?;
                init_qp(now, (&mut *self.qps, ep), c.qpn, o.access)?;
                qp_type
            }
            QpMover::Application(qp_type) => qp_type,
        };
        // The REQ names the PSN our QP expects; the REP will name the one it sends from.
        let starting_psn = self.cm.random_psn();
        let rc = qp_type == QpType::Rc;
        let depth = if rc { o.max_rd_atomic } else { 0 };
        let conn = self.cm.connect(
            now,
            &ReqParams {
                dst: c.dst,
                service_id: c.service_id,
                src_port: c.src_port,
                local_qpn: c.qpn,
                starting_psn,
                qp_type,
                responder_resources: depth,
                initiator_depth: depth,
                retry_count: o.retry_cnt,
                rnr_retry_count: o.rnr_retry,
                path_mtu: o.mtu.map_or(ep.port_mtu(), |mtu| mtu.min(ep.port_mtu())),
                local_ack_timeout: o.timeout,
                srq: false,
                private_data: c.private_data,
            },
        )?;
        let bound = Bound {
            qpn: c.qpn,
            peer: c.dst.to_canonical(),
            active: Some(*o),
            mover: c.mover,
            established: false,
        };
        self.bound.insert(conn, bound);
        Ok(conn)
    }

    /// Accepts a request (of [`CmEvent::ConnectRequest`] `conn`) with `a.qpn`, an RC or UC QP
    /// in RESET or INIT: moves it to RTS with what the REQ asked and `a.options` allow
    /// ([`passive_steps`]), unless the application moves it, then sends the REP. A REQ whose
    /// path MTU is above the port's is rejected (reason 26, invalid MTU): the link could not
    /// carry the peer's packets.
    pub fn accept(
        &mut self,
        now: Duration,
        ep: &mut Endpoint,
        conn: ConnId,
        a: &Accept<'_>,
    ) -> Result<(), CmError> {
        let request = a.request;
        if request.path_mtu > ep.port_mtu() {
            self.cm
                .reject(now, conn, RejReason::INVALID_MTU, a.private_data)?;
            return Err(CmError::Invalid(
                "the peer's path MTU is above the port's: rejected with reason 26",
            ));
        }
        let qp_type = match a.mover {
            QpMover::Agent => self.qps.qp_type(ep, a.qpn),
            QpMover::Application(qp_type) => Some(qp_type),
        };
        if qp_type != Some(request.qp_type) {
            return Err(CmError::Invalid(
                "the QP is not of the type the REQ asks for",
            ));
        }
        let negotiated = passive_steps(request, a.options);
        if a.mover == QpMover::Agent {
            init_qp(now, (&mut *self.qps, ep), a.qpn, a.options.access)?;
            let [_, rtr, rts] = &negotiated.steps;
            self.qps.modify_qp(ep, now, a.qpn, rtr)?;
            self.qps.modify_qp(ep, now, a.qpn, rts)?;
        }
        self.cm.accept(
            now,
            conn,
            &RepParams {
                local_qpn: a.qpn,
                responder_resources: negotiated.responder_resources,
                initiator_depth: negotiated.initiator_depth,
                rnr_retry_count: a.options.rnr_retry,
                srq: false,
                private_data: a.private_data,
            },
        )?;
        let bound = Bound {
            qpn: a.qpn,
            peer: request.peer,
            active: None,
            mover: a.mover,
            established: false,
        };
        self.bound.insert(conn, bound);
        Ok(())
    }

    /// Ends the active side's handshake of a connection whose QP the application moves, once
    /// its QP is in RTS: the RTU goes out (`rdma_establish`).
    pub fn establish(&mut self, now: Duration, conn: ConnId) -> Result<(), CmError> {
        match self.bound.get(&conn) {
            Some(b) if b.active.is_some() && b.mover != QpMover::Agent => {
                self.cm.establish(now, conn)
            }
            Some(_) => Err(CmError::WrongState(
                "only the active side of a QP the application moves establishes",
            )),
            None => Err(CmError::Unknown),
        }
    }

    /// Ends a connection as `rdma_disconnect` does: its QP goes to ERROR (what it had
    /// outstanding is flushed), then the DREQ goes out.
    pub fn disconnect(
        &mut self,
        now: Duration,
        ep: &mut Endpoint,
        conn: ConnId,
    ) -> Result<(), CmError> {
        if let Some(bound) = self.bound.get(&conn).filter(|b| b.mover == QpMover::Agent) {
            to_error(now, (&mut *self.qps, ep), bound.qpn);
        }
        self.cm.disconnect(now, conn)
    }

    /// QP `qpn` is being destroyed, while connections may still name it: none moves it from now
    /// on, as its number may come to name another QP. Each such connection goes on without a
    /// QP, as one whose application gave up on it (the CM's own timers end it).
    pub fn forget_qp(&mut self, qpn: Qpn) {
        self.bound.retain(|_, bound| bound.qpn != qpn);
    }

    /// The application is done with a connection, in whatever state ([`CmEndpoint::abort`]);
    /// its QP is the application's to destroy.
    pub fn abort(&mut self, now: Duration, conn: ConnId) {
        self.bound.remove(&conn);
        let _ = self.cm.abort(now, conn);
    }

    /// The io layer could not reach `dst`: the CM's attempts toward it end now.
    pub fn handle_unreachable(&mut self, now: Duration, ep: &mut Endpoint, dst: IpAddr) {
        self.cm.peer_unreachable(now, dst);
        self.pump(now, ep);
    }

    /// An ICMP destination unreachable for a packet sent to `dst`, quoting `quoted`
    /// ([`CmEndpoint::peer_refused`]).
    pub fn handle_refused(&mut self, now: Duration, ep: &mut Endpoint, dst: IpAddr, quoted: &[u8]) {
        self.cm.peer_refused(now, dst, quoted);
        self.pump(now, ep);
    }

    /// The next CM event, after the agent has done what it asks of the QPs.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`pump`](Self::pump) next has timer work: the CM's earliest deadline.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.cm.next_deadline()
    }

    /// Does everything due: takes the MADs QP1 received, runs the CM's timers, notices
    /// connections whose QP has heard from the peer before the RTU, moves QPs as the REPs
    /// that came ask, and posts the CM's MADs on QP1.
    pub fn pump(&mut self, now: Duration, ep: &mut Endpoint) {
        self.receive(now, ep);
        if self.cm.next_deadline().is_some_and(|d| d <= now) {
            self.cm.handle_timeout(now);
        }
        for (&conn, bound) in &self.bound {
            if !bound.established
                && bound.active.is_none()
                && (self.qps.qp_received(ep, now, bound.qpn)).is_some_and(|n| n > 0)
            {
                self.cm.notify_established(conn);
            }
        }
        while let Some(event) = self.cm.poll_event() {
            self.on_event(now, ep, &event);
            self.events.push_back(event);
        }
        while let Some(out) = self.cm.poll_transmit() {
            self.send(now, ep, out);
        }
    }

    /// What a CM event asks of the QPs.
    fn on_event(&mut self, now: Duration, ep: &mut Endpoint, event: &CmEvent) {
        match event {
            CmEvent::Reply { conn, reply } => {
                if let Err(error) = self.complete_active(now, ep, *conn, reply) {
                    self.cm.fail_local(now, *conn, error);
                }
            }
            CmEvent::Established { conn } => {
                if let Some(bound) = self.bound.get_mut(conn) {
                    bound.established = true;
                }
            }
            // As librdmacm does on REJECTED and rdma_disconnect: the QP leaves RTS, and what
            // it had outstanding is flushed.
            CmEvent::Failed { conn, .. } | CmEvent::Disconnected { conn } => {
                let bound = self.bound.remove(conn);
                if let Some(bound) = bound.filter(|b| b.mover == QpMover::Agent) {
                    to_error(now, (&mut *self.qps, ep), bound.qpn);
                }
            }
            _ => {}
        }
    }

    /// The REP came: RTR and RTS with what it says, then the RTU; for a QP the application
    /// moves, nothing until it calls [`establish`](Self::establish).
    fn complete_active(
        &mut self,
        now: Duration,
        ep: &mut Endpoint,
        conn: ConnId,
        reply: &Reply,
    ) -> Result<(), VerbsError> {
        let Some(bound) = self.bound.get(&conn) else {
            // The application gave up on it; the CM's own timer ends it.
            return Ok(());
        };
        let (Some(options), QpMover::Agent) = (bound.active, bound.mover) else {
            return Ok(());
        };
        let qp_type = (self.qps.qp_type(ep, bound.qpn)).ok_or(VerbsError::UnknownQp(bound.qpn))?;
        let [_, rtr, rts] = active_steps(qp_type, bound.peer, reply, &options, ep.port_mtu());
        let qpn = bound.qpn;
        self.qps.modify_qp(ep, now, qpn, &rtr)?;
        self.qps.modify_qp(ep, now, qpn, &rts)?;
        self.cm
            .establish(now, conn)
            .map_err(|_| VerbsError::InvalidRequest("the connection ended during its REP"))
    }

    /// Takes the MADs QP1 received, and posts their buffers again.
    fn receive(&mut self, now: Duration, ep: &mut Endpoint) {
        while let Some(wc) = ep.poll_cq(self.cq) {
            if wc.opcode != WcOpcode::Recv {
                if wc.status != WcStatus::Success {
                    self.counters.sends_failed += 1;
                }
                continue;
            }
            let slot = wc.wr_id as usize;
            let mut mad = [0u8; MAD_LEN];
            let whole = wc.status == WcStatus::Success && wc.byte_len as usize == SLOT;
            let from_gsi = wc.src_qp == Some(Qpn::GSI);
            match wc.src_addr {
                Some(src) if whole && from_gsi && slot < RECV_SLOTS => {
                    let read = self.buffers.read(slot * SLOT + GRH_LEN, &mut mad);
                    match read {
                        Ok(()) => self.cm.handle_mad(now, src, &mad),
                        Err(_) => self.counters.receives_dropped += 1,
                    }
                }
                _ => self.counters.receives_dropped += 1,
            }
            if slot < RECV_SLOTS && self.post_buffer(ep, slot).is_err() {
                self.counters.receives_dropped += 1;
            }
        }
    }

    fn post_buffer(&mut self, ep: &mut Endpoint, slot: usize) -> Result<(), VerbsError> {
        let wr = RecvWr::new(slot as u64, self.buffers.sge(slot * SLOT, SLOT)?);
        ep.post_recv(Qpn::GSI, wr)
    }

    /// Posts a MAD as a UD SEND to the peer's QP1.
    fn send(&mut self, now: Duration, ep: &mut Endpoint, out: Outgoing) {
        let Some(ah) = self.ah(ep, out.dst) else {
            self.counters.sends_dropped += 1;
            return;
        };
        if ep.send_queue_room(Qpn::GSI) == 0 {
            self.counters.sends_dropped += 1;
            return;
        }
        let mut wr = SendWr::new(0, SendOp::Send, Payload::Inline(out.mad[..].into()));
        wr.signaled = false;
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: Qpn::GSI,
            remote_qkey: QKey::GSI,
        });
        if ep.post_send(now, Qpn::GSI, wr).is_err() {
            self.counters.sends_dropped += 1;
        }
    }

    /// The address handle for `dst`, made once and kept. A peer that sends from many
    /// addresses cannot grow the cache beyond [`MAX_AHS`]: it starts over.
    fn ah(&mut self, ep: &mut Endpoint, dst: IpAddr) -> Option<AddressHandle> {
        if let Some(&ah) = self.ahs.get(&dst) {
            return Some(ah);
        }
        if self.ahs.len() >= MAX_AHS {
            for (_, ah) in self.ahs.drain() {
                let _ = ep.destroy_ah(ah);
            }
        }
        let ah = ep.create_ah(self.pd, AddressVector { dest: dst }).ok()?;
        self.ahs.insert(dst, ah);
        Some(ah)
    }
}

/// Moves a QP in RESET to INIT with `access`; one in INIT is given `access`.
fn init_qp(
    now: Duration,
    (qps, ep): (&mut dyn AppQps, &mut Endpoint),
    qpn: Qpn,
    access: Access,
) -> Result<(), CmError> {
    match qps.qp_state(ep, qpn) {
        Some(QpState::Reset) => {
            let init = QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(access),
                ..Default::default()
            };
            Ok(qps.modify_qp(ep, now, qpn, &init)?)
        }
        // A QP its application took to INIT itself (librdmacm's `rdma_create_qp` grants remote
        // write only there) gets the access the connection grants, as cm.c sets it at RTR.
        Some(QpState::Init) => {
            let again = QpAttr {
                state: Some(QpState::Init),
                access: Some(access),
                ..Default::default()
            };
            Ok(qps.modify_qp(ep, now, qpn, &again)?)
        }
        Some(_) => Err(CmError::WrongState("the QP must be in RESET or INIT")),
        None => Err(CmError::Qp(VerbsError::UnknownQp(qpn))),
    }
}

/// Moves a QP to ERROR, if it still exists: its outstanding work is flushed.
fn to_error(now: Duration, (qps, ep): (&mut dyn AppQps, &mut Endpoint), qpn: Qpn) {
    let error = QpAttr {
        state: Some(QpState::Error),
        ..Default::default()
    };
    let _ = qps.modify_qp(ep, now, qpn, &error);
}
