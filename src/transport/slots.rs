//! A QP's or an SRQ's outstanding work requests, counted where the application posts and where
//! the transport retires them, so that `max_send_wr`, `max_recv_wr` and an SRQ's `max_wr` are
//! exact: a post beyond them is refused at the call, whatever the engine has or has not yet
//! taken in.
//!
//! A send request holds its slot from its post until it leaves the send queue (completed,
//! signalled or not, flushed, or refused); a receive request of a QP's own queue until its
//! completion is made (or it is flushed or refused); one posted to an SRQ until a QP takes it
//! from the SRQ. Atomics, not a lock: a post is one compare-and-swap on a
//! line only posters write, a retirement one add on a line only the engine writes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A counter on a cache line of its own: each is written by one side only (here posts by the
/// application's threads, retirements by the engine; a CQ ring's tally in `engine::queues`),
/// so that neither side's writes evict the other's line, and the other side only reads it.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Line(pub(crate) AtomicUsize);

/// One queue's counts: requests posted and requests retired, both only growing (wrapping), so
/// that what is outstanding is their difference.
#[derive(Debug, Default)]
struct Queue {
    posted: Line,
    retired: Line,
}

impl Queue {
    fn outstanding(&self) -> usize {
        let retired = self.retired.0.load(Ordering::Acquire);
        self.posted.0.load(Ordering::Acquire).wrapping_sub(retired)
    }

    /// Takes a slot if fewer than `max` are outstanding. Posters race only with each other
    /// (a compare-and-swap on their own line); the engine's retirements only make room.
    fn take(&self, max: usize) -> bool {
        self.take_n(1, max)
    }

    /// Takes `n` slots at once if no more than `max` would then be outstanding, else none.
    fn take_n(&self, n: usize, max: usize) -> bool {
        loop {
            // `retired` first: a request is retired only after it was posted, so a `retired`
            // read before `posted` is never ahead of it. Read the other way round, another
            // poster's request posted and retired in between would make the difference wrap
            // and refuse a post to an empty queue.
            let retired = self.retired.0.load(Ordering::Acquire);
            let posted = self.posted.0.load(Ordering::Acquire);
            if posted.wrapping_sub(retired).saturating_add(n) > max {
                return false;
            }
            let taken = self.posted.0.compare_exchange_weak(
                posted,
                posted.wrapping_add(n),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if taken.is_ok() {
                return true;
            }
        }
    }

    /// `n` requests left the queue. The engine retires (and, rarely, a post whose request
    /// could not be handed over after all); an add, so any number of writers stays exact.
    fn retire(&self, n: usize) {
        if n > 0 {
            self.retired.0.fetch_add(n, Ordering::Release);
            debug_assert!(
                self.outstanding() <= isize::MAX as usize,
                "more requests retired than posted"
            );
        }
    }
}

/// The counts of one QP (or SRQ: its receive side alone), shared by its handles and the
/// transport.
#[derive(Debug, Default)]
pub struct QueueSlots {
    send: Queue,
    recv: Queue,
}

impl QueueSlots {
    /// A slot for a send request, if fewer than `max` are outstanding.
    pub fn take_send(&self, max: usize) -> bool {
        self.send.take(max)
    }

    /// Slots for `n` send requests, all or none, if no more than `max` would be outstanding.
    pub fn take_sends(&self, n: usize, max: usize) -> bool {
        self.send.take_n(n, max)
    }

    /// A slot for a receive request, if fewer than `max` are outstanding.
    pub fn take_recv(&self, max: usize) -> bool {
        self.recv.take(max)
    }

    /// `n` send requests left the QP (or were never handed to it).
    pub fn retire_sends(&self, n: usize) {
        self.send.retire(n);
    }

    /// `n` receive requests completed (or were never handed to the QP).
    pub fn retire_recvs(&self, n: usize) {
        self.recv.retire(n);
    }

    /// How many send and receive requests are outstanding.
    pub fn outstanding(&self) -> (usize, usize) {
        (self.send.outstanding(), self.recv.outstanding())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stop_at_the_depth_and_never_go_below_zero() {
        let slots = QueueSlots::default();
        assert!((0..4).all(|_| slots.take_send(4)));
        assert!(!slots.take_send(4), "a fifth send is refused");
        slots.retire_sends(1);
        assert!(slots.take_send(4));
        assert_eq!(slots.outstanding(), (4, 0));
        assert!(slots.take_recv(1) && !slots.take_recv(1));
        assert_eq!(
            slots.outstanding(),
            (4, 1),
            "a refused take leaves the count as it was"
        );
    }

    #[test]
    fn several_slots_are_taken_all_or_none() {
        let slots = QueueSlots::default();
        assert!(slots.take_sends(3, 4));
        assert!(!slots.take_sends(2, 4), "two more would be five");
        assert_eq!(slots.outstanding(), (3, 0), "a refused take takes nothing");
        assert!(slots.take_sends(1, 4) && !slots.take_send(4));
        slots.retire_sends(4);
        assert!(slots.take_sends(4, 4));
    }
}
