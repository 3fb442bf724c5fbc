//! A QP's send or receive queue as the core holds it: each work request where its post wrote
//! it, read in place until the queue's head passes it, and beside it, in the same order, the
//! little the core keeps about it (for a send, its PSNs and status). An SRQ holds its requests
//! in one too, until a QP moves one out ([`WorkQueue::pop_front`]).
//!
//! The posts write requests into a vector (the engine's posting queue, `engine::queues`), and
//! the engine hands the core that vector whole: it becomes a batch here, and the requests in it
//! are not moved again, as a NIC reads WQEs from the ring the driver wrote them into. A batch
//! is cleared, dropping its requests where they lie, once the head has passed its last request,
//! and kept, with its capacity, to be traded for the next posts' vector: in a steady stream no
//! vector is allocated. Receive queues make one exception ([`WorkQueue::take_dense`]): a
//! vector less than half full, a single post's, is moved into the tail a request at a time, so
//! that a deep queue refilled a post at a time does not hold a batch for every request.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

/// How many requests' room the emptied batches a queue keeps may hold in all, in multiples of
/// the queue's depth; past it they are freed. A stream of sends keeps as many batches in
/// circulation as it has in flight, one for each turn that took posts: up to one a request
/// when each turn finds one, and an ACK then retires up to a window of them at once, which the
/// next posts need again. A vector that one post grew from nothing has room for 4 (`Vec`'s
/// least for requests of this size), so a window of one-request batches takes 4 depths.
const SPARE_DEPTHS: usize = 4;

/// Where a request lies: slot `slot` of batch number `batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    batch: u32,
    slot: u32,
}

/// The core's state of a request, which knows where the request lies.
pub(super) trait Placed {
    fn place(&self) -> Place;
}

impl Placed for Place {
    fn place(&self) -> Place {
        *self
    }
}

/// The requests `T` of a work queue, oldest first, each with its state `S`.
#[derive(Debug)]
pub(super) struct WorkQueue<T, S> {
    /// The requests in posting order, as the posts wrote them. (A deque: a queue holds one
    /// batch for each turn that took posts, up to one a request when every turn takes a single
    /// send, or two receives; retiring one from a `Vec` would move every other's header.)
    batches: VecDeque<Vec<T>>,
    /// The number of `batches[0]`; batch numbers wrap.
    first_batch: u32,
    /// One state per request, in the same order.
    states: VecDeque<S>,
    /// Emptied batches, with their capacity, for the next posts.
    spare: Vec<Vec<T>>,
    /// The requests the spares have room for, in all.
    spare_room: usize,
}

impl<T, S> Default for WorkQueue<T, S> {
    fn default() -> Self {
        WorkQueue {
            batches: VecDeque::new(),
            first_batch: 0,
            states: VecDeque::new(),
            spare: Vec::new(),
            spare_room: 0,
        }
    }
}

impl<T, S: Placed> WorkQueue<T, S> {
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    pub fn get(&self, idx: usize) -> Option<&S> {
        self.states.get(idx)
    }

    pub fn get_mut(&mut self, idx: usize) -> Option<&mut S> {
        self.states.get_mut(idx)
    }

    pub fn iter(&self) -> impl Iterator<Item = &S> {
        self.states.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.states.iter_mut()
    }

    /// Request `idx`, where its post wrote it.
    #[inline]
    pub fn wr(&self, idx: usize) -> &T {
        self.entry(idx).1
    }

    /// The state of request `idx`, and the request.
    #[inline]
    pub fn entry(&self, idx: usize) -> (&S, &T) {
        let state = &self.states[idx];
        let Place { batch, slot } = state.place();
        let batch = &self.batches[batch.wrapping_sub(self.first_batch) as usize];
        (state, &batch[slot as usize])
    }

