//! The calls that wait for an event (`ibv_get_cq_event`, `ibv_get_async_event`,
//! `rdma_get_cm_event`), and the cancellation of a thread that waits in one.
//!
//! rdma-core's versions of these calls wait in a `read()` of the channel's descriptor, which
//! is a cancellation point: a program may cancel a thread that waits there (rping cancels its
//! CQ thread so when a connection fails), and the thread ends, its cleanup handlers run. A
//! cancellation unwinds the thread's stack by force, which Rust defines only through frames
//! that have nothing to drop, entered through functions whose ABI allows unwinding ("plain old
//! frames", RFC 2945); through the library's panic guard ([`guard`]) it ends the process.
//!
//! So each of these calls waits in slices ([`wait_in_slices`]). A slice runs under the guard,
//! with the thread's cancellation disabled, and says what comes next ([`Next`]): the call's
//! result, a sleep until the channel's descriptor is readable, or the next slice (after one
//! that ran the engine for a while, and so did not sleep where a cancellation is taken). Between
//! two slices, the call's own frames hold nothing with a destructor: the sleep, in them, is the
//! call's cancellation point, as the `read()` is rdma-core's, and a cancellation pending is
//! taken there or before the next slice. What a call keeps from one slice to the next (the
//! channel's queue, the thread's signals held off) lives in its frame behind `ManuallyDrop`,
//! and a glibc cleanup buffer there drops it should a cancellation unwind through (or a
//! handler's `siglongjmp` leave it): the held
//! signals are let go (the thread's own mask back) before the program's cleanup handlers run,
//! as they would after rdma-core's `read()`.
//!
//! Held signals are let in only in the call's own frames too: by the sleep ([`Sleep`]'s mask),
//! by a look that does not wait ([`Next::LetIn`]), and last, once the call is done. A handler
//! that jumps out (an alarm's timeout around a wait, with `siglongjmp`) so leaves no slice
//! half run, and the thread's cancellation as the program had it.

use std::os::fd::RawFd;
use std::time::Duration;

use std::mem::ManuallyDrop;
use std::ptr;

use libc::{c_int, c_void, sigset_t};

use crate::{guard, set_errno};

/// What comes after a slice of a waiting call.
#[derive(Clone, Copy)]
pub(crate) enum Next {
    /// The call returns this, `errno` set where it fails.
    Done(c_int),
    /// A sleep on a descriptor, then the next slice.
    Sleep(Sleep),
    /// The next slice, once a cancellation pending is taken.
    Again,
    /// The thread's signals are let in for an instant (`own`, its mask, in force), in the
    /// call's own frame: a wait that holds them off found one pending that the thread takes.
    /// Its handler runs there, where one that jumps out leaves the call as it would leave
    /// rdma-core's `read()`. Then the call fails with `EINTR` if `interrupts` (the handler
    /// lacks `SA_RESTART`) and a handler ran, or goes on.
    LetIn { own: sigset_t, interrupts: bool },
}

impl Next {
    /// The call fails with `errno`.
    pub(crate) fn failed(errno: c_int) -> Next {
        set_errno(errno);
        Next::Done(-1)
    }

    /// A sleep until `fd`, the descriptor of one of the program's event channels, is readable,
    /// as rdma-core's calls sleep in `read()` on theirs; at once `EAGAIN` if the program made
    /// it non-blocking.
    pub(crate) fn until_readable(fd: RawFd) -> Next {
        if non_blocking(fd) {
            return Next::failed(libc::EAGAIN);
        }
        Next::Sleep(Sleep {
            fd,
            within: None,
            mask: None,
        })
    }
}

/// A sleep of a waiting call: until `fd` is readable, for up to `within` (`None`: no limit),
/// with the signal mask `mask` in force meanwhile if one is given (`ppoll`: for a thread that
/// holds its signals off but while it sleeps).
#[derive(Clone, Copy)]
pub(crate) struct Sleep {
    pub fd: RawFd,
    pub within: Option<Duration>,
    pub mask: Option<sigset_t>,
}

impl Sleep {
    /// `Ok` once the descriptor is readable or the time is up; else `ppoll`'s `errno`
    /// (`EINTR`: a signal's handler ran).
    fn run(&self) -> Result<(), c_int> {
        let timeout = self.within.map(|t| libc::timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(t.subsec_nanos()),
        });
        let mut pollfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        let mask = self
            .mask
            .as_ref()
            .map_or(std::ptr::null(), |m| m as *const _);
        // SAFETY: one pollfd, ours, on the stack; the timeout and the mask, if any, too.
        // glibc's `ppoll` is a cancellation point: a cancellation unwinds from it through
        // this frame and the call's, which hold only plain values.
        if unsafe { ppoll(&mut pollfd, 1, timeout, mask) } >= 0 {
            return Ok(());
        }
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    }
}

