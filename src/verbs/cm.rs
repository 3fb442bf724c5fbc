//! Connections by RDMA-CM: what librdmacm gives C programs, so that no application invents
//! its own exchange of QP numbers. The device's CM speaks the InfiniBand CM on QP1 with
//! RDMA-CM's IP addressing, so the peer may be softroce, kernel rxe or a ConnectX NIC running
//! `rping`, `ucmatose` or perftest with `-R`.
//!
//! A server listens on a port and accepts requests with a QP of its own; a client connects a
//! QP to `address:port`. Either way the result is a [`Connection`]: the QP, connected (it
//! derefs to [`QueuePair`]), and the connection's end as an event. Dropping it disconnects.
//!
//! ```
//! use std::time::Duration;
//! use softroce::prelude::*;
//!
//! # fn main() -> Result<(), softroce::verbs::Error> {
//! let (server, client) = (Device::open(DeviceConfig::udp("127.0.0.61".parse().unwrap()))?,
//!                         Device::open(DeviceConfig::udp("127.0.0.62".parse().unwrap()))?);
//! let listener = server.listen(7174)?;
//! let (pd, cq) = (server.alloc_pd()?, server.create_cq(16)?);
//! let target = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let accepting = std::thread::spawn(move || -> Result<_, softroce::verbs::Error> {
//!     let request = listener.next_request(Duration::from_secs(10))?.expect("a request");
//!     let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
//!     request.accept(qp, &ConnectOptions::default(), &[])
//! });
//! let (pd, cq) = (client.alloc_pd()?, client.create_cq(16)?);
//! let source = pd.register(4096, Access::LOCAL_WRITE)?;
//! source.write(0, b"written by RDMA")?;
//! let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
//! let connection = Connection::connect(qp, "127.0.0.61:7174".parse().unwrap(),
//!                                      &ConnectOptions::default(), &[])?;
//! let _server_side = accepting.join().unwrap()?;
//! let region = target.remote(); // What the server would tell the client, in private data.
//! connection.post_send(SendWr::write(1, source.sge(0, 15)?, region))?;
//! assert_eq!(cq.wait(Duration::from_secs(10))?.map(|wc| wc.status), Some(WcStatus::Success));
//! assert_eq!(&target.to_vec()[..15], b"written by RDMA");
//! # Ok(()) }
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver};

use super::{receive, Device, Error, QueuePair, Result};
use crate::cm::agent::AgentCounters;
use crate::cm::{
    CmCounters, CmEvent, ConnId, ConnectRequest, Failure, ListenerId, SidrId, RDMA_UDP_QKEY,
};
use crate::engine::{CmCommand, Command, ConnectCall};
use crate::transport::{ConnectOptions, QpState, QpType};
use crate::wire::cm::{PortSpace, ServiceId, SidrStatus};
use crate::wire::{QKey, Qpn};

/// Requests a listener holds for the application before the CM refuses more ("no
/// resources"), as `rdma_listen`'s backlog.
const BACKLOG: usize = 64;

/// How often a wait for the CM looks again whether the device still runs: every wait ends
/// by the CM's own timers, which bound each step of the protocol.
const POLL: Duration = Duration::from_secs(1);

impl Device {
    /// Listens for RC and UC connections on `port` of RDMA-CM's TCP port space, as
    /// `rdma_listen` on an `RDMA_PS_TCP` ID bound to the device's address.
    pub fn listen(&self, port: u16) -> Result<Listener> {
        let service_id = ServiceId::ip(PortSpace::Tcp, port);
        Ok(Listener(Listening::start(self, service_id)?))
    }

    /// Listens for UD service resolution (SIDR) on `port` of RDMA-CM's UDP port space, as
    /// `rdma_listen` on an `RDMA_PS_UDP` ID (udaddy's server).
    pub fn listen_datagram(&self, port: u16) -> Result<DatagramListener> {
        let service_id = ServiceId::ip(PortSpace::Udp, port);
        Ok(DatagramListener(Listening::start(self, service_id)?))
    }

