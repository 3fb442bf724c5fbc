//! Shared receive queues: one pool of receive requests for any number of QPs.
//!
//! The limit event follows rxe_srq.c and rxe_resp.c (`get_srq_wqe`): setting `srq_limit` to a
//! non-zero value arms it; when taking a request leaves fewer than `srq_limit` posted, the SRQ
//! raises [`AsyncEvent::SrqLimitReached`] once and disarms, which `query_srq` shows as a limit of
//! 0 (IBTA 11.5.2.4). Like rxe, the check runs when a request is taken, not when the limit is set.
//!
//! The requests lie in a [`WorkQueue`], most where their posts wrote them, until a QP takes one,
//! which moves it into the QP's message, as rxe's `get_srq_wqe` copies the WQE into
//! `qp->resp.srq_wqe` and frees its slot at once. A QP's own receive queue is read in place
//! until the message completes; an SRQ's cannot be. Many QPs take its requests, and finish them
//! in any order. One left in place until done would pin every batch posted after it for as long
//! as its message lasts: a UC message whose last packet never comes would pin them for ever,
//! and a peer could grow the SRQ's storage with every post.
//!
//! Posts are taken as a QP's own receive queue takes them ([`WorkQueue::take_dense`]): a vector
//! of posts less than half full is moved into the tail, so that an SRQ, often deep and shared
//! to save memory, holds its requests densely when it is filled a post at a time.

use std::collections::VecDeque;
use std::sync::Arc;

use super::work_queue::{Place, WorkQueue};
use super::wr::RecvWr;
use super::{AsyncEvent, QueueSlots, VerbsError};
use crate::memory::PdId;

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

/// `ibv_srq_attr`: the size of an SRQ and its limit (0: not armed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// The most receive requests the SRQ holds at once.
    pub max_wr: usize,
    /// The limit event's threshold: fewer requests posted than this raises it; 0: not armed.
    pub srq_limit: u32,
}

/// A change to an SRQ (`ibv_modify_srq`); `None` leaves the value as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrqModify {
    /// Resizes the queue; it must still hold what is posted.
    pub max_wr: Option<usize>,
    /// Arms the limit event (or disarms it, with 0).
    pub srq_limit: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct SharedRq {
    /// The protection domain of the SRQ and of every QP it serves.
    pub pd: PdId,
    attr: SrqAttr,
    /// The requests not yet taken: most where their posts wrote them, a single post's moved
    /// into the tail (`WorkQueue::take_dense`).
    wqes: WorkQueue<RecvWr, Place>,
    /// The outstanding requests its handles count ([`Endpoint::share_srq_slots`]): taken by a
    /// post, given back as a QP takes the request.
    ///
    /// [`Endpoint::share_srq_slots`]: super::Endpoint::share_srq_slots
    pub slots: Option<Arc<QueueSlots>>,
}

/// rxe_srq.c `rxe_srq_chk_attr`: a queue holds at least one request, the limit fits in the
/// queue, and a resize keeps what is posted.
fn check(attr: SrqAttr, posted: usize) -> Result<(), VerbsError> {
    if attr.max_wr == 0 {
        return Err(VerbsError::InvalidRequest(
            "an SRQ holds at least one request",
        ));
    }
    if attr.srq_limit as usize > attr.max_wr {
        return Err(VerbsError::InvalidRequest("srq_limit is at most max_wr"));
    }
    if posted > attr.max_wr {
        return Err(VerbsError::InvalidRequest(
            "max_wr is below the number of requests posted",
        ));
    }
    Ok(())
}

impl SharedRq {
    /// An empty SRQ; `attr` as `ibv_create_srq` checks it, a non-zero limit armed.
    pub fn new(pd: PdId, attr: SrqAttr) -> Result<Self, VerbsError> {
        check(attr, 0)?;
        Ok(SharedRq {
            pd,
            attr,
            wqes: WorkQueue::default(),
            slots: None,
        })
    }

    /// Its size and limit, the limit 0 once the event has fired.
    pub fn attr(&self) -> SrqAttr {
        self.attr
    }

    /// Applies a resize or a new limit, if the result still passes the checks.
    pub fn modify(&mut self, change: &SrqModify) -> Result<(), VerbsError> {
        let attr = SrqAttr {
            max_wr: change.max_wr.unwrap_or(self.attr.max_wr),
            srq_limit: change.srq_limit.unwrap_or(self.attr.srq_limit),
        };
        // What its handles count as posted includes what the engine has not moved in yet.
        let posted = self
            .slots
            .as_ref()
            .map_or(self.wqes.len(), |slots| slots.outstanding().1);
        check(attr, posted)?;
        self.attr = attr;
        Ok(())
    }

    /// Adds a receive request; `QueueFull` at `max_wr`.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.wqes.len() >= self.attr.max_wr {
            return Err(VerbsError::QueueFull);
        }
        self.wqes.push(wr, |_, place| place);
        Ok(())
    }

    /// Takes every request of `wrs`, which their posts already counted against `max_wr` (the
    /// handles' slots, [`Endpoint::share_srq_slots`]), leaving `wrs` empty
    /// ([`WorkQueue::take_dense`]). None is refused for the depth: a post that raced a
    /// shrinking resize keeps its request, which no CQ could report as refused.
    ///
    /// [`Endpoint::share_srq_slots`]: super::Endpoint::share_srq_slots
    pub fn take_posted(&mut self, wrs: &mut Vec<RecvWr>) {
        self.wqes.take_dense(wrs, |_, place| place);
    }

    /// Whether no receive request is posted.
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Moves the oldest request out for a QP's message; may fire the limit event.
    pub fn take(&mut self, id: SrqId, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWr> {
        let wr = self.wqes.pop_front(self.attr.max_wr)?;
        if let Some(slots) = &self.slots {
            slots.retire_recvs(1);
        }
        let limit = self.attr.srq_limit as usize;
        if limit > 0 && self.wqes.len() < limit {
            self.attr.srq_limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached { srq: id });
        }
        Some(wr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::SgeList;

    /// An SRQ refilled a post at a time as QPs take its requests, each post's vector less than
    /// half full: the requests come out in posting order, and the SRQ holds them densely, its
    /// batches freed as requests are moved out and filled again by the next posts.
    #[test]
    fn an_srq_refilled_a_post_at_a_time_is_taken_in_order_and_held_densely() {
        let attr = SrqAttr {
            max_wr: 64,
            srq_limit: 0,
        };
        let mut srq = SharedRq::new(PdId(1), attr).unwrap();
        let mut posting = Vec::new();
        let mut post = |srq: &mut SharedRq, id| {
            posting.push(RecvWr::new(id, SgeList::new()));
            srq.take_posted(&mut posting);
        };
        for id in 0..64 {
            post(&mut srq, id);
        }
        let mut events = VecDeque::new();
        for id in 64..10_000 {
            let taken = srq.take(SrqId(0), &mut events).expect("64 posted");
            assert_eq!(taken.wr_id, id - 64);
            post(&mut srq, id);
        }
        assert!(srq.wqes.room() <= 64 + 8, "room {} for 64", srq.wqes.room());
        assert!(events.is_empty(), "no limit armed");
    }
}
