//! Completion channels (`ibv_comp_channel`), and the waits of `ibv_get_cq_event`.
//!
//! A channel's `fd` is an epoll descriptor, and each CQ created on the channel adds its own
//! notification descriptor (softroce's `CompletionQueue` eventfd, readable once an armed event
//! fired) to it: so `poll(2)` on `channel->fd` wakes for any of its CQs, and
//! `ibv_get_cq_event` learns which. A program that made `channel->fd` non-blocking gets
//! `EAGAIN` from `ibv_get_cq_event` when nothing fired.
//!
//! # A wait that receives
//!
//! With hybrid or inline progress, a thread that waits in `ibv_get_cq_event` (rping,
//! `ibv_rc_pingpong -e`, qperf's RC tests, perftest's `-e`, librdmacm's `rdma_get_recv_comp`)
//! runs the engine itself, sleeping in the device's socket (`Device::drive_wait`), its signals
//! held off meanwhile and watched (`signals`): the datagram that
//! completes its request wakes it, and its own turn fires the event it waits for. Sleeping on
//! the channel's descriptor instead, it would be woken by the library's thread once that thread
//! had been woken for the datagram: two hand-offs a message where the kernel's rxe, which
//! completes the CQ in the softirq that took the packet, makes one.
//!
//! A channel on which such a wait has run the engine arms its CQs for it
//! (`CompletionQueue::req_notify_driving`): an arming otherwise hands the engine to the
//! library's thread until the event fires (the program may sleep where no turn runs), and the
//! wait that follows would have to interrupt that thread to take it back. A program that arms
//! a CQ of such a channel and then sleeps on `channel->fd` itself has the thread take over as
//! from any program gone quiet, within about a millisecond (a few on one CPU; with inline
//! progress, nothing runs the engine until its next call); a program that only ever sleeps on
//! the descriptor, or only waits where an event is already there (UCX, after its own
//! `epoll_wait`), keeps the hand-over at each arming.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use libc::{c_int, c_void};
use softroce::verbs::{Device, Driving, WeakDevice};

use crate::abi::*;
use crate::blocking::{non_blocking, wait_in_slices, Kept, Next, Sleep};
use crate::cq::Cq;
use crate::devices::Context;
use crate::fork::Born;
use crate::signals::SignalsHeld;
use crate::{guard, set_errno};

/// How long a wait runs the engine before it looks at the channel's device again: a device
/// that the program closes meanwhile stops once the wait has let go of it.
const DRIVE_SLICE: Duration = Duration::from_millis(100);

/// How long a wait sleeps on the channel's descriptor, while another thread of the program
/// runs the engine waiting on the socket, before it asks for the engine again: that thread may
/// stop running it at any time.
const ELSEWHERE_SLICE: Duration = Duration::from_millis(1);

/// A completion channel: the program's `ibv_comp_channel`, first.
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: ibv_comp_channel,
    /// Held by `ibv_get_cq_event`'s waits too: a program may destroy the channel (once its
    /// CQs are gone) while a thread of its waits on it, as `rdma_destroy_qp` destroys the
    /// channels librdmacm made under a thread in `rdma_get_recv_comp`.
    core: Arc<ChannelCore>,
    /// The process generation that made it ([`crate::fork`]).
    born: Born,
}

struct ChannelCore {
    epoll: OwnedFd,
    /// Held while a CQ's pointer, read from `epoll`, is used, and while a CQ leaves `epoll`:
    /// so a CQ `ibv_destroy_cq` took out is never read through a pointer fetched before.
    taking: Mutex<()>,
    /// In `epoll` under [`STOPPED`]; readable for good once the device stopped, so that
    /// every wait on the channel ends, and every later one fails at once, with `EIO` (what a
    /// read of rdma-core's channel gives once its device is gone).
    stopped: OwnedFd,
    /// Whose engine a wait may run.
    runs: Mutex<Runs>,
    /// A wait has run the engine: the CQs are armed for such waits.
    driven: AtomicBool,
    /// The CQs on it: a wait runs the engine only for one of them.
    cqs: AtomicUsize,
    /// Counts the events its CQs fire (`CompletionQueue::count_events_in`): a wait that read
    /// it before it found `epoll` empty asks it, not `epoll`, whether one came since.
    fired: Arc<AtomicU64>,
}

