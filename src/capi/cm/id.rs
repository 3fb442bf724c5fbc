//! RDMA-CM IDs: what `rdma_create_id` hands out, and every call on one, over softroce's CM.
//!
//! An ID moves through the stages of librdmacm's (fresh, bound, address and route resolved,
//! listening, a request not yet answered, connecting, connected, ended). The calls that wait
//! on the network start a thread of the ID's and return; the thread posts the outcome to the
//! ID's channel as an event. A synchronous ID (made with no channel, as `rdma_create_ep` makes
//! them) has a channel of its own, and its calls wait for their event before they return.

use std::net::{IpAddr, SocketAddr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use libc::{c_int, c_void};
use softroce::memory::Access;
use softroce::transport::QpType;
use softroce::transport::{ConnectOptions, MAX_RD_ATOMIC};
use softroce::verbs::{
    Connection, ConnectionRequest, DatagramRequest, Device, Error as VerbsError, ManualConnection,
    QueuePair,
};
use softroce::wire::cm::RejReason;
use softroce::wire::{Qpn, RnrTimer};

use super::channel::{Channel, Event, Events};
use super::link::{established_param, Link};
use super::ports::PortClaim;
use super::{ip_of, socket_addr, storage};
use crate::abi::*;
use crate::devices::{self, Context, FailureWatcher};
use crate::fork::Born;
use crate::qp::Qp;
use crate::{errno_of, guard, say, set_errno, unsupported};

/// How long a synchronous call waits for its event: longer than the CM's own retries (15
/// tries of about 4.3 s) take to give up.
const SYNC_WAIT: Duration = Duration::from_secs(90);
/// How often the threads that wait on softroce's CM look whether their ID was destroyed.
const POLL: Duration = Duration::from_millis(100);

/// What a connection request waits for: an answer to a REQ, or to a SIDR request.
pub(super) enum Request {
    Rc(ConnectionRequest),
    Ud(DatagramRequest),
}

/// Where an ID is.
pub(super) enum Stage {
    Fresh,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Requested(Request),
    Connecting,
    Connected(Link),
    Ended,
}

/// What an ID's threads share with it.
pub(super) struct Shared {
    /// The program's pointer to the ID, which its events carry.
    me: usize,
    events: Mutex<Arc<Events>>,
    /// The program's channel, which a listener's requests' IDs take (as their `id->channel`):
    /// changed with `events`, under its lock.
    channel: AtomicPtr<rdma_event_channel>,
    stage: Mutex<Stage>,
    destroyed: AtomicBool,
    /// The ID's events the program holds (see [`hand_out`]).
    held: Mutex<Held>,
    /// The QP `rdma_create_qp` made on the ID, while the ID holds it: for the state a
    /// connection's event leaves it in ([`note_event`], on the thread that takes the event).
    qp: Mutex<Option<MadeQp>>,
    /// A listening ID's requests not yet taken, and how many may wait.
    backlog: Backlog,
}

/// The most requests a listener keeps unread: the kernel's `net.rdma_ucm.max_backlog`
/// default, which a backlog of 0 or less, or more than this, becomes (ucma.c `ucma_listen`).
const MAX_BACKLOG: usize = 1024;

/// A listener's backlog, as the kernel's ucma counts it: the `CONNECT_REQUEST` events posted
/// and not yet taken by `rdma_get_cm_event` (or `rdma_get_request`). A request beyond it is not
/// queued: a REQ is let go unanswered, so that the peer sends it again later (ucma.c answers
/// `-ENOMEM`, after which cm.c sends no REJ), and a SIDR request is refused (SIDR_REP status 2,
/// which cm.c sends whatever the handler's error). So a peer cannot make a listener whose
/// program does not read its events hold more than this many requests.
#[derive(Default)]
struct Backlog {
    /// The most that may wait; 0 until the ID listens.
    limit: AtomicUsize,
    unread: AtomicUsize,
    /// Whether the program was told, on standard error, that requests are being let go.
    said: AtomicBool,
}

impl Backlog {
    /// The ID listens with `backlog`, as the program gave it.
    fn start(&self, backlog: c_int) {
        let limit = usize::try_from(backlog)
            .ok()
            .filter(|n| (1..=MAX_BACKLOG).contains(n))
            .unwrap_or(MAX_BACKLOG);
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Whether another request may wait. Only the listener's thread posts requests, so room
    /// found here is still there when it posts: takes only make more.
    fn has_room(&self) -> bool {
        self.unread.load(Ordering::Acquire) < self.limit.load(Ordering::Relaxed)
    }

    /// A request from `peer` to the listener at `local` found no room: says so on standard
    /// error, once per listener.
    fn overflowed(&self, local: SocketAddr, peer: SocketAddr) {
        if !self.said.swap(true, Ordering::Relaxed) {
            say!(
                "rdma_listen on {local}: {} connection requests wait unread (its backlog): \
                 the request from {peer}, and any more until the program takes them \
                 (rdma_get_cm_event), are let go as the kernel lets them go",
                self.limit.load(Ordering::Relaxed)
            );
        }
    }
}

/// A QP `rdma_create_qp` made: its number, and the program's pointers to it and its context.
#[derive(Clone, Copy)]
struct MadeQp {
    qpn: Qpn,
    qp: usize,
    context: usize,
}

/// An ID's events taken by `rdma_get_cm_event` and not yet acked (its own, and requests to it
/// if it listens), and whether the program destroyed the ID meanwhile: the last ack then
/// frees it. librdmacm's `rdma_destroy_id` blocks until those acks instead; either way, an
/// event a thread holds (its `id` and `listen_id`) never points at freed memory when another
/// thread destroys its ID, as rping's threads may at a disconnection (the CM thread between
/// `rdma_get_cm_event` and its ack, the main thread destroying the ID). Freeing later rather
/// than blocking keeps a destroy made by the thread holding the event (which librdmacm would
/// hang) from hanging.
#[derive(Default)]
struct Held {
    events: usize,
    destroyed: bool,
}

impl Shared {
    /// Posts `event` to the ID's channel as the ID's, unless the ID is destroyed. The check
    /// and the post are made under the lock of `events`, which `rdma_destroy_id` takes to mark
    /// the ID destroyed before it forgets the ID's queued events: so no event of a freed ID is
    /// left for the program to read (its `id` would point at freed memory).
    fn post(self: &Arc<Self>, mut event: Box<Event>) {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        event.ibv.id = self.id();
        event.owners.id = Arc::downgrade(self);
        events.post(event);
    }

    /// Posts the event `make` builds for a request to this listening ID, as the event of the
    /// request's own ID that `make` makes, given this ID's events and channel (which that ID
    /// takes), both as they are under the lock a migration takes; unless this ID is destroyed:
    /// then `make` is not called, and the request it holds is dropped, which refuses it.
    fn post_request(
        self: &Arc<Self>,
        make: impl FnOnce(&Arc<Events>, *mut rdma_event_channel) -> (Arc<Shared>, Box<Event>),
    ) {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        let (child, mut event) = make(&events, self.channel.load(Ordering::Relaxed));
        self.backlog.unread.fetch_add(1, Ordering::AcqRel);
        event.ibv.id = child.id();
        event.owners.id = Arc::downgrade(&child);
        event.ibv.listen_id = self.id();
        event.owners.listener = Arc::downgrade(self);
        events.post(event);
    }

    /// Marks the ID destroyed (see [`post`](Self::post)) and returns its channel's events.
    fn destroy(&self) -> Arc<Events> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        self.destroyed.store(true, Ordering::Release);
        events.clone()
    }

    /// One of the requests to this listener was taken from its channel: it no longer counts in
    /// the backlog.
    pub(super) fn request_taken(&self) {
        let _ = self
            .backlog
            .unread
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The destroyed ID may be freed now: the program holds none of its events. Otherwise the
    /// last ack frees it ([`Held`]). Also the ID's synchronous event, taken out of it: under
    /// the lock that `keep_sync_event` writes it under, and before a last ack on another
    /// thread, which takes the lock too, can free the ID.
    fn free_now(&self) -> (bool, *mut rdma_cm_event) {
        let mut held = self.held();
        held.destroyed = true;
        // SAFETY: the ID is live: its box is freed only by this destroy or by the last ack,
        // which waits for this lock and then sees it destroyed. Only this one field is
        // written, not the whole ID borrowed.
        let event = unsafe { std::mem::replace(&mut (*self.id()).event, ptr::null_mut()) };
        (held.events == 0, event)
    }

    /// One of the ID's events was acked: whether that was the last one of an ID destroyed
    /// meanwhile, which the caller then frees.
    fn acked(&self) -> bool {
        let mut held = self.held();
        held.events = held.events.saturating_sub(1);
        held.destroyed && held.events == 0
    }

    fn id(&self) -> *mut rdma_cm_id {
        self.me as *mut rdma_cm_id
    }

    /// Makes `event`, which a synchronous call of the ID waited for, the ID's `id->event`, as
    /// librdmacm does (the connection's parameters and private data are read there), and frees
    /// the one it replaces. Dropped instead if the ID was destroyed meanwhile (by another
    /// thread: the program's race, which this call then survives).
    fn keep_sync_event(&self, mut event: Box<Event>) {
        // Taken by no `rdma_get_cm_event`, so counted in no ID's held events: a program that
        // acks it itself (rsocket does, then clears `id->event`) only frees it.
        event.owners = Owners::default();
        let held = self.held();
        if held.destroyed {
            return;
        }
        let id = self.id();
        // SAFETY: the ID is live: `rdma_destroy_id` marks it destroyed under the lock held here
        // before it frees it, or takes its `event`. The synchronous ID's calls are the program's
        // one at a time, and this is one of them, after its borrow of the ID has ended.
        let old =
            unsafe { std::mem::replace(&mut (*id).event, ptr::addr_of_mut!(Box::leak(event).ibv)) };
        drop(held);
        // SAFETY: an event this function kept before, handed to no one else.
        unsafe { free_sync_event(old) };
    }

    fn set(&self, stage: Stage) {
        *self.stage.lock().unwrap_or_else(|p| p.into_inner()) = stage;
    }

    /// The ID is on `entry`'s device from now on: it hears if the device fails.
    fn watch(self: &Arc<Self>, entry: &devices::DeviceEntry) {
        let me: Arc<dyn FailureWatcher> = self.clone();
        entry.watch_failure(Arc::downgrade(&me));
    }
}

/// An ID whose device failed gets `RDMA_CM_EVENT_DEVICE_REMOVAL`, as the kernel's cma.c
/// sends it to every ID on a device being removed (`cma_process_remove`); a synchronous
/// call waiting on it fails with `ENODEV`.
impl FailureWatcher for Shared {
    fn device_failed(self: Arc<Self>) {
        self.post(Event::new(RDMA_CM_EVENT_DEVICE_REMOVAL, 0));
    }
}

/// An RDMA-CM ID: the program's `rdma_cm_id`, first.
#[repr(C)]
pub(crate) struct Id {
    pub ibv: rdma_cm_id,
    shared: Arc<Shared>,
    /// A synchronous ID's own channel.
    own: Option<Box<Channel>>,
    /// A synchronous listener's QP attributes (`rdma_create_ep`): each request's ID gets a QP
    /// made with them, on this PD.
    qp_attr: Option<(*mut ibv_pd, ibv_qp_init_attr)>,
    /// A listening ID's thread, which takes its requests: joined when the ID is destroyed, so
    /// that the port is free again when `rdma_destroy_id` returns.
    listening: Option<std::thread::JoinHandle<()>>,
    /// The RDMA-CM port it is bound to, held from its bind to its destroy.
    port: Option<PortClaim>,
    /// The process generation that made it ([`crate::fork`]).
    born: Born,
}

impl Id {
    /// A new ID on `events`, boxed and leaked: the program's pointer is its first field.
    fn create(
        events: Arc<Events>,
        channel: *mut rdma_event_channel,
        own: Option<Box<Channel>>,
        context: *mut c_void,
        ps: u32,
    ) -> *mut Id {
        // SAFETY: `rdma_cm_id` is pointers and integers, for which zero (null) is valid.
        let mut ibv: rdma_cm_id = unsafe { std::mem::zeroed() };
        ibv.channel = channel;
        ibv.context = context;
        ibv.ps = ps;
        ibv.qp_type = if ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        let raw = Box::into_raw(Box::new(Id {
            ibv,
            shared: Arc::new(Shared {
                me: 0,
                events: Mutex::new(events),
                channel: AtomicPtr::new(channel),
                stage: Mutex::new(Stage::Fresh),
                destroyed: AtomicBool::new(false),
                held: Mutex::default(),
                qp: Mutex::new(None),
                backlog: Backlog::default(),
            }),
            own,
            qp_attr: None,
            listening: None,
            port: None,
            born: Born::now(),
        }));
        // SAFETY: `raw` was just made and is ours alone; `shared` has no other holder yet.
        unsafe {
            Arc::get_mut(&mut (*raw).shared)
                .expect("no other holder yet")
                .me = raw as usize;
        }
        raw
    }

    /// The ID behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `id` is one librdmacm handed out (`rdma_create_id`, a connection request's
    /// event) that `rdma_destroy_id` has not freed, used by one thread at a time for the
    /// calls that change it, as librdmacm asks. Nothing else here borrows an ID the program
    /// has: its events' threads reach what they share with it through the events
    /// ([`Owners`]), and the calls that change nothing read single fields.
    unsafe fn from_ibv<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
        // SAFETY: per the contract, `id` is the first field of a live `Id`.
        unsafe { id.cast::<Id>().as_mut() }.filter(|id| id.born.ours())
    }

    fn local(&self) -> SocketAddr {
        ip_of(&self.ibv.route.addr.src_storage)
    }

    fn peer(&self) -> SocketAddr {
        ip_of(&self.ibv.route.addr.dst_storage)
    }

    fn set_local(&mut self, addr: SocketAddr) {
        self.ibv.route.addr.src_storage = storage(addr).0;
        self.ibv.route.addr.ibaddr.sgid = gid(addr.ip());
    }

    fn set_peer(&mut self, addr: SocketAddr) {
        self.ibv.route.addr.dst_storage = storage(addr).0;
        self.ibv.route.addr.ibaddr.dgid = gid(addr.ip());
    }

    /// Binds the ID, unbound yet, to the device of `addr` (the first device for a wildcard
    /// address, or a loopback address no device has), and to its port (an ephemeral one for
    /// port 0).
    fn bind(&mut self, addr: SocketAddr) -> Result<(), c_int> {
        let entry = devices::entry_for(addr.ip()).ok_or(libc::EADDRNOTAVAIL)?;
        let context = devices::cm_context(entry)?;
        // SAFETY: librdmacm's contexts stay open for the process's life.
        let opened = unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
        // Until the bind is done, a failure gives the port back (`claim` drops).
        let claim = PortClaim::claim(&opened.device, entry.index, self.ibv.ps, addr.port())?;
        let pd = opened.default_pd()?;
        if self.ibv.verbs.is_null() {
            self.shared.watch(entry);
        }
        self.ibv.verbs = context;
        self.ibv.pd = pd;
        self.ibv.port_num = 1;
        self.ibv.route.addr.ibaddr.pkey = 0xffffu16.to_be();
        // A wildcard, or a loopback address that is no device's, binds the device's own
        // address, where the kernel keeps the address given: a peer in another process, on a
        // device of its own, reaches this one only there (its listener's address, which
        // libfabric hands a client, says so).
        let local = if entry.addr == addr.ip().to_canonical() {
            let mut local = addr;
            local.set_port(claim.port());
            local
        } else {
            SocketAddr::new(entry.addr, claim.port())
        };
        self.set_local(local);
        self.port = Some(claim);
        Ok(())
    }

    /// The ID's device context (librdmacm's).
    fn context(&self) -> Result<&Context, c_int> {
        // SAFETY: an ID's context is one of librdmacm's, open for the process's life.
        unsafe { Context::from_ibv(self.ibv.verbs) }.ok_or(libc::EINVAL)
    }

    /// The softroce device under the ID.
    fn device(&self) -> Result<&Device, c_int> {
        Ok(&self.context()?.device)
    }

    /// Starts `work` on a thread of the ID's, on the ID's device: a panic there fails the
    /// device ([`devices::DeviceEntry::spawn_guarded`]).
    fn spawn(&self, work: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
        self.spawn_joinable(work).map(drop)
    }

    /// [`spawn`](Self::spawn), for a thread to be joined.
    fn spawn_joinable(
        &self,
        work: impl FnOnce() + Send + 'static,
    ) -> Result<std::thread::JoinHandle<()>, c_int> {
        let entry = self.context()?.entry;
        entry
            .spawn_guarded("softroce-rdmacm", work)
            .map_err(|_| libc::EAGAIN)
    }

    /// The QP the program created on the ID (`rdma_create_qp`).
    fn qp(&self) -> Option<&Qp> {
        // SAFETY: `id->qp` is null or the QP `rdma_create_qp` made. A program that destroys
        // it with `ibv_destroy_qp` rather than `rdma_destroy_qp` (which clears it) calls no
        // connection verb on the ID after, as librdmacm, which uses `id->qp` there too, asks.
        unsafe { Qp::from_ibv(self.ibv.qp) }
    }

    fn stage(&self) -> std::sync::MutexGuard<'_, Stage> {
        self.shared.stage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For a synchronous ID, the wait for the event its call posts ([`SyncWait`]), which
    /// [`with_id`] runs once the call lets go of the ID; 0 at once for an ID on a program's
    /// channel.
    fn finish(&self, success: u32) -> Outcome {
        match &self.own {
            None => Outcome::Now(0),
            Some(own) => Outcome::Wait(SyncWait {
                events: Arc::clone(&own.events),
                shared: Arc::clone(&self.shared),
                success,
            }),
        }
    }
}

/// What a call on an ID returns: a value now, or, on a synchronous ID, what its event says.
pub(super) enum Outcome {
    Now(c_int),
    Wait(SyncWait),
}

impl From<c_int> for Outcome {
    fn from(value: c_int) -> Self {
        Outcome::Now(value)
    }
}

/// A synchronous ID's wait for the event of its call: it holds the queue and what the ID's
/// threads share, not the ID, which another thread may destroy meanwhile (the wait then ends).
pub(super) struct SyncWait {
    events: Arc<Events>,
    shared: Arc<Shared>,
    success: u32,
}

impl SyncWait {
    /// 0 if the event is `success`, else -1 with `errno` from the event.
    fn end(self) -> c_int {
        let shared = &self.shared;
        let Some(event) = self
            .events
            .wait_for(shared.id(), SYNC_WAIT, &shared.destroyed)
        else {
            set_errno(ended_wait(shared));
            return -1;
        };
        let (kind, status) = (event.ibv.event, event.ibv.status);
        note_event(&event);
        shared.keep_sync_event(event);
        if kind == self.success {
            return 0;
        }
        set_errno(match kind {
            _ if status < 0 => -status,
            RDMA_CM_EVENT_DEVICE_REMOVAL => libc::ENODEV,
            _ => libc::ECONNREFUSED,
        });
        -1
    }
}

/// The RoCE v2 GID of `ip`.
fn gid(ip: IpAddr) -> ibv_gid {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    ibv_gid { raw: v6.octets() }
}

/// Runs an exported call's body on the ID behind `id`: -1 with `EINVAL` for null, -1 with
/// the errno `body` returns, or what it returns: a value, or a synchronous ID's wait, which
/// runs once the borrow of the ID has ended.
pub(super) fn with_id<T: Into<Outcome>>(
    id: *mut rdma_cm_id,
    body: impl FnOnce(&mut Id) -> Result<T, c_int>,
) -> c_int {
    guard(-1, || {
        let outcome = {
            // SAFETY: the program passes an ID it holds.
            let Some(this) = (unsafe { Id::from_ibv(id) }) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            match body(this) {
                Ok(outcome) => outcome.into(),
                Err(errno) => {
                    set_errno(errno);
                    return -1;
                }
            }
        };
        match outcome {
            Outcome::Now(value) => value,
            Outcome::Wait(wait) => wait.end(),
        }
    })
}

/// `rdma_create_id`: an ID on `channel`, or a synchronous one if `channel` is null.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard(-1, || {
        if id.is_null() || !matches!(ps, RDMA_PS_TCP | RDMA_PS_UDP) {
            if ps == RDMA_PS_IB || ps == RDMA_PS_IPOIB {
                set_errno(unsupported("rdma_create_id in the IB or IPoIB port space"));
            } else {
                set_errno(libc::EINVAL);
            }
            return -1;
        }
        // SAFETY: a non-null channel is one the program created and has not destroyed.
        let (events, own) = match unsafe { Channel::from_ibv(channel) } {
            Some(channel) => (channel.events.clone(), None),
            None => match Channel::new() {
                Ok(own) => (own.events.clone(), Some(own)),
                Err(_) => {
                    set_errno(libc::EMFILE);
                    return -1;
                }
            },
        };
        let made = Id::create(events, channel, own, context, ps);
        // SAFETY: the program's out-pointer, checked above.
        unsafe { *id = made.cast() };
        0
    })
}

