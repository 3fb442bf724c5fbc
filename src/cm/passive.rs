//! The passive side: a REQ in, the application's answer (REP or REJ) out, the RTU in (IBTA
//! 12.6.5, 12.6.7, 12.9.6; cm.c `cm_req_handler`, `cm_dup_req_handler`, `cm_rep_handler`;
//! cma.c `cma_ib_req_handler`, `cma_save_ip_info`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use super::{
    gid_of, ib_timeout, lookup, private_data, CmEndpoint, CmError, CmEvent, Conn, ConnId,
    ConnectRequest, State, MRA_SERVICE_TIMEOUT, TARGET_ACK_DELAY,
};
use crate::transport::{PathMtu, QpType};
use crate::wire::cm::rej::{REJECTED_REQ, REJ_ARI};
use crate::wire::cm::{
    CmMessage, CmMraRepr, CmRejRepr, CmRepRepr, CmReqRepr, CmaHeader, CmaHeaderRepr, RejReason,
    ServiceId, CMA_HEADER_LEN, MRA_PRIVATE_DATA, REJ_PRIVATE_DATA, REP_PRIVATE_DATA,
};
use crate::wire::{QKey, Qpn};

/// A REQ for a service no one listens on yet, held for the listen grace
/// ([`CmConfig::listen_grace`](super::CmConfig::listen_grace)).
#[derive(Debug)]
pub(super) struct HeldReq {
    /// When it is rejected if no listener has taken it.
    pub until: Duration,
    src: IpAddr,
    tid: u64,
    req: Box<CmReqRepr>,
}

/// The passive side's answer to a REQ, for its REP.
#[derive(Debug, Clone, Copy)]
pub struct RepParams<'a> {
    /// Our QP's number, sent as the REP's Local QPN.
    pub local_qpn: Qpn,
    /// Our `max_dest_rd_atomic` and `max_rd_atomic`.
    pub responder_resources: u8,
    /// Our `max_rd_atomic`: READs and atomics we keep outstanding.
    pub initiator_depth: u8,
    /// The RNR retry count the active side is to use.
    pub rnr_retry_count: u8,
    /// Whether our QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// Up to 196 bytes.
    pub private_data: &'a [u8],
}

/// Why a REQ cannot be taken, as a REJ reason.
fn check_req(local: IpAddr, src: IpAddr, req: &CmReqRepr) -> Result<RequestParts, RejReason> {
    let qp_type = match req.transport_service_type {
        0 => QpType::Rc,
        1 => QpType::Uc,
        _ => return Err(RejReason::INVALID_TRANSPORT_TYPE),
    };
    let path_mtu = PathMtu::from_ibv_enum(req.path_mtu).ok_or(RejReason::INVALID_MTU)?;
    if req.local_qpn.value() < 2 || req.local_comm_id == 0 {
        return Err(RejReason::CONSUMER_DEFINED);
    }
    // The path names the two ends by GID: they must be the packet's (cm.c resolves a route
    // between them, and rejects with reason 12 where there is none).
    let path = &req.primary_path;
    if path.local_gid != gid_of(src) || path.remote_gid != gid_of(local) {
        return Err(RejReason::INVALID_GID);
    }
    // RDMA-CM's header, in its IP port spaces: the addresses must be the packet's, or a peer
    // could name another host as the one connecting (cma.c checks them against its routes).
    let (peer_port, data_at) = match req.service_id.ip_port() {
        Some(_) => {
            let header = CmaHeader::new_checked(&req.private_data[..])
                .and_then(|h| CmaHeaderRepr::parse(&h))
                .map_err(|_| RejReason::CONSUMER_DEFINED)?;
            if header.src.to_canonical() != src || header.dst.to_canonical() != local {
                return Err(RejReason::CONSUMER_DEFINED);
            }
            (header.src_port, CMA_HEADER_LEN)
        }
        None => (0, 0),
    };
    Ok(RequestParts {
        qp_type,
        path_mtu,
        peer_port,
        data_at,
    })
}