/// The engine a wait on a channel may run: that of the device of every CQ made on it.
enum Runs {
    /// No CQ made on the channel yet.
    Nothing,
    /// The device of every CQ so far, whose waits run its engine.
    Device(WeakDevice),
    /// None: CQs of two devices, or a device whose engine has a thread of its own (or
    /// several engines).
    Neither,
}

/// What `epoll` hands for [`ChannelCore::stopped`]; a CQ's is its address, never 0.
const STOPPED: u64 = 0;

impl ChannelCore {
    fn taking(&self) -> MutexGuard<'_, ()> {
        self.taking.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A CQ of the channel found its device stopped: every wait ends, with `EIO`.
    fn stop(&self) {
        let one: u64 = 1;
        // SAFETY: our own eventfd, 8 bytes.
        unsafe { libc::write(self.stopped.as_raw_fd(), ptr::addr_of!(one).cast(), 8) };
    }

    /// A CQ of `device` is made on the channel.
    fn note_device(&self, device: &Device) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        *runs = match &*runs {
            Runs::Nothing if device.waits_run_engine() => Runs::Device(device.downgrade()),
            Runs::Device(noted) if noted.is(device) => return,
            _ => Runs::Neither,
        };
    }

    /// The device whose engine a wait runs, while it is open and has a CQ on the channel (a
    /// wait whose channel has lost its CQs waits on, as a read of rdma-core's channel does, but
    /// keeps no device open meanwhile).
    fn device(&self) -> Option<Device> {
        if self.cqs.load(Relaxed) == 0 {
            return None;
        }
        match &*self.runs.lock().unwrap_or_else(|p| p.into_inner()) {
            Runs::Device(device) => device.upgrade(),
            Runs::Nothing | Runs::Neither => None,
        }
    }

    /// Waits for an event of the channel's CQs, or part of the way: the caller looks again
    /// after what it returns (`crate::blocking`). Runs the engine of the channel's device
    /// while it waits, if it can (see the module's documentation), until `fired` has moved
    /// past `seen` (read before the caller found nothing), with the thread's signals held off
    /// (`held`, kept by the caller until it returns: `signals`); otherwise, and after the
    /// device has stopped, a sleep on the descriptor. `EAGAIN` if the program made it
    /// non-blocking; `EINTR` if a signal whose handler lacks `SA_RESTART` came.
    fn wait(&self, held: &mut Option<SignalsHeld>, seen: u64) -> Result<Next, c_int> {
        let fd = self.epoll.as_raw_fd();
        if non_blocking(fd) {
            return Err(libc::EAGAIN);
        }
        // Held signals are let in by the sleep itself, so that one that is pending already
        // ends it (and one that comes during it), as it would end a `read()`.
        let sleep = |within, mask| Ok(Next::Sleep(Sleep { fd, within, mask }));
        let own = held.as_ref().map(|held| held.own);
        let Some(device) = self.device() else {
            return sleep(None, own);
        };
        if held.is_none() {
            *held = SignalsHeld::hold();
        }
        let Some(signals) = held.as_mut() else {
            return sleep(None, None);
        };
        self.driven.store(true, Relaxed);
        // The thread's cancellation is disabled here (`crate::blocking`): a cancellation
        // pending is taken once the wait has let go of the engine (`Next::Again`).
        let arrived = || self.fired.load(SeqCst) != seen;
        let driving = device.drive_wait(DRIVE_SLICE, &arrived, Some(&signals.watch));
        drop(device);
        let own = signals.own;
        match driving {
            Ok(Driving::Ran) if !signals.time_to_look() => Ok(Next::Again),
            // A turn that busy polled never slept, and never saw the signalfd: look.
            Ok(Driving::Ran) if signals.pending().is_none() => Ok(Next::Again),
            // A signal the thread takes is pending: it is handled as the call lets the signals
            // in, with the engine let go already.
            Ok(Driving::Ran | Driving::Woken) => Ok(Next::LetIn {
                own,
                interrupts: signals.pending() == Some(true),
            }),
            Ok(Driving::Elsewhere) => sleep(Some(ELSEWHERE_SLICE), Some(own)),
            // The device has stopped: its CQs' events say so.
            Err(_) => sleep(None, Some(own)),
        }
    }
}

