//! The verbs API: devices, protection domains, memory regions, completion queues and queue
//! pairs, in the shape of libibverbs, over the engine thread.
//!
//! ```
//! use softroce::prelude::*;
//!
//! let device = Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap()))?;
//! let pd = device.alloc_pd()?;
//! let cq = device.create_cq(256)?;
//! let mr = pd.register(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
//! // Hand these two to the peer out of band (with the `serde` feature they serialise) ...
//! let (mine, memory): (QpEndpoint, RemoteRegion) = (qp.endpoint(), mr.remote());
//! // ... and connect to the endpoint the peer hands back. Here, a QP of the same device:
//! let peer = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
//! qp.connect(&peer.endpoint(), &ConnectOptions::default())?;
//! peer.connect(&mine, &ConnectOptions::default())?;
//! # let _ = memory;
//! # Ok::<(), softroce::verbs::Error>(())
//! ```
//!
//! Handles are `Send` and `Sync`, and each keeps its device alive: the engine thread stops, its
//! QPs flushed and its socket closed, when the last handle is dropped.

mod cm;
mod connection;
mod device;
mod inbox;
pub mod private_data;
mod router;

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::cm::{CmError, Failure};
use crate::engine::{
    CmCommand, Command, Completions, CqNotify, EngineGone, EngineHandle, PostQueue, QpQueues,
    SrqQueues, Watch,
};
pub use crate::engine::{EnginePanicked, Progress};
use crate::memory::{inc_rkey, Access, BindMw, ForeignMemory, MemoryError, MwType, PdId};
use crate::transport::{
    connect_steps, AddressVector, CqId, Payload, QpAttr, QpInit, QpState, QpType, QueueSlots,
    RecvWr, SendOp, SendWr, SgeList, SrqAttr, SrqId, VerbsError, WorkCompletion,
};
pub use crate::transport::{AddressHandle, ConnectOptions, QpEndpoint, SrqModify};
use crate::wire::cm::{RejReason, SidrStatus};
use crate::wire::{LKey, Psn, QKey, Qpn, RKey};
pub(crate) use inbox::receive;

pub use crate::engine::hold_signals_off_for_good;
pub use crate::memory::MemoryRegion;
pub use cm::{ConnectionRequest, DatagramListener, DatagramPeer, DatagramRequest, Listener};
pub use connection::{Connection, ConnectionEvent, ManualConnection};
pub(crate) use device::random_psn;
pub use device::{
    AsyncEvents, BackendKind, Device, DeviceConfig, Driving, WeakDevice, C_ADDR_VAR,
    C_BUSY_POLL_VAR, C_CC_VAR, C_MTU_VAR, C_PROGRESS_VAR, C_TRAINS_PER_QP_VAR, DEFAULT_BUSY_POLL,
    DEFAULT_KEEPALIVE, MAX_BUSY_POLL, MAX_CQ_CAPACITY,
};
pub use router::{CompletionRouter, Routed};

/// What went wrong with a verb.
#[derive(Debug)]
pub enum Error {
    /// Opening the device's socket or thread failed.
    Io(io::Error),
    /// The transport refused the request.
    Verbs(VerbsError),
    /// A memory registration or access refused the request.
    Memory(MemoryError),
    /// The queue holds as many requests as it was created for: `depth`.
    QueueFull {
        /// Which queue.
        queue: WorkQueue,
        /// The requests it holds at most (`max_send_wr`, `max_recv_wr`, an SRQ's `max_wr`).
        depth: usize,
    },
    /// The device was closed: every handle to it was dropped.
    DeviceClosed,
    /// The device stopped because its socket failed, with this error; its outstanding work
    /// requests were flushed (WR_FLUSH_ERR) before it stopped. Or, from a bug, because its
    /// engine panicked: the error then wraps [`EnginePanicked`], and nothing was flushed. Or
    /// because the application stopped it with this error ([`Device::fail`]).
    DeviceFailed(Arc<io::Error>),
    /// The connection manager refused the call.
    Cm(CmError),
    /// A connection attempt to `to` failed: the peer rejected it (with its reason and private
    /// data), never answered, no RoCE device answers at its address, or the QP refused what was
    /// negotiated.
    ConnectFailed {
        /// Where the connection was to go.
        to: SocketAddr,
        /// Why it failed, in the CM's terms.
        failure: Failure,
    },
    /// The peer disconnected before the connection was established.
    Disconnected,
    /// The peer answered a UD service resolution with this status: no one serves the port
    /// (1), or its server refused (2).
    Unresolved(SidrStatus),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "device: {e}"),
            Error::Verbs(e) => e.fmt(f),
            Error::Memory(e) => e.fmt(f),
            Error::QueueFull { queue, depth } => write!(f, "{queue} full (depth {depth})"),
            Error::DeviceClosed => f.write_str("the device is closed"),
            Error::DeviceFailed(e) if e.raw_os_error().is_some() => {
                write!(f, "the device stopped: its socket failed: {e}")
            }
            Error::DeviceFailed(e) => write!(f, "the device stopped: {e}"),
            Error::Cm(e) => write!(f, "connection manager: {e}"),
            Error::ConnectFailed { to, failure } => connect_failed(f, *to, failure),
            Error::Disconnected => f.write_str("the peer disconnected"),
            Error::Unresolved(status) => {
                write!(
                    f,
                    "UD service not resolved: status {} ({})",
                    status.0,
                    status.name()
                )
            }
        }
    }
}