/// `rdma_destroy_id`: stops what the ID was doing (a listen, a connection: its QP is moved
/// to ERROR and the peer sent a DREQ), and forgets its events not yet taken; a listener's
/// requests not yet read go with their IDs, which refuses them.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        if id.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let this = id.cast::<Id>();
        // SAFETY: a live ID's field, written only when it was made.
        if !unsafe { (*this).born }.ours() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: every ID is a leaked `Box<Id>`, destroyed once. Only these two fields are
        // borrowed, not the whole ID, which a thread of the program's holding one of its
        // events may read meanwhile; it becomes a box again only to be freed.
        let (shared, listening, port) = unsafe {
            (
                Arc::clone(&(*this).shared),
                (*this).listening.take(),
                (*this).port.take(),
            )
        };
        let events = shared.destroy();
        // The connection's end goes to the CM now (its DREQ queued), not when the ID's watcher
        // lets go of it: the program may exit right after.
        if let Stage::Connected(conn) = &*shared.stage.lock().unwrap_or_else(|p| p.into_inner()) {
            conn.close();
        }
        shared.set(Stage::Ended);
        if let Some(listening) = listening {
            let _ = listening.join();
        }
        // Its port is free again once its listener has stopped.
        drop(port);
        // Its events still queued go; one taken before this is counted in `held` already
        // (`hand_out` counts under the queue's lock, which `forget` takes). A request no one
        // read goes with its ID, which refuses it (the peer hears at once, rather than at
        // its CM's timeout).
        for event in events.forget(id) {
            let child = event.ibv.id;
            if ptr::eq(event.ibv.listen_id, id) && !child.is_null() {
                // SAFETY: a queued request's ID is alive, and the program never had it.
                unsafe { rdma_destroy_id(child) };
            }
        }
        let (free, sync_event) = shared.free_now();
        // SAFETY: taken out of the ID, which, marked destroyed, gets no other one
        // (`keep_sync_event`).
        unsafe { free_sync_event(sync_event) };
        if free {
            // SAFETY: no event of the ID's is held, and none can be taken any more, so
            // nothing else frees it or reads it.
            drop(unsafe { Box::from_raw(this) });
        }
        // Otherwise the last ack frees it (`release`): `this` is not touched again here.
        0
    })
}

