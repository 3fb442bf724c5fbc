//! Connections the CM made: [`Connection`], a QP the CM moved to RTS, and [`ManualConnection`],
//! for a QP the application moves itself with the attributes the CM negotiated. Both keep a
//! [`Link`] to the CM: the connection's events and how far it got.

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::inbox::next_event;
use super::{receive, Device, Error, QueuePair, Result};
use crate::cm::agent::{active_steps, QpMover};
use crate::cm::{CmError, CmEvent, ConnId, Failure, Reply};
use crate::engine::{CmCommand, Command, ConnEvent, ConnSender, ConnectCall};
use crate::transport::AsyncEvent;
use crate::transport::{ConnectOptions, QpAttr, QpState, QpType};
use crate::wire::cm::{PortSpace, ServiceId};
use crate::wire::Qpn;

/// How often a wait for the CM looks again whether the device still runs: every wait ends
/// by the CM's own timers, which bound each step of the protocol.
pub(super) const POLL: Duration = Duration::from_secs(1);

/// What a connection's handle keeps of the CM: where its events come, and how far it got.
#[derive(Debug)]
pub(super) struct Link {
    device: Device,
    conn: ConnId,
    peer: SocketAddr,
    private_data: Vec<u8>,
    events: flume::Receiver<ConnEvent>,
    /// How the CM ended the connection, once it has (disconnected or failed): nothing more
    /// comes on `events`, and every later wait says this.
    end: OnceLock<ConnectionEvent>,
    /// The QP's failure, once it came: the connection carries nothing more, though the CM's
    /// connection stands until it is disconnected or dropped.
    qp_failed: OnceLock<AsyncEvent>,
    /// The connection was established (an accepted one waits for the peer's RTU).
    established: AtomicBool,
    /// The CM was told the application is done with it ([`close`](Self::close) or the drop).
    closed: AtomicBool,
}