/// What a waiting call keeps between its slices.
pub(crate) trait Kept {
    /// The thread's own signal mask, if what is kept holds the thread's signals off: taken
    /// out, so that dropping the rest lets no signal in. The call puts the mask back last, in
    /// its own frame, where a handler that runs then, and jumps out, leaves nothing undone.
    fn own_signals(&mut self) -> Option<sigset_t>;
}

/// Lets the signals that `own`, the thread's mask, lets in run their handlers, if any is
/// pending (a `ppoll` of no descriptor that does not wait): whether a handler ran.
fn let_in(own: &sigset_t) -> bool {
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: no descriptors; the timeout and the mask on the stack. A handler runs inside,
    // under this plain frame and the call's.
    unsafe { ppoll(ptr::null_mut(), 0, &now, own) < 0 }
}

/// What the end of the last slice's sleep, if any, means for the call: `Err` with the `errno`
/// it fails with. A signal ends the wait with `EINTR` as it ends rdma-core's `read()`: when
/// its handler lacks `SA_RESTART` (programs that time a test with an alarm, qperf and
/// perftest's `-D`, end a wait for a message that will not come this way); else the wait goes
/// on, as the kernel restarts the `read()`. `ppoll` is never restarted, and which signal came
/// is not known, so the wait ends if any handler the program installed lacks `SA_RESTART`
/// ([`every_handler_restarts`]).
fn after_sleep(slept: Option<Result<(), c_int>>) -> Result<(), c_int> {
    match slept {
        Some(Err(libc::EINTR)) if every_handler_restarts() => Ok(()),
        Some(Err(errno)) => Err(errno),
        Some(Ok(())) | None => Ok(()),
    }
}