/// What the threads of an event's IDs share with them: its own ID's (`id`), and a request's
/// listener's (`listen_id`). Taking and acking the event count there, not in the IDs, which
/// the program may be changing meanwhile in a call on another thread (the call holds the ID
/// as `&mut`, under librdmacm's rule of one such call at a time). Each is alive while the
/// event is queued or held: an ID's queued events are forgotten before it is destroyed, and
/// one whose events are held stays until the acks ([`Held`]).
#[derive(Default)]
pub(crate) struct Owners {
    pub(super) id: Weak<Shared>,
    pub(super) listener: Weak<Shared>,
}

/// `event` goes to the program: each of its IDs stays allocated until it is acked
/// ([`release`]), even if the program destroys the ID meanwhile ([`Held`]). Called under the
/// lock of the queue the event was taken from, so that `rdma_destroy_id` cannot be between
/// its `forget` and its `free_now`.
pub(super) fn hand_out(event: &Event) {
    for shared in [&event.owners.id, &event.owners.listener] {
        if let Some(shared) = shared.upgrade() {
            shared.held().events += 1;
        }
    }
}

/// The program acked `event`: each of its IDs that the program destroyed meanwhile, and held
/// no other event of, is freed.
///
/// # Safety
///
/// `event` is one [`hand_out`] counted, released once.
pub(super) unsafe fn release(event: &Event) {
    let ids = [
        (event.ibv.id, &event.owners.id),
        (event.ibv.listen_id, &event.owners.listener),
    ];
    for (id, shared) in ids {
        if shared.upgrade().is_some_and(|shared| shared.acked()) {
            // SAFETY: the ID was destroyed and its last event is released: `rdma_destroy_id`
            // left the box for this release to free, and no one else holds it.
            drop(unsafe { Box::from_raw(id.cast::<Id>()) });
        }
    }
}