/// A failed connection to `to`, in a user's words, the CM's kept in brackets.
fn connect_failed(f: &mut fmt::Formatter<'_>, to: SocketAddr, failure: &Failure) -> fmt::Result {
    match failure {
        Failure::Rejected { reason, .. } if *reason == RejReason::INVALID_SERVICE_ID => {
            write!(
                f,
                "no listener on {to} (REJ {}, {})",
                reason.0,
                reason.name()
            )
        }
        Failure::Rejected { reason, .. } => write!(
            f,
            "{to} rejected the connection (REJ {}, {})",
            reason.0,
            reason.name()
        ),
        Failure::TimedOut => write!(f, "{to} did not answer, however often asked"),
        Failure::Unreachable => write!(
            f,
            "no RoCE device at {} (UDP {} unreachable)",
            to.ip(),
            crate::wire::ROCEV2_UDP_PORT
        ),
        Failure::Qp(e) => write!(f, "the QP refused what {to} negotiated: {e}"),
    }
}

/// Which work queue a request was refused by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkQueue {
    /// A QP's send queue.
    Send,
    /// A QP's receive queue.
    Receive,
    /// A shared receive queue.
    SharedReceive,
}

impl fmt::Display for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkQueue::Send => "send queue",
            WorkQueue::Receive => "receive queue",
            WorkQueue::SharedReceive => "shared receive queue",
        })
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Verbs(e) => Some(e),
            Error::Memory(e) => Some(e),
            Error::DeviceFailed(e) => Some(e.as_ref()),
            Error::Cm(e) => Some(e),
            Error::QueueFull { .. }
            | Error::DeviceClosed
            | Error::ConnectFailed { .. }
            | Error::Disconnected
            | Error::Unresolved(_) => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        Error::Verbs(e)
    }
}
impl From<MemoryError> for Error {
    fn from(e: MemoryError) -> Self {
        Error::Memory(e)
    }
}
impl From<CmError> for Error {
    fn from(e: CmError) -> Self {
        Error::Cm(e)
    }
}
impl From<EngineGone> for Error {
    fn from(gone: EngineGone) -> Self {
        match gone.0 {
            Some(failure) => Error::DeviceFailed(failure),
            None => Error::DeviceClosed,
        }
    }
}

/// What the verbs return.
pub type Result<T> = std::result::Result<T, Error>;

/// A protection domain.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    device: Device,
    pd: PdId,
}

