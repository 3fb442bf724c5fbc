//! The engine's side of connection management: the CM agent of the device, the
//! application's CM commands, and the CM's events routed to whoever waits for them (a
//! listener's channel, a connection's, a SIDR request's).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::Reply;
use crate::cm::agent::{Accept, Agent, AgentCounters, Connect, QpMover};
use crate::cm::AppQps;
use crate::cm::{
    CmConfig, CmCounters, CmError, CmEvent, ConnId, ConnectRequest, ListenerId, SidrId,
};
use crate::transport::{AsyncEvent, ConnectOptions, Endpoint, Resources};
use crate::wire::cm::{RejReason, ServiceId, SidrStatus};
use crate::wire::{QKey, Qpn};

/// Where the CM's events for a listener or a SIDR request go: a channel the application may
/// wait on from a thread or await from a task (`verbs::inbox`).
pub(crate) type EventSender = flume::Sender<CmEvent>;

/// What a connection's handle hears on its channel: the CM's events, and the failure of the QP
/// the CM connected (from the QP's own engine, [`super::Command::WatchQp`]).
#[derive(Debug)]
pub(crate) enum ConnEvent {
    Cm(CmEvent),
    /// The QP met an error and went to ERROR: `QpAccessError` or `QpFatal`, the first of them.
    QpFailed(AsyncEvent),
}

/// Where a connection's events go.
pub(crate) type ConnSender = flume::Sender<ConnEvent>;

/// The bytes of the agent's receive buffers, kept apart from the application's regions.
pub(super) const AGENT_REGION: u64 = 64 * 1024;

/// A connection the application asks for.
#[derive(Debug)]
pub(crate) struct ConnectCall {
    pub qpn: Qpn,
    pub dst: IpAddr,
    pub service_id: ServiceId,
    pub options: ConnectOptions,
    pub private_data: Vec<u8>,
    pub mover: QpMover,
}

/// What the application asks of the device's CM.
pub(crate) enum CmCommand {
    /// Listens on a service; its requests go to `requests`.
    Listen {
        service_id: ServiceId,
        requests: EventSender,
        reply: Reply<Result<ListenerId, CmError>>,
    },
    Unlisten(ListenerId),
    /// Sends a REQ; the connection's events go to `events`.
    Connect {
        call: Box<ConnectCall>,
        events: ConnSender,
        reply: Reply<Result<ConnId, CmError>>,
    },
    /// Accepts a request with a QP; the connection's events go to `events`.
    Accept {
        conn: ConnId,
        qpn: Qpn,
        request: Box<ConnectRequest>,
        options: Box<ConnectOptions>,
        private_data: Vec<u8>,
        mover: QpMover,
        events: ConnSender,
        reply: Reply<Result<(), CmError>>,
    },
    /// Sends the RTU of a connection whose QP the application moves (`rdma_establish`).
    Establish {
        conn: ConnId,
        reply: Reply<Result<(), CmError>>,
    },
    Reject {
        conn: ConnId,
        reason: RejReason,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CmError>>,
    },
    /// Sends the DREQ; `Disconnected` follows on the connection's channel.
    Disconnect {
        conn: ConnId,
        reply: Reply<Result<(), CmError>>,
    },
    /// The application let go of a connection or a request without answering it.
    Abort(ConnId),
    /// The application lets a request go unanswered, with nothing sent (its backlog is full).
    Ignore(ConnId),
    /// A QP is being destroyed while its handle lives on: no connection may move it from now
    /// on, as its number may come to name another QP ([`crate::cm::agent::Agent::forget_qp`]).
    ForgetQp {
        qpn: Qpn,
        reply: Reply<()>,
    },
    SidrResolve {
        dst: IpAddr,
        service_id: ServiceId,
        private_data: Vec<u8>,
        events: EventSender,
        reply: Reply<Result<SidrId, CmError>>,
    },
    SidrReply {
        id: SidrId,
        result: Result<(Qpn, QKey), SidrStatus>,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CmError>>,
    },
    Counters(Reply<(CmCounters, AgentCounters)>),
    /// Sends `true` on `settled` once no disconnect is in flight ([`CmEndpoint::lingering`]),
    /// or `false` after `max`: a caller that runs the engine itself may see that deadline
    /// before its own wait ends, and must not read a dropped sender as a stopped engine.
    ///
    /// [`CmEndpoint::lingering`]: crate::cm::CmEndpoint::lingering
    Linger {
        settled: Sender<bool>,
        max: Duration,
    },
}

