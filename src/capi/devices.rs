//! Devices and contexts: the device list, `ibv_open_device` and `ibv_close_device`, what a
//! device and its port say of themselves (`ibv_query_device`, `ibv_query_port`, the GID table),
//! and the asynchronous events of a context.
//!
//! A device is one address of the process ([`Addresses`]): opening it opens a softroce
//! [`Device`] on `address:4791`, with its engine on a thread of its own unless
//! `SOFTROCE_PROGRESS` says otherwise, so that a program that only waits on a completion
//! channel still answers its peers' READs, WRITEs and atomics.
//!
//! Its GID table holds one entry, index 0: the address as a RoCE v2 GID (IPv4-mapped for an
//! IPv4 address). softroce speaks RoCE v2 only, so it lists no RoCE v1 GIDs, and no link-local
//! address it does not listen on; rxe's habitual `-g 1` or `-g 3` gets `EINVAL`, with a line
//! saying which index to use.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::mem::offset_of;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use libc::{c_char, c_int, c_uint, c_void, size_t};
use softroce::transport::{AsyncEvent, MAX_RD_ATOMIC};
use softroce::verbs::{BackendKind, Device, DeviceConfig};

use crate::abi::*;
use crate::blocking::{wait_in_slices, Kept, Next};
use crate::config::{self, Addresses};
use crate::fork::{self, Born};
use crate::held::HeldEvents;
use crate::{cq, guard, memory, post, qp, say, set_errno};

/// One device of the process, as `ibv_get_device_list` hands it out: it lives as long as the
/// process, so a program may keep the pointer past `ibv_free_device_list`.
#[repr(C)]
pub(crate) struct DeviceEntry {
    /// What the program sees; first, so that the program's pointer is this entry's.
    pub ibv: ibv_device,
    pub index: usize,
    pub addr: IpAddr,
    pub guid: u64,
    /// The device while any context has it open.
    opened: Mutex<Option<Opened>>,
    /// What else must hear that the device failed: librdmacm's IDs on it.
    watchers: Mutex<Vec<Weak<dyn FailureWatcher>>>,
}

/// Something of the program's on a device, besides its contexts, that must hear that the
/// device failed (an RDMA-CM ID, which then gets `RDMA_CM_EVENT_DEVICE_REMOVAL`).
pub(crate) trait FailureWatcher: Send + Sync {
    /// The device failed.
    fn device_failed(self: Arc<Self>);
}

/// A device opened by one context or more (the program's own, and librdmacm's, which share
/// it as they would share a NIC): one softroce device on the address, and one thread handing
/// its asynchronous events to every context.
struct Opened {
    device: Device,
    /// Each open context's event queue.
    contexts: Arc<Mutex<Vec<Arc<PendingEvents>>>>,
    /// The process generation that opened it ([`fork`]).
    born: Born,
    /// Whether its failure was told (see [`DeviceEntry::tell_failure`]).
    failure_told: Arc<AtomicBool>,
}

// SAFETY: the entry is written once, before any thread sees it, and only read after: its raw
// pointers (`_ops`) are null.
unsafe impl Sync for DeviceEntry {}
// SAFETY: as for `Sync`.
unsafe impl Send for DeviceEntry {}

/// The process's devices, made at the first `ibv_get_device_list`.
fn devices() -> &'static Result<Vec<&'static DeviceEntry>, String> {
    static DEVICES: OnceLock<Result<Vec<&'static DeviceEntry>, String>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let addresses = Addresses::from_env()?;
        Ok(addresses
            .0
            .into_iter()
            .enumerate()
            .map(|(index, addr)| &*Box::leak(Box::new(DeviceEntry::new(index, addr))))
            .collect())
    })
}

/// Copies `text` into a C string field, cut to fit with its terminating zero.
fn fill(field: &mut [c_char], text: &str) {
    let bytes = text.as_bytes();
    let n = bytes.len().min(field.len() - 1);
    for (to, &from) in field.iter_mut().zip(&bytes[..n]) {
        *to = from as c_char;
    }
    field[n] = 0;
}

/// The node GUID of the device at `addr`: an EUI-64 of a locally administered MAC made of the
/// address, as rxe derives its GUID from the interface's MAC.
fn guid_of(addr: IpAddr) -> u64 {
    let low = match addr {
        IpAddr::V4(v4) => u32::from(v4) as u64,
        IpAddr::V6(v6) => u128::from(v6) as u64 & 0xffff_ffff,
    };
    // 02:00:<a>:ff:fe:<b>:<c>:<d>
    let a = (low >> 24) & 0xff;
    0x0200_0000_0000_0000 | a << 40 | 0xff_fe00_0000 | (low & 0xff_ffff)
}

