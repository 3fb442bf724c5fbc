//! What passes between the application's threads and the engine's turns one request at a
//! time: the work requests a QP's handles post ([`PostQueue`]) and the completions a CQ's
//! handles poll ([`Completions`]). The Rust API and the C library post and poll through the
//! same two types.
//!
//! Neither is a channel. A post is one uncontended lock and one move of the request into a
//! vector (what a provider's send-queue spinlock and WQE write are to `ibv_post_send`); the
//! engine takes everything a QP's queue holds at once, by swapping that vector with an empty
//! one of its own. That vector then goes whole to the core, which reads its requests where the
//! posts wrote them until they complete (`transport::work_queue`), and gives back an emptied
//! one; a batch the core cannot take whole (a QP in a state that refuses or flushes, or without
//! room for it all), and receives whose vector is less than half full (a single post's) into a
//! queue that did not run empty, are moved into it a request at a time, or refused there. An
//! SRQ has a posting queue of its own ([`SrqQueues`]), which the doorbell lists as it lists a
//! QP's, and whose vector the SRQ takes as a QP's receive queue does. A completion is written
//! once into a ring that its engine alone writes, without a lock, and read once by a poll,
//! under a lock that the polls take, and the engine only to wake a thread blocked in a wait: a
//! delivery does not wait for a poll, nor a poll for a delivery. A poll of an empty CQ takes no
//! lock: it reads each ring's tally of completions published and taken. A blocked wait holds
//! the lock while it looks.
//!
//! Neither allocates per request once warm. A post queue's vector circulates: the engine trades
//! it for an emptied one the core kept, or keeps it when the core moved a single receive out of
//! it, with its capacity (up to four depths of them a queue, `transport::work_queue`), so a QP
//! costs memory only once it is used, and only for what its traffic keeps in flight: the
//! channels these replaced reserved their whole depth at creation, which 1000 idle QPs paid in
//! full. A CQ's ring reserves its capacity at creation, as a NIC's CQ is a ring of its size,
//! and its memory is touched as completions are first written there. The depths are held
//! elsewhere: posts by the QP's or SRQ's slots ([`crate::transport::QueueSlots`], taken before
//! a push), completions by each ring's capacity.

use std::sync::atomic::{
    fence, AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
    Ordering::SeqCst,
};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::transport::{Line, QueueSlots, RecvWr, SendWr, SrqId, WorkCompletion};
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
    // Inlined into the post, so that the request is moved once, into the vector, rather than
    // into this call's argument first.
    #[inline]
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

/// What the engine's doorbell lists as posted to: a QP, or an SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostedTo {
    Qp(Qpn),
    Srq(SrqId),
}

impl PostedTo {
    /// An order to sort by, so that a QP listed twice is looked at once.
    pub(super) fn key(self) -> (bool, u32) {
        match self {
            PostedTo::Qp(qpn) => (false, qpn.value()),
            PostedTo::Srq(SrqId(id)) => (true, id),
        }
    }
}

/// A queue the application posts to, which the doorbell lists when a post finds it unlisted.
pub(crate) trait OnDoorbell {
    /// Set while it is on the engine's list (`Doorbell::ready`).
    fn listed(&self) -> &AtomicBool;
    /// What the list names it by.
    fn posted(&self) -> PostedTo;
}

/// The application's ends of a QP's queues.
#[derive(Debug, Clone)]
pub(crate) struct QpQueues {
    pub send: Arc<PostQueue<SendWr>>,
    pub recv: Arc<PostQueue<RecvWr>>,
    /// The QP's outstanding requests, which a post takes a slot of first (exact depths).
    pub slots: Arc<QueueSlots>,
    pub(super) qpn: Qpn,
    /// Set while the QP is on the engine's list of QPs posted to (`Doorbell::ready`).
    pub(super) listed: Arc<AtomicBool>,
}

impl OnDoorbell for QpQueues {
    fn listed(&self) -> &AtomicBool {
        &self.listed
    }

    fn posted(&self) -> PostedTo {
        PostedTo::Qp(self.qpn)
    }
}