    /// Asks `to` which UD QP serves its port in RDMA-CM's UDP port space (SIDR, as
    /// `rdma_connect` on an `RDMA_PS_UDP` ID). Sends go to the answer with an address handle
    /// for `to.ip()` ([`ProtectionDomain::create_ah`](super::ProtectionDomain::create_ah)).
    pub fn resolve_datagram(&self, to: SocketAddr, private_data: &[u8]) -> Result<DatagramPeer> {
        let (events, answers) = bounded(1);
        let service_id = ServiceId::ip(PortSpace::Udp, to.port());
        let private_data = private_data.to_vec();
        self.engine().call(|reply| {
            Command::Cm(CmCommand::SidrResolve {
                dst: to.ip(),
                service_id,
                private_data,
                events,
                reply,
            })
        })??;
        loop {
            match receive(self.engine(), &answers, POLL)? {
                Some(CmEvent::SidrResolved {
                    result: Ok((qpn, qkey)),
                    private_data,
                    ..
                }) => {
                    return Ok(DatagramPeer {
                        addr: to.ip().to_canonical(),
                        qpn,
                        qkey,
                        private_data,
                    })
                }
                Some(CmEvent::SidrResolved {
                    result: Err(status),
                    ..
                }) => return Err(Error::Unresolved(status)),
                Some(CmEvent::SidrTimedOut { .. }) => {
                    return Err(Error::ConnectFailed(Failure::TimedOut))
                }
                Some(_) | None => {}
            }
        }
    }

    /// Waits, up to `max`, until no disconnect is in flight: every DREQ of ours answered, and
    /// every peer whose DREQ we answered past the time it would send it again had our DREP been
    /// lost (its retransmission period: about 4 to 7 s with librdmacm's defaults). True if
    /// that came before `max`.
    ///
    /// The kernel's CM outlives the processes that use it and answers a repeated DREQ long
    /// after they exit; softroce's CM lives in the process. A program that exits right after
    /// its connections end calls this first, or a peer that lost the last DREP keeps sending
    /// its DREQ for a minute before it reports the disconnect (cmatose's server, which waits
    /// for its DISCONNECTED events, hangs that long). Nothing else waits: dropping the device
    /// does not.
    pub fn linger(&self, max: Duration) -> Result<bool> {
        let (settled, done) = bounded(1);
        self.engine()
            .command(Command::Cm(CmCommand::Linger { settled, max }))?;
        Ok(receive(self.engine(), &done, max)?.is_some())
    }

    /// The CM's counters, and those of the agent that carries its MADs on QP1.
    pub fn cm_counters(&self) -> Result<(CmCounters, AgentCounters)> {
        Ok(self
            .engine()
            .call(|reply| Command::Cm(CmCommand::Counters(reply)))?)
    }
}

/// A listening service, of either port space.
#[derive(Debug)]
struct Listening {
    device: Device,
    id: ListenerId,
    port: u16,
    requests: Receiver<CmEvent>,
}

impl Listening {
    fn start(device: &Device, service_id: ServiceId) -> Result<Listening> {
        let (requests, incoming) = bounded(BACKLOG);
        let id = device.engine().call(|reply| {
            Command::Cm(CmCommand::Listen {
                service_id,
                requests,
                reply,
            })
        })??;
        Ok(Listening {
            device: device.clone(),
            id,
            port: service_id.0 as u16,
            requests: incoming,
        })
    }

    fn next(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        receive(self.device.engine(), &self.requests, timeout)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self
            .device
            .engine()
            .command(Command::Cm(CmCommand::Unlisten(self.id)));
    }
}

/// Listens for connections on a port: [`Device::listen`]. Requests that come while no one
/// asks for them wait, up to a backlog of 64; beyond it they are rejected. Dropping it stops
/// the listening: later requests are rejected as for no listener (REJ 8).
#[derive(Debug)]
pub struct Listener(Listening);

impl Listener {
    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.0.port
    }

    /// The next connection request, waiting up to `timeout` for one.
    pub fn next_request(&self, timeout: Duration) -> Result<Option<ConnectionRequest>> {
        let Some(CmEvent::ConnectRequest { conn, request, .. }) = self.0.next(timeout)? else {
            return Ok(None);
        };
        Ok(Some(ConnectionRequest {
            device: self.0.device.clone(),
            conn,
            request,
            answered: false,
        }))
    }
}

/// A peer's request to connect: its address, its private data and what its REQ asks. Answer
/// with [`accept`](Self::accept) or [`reject`](Self::reject); dropped unanswered, it is
/// rejected.
pub struct ConnectionRequest {
    device: Device,
    conn: ConnId,
    request: Box<ConnectRequest>,
    answered: bool,
}

