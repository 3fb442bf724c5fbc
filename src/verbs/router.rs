//! [`CompletionRouter`]: a request posted through it is a future of its own completion, beside
//! the CQ loop for applications that would rather await each request than sort a CQ's
//! completions themselves.
//!
//! The router owns a CQ's completions: it posts each request with a `wr_id` of its own (a
//! slot's index and generation), and whichever of its futures is polled takes what the CQ
//! holds and hands each completion to its slot, waking the task that awaits it. The CQ's
//! waker is the router's own, which wakes every task still waiting: no task's choice to do
//! something else for a while (a `select!` arm, a timeout retried later) can leave the others
//! unwoken. A post, and a future dropped before its completion, take what the CQ holds too, so
//! requests posted and let go of (a send whose completion nobody awaits) do not pile up in it.
//! Nothing here runs unless it is used: a CQ without a router is as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use smallvec::SmallVec;

use super::{CompletionQueue, QueuePair, Result, SharedReceiveQueue};
use crate::engine::Watch;
use crate::transport::{RecvWr, SendWr, WorkCompletion};

/// Posts requests on QPs (and SRQs) whose completions all go to one CQ, each as a future
/// that resolves with its own completion (its `wr_id` the caller's). Clones share the router;
/// the futures own what they need, so they may be spawned.
///
/// The router must see every completion of its CQ: post every request of the QPs that use the
/// CQ through it, and do not poll the CQ elsewhere. A completion it cannot route (a request
/// posted around it) is dropped and counted ([`strays`](Self::strays)). Send requests are
/// posted signaled: each has a completion to await.
///
/// ```
/// use softroce::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = Device::open(DeviceConfig::udp("127.0.0.49".parse()?))?;
/// let (pd, cq) = (device.alloc_pd()?, device.create_cq(16)?);
/// let router = CompletionRouter::new(cq.clone());
/// let mr = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
/// let (a, b) = (
///     pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?,
///     pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?,
/// );
/// let options = ConnectOptions::default();
/// a.connect(&b.endpoint(), &options)?;
/// b.connect(&a.endpoint(), &options)?;
/// mr.write(0, b"value")?;
/// // A READ of the region's first bytes into its second half, awaited by itself.
/// let wc = router.send(&a, SendWr::read(7, mr.sge(2048, 5)?, mr.remote()))?.await?;
/// assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
/// let mut value = [0; 5];
/// mr.read(2048, &mut value)?;
/// assert_eq!(&value, b"value");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CompletionRouter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cq: CompletionQueue,
    slots: Arc<Mutex<Slots>>,
    /// The CQ's waker while a future waits: wakes every waiting task ([`WakeAll`]).
    waker: Waker,
    wake_all: Arc<WakeAll>,
}

/// The router's waker: wakes every task that waits for a request's completion, the one that
/// polled last first, before it takes the slots' lock (an application thread posting or
/// polling meanwhile holds it: waking the likeliest taker after it doubled the time of an
/// awaited WRITE). It holds the slots alone, not the CQ: the engine that wakes it may hold the
/// last reference, and must not be the one that destroys the CQ.
#[derive(Debug)]
struct WakeAll {
    slots: Arc<Mutex<Slots>>,
    /// The task that polled last: woken first, with no other lock on the way.
    last: Mutex<Option<Waker>>,
}

impl WakeAll {
    /// Notes the task that polls now, to be woken first.
    fn polled_by(&self, waker: &Waker) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if !last.as_ref().is_some_and(|kept| kept.will_wake(waker)) {
            *last = Some(waker.clone());
        }
    }
}

impl Wake for WakeAll {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(last) = &last {
            last.wake_by_ref();
        }
        let mut woken = Woken::new();
        lock(&self.slots).wake_waiters(&mut woken);
        woken.retain(|w| !last.as_ref().is_some_and(|l| l.will_wake(w)));
        wake(woken);
    }
}

/// The tasks to wake, woken once the slots' lock is let go of: a task woken under it would
/// run at once on the other CPU, find the lock held, and sleep on it again.
type Woken = SmallVec<[Waker; 4]>;

fn wake(woken: Woken) {
    for waker in woken {
        waker.wake();
    }
}

fn lock(slots: &Mutex<Slots>) -> MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The requests in flight, by slot: reused, so a steady stream allocates nothing.
#[derive(Debug, Default)]
struct Slots {
    slots: Vec<Slot>,
    /// The generation of each slot, which the `wr_id` it posts with carries: a completion of
    /// a slot's earlier request is told from its current one.
    generations: Vec<u32>,
    free: Vec<u32>,
    strays: u64,
}

