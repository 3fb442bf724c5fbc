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
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::bounded;

use super::connection::{Link, POLL};
use super::inbox::next_event;
use super::{receive, Connection, Device, Error, ManualConnection, QueuePair, Result};
use crate::cm::agent::{passive_steps, AgentCounters, QpMover};
use crate::cm::{
    CmCounters, CmEvent, ConnId, ConnectRequest, Failure, ListenerId, SidrId, RDMA_UDP_QKEY,
};
use crate::engine::{CmCommand, Command};
use crate::transport::{AddressHandle, ConnectOptions, QpAttr, QpType, UdDest};
use crate::wire::cm::{PortSpace, RejReason, ServiceId, SidrStatus};
use crate::wire::{QKey, Qpn};

/// Requests a listener holds for the application before the CM refuses more ("no
/// resources"), as `rdma_listen`'s backlog.
const BACKLOG: usize = 64;

impl Device {
    /// Listens for RC and UC connections on `port` of RDMA-CM's TCP port space, as
    /// `rdma_listen` on an `RDMA_PS_TCP` ID bound to the device's address.
    pub fn listen(&self, port: u16) -> Result<Listener> {
        Ok(Listener(Listening::start(self, PortSpace::Tcp, port)?))
    }

    /// Listens for UD service resolution (SIDR) on `port` of RDMA-CM's UDP port space, as
    /// `rdma_listen` on an `RDMA_PS_UDP` ID (udaddy's server).
    pub fn listen_datagram(&self, port: u16) -> Result<DatagramListener> {
        Ok(DatagramListener(Listening::start(
            self,
            PortSpace::Udp,
            port,
        )?))
    }

