//! Event channels and their events: `rdma_create_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`, `rdma_event_str`.
//!
//! A channel's `fd` is an eventfd, readable while events wait: a program may `poll(2)` it, or
//! make it non-blocking and have `rdma_get_cm_event` answer `EAGAIN`. Events are made by the
//! threads that carry out the CM's work for each ID (`id.rs`), and each is a structure of its
//! own until `rdma_ack_cm_event` frees it, its private data inside it.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use libc::{c_char, c_int, c_uint};

use super::id;
use crate::abi::*;
use crate::blocking::{wait_in_slices, Kept, Next};
use crate::fork::Born;
use crate::{guard, set_errno};

/// The most private data any CM message carries (a REP's 196 bytes, a SIDR request's 216).
pub(crate) const MAX_PRIVATE_DATA: usize = 256;

/// An event, as `rdma_get_cm_event` hands it out: the program's `rdma_cm_event`, first, and
/// the private data its parameters point into.
#[repr(C)]
pub(crate) struct Event {
    pub ibv: rdma_cm_event,
    data: [u8; MAX_PRIVATE_DATA],
    /// What the threads of its IDs share with them, set with the IDs as the event is posted.
    pub(super) owners: id::Owners,
}

impl Event {
    /// An event of `kind`, with `status`, for no ID yet (its post names it), no parameters yet.
    pub(crate) fn new(kind: c_uint, status: c_int) -> Box<Event> {
        Box::new(Event {
            ibv: rdma_cm_event {
                id: ptr::null_mut(),
                listen_id: ptr::null_mut(),
                event: kind,
                status,
                // SAFETY: the parameters are integers and pointers, for which zero (null) is
                // valid.
                param: unsafe { std::mem::zeroed() },
            },
            data: [0; MAX_PRIVATE_DATA],
            owners: id::Owners::default(),
        })
    }

    /// Copies `data` (at most 255 bytes, as `private_data_len` holds) into the event, and
    /// returns where it is and its length.
    fn keep(&mut self, data: &[u8]) -> (*const libc::c_void, u8) {
        let n = data.len().min(255);
        self.data[..n].copy_from_slice(&data[..n]);
        (self.data.as_ptr().cast(), n as u8)
    }

    /// Sets a connection event's parameters, with `data` as its private data.
    pub(crate) fn conn(mut self: Box<Self>, mut conn: rdma_conn_param, data: &[u8]) -> Box<Self> {
        (conn.private_data, conn.private_data_len) = self.keep(data);
        if data.is_empty() {
            conn.private_data = ptr::null();
        }
        self.ibv.param.conn = conn;
        self
    }

    /// Sets a UD event's parameters, with `data` as its private data.
    pub(crate) fn ud(mut self: Box<Self>, mut ud: rdma_ud_param, data: &[u8]) -> Box<Self> {
        (ud.private_data, ud.private_data_len) = self.keep(data);
        self.ibv.param.ud = ud;
        self
    }
}

/// The events of a channel not yet taken, and the eventfd that says so.
pub(crate) struct Events {
    queue: Mutex<VecDeque<Box<Event>>>,
    /// Woken at each event, for the IDs that wait for theirs (synchronous IDs).
    arrived: Condvar,
    fd: OwnedFd,
}

// SAFETY: the queued events' raw pointers (to IDs, and into themselves) are only handed to the
// program; nothing here dereferences them. The rest is `Mutex`, `Condvar` and a descriptor.
unsafe impl Send for Events {}
// SAFETY: as for `Send`.
unsafe impl Sync for Events {}

impl Events {
    fn new() -> std::io::Result<Arc<Events>> {
        // Blocking, as the program's `fd` is until it says otherwise; softroce reads it only
        // when its count is not zero (see `take`).
        // SAFETY: eventfd takes no pointers; a non-negative result is a descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Events {
            queue: Mutex::new(VecDeque::new()),
            arrived: Condvar::new(),
            // SAFETY: `fd` was just opened and is owned by no one else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    /// Queues `event` and makes the descriptor readable.
    pub(crate) fn post(&self, event: Box<Event>) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push_back(event);
        let one: u64 = 1;
        // SAFETY: our own eventfd, 8 bytes.
        unsafe { libc::write(self.fd.as_raw_fd(), ptr::addr_of!(one).cast(), 8) };
        self.arrived.notify_all();
    }