#[derive(Debug)]
enum Slot {
    Free,
    /// Posted; the caller's `wr_id`, and the task to wake.
    Waiting {
        wr_id: u64,
        waker: Option<Waker>,
    },
    /// Its completion came, and waits for its future.
    Done(WorkCompletion),
    /// Its future was dropped: the completion, when it comes, frees the slot.
    Abandoned,
}

impl Slots {
    /// A free slot for a request of the caller's `wr_id`: its index and generation.
    fn take(&mut self, wr_id: u64) -> (u32, u32) {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot::Free);
            self.generations.push(0);
            (self.slots.len() - 1) as u32
        });
        let at = index as usize;
        self.generations[at] = self.generations[at].wrapping_add(1);
        self.slots[at] = Slot::Waiting { wr_id, waker: None };
        (index, self.generations[at])
    }

    fn release(&mut self, index: u32) {
        self.slots[index as usize] = Slot::Free;
        self.free.push(index);
    }

    /// Hands `wc` to the slot its `wr_id` names, its task to be woken; counts one that names
    /// none.
    fn route(&mut self, mut wc: WorkCompletion, woken: &mut Woken) {
        let (index, generation) = ((wc.wr_id & 0xffff_ffff) as u32, (wc.wr_id >> 32) as u32);
        let at = index as usize;
        if self.generations.get(at) != Some(&generation) {
            self.strays += 1;
            return;
        }
        match std::mem::replace(&mut self.slots[at], Slot::Free) {
            Slot::Waiting { wr_id, waker } => {
                wc.wr_id = wr_id;
                self.slots[at] = Slot::Done(wc);
                woken.extend(waker);
            }
            Slot::Abandoned => self.release(index),
            other => {
                self.slots[at] = other;
                self.strays += 1;
            }
        }
    }

    /// Every task still waiting, to be woken: one of them takes what the CQ holds.
    fn wake_waiters(&self, woken: &mut Woken) {
        for slot in &self.slots {
            if let Slot::Waiting {
                waker: Some(waker), ..
            } = slot
            {
                woken.push(waker.clone());
            }
        }
    }
}

/// The `wr_id` a request of slot `index`, generation `generation`, is posted with.
fn routed_id(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl CompletionRouter {
    /// A router of `cq`'s completions.
    pub fn new(cq: CompletionQueue) -> CompletionRouter {
        let slots = Arc::new(Mutex::new(Slots::default()));
        let wake_all = Arc::new(WakeAll {
            slots: Arc::clone(&slots),
            last: Mutex::new(None),
        });
        let waker = Waker::from(Arc::clone(&wake_all));
        CompletionRouter {
            inner: Arc::new(Inner {
                cq,
                slots,
                waker,
                wake_all,
            }),
        }
    }

    /// Posts `wr` on `qp` (signaled), as [`QueuePair::post_send`]: refused at the call as it
    /// is; else its completion, as a future.
    pub fn send(&self, qp: &QueuePair, mut wr: SendWr) -> Result<Routed> {
        wr.signaled = true;
        self.post(wr.wr_id, |routed| {
            wr.wr_id = routed;
            qp.post_send(wr)
        })
    }

    /// Posts `wr` on `qp`'s receive queue, as [`QueuePair::post_recv`]; its completion, as a
    /// future.
    pub fn recv(&self, qp: &QueuePair, mut wr: RecvWr) -> Result<Routed> {
        self.post(wr.wr_id, |routed| {
            wr.wr_id = routed;
            qp.post_recv(wr)
        })
    }

    /// Posts `wr` on `srq`, as [`SharedReceiveQueue::post_recv`]; its completion, as a future.
    /// It completes on the receive CQ of the QP that takes it: the router's CQ must be the
    /// receive CQ of every QP of the SRQ.
    pub fn srq_recv(&self, srq: &SharedReceiveQueue, mut wr: RecvWr) -> Result<Routed> {
        self.post(wr.wr_id, |routed| {
            wr.wr_id = routed;
            srq.post_recv(wr)
        })
    }

    /// Completions of the CQ that no request of the router's was waiting for, dropped.
    pub fn strays(&self) -> u64 {
        self.inner.slots().strays
    }

    /// Takes a slot for the caller's `wr_id` and posts with its `wr_id`; gives the slot back
    /// if the post is refused.
    fn post(&self, wr_id: u64, post: impl FnOnce(u64) -> Result<()>) -> Result<Routed> {
        let mut woken = Woken::new();
        let (index, generation) = {
            let mut slots = self.inner.slots();
            // What came meanwhile: the completions of requests nobody awaits leave the CQ.
            let _ = self.inner.drain(&mut slots, &mut woken);
            slots.take(wr_id)
        };
        wake(woken);
        match post(routed_id(index, generation)) {
            Ok(()) => Ok(Routed {
                inner: Arc::clone(&self.inner),
                index,
                watch: None,
                finished: false,
            }),
            Err(error) => {
                self.inner.slots().release(index);
                Err(error)
            }
        }
    }
}

impl Inner {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        lock(&self.slots)
    }

    /// Hands every completion the CQ holds to its slot; the device's error once it has
    /// stopped and every completion it flushed is taken.
    fn drain(&self, slots: &mut Slots, woken: &mut Woken) -> Result<()> {
        loop {
            match self.cq.try_next() {
                Some(Ok(wc)) => slots.route(wc, woken),
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            }
        }
    }
}

