//! Teardown: DREQ and DREP, timewait, and what ending a connection in any state sends (IBTA
//! 12.6.10, 12.6.11, 12.9.6; cm.c `ib_send_cm_dreq`, `cm_dreq_handler`, `cm_issue_drep`,
//! `cm_destroy_id`, `cm_enter_timewait`).

use std::net::IpAddr;
use std::time::Duration;

use super::{ib_timeout, lookup, CmEndpoint, CmError, CmEvent, ConnId, Failure, State};
use crate::wire::cm::{
    CmDrepRepr, CmDreqRepr, CmMessage, RejReason, DREP_PRIVATE_DATA, DREQ_PRIVATE_DATA,
};

impl CmEndpoint {
    /// Ends an established connection: sends the DREQ, and again until the DREP;
    /// [`CmEvent::Disconnected`] follows either way. A connection not yet established ends
    /// as [`abort`](Self::abort) ends it.
    pub fn disconnect(&mut self, now: Duration, conn: ConnId) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get(&conn.0).ok_or(CmError::Unknown)?;
        match c.state {
            State::Established => {
                self.send_dreq(conn.0);
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.state = State::DreqSent;
                    c.retries_left = self.config.max_retries;
                    c.deadline = Some(self.now + c.period);
                }
                Ok(())
            }
            State::DreqSent | State::TimeWait => Ok(()),
            _ => self.abort(now, conn),
        }
    }

    /// The application is done with a connection in whatever state, as when the kernel
    /// destroys a CM ID: an attempt is rejected (REJ timeout before the REP, consumer defined
    /// after), an established connection gets one DREQ, and the ID waits out its timewait.
    /// No event follows.
    pub fn abort(&mut self, now: Duration, conn: ConnId) -> Result<(), CmError> {
        self.now = self.now.max(now);
        let c = self.conns.get(&conn.0).ok_or(CmError::Unknown)?;
        match c.state {
            State::ReqSent => {
                self.send_rej(conn.0, RejReason::TIMEOUT, &[]);
                self.forget(conn.0);
            }
            State::ReqRcvd | State::RepRcvd | State::RepSent => {
                self.send_rej(conn.0, RejReason::CONSUMER_DEFINED, &[]);
                self.forget(conn.0);
            }
            State::Established => {
                self.send_dreq(conn.0);
                self.enter_timewait(conn.0);
            }
            State::DreqSent => self.enter_timewait(conn.0),
            State::TimeWait => {}
        }
        Ok(())
    }

    /// Sends connection `id`'s DREQ and keeps it for retransmission.
    fn send_dreq(&mut self, id: u32) {
        let tid = self.tid(id);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let dreq = CmDreqRepr {
            local_comm_id: id,
            remote_comm_id: conn.remote_id,
            remote_qpn: conn.remote_qpn,
            private_data: [0; DREQ_PRIVATE_DATA],
        };
        let message = CmMessage::Dreq(Box::new(dreq));
        conn.last = Some(
            self.outbox
                .send(&mut self.counters, conn.peer, tid, &message),
        );
    }

    /// A DREQ: the peer ends the connection, or ends one we do not know, or asks again.
    pub(super) fn on_dreq(&mut self, src: IpAddr, tid: u64, dreq: &CmDreqRepr) {
        let drep = |dreq: &CmDreqRepr| {
            CmMessage::Drep(Box::new(CmDrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; DREP_PRIVATE_DATA],
            }))
        };
        let known = self.conns.get(&dreq.remote_comm_id).is_some_and(|c| {
            c.peer == src && c.remote_id == dreq.local_comm_id && c.remote_id != 0
        });
        if !known {
            // cm.c `cm_issue_drep`: a peer that lost its state still hears that we are done.
            self.counters.unknown_dreqs_answered += 1;
            self.outbox.send(&mut self.counters, src, tid, &drep(dreq));
            return;
        }
        let id = dreq.remote_comm_id;
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, id) else {
            return;
        };
        // cm.c ignores a DREQ that names another QP than the connection's.
        if dreq.remote_qpn != conn.local_qpn {
            self.counters.dropped_unexpected += 1;
            return;
        }
        match conn.state {
            // A DREQ can overtake the RTU: the connection was up for the peer.
            State::Established | State::RepSent | State::DreqSent => {
                self.outbox.send(&mut self.counters, src, tid, &drep(dreq));
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
                self.enter_timewait(id);
                self.await_repeat(id);
            }
            State::TimeWait => {
                self.counters.duplicates += 1;
                self.outbox.send(&mut self.counters, src, tid, &drep(dreq));
                self.await_repeat(id);
            }
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// A DREP: the answer to our DREQ.
    pub(super) fn on_drep(&mut self, src: IpAddr, id: u32, sender: u32) {
        let Some(conn) = lookup(&mut self.conns, &mut self.counters, src, id) else {
            return;
        };
        match conn.state {
            State::DreqSent if sender == conn.remote_id => {
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
                self.enter_timewait(id);
            }
            // Both sides sent a DREQ, and each answered the other's.
            State::TimeWait if sender == conn.remote_id => self.counters.duplicates += 1,
            _ => self.counters.dropped_unexpected += 1,
        }
    }

    /// Waits the connection's local ACK timeout before its ID is free, so that its last
    /// packets are gone from the network (cm.c `cm_enter_timewait`).
    pub(super) fn enter_timewait(&mut self, id: u32) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::TimeWait;
            conn.deadline = Some(self.now + ib_timeout(conn.ack_timeout));
        }
    }

    /// We answered connection `id`'s DREQ: it stays in timewait until the peer, had the DREP
    /// been lost, would have sent its DREQ again (its retransmission period and an eighth more
    /// for the network), so that the repeat is answered from the connection and a closing
    /// device knows to wait for it ([`lingering`](Self::lingering)).
    fn await_repeat(&mut self, id: u32) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.answered_dreq = true;
            let repeat = self.now + conn.peer_period + conn.peer_period / 8;
            conn.deadline = conn.deadline.max(Some(repeat));
        }
    }

    /// A connection whose QP could not take what was negotiated: the peer gets a REJ, the
    /// application the reason.
    pub fn fail_local(&mut self, now: Duration, conn: ConnId, error: crate::transport::VerbsError) {
        self.now = self.now.max(now);
        if self.conns.contains_key(&conn.0) {
            self.send_rej(conn.0, RejReason::CONSUMER_DEFINED, &[]);
            self.fail(conn.0, Failure::Qp(error));
        }
    }

    /// The network says `peer` cannot be reached (the io layer's unreachable destinations):
    /// what waits on its answer ends now instead of after every retry. An attempt fails, a
    /// DREQ counts as answered, a SIDR request times out. Established connections stand: their
    /// QPs learn of it from their own packets.
    pub fn peer_unreachable(&mut self, now: Duration, peer: IpAddr) {
        self.now = self.now.max(now);
        let peer = peer.to_canonical();
        let waiting: Vec<(u32, State)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .map(|(&id, c)| (id, c.state))
            .collect();
        for (id, state) in waiting {
            match state {
                State::ReqSent | State::RepSent | State::RepRcvd => {
                    self.fail(id, Failure::Unreachable)
                }
                State::DreqSent => {
                    self.events
                        .push_back(CmEvent::Disconnected { conn: ConnId(id) });
                    self.enter_timewait(id);
                }
                State::ReqRcvd | State::Established | State::TimeWait => {}
            }
        }
        self.sidr_unreachable(peer, None);
    }
}