impl ProtectionDomain {
    /// Registers a zeroed region of `len` bytes. The application reads and writes it through
    /// the returned handle; peers address it from `iova()` with its `rkey()`.
    ///
    /// [`deregister`](Self::deregister) ends it at once; so does dropping its last handle
    /// (a packet queued and not yet built keeps the memory it was granted until it is built).
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        let pd = self.pd;
        let region = self.device.engine().call(|reply| Command::RegMr {
            pd,
            len,
            access,
            reply,
        })??;
        Ok(self.deregistered_on_drop(region))
    }

    /// `region`, deregistered when the application's last handle to it goes.
    fn deregistered_on_drop(&self, region: MemoryRegion) -> MemoryRegion {
        let (device, keys) = (self.device.clone(), (region.lkey(), region.rkey()));
        region.on_last_drop(move || {
            // A device that has stopped has nothing left to release.
            let _ = device.engine().command(Command::ReleaseMr(keys.0, keys.1));
        })
    }

    /// Registers a program's `memory` in place, at its own address, as a region that peers
    /// address from `iova` (its address for `ibv_reg_mr`): no copy, and a peer's WRITE lands
    /// in that memory. For a C library over softroce; a Rust program registers a buffer
    /// ([`register_buffer`](Self::register_buffer)).
    ///
    /// After [`deregister`](Self::deregister), the memory is the program's again once
    /// [`MemoryRegion::try_close`] succeeds on the last handle: until then a transfer in
    /// flight may still read or write it.
    pub fn register_foreign(
        &self,
        memory: ForeignMemory,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        let pd = self.pd;
        let region = self.device.engine().call(|reply| Command::RegForeign {
            pd,
            memory,
            iova,
            access,
            reply,
        })??;
        Ok(self.deregistered_on_drop(region))
    }

    /// Registers `buffer` (a `Vec<u8>` or a `Box<[u8]>`), which the application hands over, as
    /// a region of its length: no copy is made, and [`MemoryRegion::into_buffer`] hands the same buffer back once the
    /// region is deregistered ([`deregister`](Self::deregister)) and its last handle is the
    /// one given.
    ///
    /// While it is registered the buffer is the region's: the application reads and writes it
    /// through the handle ([`MemoryRegion::read`], [`write`](MemoryRegion::write)), as every
    /// access is an atomic one, so that a peer's WRITE landing while the application reads is
    /// not a data race; the `Vec` itself is gone until it is handed back. If its length is not
    /// a multiple of 8, up to 7 zero bytes complete its last word, in its spare capacity (make
    /// it with `Vec::with_capacity(len.next_multiple_of(8))` to be sure) or by growing it,
    /// which may move it once; they come off again when it is handed back.
    ///
    /// The region's words are atomic, so its allocation must be aligned to 8 bytes. Rust does
    /// not promise that of a `Vec<u8>`, but glibc's, jemalloc's and mimalloc's allocators give
    /// 16; a buffer that is not aligned comes back in the error ([`MemoryError::Misaligned`]),
    /// untouched, as does every buffer that cannot be registered.
    pub fn register_buffer(
        &self,
        buffer: impl Into<Vec<u8>>,
        access: Access,
    ) -> std::result::Result<MemoryRegion, (Vec<u8>, Error)> {
        // A `Box<[u8]>` becomes a `Vec` of the same allocation.
        let buffer = buffer.into();
        let pd = self.pd;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let command = Command::RegBuffer {
            pd,
            buffer,
            access,
            reply: tx,
        };
        let engine = self.device.engine();
        if let Err((unsent, gone)) = engine.offer(command) {
            let buffer = match (unsent, rx.try_recv()) {
                (Some(Command::RegBuffer { buffer, .. }), _) => buffer,
                // An inline turn took it and answered before the device stopped.
                (None, Ok(Ok(region))) => return Ok(self.deregistered_on_drop(region)),
                (None, Ok(Err((buffer, _)))) => buffer,
                // Taken by an engine that stopped before it answered: freed with it.
                _ => Vec::new(),
            };
            return Err((buffer, gone.into()));
        }
        match rx.recv() {
            Ok(Ok(region)) => Ok(self.deregistered_on_drop(region)),
            Ok(Err((buffer, error))) => Err((buffer, error.into())),
            // The engine stopped with the buffer in hand: it was freed with it.
            Err(_) => Err((Vec::new(), engine.gone().into())),
        }
    }

    /// `ibv_alloc_mw`: a memory window of this protection domain (see [`crate::memory`]'s
    /// window rules). A type 1 window is bound with [`QueuePair::bind_mw`]; a type 2 window
    /// with a [`SendOp::BindMw`] work request, after which
    /// only that QP's peer reaches memory through it. Deallocated when the handle is dropped.
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        let pd = self.pd;
        let rkey = self
            .device
            .engine()
            .call(|reply| Command::AllocMw(pd, kind, reply))??;
        Ok(MemoryWindow {
            device: self.device.clone(),
            kind,
            rkey: AtomicU32::new(rkey.0),
        })
    }

    /// Deregisters a region: its keys stop working at once. Refused while memory windows are
    /// bound over it.
    pub fn deregister(&self, region: &MemoryRegion) -> Result<()> {
        let lkey = region.lkey();
        Ok(self
            .device
            .engine()
            .call(|reply| Command::DeregMr(lkey, reply))??)
    }

    /// The domain's number on its device.
    pub fn id(&self) -> PdId {
        self.pd
    }

    /// The device the domain is on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Starts building a queue pair: RC, with 256-deep queues, unless told otherwise.
    pub fn create_qp(&self) -> QpBuilder<'_> {
        QpBuilder {
            pd: self,
            qp_type: QpType::Rc,
            send_cq: None,
            recv_cq: None,
            srq: None,
            max_send_wr: 256,
            max_recv_wr: 256,
            sq_psn: None,
            qkey: QKey(0),
        }
    }

    /// An address handle for UD sends to `dest`.
    ///
    /// Every engine of the device gets it, at the number the first engine chose, so that a UD
    /// QP on any engine sends with it.
    pub fn create_ah(&self, dest: IpAddr) -> Result<AddressHandle> {
        let (pd, av) = (self.pd, AddressVector { dest });
        let engines = &self.device.inner.engines;
        let _serial = self.device.address_handles();
        let create = |engine: &EngineHandle, at| {
            engine.call(|reply| Command::CreateAh { pd, av, at, reply })
        };
        let ah = create(&engines[0], None)??;
        for (n, engine) in engines.iter().enumerate().skip(1) {
            if let Err(error) = create(engine, Some(ah))
                .map_err(Error::from)
                .and_then(|r| r.map_err(Error::from))
            {
                for engine in &engines[..n] {
                    let _ = engine.call(|reply| Command::DestroyAh(ah, reply));
                }
                return Err(error);
            }
        }
        Ok(ah)
    }

    /// `ibv_destroy_ah`: the handle no longer names a destination; sends already posted with
    /// it still go where it said.
    pub fn destroy_ah(&self, ah: AddressHandle) -> Result<()> {
        let engines = self.device.inner.engines.iter();
        let _serial = self.device.address_handles();
        // The first engine's answer is the handle's; the others only hold copies.
        let answers: Vec<_> = engines
            .map(|engine| engine.call(|reply| Command::DestroyAh(ah, reply)))
            .collect();
        answers
            .into_iter()
            .next()
            .expect("a device has an engine")??;
        Ok(())
    }

    /// A shared receive queue of up to `max_wr` requests; a non-zero `srq_limit` arms the
    /// limit event (`AsyncEvent::SrqLimitReached`, from `Device::poll_event`).
    pub fn create_srq(&self, max_wr: usize, srq_limit: u32) -> Result<SharedReceiveQueue> {
        let (pd, attr) = (self.pd, SrqAttr { max_wr, srq_limit });
        let engine = self.device.next_engine();
        let queues = self
            .device
            .engine_at(engine)
            .call(|reply| Command::CreateSrq(pd, attr, reply))??;
        Ok(SharedReceiveQueue {
            device: self.device.clone(),
            engine,
            id: queues.id(),
            queues,
        })
    }
}

/// A memory window (`struct ibv_mw`): a remote key for part of a region, bound and invalidated
/// without registering anything. Its rkey changes with each bind (`ibv_inc_rkey`):
/// [`rkey`](Self::rkey) is the latest, the one to hand to a peer.
#[derive(Debug)]
pub struct MemoryWindow {
    device: Device,
    kind: MwType,
    rkey: AtomicU32,
}

impl MemoryWindow {
    /// The window's rkey: after a bind, the one it was bound with.
    pub fn rkey(&self) -> RKey {
        RKey(self.rkey.load(Ordering::Relaxed))
    }

    /// The window's type, 1 or 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// A bind of this window over `len` bytes at `offset` into `region`, with `access`, for a
    /// [`SendOp::BindMw`] work request. The window's rkey
    /// becomes the bind's new one now: the application hands it to its peer once the bind
    /// completes successfully.
    pub fn bind_request(
        &self,
        region: &MemoryRegion,
        offset: usize,
        len: usize,
        access: Access,
    ) -> BindMw {
        let addr = region.iova() + offset as u64;
        self.next_bind(region.lkey(), addr, len as u64, access)
    }

    /// The bind that unbinds a type 1 window (a zero length, as `ibv_bind_mw` with no region):
    /// once it completes, the window reaches nothing, its region counts it no more (and may be
    /// deregistered), and it may be bound again. Its rkey changes as with any bind.
    pub fn unbind_request(&self) -> BindMw {
        self.next_bind(LKey(0), 0, 0, Access::NONE)
    }