/// Takes the new CQ `cq`, whose notification descriptor is `fd`, on the program's non-null
/// `channel`, for the CQ's `device`: false if epoll refused it (`errno` set).
///
/// # Safety
///
/// `channel` is one the program created and has not destroyed; `cq` is live.
pub(crate) unsafe fn add_cq(
    channel: *mut ibv_comp_channel,
    cq: &Cq,
    fd: RawFd,
    device: &Device,
) -> bool {
    let ch = channel.cast::<Channel>();
    // SAFETY: per the contract; only its core is borrowed, and its count written through the
    // pointer, since another thread may be in `ibv_get_cq_event` on it.
    let core = unsafe { &(*ch).core };
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: ptr::from_ref(cq) as u64,
    };
    // SAFETY: both descriptors are open; `event` is a valid epoll_event.
    let added =
        unsafe { libc::epoll_ctl(core.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
    if added != 0 {
        return false;
    }
    cq.cq.count_events_in(Arc::clone(&core.fired));
    core.note_device(device);
    core.cqs.fetch_add(1, Relaxed);
    let _taking = core.taking();
    // SAFETY: as above; under the lock its other changes and its check take.
    unsafe { (*ch).ibv.refcnt += 1 };
    true
}

/// Takes the CQ whose notification descriptor is `fd` off the program's non-null `channel`.
///
/// # Safety
///
/// `channel` is one the program created and has not destroyed (it cannot while the CQ holds
/// it), and the CQ is on it.
pub(crate) unsafe fn remove_cq(channel: *mut ibv_comp_channel, fd: RawFd) {
    let ch = channel.cast::<Channel>();
    // SAFETY: per the contract; only its core is borrowed, as in `add_cq`.
    let core = unsafe { &(*ch).core };
    core.cqs.fetch_sub(1, Relaxed);
    let taking = core.taking();
    // SAFETY: both descriptors are open.
    unsafe {
        libc::epoll_ctl(
            core.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            ptr::null_mut(),
        )
    };
    // SAFETY: as above; under the lock, as in `add_cq`.
    unsafe { (*ch).ibv.refcnt -= 1 };
    drop(taking);
}

/// Whether the CQs of the program's `channel` (null: none) are armed for waits that run the
/// engine (`CompletionQueue::req_notify_driving`): once such a wait has run on it.
///
/// # Safety
///
/// A non-null `channel` is one the program created and has not destroyed.
pub(crate) unsafe fn armed_for_driving_waits(channel: *mut ibv_comp_channel) -> bool {
    // SAFETY: per the contract; only its core is read.
    unsafe { channel.cast::<Channel>().as_ref() }.is_some_and(|ch| ch.core.driven.load(Relaxed))
}

/// `ibv_create_comp_channel`, on a context of today's ABI or of libibverbs 1.0's (which gets
/// a channel of 1.0's shape: `crate::verbs_1_0`).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(ptr::null_mut(), || {
        // A program of libibverbs 1.0 passes its 1.0 context, and gets a 1.0 channel.
        let for_1_0 = crate::verbs_1_0::today_context(context);
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(for_1_0.unwrap_or(context)) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: epoll_create1 takes a flag; a non-negative result is ours.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return ptr::null_mut();
        }
        // SAFETY: `fd` was just opened and is owned by no one else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: eventfd takes no pointers; a non-negative result is ours.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            set_errno(libc::EMFILE);
            return ptr::null_mut();
        }
        // SAFETY: `stop_fd` was just opened and is owned by no one else.
        let stopped = unsafe { OwnedFd::from_raw_fd(stop_fd) };
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: STOPPED,
        };
        // SAFETY: both descriptors are ours and open; `event` is a valid epoll_event.
        if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, stop_fd, &mut event) } != 0 {
            set_errno(crate::cm::last_errno());
            return ptr::null_mut();
        }
        let channel = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: context.ibv(),
                fd,
                refcnt: 0,
            },
            core: Arc::new(ChannelCore {
                epoll,
                taking: Mutex::new(()),
                stopped,
                runs: Mutex::new(Runs::Nothing),
                driven: AtomicBool::new(false),
                cqs: AtomicUsize::new(0),
                fired: Arc::default(),
            }),
            born: Born::now(),
        });
        let made = Box::into_raw(channel).cast();
        match for_1_0 {
            // SAFETY: just made; the program does not have it yet.
            Some(_) => unsafe { crate::verbs_1_0::channel_1_0(made) },
            None => made,
        }
    })
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // A 1.0 program's channel stands for one of today's.
        let (given, channel) = (channel, crate::verbs_1_0::today_channel(channel));
        // SAFETY: the program passes a channel it created and has not destroyed.
        let Some(ch) = (unsafe { channel.cast::<Channel>().as_ref() }).filter(|c| c.born.ours())
        else {
            return libc::EINVAL;
        };
        // Read under the lock its changes take (`ibv_create_cq`, `ibv_destroy_cq`).
        let busy = {
            let _taking = ch.core.taking();
            ch.ibv.refcnt > 0
        };
        if busy {
            return libc::EBUSY;
        }
        // SAFETY: every channel is a leaked `Box<Channel>`, handed back once.
        drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        crate::verbs_1_0::forget_channel(given);
        0
    })
}