/// The application's end of an SRQ's posting queue: receives posted without a round trip to
/// the engine, as a QP's are.
#[derive(Debug, Clone)]
pub(crate) struct SrqQueues {
    pub recv: Arc<PostQueue<RecvWr>>,
    /// The SRQ's outstanding requests: a post takes a slot, a QP taking the request from the
    /// SRQ gives it back.
    pub slots: Arc<QueueSlots>,
    /// Its size as the last resize the engine applied left it, which posts are held to.
    pub max_wr: Arc<AtomicUsize>,
    pub(super) id: SrqId,
    pub(super) listed: Arc<AtomicBool>,
}

impl SrqQueues {
    /// The SRQ's number.
    pub fn id(&self) -> SrqId {
        self.id
    }
}

impl OnDoorbell for SrqQueues {
    fn listed(&self) -> &AtomicBool {
        &self.listed
    }

    fn posted(&self) -> PostedTo {
        PostedTo::Srq(self.id)
    }
}

/// The engine's end of an SRQ's posting queue; dropping it closes the queue.
#[derive(Debug)]
pub(super) struct SrqPosts {
    pub recv: Arc<PostQueue<RecvWr>>,
    pub recvs: Vec<RecvWr>,
    pub listed: Arc<AtomicBool>,
    pub max_wr: Arc<AtomicUsize>,
}

impl SrqPosts {
    /// The posting queue of an SRQ of `max_wr`: the engine's end, and the application's.
    pub(super) fn open(id: SrqId, max_wr: usize, slots: Arc<QueueSlots>) -> (SrqPosts, SrqQueues) {
        let queues = SrqQueues {
            recv: PostQueue::new(),
            slots,
            max_wr: Arc::new(AtomicUsize::new(max_wr)),
            id,
            listed: Arc::new(AtomicBool::new(false)),
        };
        let posts = SrqPosts {
            recv: Arc::clone(&queues.recv),
            recvs: Vec::new(),
            listed: Arc::clone(&queues.listed),
            max_wr: Arc::clone(&queues.max_wr),
        };
        (posts, queues)
    }
}