/// What `check_req` learned from a REQ.
struct RequestParts {
    qp_type: QpType,
    path_mtu: PathMtu,
    peer_port: u16,
    data_at: usize,
}

impl CmEndpoint {
    /// A REQ: new, repeated, for no listener, or one that cannot be taken.
    pub(super) fn on_req(&mut self, src: IpAddr, tid: u64, req: &CmReqRepr) {
        if let Some(&id) = self.by_remote.get(&(src, req.local_comm_id)) {
            self.on_repeated_req(id);
            return;
        }
        if let Some(old) = self.connection_of(src, req.local_qpn) {
            // cm.c `cm_match_req`: the peer's QP is already in a connection of ours (a new
            // communication ID for the same QP: the peer lost the old one). The REQ gets REJ
            // 10, stale connection, and an established old connection a DREQ.
            self.counters.rejected_stale += 1;
            self.reject_req(src, tid, req.local_comm_id, RejReason::STALE_CONN);
            if self
                .conns
                .get(&old)
                .is_some_and(|c| c.state == State::Established)
            {
                let _ = self.disconnect(self.now, ConnId(old));
            }
            return;
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            if !self.hold(src, tid, req) {
                self.counters.rejected_no_listener += 1;
                self.reject_req(src, tid, req.local_comm_id, RejReason::INVALID_SERVICE_ID);
            }
            return;
        };
        let parts = match check_req(self.local, src, req) {
            Ok(parts) => parts,
            Err(reason) => {
                self.counters.rejected_invalid += 1;
                self.reject_req(src, tid, req.local_comm_id, reason);
                return;
            }
        };
        let full = self.conns.len() >= self.config.max_connections;
        let id = match self.fresh_id() {
            Some(id) if !full && self.pending() < self.config.max_pending => id,
            _ => {
                self.counters.rejected_no_resources += 1;
                self.reject_req(src, tid, req.local_comm_id, RejReason::NO_RESOURCES);
                return;
            }
        };
        let local_psn = self.random_psn();
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: src,
                remote_id: req.local_comm_id,
                tid,
                local_qpn: Qpn::new(0),
                remote_qpn: req.local_qpn,
                local_psn,
                ack_timeout: req.primary_path.local_ack_timeout,
                // The REP is sent again as often as the active side would send its REQ, and
                // waits as long as it says it takes to answer.
                period: ib_timeout(req.local_cm_response_timeout),
                // The active side sends again after twice the packet life time and the
                // response time it asks of us (cm.c `ib_send_cm_req`: `timeout_ms`). The kernel
                // announces an ACK timeout one above its packet life time; softroce announces
                // the QP's and waits RoCE's packet life time: the longer of the two.
                peer_period: ib_timeout(req.remote_cm_response_timeout)
                    + 2 * ib_timeout(
                        (req.primary_path.local_ack_timeout.saturating_sub(1))
                            .max(self.config.packet_life_time),
                    ),
                answered_dreq: false,
                retries_left: req.max_cm_retries.min(self.config.max_retries),
                // How long the application may take: what our MRA promises.
                deadline: Some(self.now + ib_timeout(MRA_SERVICE_TIMEOUT)),
                last: None,
                rejected: false,
            },
        );
        self.by_remote.insert((src, req.local_comm_id), id);
        let request = ConnectRequest {
            service_id: req.service_id,
            peer: src,
            peer_port: parts.peer_port,
            peer_qpn: req.local_qpn,
            peer_psn: req.starting_psn,
            local_psn,
            qp_type: parts.qp_type,
            path_mtu: parts.path_mtu,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            local_ack_timeout: req.primary_path.local_ack_timeout,
            srq: req.srq,
            private_data: req.private_data[parts.data_at..].to_vec(),
        };
        self.events.push_back(CmEvent::ConnectRequest {
            conn: ConnId(id),
            listener,
            request: Box::new(request),
        });
    }

    /// Our connection, in any state before timewait, whose peer is `qpn` at `peer`. Not one in
    /// timewait: cm.c `cm_enter_timewait` takes it out of its table of remote QPs, so the peer
    /// may connect the number again (it destroyed the QP and drew the same number anew).
    fn connection_of(&self, peer: IpAddr, qpn: Qpn) -> Option<u32> {
        let same = |c: &Conn| {
            c.peer == peer && c.remote_qpn == qpn && qpn.value() != 0 && c.state != State::TimeWait
        };
        self.conns.iter().find(|(_, c)| same(c)).map(|(&id, _)| id)
    }

    /// A REQ we have seen: the peer did not hear our answer, or has not had one yet.
    fn on_repeated_req(&mut self, id: u32) {
        self.counters.duplicates += 1;
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let (peer, tid) = (conn.peer, conn.tid);
        match conn.state {
            // The application is still deciding: ask for patience (cm.c sends its MRA only
            // now, on a repeat).
            State::ReqRcvd => {
                let mra = CmMraRepr {
                    local_comm_id: id,
                    remote_comm_id: conn.remote_id,
                    message_mraed: REJECTED_REQ,
                    service_timeout: MRA_SERVICE_TIMEOUT,
                    private_data: [0; MRA_PRIVATE_DATA],
                };
                let message = CmMessage::Mra(Box::new(mra));
                self.outbox.send(&mut self.counters, peer, tid, &message);
            }
            // Our REP, or our REJ, was lost: the same again.
            State::RepSent => self.resend_last(id),
            State::TimeWait if conn.rejected => self.resend_last(id),
            // A REQ for a connection that has ended: stale (cm.c `cm_dup_req_handler`).
            State::TimeWait => {
                let remote_id = conn.remote_id;
                self.reject_req(peer, tid, remote_id, RejReason::STALE_CONN);
            }
            // Established, or the active side's own states: nothing to add.
            _ => {}
        }
    }

    /// A REJ of a REQ we keep no state for (cm.c `cm_issue_rej`): it names the REQ's sender,
    /// not us.
    /// Holds a REQ for no listener for the listen grace; false if it is to be rejected now:
    /// no grace, already [`MAX_HELD_REQS`](super::MAX_HELD_REQS) held, or a repeat of a held
    /// one (its sender waited a whole retry period, shorter than the grace: it is answered
    /// now, before its retries run out and it reports a timeout instead of the REJ).
    fn hold(&mut self, src: IpAddr, tid: u64, req: &CmReqRepr) -> bool {
        let same = |h: &HeldReq| h.src == src && h.req.local_comm_id == req.local_comm_id;
        if let Some(at) = self.held.iter().position(same) {
            self.held.remove(at);
            return false;
        }
        if self.config.listen_grace.is_zero() || self.held.len() >= super::MAX_HELD_REQS {
            return false;
        }
        self.held.push_back(HeldReq {
            until: self.now + self.config.listen_grace,
            src,
            tid,
            req: Box::new(req.clone()),
        });
        true
    }

    /// A listener for `service_id` appeared: the REQs held for it are taken as if they came
    /// now.
    pub(super) fn claim_held(&mut self, service_id: ServiceId) {
        let (claimed, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.req.service_id == service_id);
        self.held = rest;
        for h in claimed {
            self.on_req(h.src, h.tid, &h.req);
        }
    }

    /// Rejects the held REQs whose grace is over (REJ 8, as for no listener).
    pub(super) fn reject_held(&mut self, now: Duration) {
        while self.held.front().is_some_and(|h| h.until <= now) {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            self.counters.rejected_no_listener += 1;
            self.reject_req(
                h.src,
                h.tid,
                h.req.local_comm_id,
                RejReason::INVALID_SERVICE_ID,
            );
        }
    }

    fn reject_req(&mut self, dst: IpAddr, tid: u64, remote_id: u32, reason: RejReason) {
        let rej = CmRejRepr {
            local_comm_id: 0,
            remote_comm_id: remote_id,
            message_rejected: REJECTED_REQ,
            info_length: 0,
            reason,
            ari: [0; REJ_ARI],
            private_data: [0; REJ_PRIVATE_DATA],
        };
        let message = CmMessage::Rej(Box::new(rej));
        self.outbox.send(&mut self.counters, dst, tid, &message);
    }

    /// Accepts a connection request: sends the REP, and again until the RTU.
    pub fn accept(
        &mut self,
        now: Duration,
        conn: ConnId,
        p: &RepParams<'_>,
    ) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get_mut(&conn.0).ok_or(CmError::Unknown)?;
        if c.state != State::ReqRcvd {
            return Err(CmError::WrongState("a REP answers a REQ not yet answered"));
        }
        let rep = CmRepRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_id,
            local_qkey: QKey(0),
            local_qpn: p.local_qpn,
            local_eecn: 0,
            // What the request told the application its QP is to expect.
            starting_psn: c.local_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: TARGET_ACK_DELAY,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: self.ca_guid,
            private_data: private_data::<REP_PRIVATE_DATA>(p.private_data, 0)?,
        };
        let message = CmMessage::Rep(Box::new(rep));
        c.last = Some(
            self.outbox
                .send(&mut self.counters, c.peer, c.tid, &message),
        );
        c.local_qpn = p.local_qpn;
        c.state = State::RepSent;
        c.deadline = Some(self.now + c.period);
        Ok(())
    }

    /// Rejects a connection request with `reason` (librdmacm's `rdma_reject` sends 28,
    /// consumer defined) and up to 148 bytes of private data.
    pub fn reject(
        &mut self,
        now: Duration,
        conn: ConnId,
        reason: RejReason,
        data: &[u8],
    ) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get(&conn.0).ok_or(CmError::Unknown)?;
        if c.state != State::ReqRcvd {
            return Err(CmError::WrongState("a REJ answers a REQ not yet answered"));
        }
        private_data::<REJ_PRIVATE_DATA>(data, 0)?;
        let rej = self.send_rej(conn.0, reason, data);
        if let Some(c) = self.conns.get_mut(&conn.0) {
            // Kept a while, to answer the REQ's repeats with the same REJ: two of the active
            // side's periods, so that one lost REJ is answered.
            c.state = State::TimeWait;
            c.rejected = true;
            c.last = rej;
            c.deadline = Some(self.now + c.period * 2);
        }
        Ok(())
    }

    /// Forgets a connection request unanswered, and sends nothing, as the kernel's CM forgets a
    /// REQ for which a listener's backlog has no room (cm.c `cm_destroy_id` after the
    /// handler's `-ENOMEM`: no REJ, "to allow future retries"). The peer's CM sends its REQ
    /// again after its timeout, and that one is a new request.
    pub fn ignore(&mut self, now: Duration, conn: ConnId) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get(&conn.0).ok_or(CmError::Unknown)?;
        if c.state != State::ReqRcvd {
            return Err(CmError::WrongState(
                "only a REQ not yet answered can be ignored",
            ));
        }
        self.counters.ignored += 1;
        self.forget(conn.0);
        Ok(())
    }

    /// An RTU: the active side is ready.
    pub(super) fn on_rtu(&mut self, src: IpAddr, id: u32, sender: u32) {
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, id) else {
            return;
        };
        match conn.state {
            State::RepSent if sender == conn.remote_id => self.establish_passive(id),
            State::Established if sender == conn.remote_id => self.counters.duplicates += 1,
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// IBTA's communication-established event: the QP of a connection whose RTU has not come
    /// has received a packet from the peer, which it only sends once it has the REP. The RTU
    /// is taken as read (cm.c `ib_cm_notify`). Nothing happens in any other state.
    pub fn notify_established(&mut self, conn: ConnId) {
        if self
            .conns
            .get(&conn.0)
            .is_some_and(|c| c.state == State::RepSent)
        {
            self.establish_passive(conn.0);
        }
    }

    fn establish_passive(&mut self, id: u32) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::Established;
            conn.deadline = None;
            self.events
                .push_back(CmEvent::Established { conn: ConnId(id) });
        }
    }
}