    /// Appends one request, moved in, with the state `state` makes of it and its place: the
    /// sans-IO posts' path, and the engine's when the core does not take its batch whole.
    /// Gives the state.
    pub fn push(&mut self, wr: T, state: impl FnOnce(&T, Place) -> S) -> &mut S {
        // A full tail is not grown: a queue that never runs empty would grow it for ever, as
        // the head passes only whole batches. A new batch starts instead.
        let full = self
            .batches
            .back()
            .is_none_or(|tail| !tail.is_empty() && tail.len() == tail.capacity());
        if full {
            let fresh = self.take_spare();
            self.batches.push_back(fresh);
        }
        let batch = self.first_batch.wrapping_add(self.batches.len() as u32 - 1);
        let tail = self.batches.back_mut().expect("a batch was just ensured");
        let place = Place {
            batch,
            slot: tail.len() as u32,
        };
        self.states.push_back(state(&wr, place));
        tail.push(wr);
        self.states.back_mut().expect("a state was just pushed")
    }

    /// Takes every request of `wrs` where it lies, by trading `wrs` for an emptied batch (or a
    /// new empty vector): nothing is moved but the vectors. `state` makes each one's state.
    pub fn take_batch(&mut self, wrs: &mut Vec<T>, mut state: impl FnMut(&T, Place) -> S) {
        if wrs.is_empty() {
            return;
        }
        match self.batches.back_mut() {
            // The tail a queue that ran empty kept (`retire_front`): the two trade places.
            Some(tail) if tail.is_empty() => std::mem::swap(tail, wrs),
            _ => {
                let spare = self.take_spare();
                self.batches.push_back(std::mem::replace(wrs, spare));
            }
        }
        let batch = self.first_batch.wrapping_add(self.batches.len() as u32 - 1);
        let taken = self.batches.back().expect("a batch was just taken");
        // A loop of pushes, not `extend` over an iterator: most batches hold one request or a
        // few, and `extend`'s set-up cost more than the pushes (callgrind, the ping-pong).
        for (slot, wr) in (0u32..).zip(taken) {
            self.states.push_back(state(wr, Place { batch, slot }));
        }
    }

    /// Moves the oldest request out, leaving an empty one in its slot, and retires it as
    /// [`retire_front`](Self::retire_front) does: for a queue whose requests are handed on
    /// when taken (an SRQ's, each to the QP that takes it) rather than read where they lie
    /// until done.
    pub fn pop_front(&mut self, depth: usize) -> Option<T>
    where
        T: Default,
    {
        let Place { batch, slot } = self.states.front()?.place();
        let batch = &mut self.batches[batch.wrapping_sub(self.first_batch) as usize];
        let wr = std::mem::take(&mut batch[slot as usize]);
        self.retire_front(1, depth);
        Some(wr)
    }

    /// [`take_batch`](Self::take_batch) for a receive queue, which keeps its requests dense: a
    /// vector less than half full (with room 4, a turn that found a single post) is moved in a
    /// request at a time, into the tail, and stays the caller's; a vector at least half full is
    /// taken whole, and so is any into a queue that ran empty and kept its emptied tail, which
    /// the two trade (a ping-pong's one receive). A queue kept deep and refilled a post at a
    /// time (a server reposting each receive it consumed; an SRQ) would otherwise hold a batch
    /// of room 4 for every request; refilled two at a time, it holds twice their room at most.
    /// Sends are always taken whole: a `SendWr` is larger, and its queue only as deep as the
    /// window in flight.
    pub fn take_dense(&mut self, wrs: &mut Vec<T>, mut state: impl FnMut(&T, Place) -> S) {
        let ran_empty = self.batches.back().is_some_and(Vec::is_empty);
        if ran_empty || wrs.len() * 2 >= wrs.capacity() {
            return self.take_batch(wrs, state);
        }
        for wr in wrs.drain(..) {
            self.push(wr, &mut state);
        }
    }

    /// The room of the batches that hold requests, in requests: what the requests take.
    #[cfg(test)]
    pub fn room(&self) -> usize {
        self.batches.iter().map(Vec::capacity).sum()
    }

