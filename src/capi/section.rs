//! A section the program enters in one call and leaves in another, which verbs promise no
//! other thread enters meanwhile: `ibv_wr_start` to `ibv_wr_complete` (or `ibv_wr_abort`) on a
//! QP (`ibv_wr_post(3)`: the provider serialises them, as rxe does with its send queue's lock),
//! and `ibv_start_poll` to `ibv_end_poll` on a CQ. A second thread's entry waits until the
//! first leaves. A lock guard cannot cross the calls, hence a flag under a mutex.
//!
//! Leaving wakes a waiter only if there is one: a condition variable's notify is a `futex`
//! system call whether or not anyone waits (std's futex `Condvar`), and a program posting
//! with `ibv_wr_*` leaves once a message, one polling with `ibv_start_poll` once a poll.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct Section {
    state: Mutex<State>,
    left: Condvar,
}

#[derive(Debug, Default)]
struct State {
    entered: bool,
    /// Threads waiting in `enter`.
    waiting: usize,
}

impl Section {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters, once no other thread is inside.
    pub(crate) fn enter(&self) {
        let mut state = self.state();
        while state.entered {
            state.waiting += 1;
            state = self.left.wait(state).unwrap_or_else(|p| p.into_inner());
            state.waiting -= 1;
        }
        state.entered = true;
    }

    /// Leaves (nothing if no one entered: a program's stray `ibv_wr_complete`).
    pub(crate) fn leave(&self) {
        let mut state = self.state();
        state.entered = false;
        if state.waiting > 0 {
            self.left.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Threads that enter and leave in turn: one inside at a time, and none left waiting.
    #[test]
    fn one_thread_is_inside_at_a_time_and_every_waiter_gets_in() {
        let section = Arc::new(Section::default());
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (section, inside) = (section.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        section.enter();
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        section.leave();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let state = section.state();
        assert!(!state.entered && state.waiting == 0);
    }
}
