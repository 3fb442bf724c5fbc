//! Signals, and the threads that run the engine.
//!
//! A C program's wait for an event ends with `EINTR` when a signal's handler runs during it, as
//! a `read()` of rdma-core's channel does, and programs that time a test with an alarm rely on
//! it (qperf: a wait whose signal slipped by waits for a peer that has stopped). A wait that
//! runs the engine ([`EngineHandle::drive_wait`](super::EngineHandle::drive_wait)) spends part
//! of its time in the engine's work, not asleep, and a handler that ran then would leave the
//! wait nothing to go by. So such a wait holds its thread's signals off ([`SignalsHeld`]) and
//! lets them in only while its turn sleeps on the socket: `ppoll` on the engine's epoll
//! descriptor with the thread's own mask, the pselect pattern. A signal that comes while the
//! turn works is kept pending until the sleep, which it then ends.
//!
//! The engine's threads hold every asynchronous signal off for good
//! ([`hold_signals_off_for_good`]), as should any thread of a library that runs none of the
//! program's handlers: a signal for the whole
//! process then goes to one of the program's threads, never to a library thread, which would
//! run the program's handler where the program's wait cannot learn of it (or while the waiting
//! thread holds it off).

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;

use std::os::fd::AsFd;
use std::time::Duration;

use mio::{Events, Poll};
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::time::TimeSpec;

thread_local! {
    /// The mask a turn of this thread sleeps with, while a [`SignalsHeld`] holds the others off.
    static LET_IN: Cell<Option<SigSet>> = const { Cell::new(None) };
    /// Set when a turn's sleep on this thread ends with `EINTR`.
    static INTERRUPTED: Cell<bool> = const { Cell::new(false) };
}

/// The signals a thread may hold off: all but those an instruction raises, which come from the
/// thread's own work and could not wait (the guarded accesses to a program's memory take
/// `SIGSEGV` and `SIGBUS`: `memory::foreign`). `SIGKILL` and `SIGSTOP` cannot be held off;
/// glibc keeps its own two (thread cancellation and `setxid`) out of any mask.
fn holdable() -> SigSet {
    let mut signals = SigSet::all();
    for raised in [
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGILL,
        Signal::SIGFPE,
    ] {
        signals.remove(raised);
    }
    signals
}

/// The calling thread's asynchronous signals, held off (blocked) until this is dropped, except
/// while a turn of the engine that the thread runs sleeps on the socket: then the thread's own
/// mask, as it was before, is in force, and a signal it lets in ends the sleep (the wait
/// learns of it: [`Driving::Interrupted`](crate::verbs::Driving::Interrupted)). For a wait that
/// runs the engine and must end for a signal, as a C program's wait for an event does.
#[derive(Debug)]
pub struct SignalsHeld {
    /// The thread's mask before.
    before: SigSet,
    /// The sleeps' mask of an enclosing hold, if any.
    outer: Option<SigSet>,
    /// A signal mask is the thread's own.
    _thread: PhantomData<*const ()>,
}

impl SignalsHeld {
    /// Holds the calling thread's signals off; an error only if the mask cannot be changed.
    pub fn hold() -> io::Result<SignalsHeld> {
        let mut before = SigSet::empty();
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&holdable()), Some(&mut before))?;
        // Within another hold, the sleeps still let in what the thread's own mask lets in.
        let outer = LET_IN.with(Cell::get);
        LET_IN.with(|let_in| let_in.set(Some(outer.unwrap_or(before))));
        Ok(SignalsHeld {
            before,
            outer,
            _thread: PhantomData,
        })
    }
}

impl SignalsHeld {
    /// The mask the thread had before: what its sleeps let in.
    pub fn mask_before(&self) -> libc::sigset_t {
        *self.before.as_ref()
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        LET_IN.with(|let_in| let_in.set(self.outer));
        // Signals that came meanwhile are taken now, by the program's handlers.
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.before), None);
    }
}

/// The mask a turn's sleep on the calling thread lets signals in with, if the thread holds
/// them off otherwise.
pub(super) fn let_in() -> Option<SigSet> {
    LET_IN.with(Cell::get)
}

/// Sleeps on `poll`'s descriptor for up to `timeout` (`None`: no limit) with the signal mask
/// `mask` in force (`ppoll`), then takes its events without a wait. `EINTR` if a signal's
/// handler ran meanwhile: only then, since `ppoll`, unlike `epoll_wait`, is not interrupted by a
/// stop and a `SIGCONT`, or a debugger's attach.
pub(super) fn sleep_letting_in(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
    mask: SigSet,
) -> io::Result<()> {
    // The registry's descriptor is the poll's epoll instance.
    let mut fds = [PollFd::new(poll.registry().as_fd(), PollFlags::POLLIN)];
    if ppoll(&mut fds, timeout.map(TimeSpec::from_duration), Some(mask))? > 0 {
        poll.poll(events, Some(Duration::ZERO))
    } else {
        events.clear();
        Ok(())
    }
}

/// A turn's sleep on the calling thread ended with `EINTR`.
pub(super) fn note_interrupted() {
    INTERRUPTED.with(|flag| flag.set(true));
}

/// Whether a turn's sleep on the calling thread ended with `EINTR` since the last call.
pub(super) fn take_interrupted() -> bool {
    INTERRUPTED.with(|flag| flag.replace(false))
}

/// Holds the calling thread's asynchronous signals off for as long as it runs: for a thread of
/// softroce's, or of a library built on it, that runs none of the program's handlers.
pub fn hold_signals_off_for_good() {
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&holdable()), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold blocks the thread's signals, remembers the thread's own mask for the sleeps, and
    /// gives both back as it ends; holds nest.
    #[test]
    fn a_hold_blocks_and_gives_back_the_threads_mask() {
        std::thread::spawn(|| {
            let mask = || SigSet::thread_get_mask().unwrap();
            let mut own = SigSet::empty();
            own.add(Signal::SIGUSR2);
            own.thread_set_mask().unwrap();
            assert_eq!(let_in(), None);
            {
                let _held = SignalsHeld::hold().unwrap();
                assert!(mask().contains(Signal::SIGALRM) && mask().contains(Signal::SIGUSR2));
                assert!(
                    !mask().contains(Signal::SIGSEGV),
                    "faults are never held off"
                );
                assert_eq!(let_in(), Some(own));
                {
                    let _inner = SignalsHeld::hold().unwrap();
                    assert_eq!(let_in(), Some(own), "the thread's own mask still");
                }
                assert_eq!(let_in(), Some(own));
            }
            assert_eq!(let_in(), None);
            assert_eq!(mask(), own);
        })
        .join()
        .unwrap();
    }
}