/// `ibv_get_cq_event`: the next CQ of `channel` whose armed event fired, waiting for one
/// unless the channel's descriptor is non-blocking. 0, or -1. A wait whose channel another
/// thread destroys (after its CQs) waits on, as a read of rdma-core's channel does, without
/// reading the freed channel. Once a CQ of the channel finds its device stopped, every wait
/// ends with -1 and `EIO`, and so does every later call. The wait is a cancellation point, as
/// rdma-core's `read()` is (`crate::blocking`).
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let start = move || {
        // SAFETY: the program passes a channel it created and has not destroyed.
        let ch = unsafe { channel.cast::<Channel>().as_ref() }
            .filter(|c| c.born.ours())
            .ok_or(libc::EINVAL)?;
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        Ok(CqWait {
            core: Arc::clone(&ch.core),
            held: None,
        })
    };
    wait_in_slices(start, move |wait| {
        // SAFETY: the program's out-pointers, checked by `start`.
        unsafe { cq_event_slice(wait, cq, cq_context) }
    })
}

/// What an `ibv_get_cq_event` under way keeps between its slices.
struct CqWait {
    /// The channel's core, not the channel (see `Channel::core`).
    core: Arc<ChannelCore>,
    /// The thread's signals, held from the first slice that runs the engine until the call
    /// returns.
    held: Option<SignalsHeld>,
}

impl Kept for CqWait {
    fn own_signals(&mut self) -> Option<libc::sigset_t> {
        self.held.take().map(SignalsHeld::into_own)
    }
}

/// A slice of `ibv_get_cq_event`'s wait (`crate::blocking`): the event, if one fired, or the
/// wait for one, part of the way.
///
/// # Safety
///
/// `cq` and `cq_context` are the program's, not null.
unsafe fn cq_event_slice(
    wait: &mut CqWait,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> Next {
    let core = &wait.core;
    let fd = core.epoll.as_raw_fd();
    loop {
        // Read before the look: an event fired after it moves the count.
        let seen = core.fired.load(SeqCst);
        let taking = core.taking();
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one event's room, our own descriptor; no wait, under the lock.
        let n = unsafe { libc::epoll_wait(fd, &mut event, 1, 0) };
        if n > 0 && event.u64 == STOPPED {
            return Next::failed(libc::EIO);
        }
        if n > 0 {
            let found = event.u64 as *mut Cq;
            // SAFETY: the channel holds live CQs only, and `ibv_destroy_cq` takes its CQ out
            // under `taking`, held since the pointer was read.
            let this = unsafe { &*found };
            if this.cq.take_events() == 0 {
                // Another thread took this event first.
                continue;
            }
            if this.cq.is_stopped() {
                // The event the device's stop fired (or one just before it): the device is
                // gone, and so is the channel's use.
                core.stop();
                return Next::failed(libc::EIO);
            }
            this.held.hand_out();
            drop(taking);
            // SAFETY: the program's out-pointers, not null.
            unsafe {
                *cq = found.cast();
                *cq_context = this.ibv.cq_context;
            }
            return Next::Done(0);
        }
        drop(taking);
        if n < 0 {
            return Next::Done(-1);
        }
        // Waits for a CQ's event without the lock. Another thread's take loops.
        return match core.wait(&mut wait.held, seen) {
            Ok(next) => next,
            Err(errno) => Next::failed(errno),
        };
    }
}