impl DeviceEntry {
    fn new(index: usize, addr: IpAddr) -> DeviceEntry {
        let mut ibv = ibv_device {
            _ops: _ibv_device_ops {
                _dummy1: ptr::null_mut(),
                _dummy2: ptr::null_mut(),
            },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        let name = format!("softroce{index}");
        fill(&mut ibv.name, &name);
        fill(&mut ibv.dev_name, &format!("uverbs{index}"));
        // No sysfs: the paths name nothing, and `ibv_read_sysfs_file` reads nothing there.
        fill(&mut ibv.dev_path, &format!("/softroce/{name}"));
        fill(&mut ibv.ibdev_path, &format!("/softroce/{name}"));
        DeviceEntry {
            ibv,
            index,
            addr,
            guid: guid_of(addr),
            opened: Mutex::new(None),
            watchers: Mutex::new(Vec::new()),
        }
    }

    /// The device, opened now if no context has it open, for a context whose events go to
    /// `events`.
    fn open(&'static self, events: &Arc<PendingEvents>) -> Result<Device, c_int> {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if opened.as_ref().is_some_and(|o| !o.born.current()) {
            // A parent's, inherited by this child with no thread of its own: never touched
            // again, and not dropped, which would call on its engine. Nor do the parent's IDs
            // hear of this child's device.
            std::mem::forget(opened.take());
            self.watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        if opened.is_none() {
            fork::watch();
            let device = self.open_device()?;
            flush_at_exit();
            let shared = Opened {
                device,
                contexts: Arc::new(Mutex::new(Vec::new())),
                born: Born::now(),
                failure_told: Arc::new(AtomicBool::new(false)),
            };
            self.spawn_event_waiter(&shared);
            *opened = Some(shared);
        }
        let shared = opened.as_ref().expect("opened above");
        shared
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(events.clone());
        Ok(shared.device.clone())
    }

    /// A context that had the device open closed: the device closes with the last.
    fn close(&self, events: &Arc<PendingEvents>) {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let last = opened.as_ref().is_some_and(|shared| {
            let mut contexts = shared.contexts.lock().unwrap_or_else(|p| p.into_inner());
            contexts.retain(|c| !Arc::ptr_eq(c, events));
            contexts.is_empty()
        });
        if last {
            if let Some(shared) = opened.take() {
                let _ = shared.device.flush(FLUSH_LIMIT);
            }
        }
    }

    /// Starts the thread that hands each of the device's events to every context that has it
    /// open. It ends when the device stops: closed by its last context, or failed, which it
    /// then tells ([`tell_failure`](Self::tell_failure)) while contexts still have it open.
    fn spawn_event_waiter(&'static self, opened: &Opened) {
        let source = opened.device.events();
        let (contexts, told) = (opened.contexts.clone(), opened.failure_told.clone());
        let spawned = self.spawn_guarded("softroce-events", move || {
            while let Some(event) = source.wait() {
                let contexts = contexts.lock().unwrap_or_else(|p| p.into_inner());
                for context in contexts.iter() {
                    context.push(Raised::Object(event));
                }
            }
            self.tell_failure(&contexts, &told);
        });
        if spawned.is_err() {
            say!("no thread for asynchronous events: none will be reported");
        }
    }

    /// Starts `work` on a thread of the library's for this device, named `name`. A panic there
    /// (a bug in softroce) fails the device ([`Device::fail`]), and the program hears it as
    /// from a failed socket, rather than wait for ever for what the thread would have done.
    pub(crate) fn spawn_guarded(
        &'static self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // The program's handlers run on its own threads (softroce's `engine::waiter`).
                softroce::verbs::hold_signals_off_for_good();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_ok() {
                    return;
                }
                let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
                let Some(shared) = opened.as_ref().filter(|o| o.born.current()) else {
                    return;
                };
                shared.device.fail(std::io::Error::other(LibraryPanicked));
                let (contexts, told) = (shared.contexts.clone(), shared.failure_told.clone());
                drop(opened);
                self.tell_failure(&contexts, &told);
            })
    }

    /// Tells the device's failure, once, if contexts still have it open (a close takes its
    /// context out first, and the last one's close stops the device): each context gets
    /// `IBV_EVENT_DEVICE_FATAL`, and each CM ID on the device `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    fn tell_failure(&self, contexts: &Mutex<Vec<Arc<PendingEvents>>>, told: &AtomicBool) {
        let contexts = contexts.lock().unwrap_or_else(|p| p.into_inner());
        if contexts.is_empty() || told.swap(true, Ordering::AcqRel) {
            return;
        }
        for context in contexts.iter() {
            context.push(Raised::DeviceFatal);
        }
        drop(contexts);
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|p| p.into_inner()));
        for watcher in watchers.iter().filter_map(Weak::upgrade) {
            watcher.device_failed();
        }
    }

    /// Has `watcher` hear of the device's failure ([`FailureWatcher`]), for as long as it
    /// lives.
    pub(crate) fn watch_failure(&self, watcher: Weak<dyn FailureWatcher>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        // Those gone are let go of as the list doubles, so that it stays within twice the
        // live ones at a cost of one look at each per addition.
        if watchers.len() >= 64 && watchers.len().is_power_of_two() {
            watchers.retain(|w| w.strong_count() > 0);
        }
        watchers.push(watcher);
    }

    /// Takes the events `named` picks out of the queue of every context that has the device
    /// open.
    fn forget_events(&self, named: impl Fn(&AsyncEvent) -> bool) {
        let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = opened.as_ref() {
            let contexts = shared.contexts.lock().unwrap_or_else(|p| p.into_inner());
            for context in contexts.iter() {
                context.forget(&named);
            }
        }
    }

    /// The device's one GID: its address as a RoCE v2 GID.
    pub(crate) fn gid(&self) -> ibv_gid {
        let v6 = match self.addr {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        ibv_gid { raw: v6.octets() }
    }

    /// The entry behind a program's device pointer, if it is one of ours.
    fn from_ibv(device: *mut ibv_device) -> Option<&'static DeviceEntry> {
        let list = devices().as_ref().ok()?;
        list.iter()
            .copied()
            .find(|entry| ptr::eq(&entry.ibv, device.cast_const()))
    }
}

/// Why a device stopped when one of the library's own threads panicked (a bug in softroce):
/// the error its calls then fail with wraps this. The panic's message went to standard error.
#[derive(Debug)]
struct LibraryPanicked;

impl std::fmt::Display for LibraryPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "a thread of softroce's C library panicked, a bug in softroce (the panic message \
             went to standard error)",
        )
    }
}

impl std::error::Error for LibraryPanicked {}