impl fmt::Debug for ConnectionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionRequest")
            .field("peer", &self.peer())
            .field("request", &self.request)
            .finish()
    }
}

impl ConnectionRequest {
    /// The peer's address and RDMA-CM source port.
    pub fn peer(&self) -> SocketAddr {
        SocketAddr::new(self.request.peer, self.request.peer_port)
    }

    /// The peer's private data: 56 bytes, zero-padded by the sender.
    pub fn private_data(&self) -> &[u8] {
        &self.request.private_data
    }

    /// Everything the REQ asked: the peer's QPN and PSN, path MTU, READ depths, retry counts.
    pub fn details(&self) -> &ConnectRequest {
        &self.request
    }

    /// Accepts with `qp` (RC or UC as the peer asked, in RESET or INIT; post its receives
    /// first, after [`QueuePair::init`], if the peer may send at once): the QP goes to RTS
    /// with what the REQ negotiated, the REP goes out with up to 196 bytes of `private_data`,
    /// and the call returns once the peer's RTU (or its first packet) says it is ready.
    ///
    /// The QP may be shared (an `Arc<QueuePair>`), for a caller that posts to it while the
    /// connection is made elsewhere, as librdmacm's programs do.
    pub fn accept(
        self,
        qp: impl Into<Arc<QueuePair>>,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Connection> {
        let connection = self.accept_now(qp, options, private_data)?;
        connection.established()?;
        Ok(connection)
    }

    /// [`accept`](Self::accept) up to the REP: returns once the QP is in RTS and the REP is on
    /// its way, as librdmacm's `rdma_accept` does, without waiting for the peer's RTU;
    /// [`Connection::established`] waits for it.
    pub fn accept_now(
        mut self,
        qp: impl Into<Arc<QueuePair>>,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Connection> {
        let qp = qp.into();
        self.answered = true;
        let (events, incoming) = bounded(8);
        let engine = self.device.engine();
        let accepted = engine.call(|reply| {
            Command::Cm(CmCommand::Accept {
                conn: self.conn,
                qpn: qp.qpn(),
                request: self.request.clone(),
                options: Box::new(*options),
                private_data: private_data.to_vec(),
                events,
                reply,
            })
        })?;
        let connection = Connection {
            qp,
            conn: self.conn,
            peer: self.peer(),
            private_data: std::mem::take(&mut self.request.private_data),
            events: incoming,
            ended: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            established: AtomicBool::new(false),
        };
        // From here the connection's drop ends it, whatever happens.
        accepted?;
        // The CM took the QP to RTS before the REP: posts may go out now, as librdmacm's
        // programs post once `rdma_accept` returns.
        connection.qp.note_state(QpState::Rts);
        Ok(connection)
    }

    /// Rejects with up to 148 bytes of private data (REJ reason 28, consumer defined, as
    /// `rdma_reject`).
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        self.answered = true;
        let (conn, private_data) = (self.conn, private_data.to_vec());
        Ok(self.device.engine().call(|reply| {
            Command::Cm(CmCommand::Reject {
                conn,
                private_data,
                reply,
            })
        })??)
    }
}

impl Drop for ConnectionRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self
                .device
                .engine()
                .command(Command::Cm(CmCommand::Abort(self.conn)));
        }
    }
}

/// A connected QP and its connection: [`Connection::connect`] or
/// [`ConnectionRequest::accept`]. It derefs to its [`QueuePair`]. Dropping it disconnects
/// (one DREQ, as when a process exits under librdmacm) and destroys the QP, unless the caller
/// shares it (`Arc<QueuePair>`) and still holds it.
#[derive(Debug)]
pub struct Connection {
    qp: Arc<QueuePair>,
    conn: ConnId,
    peer: SocketAddr,
    private_data: Vec<u8>,
    events: Receiver<CmEvent>,
    /// The connection is over (disconnected or failed): nothing more comes on `events`.
    ended: AtomicBool,
    /// The connection was established (an accepted one waits for the peer's RTU).
    established: AtomicBool,
    /// The CM was told the application is done with it ([`close`](Self::close) or the drop).
    closed: AtomicBool,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// The peer's DREQ, or the answer (or silence) after ours: the QP is in ERROR, its
    /// outstanding work flushed.
    Disconnected,
    /// It failed before it was established: rejected, unanswered, or refused by the QP.
    Failed(Failure),
}

