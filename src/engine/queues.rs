//! What passes between the application's threads and the engine's turns one request at a
//! time: the work requests a QP's handles post ([`PostQueue`]) and the completions a CQ's
//! handles poll ([`Completions`]). The Rust API and the C library post and poll through the
//! same two types.
//!
//! Neither is a channel. A post is one uncontended lock and one move of the request into a
//! vector (what a provider's send-queue spinlock and WQE write are to `ibv_post_send`); the
//! engine takes everything a QP's queue holds at once, by swapping that vector with an empty
//! one of its own, and moves each request once more, into the core's queue. A completion is
//! moved once into the CQ's queue, under one lock per CQ per turn, and once out of it by the
//! poll; a poll of an empty CQ reads one counter and takes no lock.
//!
//! Neither allocates per request. Both keep the capacity their vectors grew to, so a QP or CQ
//! costs memory only once it is used, and only as much as its deepest backlog: the channels
//! these replace reserved their whole depth at creation, which 1000 idle QPs paid in full.
//! Their depths are held elsewhere: posts by the QP's slots ([`crate::transport::QueueSlots`],
//! taken before a push), completions by the CQ's capacity, checked under the lock here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::transport::{RecvWr, SendWr, WorkCompletion};
use crate::wire::Qpn;

/// Takes `lock` whatever a panic left behind: nothing below panics while holding one (a
/// push, a swap, a pop), and a queue must not turn one bug into a second panic.
fn locked<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One of a QP's work queues on its way from the application to the engine.
#[derive(Debug)]
pub(crate) struct PostQueue<T> {
    posted: Mutex<Posted<T>>,
}

#[derive(Debug)]
struct Posted<T> {
    requests: Vec<T>,
    /// False once the engine has let go of the QP: posts are refused from then on.
    open: bool,
}

impl<T> PostQueue<T> {
    pub(crate) fn new() -> Arc<PostQueue<T>> {
        Arc::new(PostQueue {
            posted: Mutex::new(Posted {
                requests: Vec::new(),
                open: true,
            }),
        })
    }

    /// Queues `wr` for the engine's next turn; gives it back if the engine has let go of the
    /// QP (the device stopped).
    pub(crate) fn push(&self, wr: T) -> Result<(), T> {
        let mut posted = locked(&self.posted);
        if !posted.open {
            return Err(wr);
        }
        posted.requests.push(wr);
        Ok(())
    }

    /// Moves everything posted to the end of `batch`, in posting order. When `batch` is empty
    /// (the usual case) the two vectors trade places, so that nothing is moved and each keeps
    /// its capacity.
    pub(super) fn take_into(&self, batch: &mut Vec<T>) {
        let mut posted = locked(&self.posted);
        if batch.is_empty() {
            std::mem::swap(&mut posted.requests, batch);
        } else {
            batch.append(&mut posted.requests);
        }
    }

    /// Refuses posts from now on; returns what was posted and never taken.
    pub(super) fn close(&self) -> Vec<T> {
        let mut posted = locked(&self.posted);
        posted.open = false;
        std::mem::take(&mut posted.requests)
    }
}

/// The application's ends of a QP's queues.
#[derive(Debug, Clone)]
pub(crate) struct QpQueues {
    pub send: Arc<PostQueue<SendWr>>,
    pub recv: Arc<PostQueue<RecvWr>>,
    /// The QP's outstanding requests, which a post takes a slot of first (exact depths).
    pub slots: Arc<crate::transport::QueueSlots>,
    pub(super) qpn: Qpn,
    /// Set while the QP is on the engine's list of QPs posted to (`Doorbell::ready`).
    pub(super) listed: Arc<AtomicBool>,
}

/// The engine's ends, and what it took from them that the core had no room for yet (taken
/// first at the next look, so posting order holds). Dropping it closes both queues.
#[derive(Debug)]
pub(super) struct QpPosts {
    pub send: Arc<PostQueue<SendWr>>,
    pub recv: Arc<PostQueue<RecvWr>>,
    pub sends: Vec<SendWr>,
    pub recvs: Vec<RecvWr>,
    pub listed: Arc<AtomicBool>,
}

impl QpPosts {
    /// A QP's queues: the engine's ends, and the application's.
    pub(super) fn open(qpn: Qpn, slots: Arc<crate::transport::QueueSlots>) -> (QpPosts, QpQueues) {
        let queues = QpQueues {
            send: PostQueue::new(),
            recv: PostQueue::new(),
            slots,
            qpn,
            listed: Arc::new(AtomicBool::new(false)),
        };
        let posts = QpPosts {
            send: Arc::clone(&queues.send),
            recv: Arc::clone(&queues.recv),
            sends: Vec::new(),
            recvs: Vec::new(),
            listed: Arc::clone(&queues.listed),
        };
        (posts, queues)
    }

    /// Lets go of the QP: every request posted and not yet in the core, sends first, each in
    /// posting order; later posts are refused.
    pub(super) fn close(mut self) -> (Vec<SendWr>, Vec<RecvWr>) {
        let mut sends = std::mem::take(&mut self.sends);
        sends.append(&mut self.send.close());
        let mut recvs = std::mem::take(&mut self.recvs);
        recvs.append(&mut self.recv.close());
        (sends, recvs)
    }
}