    /// An emptied batch, or a new vector, which allocates nothing until it is pushed to.
    fn take_spare(&mut self) -> Vec<T> {
        let spare = self.spare.pop().unwrap_or_default();
        self.spare_room -= spare.capacity();
        spare
    }

    /// Forgets the oldest `n` requests of a queue `depth` deep: the batches the head has
    /// passed are cleared, their requests dropped where they lie, and kept for reuse while
    /// the spares' room stays within `SPARE_DEPTHS` depths (a `depth` of 0 keeps none).
    pub fn retire_front(&mut self, n: usize, depth: usize) {
        // Pops, not `drain`, for the same reason as `take_batch`'s pushes: `n` is often 1.
        for _ in 0..n {
            self.states.pop_front();
        }
        // The batches before the new head's are passed. With no request left all are, and the
        // last stays, emptied, for the next requests to go into: a ping-pong's one batch is
        // then traded back and forth without a turn through the spares.
        let passed = match self.states.front() {
            Some(head) => head.place().batch.wrapping_sub(self.first_batch) as usize,
            None if depth > 0 && !self.batches.is_empty() => {
                let tail = self.batches.back_mut().expect("not empty");
                tail.clear();
                self.batches.len() - 1
            }
            None => self.batches.len(),
        };
        if passed == 0 {
            return;
        }
        // Popped, not drained: a drain's drop cost more than the rest of the retirement
        // (callgrind, the ping-pong, where every batch is one request).
        for _ in 0..passed {
            let mut batch = self
                .batches
                .pop_front()
                .expect("no more passed than there are");
            let room = batch.capacity();
            if room > 0 && self.spare_room + room <= SPARE_DEPTHS.saturating_mul(depth) {
                batch.clear();
                self.spare.push(batch);
                self.spare_room += room;
            }
        }
        self.first_batch = self.first_batch.wrapping_add(passed as u32);
    }
}

impl<T, S> Index<usize> for WorkQueue<T, S> {
    type Output = S;

    fn index(&self, idx: usize) -> &S {
        &self.states[idx]
    }
}

