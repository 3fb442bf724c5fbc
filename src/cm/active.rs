//! The active side: the REQ out, the REP in, the RTU out (IBTA 12.6.2, 12.6.8, 12.6.9; cm.c
//! `cm_format_req`, `cm_rep_handler`, `ib_send_cm_rtu`; cma.c `cma_connect_ib`), and the MRA
//! and REJ that may come instead.

use std::net::IpAddr;
use std::time::Duration;

use super::{
    check_peer, gid_of, ib_timeout, lookup, private_data, CmEndpoint, CmError, CmEvent, Conn,
    ConnId, Failure, Reply, State, HOP_LIMIT, MRA_SERVICE_TIMEOUT,
};
use crate::transport::{PathMtu, QpType};
use crate::wire::cm::{
    CmMessage, CmMraRepr, CmPath, CmRejRepr, CmRepRepr, CmReqRepr, CmRtuRepr, CmaHeader,
    CmaHeaderRepr, ServiceId, CMA_HEADER_LEN, REQ_PRIVATE_DATA, RTU_PRIVATE_DATA,
};
use crate::wire::{PKey, Psn, QKey, Qpn};

/// What an active side asks for in its REQ.
#[derive(Debug, Clone, Copy)]
pub struct ReqParams<'a> {
    /// The passive side's address.
    pub dst: IpAddr,
    /// The service to connect to.
    pub service_id: ServiceId,
    /// RDMA-CM's source port: the header's, and half of the flow label's seed.
    pub src_port: u16,
    /// Our QP's number, sent as the REQ's Local QPN.
    pub local_qpn: Qpn,
    /// The PSN our QP expects first (its `rq_psn`): the peer sends from it.
    pub starting_psn: Psn,
    /// RC or UC.
    pub qp_type: QpType,
    /// Our `max_dest_rd_atomic` and `max_rd_atomic`.
    pub responder_resources: u8,
    /// Our `max_rd_atomic`: READs and atomics we keep outstanding.
    pub initiator_depth: u8,
    /// The retry counts the passive side is to use: its transport retries and RNR retries.
    pub retry_count: u8,
    /// The RNR retry count the passive side is to use (3 bits; 7 means no limit).
    pub rnr_retry_count: u8,
    /// The path MTU to ask for.
    pub path_mtu: PathMtu,
    /// The local ACK timeout we use, and ask the passive side to use.
    pub local_ack_timeout: u8,
    /// Whether our QP takes its receives from a shared receive queue.
    pub srq: bool,
    /// Up to 56 bytes in RDMA-CM's IP port spaces (after its header), 92 otherwise.
    pub private_data: &'a [u8],
}

impl<'a> ReqParams<'a> {
    /// An RC connection of `local_qpn`, starting at `starting_psn`, to `service_id` at `dst`,
    /// with rping's connection parameters (one READ each way, seven retries of each kind),
    /// path MTU 1024, ACK timeout 14 (67 ms), source port 0 and no private data.
    pub fn rc(dst: IpAddr, service_id: ServiceId, local_qpn: Qpn, starting_psn: Psn) -> Self {
        ReqParams {
            dst,
            service_id,
            src_port: 0,
            local_qpn,
            starting_psn,
            qp_type: QpType::Rc,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: PathMtu::Mtu1024,
            local_ack_timeout: 14,
            srq: false,
            private_data: &[],
        }
    }
}

/// RoCEv2's flow label for an RDMA-CM connection: a hash of its two ports (cma.c
/// `cma_get_roce_udp_flow_label`), which rxe's fixture shows as 0xbc7c4 for 58498 to 7174.
fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xf_ffff
}