impl Drop for QpPosts {
    fn drop(&mut self) {
        self.send.close();
        self.recv.close();
    }
}

/// Completions a poll hands out per lock: [`Completions::take_each`] calls the caller's
/// closure with the lock released, so that the closure may do anything, polling the same CQ
/// included.
const POLL_BATCH: usize = 16;

/// A CQ's completions on their way from its engines to the application's polls.
#[derive(Debug)]
pub(crate) struct Completions {
    queue: Mutex<VecDeque<WorkCompletion>>,
    /// How many wait in `queue`, written under its lock: a poll that finds none takes no lock.
    len: AtomicUsize,
    capacity: usize,
    /// The engines that deliver here and have not let go: at none, the device has stopped,
    /// and a poll says so once the queue is empty.
    engines: AtomicUsize,
    /// Threads blocked in `take_within`: a delivery signals `arrived` only if there are any.
    sleepers: AtomicUsize,
    arrived: Condvar,
}

impl Completions {
    /// A queue of up to `capacity` completions, delivered to by `engines` engines.
    pub(crate) fn new(capacity: usize, engines: usize) -> Arc<Completions> {
        Arc::new(Completions {
            queue: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
            capacity: capacity.max(1),
            engines: AtomicUsize::new(engines),
            sleepers: AtomicUsize::new(0),
            arrived: Condvar::new(),
        })
    }

    /// The engine's delivery: completions from `next` while the queue has room, each shown to
    /// `each` as it goes in; how many went in. `next` is not called once the queue is full,
    /// so the core keeps what does not fit (and overruns its own CQ if that fills too).
    pub(super) fn deliver(
        &self,
        mut next: impl FnMut() -> Option<WorkCompletion>,
        mut each: impl FnMut(&WorkCompletion),
    ) -> usize {
        let delivered = {
            let mut queue = locked(&self.queue);
            let before = queue.len();
            while queue.len() < self.capacity {
                let Some(wc) = next() else { break };
                each(&wc);
                queue.push_back(wc);
            }
            self.len.store(queue.len(), SeqCst);
            queue.len() - before
        };
        // A sleeper counts itself under the lock before it waits: one that began waiting
        // before this delivery took the lock is counted here.
        if delivered > 0 && self.sleepers.load(SeqCst) > 0 {
            self.arrived.notify_all();
        }
        delivered
    }

    /// An engine lets go (its device stopped, or the CQ was destroyed on it): once all have,
    /// the application's polls, after the last completion, learn that the device is gone, and
    /// sleepers wake to learn it now.
    pub(super) fn let_go(&self) {
        // Under the lock: a waiter that read the count before this is asleep on `arrived`
        // already when the notification comes.
        let queue = locked(&self.queue);
        self.engines.fetch_sub(1, SeqCst);
        drop(queue);
        self.arrived.notify_all();
    }

    /// Whether the engines have all let go and every completion has been taken: the device
    /// has stopped, for good. Read in this order: an engine's last delivery comes before its
    /// letting go, so a `len` read after seeing none left is not stale.
    pub(crate) fn stopped(&self) -> bool {
        self.engines.load(SeqCst) == 0 && self.len.load(SeqCst) == 0
    }

    /// Up to `max` completions, oldest first, each handed to `each`; how many. `None` if there
    /// were none because the engines have all let go.
    pub(crate) fn take_each(
        &self,
        max: usize,
        mut each: impl FnMut(WorkCompletion),
    ) -> Option<usize> {
        let mut taken = 0;
        // Filled and emptied in place: a batch collected in the lock's block and returned
        // from it was copied whole, all POLL_BATCH slots, on the way out and again into its
        // iterator.
        let mut batch: SmallVec<[WorkCompletion; POLL_BATCH]> = SmallVec::new();
        while taken < max && self.len.load(SeqCst) > 0 {
            {
                let mut queue = locked(&self.queue);
                let n = (max - taken).min(POLL_BATCH).min(queue.len());
                batch.extend(queue.drain(..n));
                self.len.store(queue.len(), SeqCst);
            }
            if batch.is_empty() {
                break;
            }
            taken += batch.len();
            batch.drain(..).for_each(&mut each);
        }
        if taken == 0 && self.stopped() {
            return None;
        }
        Some(taken)
    }

    /// The oldest completion, if one waits.
    pub(crate) fn try_pop(&self) -> Option<WorkCompletion> {
        if self.len.load(SeqCst) == 0 {
            return None;
        }
        self.pop(&mut locked(&self.queue))
    }