/// Runs a waiting call: `start` checks the program's arguments and makes what the call keeps
/// between its slices (`Err`: the call fails with that `errno`), then `slice` runs until it
/// says the call is done. Returns the call's result. Both are `Copy`, so they hold nothing to
/// drop: they capture the program's pointers. A sleep that a signal ended fails the call as
/// [`after_sleep`] says, before the next slice.
///
/// Called by the exported function itself (`extern "C-unwind"`), so that only its frame (and a
/// 1.0 wrapper's), this one and the cancellation point's (`at_cancellation_point`, the
/// closure, `Sleep::run`) are between the program's and a cancellation, none with a
/// destructor.
pub(crate) fn wait_in_slices<K: Kept>(
    start: impl Fn() -> Result<K, c_int> + Copy,
    slice: impl Fn(&mut K) -> Next + Copy,
) -> c_int {
    let program = cancel_state(PTHREAD_CANCEL_DISABLE);
    // What the call keeps, never dropped by an unwinding: by `drop_kept`, run by glibc should
    // a cancellation unwind through this frame (or a handler's jump leave it), or below, once
    // the call is done. Reached only through `kept`, the pointer glibc holds too.
    let mut slot: ManuallyDrop<Option<K>> = ManuallyDrop::new(None);
    let kept = ptr::addr_of_mut!(slot);
    let mut buffer = CleanupBuffer::default();
    // SAFETY: glibc links the buffer, in this frame, into the thread's cleanup list until the
    // pop below; what it hands the routine is in this frame too, of the routine's type.
    unsafe { _pthread_cleanup_push(&mut buffer, drop_kept::<K>, kept.cast()) };
    let mut slept = None;
    let result = loop {
        let next = guard(Next::Done(-1), || {
            if let Err(errno) = after_sleep(slept) {
                return Next::failed(errno);
            }
            // SAFETY: the slot of this frame, used by nothing else meanwhile.
            let kept = unsafe { &mut **kept };
            let this = match kept {
                Some(this) => this,
                None => match start() {
                    Ok(first) => kept.insert(first),
                    Err(errno) => return Next::failed(errno),
                },
            };
            slice(this)
        });
        match next {
            Next::Done(result) => break result,
            Next::Sleep(sleep) => slept = Some(at_cancellation_point(program, || sleep.run())),
            Next::Again => {
                // SAFETY: glibc's call; a cancellation pending unwinds from it through plain
                // frames, as from the sleep.
                at_cancellation_point(program, || unsafe { pthread_testcancel() });
                slept = None;
            }
            Next::LetIn { own, interrupts } => {
                let handled = at_cancellation_point(program, || let_in(&own));
                slept = (handled && interrupts).then_some(Err(libc::EINTR));
            }
        }
    };
    // SAFETY: the buffer pushed above, the last pushed (a wait a handler made meanwhile popped
    // its own); its routine not run.
    unsafe { _pthread_cleanup_pop(&mut buffer, 0) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let own = guard(None, || {
        // SAFETY: the slot of this frame, no longer glibc's; taken once.
        let mut kept = unsafe { (**kept).take() }?;
        kept.own_signals()
    });
    cancel_state(program);
    // The call is done: a handler that runs as the signals are let go, and jumps out, leaves
    // it finished.
    if let Some(own) = own {
        // SAFETY: the thread's own mask, given back.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &own, ptr::null_mut()) };
    }
    set_errno(errno);
    result
}

/// Runs `point`, the call's cancellation point, in the program's cancellation state
/// (`program`). Its frame, like its callers', holds nothing with a destructor.
fn at_cancellation_point<R>(program: c_int, point: impl FnOnce() -> R) -> R {
    cancel_state(program);
    let result = point();
    cancel_state(PTHREAD_CANCEL_DISABLE);
    result
}

/// Drops what a waiting call kept (`kept`, a `ManuallyDrop<Option<K>>`): run by glibc as a
/// cancellation unwinds through [`wait_in_slices`], or as a signal handler's `siglongjmp`
/// leaves it. Letting the held signals go gives the thread its own mask back before the
/// program's cleanup handlers run. Taken out before it is dropped: a handler that runs as the
/// signals are let go, and jumps out too, has glibc run this again, on nothing.
extern "C" fn drop_kept<K>(kept: *mut c_void) {
    // SAFETY: the `ManuallyDrop<Option<K>>` of the call's frame, which the unwinding or the
    // jump leaves and which nothing else uses again.
    drop(unsafe { (*kept.cast::<ManuallyDrop<Option<K>>>()).take() });
}

/// glibc's `struct _pthread_cleanup_buffer` (pthread.h).
#[repr(C)]
struct CleanupBuffer {
    routine: Option<extern "C" fn(*mut c_void)>,
    arg: *mut c_void,
    cancel_type: c_int,
    prev: *mut CleanupBuffer,
}

impl Default for CleanupBuffer {
    fn default() -> Self {
        CleanupBuffer {
            routine: None,
            arg: ptr::null_mut(),
            cancel_type: 0,
            prev: ptr::null_mut(),
        }
    }
}

/// Sets the calling thread's cancellation state (`PTHREAD_CANCEL_ENABLE` or `_DISABLE`), and
/// returns the one before.
pub(crate) fn cancel_state(state: c_int) -> c_int {
    let mut before = 0;
    // SAFETY: glibc's call, on the calling thread, writing the state before into ours; setting
    // the state is not a cancellation point.
    unsafe { pthread_setcancelstate(state, &mut before) };
    before
}

/// Whether the program made `fd`, one of its event channels' descriptors, non-blocking.
pub(crate) fn non_blocking(fd: RawFd) -> bool {
    // SAFETY: fcntl on a descriptor of ours, which the caller's channel keeps open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags & libc::O_NONBLOCK != 0
}

/// Whether every signal handler installed has `SA_RESTART` (none installed: true). The fault
/// signals are left out: they come from an instruction, never during a wait (and the library's
/// own guard of the program's memory handles SIGSEGV and SIGBUS).
fn every_handler_restarts() -> bool {
    let synchronous = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
    (1..=libc::SIGRTMAX())
        .filter(|s| !synchronous.contains(s))
        .all(|signal| {
            // SAFETY: sigaction reads the disposition into `old`, ours; a signal it refuses
            // (SIGKILL, SIGSTOP, one glibc keeps) has no handler of the program's.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            if unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } != 0 {
                return true;
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            !handled || old.sa_flags & libc::SA_RESTART != 0
        })
}

/// glibc's calls that a cancellation may unwind from (`C-unwind`: the `libc` crate declares
/// `ppoll` as `C`, which may not unwind), the cancellation state, and the old-style cleanup
/// buffers, which it does not declare (pthread.h).
pub(crate) const PTHREAD_CANCEL_DISABLE: c_int = 1;
extern "C-unwind" {
    fn ppoll(
        fds: *mut libc::pollfd,
        nfds: libc::nfds_t,
        timeout: *const libc::timespec,
        mask: *const sigset_t,
    ) -> c_int;
    fn pthread_testcancel();
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}
extern "C" {
    fn _pthread_cleanup_push(
        buffer: *mut CleanupBuffer,
        routine: extern "C" fn(*mut c_void),
        arg: *mut c_void,
    );
    fn _pthread_cleanup_pop(buffer: *mut CleanupBuffer, execute: c_int);
}