/// The CM agent and where its events go.
#[derive(Debug)]
pub(super) struct CmRouter {
    agent: Agent,
    listeners: HashMap<ListenerId, EventSender>,
    conns: HashMap<ConnId, ConnSender>,
    sidr: HashMap<SidrId, EventSender>,
    /// Waiting for the disconnects in flight to settle, each until its deadline.
    lingering: Vec<(Duration, Sender<bool>)>,
    /// Draws RDMA-CM source ports, as the kernel picks an ephemeral port for each ID.
    next_port: u16,
    /// The agent's next deadline as the last pump left it. Between pumps only a datagram
    /// (a MAD on QP1, or the first packet on a QP waiting for its RTU) or that deadline can
    /// give the agent work: commands and ICMP reports pump on the spot.
    deadline: Option<Duration>,
    /// Whether the engine sees every QP's packets ([`pump_if_due`](Self::pump_if_due)): not
    /// on a device of several engines, where a QP of another engine may hear from its peer
    /// first.
    sees_all_qps: bool,
}

/// RDMA-CM's source ports: Linux's default ephemeral range, 32768 to 60999.
const PORTS: std::ops::Range<u16> = 32768..61000;

impl CmRouter {
    pub(super) fn new(
        ep: &mut Endpoint,
        now: Duration,
        (seed, config): (u64, CmConfig),
        iova: u64,
        (app_qps, sees_all_qps): (Box<dyn AppQps>, bool),
    ) -> Result<Self, CmError> {
        let agent =
            Agent::new(ep, now, seed ^ 0xc3c3_5a5a_0f0f_9696, config, iova)?.with_app_qps(app_qps);
        Ok(CmRouter {
            agent,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            sidr: HashMap::new(),
            lingering: Vec::new(),
            next_port: PORTS.start + (seed % u64::from(PORTS.end - PORTS.start)) as u16,
            deadline: Some(now),
            sees_all_qps,
        })
    }

    /// Ends the CM's IDs in the device's place in its address group.
    pub(super) fn end_ids_in(&mut self, place: u8) {
        self.agent.cm_mut().end_ids_in(place);
    }

    pub(super) fn next_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// What the CM holds of the endpoint's resources.
    pub(super) fn resources(&self) -> Resources {
        self.agent.resources()
    }

    fn source_port(&mut self) -> u16 {
        let port = self.next_port;
        self.next_port = if port + 1 >= PORTS.end {
            PORTS.start
        } else {
            port + 1
        };
        port
    }

    /// Runs a command. A reply whose caller has gone is of no interest: sends are not checked.
    pub(super) fn command(&mut self, now: Duration, ep: &mut Endpoint, command: CmCommand) {
        match command {
            CmCommand::Listen {
                service_id,
                requests,
                reply,
            } => {
                let listened = self.agent.cm_mut().listen(service_id);
                if let Ok(id) = listened {
                    self.listeners.insert(id, requests);
                }
                let _ = reply.send(listened);
            }
            CmCommand::Unlisten(id) => {
                self.agent.cm_mut().unlisten(id);
                self.listeners.remove(&id);
            }
            CmCommand::Connect {
                call,
                events,
                reply,
            } => {
                let src_port = self.source_port();
                let connect = Connect {
                    qpn: call.qpn,
                    dst: call.dst,
                    service_id: call.service_id,
                    src_port,
                    options: &call.options,
                    private_data: &call.private_data,
                    mover: call.mover,
                };
                let result = self.agent.connect(now, ep, &connect);
                let _ = reply.send(result.and_then(|conn| self.route_conn(now, conn, events)));
            }
            CmCommand::Accept {
                conn,
                qpn,
                request,
                options,
                private_data,
                mover,
                events,
                reply,
            } => {
                let accept = Accept {
                    qpn,
                    request: &request,
                    options: &options,
                    private_data: &private_data,
                    mover,
                };
                let accepted = self.agent.accept(now, ep, conn, &accept);
                let routed = accepted.and_then(|()| self.route_conn(now, conn, events));
                let _ = reply.send(routed.map(|_| ()));
            }
            CmCommand::Establish { conn, reply } => {
                let _ = reply.send(self.agent.establish(now, conn));
            }
            CmCommand::Reject {
                conn,
                reason,
                private_data,
                reply,
            } => {
                let _ = reply.send(self.agent.cm_mut().reject(now, conn, reason, &private_data));
            }
            CmCommand::Disconnect { conn, reply } => {
                let _ = reply.send(self.agent.disconnect(now, ep, conn));
            }
            CmCommand::Abort(conn) => {
                self.conns.remove(&conn);
                self.agent.abort(now, conn);
            }
            CmCommand::Ignore(conn) => {
                let _ = self.agent.cm_mut().ignore(now, conn);
            }
            CmCommand::ForgetQp { qpn, reply } => {
                self.agent.forget_qp(qpn);
                let _ = reply.send(());
            }
            CmCommand::SidrResolve {
                dst,
                service_id,
                private_data,
                events,
                reply,
            } => {
                let src_port = self.source_port();
                let result =
                    self.agent
                        .cm_mut()
                        .sidr_resolve(now, dst, service_id, src_port, &private_data);
                if let Ok(id) = result {
                    self.sidr.insert(id, events);
                }
                let _ = reply.send(result);
            }
            CmCommand::SidrReply {
                id,
                result,
                private_data,
                reply,
            } => {
                let _ = reply.send(
                    self.agent
                        .cm_mut()
                        .sidr_reply(now, id, result, &private_data),
                );
            }
            CmCommand::Counters(reply) => {
                let counters = (
                    self.agent.cm().counters().clone(),
                    self.agent.counters().clone(),
                );
                let _ = reply.send(counters);
            }
            CmCommand::Linger { settled, max } => self.lingering.push((now + max, settled)),
        }
        self.pump(now, ep);
    }