impl Drop for SrqPosts {
    fn drop(&mut self) {
        self.recv.close();
    }
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
    pub(super) fn open(qpn: Qpn, slots: Arc<QueueSlots>) -> (QpPosts, QpQueues) {
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

/// A CQ's completions on their way from its engines to the application's polls: one ring
/// per engine, which that engine alone writes ([`CompletionRing`]) and the polls read.
///
/// The engine takes no lock to deliver. It writes completions into free slots and publishes
/// them with one store of the ring's tail a turn; a poll reads them from their slots and frees
/// them with one store of the head. The polls take a lock among themselves (the application
/// may poll one CQ from several threads, as libibverbs allows) which the engine never takes,
/// except to wake a thread blocked in [`pop_within`](Completions::pop_within). A poll that
/// finds every ring's [`Tally`] even takes no lock: programs spin on empty polls.
///
/// A ring holds up to the CQ's capacity: with several engines, each may fill its own, as each
/// engine's core has a CQ of that capacity behind it. A ring reserves its slots at creation
/// and touches none until a completion is written there.
#[derive(Debug)]
pub(crate) struct Completions {
    polls: Mutex<Rings>,
    /// Each ring's counts, in the rings' order.
    tallies: Box<[Tally]>,
    /// The engines that have not let go: at none, and no completion left, the device has
    /// stopped.
    live: AtomicUsize,
    /// Threads blocked in `pop_within`: a delivery wakes `arrived` only if there are any.
    sleepers: AtomicUsize,
    arrived: Condvar,
}

/// How many completions one ring has had published and taken, each written by its one side
/// alone (the engine; a poll under the lock) and read by the polls without the lock, each on
/// a line of its own.
#[derive(Debug, Default)]
struct Tally {
    published: Line,
    taken: Line,
}

impl Tally {
    /// Whether all it had published has been taken, as far as this thread has seen: a ring
    /// found even may have had more published since, which the next poll sees; one found
    /// uneven may be empty (its engine committed and has not counted yet, or another poll's
    /// count is not seen yet), which the poll's look under the lock settles.
    fn even(&self) -> bool {
        self.published.0.load(Acquire) == self.taken.0.load(Acquire)
    }

    /// Adds `n` to a count that only the caller writes.
    fn add(count: &AtomicUsize, n: usize) {
        count.store(count.load(Relaxed).wrapping_add(n), Release);
    }
}

/// The polls' ends of the rings.
#[derive(Debug)]
struct Rings {
    rings: Vec<rtrb::Consumer<WorkCompletion>>,
    /// The ring a poll reads first: each in turn, so that one busy engine does not keep a
    /// poll of few entries from another's completions.
    next: usize,
}

/// An engine's end of a CQ's completions. Dropping it lets go: once every engine has, the
/// polls, after the last completion, learn that the device has stopped.
#[derive(Debug)]
pub(crate) struct CompletionRing {
    /// `None` once the engine has let go ([`let_go`](Self::let_go)).
    ring: Option<rtrb::Producer<WorkCompletion>>,
    completions: Arc<Completions>,
    /// Its index among the CQ's rings and tallies.
    index: usize,
}

impl Completions {
    /// A CQ's queue of up to `capacity` completions from each of `engines` engines, and the
    /// engines' ends, one each.
    pub(crate) fn new(capacity: usize, engines: usize) -> (Arc<Completions>, Vec<CompletionRing>) {
        let (producers, consumers): (Vec<_>, Vec<_>) = (0..engines)
            .map(|_| rtrb::RingBuffer::new(capacity.max(1)))
            .unzip();
        let completions = Arc::new(Completions {
            polls: Mutex::new(Rings {
                rings: consumers,
                next: 0,
            }),
            tallies: (0..engines).map(|_| Tally::default()).collect(),
            live: AtomicUsize::new(engines),
            sleepers: AtomicUsize::new(0),
            arrived: Condvar::new(),
        });
        let ends = producers
            .into_iter()
            .enumerate()
            .map(|(index, ring)| CompletionRing {
                ring: Some(ring),
                completions: Arc::clone(&completions),
                index,
            })
            .collect();
        (completions, ends)
    }

    /// Whether the engines have all let go and every completion has been taken: the device
    /// has stopped, for good. Read in this order: an engine publishes its last completions
    /// before it lets go, so the tallies read after seeing none live are final, but for
    /// another poll's taking, which can only make this say "not yet" once more.
    pub(crate) fn stopped(&self) -> bool {
        self.let_go() && self.looks_empty()
    }

    /// Whether every engine has let go of the queue (its device stopped): completions may
    /// still wait in it, but no more come.
    pub(crate) fn let_go(&self) -> bool {
        self.live.load(SeqCst) == 0
    }

    /// Whether every ring's tally is even: no lock, a few loads.
    fn looks_empty(&self) -> bool {
        self.tallies.iter().all(Tally::even)
    }

    /// Whether completions wait for a poll, as far as this thread has seen (a ring's tally is
    /// uneven): no lock.
    pub(crate) fn waiting(&self) -> bool {
        !self.looks_empty()
    }

    /// Up to `max` completions, oldest first per engine, each handed to `each`; how many.
    /// `None` if there were none because the engines have all let go.
    pub(crate) fn take_each(
        &self,
        max: usize,
        mut each: impl FnMut(WorkCompletion),
    ) -> Option<usize> {
        let mut taken = 0;
        // Filled and emptied in place: a batch returned from the lock's block would be copied
        // whole, all POLL_BATCH slots, on the way out and again into its iterator.
        let mut batch: SmallVec<[WorkCompletion; POLL_BATCH]> = SmallVec::new();
        if self.looks_empty() {
            return (!self.stopped()).then_some(0);
        }
        let mut stopped = false;
        while taken < max {
            let want = (max - taken).min(POLL_BATCH);
            {
                let mut rings = locked(&self.polls);
                rings.take_into(&self.tallies, &mut batch, want);
                if batch.is_empty() {
                    stopped = taken == 0 && self.stopped();
                    break;
                }
            }
            let got = batch.len();
            taken += got;
            batch.drain(..).for_each(&mut each);
            if got < want {
                // The rings held no more: what came since is the next poll's.
                break;
            }
        }
        (!stopped).then_some(taken)
    }

    /// The oldest completion of an engine, if one waits.
    pub(crate) fn try_pop(&self) -> Option<WorkCompletion> {
        if self.looks_empty() {
            return None;
        }
        locked(&self.polls).pop(&self.tallies)
    }

    /// An engine's oldest completion, waiting up to `timeout` for one; `None` at the timeout
    /// or once the engines have all let go ([`stopped`](Self::stopped) tells which).
    pub(crate) fn pop_within(&self, timeout: Duration) -> Option<WorkCompletion> {
        // A timeout past the clock's range (`Duration::MAX`) waits as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        let mut rings = locked(&self.polls);
        loop {
            // Counted before the rings are read: a delivery that the read below misses reads
            // the count after its own publication (the fences), finds this sleeper, and takes
            // the lock to wake it, which it can do only once this thread waits.
            self.sleepers.fetch_add(1, SeqCst);
            fence(SeqCst);
            // Whether the engines have let go, read before the rings: a ring found empty after
            // its engine let go is empty for good, but one read before may since have had the
            // engine's last completions published, and then its letting go.
            let gone = self.live.load(SeqCst) == 0;
            let wc = rings.pop(&self.tallies);
            let left = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if wc.is_some() || gone || left.is_zero() {
                self.sleepers.fetch_sub(1, SeqCst);
                return wc;
            }
            rings = match self.arrived.wait_timeout(rings, left) {
                Ok((rings, _)) => rings,
                Err(poisoned) => poisoned.into_inner().0,
            };
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }

    /// Whether a completion waits; for a moment after a take, perhaps yes when none does.
    pub(crate) fn has_mail(&self) -> bool {
        !self.looks_empty()
    }

    /// Wakes the threads blocked in `pop_within`, if any. Called after a publication (of a
    /// completion, or of an engine letting go), which the fence orders before the count's
    /// read.
    fn wake_sleepers(&self) {
        fence(SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            // A sleeper holds the lock from before it counts itself until it waits.
            drop(locked(&self.polls));
            self.arrived.notify_all();
        }
    }
}

impl Rings {
    /// Moves up to `max` completions into `batch`, reading the rings from `next` on.
    fn take_into(
        &mut self,
        tallies: &[Tally],
        batch: &mut SmallVec<[WorkCompletion; POLL_BATCH]>,
        max: usize,
    ) {
        for i in self.order() {
            let ring = &mut self.rings[i];
            let n = ring.slots().min(max - batch.len());
            if n == 0 {
                continue;
            }
            if let Ok(chunk) = ring.read_chunk(n) {
                chunk.into_iter().for_each(|wc| batch.push(wc));
                Tally::add(&tallies[i].taken.0, n);
            }
        }
    }

    fn pop(&mut self, tallies: &[Tally]) -> Option<WorkCompletion> {
        let (i, wc) = self
            .order()
            .find_map(|i| Some((i, self.rings[i].pop().ok()?)))?;
        Tally::add(&tallies[i].taken.0, 1);
        Some(wc)
    }

    /// The rings' indices in the order this poll reads them, from `next` on; the next poll
    /// starts one further.
    fn order(&mut self) -> impl Iterator<Item = usize> {
        let (start, count) = (self.next, self.rings.len());
        self.next = if start + 1 >= count { 0 } else { start + 1 };
        (start..count).chain(0..start)
    }
}

impl CompletionRing {
    /// The engine's delivery: completions from `next` while its ring has room, each shown to
    /// `each` as it goes in; how many went in. `next` is not called once the ring is full, so
    /// the core keeps what does not fit (and overruns its own CQ if that fills too).
    pub(super) fn deliver(
        &mut self,
        mut next: impl FnMut() -> Option<WorkCompletion>,
        mut each: impl FnMut(&WorkCompletion),
    ) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        // Most turns have nothing for most CQs: the core is asked before a chunk is taken,
        // whose commit, even of nothing, would store the ring's tail.
        let room = ring.slots();
        if room == 0 {
            return 0;
        }
        let Some(first) = next() else {
            return 0;
        };
        each(&first);
        let chunk = ring
            .write_chunk_uninit(room)
            .expect("a ring's free slots only grow between its producer's looks");
        let delivered =
            chunk.fill_from_iter(std::iter::once(first).chain(std::iter::from_fn(|| {
                let wc = next()?;
                each(&wc);
                Some(wc)
            })));
        Tally::add(&self.completions.tallies[self.index].published.0, delivered);
        self.completions.wake_sleepers();
        delivered
    }

    /// Whether the application has taken every completion this ring was handed: it polls this
    /// CQ, and so takes what comes next in its next call.
    pub(super) fn drained(&self) -> bool {
        self.ring
            .as_ref()
            .is_some_and(|ring| ring.slots() == ring.buffer().capacity())
    }

    /// Lets go of the ring (the CQ was destroyed on this engine, or the engine stopped): once
    /// every engine has, the polls, after the last completion, learn that the device is gone,
    /// and sleepers wake to learn it now.
    pub(super) fn let_go(&mut self) {
        if self.ring.take().is_some() {
            // After its last publication, which a poll that sees none live then sees.
            self.completions.live.fetch_sub(1, SeqCst);
            self.completions.wake_sleepers();
        }
    }
}

impl Drop for CompletionRing {
    fn drop(&mut self) {
        self.let_go();
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use std::collections::VecDeque;

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

    /// Delivers the completions numbered `ids` through `ring`; how many went in.
    fn deliver(ring: &mut CompletionRing, ids: impl IntoIterator<Item = u64>) -> usize {
        let mut next = ids.into_iter().map(wc);
        ring.deliver(|| next.next(), |_| {})
    }

    #[test]
    fn delivery_stops_at_the_capacity_and_leaves_the_rest_with_the_core() {
        let (completions, mut rings) = Completions::new(3, 1);
        let mut core: VecDeque<_> = (0..5).map(wc).collect();
        let mut shown = 0;
        assert_eq!(rings[0].deliver(|| core.pop_front(), |_| shown += 1), 3);
        assert_eq!(
            (shown, core.len()),
            (3, 2),
            "the core keeps what did not fit"
        );
        assert_eq!(ids(&completions, 2), Some(vec![0, 1]));
        assert_eq!(rings[0].deliver(|| core.pop_front(), |_| {}), 2);
        assert_eq!(ids(&completions, 10), Some(vec![2, 3, 4]));
        assert_eq!(ids(&completions, 10), Some(vec![]));
    }

    #[test]
    fn a_poll_learns_the_device_stopped_only_after_the_last_completion() {
        let (completions, mut rings) = Completions::new(64, 2);
        deliver(&mut rings[0], 0..40);
        drop(rings.remove(0));
        assert!(!completions.stopped(), "one engine still delivers");
        drop(rings);
        assert!(!completions.stopped(), "completions wait");
        assert_eq!(ids(&completions, 100).map(|v| v.len()), Some(40));
        assert!(completions.stopped());
        assert_eq!(ids(&completions, 100), None);
        assert!(completions.pop_within(Duration::from_secs(5)).is_none());
    }

    #[test]
    fn each_engines_ring_is_read_in_turn_and_in_its_own_order() {
        let (completions, mut rings) = Completions::new(64, 2);
        deliver(&mut rings[0], 0..40);
        deliver(&mut rings[1], 100..102);
        // A poll of one entry at a time still reaches the second engine's completions.
        let first_two: Vec<_> = (0..2)
            .filter_map(|_| completions.try_pop())
            .map(|wc| wc.wr_id)
            .collect();
        assert_eq!(first_two, [0, 100]);
        // Polls that take a batch turn likewise.
        let next_two = [ids(&completions, 1), ids(&completions, 1)];
        assert_eq!(next_two, [Some(vec![1]), Some(vec![101])]);
        assert_eq!(ids(&completions, 100), Some((2..40).collect()));
    }

    /// Programs spin on empty polls: one must not take the polls' lock, which a poll of
    /// another thread may hold, nor make the engine's wake-up wait for it.
    #[test]
    fn a_poll_of_an_empty_cq_takes_no_lock() {
        let (completions, mut rings) = Completions::new(8, 2);
        deliver(&mut rings[1], [1]);
        assert_eq!(ids(&completions, 4), Some(vec![1]));
        // What the polls find with the lock held elsewhere: the engines live, then let go.
        let look = || {
            let held = locked(&completions.polls);
            let (done, finished) = std::sync::mpsc::channel();
            thread::scope(|s| {
                s.spawn(|| {
                    let found = (
                        completions.take_each(4, drop),
                        completions.try_pop().map(|wc| wc.wr_id),
                        completions.has_mail(),
                        completions.stopped(),
                    );
                    done.send(found).unwrap();
                });
                let found = finished.recv_timeout(Duration::from_secs(10));
                drop(held);
                found.expect("a poll waited for the lock")
            })
        };
        assert_eq!(look(), (Some(0), None, false, false));
        drop(rings);
        assert_eq!(
            look(),
            (None, None, false, true),
            "the stop, without the lock too"
        );
    }

    #[test]
    fn a_poll_may_poll_the_same_cq_from_its_closure() {
        let (completions, mut rings) = Completions::new(64, 1);
        deliver(&mut rings[0], 0..4);
        let mut inner = Vec::new();
        let taken = completions.take_each(1, |_| {
            completions.take_each(10, |wc| inner.push(wc.wr_id));
        });
        assert_eq!((taken, inner), (Some(1), vec![1, 2, 3]));
    }

    #[test]
    fn a_blocked_wait_wakes_at_a_delivery_and_at_the_stop() {
        let (completions, mut rings) = Completions::new(8, 1);
        let mut ring = rings.pop().unwrap();
        thread::scope(|s| {
            let waiter = s.spawn(|| completions.pop_within(Duration::from_secs(30)));
            // Delivered whether the waiter sleeps already or not yet.
            thread::sleep(Duration::from_millis(20));
            deliver(&mut ring, [9]);
            assert_eq!(waiter.join().unwrap().map(|wc| wc.wr_id), Some(9));
            // No deadline at all: only the stop ends this wait.
            let waiter = s.spawn(|| completions.pop_within(Duration::MAX));
            thread::sleep(Duration::from_millis(20));
            drop(ring);
            assert!(waiter.join().unwrap().is_none());
            assert!(completions.stopped());
        });
    }

    /// The engines write while threads poll and wait: every completion arrives once, each
    /// engine's in its order, and the wait ends when the engines let go, not at its deadline.
    #[test]
    fn engines_and_pollers_at_once_lose_and_repeat_nothing() {
        const EACH: u64 = 20_000;
        let (completions, rings) = Completions::new(32, 2);
        let taken = thread::scope(|s| {
            for (engine, mut ring) in rings.into_iter().enumerate() {
                s.spawn(move || {
                    let base = engine as u64 * EACH;
                    let mut next = base;
                    while next < base + EACH {
                        next += deliver(&mut ring, next..base + EACH) as u64;
                    }
                });
            }
            let poller = s.spawn(|| {
                let mut ids = Vec::new();
                while completions.take_each(7, |wc| ids.push(wc.wr_id)).is_some() {}
                ids
            });
            let waiter = s.spawn(|| {
                let mut ids = Vec::new();
                while let Some(wc) = completions.pop_within(Duration::from_secs(60)) {
                    ids.push(wc.wr_id);
                }
                assert!(completions.stopped(), "the wait ended at its deadline");
                ids
            });
            [poller.join().unwrap(), waiter.join().unwrap()]
        });
        assert!(completions.stopped());
        for ids in &taken {
            for engine in 0..2 {
                let own: Vec<_> = ids.iter().filter(|&&id| id / EACH == engine).collect();
                assert!(own.is_sorted(), "an engine's completions in its order");
            }
        }
        let mut all: Vec<_> = taken.concat();
        all.sort_unstable();
        assert_eq!(all, (0..2 * EACH).collect::<Vec<_>>());
    }
}