/// How long closing a device, or the process's exit, waits for the packets already queued
/// (the ACK of the last message received, a DREQ) to reach the socket: a turn of the engine,
/// unless the socket is full.
const FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// Has the process's exit wait for what its open devices have queued (`FLUSH_LIMIT` each).
/// A device's engine is a thread of the process and dies with it: without this, the DREQ of a
/// program that disconnects and exits at once may never go out (its peer then waits for ever,
/// as rping's server waits for its DISCONNECTED event), where the kernel's would.
fn flush_at_exit() {
    extern "C" fn flush_open_devices() {
        guard((), || {
            for entry in all() {
                // try_lock: a thread of the program that still holds the entry at exit must not
                // hang it.
                // Only this process's own: a child's exit leaves its parent's devices alone.
                let device = match entry.opened.try_lock() {
                    Ok(opened) => opened
                        .as_ref()
                        .filter(|shared| shared.born.current())
                        .map(|shared| shared.device.clone()),
                    Err(_) => None,
                };
                if let Some(device) = device {
                    let _ = device.flush(FLUSH_LIMIT);
                }
            }
        });
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: the handler is a plain function of this library that takes nothing. glibc's
        // `atexit` is linked into the library (libc_nonshared.a) and registers it with the
        // library's `__dso_handle`, so it also runs, and is forgotten, if the library is
        // dlclose()d before the exit: it is never called once the library is gone.
        unsafe { libc::atexit(flush_open_devices) };
    });
}

/// The process's devices; none if `SOFTROCE_ADDR` does not parse.
pub(crate) fn all() -> &'static [&'static DeviceEntry] {
    devices().as_deref().unwrap_or(&[])
}

/// The device an RDMA-CM ID bound to `ip` is on: the device at `ip`; for a wildcard address,
/// or a loopback address no device has, the first device. (The kernel binds a loopback address
/// to its first active device, `cma_bind_loopback`: libfabric's verbs provider binds
/// `localhost` to find a server's device.)
pub(crate) fn entry_for(ip: IpAddr) -> Option<&'static DeviceEntry> {
    let list = all();
    let ip = ip.to_canonical();
    let exact = list.iter().copied().find(|e| e.addr == ip);
    if exact.is_none() && (ip.is_unspecified() || ip.is_loopback()) {
        return list.first().copied();
    }
    exact
}

/// The address of the device a connection to `dst` goes from, without a source address: the
/// first device of `dst`'s family, or the first device.
pub(crate) fn default_for(dst: IpAddr) -> Option<IpAddr> {
    let list = all();
    let same = list
        .iter()
        .find(|e| e.addr.is_ipv4() == dst.to_canonical().is_ipv4());
    same.or(list.first()).map(|e| e.addr)
}

/// librdmacm's context of `entry`'s device: opened at its first use and kept open for the
/// process's life, as rdma-core's librdmacm keeps its contexts.
/// A child after `fork()` gets contexts of its own, its parent's left alone ([`fork`]).
pub(crate) fn cm_context(entry: &'static DeviceEntry) -> Result<*mut ibv_context, c_int> {
    /// Each context by its device's index and the process generation that opened it.
    static CONTEXTS: Mutex<Vec<(usize, Born, usize)>> = Mutex::new(Vec::new());
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    contexts.retain(|&(_, born, _)| born.current());
    let found = contexts.iter().find(|(index, ..)| *index == entry.index);
    if let Some(&(.., context)) = found {
        return Ok(context as *mut ibv_context);
    }
    let context = Box::leak(Context::open(entry)?).ibv();
    contexts.push((entry.index, Born::now(), context as usize));
    Ok(context)
}

/// The GID table's length: one entry.
pub(crate) const GID_TABLE_LEN: c_int = 1;

/// An open device, as `ibv_open_device` hands it out: the program's `ibv_context` is the end of
/// the `verbs_context`, which begins this structure.
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub entry: &'static DeviceEntry,
    pub device: Device,
    /// The descriptor `cmd_fd` names: rdma-core's command channel to the kernel, which
    /// softroce has none of. A program may `fcntl` it; nothing else.
    cmd_fd: OwnedFd,
    /// Its asynchronous events, and the descriptor `async_fd` names.
    events: Arc<PendingEvents>,
    /// What the events name.
    pub objects: Mutex<Objects>,
    /// librdmacm's PD on this context, for QPs created on an ID with no PD of the program's.
    default_pd: OnceLock<usize>,
    /// The process generation that opened it ([`fork`]).
    born: Born,
}

/// The most asynchronous events a context keeps unread. Each names a live object (those of an
/// object destroyed are taken out: [`Context::forget_events`]), so a program reaches this only
/// with as many objects each in trouble and none of it read.
const MAX_PENDING_EVENTS: usize = 16_384;

/// Asynchronous events not yet taken by `ibv_get_async_event`, and the descriptor (the
/// context's `async_fd`, owned here) that is readable while any wait, or once the context is
/// closed.
///
/// A thread waiting in `ibv_get_async_event` holds this, not the context: a program may close
/// the context while a thread of its waits for events (one that watches a device for errors,
/// and stops when the wait fails), and the waiter must then learn it (`EIO`, as a blocked
/// read of rdma-core's `async_fd` does) without reading the freed context.
struct PendingEvents {
    queue: Mutex<Pending>,
    fd: OwnedFd,
}

struct Pending {
    events: VecDeque<Raised>,
    /// The context was closed: waiters return `EIO`.
    closed: bool,
}