    /// The io layer could not reach `dst`.
    pub(super) fn handle_unreachable(&mut self, now: Duration, ep: &mut Endpoint, dst: IpAddr) {
        self.agent.handle_unreachable(now, ep, dst);
        self.pump(now, ep);
    }

    /// An ICMP destination unreachable came for a packet to `dst`.
    pub(super) fn handle_refused(
        &mut self,
        now: Duration,
        ep: &mut Endpoint,
        (dst, quoted): (IpAddr, &[u8]),
    ) {
        self.agent.handle_refused(now, ep, dst, quoted);
        self.pump(now, ep);
    }

    /// Sends `conn`'s events to `events` from now on. An ID still routed to an older handle
    /// (a 32-bit draw that came up twice while the old handle lives) is refused rather than
    /// shared: that handle's drop would end the new connection.
    fn route_conn(
        &mut self,
        now: Duration,
        conn: ConnId,
        events: ConnSender,
    ) -> Result<ConnId, CmError> {
        if self.conns.contains_key(&conn) {
            self.agent.abort(now, conn);
            return Err(CmError::NoResources);
        }
        self.conns.insert(conn, events);
        Ok(conn)
    }

    /// Lets the agent do what is due, then hands its events out. A request no one can take
    /// (its listener's queue full, or the listener gone) is refused at once: the peer hears
    /// "no resources" rather than waiting.
    pub(super) fn pump(&mut self, now: Duration, ep: &mut Endpoint) {
        self.agent.pump(now, ep);
        let mut refused = false;
        while let Some(event) = self.agent.poll_event() {
            refused |= !self.route(now, event);
        }
        if refused {
            // The refusals go out now, not at the next turn.
            self.agent.pump(now, ep);
        }
        self.deadline = self.agent.next_deadline();
        if self.lingering.is_empty() {
            return;
        }
        if self.agent.cm().lingering() == 0 {
            for (_, settled) in self.lingering.drain(..) {
                let _ = settled.try_send(true);
            }
        } else {
            self.lingering.retain(|(until, settled)| {
                let waiting = *until > now;
                if !waiting {
                    let _ = settled.try_send(false);
                }
                waiting
            });
        }
    }

    /// [`pump`](Self::pump), at a turn that received datagrams (`received`), reached the
    /// agent's deadline, or waits for disconnects to settle; not at an idle turn, where it
    /// would find nothing to do at the cost of a look at every connection's timer.
    pub(super) fn pump_if_due(&mut self, now: Duration, ep: &mut Endpoint, received: bool) {
        let due = received
            || !self.sees_all_qps
            || !self.lingering.is_empty()
            || self.deadline.is_some_and(|deadline| deadline <= now);
        if due {
            self.pump(now, ep);
        }
    }

    /// Hands an event to whoever waits for it; false if a request had to be refused.
    fn route(&mut self, now: Duration, event: CmEvent) -> bool {
        match event {
            CmEvent::ConnectRequest { conn, listener, .. } => {
                let taken = self.to_listener(listener, event);
                if !taken {
                    let cm = self.agent.cm_mut();
                    let _ = cm.reject(now, conn, RejReason::NO_RESOURCES, &[]);
                }
                taken
            }
            CmEvent::SidrRequest { id, listener, .. } => {
                let taken = self.to_listener(listener, event);
                if !taken {
                    let cm = self.agent.cm_mut();
                    let _ = cm.sidr_reply(now, id, Err(SidrStatus::REJECT), &[]);
                }
                taken
            }
            // A connection's route stays until its handle lets go of it (`Abort`), so that
            // its channel never closes under a waiting application.
            CmEvent::Reply { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Failed { conn, .. }
            | CmEvent::Disconnected { conn } => {
                if let Some(tx) = self.conns.get(&conn) {
                    let _ = tx.try_send(ConnEvent::Cm(event));
                }
                true
            }
            CmEvent::SidrResolved { id, .. } | CmEvent::SidrTimedOut { id } => {
                if let Some(tx) = self.sidr.remove(&id) {
                    let _ = tx.try_send(event);
                }
                true
            }
        }
    }

    /// Queues a request for its listener's application; false if it has no room or is gone.
    fn to_listener(&self, listener: ListenerId, event: CmEvent) -> bool {
        let tx = self.listeners.get(&listener);
        tx.is_some_and(|tx| tx.try_send(event).is_ok())
    }
}