    /// A bind of this window with the next rkey, which becomes the window's now.
    fn next_bind(&self, region: LKey, addr: u64, len: u64, access: Access) -> BindMw {
        let window = self.rkey();
        let new_rkey = inc_rkey(window);
        self.rkey.store(new_rkey.0, Ordering::Relaxed);
        BindMw {
            window,
            new_rkey,
            region,
            addr,
            len,
            access,
        }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let rkey = self.rkey();
        let _ = self
            .device
            .engine()
            .call(|reply| Command::DeallocMw(rkey, reply));
    }
}

/// A shared receive queue: QPs built with it take their receive requests from it.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    device: Device,
    /// The engine it lives on, with every QP built with it.
    engine: usize,
    id: SrqId,
    /// Its posting queue, which its engine takes whole at its turns, and the size posts are
    /// held to.
    queues: SrqQueues,
}

impl SharedReceiveQueue {
    /// Posts a receive request, which any QP built with the SRQ may take: written into the
    /// SRQ's posting queue for its engine's next turn, as a QP's receives are, with no round
    /// trip to the engine. Refused at the call ([`Error::QueueFull`]) once `max_wr` requests
    /// are posted and not yet taken by a QP.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let engine = self.device.engine_at(self.engine);
        let max_wr = self.queues.max_wr.load(Ordering::SeqCst);
        if !self.queues.slots.take_recv(max_wr) {
            return Err(Error::QueueFull {
                queue: WorkQueue::SharedReceive,
                depth: max_wr,
            });
        }
        if self.queues.recv.push(wr).is_err() {
            self.queues.slots.retire_recvs(1);
            return Err(engine.gone().into());
        }
        engine.ring(&self.queues)?;
        Ok(())
    }

    /// Whether `id` is this SRQ's number (the one an `AsyncEvent::SrqLimitReached` names).
    pub fn owns(&self, id: SrqId) -> bool {
        self.id == id
    }

    /// `ibv_modify_srq`: resize (refused below what is posted), or arm the limit event again.
    pub fn modify(&self, change: SrqModify) -> Result<()> {
        let id = self.id;
        Ok(self
            .device
            .engine_at(self.engine)
            .call(|reply| Command::ModifySrq(id, change, reply))??)
    }
}

/// Builds a queue pair.
#[derive(Debug)]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    qp_type: QpType,
    send_cq: Option<CompletionQueue>,
    recv_cq: Option<CompletionQueue>,
    /// The SRQ's device, its engine and its number.
    srq: Option<(Device, usize, SrqId)>,
    max_send_wr: usize,
    max_recv_wr: usize,
    sq_psn: Option<Psn>,
    qkey: QKey,
}

impl QpBuilder<'_> {
    /// The PSN the QP sends from, which its [`endpoint`](QueuePair::endpoint) tells the peer.
    /// Without it, a random one.
    pub fn sq_psn(mut self, psn: Psn) -> Self {
        self.sq_psn = Some(psn);
        self
    }

    /// The Q_Key a UD QP checks on receive and sends by default (see
    /// [`QueuePair::ready_datagram`]); 0 unless told.
    pub fn qkey(mut self, qkey: QKey) -> Self {
        self.qkey = qkey;
        self
    }

    /// Takes receive requests from `srq` instead of a queue of its own.
    pub fn srq(mut self, srq: &SharedReceiveQueue) -> Self {
        self.srq = Some((srq.device.clone(), srq.engine, srq.id));
        self
    }

    /// RC (the default), UC or UD.
    pub fn qp_type(mut self, qp_type: QpType) -> Self {
        self.qp_type = qp_type;
        self
    }

    /// The CQ its send completions go to. Required.
    pub fn send_cq(mut self, cq: &CompletionQueue) -> Self {
        self.send_cq = Some(cq.clone());
        self
    }

    /// The CQ its receive completions go to. Required (it may be the send CQ).
    pub fn recv_cq(mut self, cq: &CompletionQueue) -> Self {
        self.recv_cq = Some(cq.clone());
        self
    }

    /// How many send requests may be outstanding at once (256 unless told).
    pub fn max_send_wr(mut self, n: usize) -> Self {
        self.max_send_wr = n;
        self
    }

    /// How many receive requests may be posted and not yet completed (256 unless told).
    pub fn max_recv_wr(mut self, n: usize) -> Self {
        self.max_recv_wr = n;
        self
    }

    /// Creates the QP, in RESET: [`QueuePair::connect`] or [`QueuePair::ready_datagram`] makes
    /// it ready.
    pub fn build(self) -> Result<QueuePair> {
        let (Some(send_cq), Some(recv_cq)) = (self.send_cq, self.recv_cq) else {
            return Err(VerbsError::InvalidRequest("a QP needs a send and a receive CQ").into());
        };
        let device = &self.pd.device;
        let theirs = [&send_cq.inner.device, &recv_cq.inner.device];
        if theirs
            .iter()
            .any(|other| !Arc::ptr_eq(&other.inner, &device.inner))
        {
            return Err(VerbsError::InvalidRequest("the CQ belongs to another device").into());
        }
        let srq_elsewhere = (self.srq.as_ref())
            .is_some_and(|(other, ..)| !Arc::ptr_eq(&other.inner, &device.inner));
        if srq_elsewhere {
            return Err(VerbsError::InvalidRequest("the SRQ belongs to another device").into());
        }
        let engine = (self.srq.as_ref()).map_or_else(|| device.next_engine(), |(_, at, _)| *at);
        let init = QpInit {
            qp_type: self.qp_type,
            pd: self.pd.pd,
            send_cq: send_cq.inner.ids[engine],
            recv_cq: recv_cq.inner.ids[engine],
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
        };
        let (srq, qp_type) = (self.srq.as_ref().map(|(.., id)| *id), self.qp_type);
        let (qpn, queues) =
            device
                .engine_at(engine)
                .call(|reply| Command::CreateQp { init, srq, reply })??;
        Ok(QueuePair {
            device: self.pd.device.clone(),
            engine,
            qpn,
            queues,
            has_srq: srq.is_some(),
            qp_type,
            sq_psn: self.sq_psn.unwrap_or_else(random_psn),
            qkey: self.qkey,
            depths: (self.max_send_wr, self.max_recv_wr),
            state: AtomicU8::new(0),
            destroyed: AtomicBool::new(false),
            _cqs: [send_cq, recv_cq],
        })
    }
}