/// Notes in the QP of `event`'s ID (`qp->state`, which programs may read) the state a
/// connection's event says the CM left it in. `id->event` stays as it is: librdmacm sets it
/// only in a synchronous ID's own calls ([`Shared::keep_sync_event`]).
///
/// The QP is written only while it is the live QP `rdma_create_qp` made on the ID: a program
/// may destroy it with `ibv_destroy_qp` and keep the ID (rping's client does, before its
/// peer's DREQ arrives), and `id->qp` then points at freed memory.
pub(super) fn note_event(event: &Event) {
    let state = match event.ibv.event {
        RDMA_CM_EVENT_ESTABLISHED => 3,  // IBV_QPS_RTS
        RDMA_CM_EVENT_DISCONNECTED => 6, // IBV_QPS_ERR
        _ => return,
    };
    let Some(shared) = event.owners.id.upgrade() else {
        return;
    };
    let Some(made) = *shared.qp.lock().unwrap_or_else(|p| p.into_inner()) else {
        return;
    };
    // SAFETY: an ID's context is one of librdmacm's, open for the process's life.
    let Some(context) = (unsafe { Context::from_ibv(made.context as *mut ibv_context) }) else {
        return;
    };
    let objects = context.objects.lock().unwrap_or_else(|p| p.into_inner());
    if objects.qps.contains(&(made.qpn, made.qp)) {
        // SAFETY: listed under this lock, the QP is live: `ibv_destroy_qp` takes it off the
        // list under the same lock before it frees it.
        let qp = unsafe { &*(made.qp as *const ibv_qp) };
        qp.state.store(state, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `rdma_bind_addr`: the ID's source address, and so its device (any device for a wildcard).
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program passes a sockaddr of its family's length.
        let addr = unsafe { socket_addr(addr) }.ok_or(libc::EAFNOSUPPORT)?;
        // An ID binds once, as the kernel's binds only an idle ID.
        if !this.ibv.verbs.is_null() {
            return Err(libc::EINVAL);
        }
        this.bind(addr)?;
        this.shared.set(Stage::Bound);
        Ok(0)
    })
}

/// `rdma_resolve_addr`: binds to `src` (or the device for `dst`) and records `dst`; the
/// address is resolved at once (RoCE v2 addresses peers by IP), `ADDR_RESOLVED` follows.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program passes sockaddrs of their families' lengths, or null for src.
        let dst = unsafe { socket_addr(dst) }.ok_or(libc::EINVAL)?;
        // A bound ID keeps its address (the kernel binds `src` only for an idle ID).
        // SAFETY: as above.
        match unsafe { socket_addr(src) } {
            Some(src) if this.ibv.verbs.is_null() => this.bind(src)?,
            None if this.ibv.verbs.is_null() => {
                let wildcard = SocketAddr::new(
                    devices::default_for(dst.ip()).ok_or(libc::EADDRNOTAVAIL)?,
                    0,
                );
                this.bind(wildcard)?;
            }
            _ => {}
        }
        this.set_peer(dst);
        this.shared.set(Stage::AddrResolved);
        this.shared.post(Event::new(RDMA_CM_EVENT_ADDR_RESOLVED, 0));
        Ok(this.finish(RDMA_CM_EVENT_ADDR_RESOLVED))
    })
}

/// `rdma_resolve_route`: the one path there is, at once; `ROUTE_RESOLVED` follows.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    with_id(id, |this| {
        if !matches!(*this.stage(), Stage::AddrResolved | Stage::RouteResolved) {
            return Err(libc::EINVAL);
        }
        this.shared.set(Stage::RouteResolved);
        this.ibv.route.num_paths = 1;
        this.shared
            .post(Event::new(RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
        Ok(this.finish(RDMA_CM_EVENT_ROUTE_RESOLVED))
    })
}

/// The connection options for a connection parameter block (librdmacm's defaults without
/// one): the retry counts, the READ/atomic depth, and remote read and atomics only with
/// responder resources, as cma.c grants them.
pub(super) fn options(param: Option<&rdma_conn_param>) -> ConnectOptions {
    let mut options = ConnectOptions::default();
    let Some(p) = param else {
        return options;
    };
    options.retry_cnt = p.retry_count.min(7);
    options.rnr_retry = p.rnr_retry_count.min(7);
    options.max_rd_atomic = p
        .responder_resources
        .max(p.initiator_depth)
        .min(MAX_RD_ATOMIC);
    options.min_rnr_timer = RnrTimer::new(12);
    options.access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    if p.responder_resources > 0 {
        options.access = options.access | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    }
    options
}

