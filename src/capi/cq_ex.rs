//! The extended CQ: `ibv_create_cq_ex` (the context's `create_cq_ex`) and its polling calls,
//! `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` readers, which
//! `verbs.h` calls through the `ibv_cq_ex` the program holds.
//!
//! An extended CQ is a [`Cq`] like any other (`ibv_poll_cq` and `ibv_destroy_cq` take it, cast
//! with `ibv_cq_ex_to_cq`), with its `ibv_cq_ex` callbacks filled. `start_poll` and
//! `next_poll` take one completion and keep it as the CQ's current one ([`Cq::current`]);
//! the readers read it. As with rxe, the completion's fields the program did not ask for in
//! `wc_flags` are readable all the same; the ones no softroce completion has (timestamps, VLAN,
//! flow tag, tag matching) are refused at creation with `EOPNOTSUPP`, and their readers are
//! null.

use std::ptr;
use std::sync::atomic::Ordering::Relaxed;

use libc::{c_int, c_uint};

use crate::abi::*;
use crate::cq::{self, Cq};
use crate::{guard, set_errno, unsupported};

/// The context op `create_cq_ex` (`ibv_create_cq_ex`, whose inline wrapper has checked that
/// `comp_mask` names only known attributes).
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: the program's attributes, or null.
        let Some(attr) = (unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if attr.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
            set_errno(unsupported(
                "ibv_create_cq_ex with completion timestamps, VLANs, flow tags or tag matching",
            ));
            return ptr::null_mut();
        }
        if attr.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            set_errno(unsupported("ibv_create_cq_ex in a parent domain"));
            return ptr::null_mut();
        }
        let flags = if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            attr.flags
        } else {
            0
        };
        // Single-threaded use is a hint softroce has no use for; ignoring overruns is not one.
        if flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0 {
            set_errno(unsupported("ibv_create_cq_ex ignoring overruns"));
            return ptr::null_mut();
        }
        let Ok(cqe) = c_int::try_from(attr.cqe) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: the program's context and channel, as `create` requires.
        let made = unsafe {
            cq::create(context, cqe, attr.cq_context, attr.channel, |ex| {
                ex.start_poll = Some(start_poll);
                ex.next_poll = Some(next_poll);
                ex.end_poll = Some(end_poll);
                ex.read_opcode = Some(read_opcode);
                ex.read_vendor_err = Some(read_vendor_err);
                ex.read_byte_len = Some(read_byte_len);
                ex.read_imm_data = Some(read_imm_data);
                ex.read_qp_num = Some(read_qp_num);
                ex.read_src_qp = Some(read_src_qp);
                ex.read_wc_flags = Some(read_wc_flags);
                ex.read_slid = Some(read_slid);
                ex.read_sl = Some(read_sl);
                ex.read_dlid_path_bits = Some(read_dlid_path_bits);
            })
        };
        made.cast()
    })
}

/// Takes the CQ's next completion as its current one: 0, `ENOENT` if there is none, `EIO`
/// once its device has stopped and none are left (where `ibv_poll_cq` answers -1).
///
/// # Safety
///
/// `cq` is an extended CQ the program created and has not destroyed.
unsafe fn take_next(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: per the contract; an `ibv_cq_ex` is the first field of a `Cq`.
    let Some(this) = (unsafe { Cq::from_ibv(cq.cast()) }) else {
        return libc::EINVAL;
    };
    let mut current = this.current.lock().unwrap_or_else(|p| p.into_inner());
    let mut taken = false;
    let polled = this.cq.poll_each(1, |completion| {
        *current = cq::ibv_wc(completion);
        taken = true;
    });
    match polled {
        Ok(_) if taken => {
            this.ibv.status.store(current.status, Relaxed);
            this.ibv.wr_id.store(current.wr_id, Relaxed);
            0
        }
        Ok(_) => {
            // As `ibv_poll_cq`'s empty poll: let a spinning program's peer or engine run.
            std::thread::yield_now();
            libc::ENOENT
        }
        Err(_) => libc::EIO,
    }
}

/// `ibv_start_poll`: the first completion of a polling pass (`attr`'s `comp_mask` must be 0).
/// A pass that found one is the thread's until `ibv_end_poll` ([`crate::section`]); one that
/// found none (`ENOENT`) or failed has ended already, as `ibv_create_cq_ex(3)` has it.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's attributes, or null.
        if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
            return libc::EINVAL;
        }
        // SAFETY: the program's CQ, as `ibv_start_poll` requires.
        let Some(this) = (unsafe { Cq::from_ibv(cq.cast()) }) else {
            return libc::EINVAL;
        };
        this.polling.enter();
        // SAFETY: as above.
        let found = unsafe { take_next(cq) };
        if found != 0 {
            this.polling.leave();
        }
        found
    })
}

/// `ibv_next_poll`: the pass's next completion.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the program's CQ, as `ibv_next_poll` requires.
    guard(libc::EIO, || unsafe { take_next(cq) })
}

/// `ibv_end_poll`: the pass ends; a completion taken is already off the queue.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: the program's CQ, as `ibv_end_poll` requires.
        if let Some(this) = unsafe { Cq::from_ibv(cq.cast()) } {
            this.polling.leave();
        }
    })
}

/// One field of `cq`'s current completion, or `T::default()` for a CQ that is not the
/// program's.
///
/// # Safety
///
/// `cq` is an extended CQ the program created and has not destroyed.
unsafe fn read<T: Default>(cq: *mut ibv_cq_ex, field: impl FnOnce(&ibv_wc) -> T) -> T {
    guard(T::default(), || {
        // SAFETY: per the contract.
        match unsafe { Cq::from_ibv(cq.cast()) } {
            Some(this) => field(&this.current.lock().unwrap_or_else(|p| p.into_inner())),
            None => T::default(),
        }
    })
}

/// Defines the `ibv_wc_read_*` readers: each returns one field of the current completion.
macro_rules! readers {
    ($($name:ident -> $ty:ty: $wc:ident => $value:expr;)*) => {$(
        #[doc = concat!("`ibv_wc_", stringify!($name), "`.")]
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $ty {
            // SAFETY: the program's CQ, as the reader requires.
            unsafe { read(cq, |$wc: &ibv_wc| $value) }
        }
    )*};
}

readers! {
    read_opcode -> c_uint: wc => wc.opcode;
    read_vendor_err -> u32: wc => wc.vendor_err;
    read_byte_len -> u32: wc => wc.byte_len;
    read_imm_data -> u32: wc => wc.imm_data;
    read_qp_num -> u32: wc => wc.qp_num;
    read_src_qp -> u32: wc => wc.src_qp;
    read_wc_flags -> c_uint: wc => wc.wc_flags;
    read_slid -> u32: wc => u32::from(wc.slid);
    read_sl -> u8: wc => wc.sl;
    read_dlid_path_bits -> u8: wc => wc.dlid_path_bits;
}
