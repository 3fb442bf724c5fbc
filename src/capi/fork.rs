//! A child process after `fork()`: it inherits the library's memory, its parent's devices
//! (their sockets among its descriptors) and every object the parent made, but none of the
//! parent's threads. rdma-core lets a child use nothing of its parent's (`ibv_fork_init(3)`);
//! with softroce, what the child ran of its parent's would run the parent's engine on the
//! shared socket, taking datagrams meant for the parent's QPs and sending its packets again,
//! or wait for ever on an engine thread the child does not have.
//!
//! So each device, context, verbs object and CM ID belongs to the process generation it was
//! made in ([`Born`]): a handler that `pthread_atfork` runs in every child starts a new
//! generation, and the child's calls on its parent's objects are refused (`EINVAL`: not an
//! object of this process), as is anything the library would do of its own in the child (the
//! exit handler's flush). What the child opens itself, on another address (the parent's
//! address is the parent's), works. Each object keeps its own generation, so the check reads
//! nothing but the object: an object destroyed with an event held is checked at the event's
//! acknowledgement, after its context may have been closed.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::say;

/// How many `fork()`s lie between the first process that opened a device and this one.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The process generation something was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Born(u32);

impl Born {
    /// This process's generation: what is made now belongs to it.
    pub(crate) fn now() -> Born {
        Born(GENERATION.load(Ordering::Relaxed))
    }

    /// Whether what was made then belongs to this process.
    pub(crate) fn current(self) -> bool {
        self == Born::now()
    }

    /// As [`current`](Self::current), for a call of the program's on it: if not, says once,
    /// on standard error, why the call is refused.
    pub(crate) fn ours(self) -> bool {
        if self.current() {
            return true;
        }
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            say!(
                "a child process after fork() called the library on its parent's objects: \
                 refused (EINVAL), as a child may use only what it opens itself"
            );
        }
        false
    }
}

/// Has every child of this process start a generation of its own; once, before the first
/// device opens.
pub(crate) fn watch() {
    extern "C" fn in_child() {
        // Async-signal-safe: one atomic add.
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: the handler is a plain function of this library that takes nothing and does
        // one atomic add. Like the exit handler (`devices::flush_at_exit`), it is registered
        // with the library's `__dso_handle` (glibc's `pthread_atfork` comes from
        // libc_nonshared.a), so a `dlclose` of the library forgets it.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}