/// The completion of one request posted through a [`CompletionRouter`], as a future. Dropped
/// before it resolves, the request goes on; its completion is let go of when it comes.
#[derive(Debug)]
#[must_use = "a routed request's completion is had by awaiting it"]
pub struct Routed {
    inner: Arc<Inner>,
    index: u32,
    /// While pending on a hybrid engine: its thread runs the engine meanwhile.
    watch: Option<Watch>,
    finished: bool,
}

impl Routed {
    /// This request's completion, if it came; else notes the task to wake.
    fn take_done(&self, slots: &mut Slots, waker: &Waker) -> Option<WorkCompletion> {
        let at = self.index as usize;
        if let Slot::Waiting { waker: kept, .. } = &mut slots.slots[at] {
            if !kept.as_ref().is_some_and(|k| k.will_wake(waker)) {
                *kept = Some(waker.clone());
            }
            return None;
        }
        let Slot::Done(wc) = std::mem::replace(&mut slots.slots[at], Slot::Free) else {
            return None;
        };
        slots.release(self.index);
        Some(wc)
    }
}

impl Future for Routed {
    type Output = Result<WorkCompletion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Its slot may serve another request by now: polled again, it would take that one's.
        assert!(!self.finished, "a Routed polled after it resolved");
        let cq = &self.inner.cq;
        let engine = cq.inner.device.engine();
        if engine.calls_only() {
            // An engine that has stopped has no completions to add: the queue says the rest.
            let _ = engine.drive();
        }
        // Twice at most: a completion delivered before the CQ's waker was in place woke
        // nobody, and is taken by the second look.
        for armed in [false, true] {
            let mut woken = Woken::new();
            let mut slots = self.inner.slots();
            let drained = self.inner.drain(&mut slots, &mut woken);
            if let Some(wc) = self.take_done(&mut slots, cx.waker()) {
                drop(slots);
                wake(woken);
                self.finished = true;
                return Poll::Ready(Ok(wc));
            }
            if let Err(error) = drained {
                // The device stopped, and every completion it flushed is taken: this
                // request's will never come. The others learn it as they look.
                slots.release(self.index);
                slots.wake_waiters(&mut woken);
                drop(slots);
                wake(woken);
                self.finished = true;
                return Poll::Ready(Err(error));
            }
            drop(slots);
            wake(woken);
            if !armed {
                self.inner.wake_all.polled_by(cx.waker());
                cq.inner.notify.wait_with(&self.inner.waker);
            }
        }
        if engine.calls_only() {
            cx.waker().wake_by_ref();
        } else if self.watch.is_none() {
            self.watch = engine.watchers().map(|watchers| watchers.begin());
        }
        Poll::Pending
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut slots = self.inner.slots();
        let at = self.index as usize;
        match slots.slots[at] {
            // Came meanwhile: nobody will take it.
            Slot::Done(_) => slots.release(self.index),
            Slot::Waiting { .. } => slots.slots[at] = Slot::Abandoned,
            Slot::Free | Slot::Abandoned => {}
        }
        // Its completion may be in the CQ already, with no future left to take it.
        let mut woken = Woken::new();
        let _ = self.inner.drain(&mut slots, &mut woken);
        drop(slots);
        wake(woken);
    }
}