/// An event a context's queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Raised {
    /// One the device raised about one of its objects.
    Object(AsyncEvent),
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`): the last it says.
    DeviceFatal,
}

/// What [`PendingEvents::take`] found.
enum Taken<T> {
    /// An event, as the caller's `each` made it.
    Event(T),
    /// The device failed.
    DeviceFatal,
    None,
    Closed,
}

impl PendingEvents {
    fn new() -> Result<Arc<PendingEvents>, c_int> {
        Ok(Arc::new(PendingEvents {
            queue: Mutex::new(Pending {
                events: VecDeque::new(),
                closed: false,
            }),
            fd: eventfd().map_err(|_| libc::EMFILE)?,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the descriptor readable (adds one to the eventfd's count).
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: our own eventfd, open while `self` is; the buffer is 8 bytes.
        unsafe { libc::write(self.fd.as_raw_fd(), ptr::addr_of!(one).cast(), 8) };
    }

    /// Queues `event` and makes the descriptor readable. A queue that holds
    /// [`MAX_PENDING_EVENTS`] already drops it: no program reads that far behind, and
    /// librdmacm's contexts, which a program may never read, must not grow for ever.
    fn push(&self, event: Raised) {
        let mut pending = self.lock();
        if pending.closed {
            return;
        }
        if pending.events.len() >= MAX_PENDING_EVENTS && event != Raised::DeviceFatal {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                say!(
                    "{MAX_PENDING_EVENTS} asynchronous events wait unread on a context: later \
                     ones are dropped (read them with ibv_get_async_event)"
                );
            }
            return;
        }
        pending.events.push_back(event);
        self.signal();
    }

    /// Takes out the events that `named` picks: those of an object being destroyed, which no
    /// one may read after it (they would name it, or a later object with its number). The
    /// descriptor stays readable exactly while events are left.
    fn forget(&self, named: &impl Fn(&AsyncEvent) -> bool) {
        let mut pending = self.lock();
        let had = !pending.events.is_empty();
        pending
            .events
            .retain(|event| !matches!(event, Raised::Object(e) if named(e)));
        if had && pending.events.is_empty() {
            let mut count = 0u64;
            // SAFETY: our own eventfd, 8 bytes; its count is not zero, as events waited.
            unsafe { libc::read(self.fd.as_raw_fd(), ptr::addr_of_mut!(count).cast(), 8) };
        }
    }

    /// The context is closed: every waiter wakes to return `EIO`.
    fn close(&self) {
        let mut pending = self.lock();
        pending.closed = true;
        pending.events.clear();
        self.signal();
    }

    /// The oldest event, through `each` (under the queue's lock, so before a close can
    /// return), leaving the descriptor readable only while more wait. The count is not zero
    /// exactly while events wait (both change under the queue's lock), so the read after one
    /// was taken never blocks.
    fn take<T>(&self, each: impl FnOnce(AsyncEvent) -> T) -> Taken<T> {
        let mut pending = self.lock();
        if pending.closed {
            return Taken::Closed;
        }
        let Some(next) = pending.events.pop_front() else {
            return Taken::None;
        };
        let mut count = 0u64;
        // SAFETY: our own eventfd, 8 bytes; a read takes its whole count, not zero here.
        unsafe { libc::read(self.fd.as_raw_fd(), ptr::addr_of_mut!(count).cast(), 8) };
        if !pending.events.is_empty() {
            self.signal();
        }
        match next {
            Raised::Object(event) => Taken::Event(each(event)),
            Raised::DeviceFatal => Taken::DeviceFatal,
        }
    }
}

/// The objects of a context that asynchronous events name, by the program's pointers.
#[derive(Default)]
pub(crate) struct Objects {
    /// QPs by number.
    pub qps: Vec<(softroce::wire::Qpn, usize)>,
    /// CQs, for an overrun's event.
    pub cqs: Vec<usize>,
    /// SRQs, for a limit's event.
    pub srqs: Vec<usize>,
}

/// `ibv_context_ops` as every context has it.
const OPS: ibv_context_ops = ibv_context_ops {
    _compat_query_device: None,
    _compat_query_port: None,
    _compat_alloc_pd: None,
    _compat_dealloc_pd: None,
    _compat_reg_mr: None,
    _compat_rereg_mr: None,
    _compat_dereg_mr: None,
    alloc_mw: Some(memory::ibv_alloc_mw),
    bind_mw: Some(memory::ibv_bind_mw),
    dealloc_mw: Some(memory::ibv_dealloc_mw),
    _compat_create_cq: None,
    poll_cq: Some(cq::poll_cq),
    req_notify_cq: Some(cq::req_notify_cq),
    _compat_cq_event: None,
    _compat_resize_cq: None,
    _compat_destroy_cq: None,
    _compat_create_srq: None,
    _compat_modify_srq: None,
    _compat_query_srq: None,
    _compat_destroy_srq: None,
    post_srq_recv: Some(post::post_srq_recv),
    _compat_create_qp: None,
    _compat_query_qp: None,
    _compat_modify_qp: None,
    _compat_destroy_qp: None,
    post_send: Some(post::post_send),
    post_recv: Some(post::post_recv),
    _compat_create_ah: None,
    _compat_destroy_ah: None,
    _compat_attach_mcast: None,
    _compat_detach_mcast: None,
    _compat_async_event: None,
};

/// An eventfd, closed on exec; blocking, as a program expects `async_fd` to be until it makes
/// it otherwise.
fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a descriptor we now own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Context {
    /// The context behind a program's `ibv_context` pointer; `None` for null, or for a parent's
    /// context in a child after `fork()` ([`fork`]).
    ///
    /// # Safety
    ///
    /// A non-null `ctx` must be one `ibv_open_device` returned and `ibv_close_device` has not
    /// closed.
    pub(crate) unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
        // SAFETY: per the contract, the pointer is to a live `Context`.
        unsafe { Self::raw_from_ibv(ctx).as_ref() }.filter(|c| c.born.ours())
    }

    /// The pointer to the context behind a program's `ibv_context` pointer (null for null):
    /// what `ibv_close_device` frees through.
    ///
    /// # Safety
    ///
    /// As for [`from_ibv`](Self::from_ibv).
    unsafe fn raw_from_ibv(ctx: *mut ibv_context) -> *mut Context {
        if ctx.is_null() {
            return ptr::null_mut();
        }
        let at = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` is the `context` field of the `vctx` of a live
        // `Context`, so stepping back by the field's offset stays inside that `Context`.
        unsafe { ctx.byte_sub(at).cast::<Context>() }
    }

    /// The program's pointer to this context.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        ptr::addr_of!(self.vctx.context).cast_mut()
    }

    fn open(entry: &'static DeviceEntry) -> Result<Box<Context>, c_int> {
        let cmd_fd = eventfd().map_err(|_| libc::EMFILE)?;
        let events = PendingEvents::new()?;
        let device = entry.open(&events)?;
        let mut context = Box::new(Context {
            vctx: verbs_context::new(),
            entry,
            device,
            cmd_fd,
            events,
            objects: Mutex::new(Objects::default()),
            default_pd: OnceLock::new(),
            born: Born::now(),
        });
        let ctx = &mut context.vctx.context;
        ctx.device = ptr::addr_of!(entry.ibv).cast_mut();
        ctx.cmd_fd = context.cmd_fd.as_raw_fd();
        ctx.async_fd = context.events.fd.as_raw_fd();
        Ok(context)
    }

    /// The event the program sees for `event`: its type and the program's pointer to what it
    /// names; `None` if that was destroyed since.
    fn async_event(&self, event: AsyncEvent) -> Option<ibv_async_event> {
        let objects = self.objects.lock().unwrap_or_else(|p| p.into_inner());
        let qp = |qpn| {
            objects
                .qps
                .iter()
                .find(|(q, _)| *q == qpn)
                .map(|&(_, at)| at)
        };
        let (element, event_type) = match event {
            AsyncEvent::QpFatal { qpn } => (qp(qpn)?, IBV_EVENT_QP_FATAL),
            AsyncEvent::QpAccessError { qpn } => (qp(qpn)?, IBV_EVENT_QP_ACCESS_ERR),
            AsyncEvent::CqOverrun { cq, .. } => (cq::find(&objects.cqs, cq)?, IBV_EVENT_CQ_ERR),
            AsyncEvent::QpLastWqeReached { qpn } => (qp(qpn)?, IBV_EVENT_QP_LAST_WQE_REACHED),
            AsyncEvent::SrqLimitReached { srq } => (
                qp::find_srq(&objects.srqs, srq)?,
                IBV_EVENT_SRQ_LIMIT_REACHED,
            ),
            // A kind the crate may gain that this library does not report yet.
            _ => return None,
        };
        let element = element as *mut c_void;
        if let Some(named) = Named::of(event_type) {
            // SAFETY: found among the live objects of the kind the event names, under the lock
            // their destroys take to put them out of reach: not freed meanwhile, and after
            // this, not before the event's acknowledgement.
            unsafe { named.held(element) }.hand_out();
        }
        Some(ibv_async_event {
            element,
            event_type,
        })
    }

    /// Forgets the events of an object being destroyed, which `named` picks, in every context
    /// of the device (each has them all): no one reads them after.
    pub(crate) fn forget_events(&self, named: impl Fn(&AsyncEvent) -> bool) {
        self.entry.forget_events(named);
    }

    /// librdmacm's PD on this context, allocated at its first use and kept.
    pub(crate) fn default_pd(&self) -> Result<*mut ibv_pd, c_int> {
        if let Some(&pd) = self.default_pd.get() {
            return Ok(pd as *mut ibv_pd);
        }
        // SAFETY: this context is open.
        let pd = unsafe { crate::memory::ibv_alloc_pd(self.ibv()) };
        if pd.is_null() {
            return Err(libc::ENOMEM);
        }
        let kept = *self.default_pd.get_or_init(|| pd as usize);
        if kept != pd as usize {
            // Another thread's won: let this one go.
            // SAFETY: `pd` was just allocated and is ours.
            unsafe { crate::memory::ibv_dealloc_pd(pd) };
        }
        Ok(kept as *mut ibv_pd)
    }

    /// The GID at `index` of port `port`, or why not.
    pub(crate) fn gid(&self, port: u8, index: c_int) -> Result<ibv_gid, c_int> {
        if port != 1 {
            return Err(libc::EINVAL);
        }
        if index != 0 {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                say!(
                    "GID index {index}: {} has one GID, index 0 (its address {} as a RoCE v2 GID)",
                    self.entry.name(),
                    self.entry.addr
                );
            }
            return Err(libc::EINVAL);
        }
        Ok(self.entry.gid())
    }
}