impl Link {
    /// Sends a REQ naming `qpn` to the listener at `to`; the REP has not come yet. The
    /// failure of `watched`, the QP if it is the device's, ends the connection too.
    pub(super) fn connect(
        device: &Device,
        (qpn, mover): (Qpn, QpMover),
        watched: Option<&QueuePair>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Link> {
        let (events, incoming) = Link::channel(watched)?;
        let call = Box::new(ConnectCall {
            qpn,
            dst: to.ip(),
            service_id: ServiceId::ip(PortSpace::Tcp, to.port()),
            options: *options,
            private_data: private_data.to_vec(),
            mover,
        });
        let conn = device.engine().call(|reply| {
            Command::Cm(CmCommand::Connect {
                call,
                events,
                reply,
            })
        })??;
        Ok(Link::new(device, conn, to, Vec::new(), incoming))
    }

    /// A connection's channel: its sender for the CM, and for `watched`'s engine, which sends
    /// the QP's failure there ([`Command::WatchQp`]).
    pub(super) fn channel(
        watched: Option<&QueuePair>,
    ) -> Result<(ConnSender, flume::Receiver<ConnEvent>)> {
        // The CM's few events and the QP's failure: never more than this waits.
        let (events, incoming) = flume::bounded(8);
        if let Some(qp) = watched {
            qp.watch_failure(events.clone())?;
        }
        Ok((events, incoming))
    }

    /// The handle of connection `conn` to `peer`, whose events come on `events`.
    pub(super) fn new(
        device: &Device,
        conn: ConnId,
        peer: SocketAddr,
        private_data: Vec<u8>,
        events: flume::Receiver<ConnEvent>,
    ) -> Link {
        Link {
            device: device.clone(),
            conn,
            peer,
            private_data,
            events,
            end: OnceLock::new(),
            qp_failed: OnceLock::new(),
            established: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// What `event` means to a wait for the REP (if `reply_ends`) or for the connection to be
    /// established: `Some` ends the wait, with the REP if one came (kept in `got` meanwhile).
    fn absorb(
        &self,
        event: ConnEvent,
        reply_ends: bool,
        got: &mut Option<Box<Reply>>,
    ) -> Option<Result<Option<Box<Reply>>>> {
        let event = match event {
            ConnEvent::Cm(event) => event,
            ConnEvent::QpFailed(failure) => {
                // The CM goes on: its end, or the wait's deadline, ends the wait.
                let _ = self.qp_failed.set(failure);
                return None;
            }
        };
        match event {
            CmEvent::Reply { reply, .. } if reply_ends => return Some(Ok(Some(reply))),
            CmEvent::Reply { reply, .. } => *got = Some(reply),
            CmEvent::Established { .. } => {
                self.established.store(true, Ordering::Relaxed);
                return Some(Ok(got.take()));
            }
            CmEvent::Failed { failure, .. } => {
                self.end_with(ConnectionEvent::Failed(failure.clone()));
                return Some(Err(Error::ConnectFailed {
                    to: self.peer,
                    failure,
                }));
            }
            CmEvent::Disconnected { .. } => {
                self.end_with(ConnectionEvent::Disconnected);
                return Some(Err(Error::Disconnected));
            }
            _ => {}
        }
        None
    }

    /// Waits for the REP (if `reply_ends`) or for the connection to be established, until
    /// `deadline` if there is one (then the attempt has failed, `TimedOut`); returns the REP
    /// if one came.
    fn wait(&self, reply_ends: bool, deadline: Option<Instant>) -> Result<Option<Box<Reply>>> {
        let mut got = None;
        loop {
            let mut wait = POLL;
            if let Some(deadline) = deadline {
                wait = wait.min(deadline.saturating_duration_since(Instant::now()));
                if wait.is_zero() {
                    self.end_with(ConnectionEvent::Failed(Failure::TimedOut));
                    return Err(Error::ConnectFailed {
                        to: self.peer,
                        failure: Failure::TimedOut,
                    });
                }
            }
            if let Some(event) = receive(self.device.engine(), &self.events, wait)? {
                if let Some(done) = self.absorb(event, reply_ends, &mut got) {
                    return done;
                }
            }
        }
    }

    /// [`wait`](Self::wait), awaited.
    async fn wait_async(&self, reply_ends: bool) -> Result<Option<Box<Reply>>> {
        let mut got = None;
        loop {
            let event = next_event(self.device.engine(), &self.events).await?;
            if let Some(done) = self.absorb(event, reply_ends, &mut got) {
                return done;
            }
        }
    }

    /// Waits for the peer's RTU (or first packet); at once if the connection is established.
    fn established(&self) -> Result<()> {
        if self.established.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.wait(false, None).map(drop)
    }

    /// [`established`](Self::established), awaited.
    async fn established_async(&self) -> Result<()> {
        if self.established.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.wait_async(false).await.map(drop)
    }

    /// Records how the connection ended (the first end recorded stands), and returns it.
    fn end_with(&self, end: ConnectionEvent) -> ConnectionEvent {
        self.end.get_or_init(|| end).clone()
    }

    /// Whether `event` ends the connection, and how: the CM's end, or the QP's failure.
    fn end_of(&self, event: ConnEvent) -> Option<ConnectionEvent> {
        match event {
            ConnEvent::Cm(CmEvent::Disconnected { .. }) => {
                Some(self.end_with(ConnectionEvent::Disconnected))
            }
            ConnEvent::Cm(CmEvent::Failed { failure, .. }) => {
                Some(self.end_with(ConnectionEvent::Failed(failure)))
            }
            ConnEvent::QpFailed(failure) => {
                let _ = self.qp_failed.set(failure);
                Some(ConnectionEvent::QpFailed(failure))
            }
            ConnEvent::Cm(_) => None,
        }
    }

    /// How the connection ended so far, if it has: the CM's end first, then the QP's failure.
    fn end_so_far(&self) -> Option<ConnectionEvent> {
        let failed = || self.qp_failed.get().map(|f| ConnectionEvent::QpFailed(*f));
        self.end.get().cloned().or_else(failed)
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        if let Some(end) = self.end_so_far() {
            return Ok(Some(end));
        }
        let event = receive(self.device.engine(), &self.events, timeout)?;
        Ok(event.and_then(|event| self.end_of(event)))
    }

    /// The CM's end only, waiting up to `timeout`: a QP's failure is kept, not returned.
    fn wait_cm_end(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(end) = self.end.get() {
                return Ok(Some(end.clone()));
            }
            let left = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            let Some(event) = receive(self.device.engine(), &self.events, left)? else {
                return Ok(None);
            };
            match self.end_of(event) {
                Some(ConnectionEvent::QpFailed(_)) | None if !left.is_zero() => {}
                Some(ConnectionEvent::QpFailed(_)) | None => return Ok(None),
                end => return Ok(end),
            }
        }
    }

    async fn ended(&self) -> Result<ConnectionEvent> {
        loop {
            if let Some(end) = self.end_so_far() {
                return Ok(end);
            }
            let event = next_event(self.device.engine(), &self.events).await?;
            if let Some(end) = self.end_of(event) {
                return Ok(end);
            }
        }
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self
                .device
                .engine()
                .command(Command::Cm(CmCommand::Abort(self.conn)));
        }
    }

    fn disconnect(&self) -> Result<()> {
        if self.end.get().is_some() {
            return Ok(());
        }
        let conn = self.conn;
        self.device
            .engine()
            .call(|reply| Command::Cm(CmCommand::Disconnect { conn, reply }))??;
        Ok(())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.close();
    }
}

/// A connected QP and its connection: [`Connection::connect`] or
/// [`ConnectionRequest::accept`](super::ConnectionRequest::accept). It derefs to its
/// [`QueuePair`]. Dropping it disconnects (one DREQ, as when a process exits under librdmacm)
/// and destroys the QP, unless the caller shares it (`Arc<QueuePair>`) and still holds it.
#[derive(Debug)]
pub struct Connection {
    qp: Arc<QueuePair>,
    link: Link,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// The peer's DREQ, or the answer (or silence) after ours: the QP is in ERROR, its
    /// outstanding work flushed.
    Disconnected,
    /// It failed before it was established: rejected, unanswered, or refused by the QP.
    Failed(Failure),
    /// Its QP met an error and went to ERROR ([`AsyncEvent::QpAccessError`]: a peer's request
    /// broke its access rules; [`AsyncEvent::QpFatal`]: a request of its own failed for good,
    /// its retries exhausted or refused by the peer), its outstanding work flushed: the
    /// connection carries nothing more. The peer is not told until the connection is
    /// disconnected or dropped (its own QP may have failed too, as after an access error).
    QpFailed(AsyncEvent),
}

impl Connection {
    /// Connects `qp` (RC or UC, in RESET or INIT) to the listener at `to`, sending up to 56
    /// bytes of `private_data` in the REQ; returns once the peer accepted and the QP is in
    /// RTS. `options` sets the QP's access, path MTU (at most the port's), ACK timeout and
    /// RNR timer, the retry counts asked of the peer, and the READ/atomic depth offered both
    /// ways. A rejection is [`Error::ConnectFailed`] with the peer's reason and data. The QP
    /// may be shared, as for [`ConnectionRequest::accept`](super::ConnectionRequest::accept).
    pub fn connect(
        qp: impl Into<Arc<QueuePair>>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<Connection> {
        Connection::connect_within(qp, to, options, private_data, None)
    }

    /// [`connect`](Self::connect), given up after `timeout` if the peer has not accepted by
    /// then: [`Error::ConnectFailed`] with [`Failure::TimedOut`], and the attempt abandoned
    /// (the peer gets a REJ). Without it a connect lasts as long as the CM's retries
    /// (`DeviceConfig::cm`: about a minute with librdmacm's).
    pub fn connect_timeout(
        qp: impl Into<Arc<QueuePair>>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        let deadline = Instant::now() + timeout;
        Connection::connect_within(qp, to, options, private_data, Some(deadline))
    }

    fn connect_within(
        qp: impl Into<Arc<QueuePair>>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Connection> {
        let qp = qp.into();
        qp.live()?;
        let route = (qp.qpn(), QpMover::Agent);
        let link = Link::connect(&qp.device, route, Some(&qp), to, options, private_data)?;
        let reply = link.wait(false, deadline)?;
        Ok(Connection::connected(qp, link, reply))
    }

    /// [`connect`](Self::connect) as a future, for any executor: it resolves once the peer
    /// accepted and the QP is in RTS. It owns what it is given (it may be spawned), sends the
    /// REQ when first polled, and, dropped before the end, abandons the attempt (the peer gets
    /// a REJ), so a runtime's timeout around it bounds the connect.
    ///
    /// ```
    /// use softroce::prelude::*;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = Device::open(DeviceConfig::udp("127.0.0.43".parse()?))?;
    /// let client = Device::open(DeviceConfig::udp("127.0.0.44".parse()?))?;
    /// let listener = server.listen(7180)?;
    /// let qp = |device: &Device| -> Result<QueuePair, Error> {
    ///     let (pd, cq) = (device.alloc_pd()?, device.create_cq(8)?);
    ///     pd.create_qp().send_cq(&cq).recv_cq(&cq).build()
    /// };
    /// let (server_qp, client_qp) = (qp(&server)?, qp(&client)?);
    /// let accepting = async {
    ///     let request = listener.next().await?;
    ///     request.accept_async(server_qp, &ConnectOptions::default(), b"welcome").await
    /// };
    /// let to = "127.0.0.43:7180".parse()?;
    /// let connecting = Connection::connect_async(client_qp, to, &ConnectOptions::default(), &[]);
    /// let (accepted, connected) = tokio::join!(accepting, connecting);
    /// let (accepted, connected) = (accepted?, connected?);
    /// assert_eq!(&connected.private_data()[..7], b"welcome");
    /// connected.disconnect()?; // returns once the DREQ is queued
    /// assert_eq!(accepted.ended().await?, ConnectionEvent::Disconnected);
    /// # Ok(()) }
    /// ```
    pub fn connect_async(
        qp: impl Into<Arc<QueuePair>>,
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> impl Future<Output = Result<Connection>> + Send + 'static {
        let (qp, options, private_data) = (qp.into(), *options, private_data.to_vec());
        async move {
            qp.live()?;
            let route = (qp.qpn(), QpMover::Agent);
            let link = Link::connect(&qp.device, route, Some(&qp), to, &options, &private_data)?;
            let reply = link.wait_async(false).await?;
            Ok(Connection::connected(qp, link, reply))
        }
    }

    /// The active side's connection once the CM took `qp` to RTS in the engine: posts may go
    /// out now. The REP's private data is the peer's.
    fn connected(qp: Arc<QueuePair>, mut link: Link, reply: Option<Box<Reply>>) -> Connection {
        link.private_data = reply.map(|r| r.private_data).unwrap_or_default();
        Connection::in_rts(qp, link)
    }

    /// The connection of `qp`, accepted with `link`: the CM took the QP to RTS before its REP,
    /// so posts may go out now, as librdmacm's programs post once `rdma_accept` returns.
    pub(super) fn accepted(qp: Arc<QueuePair>, link: Link) -> Connection {
        Connection::in_rts(qp, link)
    }

    /// The connection of `qp`, in RTS, with the device's keepalive if it is RC
    /// ([`DeviceConfig::keepalive`](super::DeviceConfig::keepalive)). A keepalive the engine
    /// cannot set (the device stopped, the QP destroyed) leaves nothing to watch.
    fn in_rts(qp: Arc<QueuePair>, link: Link) -> Connection {
        qp.note_state(QpState::Rts);
        if let (Some(interval), QpType::Rc) = (qp.device.inner.keepalive, qp.qp_type) {
            let _ = qp.set_keepalive(Some(interval));
        }
        Connection { qp, link }
    }

    /// Sets the keepalive of the connection's QP ([`QueuePair::set_keepalive`]): how long the
    /// peer of an idle connection may be silent before it is probed, and the connection ends
    /// with [`ConnectionEvent::QpFailed`] if it answers none of the probes. A connection
    /// starts with [`DeviceConfig::keepalive`](super::DeviceConfig::keepalive)
    /// ([`DEFAULT_KEEPALIVE`](super::DEFAULT_KEEPALIVE), 30 s, unless the device says
    /// otherwise); `None` turns it off. Refused for UC.
    ///
    /// ```
    /// use std::time::Duration;
    /// use softroce::prelude::*;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = Device::open(DeviceConfig::udp("127.0.0.47".parse()?))?;
    /// let client = Device::open(DeviceConfig::udp("127.0.0.48".parse()?))?;
    /// let listener = server.listen(7181)?;
    /// let qp = |device: &Device| -> Result<QueuePair, Error> {
    ///     let (pd, cq) = (device.alloc_pd()?, device.create_cq(8)?);
    ///     pd.create_qp().send_cq(&cq).recv_cq(&cq).build()
    /// };
    /// let server_qp = qp(&server)?;
    /// let accepting = std::thread::spawn(move || -> Result<Connection, Error> {
    ///     let request = listener.next_request(Duration::from_secs(10))?.expect("a request");
    ///     request.accept(server_qp, &ConnectOptions::default(), &[])
    /// });
    /// let to = "127.0.0.47:7181".parse()?;
    /// let conn = Connection::connect(qp(&client)?, to, &ConnectOptions::default(), &[])?;
    /// let _accepted = accepting.join().unwrap()?;
    /// // A peer silent for 1 s is probed; one that answers no probe ends the connection.
    /// conn.set_keepalive(Some(Duration::from_secs(1)))?;
    /// # Ok(()) }
    /// ```
    pub fn set_keepalive(&self, interval: Option<Duration>) -> Result<()> {
        self.qp.set_keepalive(interval)
    }

    /// Waits for a connection accepted with
    /// [`ConnectionRequest::accept_now`](super::ConnectionRequest::accept_now) to be
    /// established: the peer's RTU, or its first packet. Returns at once for one already
    /// established.
    pub fn established(&self) -> Result<()> {
        self.link.established()
    }

    /// [`established`](Self::established), awaited.
    pub async fn established_async(&self) -> Result<()> {
        self.link.established_async().await
    }

    /// The connected QP (the connection also derefs to it).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The peer's address and port: the listener's for the active side, the peer's RDMA-CM
    /// source port for the passive side.
    pub fn peer(&self) -> SocketAddr {
        self.link.peer
    }

    /// What the peer sent: the REP's 196 bytes on the active side, the REQ's 56 on the
    /// passive side, zero-padded by the sender. The wire carries no length: a peer that needs
    /// one sends it ([`private_data::encode`](super::private_data::encode)).
    pub fn private_data(&self) -> &[u8] {
        &self.link.private_data
    }

    /// Whether the connection still stands: true until an end (the peer's DREQ, a failure,
    /// our own [`disconnect`](Self::disconnect), or the QP's failure) is among the events
    /// taken so far, then false.
    pub fn is_connected(&self) -> bool {
        self.link.end_so_far().is_none()
    }

    /// How the connection ended, waiting up to `timeout` for it: `None` while it stands.
    pub fn wait_event(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        self.link.wait_event(timeout)
    }

    /// How the CM ended the connection ([`Disconnected`](ConnectionEvent::Disconnected) or
    /// [`Failed`](ConnectionEvent::Failed)), waiting up to `timeout`: `None` while the CM's
    /// connection stands, even after its QP failed, as librdmacm reports no event for a QP's
    /// error. [`wait_event`](Self::wait_event) reports either.
    pub fn wait_cm_end(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        self.link.wait_cm_end(timeout)
    }

    /// How the connection ended, as a future that resolves when it does: the peer's DREQ, a
    /// failure, the end of our own [`disconnect`](Self::disconnect) (the peer's DREP, or the
    /// DREQ's last retry going unanswered), or the QP's failure
    /// ([`ConnectionEvent::QpFailed`]). One task at a time should await it.
    pub async fn ended(&self) -> Result<ConnectionEvent> {
        self.link.ended().await
    }

    /// Disconnects as `rdma_disconnect`: the QP goes to ERROR (what it had outstanding is
    /// flushed) and the DREQ is queued when this returns; the end comes as an event
    /// ([`wait_event`](Self::wait_event), [`ended`](Self::ended)) once the peer answers or
    /// the CM's retries run out, so a dead peer costs the caller nothing. Disconnecting an
    /// ended connection does nothing.
    pub fn disconnect(&self) -> Result<()> {
        self.link.disconnect()
    }

    /// Tells the CM now that the application is done with the connection, as dropping it
    /// does, while others may still hold it: an established connection sends its DREQ (and
    /// does not wait for the answer), an attempt is rejected; no event follows. As
    /// `rdma_destroy_id`, which must not wait for the last holder of the connection to let go.
    pub fn close(&self) {
        self.link.close();
    }
}

impl Deref for Connection {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        &self.qp
    }
}

/// A connection the CM negotiated for a QP the application moves itself, as librdmacm's IDs
/// without a QP are connected (UCX names a placeholder QP there and connects its own out of
/// band). The CM exchanges the REQ, the REP and the RTU; the application takes its QP through
/// INIT, RTR and RTS with [`qp_attr`](Self::qp_attr) (`rdma_init_qp_attr`), and the active side
/// ends the handshake with [`establish`](Self::establish) (`rdma_establish`). Nothing here
/// moves, checks or flushes the QP, which may even be another device's. Dropping it
/// disconnects.
#[derive(Debug)]
pub struct ManualConnection {
    link: Link,
    steps: [QpAttr; 3],
    active: bool,
}

impl ManualConnection {
    /// Sends a REQ naming `qpn`, a QP of `qp_type` (RC or UC) that the application moves, to
    /// the listener at `to`, with up to 56 bytes of `private_data`; returns once the peer
    /// accepted (its REP: librdmacm's `CONNECT_RESPONSE`). Then move the QP to RTR and RTS
    /// with [`qp_attr`](Self::qp_attr) and call [`establish`](Self::establish). `options` are
    /// as for [`Connection::connect`].
    pub fn connect(
        device: &Device,
        (qpn, qp_type): (Qpn, QpType),
        to: SocketAddr,
        options: &ConnectOptions,
        private_data: &[u8],
    ) -> Result<ManualConnection> {
        let route = (qpn, QpMover::Application(qp_type));
        let mut link = Link::connect(device, route, None, to, options, private_data)?;
        let Some(reply) = link.wait(true, None)? else {
            return Err(Error::Disconnected);
        };
        let steps = active_steps(qp_type, to.ip(), &reply, options, device.port_mtu());
        link.private_data = reply.private_data;
        Ok(ManualConnection {
            link,
            steps,
            active: true,
        })
    }