impl CmEndpoint {
    /// Sends a REQ for `p.service_id` to `p.dst`: [`CmEvent::Reply`] follows if the peer
    /// accepts, [`CmEvent::Failed`] if it rejects or never answers.
    pub fn connect(&mut self, now: Duration, p: &ReqParams<'_>) -> Result<ConnId, CmError> {
        self.now = self.now.max(now);
        let dst = check_peer(self.local, p.dst)?;
        let transport_service_type = match p.qp_type {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => return Err(CmError::Invalid("a UD QP is resolved with SIDR")),
        };
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::NoResources);
        }
        let ip = p.service_id.ip_port();
        let header_len = if ip.is_some() { CMA_HEADER_LEN } else { 0 };
        let mut private = private_data::<REQ_PRIVATE_DATA>(p.private_data, header_len)?;
        if ip.is_some() {
            let header = CmaHeaderRepr {
                src: self.local,
                src_port: p.src_port,
                dst,
            };
            header.emit(&mut CmaHeader::new_unchecked(&mut private[..]));
        }
        let id = self.fresh_id().ok_or(CmError::NoResources)?;
        let dst_port = ip.map_or(0, |(_, port)| port);
        let req = CmReqRepr {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: QKey(0),
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.config.response_timeout.min(31),
            transport_service_type,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.config.response_timeout.min(31),
            retry_count: p.retry_count.min(7),
            pkey: PKey::DEFAULT,
            path_mtu: p.path_mtu.ibv_enum(),
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: self.config.max_retries.min(15),
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: gid_of(self.local),
                remote_gid: gid_of(dst),
                flow_label: flow_label(p.src_port, dst_port),
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: HOP_LIMIT,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.local_ack_timeout.min(31),
            },
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data: private,
        };
        let tid = self.tid(id);
        let message = CmMessage::Req(Box::new(req));
        let mad = self.outbox.send(&mut self.counters, dst, tid, &message);
        let period = self.config.request_period();
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                peer: dst,
                remote_id: 0,
                tid,
                local_qpn: p.local_qpn,
                remote_qpn: Qpn::new(0),
                local_psn: p.starting_psn,
                ack_timeout: p.local_ack_timeout,
                period,
                // The passive side sends again after the response time our REQ announces
                // (cm.c `cm_req_handler`: `timeout_ms` from LocalCMResponseTimeout).
                peer_period: ib_timeout(self.config.response_timeout),
                answered_dreq: false,
                retries_left: self.config.max_retries,
                deadline: Some(self.now + period),
                last: Some(mad),
                rejected: false,
            },
        );
        Ok(ConnId(id))
    }

    /// A REP: the answer to our REQ, or a repeat of it.
    pub(super) fn on_rep(&mut self, src: IpAddr, rep: &CmRepRepr) {
        let now = self.now;
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, rep.remote_comm_id)
        else {
            return;
        };
        match conn.state {
            State::ReqSent => {
                if rep.local_qpn.value() < 2 || rep.local_comm_id == 0 {
                    // Nothing can be connected to QP0 or QP1; let the REQ's timer run, as for
                    // a REP that never came.
                    self.counters.dropped_malformed += 1;
                    return;
                }
                conn.state = State::RepRcvd;
                conn.remote_id = rep.local_comm_id;
                conn.remote_qpn = rep.local_qpn;
                // An application that moves its QP itself (librdmacm's ID without a QP) calls
                // establish when it is ready; it has as long as a passive application has to
                // answer a REQ, which is about as long as the peer sends its REP again.
                conn.deadline = Some(now + ib_timeout(MRA_SERVICE_TIMEOUT));
                conn.last = None;
                let reply = Reply {
                    peer_qpn: rep.local_qpn,
                    peer_psn: rep.starting_psn,
                    local_psn: conn.local_psn,
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    rnr_retry_count: rep.rnr_retry_count,
                    target_ack_delay: rep.target_ack_delay,
                    private_data: rep.private_data.to_vec(),
                };
                let conn = ConnId(rep.remote_comm_id);
                let reply = Box::new(reply);
                self.events.push_back(CmEvent::Reply { conn, reply });
            }
            // Our RTU was lost: the peer asks again.
            State::Established | State::RepRcvd if rep.local_comm_id == conn.remote_id => {
                self.counters.duplicates += 1;
                if let Some(rtu) = conn.last.clone() {
                    self.outbox.resend(&mut self.counters, conn.peer, rtu);
                }
            }
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// Sends the RTU once the QP has taken the REP's values: the connection is established.
    pub fn establish(&mut self, now: Duration, conn: ConnId) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get_mut(&conn.0).ok_or(CmError::Unknown)?;
        if c.state != State::RepRcvd {
            return Err(CmError::WrongState("an RTU answers a REP"));
        }
        let rtu = CmRtuRepr {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_id,
            private_data: [0; RTU_PRIVATE_DATA],
        };
        let message = CmMessage::Rtu(Box::new(rtu));
        c.last = Some(
            self.outbox
                .send(&mut self.counters, c.peer, c.tid, &message),
        );
        c.state = State::Established;
        c.deadline = None;
        self.events.push_back(CmEvent::Established { conn });
        Ok(())
    }

    /// A REJ: of our REQ or REP, or of a REQ we had not answered yet.
    pub(super) fn on_rej(&mut self, src: IpAddr, rej: &CmRejRepr) {
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, rej.remote_comm_id)
        else {
            return;
        };
        // A REJ of a REQ may name no sender (cm.c `cm_issue_rej`); otherwise it must be the
        // peer we know.
        let sender_known = conn.remote_id != 0 && rej.local_comm_id != 0;
        if sender_known && rej.local_comm_id != conn.remote_id {
            self.counters.dropped_unexpected += 1;
            return;
        }
        match conn.state {
            State::ReqSent | State::RepRcvd | State::ReqRcvd | State::RepSent => {
                let failure = Failure::Rejected {
                    reason: rej.reason,
                    private_data: rej.private_data.to_vec(),
                };
                self.fail(rej.remote_comm_id, failure);
            }
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// An MRA: the peer needs longer to answer our REQ or REP.
    pub(super) fn on_mra(&mut self, src: IpAddr, mra: &CmMraRepr) {
        use crate::wire::cm::rej::{REJECTED_REP, REJECTED_REQ};
        let now = self.now;
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, mra.remote_comm_id)
        else {
            return;
        };
        match (conn.state, mra.message_mraed) {
            (State::ReqSent, REJECTED_REQ) | (State::RepSent, REJECTED_REP) => {
                // cm.c `cm_mra_handler`: the service timeout plus the usual wait. A peer that
                // asks for hours is held to the kernel's own setting.
                let service = ib_timeout(mra.service_timeout.min(MRA_SERVICE_TIMEOUT));
                conn.deadline = Some(now + service + conn.period);
            }
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// An ICMP destination unreachable for a packet we sent to `peer`, with the start of the
    /// packet it quotes (as much as the io layer kept). ICMP is easily forged, so it is weighed
    /// as TCP weighs it while a connection opens (RFC 5927 section 4.1, RFC 5461): it ends only
    /// an attempt whose REQ is still unanswered toward that destination, or a SIDR request
    /// there, and when the quote reaches the MAD (Linux quotes whole packets), only the one
    /// whose ID it names. An established connection, or a REP or DREQ that drew it, is left
    /// to its own timers. Counted either way.
    pub fn peer_refused(&mut self, now: Duration, peer: IpAddr, quoted: &[u8]) {
        self.now = self.now.max(now);
        let peer = peer.to_canonical();
        let Some(named) = quoted_request(quoted) else {
            self.counters.icmp_ignored += 1;
            return;
        };
        let attempts: Vec<u32> = (self.conns.iter())
            .filter(|(&id, c)| {
                c.peer == peer && c.state == State::ReqSent && named.is_none_or(|n| n == id)
            })
            .map(|(&id, _)| id)
            .collect();
        let resolving = self.sidr_unreachable(peer, named);
        if attempts.is_empty() && resolving == 0 {
            self.counters.icmp_ignored += 1;
            return;
        }
        self.counters.icmp_accepted += 1;
        for id in attempts {
            self.fail(id, Failure::Unreachable);
        }
    }
}

/// What an ICMP message's quote says it answers: `Some(Some(id))` a REQ or SIDR_REQ to QP1
/// with this communication or request ID, `Some(None)` a quote too short to tell (a router's
/// may hold only the UDP header), `None` another packet (a data packet, another CM message).
fn quoted_request(quoted: &[u8]) -> Option<Option<u32>> {
    use crate::wire::cm::{attr, MadHeader, CM_DATA_AT};
    use crate::wire::{Bth, Deth};
    let Ok(bth) = Bth::new_checked(quoted) else {
        return Some(None);
    };
    if bth.dest_qp() != Qpn::GSI {
        return None;
    }
    let mad = quoted
        .get(Bth::<&[u8]>::LEN + Deth::<&[u8]>::LEN..)
        .unwrap_or(&[]);
    let Some(id) = mad.get(CM_DATA_AT..CM_DATA_AT + 4) else {
        return Some(None);
    };
    // REQ's Local Communication ID and SIDR_REQ's Request ID both open the message.
    match MadHeader::new_checked(mad).map(|h| h.attr_id()) {
        Ok(attr::REQ | attr::SIDR_REQ) => Some(Some(u32::from_be_bytes(id.try_into().ok()?))),
        _ => None,
    }
}