/// The private data of a connection parameter block.
///
/// # Safety
///
/// A non-null `private_data` points to `private_data_len` readable bytes.
unsafe fn private_data(param: Option<&rdma_conn_param>) -> Vec<u8> {
    match param {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: per the contract.
            unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

/// Waits, on the ID's thread, for the end of `conn` and reports it (`DISCONNECTED`), unless
/// the ID is destroyed first.
fn watch(shared: Arc<Shared>, conn: Link) {
    loop {
        if shared.destroyed.load(Ordering::Acquire) {
            return;
        }
        match conn.wait_event(POLL) {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => break,
        }
    }
    shared.set(Stage::Ended);
    shared.post(Event::new(RDMA_CM_EVENT_DISCONNECTED, 0));
}

/// The event for a connection attempt that failed with `error`.
fn failed(error: &VerbsError) -> Box<Event> {
    use softroce::cm::Failure;
    match error {
        VerbsError::ConnectFailed {
            failure:
                Failure::Rejected {
                    reason,
                    private_data,
                },
            ..
        } => {
            // SAFETY: the parameters are plain data, for which zero (null) is valid.
            let conn: rdma_conn_param = unsafe { std::mem::zeroed() };
            Event::new(RDMA_CM_EVENT_REJECTED, reason.0.into()).conn(conn, private_data)
        }
        VerbsError::ConnectFailed {
            failure: Failure::TimedOut,
            ..
        } => Event::new(RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
        VerbsError::ConnectFailed {
            failure: Failure::Unreachable,
            ..
        } => Event::new(RDMA_CM_EVENT_UNREACHABLE, -libc::EHOSTUNREACH),
        VerbsError::Unresolved(status) => Event::new(RDMA_CM_EVENT_UNREACHABLE, status.0.into()),
        _ => Event::new(RDMA_CM_EVENT_CONNECT_ERROR, -errno_of(error)),
    }
}

/// The attributes that move a QP to ERROR.
fn error_state() -> softroce::transport::QpAttr {
    softroce::transport::QpAttr {
        state: Some(softroce::transport::QpState::Error),
        ..Default::default()
    }
}

/// `rdma_connect`: an RC connection (a REQ; `ESTABLISHED`, `REJECTED` or `UNREACHABLE`
/// follows) or, on a UD ID, a service resolution (SIDR; `ESTABLISHED` with the server's QP,
/// or `UNREACHABLE`). The ID needs its QP (`rdma_create_qp`).
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |this| {
        if !matches!(*this.stage(), Stage::RouteResolved) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's parameter block, or null.
        let param = unsafe { param.as_ref() };
        // SAFETY: its private data is as long as it says.
        let data = unsafe { private_data(param) };
        let (peer, shared) = (this.peer(), this.shared.clone());
        if this.ibv.ps == RDMA_PS_UDP {
            let device = this.device()?.clone();
            this.shared.set(Stage::Connecting);
            this.spawn(move || {
                let event = match device.resolve_datagram(peer, &data) {
                    Ok(found) => {
                        let ud = rdma_ud_param {
                            private_data: ptr::null(),
                            private_data_len: 0,
                            ah_attr: ah_attr(found.addr),
                            qp_num: found.qpn.value(),
                            qkey: found.qkey.0,
                        };
                        shared.set(Stage::Ended);
                        Event::new(RDMA_CM_EVENT_ESTABLISHED, 0).ud(ud, &found.private_data)
                    }
                    Err(e) => failed(&e),
                };
                shared.post(event);
            })?;
            return Ok(this.finish(RDMA_CM_EVENT_ESTABLISHED));
        }
        let options = options(param);
        let Some(qp) = this.qp() else {
            // A QP the program moves itself: the REQ names `qp_num`; the REP comes as
            // CONNECT_RESPONSE, and `rdma_establish` sends the RTU.
            let qpn = param.map_or(0, |p| p.qp_num);
            if qpn == 0 {
                return Err(crate::report(
                    "rdma_connect",
                    libc::EINVAL,
                    "an ID without a QP names the program's QP in conn_param->qp_num",
                ));
            }
            let route = (Qpn::new(qpn), qp_type_of(&this.ibv));
            let device = this.device()?.clone();
            this.shared.set(Stage::Connecting);
            this.spawn(move || {
                match ManualConnection::connect(&device, route, peer, &options, &data) {
                    Ok(conn) => {
                        let link = Link::Manual(Arc::new(conn));
                        shared.set(Stage::Connected(link.clone()));
                        let event = Event::new(RDMA_CM_EVENT_CONNECT_RESPONSE, 0)
                            .conn(established_param(&link, &options), link.private_data());
                        shared.post(event);
                        watch(shared, link);
                    }
                    Err(e) => {
                        shared.set(Stage::Ended);
                        shared.post(failed(&e));
                    }
                }
            })?;
            return Ok(this.finish(RDMA_CM_EVENT_CONNECT_RESPONSE));
        };
        let qp: Arc<QueuePair> = Arc::clone(&qp.qp);
        this.shared.set(Stage::Connecting);
        this.spawn(
            move || match Connection::connect(qp.clone(), peer, &options, &data) {
                Ok(conn) => {
                    let link = Link::Qp(Arc::new(conn));
                    shared.set(Stage::Connected(link.clone()));
                    let event = Event::new(RDMA_CM_EVENT_ESTABLISHED, 0)
                        .conn(established_param(&link, &options), link.private_data());
                    shared.post(event);
                    watch(shared, link);
                }
                Err(e) => {
                    // As librdmacm does with a rejected or failed connection's QP.
                    let _ = qp.modify(&error_state());
                    shared.set(Stage::Ended);
                    shared.post(failed(&e));
                }
            },
        )?;
        Ok(this.finish(RDMA_CM_EVENT_ESTABLISHED))
    })
}

/// The address vector to a UD peer at `addr`.
fn ah_attr(addr: IpAddr) -> ibv_ah_attr {
    // SAFETY: `ibv_ah_attr` is plain data, for which zero is valid.
    let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    attr.is_global = 1;
    attr.grh.dgid = gid(addr);
    attr.grh.sgid_index = 0;
    attr.grh.hop_limit = 64;
    attr.port_num = 1;
    attr
}

/// `rdma_listen`: takes connection requests (or, on a UD ID, service resolutions) for the
/// bound port on the bound device; each comes as `CONNECT_REQUEST` with an ID of its own. At
/// most `backlog` of them wait unread (1024 for 0 or less, or more than that): see
/// [`Backlog`].
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id(id, |this| {
        if !matches!(*this.stage(), Stage::Bound) {
            return Err(libc::EINVAL);
        }
        this.shared.backlog.start(backlog);
        let local = this.local();
        let device = this.device()?.clone();
        let template = Template {
            entry: this.context()?.entry,
            verbs: this.ibv.verbs,
            pd: this.ibv.pd,
            context: this.ibv.context,
            ps: this.ibv.ps,
            local,
        };
        let shared = this.shared.clone();
        if this.ibv.ps == RDMA_PS_UDP {
            let listener = device
                .listen_datagram(local.port())
                .map_err(|e| errno_of(&e))?;
            this.listening = Some(this.spawn_joinable(move || loop {
                if shared.destroyed.load(Ordering::Acquire) {
                    return;
                }
                match listener.next_request(POLL) {
                    Ok(Some(request)) if !shared.backlog.has_room() => {
                        shared.backlog.overflowed(local, request.peer());
                        let _ = request.reject();
                    }
                    Ok(Some(request)) => {
                        let peer = request.peer();
                        let data = request.private_data().to_vec();
                        let ud = rdma_ud_param {
                            private_data: ptr::null(),
                            private_data_len: 0,
                            ah_attr: ah_attr(peer.ip()),
                            qp_num: 0,
                            qkey: RDMA_UDP_QKEY,
                        };
                        shared.post_request(|events, channel| {
                            let child =
                                template.child((events, channel), peer, Request::Ud(request));
                            let event = Event::new(RDMA_CM_EVENT_CONNECT_REQUEST, 0).ud(ud, &data);
                            (child, event)
                        });
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
            })?);
        } else {
            let listener = device.listen(local.port()).map_err(|e| errno_of(&e))?;
            this.listening = Some(this.spawn_joinable(move || loop {
                if shared.destroyed.load(Ordering::Acquire) {
                    return;
                }
                match listener.next_request(POLL) {
                    Ok(Some(request)) if !shared.backlog.has_room() => {
                        shared.backlog.overflowed(local, request.peer());
                        let _ = request.ignore();
                    }
                    Ok(Some(request)) => {
                        let d = request.details();
                        let conn = rdma_conn_param {
                            private_data: ptr::null(),
                            private_data_len: 0,
                            responder_resources: d.responder_resources,
                            initiator_depth: d.initiator_depth,
                            flow_control: 1,
                            retry_count: d.retry_count,
                            rnr_retry_count: d.rnr_retry_count,
                            srq: d.srq.into(),
                            qp_num: d.peer_qpn.value(),
                        };
                        let (peer, data) = (request.peer(), request.private_data().to_vec());
                        shared.post_request(|events, channel| {
                            let child =
                                template.child((events, channel), peer, Request::Rc(request));
                            let event =
                                Event::new(RDMA_CM_EVENT_CONNECT_REQUEST, 0).conn(conn, &data);
                            (child, event)
                        });
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
            })?);
        }
        this.shared.set(Stage::Listening);
        Ok(0)
    })
}

/// What a listening ID's requests' IDs take from it.
struct Template {
    entry: &'static devices::DeviceEntry,
    verbs: *mut ibv_context,
    pd: *mut ibv_pd,
    context: *mut c_void,
    ps: u32,
    local: SocketAddr,
}

// SAFETY: the pointers are only copied into new IDs, never dereferenced by the thread.
unsafe impl Send for Template {}

impl Template {
    /// A new ID for `request` from `peer`, on the listening ID's device and channel (its
    /// events and the program's pointer, from [`Shared::post_request`]): what its threads
    /// share with it, which knows its pointer.
    fn child(
        &self,
        (events, channel): (&Arc<Events>, *mut rdma_event_channel),
        peer: SocketAddr,
        request: Request,
    ) -> Arc<Shared> {
        let raw = Id::create(events.clone(), channel, None, self.context, self.ps);
        // SAFETY: `raw` was just made; the program does not have it until the event.
        let child = unsafe { &mut *raw };
        child.ibv.verbs = self.verbs;
        child.ibv.pd = self.pd;
        child.ibv.port_num = 1;
        child.set_local(self.local);
        child.set_peer(peer);
        child.shared.set(Stage::Requested(request));
        child.shared.watch(self.entry);
        Arc::clone(&child.shared)
    }
}

/// `rdma_get_request`: a synchronous listener's next request's ID.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    // What the wait and the request need of the listener, held or copied first, and no
    // borrow of it kept during the wait: a program may destroy the listener from another
    // thread to stop its accept loop, and this call must then fail without reading it.
    let mut listener = None;
    let checked = with_id(listen, |this| {
        let own = this.own.as_ref().ok_or(libc::EINVAL)?;
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        listener = Some((
            Arc::clone(&own.events),
            Arc::clone(&this.shared),
            this.qp_attr,
        ));
        Ok(0)
    });
    let Some((events, shared, qp_attr)) = listener else {
        return checked;
    };
    guard(-1, || loop {
        // A request taken is the program's, even if the listener is destroyed meanwhile: its
        // ID does not depend on the listener's.
        let Some(event) = events.wait_for_listener(shared.id(), SYNC_WAIT, &shared.destroyed)
        else {
            set_errno(ended_wait(&shared));
            return -1;
        };
        if event.ibv.event == RDMA_CM_EVENT_DEVICE_REMOVAL {
            set_errno(libc::ENODEV);
            return -1;
        }
        if event.ibv.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            continue;
        }
        let request = event.ibv.id;
        // SAFETY: the program's out-pointer, checked above.
        unsafe { *id = request };
        // SAFETY: the request's ID is new and the program's now; make it synchronous as its
        // listener is, with a channel of its own, and the request its `id->event`, as
        // librdmacm does (its private data is read there).
        let kept = unsafe { Id::from_ibv(request) }.map(|child| {
            if let Ok(channel) = Channel::new() {
                *child
                    .shared
                    .events
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = channel.events.clone();
                child.own = Some(channel);
            }
            Arc::clone(&child.shared)
        });
        // Once the borrow of the ID has ended: this writes into it through its pointer.
        if let Some(shared) = kept {
            shared.keep_sync_event(event);
        }
        if let Some((pd, mut attr)) = qp_attr {
            // SAFETY: the listener's PD (or null) and a copy of its attributes.
            if unsafe { rdma_create_qp(request, pd, &mut attr) } != 0 {
                return -1;
            }
        }
        return 0;
    })
}

/// Frees `event`, a synchronous ID's `id->event` ([`Shared::keep_sync_event`]), if not null.
///
/// # Safety
///
/// `event` is null or an event kept as an ID's `id->event` and no longer that.
unsafe fn free_sync_event(event: *mut rdma_cm_event) {
    if !event.is_null() {
        // SAFETY: per the contract, a leaked `Box<Event>` whose first field `event` is.
        drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    }
}

/// Why a synchronous wait for the ID's event ended without one: the ID was destroyed meanwhile
/// (by another thread: `EINVAL`), or its time ran out.
fn ended_wait(shared: &Shared) -> c_int {
    if shared.destroyed.load(Ordering::Acquire) {
        libc::EINVAL
    } else {
        libc::ETIMEDOUT
    }
}

/// `rdma_accept`: answers the request with the ID's QP (the REP goes out; `ESTABLISHED`
/// follows the RTU), or, on a UD ID, names the ID's QP to the client (SIDR_REP).
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program's parameter block, or null.
        let param = unsafe { param.as_ref() };
        // SAFETY: its private data is as long as it says.
        let data = unsafe { private_data(param) };
        let request = match std::mem::replace(&mut *this.stage(), Stage::Connecting) {
            Stage::Requested(request) => request,
            other => {
                *this.stage() = other;
                return Err(libc::EINVAL);
            }
        };
        let options = options(param);
        let Some(qp) = this.qp() else {
            return accept_manual(this, request, param, (&options, &data));
        };
        let qp: Arc<QueuePair> = Arc::clone(&qp.qp);
        match request {
            Request::Ud(request) => {
                this.shared.set(Stage::Ended);
                request.reply(&qp, &data).map_err(|e| errno_of(&e))?;
                Ok(Outcome::Now(0))
            }
            Request::Rc(request) => {
                // As librdmacm's: the QP is in RTS and the REP on its way when this returns;
                // the peer's RTU comes as ESTABLISHED.
                let link = match request.accept_now(qp, &options, &data) {
                    Ok(conn) => Link::Qp(Arc::new(conn)),
                    Err(e) => {
                        this.shared.set(Stage::Ended);
                        return Err(errno_of(&e));
                    }
                };
                until_established(this, link)
            }
        }
    })
}