impl DeviceEntry {
    /// Opens the softroce device on the entry's address, or says on standard error why not.
    fn open_device(&self) -> Result<Device, c_int> {
        let mut config = DeviceConfig::udp(self.addr);
        let settings = config::progress().and_then(|p| {
            Ok((
                p,
                config::port_mtu()?,
                config::congestion()?,
                config::busy_poll()?,
                config::trains_per_qp()?,
            ))
        });
        let trains_per_qp;
        (
            config.progress,
            config.port_mtu,
            config.congestion,
            config.busy_poll,
            trains_per_qp,
        ) = settings.map_err(|why| {
            say!("{why}");
            libc::EINVAL
        })?;
        config.backend = BackendKind::Udp {
            segmentation: true,
            trains_per_qp,
        };
        // librdmacm's connections send no probes (kernel rxe's and NICs' QPs send none).
        config.keepalive = None;
        Device::open(config).map_err(|e| {
            let name = self.name();
            match &e {
                softroce::verbs::Error::Io(io) if io.kind() == std::io::ErrorKind::AddrInUse => {
                    say!("{name}: {e}; for example {}=127.0.0.2 (softroce run --addr 127.0.0.2 -- ...)",
                        config::ADDR_VAR
                    );
                    libc::EADDRINUSE
                }
                softroce::verbs::Error::Io(io)
                    if io.kind() == std::io::ErrorKind::AddrNotAvailable =>
                {
                    say!("{name}: {} is not an address of this host: set {} to one it has",
                        self.addr,
                        config::ADDR_VAR
                    );
                    libc::EADDRNOTAVAIL
                }
                _ => {
                    say!("{name}: cannot open the device: {e}");
                    libc::EIO
                }
            }
        })
    }

    /// The device's name, as the program sees it.
    pub(crate) fn name(&self) -> &str {
        // SAFETY: `name` was filled by `fill`, which always leaves a terminating zero.
        let name = unsafe { CStr::from_ptr(self.ibv.name.as_ptr()) };
        name.to_str().unwrap_or("softroce")
    }
}

