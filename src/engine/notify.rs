//! How the engine tells an application that a completion queue has news, without a thread of
//! the application's blocked on it: an eventfd that a completion channel's `poll(2)`, epoll,
//! tokio's `AsyncFd` or any reactor can watch, armed as `ibv_req_notify_cq` arms a CQ, and a
//! waker for the runtime-agnostic future.
//!
//! The engine calls [`CqNotify::delivered`] once per batch it hands to the CQ's queue, not
//! per completion: a fence and two loads when nobody waits.
//!
//! An armed CQ is a wait where no turn of the engine runs (the application sleeps on the
//! descriptor): on a hybrid engine it is counted among the [`Watchers`] from its arming to its
//! firing, so that the engine's thread runs the engine meanwhile.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;

use rustix::event::{eventfd, EventfdFlags};

use super::drive::{Watch, Watchers};

/// Not armed: completions raise no event.
const DISARMED: u8 = 0;
/// Armed for the next completion of any kind.
const NEXT: u8 = 1;
/// Armed for the next solicited completion: a receive whose message had the SE bit set, or
/// any completion in error (ibv_req_notify_cq(3)).
const SOLICITED: u8 = 2;

/// A CQ's notifier, shared by its handles and the engine.
#[derive(Debug)]
pub(crate) struct CqNotify {
    armed: AtomicU8,
    /// Readable while an armed notification has fired and not been taken.
    event: OwnedFd,
    /// A task waits for the next completion ([`waker`](Self::waker) is set).
    waiting: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// A hybrid engine's count of outside waits, and this CQ's place in it while armed. The
    /// lock is taken by an arming and by a firing only, never by a delivery that fires nothing.
    watchers: Option<Arc<Watchers>>,
    armed_watch: Mutex<Option<Watch>>,
    /// Counts each event fired, once the descriptor is readable with it
    /// ([`count_events_in`](Self::count_events_in)).
    fired: OnceLock<Arc<AtomicU64>>,
}

impl CqNotify {
    /// A notifier; `watchers` if the CQ's engine is hybrid.
    pub(crate) fn new(watchers: Option<Arc<Watchers>>) -> io::Result<CqNotify> {
        Ok(CqNotify {
            armed: AtomicU8::new(DISARMED),
            event: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            waiting: AtomicBool::new(false),
            waker: Mutex::new(None),
            watchers,
            armed_watch: Mutex::new(None),
            fired: OnceLock::new(),
        })
    }

    /// Counts each event this notifier fires in `counter` too, after its descriptor is
    /// readable with it (so a waiter that read the counter before it looked at the descriptor
    /// and found nothing learns of a later event from the counter alone). The first counter
    /// given stays; false for a later one.
    pub(crate) fn count_events_in(&self, counter: Arc<AtomicU64>) -> bool {
        self.fired.set(counter).is_ok()
    }