/// `rdma_accept` on an ID without a QP: the REP names the program's QP, `conn_param->qp_num`,
/// which the program moves itself (`rdma_init_qp_attr`); ESTABLISHED follows the RTU.
fn accept_manual(
    this: &mut Id,
    request: Request,
    param: Option<&rdma_conn_param>,
    (options, data): (&ConnectOptions, &[u8]),
) -> Result<Outcome, c_int> {
    let qpn = param.map_or(0, |p| p.qp_num);
    let request = match request {
        Request::Rc(request) if qpn != 0 => request,
        Request::Rc(request) => {
            this.shared.set(Stage::Requested(Request::Rc(request)));
            return Err(crate::report(
                "rdma_accept",
                libc::EINVAL,
                "an ID without a QP names the program's QP in conn_param->qp_num",
            ));
        }
        Request::Ud(_) => {
            this.shared.set(Stage::Ended);
            return Err(crate::report(
                "rdma_accept",
                unsupported("rdma_accept on a UD ID without a QP"),
                "create the QP on the ID (rdma_create_qp)",
            ));
        }
    };
    let link = match request.accept_manual(Qpn::new(qpn), options, data) {
        Ok(conn) => Link::Manual(Arc::new(conn)),
        Err(e) => {
            this.shared.set(Stage::Ended);
            return Err(errno_of(&e));
        }
    };
    until_established(this, link)
}

/// An accepted ID's connection: ESTABLISHED when the peer's RTU (or first packet) comes,
/// then its end. The event carries no parameters, as the kernel's after an RTU (cma.c
/// `cma_ib_handler`), which a program's test against kernel rxe showed.
fn until_established(this: &mut Id, link: Link) -> Result<Outcome, c_int> {
    this.shared.set(Stage::Connected(link.clone()));
    let shared = this.shared.clone();
    this.spawn(move || match link.established() {
        Ok(()) => {
            shared.post(Event::new(RDMA_CM_EVENT_ESTABLISHED, 0));
            watch(shared, link);
        }
        Err(e) => {
            shared.set(Stage::Ended);
            shared.post(failed(&e));
        }
    })?;
    Ok(this.finish(RDMA_CM_EVENT_ESTABLISHED))
}

/// The type of QP an ID connects: UC for an ID made so, RC otherwise.
fn qp_type_of(id: &rdma_cm_id) -> QpType {
    if id.qp_type == IBV_QPT_UC {
        QpType::Uc
    } else {
        QpType::Rc
    }
}

/// `rdma_reject`: REJ (consumer defined, 28) with up to 148 bytes of private data, or, on a
/// UD ID, a refused service resolution.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: as the program calls it.
    unsafe {
        reject(
            id,
            private_data,
            private_data_len,
            RejReason::CONSUMER_DEFINED,
        )
    }
}

/// Answers the request `id` holds with a REJ for `reason` (a refused service resolution on a
/// UD ID, whatever the reason, as the kernel's `rdma_reject` sends).
///
/// # Safety
///
/// `id` is an ID the program holds; `private_data` is null or `private_data_len` readable
/// bytes.
pub(super) unsafe fn reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
    reason: RejReason,
) -> c_int {
    with_id(id, |this| {
        let request = match std::mem::replace(&mut *this.stage(), Stage::Ended) {
            Stage::Requested(request) => request,
            other => {
                *this.stage() = other;
                return Err(libc::EINVAL);
            }
        };
        let data = if private_data.is_null() {
            Vec::new()
        } else {
            // SAFETY: the program passes `private_data_len` readable bytes.
            unsafe {
                std::slice::from_raw_parts(private_data.cast::<u8>(), private_data_len.into())
            }
            .to_vec()
        };
        let rejected = match request {
            Request::Rc(request) => request.reject_with(reason, &data),
            Request::Ud(request) => request.reject(),
        };
        rejected.map(|()| 0).map_err(|e| errno_of(&e))
    })
}

/// `rdma_disconnect`: the QP goes to ERROR and the DREQ goes out; `DISCONNECTED` follows
/// when the peer answers (or the CM gives up).
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |this| {
        let conn = match &*this.stage() {
            Stage::Connected(conn) => conn.clone(),
            Stage::Ended => return Ok(Outcome::Now(0)),
            _ => return Err(libc::EINVAL),
        };
        if let Some(qp) = this.qp() {
            let _ = qp.qp.modify(&error_state());
        }
        // The DREQ is queued before this returns, so that the program's next calls (destroy,
        // exit) come after it; the ID's watcher reports the end.
        conn.disconnect().map_err(|e| errno_of(&e))?;
        Ok(this.finish(RDMA_CM_EVENT_DISCONNECTED))
    })
}