impl Connection {
    /// Connects `qp` (RC or UC, in RESET or INIT) to the listener at `to`, sending up to 56
    /// bytes of `private_data` in the REQ; returns once the peer accepted and the QP is in
    /// RTS. `options` sets the QP's access, path MTU (at most the port's), ACK timeout and
    /// RNR timer, the retry counts asked of the peer, and the READ/atomic depth offered both
    /// ways. A rejection is [`Error::ConnectFailed`] with the peer's reason and data. The QP
    /// may be shared, as for [`ConnectionRequest::accept`].
    pub fn connect(
        qp: impl Into<Arc<QueuePair>>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Connection> {
        let qp = qp.into();
        let (events, incoming) = bounded(8);
        let call = Box::new(ConnectCall {
            qpn: qp.qpn(),
            dst: to.ip(),
            service_id: ServiceId::ip(PortSpace::Tcp, to.port()),
            options: *options,
            private_data: private_data.to_vec(),
        });
        let device = qp.device.clone();
        let conn = device.engine().call(|reply| {
            Command::Cm(CmCommand::Connect {
                call,
                events,
                reply,
            })
        })??;
        let mut connection = Connection {
            qp,
            conn,
            peer: to,
            private_data: Vec::new(),
            events: incoming,
            ended: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            established: AtomicBool::new(false),
        };
        connection.private_data = connection.wait_established()?;
        Ok(connection)
    }

    /// Waits for a connection accepted with [`ConnectionRequest::accept_now`] to be
    /// established: the peer's RTU, or its first packet. Returns at once for one already
    /// established.
    pub fn established(&self) -> Result<()> {
        if self.established.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.wait_established().map(drop)
    }

    /// Waits for the connection to be established; returns the REP's private data, if one
    /// came (the active side's).
    fn wait_established(&self) -> Result<Vec<u8>> {
        let mut reply_data = Vec::new();
        loop {
            match self.next_cm_event(POLL)? {
                Some(CmEvent::Reply { reply, .. }) => reply_data = reply.private_data,
                Some(CmEvent::Established { .. }) => {
                    // The CM took the QP to RTS in the engine: posts may go out now.
                    self.qp.note_state(QpState::Rts);
                    self.established.store(true, Ordering::Relaxed);
                    return Ok(reply_data);
                }
                Some(CmEvent::Failed { failure, .. }) => {
                    self.ended.store(true, Ordering::Relaxed);
                    return Err(Error::ConnectFailed(failure));
                }
                Some(CmEvent::Disconnected { .. }) => {
                    self.ended.store(true, Ordering::Relaxed);
                    return Err(Error::Disconnected);
                }
                Some(_) | None => {}
            }
        }
    }

    fn next_cm_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        receive(self.qp.device.engine(), &self.events, timeout)
    }

    /// The connected QP (the connection also derefs to it).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The peer's address and port: the listener's for the active side, the peer's RDMA-CM
    /// source port for the passive side.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// What the peer sent: the REP's 196 bytes on the active side, the REQ's 56 on the
    /// passive side, zero-padded by the sender.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Whether the connection has ended, as far as events taken so far say.
    pub fn is_connected(&self) -> bool {
        !self.ended.load(Ordering::Relaxed)
    }

    /// How the connection ended, waiting up to `timeout` for it: `None` while it stands.
    pub fn wait_event(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        if self.ended.load(Ordering::Relaxed) {
            return Ok(Some(ConnectionEvent::Disconnected));
        }
        let event = match self.next_cm_event(timeout)? {
            Some(CmEvent::Disconnected { .. }) => ConnectionEvent::Disconnected,
            Some(CmEvent::Failed { failure, .. }) => ConnectionEvent::Failed(failure),
            _ => return Ok(None),
        };
        self.ended.store(true, Ordering::Relaxed);
        Ok(Some(event))
    }

    /// Disconnects as `rdma_disconnect`: the QP goes to ERROR (what it had outstanding is
    /// flushed), the DREQ goes out, and the call returns when the peer answered (or after the
    /// CM's retries). Disconnecting an ended connection does nothing.
    pub fn disconnect(&self) -> Result<()> {
        self.start_disconnect()?;
        while self.wait_event(POLL)?.is_none() {}
        Ok(())
    }

