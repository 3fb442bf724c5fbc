//! A waiter's own descriptor in the engine's sleep.
//!
//! An application thread that runs the engine while it waits for something
//! ([`EngineHandle::drive_wait`](super::EngineHandle::drive_wait)) sleeps in the engine's
//! epoll descriptor. It may also have to wake for something the engine knows nothing of: a C
//! program's wait for an event ends when a signal's handler would run, and the C library
//! watches for that with a signalfd while it holds the thread's signals off (a handler must
//! not run while the thread holds the engine). The waiter lends such a descriptor for its
//! turns ([`lend`]); a sleep then polls it beside epoll, and ends when it is readable (the
//! wait learns it as [`Driven::Woken`](super::Driven::Woken)). It is never read here.
//!
//! The engine's own threads hold every asynchronous signal off for good
//! ([`hold_signals_off_for_good`]), as should any thread of a library that runs none of the
//! program's handlers: a signal for the whole process then goes to one of the program's
//! threads, which can tell its waits of it, never to a library thread, which would run the
//! program's handler where no wait learns of it.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use mio::{Events, Poll};
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::time::TimeSpec;

thread_local! {
    /// The descriptor lent for this thread's turns.
    static LENT: RefCell<Option<Arc<OwnedFd>>> = const { RefCell::new(None) };
    /// A sleep of this thread ended because the lent descriptor was readable.
    static WOKEN: Cell<bool> = const { Cell::new(false) };
}

/// Runs `turns` with `fd` lent to the sleeps of the calling thread; also says whether one of
/// them ended because `fd` was readable.
pub(super) fn lend<R>(fd: Option<&Arc<OwnedFd>>, turns: impl FnOnce() -> R) -> (R, bool) {
    let Some(fd) = fd else {
        return (turns(), false);
    };
    let outer = LENT.with(|lent| lent.replace(Some(Arc::clone(fd))));
    WOKEN.with(|woken| woken.set(false));
    let ran = turns();
    LENT.with(|lent| *lent.borrow_mut() = outer);
    (ran, WOKEN.with(|woken| woken.replace(false)))
}

/// A turn's sleep: on `poll` for up to `timeout` (`None`: no limit), and on the descriptor
/// lent to the calling thread, if any, beside it; `events` as `poll` reports them.
pub(super) fn sleep(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
) -> io::Result<()> {
    let Some(lent) = LENT.with(|lent| lent.borrow().clone()) else {
        return poll.poll(events, timeout);
    };
    // The registry's descriptor is the poll's epoll instance: readable while it has events.
    let mut fds = [
        PollFd::new(poll.registry().as_fd(), PollFlags::POLLIN),
        PollFd::new(lent.as_fd(), PollFlags::POLLIN),
    ];
    ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None)?;
    let readable = |fd: &PollFd| {
        fd.revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLIN))
    };
    if readable(&fds[1]) {
        WOKEN.with(|woken| woken.set(true));
    }
    if readable(&fds[0]) {
        poll.poll(events, Some(Duration::ZERO))
    } else {
        events.clear();
        Ok(())
    }
}

/// Holds the calling thread's asynchronous signals off for as long as it runs: for a thread of
/// softroce's, or of a library built on it, that runs none of the program's handlers. Those an
/// instruction raises stay: the guarded accesses to a program's memory take `SIGSEGV` and
/// `SIGBUS` (`memory::foreign`), and a blocked `SIGILL`, `SIGFPE`, `SIGTRAP` or `SIGSYS` that
/// an instruction raises kills the process.
pub fn hold_signals_off_for_good() {
    let mut signals = SigSet::all();
    for raised in [
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGILL,
        Signal::SIGFPE,
        Signal::SIGTRAP,
        Signal::SIGSYS,
    ] {
        signals.remove(raised);
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{eventfd, EventfdFlags};

    /// A sleep with a descriptor lent ends when the descriptor is readable, says so, and
    /// leaves it unread; without one, it sleeps out its time.
    #[test]
    fn a_lent_descriptor_ends_the_sleep() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(4);
        let fd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
        let ((), woken) = lend(Some(&fd), || {
            sleep(&mut poll, &mut events, Some(Duration::from_millis(1))).unwrap()
        });
        assert!(!woken, "nothing to read: the sleep timed out");
        rustix::io::write(&*fd, &1u64.to_ne_bytes()).unwrap();
        let started = std::time::Instant::now();
        let ((), woken) = lend(Some(&fd), || {
            sleep(&mut poll, &mut events, Some(Duration::from_secs(10))).unwrap()
        });
        assert!(woken && started.elapsed() < Duration::from_secs(5));
        let ((), woken) = lend(None, || {
            sleep(&mut poll, &mut events, Some(Duration::from_millis(1))).unwrap()
        });
        assert!(!woken, "not lent: not watched");
        let mut count = [0u8; 8];
        assert_eq!(
            rustix::io::read(&*fd, &mut count).unwrap(),
            8,
            "left unread"
        );
    }
}