/// `rdma_create_qp`: a QP on the ID's device (on `pd`, or a PD of librdmacm's own), moved as
/// librdmacm moves it: INIT for RC and UC, which the connection then takes to RTS; RTS with
/// RDMA-CM's Q_Key for UD.
///
/// As librdmacm (cma.c `rdma_create_qp_ex`): a CQ the attributes lack is the ID's, made now
/// if the ID has none, and only those the ID names are librdmacm's, which `rdma_destroy_qp`
/// destroys; a CQ the program passes stays the program's. `EINVAL` for an ID that has a QP
/// already, a PD of another context than the ID's, or a CQ other than the one the ID has.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the program's ID and attributes, forwarded.
    unsafe { create_qp_on(id, pd, attr, false) }
}

/// `rdma_create_qp`'s work, the QP with the `ibv_wr_*` interface if `extended`.
///
/// # Safety
///
/// As `rdma_create_qp`'s arguments.
unsafe fn create_qp_on(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    extended: bool,
) -> c_int {
    with_id(id, |this| {
        if this.ibv.verbs.is_null() || attr.is_null() || !this.ibv.qp.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the ID's context is one of librdmacm's, open for the process's life.
        let context = unsafe { Context::from_ibv(this.ibv.verbs) }.ok_or(libc::EINVAL)?;
        // The ID's PD when none is given, as librdmacm (`attr_ex.pd = pd ? pd : id->pd`).
        let pd = if pd.is_null() && !this.ibv.pd.is_null() {
            this.ibv.pd
        } else if pd.is_null() {
            context.default_pd()?
        } else {
            // SAFETY: a PD the program allocated and has not freed.
            let owner = unsafe { crate::memory::Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
            if owner.ibv.context != this.ibv.verbs {
                return Err(crate::report(
                    "rdma_create_qp",
                    libc::EINVAL,
                    "the PD is of another context than the ID's (id->verbs)",
                ));
            }
            pd
        };
        // SAFETY: the program's attributes, checked above.
        let attr = unsafe { &mut *attr };
        let clashes = |given: *mut ibv_cq, ids: *mut ibv_cq| {
            !given.is_null() && !ids.is_null() && given != ids
        };
        if clashes(attr.send_cq, this.ibv.send_cq) || clashes(attr.recv_cq, this.ibv.recv_cq) {
            return Err(libc::EINVAL);
        }
        this.make_cqs(context, attr)?;
        // The SRQ `rdma_create_srq` made on the ID, unless the attributes name one.
        if attr.srq.is_null() {
            attr.srq = this.ibv.srq;
        }
        // SAFETY: forwarded as the program gave them, with a live PD and CQs.
        let qp = unsafe { crate::qp::create(pd, attr, extended) };
        if qp.is_null() {
            let errno = crate::cm::last_errno();
            this.destroy_cqs();
            return Err(errno);
        }
        // SAFETY: `qp` was just created.
        let made = unsafe { Qp::from_ibv(qp) }.expect("just created");
        let ready = if this.ibv.ps == RDMA_PS_UDP {
            ready_datagram(&made.qp)
        } else {
            made.qp
                .init(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        };
        if let Err(e) = ready {
            // SAFETY: `qp` is ours to destroy again.
            unsafe { crate::qp::ibv_destroy_qp(qp) };
            this.destroy_cqs();
            return Err(errno_of(&e));
        }
        this.ibv.qp = qp;
        *this.shared.qp.lock().unwrap_or_else(|p| p.into_inner()) = Some(MadeQp {
            qpn: made.qp.qpn(),
            qp: qp as usize,
            context: this.ibv.verbs as usize,
        });
        this.ibv.pd = pd;
        this.ibv.qp_type = attr.qp_type;
        Ok(0)
    })
}

/// Takes a UD QP to RTS with RDMA-CM's Q_Key, as librdmacm readies its UD QPs.
fn ready_datagram(qp: &QueuePair) -> softroce::verbs::Result<()> {
    super::link::ud_steps()
        .iter()
        .try_for_each(|step| qp.modify(step))
}

/// `rdma_create_qp_ex`: as `rdma_create_qp`, with the extended attributes' PD, and the
/// `ibv_wr_*` interface if they name `send_ops_flags` (`ibv_qp_to_qp_ex`).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's attributes, or null.
        let Some(ex) = (unsafe { attr.as_mut() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let extended = match crate::qp_ex::send_ops(ex, "rdma_create_qp_ex") {
            Ok(ops) => ops.is_some(),
            Err(errno) => {
                set_errno(errno);
                return -1;
            }
        };
        let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            ex.pd
        } else {
            ptr::null_mut()
        };
        let mut plain = crate::qp_ex::plain(ex);
        // SAFETY: forwarded with the same meaning.
        let made = unsafe { create_qp_on(id, pd, &mut plain, extended) };
        ex.cap = plain.cap;
        made
    })
}

/// `rdma_destroy_qp`: the ID's QP, and the CQs librdmacm made for it (those the ID names).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    with_id(id, |this| {
        let qp = std::mem::replace(&mut this.ibv.qp, ptr::null_mut());
        *this.shared.qp.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if !qp.is_null() {
            // SAFETY: the QP `rdma_create_qp` made, destroyed once.
            unsafe { crate::qp::ibv_destroy_qp(qp) };
        }
        this.destroy_cqs();
        this.settle_pd();
        Ok(0)
    });
}

/// Keeps a synchronous listener's QP attributes for the IDs of its requests
/// (`rdma_create_ep`).
///
/// # Safety
///
/// `id` is a live ID; `pd` is null or a live PD.
pub(crate) unsafe fn remember_qp_attr(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: &ibv_qp_init_attr,
) {
    // SAFETY: per the contract.
    if let Some(this) = unsafe { Id::from_ibv(id) } {
        this.qp_attr = Some((pd, *attr));
    }
}

impl Id {
    /// Gives the attributes the ID's CQs where they name none, making those the ID lacks (each
    /// with a completion channel), as librdmacm does for `rdma_create_qp` (`ucma_create_cqs`):
    /// the ID names only the CQs made here, which [`destroy_cqs`](Self::destroy_cqs) destroys.
    fn make_cqs(&mut self, context: &Context, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
        let ctx = context.ibv();
        // The ID is each CQ's context, as librdmacm makes it: `rdma_get_send_comp` and
        // `rdma_get_recv_comp` (rdma_verbs.h) assert that the event's context is the ID.
        let id = ptr::addr_of_mut!(self.ibv).cast::<c_void>();
        for send in [true, false] {
            let (given, depth) = if send {
                (attr.send_cq, attr.cap.max_send_wr)
            } else {
                (attr.recv_cq, attr.cap.max_recv_wr)
            };
            let (ids, ids_channel) = if send {
                (&mut self.ibv.send_cq, &mut self.ibv.send_cq_channel)
            } else {
                (&mut self.ibv.recv_cq, &mut self.ibv.recv_cq_channel)
            };
            if !given.is_null() {
                continue;
            }
            if ids.is_null() {
                // SAFETY: the context is open.
                let channel = unsafe { crate::comp_channel::ibv_create_comp_channel(ctx) };
                // SAFETY: as above, with the channel just made (or null).
                let cq =
                    unsafe { crate::cq::ibv_create_cq(ctx, depth.max(1) as c_int, id, channel, 0) };
                (*ids, *ids_channel) = (cq, channel);
                if channel.is_null() || cq.is_null() {
                    self.destroy_cqs();
                    return Err(libc::ENOMEM);
                }
            }
            if send {
                attr.send_cq = self.ibv.send_cq;
            } else {
                attr.recv_cq = self.ibv.recv_cq;
            }
        }
        Ok(())
    }