impl verbs_context {
    /// The extended table softroce fills: `query_port`, `create_cq_ex`, `create_qp_ex`, and
    /// its size.
    fn new() -> verbs_context {
        verbs_context {
            query_port: Some(query_port_ex),
            advise_mr: None,
            alloc_null_mr: None,
            read_counters: None,
            attach_counters_point_flow: None,
            create_counters: None,
            destroy_counters: None,
            reg_dm_mr: None,
            alloc_dm: None,
            free_dm: None,
            modify_flow_action_esp: None,
            destroy_flow_action: None,
            create_flow_action_esp: None,
            modify_qp_rate_limit: None,
            alloc_parent_domain: None,
            dealloc_td: None,
            alloc_td: None,
            modify_cq: None,
            post_srq_ops: None,
            destroy_rwq_ind_table: None,
            create_rwq_ind_table: None,
            destroy_wq: None,
            modify_wq: None,
            create_wq: None,
            query_rt_values: None,
            create_cq_ex: Some(crate::cq_ex::create_cq_ex),
            priv_: ptr::null_mut(),
            query_device_ex: None,
            ibv_destroy_flow: None,
            abi_placeholder2: None,
            ibv_create_flow: None,
            abi_placeholder1: None,
            open_qp: None,
            create_qp_ex: Some(crate::qp_ex::create_qp_ex),
            get_srq_num: None,
            create_srq_ex: None,
            open_xrcd: None,
            close_xrcd: None,
            _abi_placeholder3: 0,
            sz: std::mem::size_of::<verbs_context>(),
            context: ibv_context {
                device: ptr::null_mut(),
                ops: OPS,
                cmd_fd: -1,
                async_fd: -1,
                num_comp_vectors: 1,
                // SAFETY: an all-zero pthread mutex is PTHREAD_MUTEX_INITIALIZER on glibc.
                mutex: unsafe { std::mem::zeroed() },
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        }
    }
}

/// `ibv_get_device_list`: every device of the process, null-terminated, in memory from
/// `malloc` that `ibv_free_device_list` frees.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(ptr::null_mut(), || {
        let list = match devices() {
            Ok(list) => list,
            Err(why) => {
                say!("{why}");
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
        };
        let size = (list.len() + 1) * std::mem::size_of::<*mut ibv_device>();
        // SAFETY: malloc takes a size; a null result is handled.
        let array = unsafe { libc::malloc(size) }.cast::<*mut ibv_device>();
        if array.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, entry) in list.iter().enumerate() {
            // SAFETY: `array` holds `list.len() + 1` pointers.
            unsafe { array.add(i).write(ptr::addr_of!(entry.ibv).cast_mut()) };
        }
        // SAFETY: as above, the last slot.
        unsafe { array.add(list.len()).write(ptr::null_mut()) };
        if !num_devices.is_null() {
            // SAFETY: the caller passes a pointer to an int, or null.
            unsafe { *num_devices = list.len() as c_int };
        }
        array
    })
}

/// `ibv_free_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from `ibv_get_device_list`'s malloc, or is null, which free ignores.
    guard((), || unsafe { libc::free(list.cast()) })
}

/// `ibv_get_device_name`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard(ptr::null(), || match DeviceEntry::from_ibv(device) {
        Some(entry) => entry.ibv.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            ptr::null()
        }
    })
}

/// `ibv_get_device_guid`: the node GUID, in network byte order.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || {
        DeviceEntry::from_ibv(device).map_or(0, |e| e.guid.to_be())
    })
}

/// `ibv_get_device_index`: the device's place in the list, or -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(-1, || {
        DeviceEntry::from_ibv(device).map_or(-1, |e| e.index as c_int)
    })
}

/// `ibv_open_device`: opens the device's socket and engine.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(ptr::null_mut(), || {
        let Some(entry) = DeviceEntry::from_ibv(device) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        match Context::open(entry) {
            Ok(context) => Box::leak(context).ibv(),
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

/// `ibv_close_device`: closes the device; its objects should have been destroyed first, as
/// rdma-core asks, but those left behind stop with it.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let raw = unsafe { Context::raw_from_ibv(context) };
        // SAFETY: as above; the reference ends before the context is freed.
        let Some(context) = (unsafe { raw.as_ref() }) else {
            return libc::EINVAL;
        };
        if !context.born.ours() {
            return libc::EINVAL;
        }
        context.entry.close(&context.events);
        // Before the context is freed, or made a box again: a waiter reads the context only
        // under the queue's lock while the queue is open (`ibv_get_async_event`), and finds
        // it closed from now on.
        context.events.close();
        // SAFETY: every context is a leaked `Box<Context>` (`ibv_open_device`), and the
        // program hands it back once; no waiter reads it any more.
        drop(unsafe { Box::from_raw(raw) });
        0
    })
}

/// The device's attributes: softroce's own limits.
fn device_attr(entry: &DeviceEntry) -> ibv_device_attr {
    // SAFETY: `ibv_device_attr` is plain integers and bytes, for which zero is valid.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    fill(&mut attr.fw_ver, env!("CARGO_PKG_VERSION"));
    attr.node_guid = entry.guid.to_be();
    attr.sys_image_guid = entry.guid.to_be();
    attr.max_mr_size = u64::MAX;
    attr.page_size_cap = 0xffff_f000;
    attr.vendor_id = 0xffffff;
    attr.max_qp = qp::MAX_QP;
    attr.max_qp_wr = qp::MAX_WR;
    attr.device_cap_flags = qp::DEVICE_CAP_FLAGS;
    attr.max_sge = post::MAX_SGE;
    attr.max_sge_rd = post::MAX_SGE;
    attr.max_cq = cq::MAX_CQ;
    attr.max_cqe = cq::MAX_CQE;
    attr.max_mr = memory::MAX_MR;
    attr.max_pd = c_int::MAX;
    attr.max_qp_rd_atom = MAX_RD_ATOMIC.into();
    attr.max_res_rd_atom = c_int::from(MAX_RD_ATOMIC) * qp::MAX_QP;
    attr.max_qp_init_rd_atom = MAX_RD_ATOMIC.into();
    attr.atomic_cap = IBV_ATOMIC_HCA;
    attr.max_mw = memory::MAX_MW;
    attr.max_ah = c_int::MAX;
    attr.max_srq = qp::MAX_QP;
    attr.max_srq_wr = qp::MAX_WR;
    attr.max_srq_sge = post::MAX_SGE;
    attr.max_pkeys = 1;
    attr.local_ca_ack_delay = 15;
    attr.phys_port_cnt = 1;
    attr
}

