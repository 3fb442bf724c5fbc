//! A QP's outstanding work requests, counted where the application posts and where the
//! transport retires them, so that `max_send_wr` and `max_recv_wr` are exact: a post beyond
//! them is refused at the call, whatever the engine has or has not yet taken in.
//!
//! A send request holds its slot from its post until it leaves the send queue (completed,
//! signalled or not, flushed, or refused); a receive request until its completion is made
//! (or it is flushed or refused). Atomics, not a lock: a post is one compare-and-swap.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The counts of one QP, shared by its handles and the transport.
#[derive(Debug, Default)]
pub struct QueueSlots {
    send: AtomicUsize,
    recv: AtomicUsize,
}

/// Takes a slot of `taken` if fewer than `max` are taken.
fn take(taken: &AtomicUsize, max: usize) -> bool {
    taken
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// Gives `n` slots back; never below zero, so that a miscount cannot wrap into a queue that
/// refuses every post.
fn give_back(taken: &AtomicUsize, n: usize) {
    if n > 0 {
        let _ = taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
            Some(t.saturating_sub(n))
        });
    }
}

impl QueueSlots {
    /// A slot for a send request, if fewer than `max` are outstanding.
    pub fn take_send(&self, max: usize) -> bool {
        take(&self.send, max)
    }

    /// A slot for a receive request, if fewer than `max` are outstanding.
    pub fn take_recv(&self, max: usize) -> bool {
        take(&self.recv, max)
    }

    /// `n` send requests left the QP (or were never handed to it).
    pub fn retire_sends(&self, n: usize) {
        give_back(&self.send, n);
    }

    /// `n` receive requests completed (or were never handed to the QP).
    pub fn retire_recvs(&self, n: usize) {
        give_back(&self.recv, n);
    }

    /// How many send and receive requests are outstanding.
    pub fn outstanding(&self) -> (usize, usize) {
        (
            self.send.load(Ordering::Acquire),
            self.recv.load(Ordering::Acquire),
        )
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
        slots.retire_recvs(3);
        assert_eq!(slots.outstanding(), (4, 0));
        assert!(slots.take_recv(1) && !slots.take_recv(1));
    }
}