/// A batch post that stopped early: how many requests were posted before the refused one,
/// and why that one was refused.
#[derive(Debug)]
pub struct PartialPost {
    /// Requests posted, from the first; the refused one and those after it were not.
    pub posted: usize,
    /// Why the next one was refused.
    pub error: Error,
}

impl fmt::Display for PartialPost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} posted, then refused: {}", self.posted, self.error)
    }
}

impl std::error::Error for PartialPost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<PartialPost> for Error {
    fn from(partial: PartialPost) -> Error {
        partial.error
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct QueuePair {
    device: Device,
    /// The engine it lives on.
    engine: usize,
    qpn: Qpn,
    queues: QpQueues,
    has_srq: bool,
    qp_type: QpType,
    sq_psn: Psn,
    qkey: QKey,
    /// `max_send_wr` and `max_recv_wr`, which [`QpQueues::slots`] holds it to.
    depths: (usize, usize),
    /// The state its last modify left it in, as an index into [`QpState::ALL`] (RESET, where a QP starts, is 0).
    state: AtomicU8,
    /// [`destroy`](Self::destroy) ran: the engine has forgotten the QP, whose number may
    /// name another QP by now, so nothing is sent to the engine for it any more.
    destroyed: AtomicBool,
    /// The send and receive CQs, kept alive until the QP is destroyed, as libibverbs refuses
    /// to destroy a CQ that a QP uses.
    _cqs: [CompletionQueue; 2],
}

impl QueuePair {
    /// The engine the QP lives on.
    fn engine(&self) -> &EngineHandle {
        self.device.engine_at(self.engine)
    }

    /// The QP's number, which its peer sends to.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// Refuses a call on a QP that [`destroy`](Self::destroy) took from the engine.
    fn live(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(VerbsError::UnknownQp(self.qpn).into());
        }
        Ok(())
    }

    /// Destroys the QP now, while this handle lives on: what a C program's `ibv_destroy_qp`
    /// does to a QP whose `struct ibv_qp` must stay readable until its events are
    /// acknowledged. The engine forgets the QP (what it had outstanding completes with
    /// WR_FLUSH_ERR), a peer's packets for it are dropped as for no QP, and every call on the
    /// handle is refused from then on ([`VerbsError::UnknownQp`]); dropping it does nothing
    /// more. Destroying it again does nothing.
    pub fn destroy(&self) -> Result<()> {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let qpn = self.qpn;
        // First the CM, on the device's first engine, lets go of the number, so that no
        // connection moves another QP that comes to have it. A device without a CM drops the
        // command unanswered: nothing to forget there.
        let _ = self
            .device
            .engine()
            .call(|reply| Command::Cm(CmCommand::ForgetQp { qpn, reply }));
        self.engine()
            .call(|reply| Command::DestroyQp(qpn, reply))??;
        Ok(())
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        self.live()?;
        let (qpn, to) = (self.qpn, attr.state);
        let attr = Box::new(attr.clone());
        self.engine()
            .call(|reply| Command::ModifyQp(qpn, attr, reply))??;
        if let Some(state) = to {
            self.note_state(state);
        }
        Ok(())
    }

    /// `ibv_query_qp`: the QP's state and attributes as the engine has them now (a QP that
    /// failed reports ERROR here before the application has heard of it).
    pub fn query(&self) -> Result<QpAttr> {
        self.live()?;
        let qpn = self.qpn;
        self.engine()
            .call(|reply| Command::QueryQp(qpn, reply))?
            .ok_or(Error::Verbs(VerbsError::UnknownQp(qpn)))
    }

    /// Gives this RC QP keepalive every `interval` (`None`: none, a QP's default unless a
    /// [`Connection`] gave it [`DeviceConfig::keepalive`]): a peer it has heard nothing from
    /// for that long while it has nothing outstanding is probed (a zero-length RDMA WRITE at
    /// an acknowledged PSN, which any responder acknowledges and does not execute), and the QP
    /// fails ([`AsyncEvent::QpFatal`](crate::transport::AsyncEvent), ERROR) if `retry_cnt` + 1
    /// probes go unanswered. Nothing is sent while the peer is heard from: it costs nothing
    /// while traffic flows. Refused for UC and UD QPs, which nothing answers.
    pub fn set_keepalive(&self, interval: Option<Duration>) -> Result<()> {
        self.live()?;
        let qpn = self.qpn;
        self.engine()
            .call(|reply| Command::Keepalive(qpn, interval, reply))??;
        Ok(())
    }

    /// Has the QP's engine send its failure to a connection's channel ([`Command::WatchQp`]).
    pub(crate) fn watch_failure(&self, events: crate::engine::ConnSender) -> Result<()> {
        self.live()?;
        self.engine()
            .command(Command::WatchQp(self.qpn, events))
            .map_err(Error::from)
    }

    /// Records the state a modify made by others (the connection manager) left the QP in.
    pub(crate) fn note_state(&self, state: QpState) {
        let code = QpState::ALL.iter().position(|&s| s == state).unwrap_or(0);
        self.state.store(code as u8, Ordering::Release);
    }

    /// `ibv_modify_qp` to INIT with `access`, from RESET: receives can be posted from here on,
    /// before the QP is connected (`rdma_create_qp` leaves a QP in INIT for this).
    pub fn init(&self, access: Access) -> Result<()> {
        self.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(access),
            ..Default::default()
        })
    }

    /// This side of the connection, to hand to the peer: the device's address, the QPN, the
    /// PSN this QP sends from ([`QpBuilder::sq_psn`], or random), the port's MTU and the QP's
    /// Q_Key.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            addr: self.device.address(),
            qpn: self.qpn,
            psn: self.sq_psn,
            mtu: self.device.port_mtu(),
            qkey: self.qkey,
        }
    }

    /// Takes a connected QP from RESET (or INIT) through INIT and RTR to RTS, towards the peer
    /// whose [`endpoint`](Self::endpoint) is `remote`. This QP sends from its own endpoint's
    /// PSN and expects `remote.psn` first; the path MTU is the smaller of the two sides'
    /// unless `o` names one. A UC QP gets only the attributes UC takes: the timeouts, retry
    /// counts and READ/atomic depths are RC's alone, and `ibv_modify_qp` refuses them on UC.
    pub fn connect(&self, remote: &QpEndpoint, o: &ConnectOptions) -> Result<()> {
        for step in connect_steps(self.qp_type, remote, self.sq_psn, o) {
            self.modify(&step)?;
        }
        Ok(())
    }

    /// The state the application's last modify left the QP in. The device moves it to an
    /// error state on its own too, but posting to a QP in error is no mistake (the request
    /// completes flushed), so this is all the checks at the call need.
    fn state(&self) -> QpState {
        QpState::ALL[usize::from(self.state.load(Ordering::Acquire))]
    }

    /// What a send request can be refused for at the call: the QP's state (rxe_verbs.c
    /// `rxe_post_send` refuses a QP before RTS), the operation and lengths its type allows,
    /// and its UD destination, given exactly where one is needed.
    fn check_send(&self, wr: &SendWr) -> Result<()> {
        self.live()?;
        let state = self.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::WrongState(state).into());
        }
        wr.check(self.qp_type)?;
        match (self.qp_type, wr.ud) {
            (QpType::Ud, None) => Err(VerbsError::InvalidRequest(
                "a UD send names its destination (SendWr::to)",
            )
            .into()),
            (QpType::Rc | QpType::Uc, Some(_)) => Err(VerbsError::InvalidRequest(
                "only a UD send takes a destination: a connected QP sends to its peer",
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// The error of a post its send queue has no room for.
    fn send_queue_full(&self) -> Error {
        Error::QueueFull {
            queue: WorkQueue::Send,
            depth: self.depths.0,
        }
    }

    /// Hands `wr` to the engine's queue, in a slot taken first; the caller rings.
    fn enqueue_send(&self, wr: SendWr) -> Result<()> {
        self.check_send(&wr)?;
        if !self.queues.slots.take_send(self.depths.0) {
            return Err(self.send_queue_full());
        }
        self.hand_over(&self.queues.send, wr, QueueSlots::retire_sends)
    }

    /// Puts a request, whose slot is taken, in the engine's queue; a request the queue refuses
    /// (the device stopped) gives its slot back (`retire`). The caller rings.
    fn hand_over<T>(
        &self,
        queue: &PostQueue<T>,
        wr: T,
        retire: fn(&QueueSlots, usize),
    ) -> Result<()> {
        queue.push(wr).map_err(|_refused| {
            retire(&self.queues.slots, 1);
            self.engine().gone().into()
        })
    }

    /// `ibv_post_send`. Refused at the call, with the reason, when the QP is not yet ready to
    /// send (RESET, INIT, RTR), the request is not one its type carries (or names a
    /// destination wrongly), or [`max_send_wr`](QpBuilder::max_send_wr) requests are
    /// outstanding ([`Error::QueueFull`]). A QP in ERROR takes the post and completes it with
    /// WR_FLUSH_ERR, as rdma-core's providers do (a program learns of the error from the
    /// completion). What only the device can know (a key that names no region, a peer that
    /// refuses) completes in error too.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.enqueue_send(wr)?;
        self.engine().ring(&self.queues)?;
        Ok(())
    }

    /// Posts every request of `wrs`, in order, or none: each is checked as
    /// [`post_send`](Self::post_send) checks it, and slots for all are taken at once, before
    /// any reaches the device; then one wake-up. What the extended QP's `ibv_wr_complete`
    /// promises ("the entire posting is aborted" on a failure). `wrs` is emptied either way.
    /// Returns how many were posted.
    pub fn post_send_all(&self, wrs: &mut Vec<SendWr>) -> Result<usize> {
        let checked = wrs.iter().try_for_each(|wr| self.check_send(wr));
        let n = wrs.len();
        if let Err(refused) = checked {
            wrs.clear();
            return Err(refused);
        }
        if !self.queues.slots.take_sends(n, self.depths.0) {
            wrs.clear();
            return Err(self.send_queue_full());
        }
        for (handed, wr) in wrs.drain(..).enumerate() {
            if let Err(gone) = self.hand_over(&self.queues.send, wr, QueueSlots::retire_sends) {
                // The device stopped: the slots of the requests not handed over go back.
                self.queues.slots.retire_sends(n - handed - 1);
                return Err(gone);
            }
        }
        if n > 0 {
            self.engine().ring(&self.queues)?;
        }
        Ok(n)
    }

    /// Posts `wrs` in order, waking the device once for all of them: what a linked list of
    /// work requests is to `ibv_post_send`. Stops at the first request refused, as
    /// [`post_send`](Self::post_send) would refuse it; the ones before it are posted, and
    /// [`PartialPost::posted`] says how many. Returns how many were posted.
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<usize, PartialPost> {
        let mut posted = 0;
        let mut refused = None;
        for wr in wrs {
            if let Err(error) = self.enqueue_send(wr) {
                refused = Some(error);
                break;
            }
            posted += 1;
        }
        if posted > 0 {
            if let Err(gone) = self.engine().ring(&self.queues) {
                refused.get_or_insert(gone.into());
            }
        }
        match refused {
            None => Ok(posted),
            Some(error) => Err(PartialPost { posted, error }),
        }
    }

    /// `ibv_bind_mw` for a type 1 window: posts the bind as a work request on this QP; its
    /// completion (opcode `BindMw`, status `MwBindErr` if a rule refused it) says when the
    /// window's new [`rkey`](MemoryWindow::rkey) is good.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        window: &MemoryWindow,
        region: &MemoryRegion,
        (offset, len): (usize, usize),
        access: Access,
    ) -> Result<()> {
        let bind = window.bind_request(region, offset, len, access);
        let wr = SendWr::new(wr_id, SendOp::BindMw(bind), Payload::Sges(SgeList::new()));
        self.post_send(wr)
    }

    /// Posts a receive request; a QP built with an SRQ takes them from the SRQ instead.
    ///
    /// Refused at the call in RESET (rxe_verbs.c `rxe_post_recv`), on a QP with an SRQ, and
    /// once [`max_recv_wr`](QpBuilder::max_recv_wr) receives wait ([`Error::QueueFull`]); in
    /// ERROR taken and flushed (WR_FLUSH_ERR), as rdma-core's providers do. A
    /// new QP is in RESET: to have receives waiting before a connection is accepted (a peer
    /// may send as soon as it is established), take it to INIT first with
    /// [`init`](Self::init).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if self.has_srq {
            return Err(Error::Verbs(VerbsError::InvalidRequest(
                "this QP receives from its SRQ: post to the SRQ",
            )));
        }
        self.live()?;
        let state = self.state();
        if state == QpState::Reset {
            return Err(VerbsError::WrongState(state).into());
        }
        if !self.queues.slots.take_recv(self.depths.1) {
            return Err(Error::QueueFull {
                queue: WorkQueue::Receive,
                depth: self.depths.1,
            });
        }
        self.hand_over(&self.queues.recv, wr, QueueSlots::retire_recvs)?;
        self.engine().ring(&self.queues)?;
        Ok(())
    }

    /// Takes a UD QP from RESET through INIT and RTR to RTS, with the Q_Key it was built with
    /// ([`QpBuilder::qkey`]), which it checks on receive and sends when a request's Q_Key has
    /// its high bit set.
    pub fn ready_datagram(&self) -> Result<()> {
        self.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(self.qkey),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(self.sq_psn),
            ..Default::default()
        })
    }
}