/// `ibv_query_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `attr` points to an `ibv_device_attr` the program owns.
        unsafe { attr.write(device_attr(context.entry)) };
        0
    })
}

/// The port's attributes.
fn port_attr(context: &Context) -> ibv_port_attr {
    let mtu = context.device.port_mtu().ibv_enum().into();
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: 5,
        active_mtu: mtu,
        gid_tbl_len: GID_TABLE_LEN,
        port_cap_flags: 0x0001_0000 | 0x0400_0000, // CM_SUP, IP_BASED_GIDS
        max_msg_sz: 0x8000_0000,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,  // 1X
        active_speed: 32, // EDR: softroce has no line rate of its own
        phys_state: 5,    // LinkUp
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// How many bytes of `ibv_port_attr` the compat `ibv_query_port` fills: up to `flags`
/// (`struct _compat_ibv_port_attr`, what programs built before rdma-core 17 pass).
const COMPAT_PORT_ATTR_LEN: usize = offset_of!(ibv_port_attr, flags);

/// Copies the port's attributes for port `port` into the `len` bytes at `attr`.
///
/// # Safety
///
/// `context` is null or a live context; `attr` is null or points to `len` writable bytes.
unsafe fn query_port_into(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: per the contract.
    let Some(context) = (unsafe { Context::from_ibv(context) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    let full = port_attr(context);
    let n = len.min(std::mem::size_of::<ibv_port_attr>());
    // SAFETY: `attr` has room for `len` bytes, `full` for `n <= size_of` of them.
    unsafe { ptr::copy_nonoverlapping(ptr::addr_of!(full).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// `ibv_query_port` as exported (`verbs.h` calls it when a context has no `query_port` op,
/// and programs built against old headers always): the compat part of the attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the program passes a live context and its own attribute structure.
    guard(libc::EIO, || unsafe {
        query_port_into(context, port_num, attr, COMPAT_PORT_ATTR_LEN)
    })
}

/// The context's `query_port` op, which `verbs.h`'s `ibv_query_port` calls with the size of the
/// structure the program was built with.
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: size_t,
) -> c_int {
    // SAFETY: the program passes a live context and `attr_len` bytes of its own.
    guard(libc::EIO, || unsafe {
        query_port_into(context, port_num, attr, attr_len)
    })
}

/// `ibv_query_gid`: 0, or -1 for an index or port the device does not have.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if gid.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match context.gid(port_num, index) {
            Ok(found) => {
                // SAFETY: `gid` points to a GID the program owns.
                unsafe { gid.write(found) };
                0
            }
            Err(errno) => {
                set_errno(errno);
                -1
            }
        }
    })
}

/// `ibv_query_gid_type` (rdma-core's private node, which `ibv_devinfo` uses): the sysfs type,
/// where 1 is RoCE v2. 0, or -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            return -1;
        };
        let found = c_int::try_from(index).map(|i| context.gid(port_num, i));
        match found {
            Ok(Ok(_)) if !gid_type.is_null() => {
                // SAFETY: `gid_type` points to the program's enum.
                unsafe { *gid_type = 1 };
                0
            }
            _ => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

/// `ibv_query_pkey`: the one P_Key, 0xFFFF, at index 0. 0, or -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let context = unsafe { Context::from_ibv(context) };
        if context.is_none() || port_num != 1 || index != 0 || pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `pkey` points to the program's `__be16`.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    })
}

/// `ibv_get_pkey_index`: the index of `pkey`, 0 for the default P_Key, or -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let context = unsafe { Context::from_ibv(context) };
        if context.is_some() && port_num == 1 && u16::from_be(pkey) | 0x8000 == 0xffff {
            0
        } else {
            set_errno(libc::ENOENT);
            -1
        }
    })
}

/// `ibv_get_async_event`: the next event, waiting for it unless `async_fd` is non-blocking
/// (then -1 with `EAGAIN`). 0, or -1; -1 with `EIO` once another thread closes the context.
/// The wait is a cancellation point, as rdma-core's `read()` is (`crate::blocking`).
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    let start = move || {
        // SAFETY: the program passes a context it opened and has not closed.
        let context = unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        Ok(AsyncWait {
            events: Arc::clone(&context.events),
            context: ptr::from_ref(context),
        })
    };
    wait_in_slices(start, move |wait| loop {
        // SAFETY: the context is open while the queue is not closed, and this runs under the
        // queue's lock, which `ibv_close_device` takes to close it before freeing the context.
        let taken = wait
            .events
            .take(|next| unsafe { (*wait.context).async_event(next) });
        let found = match taken {
            Taken::Event(Some(found)) => found,
            // Its object was destroyed since: nothing to tell.
            Taken::Event(None) => continue,
            Taken::DeviceFatal => ibv_async_event {
                element: ptr::null_mut(),
                event_type: IBV_EVENT_DEVICE_FATAL,
            },
            Taken::Closed => return Next::failed(libc::EIO),
            Taken::None => return Next::until_readable(wait.events.fd.as_raw_fd()),
        };
        // SAFETY: `event` points to the program's structure, checked by `start`.
        unsafe { event.write(found) };
        return Next::Done(0);
    })
}

/// What an `ibv_get_async_event` under way keeps between its slices (`crate::blocking`): the
/// context's queue and descriptor, not the context, which another thread may close meanwhile
/// (`PendingEvents`).
struct AsyncWait {
    events: Arc<PendingEvents>,
    context: *const Context,
}

impl Kept for AsyncWait {
    fn own_signals(&mut self) -> Option<libc::sigset_t> {
        None
    }
}

