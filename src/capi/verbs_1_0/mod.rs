//! libibverbs 1.0's ABI: the 33 verbs rdma-core still defines at version `IBVERBS_1.0`, for
//! programs linked against libibverbs before 1.1 (2006), whose objects had other shapes
//! ([`abi`]). A program binds each at the version it was linked with, so a program of today
//! never reaches these; one that old finds every verb it names, as with rdma-core.
//!
//! As rdma-core's `compat-1_0.c` does, each 1.0 object is a structure of the old shape that
//! points to the object of today's ABI it stands for, and each 1.0 verb calls today's verb of
//! this library on it (so each answers exactly as today's does, error for error). Today's CQs,
//! QPs and SRQs point back: their `cq_context`, `qp_context` and `srq_context` are the 1.0
//! object, as rdma-core sets them, and each owns its 1.0 structure (`Legacy`).
//!
//! Where softroce does better than rdma-core's 1.0 layer: a 1.0 device lives as long as the
//! process, so a context's `device` stays valid after the list is freed; a 1.0 CQ, QP or SRQ
//! lives as long as the object it stands for, so an event held past a destroy is still
//! acknowledged through it; `ibv_query_qp` of a QP with no SRQ does not read through null;
//! and a post converts each request as it goes, with no copy of the chain.
//!
//! A program uses one ABI: an object made through today's verbs has no 1.0 structure, and is
//! not one a 1.0 verb takes.

pub mod abi;
mod channel;
mod context;
mod objects;
mod ops;

pub(crate) use channel::{channel_1_0, forget_channel, today_channel};
pub(crate) use context::today_context;

use std::ptr;
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{AcqRel, Acquire};

/// The 1.0 structure that stands for an object of today's ABI that a 1.0 program made, owned
/// by that object so that it lives exactly as long. rdma-core frees it in the 1.0 destroy,
/// which waits for the object's events; softroce's destroy does not wait, but leaves an object
/// whose events the program holds allocated until they are acknowledged ([`crate::held`]), and
/// a 1.0 program acknowledges them through this structure.
pub(crate) struct Legacy<T>(AtomicPtr<T>);

impl<T> Default for Legacy<T> {
    fn default() -> Self {
        Legacy(AtomicPtr::new(ptr::null_mut()))
    }
}

impl<T> Legacy<T> {
    /// The 1.0 structure; null for an object made through today's verbs.
    pub(crate) fn get(&self) -> *mut T {
        self.0.load(Acquire)
    }

    /// Gives the object its 1.0 structure, once, as the 1.0 verb that made it returns; the
    /// structure's address, which the program holds from then on.
    fn set(&self, made: Box<T>) -> *mut T {
        let raw = Box::into_raw(made);
        let before = self.0.swap(raw, AcqRel);
        debug_assert!(before.is_null(), "a 1.0 structure is set once");
        raw
    }
}

impl<T> Drop for Legacy<T> {
    fn drop(&mut self) {
        let raw = *self.0.get_mut();
        if !raw.is_null() {
            // SAFETY: set from `Box::into_raw` (`set`), and freed only here, with the object.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}