    /// The oldest completion, waiting up to `timeout` for one; `None` at the timeout or once
    /// the engines have all let go ([`stopped`](Self::stopped) tells which).
    pub(crate) fn pop_within(&self, timeout: Duration) -> Option<WorkCompletion> {
        // A timeout past the clock's range (`Duration::MAX`) waits as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        let mut queue = locked(&self.queue);
        loop {
            if let Some(wc) = self.pop(&mut queue) {
                return Some(wc);
            }
            let left = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if self.engines.load(SeqCst) == 0 || left.is_zero() {
                return None;
            }
            self.sleepers.fetch_add(1, SeqCst);
            queue = match self.arrived.wait_timeout(queue, left) {
                Ok((queue, _)) => queue,
                Err(poisoned) => poisoned.into_inner().0,
            };
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }

    /// Whether a completion waits.
    pub(crate) fn has_mail(&self) -> bool {
        self.len.load(SeqCst) > 0
    }

    fn pop(&self, queue: &mut VecDeque<WorkCompletion>) -> Option<WorkCompletion> {
        let wc = queue.pop_front();
        self.len.store(queue.len(), SeqCst);
        wc
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::transport::{SgeList, WcOpcode, WcStatus};

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::Success, WcOpcode::Send, Qpn::new(17))
    }

    fn ids(completions: &Completions, max: usize) -> Option<Vec<u64>> {
        let mut ids = Vec::new();
        completions
            .take_each(max, |wc| ids.push(wc.wr_id))
            .map(|n| {
                assert_eq!(n, ids.len());
                ids
            })
    }

    #[test]
    fn posts_reach_the_engine_in_order_and_none_after_it_lets_go() {
        let queue = PostQueue::new();
        let mut batch = Vec::new();
        (0..3).for_each(|i| queue.push(i).unwrap());
        queue.take_into(&mut batch);
        assert_eq!(batch, [0, 1, 2]);
        // Left over in the batch (the core had no room): later posts go behind them.
        batch.drain(..1);
        (3..5).for_each(|i| queue.push(i).unwrap());
        queue.take_into(&mut batch);
        assert_eq!(batch, [1, 2, 3, 4]);
        queue.push(5).unwrap();
        assert_eq!(queue.close(), [5], "what was never taken comes back");
        assert_eq!(queue.push(6), Err(6), "a post after the close is refused");
        assert!(queue.close().is_empty());
    }

    #[test]
    fn a_qps_posts_are_refused_once_the_engine_drops_its_end() {
        let (posts, queues) = QpPosts::open(Qpn::new(5), Arc::default());
        queues.recv.push(RecvWr::new(1, SgeList::new())).unwrap();
        drop(posts);
        assert!(queues.recv.push(RecvWr::new(2, SgeList::new())).is_err());
    }

    #[test]
    fn delivery_stops_at_the_capacity_and_leaves_the_rest_with_the_core() {
        let completions = Completions::new(3, 1);
        let mut core: VecDeque<_> = (0..5).map(wc).collect();
        let mut shown = 0;
        assert_eq!(completions.deliver(|| core.pop_front(), |_| shown += 1), 3);
        assert_eq!(
            (shown, core.len()),
            (3, 2),
            "the core keeps what did not fit"
        );
        assert_eq!(ids(&completions, 2), Some(vec![0, 1]));
        assert_eq!(completions.deliver(|| core.pop_front(), |_| {}), 2);
        assert_eq!(ids(&completions, 10), Some(vec![2, 3, 4]));
        assert_eq!(ids(&completions, 10), Some(vec![]));
    }

    #[test]
    fn a_poll_learns_the_device_stopped_only_after_the_last_completion() {
        let completions = Completions::new(64, 2);
        let mut next = (0..40).map(wc);
        completions.deliver(|| next.next(), |_| {});
        completions.let_go();
        assert!(!completions.stopped(), "one engine still delivers");
        completions.let_go();
        assert!(!completions.stopped(), "completions wait");
        assert_eq!(ids(&completions, 100).map(|v| v.len()), Some(40));
        assert!(completions.stopped());
        assert_eq!(ids(&completions, 100), None);
        assert!(completions.pop_within(Duration::from_secs(5)).is_none());
    }

    #[test]
    fn a_poll_may_poll_the_same_cq_from_its_closure() {
        let completions = Completions::new(64, 1);
        let mut next = (0..4).map(wc);
        completions.deliver(|| next.next(), |_| {});
        let mut inner = Vec::new();
        let taken = completions.take_each(1, |_| {
            completions.take_each(10, |wc| inner.push(wc.wr_id));
        });
        assert_eq!((taken, inner), (Some(1), vec![1, 2, 3]));
    }

    #[test]
    fn a_blocked_wait_wakes_at_a_delivery_and_at_the_stop() {
        let completions = Completions::new(8, 1);
        thread::scope(|s| {
            let waiter = s.spawn(|| completions.pop_within(Duration::from_secs(30)));
            // Delivered whether the waiter sleeps already or not yet.
            thread::sleep(Duration::from_millis(20));
            let mut one = Some(wc(9));
            completions.deliver(|| one.take(), |_| {});
            assert_eq!(waiter.join().unwrap().map(|wc| wc.wr_id), Some(9));
            // No deadline at all: only the stop ends this wait.
            let waiter = s.spawn(|| completions.pop_within(Duration::MAX));
            thread::sleep(Duration::from_millis(20));
            completions.let_go();
            assert!(waiter.join().unwrap().is_none());
            assert!(completions.stopped());
        });
    }
}