/// The kind of object an asynchronous event names.
#[derive(Clone, Copy)]
enum Named {
    Qp,
    Cq,
    Srq,
}

impl Named {
    /// What an event of `event_type` names; `None` for a type softroce does not raise.
    fn of(event_type: c_uint) -> Option<Named> {
        match event_type {
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_ACCESS_ERR | IBV_EVENT_QP_LAST_WQE_REACHED => {
                Some(Named::Qp)
            }
            IBV_EVENT_CQ_ERR => Some(Named::Cq),
            IBV_EVENT_SRQ_LIMIT_REACHED => Some(Named::Srq),
            _ => None,
        }
    }

    /// What keeps `element` allocated while the program holds its events ([`crate::held`]).
    ///
    /// # Safety
    ///
    /// `element` is an object of this kind, allocated: live, or destroyed with events held.
    unsafe fn held<'a>(self, element: *mut c_void) -> &'a HeldEvents {
        // SAFETY: per the contract, a live allocation of this kind's type.
        unsafe {
            match self {
                Named::Qp => &(*element.cast::<qp::Qp>()).held,
                Named::Cq => &(*element.cast::<cq::Cq>()).held,
                Named::Srq => &(*element.cast::<qp::Srq>()).held,
            }
        }
    }

    /// Frees `element`.
    ///
    /// # Safety
    ///
    /// `element` is a leaked box of this kind's type that its destroy left to be freed here.
    unsafe fn free(self, element: *mut c_void) {
        // SAFETY: per the contract.
        unsafe {
            match self {
                Named::Qp => drop(Box::from_raw(element.cast::<qp::Qp>())),
                Named::Cq => drop(Box::from_raw(element.cast::<cq::Cq>())),
                Named::Srq => drop(Box::from_raw(element.cast::<qp::Srq>())),
            }
        }
    }
}

/// `ibv_ack_async_event`: frees the object the event names if the program destroyed it
/// meanwhile and this was its last event held ([`crate::held`]). rdma-core's
/// `events_completed` counters are not kept: they serve its destroys' waits, which softroce's
/// do not need.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        // SAFETY: the program passes an event `ibv_get_async_event` gave it, once.
        let Some(&ibv_async_event {
            element,
            event_type,
        }) = (unsafe { event.as_ref() })
        else {
            return;
        };
        let Some(named) = Named::of(event_type).filter(|_| !element.is_null()) else {
            return;
        };
        // SAFETY: the event holds its object allocated until this acknowledgement.
        if unsafe { named.held(element) }.ack(1) {
            // SAFETY: the program destroyed the object and this was its last event held: its
            // destroy left the box for this to free.
            unsafe { named.free(element) };
        }
    })
}

/// `ibv_fork_init`: softroce pins no pages, so a child after `fork` changes nothing a peer
/// reaches; 0.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2), as with a kernel that copies on fork.
#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_read_sysfs_file`: softroce has no sysfs; -1 with `ENOENT`, as for a file that is not
/// there (`ibv_devinfo` asks for the firmware and board IDs and prints what it has).
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: size_t,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

#[cfg(test)]
mod tests {
    use super::*;
    use softroce::wire::Qpn;

    /// Whether the queue's descriptor is readable now.
    fn readable(events: &PendingEvents) -> bool {
        let mut pollfd = libc::pollfd {
            fd: events.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours, no wait.
        unsafe { libc::poll(&mut pollfd, 1, 0) == 1 }
    }

    fn fatal(qpn: u32) -> AsyncEvent {
        AsyncEvent::QpFatal { qpn: Qpn::new(qpn) }
    }

    /// An object's events go with it, and the descriptor is readable exactly while any wait.
    #[test]
    fn forgotten_events_are_never_read_and_the_descriptor_follows() {
        let events = PendingEvents::new().unwrap();
        for qpn in [1, 2, 1] {
            events.push(Raised::Object(fatal(qpn)));
        }
        events.forget(&|e| *e == fatal(1));
        assert!(readable(&events));
        assert!(matches!(events.take(|e| e), Taken::Event(e) if e == fatal(2)));
        assert!(!readable(&events));
        events.push(Raised::Object(fatal(3)));
        events.forget(&|e| *e == fatal(3));
        assert!(!readable(&events), "emptied by the forget");
        assert!(matches!(events.take(|e| e), Taken::None));
    }

    /// A panic on one of the library's threads fails the device: every context hears
    /// `IBV_EVENT_DEVICE_FATAL`, and every call fails saying what happened, rather than the
    /// program waiting for what the thread would have done.
    #[test]
    fn a_panic_on_a_library_thread_fails_the_device() {
        let addr: IpAddr = "127.0.49.15".parse().unwrap();
        let entry: &'static DeviceEntry = Box::leak(Box::new(DeviceEntry::new(0, addr)));
        let events = PendingEvents::new().unwrap();
        let device = entry.open(&events).unwrap();
        let thread = entry
            .spawn_guarded("softroce-test", || panic!("a bug, for the test"))
            .unwrap();
        thread.join().unwrap();
        assert!(matches!(events.take(|e| e), Taken::DeviceFatal));
        let refused = device.alloc_pd().unwrap_err().to_string();
        assert!(refused.contains("C library panicked"), "{refused}");
        entry.close(&events);
    }

    /// A context no one reads keeps at most `MAX_PENDING_EVENTS`.
    #[test]
    fn an_unread_queue_stops_growing() {
        let events = PendingEvents::new().unwrap();
        for qpn in 0..MAX_PENDING_EVENTS as u32 + 10 {
            events.push(Raised::Object(fatal(qpn)));
        }
        assert_eq!(events.lock().events.len(), MAX_PENDING_EVENTS);
        events.push(Raised::DeviceFatal);
        assert_eq!(
            events.lock().events.back(),
            Some(&Raised::DeviceFatal),
            "the device's failure is never dropped"
        );
        assert!(matches!(events.take(|e| e), Taken::Event(e) if e == fatal(0)));
    }
}