impl Drop for QueuePair {
    /// Destroys the QP, unless [`destroy`](QueuePair::destroy) did: what it still had
    /// outstanding completes with WR_FLUSH_ERR.
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

/// A completion queue. Clones are handles to the same queue; it is destroyed when the last
/// handle goes, and every QP built with it holds one.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

#[derive(Debug)]
struct CqInner {
    device: Device,
    /// Its number on each engine, in engine order.
    ids: Vec<CqId>,
    completions: Arc<Completions>,
    notify: Arc<CqNotify>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        for (engine, &id) in self.device.inner.engines.iter().zip(&self.ids) {
            let _ = engine.call(|reply| Command::DestroyCq(id, reply));
        }
    }
}

impl CompletionQueue {
    /// Up to `max` completions, without blocking, appended to `out`; returns how many. With
    /// inline progress, the engine runs a turn first.
    ///
    /// Once the device has stopped, the completions it flushed are still returned; after the
    /// last of them, `poll` fails with why the device stopped ([`Error::DeviceFailed`] or
    /// [`Error::DeviceClosed`]), so that a poll loop learns it instead of spinning on zero.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        self.poll_each(max, |wc| out.push(wc))
    }

    /// [`poll`](Self::poll), handing each completion to `each` instead of a `Vec`: for a
    /// caller that writes them where it keeps them (`ibv_poll_cq`'s array), with no allocation.
    pub fn poll_each(&self, max: usize, each: impl FnMut(WorkCompletion)) -> Result<usize> {
        let engine = self.inner.device.engine();
        // An engine that has stopped has no completions to add: the queue says the rest.
        let _ = engine.help_poll(self.inner.completions.waiting());
        self.inner
            .completions
            .take_each(max, each)
            .ok_or_else(|| engine.gone().into())
    }

    /// One completion, waiting up to `timeout` for it: the completion channel, for applications
    /// that do not want to spin.
    pub fn wait(&self, timeout: Duration) -> Result<Option<WorkCompletion>> {
        receive(
            self.inner.device.engine(),
            &*self.inner.completions,
            timeout,
        )
    }

    /// The next completion, as a future that any executor can run: it is woken when the
    /// device delivers a completion to this CQ (or stops). One task at a time should await a
    /// CQ, as one thread at a time polls a CQ in libibverbs.
    ///
    /// With [`Progress::Inline`] nothing runs the engine between the application's calls, so
    /// the future runs a turn each time it is polled and asks to be polled again: it works,
    /// but it spins. Async programs want [`Progress::Hybrid`] (the default) or
    /// [`Progress::Thread`]: a hybrid engine's thread runs the engine from the moment the
    /// future is pending until it is ready or dropped.
    pub fn next_completion(&self) -> NextCompletion<'_> {
        NextCompletion {
            cq: self,
            watch: None,
        }
    }

    /// Whether the device has stopped: no completion comes to the CQ any more but those it
    /// flushed, which [`poll`](Self::poll) still returns before it fails.
    pub fn is_stopped(&self) -> bool {
        self.inner.completions.let_go()
    }

    /// Whether `id` is this CQ's number on one of its device's engines (the number an
    /// `AsyncEvent::CqOverrun` names). Numbers are per engine: with several engines, two CQs
    /// may each own the same number on different engines.
    pub fn owns(&self, id: CqId) -> bool {
        self.inner.ids.contains(&id)
    }

    /// `ibv_req_notify_cq`: the CQ's file descriptor ([`AsFd`]) becomes readable at the next
    /// completion delivered to it, or with `solicited_only`, at the next solicited one (a
    /// receive whose message set the SE bit, see [`SendWr::solicited`]) or failed one. One
    /// event per call: arm again after handling it.
    ///
    /// As with libibverbs, arm first and then poll, so that a completion delivered in between
    /// is not left waiting for an event that was never armed:
    /// `req_notify`, `poll` until empty, wait for the descriptor, [`take_events`](Self::take_events),
    /// and again.
    pub fn req_notify(&self, solicited_only: bool) {
        self.inner.notify.arm(solicited_only, true);
    }

    /// [`req_notify`](Self::req_notify), for a caller that waits for the event in
    /// [`Device::drive_wait`], running the engine itself. A hybrid engine's thread takes the
    /// engine from an arming until its event fires, since the caller of `req_notify` may sleep
    /// where no turn runs; here it does not, and takes over only as it does from any
    /// application that has gone quiet (after about a millisecond) if the caller does not
    /// come.
    pub fn req_notify_driving(&self, solicited_only: bool) {
        self.inner.notify.arm(solicited_only, false);
    }

    /// Counts each event of this CQ's arming, and its device's stop, in `counter` as well,
    /// once its descriptor is readable with it: a waiter over several CQs (a completion
    /// channel) that reads the counter, then finds no descriptor readable, learns of a later
    /// event without a system call. The first counter given stays: false for a later one.
    pub fn count_events_in(&self, counter: Arc<AtomicU64>) -> bool {
        self.inner.notify.count_events_in(counter)
    }

    /// `ibv_get_cq_event` and `ibv_ack_cq_events` in one: how many armed events fired since the
    /// last call (0 if none), clearing the descriptor's readiness.
    pub fn take_events(&self) -> u64 {
        self.inner.notify.take_events()
    }

    /// The next completion if one is waiting; `None` if not; the device's end once it has
    /// stopped and every completion it flushed has been taken.
    fn try_next(&self) -> Option<Result<WorkCompletion>> {
        let completions = &self.inner.completions;
        match completions.try_pop() {
            Some(wc) => Some(Ok(wc)),
            None if completions.stopped() => Some(Err(self.inner.device.engine().gone().into())),
            None => None,
        }
    }
}