    /// The passive side's connection, accepted with `link` and `steps`.
    pub(super) fn accepted(link: Link, steps: [QpAttr; 3]) -> ManualConnection {
        ManualConnection {
            link,
            steps,
            active: false,
        }
    }

    /// The attributes that take the QP to `state` (INIT, RTR or RTS) as the CM negotiated:
    /// the peer's QPN, address and PSN, the PSNs, the path MTU, the timeouts, retry counts and
    /// READ/atomic depths; `None` for another state.
    pub fn qp_attr(&self, state: QpState) -> Option<&QpAttr> {
        let step = match state {
            QpState::Init => 0,
            QpState::Rtr => 1,
            QpState::Rts => 2,
            _ => return None,
        };
        Some(&self.steps[step])
    }

    /// The active side's last step, once its QP is in RTS: the RTU goes out and the
    /// connection is established (the passive side's `ESTABLISHED`). The passive side has
    /// nothing to send: it waits with [`established`](Self::established).
    pub fn establish(&self) -> Result<()> {
        if !self.active {
            return Err(Error::Cm(CmError::WrongState(
                "the passive side waits for the RTU (established); it sends none",
            )));
        }
        let conn = self.link.conn;
        let engine = self.link.device.engine();
        engine.call(|reply| Command::Cm(CmCommand::Establish { conn, reply }))??;
        self.link.established.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until the connection is established: the peer's RTU (or its QP's first packet,
    /// if the QP is this device's) on the passive side, [`establish`](Self::establish) on the
    /// active side.
    pub fn established(&self) -> Result<()> {
        if self.active && !self.link.established.load(Ordering::Relaxed) {
            return Err(Error::Cm(CmError::WrongState(
                "the active side is established by its own establish",
            )));
        }
        self.link.established()
    }

    /// The peer's address and port, as for [`Connection::peer`].
    pub fn peer(&self) -> SocketAddr {
        self.link.peer
    }

    /// What the peer sent, as for [`Connection::private_data`].
    pub fn private_data(&self) -> &[u8] {
        &self.link.private_data
    }

    /// How the connection ended, waiting up to `timeout` for it: `None` while it stands.
    pub fn wait_event(&self, timeout: Duration) -> Result<Option<ConnectionEvent>> {
        self.link.wait_event(timeout)
    }

    /// How the connection ended, as a future, as for [`Connection::ended`].
    pub async fn ended(&self) -> Result<ConnectionEvent> {
        self.link.ended().await
    }

    /// Disconnects: the DREQ is queued when this returns, and
    /// [`wait_event`](Self::wait_event) or [`ended`](Self::ended) reports the end. The QP is
    /// the application's to move to ERROR.
    pub fn disconnect(&self) -> Result<()> {
        self.link.disconnect()
    }

    /// Tells the CM that the application is done with the connection, as for
    /// [`Connection::close`].
    pub fn close(&self) {
        self.link.close();
    }
}
