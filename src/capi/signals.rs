//! A program thread's signals while its wait runs the engine.
//!
//! A C program's wait for an event ends with `EINTR` when a signal's handler runs, as a
//! `read()` of rdma-core's channel does (qperf ends each test's last wait with an alarm). A wait
//! that runs the engine (`comp_channel`) holds the engine while it sleeps and while it works,
//! and a handler must not run then: one that calls `exit()` would flush the devices through
//! the engine the thread holds, one that calls a verb would wait for it, one that jumps out
//! would leave it held. So the wait holds the thread's signals off ([`SignalsHeld`]) and lends
//! the engine's sleeps a signalfd of those the thread takes; a signal that comes ends the
//! sleep, or is found between turns, and the wait lets go of the engine and then lets the
//! signals in, in its own frame (`crate::blocking`): the handler runs there, holding nothing,
//! and the wait ends as `read()` would.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use libc::{c_int, sigset_t};

/// Signals an instruction raises, which come from the thread's own work and could not wait:
/// never held off (the guarded accesses to a program's memory take `SIGSEGV` and `SIGBUS`; a
/// blocked one of the others that an instruction raises kills the process).
const RAISED: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// How many of the wait's turns may find no sleep between two looks at the pending signals:
/// turns that busy poll (while packets move) never sleep, so never see the signalfd.
const TURNS_BETWEEN_LOOKS: u32 = 16;

thread_local! {
    /// The thread's signalfd, and the signals (a bit per number) it watches.
    static WATCH: RefCell<Option<(u64, Arc<OwnedFd>)>> = const { RefCell::new(None) };
}

/// An empty signal set.
fn empty() -> sigset_t {
    let mut set = MaybeUninit::<sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        set.assume_init()
    }
}

/// Whether `signal` is in `set`.
fn has(set: &sigset_t, signal: c_int) -> bool {
    // SAFETY: a set initialised by sigemptyset or the kernel; a signal number in range.
    unsafe { libc::sigismember(set, signal) == 1 }
}

/// The calling thread's asynchronous signals, held off until this is dropped (or until the
/// caller sets the mask [`into_own`](Self::into_own) returns), and a signalfd that is readable
/// while one of those the thread takes (its mask before lets it in) is pending.
pub(crate) struct SignalsHeld {
    /// The thread's mask before.
    pub own: sigset_t,
    /// Readable while a signal the thread takes is pending.
    pub watch: Arc<OwnedFd>,
    /// Turns since the pending signals were last looked at.
    turns: u32,
    /// Whether dropping this gives the thread its mask back (not after [`into_own`]).
    ///
    /// [`into_own`]: Self::into_own
    give_back: bool,
}

impl SignalsHeld {
    /// Holds the thread's signals off; `None` (and nothing held) if the mask or the signalfd
    /// cannot be had.
    pub fn hold() -> Option<SignalsHeld> {
        let mut all = empty();
        // SAFETY: sigfillset fills the set it is given; sigdelset takes a member of it.
        unsafe {
            libc::sigfillset(&mut all);
            for raised in RAISED {
                libc::sigdelset(&mut all, raised);
            }
        }
        let mut own = empty();
        // SAFETY: both sets are initialised; glibc keeps its own two out of any mask.
        if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut own) } != 0 {
            return None;
        }
        let mut watched = empty();
        let mut bits = 0u64;
        for signal in 1..=libc::SIGRTMAX().min(64) {
            if has(&all, signal) && !has(&own, signal) {
                // SAFETY: an initialised set; a signal number in range.
                unsafe { libc::sigaddset(&mut watched, signal) };
                bits |= 1 << (signal - 1);
            }
        }
        let watch = WATCH.with(|kept| {
            let mut kept = kept.borrow_mut();
            match &*kept {
                Some((same, fd)) if *same == bits => Some(Arc::clone(fd)),
                _ => {
                    // SAFETY: a new descriptor for the set, or -1 for none; ours if not -1.
                    let fd = unsafe {
                        libc::signalfd(-1, &watched, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC)
                    };
                    if fd < 0 {
                        return None;
                    }
                    // SAFETY: just opened, owned by no one else.
                    let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
                    *kept = Some((bits, Arc::clone(&fd)));
                    Some(fd)
                }
            }
        });
        let Some(watch) = watch else {
            // SAFETY: the mask before, given back.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &own, std::ptr::null_mut()) };
            return None;
        };
        Some(SignalsHeld {
            own,
            watch,
            turns: 0,
            give_back: true,
        })
    }

    /// Lets go of this without giving the thread its mask back: returns the mask, which the
    /// caller sets (`crate::blocking`: in a frame where a handler may jump out).
    pub fn into_own(mut self) -> sigset_t {
        self.give_back = false;
        self.own
    }

    /// After a turn that did not end for the signalfd: whether to look at the pending
    /// signals now, once every [`TURNS_BETWEEN_LOOKS`].
    pub fn time_to_look(&mut self) -> bool {
        self.turns += 1;
        if self.turns < TURNS_BETWEEN_LOOKS {
            return false;
        }
        self.turns = 0;
        true
    }

    /// The signals pending that the thread takes: `None` if there are none; `Some(true)` if
    /// the handler of one of them lacks `SA_RESTART` (the wait then ends with `EINTR`, as a
    /// `read()` does), `Some(false)` if not (the wait goes on once they are handled).
    pub fn pending(&self) -> Option<bool> {
        let mut pending = empty();
        // SAFETY: an initialised set for sigpending to fill.
        if unsafe { libc::sigpending(&mut pending) } != 0 {
            return None;
        }
        let mut any = None;
        for signal in 1..=libc::SIGRTMAX() {
            if !has(&pending, signal) || has(&self.own, signal) || RAISED.contains(&signal) {
                continue;
            }
            // SAFETY: sigaction reads the disposition into `old`, ours.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            let handled = unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN;
            let interrupts = handled && old.sa_flags & libc::SA_RESTART == 0;
            any = Some(any.unwrap_or(false) || interrupts);
        }
        any
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        if self.give_back {
            // SAFETY: the mask before, given back: the signals that came meanwhile are
            // handled now, before this returns.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.own, std::ptr::null_mut()) };
        }
    }
}