    /// Arms the notifier for the next completion, or only the next solicited (or failed) one.
    /// One event per arming, as `ibv_req_notify_cq`. `watched`: the wait that follows runs no
    /// turn of the engine, so a hybrid engine's thread takes the engine until the event fires;
    /// not for a waiter that runs the engine itself (`EngineHandle::drive_wait`).
    pub(crate) fn arm(&self, solicited_only: bool, watched: bool) {
        let how = if solicited_only { SOLICITED } else { NEXT };
        // Held across the update, so that a firing in between takes the watch set here.
        let mut watch = self.armed_watch();
        // A request for any completion widens one for solicited ones, never the reverse.
        let before = self
            .armed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now != NEXT).then_some(how)
            });
        if before == Ok(DISARMED) && watched {
            *watch = self.watchers.as_ref().map(Watchers::begin);
        }
        drop(watch);
        // Pairs with the fence in `delivered`, as in `wait_with`: either the engine sees the
        // notifier armed, or the caller's poll after arming sees the completion.
        fence(Ordering::SeqCst);
    }

    /// How many notifications fired since the last call (0 if none): reading the eventfd
    /// resets it, so a reactor sees it readable again only after the next one.
    pub(crate) fn take_events(&self) -> u64 {
        let mut count = [0u8; 8];
        match rustix::io::read(&self.event, &mut count) {
            Ok(8) => u64::from_ne_bytes(count),
            _ => 0,
        }
    }

    /// A task waits for the CQ's next completion: `waker` is woken when the engine delivers
    /// one. Callers look at the queue again after this, so that a completion delivered
    /// between their first look and this call is not missed.
    pub(crate) fn wait_with(&self, waker: &Waker) {
        let mut slot = self
            .waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match slot.as_ref() {
            Some(kept) if kept.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
        drop(slot);
        self.waiting.store(true, Ordering::SeqCst);
        // Pairs with the fence in `delivered`: either the engine sees `waiting`, or the
        // caller's next look at the queue sees the completion.
        fence(Ordering::SeqCst);
    }

    /// The engine delivered completions to the CQ's queue; `solicited` says whether one of
    /// them was solicited or failed.
    pub(crate) fn delivered(&self, solicited: bool) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) {
            self.wake_task();
        }
        let armed = self.armed.load(Ordering::Relaxed);
        let fires = armed == NEXT || (armed == SOLICITED && solicited);
        if fires && self.armed.swap(DISARMED, Ordering::SeqCst) != DISARMED {
            self.armed_watch().take();
            self.signal();
        }
    }

    fn armed_watch(&self) -> std::sync::MutexGuard<'_, Option<Watch>> {
        self.armed_watch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The engine stopped: whoever waits must look, and learn it from the queue.
    pub(crate) fn closed(&self) {
        self.wake_task();
        self.signal();
    }

    fn wake_task(&self) {
        self.waiting.store(false, Ordering::Relaxed);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn signal(&self) {
        // The counter saturates only after 2^64 - 2 unread events; a full counter makes the
        // write fail with EAGAIN, and the fd stays readable, which is all a reader needs.
        let _ = rustix::io::write(&self.event, &1u64.to_ne_bytes());
        if let Some(fired) = self.fired.get() {
            fired.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl AsFd for CqNotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.event.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_notifier_fires_once_and_solicited_arming_waits_for_a_solicited_batch() {
        let notify = CqNotify::new(None).unwrap();
        notify.delivered(true);
        assert_eq!(notify.take_events(), 0, "not armed: no event");
        notify.arm(false, true);
        notify.delivered(false);
        notify.delivered(false);
        assert_eq!(notify.take_events(), 1, "one event per arming");
        notify.arm(true, true);
        notify.delivered(false);
        assert_eq!(
            notify.take_events(),
            0,
            "an unsolicited batch does not fire"
        );
        notify.delivered(true);
        assert_eq!(notify.take_events(), 1);
        notify.arm(false, true);
        notify.arm(true, true);
        notify.delivered(false);
        assert_eq!(
            notify.take_events(),
            1,
            "solicited arming does not narrow NEXT"
        );
    }

    /// An armed CQ counts as one wait of a hybrid engine's application from its arming to its
    /// firing or its end, however often it is armed meanwhile.
    #[test]
    fn an_armed_notifier_is_one_watch_until_it_fires() {
        let watchers = Arc::new(Watchers::default());
        let notify = CqNotify::new(Some(watchers.clone())).unwrap();
        assert!(!watchers.any());
        notify.arm(true, true);
        notify.arm(false, true);
        notify.arm(false, true);
        assert!(watchers.any(), "armed");
        notify.delivered(false);
        assert!(!watchers.any(), "fired: one arming, one end");
        notify.arm(true, true);
        notify.delivered(false);
        assert!(watchers.any(), "an unsolicited batch fires nothing");
        drop(notify);
        assert!(!watchers.any(), "a CQ destroyed while armed ends its wait");
    }

    /// A counter given to the notifier counts each event it fires, and the stop.
    #[test]
    fn a_counter_counts_the_events_fired() {
        let notify = CqNotify::new(None).unwrap();
        let fired = Arc::new(AtomicU64::new(0));
        assert!(notify.count_events_in(fired.clone()));
        assert!(
            !notify.count_events_in(Arc::default()),
            "the first counter stays"
        );
        notify.delivered(false);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "not armed");
        notify.arm(false, false);
        notify.delivered(false);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        notify.closed();
        assert_eq!(fired.load(Ordering::SeqCst), 2);
    }

    /// Armed for a waiter that runs the engine itself, a CQ is no outside wait: the hybrid
    /// thread is not handed the engine, and the event fires all the same.
    #[test]
    fn an_arming_for_a_driving_waiter_is_no_watch() {
        let watchers = Arc::new(Watchers::default());
        let notify = CqNotify::new(Some(watchers.clone())).unwrap();
        notify.arm(false, false);
        assert!(!watchers.any());
        notify.delivered(false);
        assert_eq!(notify.take_events(), 1);
    }
}
