//! What keeps a PD, CQ or SRQ from being destroyed while another of the program's objects uses
//! it.
//!
//! rdma-core refuses to destroy an object in use (`EBUSY`, from the kernel's `usecnt` checks):
//! a CQ or SRQ a QP was created with, a PD with a QP, SRQ, region, window or address handle on
//! it. The user names it (`qp->send_cq`, `qp->srq`, `mr->pd`), and the program, and softroce
//! through it, would read freed memory if the destroy went through. Each such object counts
//! its users here: a user adds itself when it is made and takes itself off when it is
//! destroyed (not when it is freed: a QP destroyed with events held stays allocated, but no
//! longer uses its CQs).

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many of the program's objects use this one.
#[derive(Debug, Default)]
pub(crate) struct Users(AtomicUsize);

impl Users {
    /// A user was made.
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// A user was destroyed.
    pub(crate) fn remove(&self) {
        let removed = self
            .0
            .fetch_update(Ordering::Release, Ordering::Relaxed, |n| n.checked_sub(1));
        debug_assert!(removed.is_ok(), "a user removed that was never added");
    }

    /// Whether any user is left: the object's destroy answers `EBUSY` then.
    pub(crate) fn busy(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::Users;

    #[test]
    fn busy_until_the_last_user_goes() {
        let users = Users::default();
        assert!(!users.busy());
        users.add();
        users.add();
        users.remove();
        assert!(users.busy(), "one user left");
        users.remove();
        assert!(!users.busy());
    }
}
