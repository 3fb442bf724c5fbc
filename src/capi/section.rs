//! A section the program enters in one call and leaves in another, which verbs promise no
//! other thread enters meanwhile: `ibv_wr_start` to `ibv_wr_complete` (or `ibv_wr_abort`) on a
//! QP (`ibv_wr_post(3)`: the provider serialises them, as rxe does with its send queue's lock),
//! and `ibv_start_poll` to `ibv_end_poll` on a CQ. A second thread's entry waits until the
//! first leaves. A lock guard cannot cross the calls, hence a flag under a mutex.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct Section {
    entered: Mutex<bool>,
    left: Condvar,
}

impl Section {
    fn flag(&self) -> MutexGuard<'_, bool> {
        self.entered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters, once no other thread is inside.
    pub(crate) fn enter(&self) {
        let mut entered = self.flag();
        while *entered {
            entered = self.left.wait(entered).unwrap_or_else(|p| p.into_inner());
        }
        *entered = true;
    }

    /// Leaves (nothing if no one entered: a program's stray `ibv_wr_complete`).
    pub(crate) fn leave(&self) {
        *self.flag() = false;
        self.left.notify_one();
    }
}
