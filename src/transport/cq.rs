//! Completion queues, and what happens when one overruns.
//!
//! A CQ holds at most the number of completions it was created for. IBTA 11.4.2.1 (and
//! `ibv_create_cq(3)`) make an overrun an error: the completion that did not fit is lost, the
//! CQ goes to the error state and so does every QP that completes into it, each with its
//! asynchronous event. softroce names the lost completion's QP and work request in the CQ's
//! event, so the application learns which one it was; later completions for an errored CQ are
//! dropped and counted (`dropped_completions`).

use std::collections::VecDeque;

use super::{CqId, WorkCompletion};

/// A completion queue handle.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    /// False once destroyed: the slot waits for the next CQ.
    pub live: bool,
    /// Overran: in the error state for good.
    pub overrun: bool,
}

/// What became of a completion.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// It did not fit: this completion is lost and the CQ is now in error.
    Overran(WorkCompletion),
    /// The CQ was already in error.
    Dropped,
}

impl CompletionQueue {
    /// A live, empty CQ that holds `capacity` completions.
    pub fn new(capacity: usize) -> Self {
        CompletionQueue {
            entries: VecDeque::new(),
            capacity,
            live: true,
            overrun: false,
        }
    }

    /// A destroyed CQ's slot.
    pub fn destroyed() -> Self {
        CompletionQueue {
            live: false,
            ..CompletionQueue::new(0)
        }
    }

    /// Queues a completion, unless the CQ is full (it overruns) or in error already.
    pub fn push(&mut self, wc: WorkCompletion) -> Pushed {
        if self.overrun {
            return Pushed::Dropped;
        }
        if self.entries.len() >= self.capacity {
            self.overrun = true;
            return Pushed::Overran(wc);
        }
        self.entries.push_back(wc);
        Pushed::Queued
    }

    /// The oldest completion, if any.
    pub fn pop(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }

    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The CQs a QP completes into, when one of them has overrun.
pub(crate) fn uses(send_cq: CqId, recv_cq: CqId, overrun: &[CqId]) -> bool {
    overrun.contains(&send_cq) || overrun.contains(&recv_cq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{WcOpcode, WcStatus};
    use crate::wire::Qpn;

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::Success, WcOpcode::Send, Qpn::new(5))
    }

    #[test]
    fn an_overrun_loses_that_completion_and_errs_the_cq_for_good() {
        let mut cq = CompletionQueue::new(2);
        assert_eq!(cq.push(wc(1)), Pushed::Queued);
        assert_eq!(cq.push(wc(2)), Pushed::Queued);
        assert_eq!(cq.push(wc(3)), Pushed::Overran(wc(3)));
        assert_eq!(cq.pop(), Some(wc(1)));
        assert_eq!(cq.push(wc(4)), Pushed::Dropped, "room again, but in error");
        assert_eq!(cq.pop(), Some(wc(2)));
        assert_eq!(cq.pop(), None);
    }
}