    /// Tells the CM now that the application is done with the connection, as dropping it
    /// does, while others may still hold it: an established connection sends its DREQ (and
    /// does not wait for the answer), an attempt is rejected; no event follows. As
    /// `rdma_destroy_id`, which must not wait for the last holder of the connection to let go.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self
                .qp
                .device
                .engine()
                .command(Command::Cm(CmCommand::Abort(self.conn)));
        }
    }

    /// Starts a disconnect and returns once the DREQ is queued (the QP already in ERROR);
    /// [`wait_event`](Self::wait_event) reports the end. Disconnecting an ended connection
    /// does nothing.
    pub fn start_disconnect(&self) -> Result<()> {
        if self.ended.load(Ordering::Relaxed) {
            return Ok(());
        }
        let conn = self.conn;
        self.qp
            .device
            .engine()
            .call(|reply| Command::Cm(CmCommand::Disconnect { conn, reply }))??;
        Ok(())
    }
}

impl Deref for Connection {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        &self.qp
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// Listens for UD service resolution on a port: [`Device::listen_datagram`].
#[derive(Debug)]
pub struct DatagramListener(Listening);

impl DatagramListener {
    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.0.port
    }

    /// The next resolution request, waiting up to `timeout` for one.
    pub fn next_request(&self, timeout: Duration) -> Result<Option<DatagramRequest>> {
        let Some(CmEvent::SidrRequest {
            id,
            peer_port,
            private_data,
            ..
        }) = self.0.next(timeout)?
        else {
            return Ok(None);
        };
        Ok(Some(DatagramRequest {
            device: self.0.device.clone(),
            id,
            peer_port,
            private_data,
            answered: false,
        }))
    }
}

/// A peer asks which UD QP serves the listener's port. Answer with
/// [`reply`](Self::reply) or [`reject`](Self::reject); dropped unanswered, it is rejected.
#[derive(Debug)]
pub struct DatagramRequest {
    device: Device,
    id: SidrId,
    peer_port: u16,
    private_data: Vec<u8>,
    answered: bool,
}

impl DatagramRequest {
    /// The client's address and port (RDMA-CM's source port).
    pub fn peer(&self) -> SocketAddr {
        SocketAddr::new(self.id.peer, self.peer_port)
    }

    /// The peer's private data: 180 bytes, zero-padded by the sender.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Names `qp`, a UD QP built with [`RDMA_UDP_QKEY`] (`QpBuilder::qkey`) and readied
    /// (`ready_datagram`), as the one that serves; up to 136 bytes of private data.
    pub fn reply(mut self, qp: &QueuePair, private_data: &[u8]) -> Result<()> {
        if qp.qp_type != QpType::Ud {
            return Err(Error::Cm(crate::cm::CmError::Invalid(
                "a SIDR reply names a UD QP",
            )));
        }
        self.answer(Ok((qp.qpn(), RDMA_UDP_QKEY)), private_data)
    }

    /// Refuses (SIDR status 2, rejected).
    pub fn reject(mut self) -> Result<()> {
        self.answer(Err(SidrStatus::REJECT), &[])
    }

    fn answer(
        &mut self,
        result: std::result::Result<(Qpn, QKey), SidrStatus>,
        data: &[u8],
    ) -> Result<()> {
        self.answered = true;
        let (id, private_data) = (self.id, data.to_vec());
        Ok(self.device.engine().call(|reply| {
            Command::Cm(CmCommand::SidrReply {
                id,
                result,
                private_data,
                reply,
            })
        })??)
    }
}

impl Drop for DatagramRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.answer(Err(SidrStatus::REJECT), &[]);
        }
    }
}

/// Where a UD service is: the answer to [`Device::resolve_datagram`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatagramPeer {
    /// The server's address.
    pub addr: IpAddr,
    /// The server's UD QP.
    pub qpn: Qpn,
    /// The Q_Key the server's QP checks: the one to put in sends to it.
    pub qkey: QKey,
    /// The SIDR_REP's private data: 136 bytes, zero-padded by the sender.
    pub private_data: Vec<u8>,
}
