//! What keeps a CQ, QP or SRQ allocated while the program holds one of its events.
//!
//! rdma-core's `ibv_destroy_cq`, `ibv_destroy_qp` and `ibv_destroy_srq` block until every event
//! handed out for the object (a CQ's completion events, from `ibv_get_cq_event`; any object's
//! asynchronous events, from `ibv_get_async_event`) is acknowledged, so a thread that holds
//! such an event may still read the object it names while another destroys it. softroce's
//! destroys do not block: they take the object out of reach (no event names it any more) and
//! leave its memory to the acknowledgement of its last event, which frees it. The program sees
//! the same: the object readable until the acknowledgement; a program that never acknowledges
//! leaks the object where rdma-core's would hang in the destroy.

use std::sync::{Mutex, PoisonError};

/// How many events of an object the program holds, and whether it destroyed the object.
#[derive(Debug, Default)]
pub(crate) struct HeldEvents(Mutex<Held>);

#[derive(Debug, Default)]
struct Held {
    unacked: u32,
    /// A destroy began ([`HeldEvents::claim_destroy`]).
    claimed: bool,
    destroyed: bool,
}

impl HeldEvents {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A destroy of the object begins: true the first time, false for a destroy made again
    /// (the object stays allocated while its events are held, so a program may call it
    /// again), which must then change nothing: its uses were let go of already.
    #[must_use]
    pub(crate) fn claim_destroy(&self) -> bool {
        !std::mem::replace(&mut self.held().claimed, true)
    }

    /// An event naming the object was handed out. The caller must know the object is not
    /// destroyed: it found it, under the lock its destroy takes, among the live ones.
    pub(crate) fn hand_out(&self) {
        let mut held = self.held();
        held.unacked = held.unacked.saturating_add(1);
    }

    /// `n` of its events were acknowledged. True if the object was destroyed and none is held
    /// any more: the caller frees it, now.
    #[must_use]
    pub(crate) fn ack(&self, n: u32) -> bool {
        let mut held = self.held();
        held.unacked = held.unacked.saturating_sub(n);
        held.destroyed && held.unacked == 0
    }

    /// The program destroyed the object. True if none of its events is held: the caller frees
    /// it, now; otherwise the acknowledgement of the last one does ([`ack`](Self::ack)).
    #[must_use]
    pub(crate) fn destroy(&self) -> bool {
        let mut held = self.held();
        held.destroyed = true;
        held.unacked == 0
    }
}

#[cfg(test)]
mod tests {
    use super::HeldEvents;

    #[test]
    fn the_last_of_destroy_and_acknowledgement_frees() {
        let none_held = HeldEvents::default();
        assert!(
            none_held.claim_destroy() && !none_held.claim_destroy(),
            "claimed once"
        );
        assert!(none_held.destroy(), "nothing held: freed at the destroy");

        let held = HeldEvents::default();
        held.hand_out();
        held.hand_out();
        assert!(!held.ack(1), "not destroyed: nothing to free");
        assert!(!held.destroy(), "one event still held");
        assert!(held.ack(1), "the last acknowledgement frees it");
    }
}