    /// The oldest event that `wanted` takes, leaving the descriptor readable while more wait.
    /// The descriptor's count is not zero exactly while the queue holds events (both change
    /// under the queue's lock), so the read below, after an event was taken, never blocks.
    /// `taking` sees the event first, under the queue's lock.
    fn take(
        &self,
        wanted: impl Fn(&rdma_cm_event) -> bool,
        taking: impl FnOnce(&Event),
    ) -> Option<Box<Event>> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let at = queue.iter().position(|e| wanted(&e.ibv))?;
        let event = queue.remove(at)?;
        if event.ibv.event == RDMA_CM_EVENT_CONNECT_REQUEST {
            if let Some(listener) = event.owners.listener.upgrade() {
                listener.request_taken();
            }
        }
        taking(&event);
        let mut count = 0u64;
        // SAFETY: our own eventfd, 8 bytes; its count is not zero (above).
        unsafe { libc::read(self.fd.as_raw_fd(), ptr::addr_of_mut!(count).cast(), 8) };
        if !queue.is_empty() {
            let one: u64 = 1;
            // SAFETY: as above.
            unsafe { libc::write(self.fd.as_raw_fd(), ptr::addr_of!(one).cast(), 8) };
        }
        Some(event)
    }

    /// Waits for the next event of the ID at `id` (a synchronous ID's own), at most `limit`;
    /// `None` at the limit, or at once when `gone` is set (the ID was destroyed).
    pub(crate) fn wait_for(
        &self,
        id: *mut rdma_cm_id,
        limit: Duration,
        gone: &AtomicBool,
    ) -> Option<Box<Event>> {
        self.wait_until(|e| ptr::eq(e.id, id), limit, gone)
    }

    /// Waits for the next event of a request to the listening ID at `id`, or for the ID's
    /// own `RDMA_CM_EVENT_DEVICE_REMOVAL` (its device failed), as [`wait_for`](Self::wait_for)
    /// does.
    pub(crate) fn wait_for_listener(
        &self,
        id: *mut rdma_cm_id,
        limit: Duration,
        gone: &AtomicBool,
    ) -> Option<Box<Event>> {
        let removed =
            |e: &rdma_cm_event| ptr::eq(e.id, id) && e.event == RDMA_CM_EVENT_DEVICE_REMOVAL;
        self.wait_until(|e| ptr::eq(e.listen_id, id) || removed(e), limit, gone)
    }

    /// Waits for the next event that `wanted` takes, at most `limit`, and not once `gone` is
    /// set: a destroy sets it before it forgets the ID's events, which wakes the waiters, so
    /// none sleeps on through it.
    fn wait_until(
        &self,
        wanted: impl Fn(&rdma_cm_event) -> bool,
        limit: Duration,
        gone: &AtomicBool,
    ) -> Option<Box<Event>> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(event) = self.take(&wanted, |_| {}) {
                return Some(event);
            }
            let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if gone.load(Ordering::Acquire) {
                return None;
            }
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            if !queue.iter().any(|e| wanted(&e.ibv)) {
                let _ = self.arrived.wait_timeout(queue, left);
            }
        }
    }

    /// Takes out the events of the ID at `id`, destroyed before they were read, and wakes the
    /// synchronous calls that wait on the queue (see [`wait_until`](Self::wait_until)).
    pub(crate) fn forget(&self, id: *mut rdma_cm_id) -> VecDeque<Box<Event>> {
        let forgotten = self.take_all_of(id);
        self.arrived.notify_all();
        forgotten
    }

    /// Takes out the events of the ID at `id`, in order: for its move to another channel
    /// (`rdma_migrate_id`), or its destroy. The descriptor stays readable exactly while events
    /// are left.
    pub(crate) fn take_all_of(&self, id: *mut rdma_cm_id) -> VecDeque<Box<Event>> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let (theirs, others) = std::mem::take(&mut *queue)
            .into_iter()
            .partition(|e| concerns(e, id));
        *queue = others;
        if queue.is_empty() && !theirs.is_empty() {
            let mut count = 0u64;
            // SAFETY: our own eventfd, 8 bytes; its count is not zero, since events were
            // queued.
            unsafe { libc::read(self.fd.as_raw_fd(), ptr::addr_of_mut!(count).cast(), 8) };
        }
        theirs
    }
}