impl<T, S> IndexMut<usize> for WorkQueue<T, S> {
    fn index_mut(&mut self, idx: usize) -> &mut S {
        &mut self.states[idx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Queue = WorkQueue<u64, Place>;

    fn ids(q: &Queue) -> Vec<u64> {
        (0..q.len()).map(|idx| *q.wr(idx)).collect()
    }

    fn here(_: &u64, place: Place) -> Place {
        place
    }

    /// Batches taken whole and requests pushed one at a time read back in posting order
    /// across batch boundaries, as the head retires part of a batch, a whole one and the rest.
    #[test]
    fn requests_read_back_in_posting_order_as_the_head_passes_batches() {
        let mut q = Queue::default();
        let mut posted = vec![1, 2, 3];
        q.take_batch(&mut posted, here);
        assert!(posted.is_empty());
        q.push(4, here);
        q.take_batch(&mut vec![5, 6], here);
        q.take_batch(&mut Vec::new(), here);
        assert_eq!(ids(&q), [1, 2, 3, 4, 5, 6]);

        // Batches [1, 2, 3], [4] (the first was full) and [5, 6].
        assert_eq!(q.batches.len(), 3);
        q.retire_front(2, 64);
        assert_eq!(ids(&q), [3, 4, 5, 6]);
        assert_eq!(q.batches.len(), 3, "the first batch still holds request 3");
        q.retire_front(2, 64);
        assert_eq!(ids(&q), [5, 6]);
        assert_eq!(q.batches.len(), 1);
        q.push(7, here);
        assert_eq!(ids(&q), [5, 6, 7]);
        q.retire_front(3, 64);
        assert!(q.is_empty());
        assert_eq!(q.batches.len(), 1, "the last batch stays, emptied");
        assert!(q.batches[0].is_empty() && q.batches[0].capacity() >= 2);
        // Of the other three, one went to hold request 7; the two left are kept.
        assert_eq!(q.spare.len(), 2, "the other emptied batches are kept");
        assert!(q.spare.iter().all(|b| b.is_empty() && b.capacity() >= 2));

        // An emptied batch is what the next taken batch is traded for: first the tail kept,
        // then a spare.
        for id in [8, 9, 10] {
            let mut posted = vec![id];
            q.take_batch(&mut posted, here);
            assert!(posted.is_empty() && posted.capacity() >= 1);
        }
        assert_eq!(ids(&q), [8, 9, 10]);
        assert!(q.spare.is_empty());
        q.push(11, here);
        assert_eq!(ids(&q), [8, 9, 10, 11]);
    }

    /// A queue fed one request at a time that never runs empty keeps a bounded store: the
    /// tail is not grown past its capacity, so the head passes whole batches and frees them.
    #[test]
    fn pushes_to_a_queue_that_never_empties_keep_a_bounded_store() {
        let mut q = Queue::default();
        for id in 0..3 {
            q.push(id, here);
        }
        for id in 3..10_000 {
            q.push(id, here);
            q.retire_front(1, 8);
            assert_eq!(*q.wr(0), id - 2);
        }
        assert_eq!(ids(&q), [9_997, 9_998, 9_999]);
        let stored: usize = q.batches.iter().chain(&q.spare).map(Vec::capacity).sum();
        assert!(stored <= 3 * 8, "{stored} slots for 3 requests");
    }

    /// A window of one-request batches, each grown by its post from an empty vector (room 4),
    /// retired at once by one ACK, is kept whole and serves the next window without a new
    /// vector: the steady state of a stream of single posts, a window deep.
    #[test]
    fn a_window_of_single_posts_is_served_again_from_the_spares() {
        const DEPTH: usize = 256;
        let mut q = Queue::default();
        // The posting queue's vector: each post pushes into it, and each turn trades it.
        let mut posting = Vec::new();
        for id in 0..DEPTH as u64 {
            posting.push(id);
            q.take_batch(&mut posting, here);
        }
        q.retire_front(DEPTH, DEPTH);
        for id in 0..DEPTH as u64 {
            posting.push(id);
            q.take_batch(&mut posting, here);
            assert_eq!(posting.capacity(), 4, "request {id}: an emptied batch");
        }
    }

    /// Requests moved out one at a time come out in posting order across batches, each batch
    /// emptied into the spares as the head passes it, and the last kept as the tail.
    #[test]
    fn requests_moved_out_from_the_head_come_out_in_order_and_free_their_batches() {
        let mut q = Queue::default();
        q.take_batch(&mut vec![1, 2], here);
        q.take_batch(&mut vec![3], here);
        q.push(4, here);
        assert_eq!(
            q.batches.len(),
            3,
            "[3] was full, so 4 began a batch of its own"
        );
        assert_eq!(q.pop_front(8), Some(1));
        assert_eq!(ids(&q), [2, 3, 4]);
        assert_eq!(
            (q.batches.len(), q.spare.len()),
            (3, 0),
            "2 is still in the first"
        );
        assert_eq!(q.pop_front(8), Some(2));
        assert_eq!((q.batches.len(), q.spare.len()), (2, 1));
        assert_eq!(q.pop_front(8), Some(3));
        assert_eq!(q.pop_front(8), Some(4));
        assert_eq!(q.pop_front(8), None);
        assert!(q.is_empty());
        assert_eq!(
            (q.batches.len(), q.spare.len()),
            (1, 2),
            "the last stays as the tail"
        );
        assert!(q.batches[0].is_empty());
        // ...which the next batch is traded for, as after `retire_front`.
        let mut next = vec![5];
        q.take_batch(&mut next, here);
        assert!(
            next.is_empty() && next.capacity() >= 1,
            "the emptied tail, given back"
        );
        assert_eq!(q.pop_front(8), Some(5));
    }

    /// A receive queue's posts: a vector mostly room is moved into the tail and stays the
    /// caller's, one at least half full is traded, and so is any into a queue that ran empty,
    /// for its emptied tail; all in posting order.
    #[test]
    fn a_vector_mostly_room_is_moved_in_unless_the_queue_ran_empty() {
        let mut q = Queue::default();
        let mut one = Vec::with_capacity(4);
        for id in [0, 1] {
            one.push(id);
            q.take_dense(&mut one, here);
            assert!(
                one.is_empty() && one.capacity() == 4,
                "moved in: the vector stays"
            );
        }
        let mut two = Vec::with_capacity(4);
        two.extend([2, 3]);
        q.take_dense(&mut two, here);
        assert_eq!(two.capacity(), 0, "half full: traded");
        assert_eq!(ids(&q), [0, 1, 2, 3]);
        q.retire_front(4, 8);
        // The vector is traded for the emptied tail: it comes back another vector.
        let posted_into = one.as_ptr();
        one.push(4);
        q.take_dense(&mut one, here);
        assert!(one.is_empty(), "taken");
        assert_ne!(
            one.as_ptr(),
            posted_into,
            "traded for the emptied tail, not moved into it"
        );
        assert_eq!(ids(&q), [4]);
    }

    /// A queue kept deep and refilled a post at a time, each post's vector with room for 4,
    /// holds its requests densely: taken whole, 256 single posts would hold room for 1024. As
    /// the head retires one and a post refills it, the batches it passes serve again.
    #[test]
    fn single_posts_to_a_deep_queue_are_held_densely() {
        let mut q = Queue::default();
        let mut posting = Vec::new();
        for id in 0..256 {
            posting.push(id);
            q.take_dense(&mut posting, here);
        }
        assert_eq!(ids(&q), (0..256).collect::<Vec<_>>());
        assert!(q.room() <= 256 + 4, "room {} for 256 requests", q.room());
        for id in 256..10_000 {
            q.retire_front(1, 256);
            posting.push(id);
            q.take_dense(&mut posting, here);
            assert_eq!(*q.wr(0), id - 255);
        }
        assert!(q.room() <= 256 + 8, "room {} for 256 requests", q.room());
        assert!(q.spare_room <= 8, "{} in the spares", q.spare_room);
    }

    /// Batch numbers wrap without losing their place.
    #[test]
    fn batch_numbers_wrap() {
        let mut q = Queue {
            first_batch: u32::MAX - 1,
            ..Queue::default()
        };
        for id in 0..5 {
            q.take_batch(&mut vec![id], here);
        }
        assert_eq!(ids(&q), [0, 1, 2, 3, 4]);
        q.retire_front(3, 64);
        assert_eq!(ids(&q), [3, 4]);
        assert_eq!(q.first_batch, 1);
    }

    /// The spares are bounded by their room: of more single-request batches (room 1 each)
    /// than `SPARE_DEPTHS` depths of a queue 8 deep, the last stays as the tail and that many
    /// are kept, and they serve as many batches more and one without a new vector.
    #[test]
    fn the_spare_batches_are_bounded_by_their_room() {
        let kept = SPARE_DEPTHS * 8;
        let mut q = Queue::default();
        for id in 0..kept as u64 + 10 {
            let mut one = Vec::with_capacity(1);
            one.push(id);
            q.take_batch(&mut one, here);
        }
        q.retire_front(kept + 10, 8);
        assert_eq!(q.batches.len(), 1, "the last batch stays, emptied");
        assert_eq!((q.spare.len(), q.spare_room), (kept, kept));
        for id in 0..=kept as u64 {
            let mut posted = vec![id];
            q.take_batch(&mut posted, here);
            assert_eq!(posted.capacity(), 1, "an emptied batch, not a new vector");
        }
        assert_eq!((q.spare.len(), q.spare_room), (0, 0));
        let mut posted = vec![0];
        q.take_batch(&mut posted, here);
        assert_eq!(posted.capacity(), 0, "none left: a new, empty vector");
        q.retire_front(kept + 2, 0);
        assert!(q.batches.is_empty(), "a depth of 0 keeps no batch");
        assert!(q.spare.is_empty());
    }
}