/// The CQ's notification descriptor (an eventfd), readable once an armed event fired: for a
/// completion channel's `poll(2)` or epoll, mio, or tokio's `AsyncFd`. See
/// [`req_notify`](CompletionQueue::req_notify). The descriptor stays open, and stays the same,
/// for as long as any handle to the CQ lives: what `AsyncFd::register` asks of the object it
/// is given (a clone of the CQ).
impl AsFd for CompletionQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.notify.as_fd()
    }
}

impl AsRawFd for CompletionQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

/// The future of [`CompletionQueue::next_completion`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct NextCompletion<'a> {
    cq: &'a CompletionQueue,
    /// While pending on a hybrid engine: the engine's thread runs it meanwhile.
    watch: Option<Watch>,
}

impl Future for NextCompletion<'_> {
    type Output = Result<WorkCompletion>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let cq = self.cq;
        let engine = cq.inner.device.engine();
        if engine.calls_only() {
            // An engine that has stopped has no completions to add: the queue says the rest.
            let _ = engine.drive();
        }
        if let Some(next) = cq.try_next() {
            return Poll::Ready(next);
        }
        cq.inner.notify.wait_with(cx.waker());
        // Again: a completion delivered before the waker was in place woke nobody.
        if let Some(next) = cq.try_next() {
            return Poll::Ready(next);
        }
        if engine.calls_only() {
            cx.waker().wake_by_ref();
        } else if self.watch.is_none() {
            let watch = engine.watchers().map(|watchers| watchers.begin());
            self.get_mut().watch = watch;
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    fn rejected(reason: RejReason, private_data: &[u8]) -> Failure {
        let mut data = private_data.to_vec();
        data.resize(148, 0);
        Failure::Rejected {
            reason,
            private_data: data,
        }
    }

    /// The errors a user reads name the address, the port and the queue, in a user's words,
    /// the CM's kept in brackets; a REJ's zero padding stays out of Debug.
    #[test]
    fn errors_say_where_and_which_in_a_users_words() {
        let to: SocketAddr = "192.0.2.7:7471".parse().unwrap();
        let failed = |failure| Error::ConnectFailed { to, failure }.to_string();
        assert_eq!(
            failed(rejected(RejReason::INVALID_SERVICE_ID, &[])),
            "no listener on 192.0.2.7:7471 (REJ 8, invalid service ID)"
        );
        assert_eq!(
            failed(Failure::Unreachable),
            "no RoCE device at 192.0.2.7 (UDP 4791 unreachable)"
        );
        assert_eq!(
            failed(Failure::TimedOut),
            "192.0.2.7:7471 did not answer, however often asked"
        );
        assert!(failed(rejected(RejReason::CONSUMER_DEFINED, b"busy"))
            .starts_with("192.0.2.7:7471 rejected the connection (REJ 28, "));
        let full = Error::QueueFull {
            queue: WorkQueue::Send,
            depth: 16,
        };
        assert_eq!(full.to_string(), "send queue full (depth 16)");

        let quiet = format!("{:?}", rejected(RejReason::INVALID_SERVICE_ID, &[]));
        assert_eq!(quiet, "Rejected { reason: RejReason(8) }");
        let said = format!("{:?}", rejected(RejReason::CONSUMER_DEFINED, b"busy"));
        assert!(
            said.contains("private_data: [98, 117, 115, 121] }"),
            "{said}"
        );
    }
}