/// Whether `event` is of the ID at `id`: its own, or a request to it.
fn concerns(event: &Event, id: *mut rdma_cm_id) -> bool {
    ptr::eq(event.ibv.id, id) || ptr::eq(event.ibv.listen_id, id)
}

/// An event channel: the program's `rdma_event_channel`, first.
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: rdma_event_channel,
    pub events: Arc<Events>,
    /// The process generation that made it ([`crate::fork`]): a child reading its parent's
    /// channel would take events from the descriptor the two share.
    born: Born,
}

impl Channel {
    /// A new channel, boxed: the program's pointer is its first field.
    pub(crate) fn new() -> std::io::Result<Box<Channel>> {
        let events = Events::new()?;
        Ok(Box::new(Channel {
            ibv: rdma_event_channel {
                fd: events.fd.as_raw_fd(),
            },
            events,
            born: Born::now(),
        }))
    }

    /// The channel behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `channel` is one `rdma_create_event_channel` returned and
    /// `rdma_destroy_event_channel` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: per the contract, `channel` is the first field of a live `Channel`.
        unsafe { channel.cast::<Channel>().as_ref() }.filter(|c| c.born.ours())
    }
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(ptr::null_mut(), || match Channel::new() {
        Ok(channel) => Box::into_raw(channel).cast(),
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            ptr::null_mut()
        }
    })
}

/// `rdma_destroy_event_channel`: its IDs should have been destroyed, and its events acked.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        if !channel.is_null() {
            // SAFETY: every channel is a leaked `Box<Channel>`, handed back once. IDs still on
            // it hold its queue (an `Arc`), not the box.
            drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        }
    })
}

/// What `rdma_get_cm_event` keeps between its slices: the channel's queue.
impl Kept for Arc<Events> {
    fn own_signals(&mut self) -> Option<libc::sigset_t> {
        None
    }
}

/// `rdma_get_cm_event`: the next event, waiting for one unless the channel's descriptor is
/// non-blocking (then -1 with `EAGAIN`). 0, or -1. The wait is a cancellation point, as
/// librdmacm's `read()` is (`crate::blocking`).
#[no_mangle]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    let start = move || {
        // SAFETY: the program passes a channel it created and has not destroyed.
        let channel = unsafe { Channel::from_ibv(channel) }.ok_or(libc::EINVAL)?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // The wait keeps the channel's queue (and its descriptor) itself, not the channel: a
        // program may destroy the channel while a thread of its waits here (rping's client
        // does at exit, its CM thread never joined), and the waiter, woken by a late event,
        // must not read the freed channel. Real librdmacm's waiter stays in its read().
        Ok(Arc::clone(&channel.events))
    };
    wait_in_slices(start, move |events| {
        // Counted under the queue's lock, which a destroy of one of the event's IDs takes to
        // forget its events before it decides whether to free the ID.
        let Some(next) = events.take(|_| true, id::hand_out) else {
            return Next::until_readable(events.fd.as_raw_fd());
        };
        id::note_event(&next);
        // SAFETY: the program's out-pointer, checked by `start`.
        unsafe { *event = ptr::addr_of_mut!(Box::leak(next).ibv) };
        Next::Done(0)
    })
}

/// `rdma_ack_cm_event`: frees the event. 0.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: every event the program holds is a leaked `Box<Event>`, whose first field
        // the pointer is, handed back once.
        let event = unsafe { Box::from_raw(event.cast::<Event>()) };
        // SAFETY: an event the program held, which `hand_out` counted when
        // `rdma_get_cm_event` took it, released once.
        unsafe { id::release(&event) };
        0
    })
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: c_uint) -> *const c_char {
    const NAMES: [&[u8]; 16] = [
        b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        b"RDMA_CM_EVENT_ADDR_ERROR\0",
        b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        b"RDMA_CM_EVENT_UNREACHABLE\0",
        b"RDMA_CM_EVENT_REJECTED\0",
        b"RDMA_CM_EVENT_ESTABLISHED\0",
        b"RDMA_CM_EVENT_DISCONNECTED\0",
        b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
    ];
    let name = NAMES
        .get(event as usize)
        .copied()
        .unwrap_or(b"UNKNOWN EVENT\0");
    name.as_ptr().cast()
}