    /// Asks `to` which UD QP serves its port in RDMA-CM's UDP port space (SIDR, as
    /// `rdma_connect` on an `RDMA_PS_UDP` ID). Sends go to the answer with an address handle
    /// for `to.ip()` ([`ProtectionDomain::create_ah`](super::ProtectionDomain::create_ah)).
    pub fn resolve_datagram(&self, to: SocketAddr, private_data: &[u8]) -> Result<DatagramPeer> {
        let (events, answers) = flume::bounded(1);
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
                    return Err(Error::ConnectFailed {
                        to,
                        failure: Failure::TimedOut,
                    })
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
        Ok(receive(self.engine(), &done, max)?.unwrap_or(false))
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
    requests: flume::Receiver<CmEvent>,
    /// The port, held against the other processes on the address.
    _binding: Option<crate::io::PortBinding>,
}

impl Listening {
    fn start(device: &Device, space: PortSpace, port: u16) -> Result<Listening> {
        let service_id = ServiceId::ip(space, port);
        // Before the CM listens: the port is this process's on the address, or in use.
        let binding = match port {
            0 => None,
            port => device.bind_cm_port(space, port)?,
        };
        let (requests, incoming) = flume::bounded(BACKLOG);
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
            port,
            requests: incoming,
            _binding: binding,
        })
    }

    fn next(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        receive(self.device.engine(), &self.requests, timeout)
    }

    async fn next_async(&self) -> Result<CmEvent> {
        next_event(self.device.engine(), &self.requests).await
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
        Ok(self.0.next(timeout)?.and_then(|event| self.request(event)))
    }

    /// The next connection request, as a future any executor can run (one task at a time
    /// should await it): a server's accept loop with no thread of its own.
    pub async fn next(&self) -> Result<ConnectionRequest> {
        loop {
            if let Some(request) = self.request(self.0.next_async().await?) {
                return Ok(request);
            }
        }
    }

    fn request(&self, event: CmEvent) -> Option<ConnectionRequest> {
        let CmEvent::ConnectRequest { conn, request, .. } = event else {
            return None;
        };
        Some(ConnectionRequest {
            device: self.0.device.clone(),
            conn,
            request,
            answered: false,
        })
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

    /// The peer's private data: 56 bytes, zero-padded by the sender. The wire carries no
    /// length: a peer that needs one sends it
    /// ([`private_data::encode`](super::private_data::encode)).
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

    /// [`accept`](Self::accept) as a future, for any executor: it resolves once the peer's
    /// RTU (or first packet) came. It owns what it is given (it may be spawned) and sends the
    /// REP when first polled; dropped before the end, the connection is ended (a REJ while the
    /// REP is unanswered).
    pub fn accept_async(
        self,
        qp: impl Into<Arc<QueuePair>>,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> impl Future<Output = Result<Connection>> + Send + 'static {
        let (qp, options, private_data) = (qp.into(), *options, private_data.to_vec());
        async move {
            let connection = self.accept_now(qp, &options, &private_data)?;
            connection.established_async().await?;
            Ok(connection)
        }
    }

    /// [`accept`](Self::accept) up to the REP: returns once the QP is in RTS and the REP is on
    /// its way, as librdmacm's `rdma_accept` does, without waiting for the peer's RTU;
    /// [`Connection::established`] waits for it.
    pub fn accept_now(
        self,
        qp: impl Into<Arc<QueuePair>>,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Connection> {
        let qp = qp.into();
        qp.live()?;
        let link = self.answer((qp.qpn(), QpMover::Agent), Some(&qp), options, private_data)?;
        Ok(Connection::accepted(qp, link))
    }

    /// The attributes that take a QP the application moves itself to INIT, RTR and RTS, if it
    /// accepts with `options` ([`accept_manual`](Self::accept_manual)): what librdmacm's
    /// `rdma_init_qp_attr` gives before `rdma_accept`.
    pub fn qp_attrs(&self, options: &ConnectOptions) -> [QpAttr; 3] {
        passive_steps(&self.request, options).steps
    }

    /// Accepts naming `qpn`, a QP of the type the peer asked that the application moves itself
    /// with [`qp_attrs`](Self::qp_attrs) (or [`ManualConnection::qp_attr`]): the REP goes out
    /// with up to 196 bytes of `private_data`, and the call returns at once, as librdmacm's
    /// `rdma_accept` on an ID without a QP; [`ManualConnection::established`] waits for the
    /// peer's RTU.
    pub fn accept_manual(
        self,
        qpn: Qpn,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<ManualConnection> {
        let steps = self.qp_attrs(options);
        let mover = QpMover::Application(self.request.qp_type);
        let link = self.answer((qpn, mover), None, options, private_data)?;
        Ok(ManualConnection::accepted(link, steps))
    }

    /// Sends the REP naming `qpn`; the connection's handle from then on. The failure of
    /// `watched`, the QP if it is the device's, ends the connection too.
    fn answer(
        mut self,
        (qpn, mover): (Qpn, QpMover),
        watched: Option<&QueuePair>,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Link> {
        self.answered = true;
        let (events, incoming) = Link::channel(watched)?;
        let accepted = self.device.engine().call(|reply| {
            Command::Cm(CmCommand::Accept {
                conn: self.conn,
                qpn,
                request: self.request.clone(),
                options: Box::new(*options),
                private_data: private_data.to_vec(),
                mover,
                events,
                reply,
            })
        })?;
        let peer = self.peer();
        let data = std::mem::take(&mut self.request.private_data);
        // From here the connection's drop ends it, whatever happens.
        let link = Link::new(&self.device, self.conn, peer, data, incoming);
        accepted?;
        Ok(link)
    }

    /// Lets the request go unanswered: nothing is sent, and the CM forgets it, as the kernel's
    /// CM does with a REQ for which a listener's backlog has no room. The peer's CM sends its
    /// REQ again after its timeout (about 4 s with librdmacm's defaults), and that one comes
    /// as a new request; a peer that hears nothing within its retries gives up (timed out).
    pub fn ignore(mut self) -> Result<()> {
        self.answered = true;
        Ok(self
            .device
            .engine()
            .command(Command::Cm(CmCommand::Ignore(self.conn)))?)
    }

    /// Rejects with up to 148 bytes of private data (REJ reason 28, consumer defined, as
    /// `rdma_reject`).
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejReason::CONSUMER_DEFINED, private_data)
    }

    /// Rejects for `reason` (librdmacm's `rdma_reject_ece` sends 35, vendor option not
    /// supported), with up to 148 bytes of private data.
    pub fn reject_with(mut self, reason: RejReason, private_data: &[u8]) -> Result<()> {
        self.answered = true;
        let (conn, private_data) = (self.conn, private_data.to_vec());
        Ok(self.device.engine().call(|reply| {
            Command::Cm(CmCommand::Reject {
                conn,
                reason,
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
        Ok(self.0.next(timeout)?.and_then(|event| self.request(event)))
    }

    /// The next resolution request, as a future any executor can run.
    pub async fn next(&self) -> Result<DatagramRequest> {
        loop {
            if let Some(request) = self.request(self.0.next_async().await?) {
                return Ok(request);
            }
        }
    }

    fn request(&self, event: CmEvent) -> Option<DatagramRequest> {
        let CmEvent::SidrRequest {
            id,
            peer_port,
            private_data,
            ..
        } = event
        else {
            return None;
        };
        Some(DatagramRequest {
            device: self.0.device.clone(),
            id,
            peer_port,
            private_data,
            answered: false,
        })
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
        qp.live()?;
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

impl DatagramPeer {
    /// Where sends to the service go: its QP and Q_Key, through `ah`, an address handle for
    /// [`addr`](Self::addr) ([`ProtectionDomain::create_ah`](super::ProtectionDomain::create_ah)).
    pub fn dest(&self, ah: AddressHandle) -> UdDest {
        UdDest {
            ah,
            remote_qpn: self.qpn,
            remote_qkey: self.qkey,
        }
    }
}