    /// Names in `id->pd` a PD that lives while the ID names it: its QP's, else its SRQ's (each
    /// keeps its PD from being deallocated), else its device's default PD, which lives with the
    /// context. librdmacm leaves a destroyed QP's PD there, which the program may free after;
    /// `rdma_create_qp` and `rdma_create_srq` take `id->pd` when given none, and must never
    /// take a freed one.
    pub(super) fn settle_pd(&mut self) {
        // SAFETY: the ID's QP and SRQ, made by `rdma_create_qp` and `rdma_create_srq`, are
        // live while it names them.
        let owned = unsafe {
            (self.ibv.qp.as_ref().map(|qp| qp.pd))
                .or_else(|| self.ibv.srq.as_ref().map(|srq| srq.pd))
        };
        // SAFETY: the ID's context is one of librdmacm's, open for the process's life.
        let default = || {
            unsafe { Context::from_ibv(self.ibv.verbs) }?
                .default_pd()
                .ok()
        };
        self.ibv.pd = owned.or_else(default).unwrap_or(ptr::null_mut());
    }

    /// Destroys the CQs and channels the ID names: those [`make_cqs`](Self::make_cqs) made.
    /// One a QP of the program's still uses (`EBUSY`) stays the ID's, with its channel.
    pub(super) fn destroy_cqs(&mut self) {
        let cqs = [
            (&mut self.ibv.send_cq, &mut self.ibv.send_cq_channel),
            (&mut self.ibv.recv_cq, &mut self.ibv.recv_cq_channel),
        ];
        for (cq, channel) in cqs {
            // SAFETY: a CQ `make_cqs` made, destroyed once (if it goes), before its channel.
            if !cq.is_null() && unsafe { crate::cq::ibv_destroy_cq(*cq) } != 0 {
                continue;
            }
            *cq = ptr::null_mut();
            let channel = std::mem::take(channel);
            if !channel.is_null() {
                // SAFETY: a channel `make_cqs` made, destroyed once.
                unsafe { crate::comp_channel::ibv_destroy_comp_channel(channel) };
            }
        }
    }
}

/// `rdma_migrate_id`: the ID's events go to `channel` from now on, those not yet read
/// included (and, for a listener, its unread requests' IDs' events).
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    with_id(id, |this| {
        // SAFETY: a channel the program created and has not destroyed.
        let channel_ref = unsafe { Channel::from_ibv(channel) }.ok_or(libc::EINVAL)?;
        // The events not yet taken go along, in order, before any posted from now on (posts
        // wait on this lock): the old channel, which a destroy of the ID does not look at,
        // keeps none that would name the ID once it is freed.
        let mut events = this.shared.events.lock().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(&mut *events, channel_ref.events.clone());
        this.shared.channel.store(channel, Ordering::Relaxed);
        let me = this.shared.id();
        for event in old.take_all_of(me) {
            // A request not yet read moves with its ID, which no one else has yet: its
            // events go where the listener's now do.
            if ptr::eq(event.ibv.listen_id, me) {
                // SAFETY: a queued request's ID is alive, and the program does not have it.
                if let Some(child) = unsafe { Id::from_ibv(event.ibv.id) } {
                    *child
                        .shared
                        .events
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = channel_ref.events.clone();
                    child.shared.channel.store(channel, Ordering::Relaxed);
                    child.ibv.channel = channel;
                }
            }
            events.post(event);
        }
        drop(events);
        this.ibv.channel = channel;
        if this.own.take().is_some() {
            // No longer synchronous: its last call's event goes, as librdmacm acks it.
            // SAFETY: an event `keep_sync_event` kept, and no longer the ID's.
            unsafe { free_sync_event(std::mem::replace(&mut this.ibv.event, ptr::null_mut())) };
        }
        Ok(0)
    })
}

/// `rdma_set_option`: accepted and kept to no effect (the TOS of RoCE v2 over a UDP socket is
/// the device's; address reuse and IPv6-only do not apply to softroce's CM).
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: libc::size_t,
) -> c_int {
    with_id(id, |_| Ok(0))
}

/// `rdma_get_src_port`, in network byte order.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the program passes an ID it holds; the field is one of it.
    guard(0, || unsafe {
        port_of(id, |id| ptr::addr_of!((*id).route.addr.src_storage))
    })
}

/// `rdma_get_dst_port`, in network byte order.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the program passes an ID it holds; the field is one of it.
    guard(0, || unsafe {
        port_of(id, |id| ptr::addr_of!((*id).route.addr.dst_storage))
    })
}

/// The port of the address that `field` finds in the ID at `id`, in network byte order; 0
/// for a null ID. Read from the field alone, not through the whole ID: these two calls change
/// nothing, and a program may make them while another of its threads is in a call on the ID.
///
/// # Safety
///
/// A non-null `id` is a live ID, and `field` gives the address of one of its fields.
unsafe fn port_of(
    id: *mut rdma_cm_id,
    field: impl FnOnce(*mut rdma_cm_id) -> *const libc::sockaddr_storage,
) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: per the contract; the field is plain bytes, copied out rather than borrowed.
    // A call on another thread that sets it meanwhile (`rdma_bind_addr`) races with this read
    // as it would in librdmacm.
    let addr = unsafe { ptr::read(field(id)) };
    ip_of(&addr).port().to_be()
}

/// `rdma_notify`: softroce's CM takes a QP's first packet as the RTU itself.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    with_id(id, |_| Ok(0))
}

/// `rdma_establish`: the active side of an ID without a QP, its QP in RTS, sends the RTU
/// after CONNECT_RESPONSE; the passive side's ESTABLISHED follows. No event comes here.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |this| {
        let link = match &*this.stage() {
            Stage::Connected(Link::Manual(conn)) => conn.clone(),
            _ => return Err(libc::EINVAL),
        };
        link.establish().map(|()| 0).map_err(|e| errno_of(&e))
    })
}

/// `rdma_init_qp_attr`: the attributes and mask that take a QP to `attr->qp_state` (INIT,
/// RTR or RTS) as the ID's connection negotiated, for a program that moves its QP itself:
/// INIT once the ID has an address; RTR and RTS once a request came (the passive side, before
/// `rdma_accept`) or the REP did (the active side, after CONNECT_RESPONSE). `EINVAL` before.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program's mask, or null.
        let Some(mask) = (unsafe { mask.as_mut() }) else {
            return Err(libc::EINVAL);
        };
        // SAFETY: the program's attribute block (of any header's), or null.
        let written: Option<Result<c_int, c_int>> = unsafe {
            crate::qp::with_qp_attr(attr, |out| {
                let state = crate::qp::state_of(out.qp_state).ok_or(libc::EINVAL)?;
                let step = super::link::qp_attr(&this.stage(), &this.ibv, state);
                Ok(crate::qp::write_qp_attr(&step.ok_or(libc::EINVAL)?, out))
            })
        };
        *mask = written.ok_or(libc::EINVAL)??;
        Ok(0)
    })
}

/// `rdma_join_multicast`: softroce has no multicast.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    guard(-1, || {
        set_errno(unsupported("rdma_join_multicast"));
        -1
    })
}

/// `rdma_join_multicast_ex`: softroce has no multicast.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    guard(-1, || {
        set_errno(unsupported("rdma_join_multicast_ex"));
        -1
    })
}

/// `rdma_leave_multicast`: softroce has no multicast.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        set_errno(unsupported("rdma_leave_multicast"));
        -1
    })
}

/// `rdma_get_devices`: librdmacm's context of every device, opened if need be, in a list
/// `rdma_free_devices` frees; the contexts stay open for the process's life.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(ptr::null_mut(), || {
        let contexts: Vec<*mut ibv_context> = devices::all()
            .iter()
            .filter_map(|entry| devices::cm_context(entry).ok())
            .collect();
        let size = (contexts.len() + 1) * std::mem::size_of::<*mut ibv_context>();
        // SAFETY: malloc takes a size; null is handled.
        let list = unsafe { libc::malloc(size) }.cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, &context) in contexts.iter().chain([&ptr::null_mut()]).enumerate() {
            // SAFETY: `list` holds `contexts.len() + 1` pointers.
            unsafe { list.add(i).write(context) };
        }
        if !num_devices.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *num_devices = contexts.len() as c_int };
        }
        list
    })
}

/// `rdma_free_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: `list` came from `rdma_get_devices`'s malloc, or is null, which free ignores.
    guard((), || unsafe { libc::free(list.cast()) })
}
