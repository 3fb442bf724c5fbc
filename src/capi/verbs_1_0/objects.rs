//! libibverbs 1.0's objects: PDs, regions, CQs, SRQs, QPs and address handles, each a 1.0
//! structure over today's object.
//!
//! A PD, region or address handle is freed by its 1.0 destroy, as rdma-core frees it. A CQ,
//! QP or SRQ belongs to today's object ([`Legacy`](super::Legacy)), which points back through
//! its `*_context`, as rdma-core's 1.0 layer sets it, and goes with it.

use std::ptr;
use std::sync::atomic::Ordering::Relaxed;

use libc::{c_int, c_void, size_t};

use super::abi::*;
use super::context::real_context;
use crate::abi::*;
use crate::at_version;
use crate::cq::Cq;
use crate::qp::{Qp, Srq};
use crate::{cq, guard, memory, qp, set_errno};

/// The all-zero pthread mutex and condition of the 1.0 structures that have them:
/// `PTHREAD_MUTEX_INITIALIZER` and `PTHREAD_COND_INITIALIZER` on glibc.
fn unused_lock() -> (libc::pthread_mutex_t, libc::pthread_cond_t) {
    (
        libc::PTHREAD_MUTEX_INITIALIZER,
        libc::PTHREAD_COND_INITIALIZER,
    )
}

/// Today's object behind a 1.0 structure, by the member that names it; null for null.
///
/// # Safety
///
/// A non-null `legacy` is a live 1.0 structure of this module's.
unsafe fn real<T, R>(legacy: *mut T, member: impl FnOnce(&T) -> *mut R) -> *mut R {
    // SAFETY: per the contract.
    unsafe { legacy.as_ref() }.map_or(ptr::null_mut(), member)
}

/// Today's PD behind a 1.0 PD.
///
/// # Safety
///
/// As for [`real`].
unsafe fn real_pd(pd: *mut ibv_pd_1_0) -> *mut ibv_pd {
    // SAFETY: per the contract.
    unsafe { real(pd, |p| p.real_pd) }
}

/// Today's CQ behind a 1.0 CQ.
///
/// # Safety
///
/// As for [`real`].
pub(super) unsafe fn real_cq(cq: *mut ibv_cq_1_0) -> *mut ibv_cq {
    // SAFETY: per the contract.
    unsafe { real(cq, |c| c.real_cq) }
}

/// Today's SRQ behind a 1.0 SRQ.
///
/// # Safety
///
/// As for [`real`].
pub(super) unsafe fn real_srq(srq: *mut ibv_srq_1_0) -> *mut ibv_srq {
    // SAFETY: per the contract.
    unsafe { real(srq, |s| s.real_srq) }
}

/// Today's QP behind a 1.0 QP.
///
/// # Safety
///
/// As for [`real`].
pub(super) unsafe fn real_qp(qp: *mut ibv_qp_1_0) -> *mut ibv_qp {
    // SAFETY: per the contract.
    unsafe { real(qp, |q| q.real_qp) }
}

/// Today's address handle behind a 1.0 one.
///
/// # Safety
///
/// As for [`real`].
pub(super) unsafe fn real_ah(ah: *mut ibv_ah_1_0) -> *mut ibv_ah {
    // SAFETY: per the contract.
    unsafe { real(ah, |a| a.real_ah) }
}

/// The 1.0 context a 1.0 PD belongs to; null for null.
///
/// # Safety
///
/// As for [`real`].
unsafe fn context_of(pd: *mut ibv_pd_1_0) -> *mut ibv_context_1_0 {
    // SAFETY: per the contract.
    unsafe { real(pd, |p| p.context) }
}

/// Frees a 1.0 PD, region or address handle once today's destroy of its object succeeded.
///
/// # Safety
///
/// `legacy` is a live box of this module's, which the program hands back once.
unsafe fn destroyed<T>(legacy: *mut T, result: c_int) -> c_int {
    if result == 0 && !legacy.is_null() {
        // SAFETY: per the contract; today's object is gone, and so is the program's use.
        drop(unsafe { Box::from_raw(legacy) });
    }
    result
}

/// `ibv_alloc_pd` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd_1_0(context: *mut ibv_context_1_0) -> *mut ibv_pd_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a context it opened.
        let made = unsafe { memory::ibv_alloc_pd(real_context(context)) };
        // SAFETY: null, or the PD just allocated.
        let Some(pd) = (unsafe { made.as_ref() }) else {
            return ptr::null_mut();
        };
        Box::into_raw(Box::new(ibv_pd_1_0 {
            context,
            handle: pd.handle,
            real_pd: made,
        }))
    })
}

/// `ibv_dealloc_pd` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd_1_0(pd: *mut ibv_pd_1_0) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a PD it allocated, once.
        unsafe { destroyed(pd, memory::ibv_dealloc_pd(real_pd(pd))) }
    })
}

/// `ibv_reg_mr` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_1_0(
    pd: *mut ibv_pd_1_0,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> *mut ibv_mr_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and its own memory.
        let made = unsafe { memory::ibv_reg_mr(real_pd(pd), addr, length, access) };
        // SAFETY: null, or the region just registered.
        let Some(mr) = (unsafe { made.as_ref() }) else {
            return ptr::null_mut();
        };
        Box::into_raw(Box::new(ibv_mr_1_0 {
            // SAFETY: today's verb took the PD: it is the program's.
            context: unsafe { context_of(pd) },
            pd,
            handle: mr.handle,
            lkey: mr.lkey,
            rkey: mr.rkey,
            real_mr: made,
        }))
    })
}

/// `ibv_dereg_mr` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr_1_0(mr: *mut ibv_mr_1_0) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a region it registered, once.
        unsafe { destroyed(mr, memory::ibv_dereg_mr(real(mr, |m| m.real_mr))) }
    })
}

/// `ibv_create_cq` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq_1_0(
    context: *mut ibv_context_1_0,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq_1_0 {
    guard(ptr::null_mut(), || {
        let channel = crate::verbs_1_0::today_channel(channel);
        // SAFETY: the program passes a context it opened and a channel of its, or null.
        let made = unsafe {
            cq::ibv_create_cq(real_context(context), cqe, cq_context, channel, comp_vector)
        };
        // SAFETY: null, or the CQ just created, the program's only when this returns.
        let Some(today) = (unsafe { Cq::from_ibv(made) }) else {
            return ptr::null_mut();
        };
        let (mutex, cond) = unused_lock();
        let legacy = today.legacy.set(Box::new(ibv_cq_1_0 {
            context,
            cq_context,
            handle: today.ibv.handle,
            cqe: today.ibv.cqe,
            mutex,
            cond,
            comp_events_completed: 0,
            async_events_completed: 0,
            real_cq: made,
        }));
        // SAFETY: as above: no other thread has the CQ yet. Its channel's events give this.
        unsafe { (*made).cq_context = legacy.cast() };
        legacy
    })
}

/// `ibv_resize_cq` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq_1_0(cq: *mut ibv_cq_1_0, cqe: c_int) -> c_int {
    // SAFETY: the program passes a CQ it created.
    unsafe { cq::ibv_resize_cq(real_cq(cq), cqe) }
}

/// `ibv_destroy_cq` of 1.0: the 1.0 CQ goes with today's (at once, or at the acknowledgement
/// of its last event the program holds).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq_1_0(cq: *mut ibv_cq_1_0) -> c_int {
    // SAFETY: the program passes a CQ it created.
    unsafe { cq::ibv_destroy_cq(real_cq(cq)) }
}

/// `ibv_get_cq_event` of 1.0: the 1.0 CQ whose event fired, and its context. An event of a
/// CQ that no 1.0 verb made (a program mixing the two ABIs) is acknowledged here and passed
/// over: it has no 1.0 structure to name it by, nor to acknowledge it through. The wait,
/// today's, is a cancellation point (`crate::blocking`): it runs under no guard of this call's.
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_cq_event_1_0(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq_1_0,
    cq_context: *mut *mut c_void,
) -> c_int {
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let channel = guard(ptr::null_mut(), || crate::verbs_1_0::today_channel(channel));
    loop {
        let (mut fired, mut context) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: the program passes a channel it created; the out-pointers are ours.
        let result =
            unsafe { crate::comp_channel::ibv_get_cq_event(channel, &mut fired, &mut context) };
        if result != 0 {
            return result;
        }
        let named = guard(Some(-1), || {
            // SAFETY: the CQ of the event, held allocated until it is acknowledged.
            let legacy = unsafe { (*fired.cast::<Cq>()).legacy.get() };
            // SAFETY: as above; a CQ with a 1.0 structure is one a 1.0 verb made, whose
            // context the structure keeps.
            let Some(made) = (unsafe { legacy.as_ref() }) else {
                // SAFETY: the event just taken, acknowledged once.
                unsafe { cq::ibv_ack_cq_events(fired, 1) };
                return None;
            };
            // SAFETY: the program's out-pointers, checked above.
            unsafe { (*cq, *cq_context) = (legacy, made.cq_context) };
            Some(0)
        });
        if let Some(result) = named {
            return result;
        }
    }
}

/// `ibv_ack_cq_events` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events_1_0(cq: *mut ibv_cq_1_0, nevents: u32) {
    // SAFETY: the program passes a CQ whose events it got, allocated until they are
    // acknowledged.
    unsafe { cq::ibv_ack_cq_events(real_cq(cq), nevents) }
}

/// `ibv_create_srq` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq_1_0(
    pd: *mut ibv_pd_1_0,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and its own attributes.
        let made = unsafe { qp::ibv_create_srq(real_pd(pd), init_attr) };
        // SAFETY: null, or the SRQ just created, the program's only when this returns.
        let Some(today) = (unsafe { Srq::from_ibv(made) }) else {
            return ptr::null_mut();
        };
        let (mutex, cond) = unused_lock();
        let legacy = today.legacy.set(Box::new(ibv_srq_1_0 {
            // SAFETY: today's verb took the PD: it is the program's.
            context: unsafe { context_of(pd) },
            srq_context: today.ibv.srq_context,
            pd,
            handle: today.ibv.handle,
            mutex,
            cond,
            events_completed: 0,
            real_srq: made,
        }));
        // SAFETY: as above: no other thread has the SRQ yet.
        unsafe { (*made).srq_context = legacy.cast() };
        legacy
    })
}

/// `ibv_modify_srq` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq_1_0(
    srq: *mut ibv_srq_1_0,
    attr: *mut ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    // SAFETY: the program passes an SRQ it created and its own attributes.
    unsafe { qp::ibv_modify_srq(real_srq(srq), attr, attr_mask) }
}

/// `ibv_query_srq` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq_1_0(
    srq: *mut ibv_srq_1_0,
    attr: *mut ibv_srq_attr,
) -> c_int {
    // SAFETY: the program passes an SRQ it created and its own attributes.
    unsafe { qp::ibv_query_srq(real_srq(srq), attr) }
}

/// `ibv_destroy_srq` of 1.0: the 1.0 SRQ goes with today's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq_1_0(srq: *mut ibv_srq_1_0) -> c_int {
    // SAFETY: the program passes an SRQ it created.
    unsafe { qp::ibv_destroy_srq(real_srq(srq)) }
}

/// `ibv_create_qp` of 1.0: the capacities as created reported back in `init_attr->cap`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp_1_0(
    pd: *mut ibv_pd_1_0,
    init_attr: *mut ibv_qp_init_attr_1_0,
) -> *mut ibv_qp_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program's attributes, or null.
        let Some(init) = (unsafe { init_attr.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: the program passes its own CQs and SRQ.
        let mut today_init = unsafe {
            ibv_qp_init_attr {
                qp_context: init.qp_context,
                send_cq: real_cq(init.send_cq),
                recv_cq: real_cq(init.recv_cq),
                srq: real_srq(init.srq),
                cap: init.cap,
                qp_type: init.qp_type,
                sq_sig_all: init.sq_sig_all,
            }
        };
        // SAFETY: the program passes a PD it allocated; the attributes are ours.
        let made = unsafe { qp::ibv_create_qp(real_pd(pd), &mut today_init) };
        // SAFETY: null, or the QP just created, the program's only when this returns.
        let Some(today) = (unsafe { Qp::from_ibv(made) }) else {
            return ptr::null_mut();
        };
        init.cap = today_init.cap;
        let base = &today.ibv.qp_base;
        let (mutex, cond) = unused_lock();
        let legacy = today.legacy.set(Box::new(ibv_qp_1_0 {
            // SAFETY: today's verb took the PD: it is the program's.
            context: unsafe { context_of(pd) },
            qp_context: init.qp_context,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            handle: base.handle,
            qp_num: base.qp_num,
            state: base.state.load(Relaxed).into(),
            qp_type: base.qp_type,
            mutex,
            cond,
            events_completed: 0,
            real_qp: made,
        }));
        // SAFETY: as above: no other thread has the QP yet.
        unsafe { (*made).qp_context = legacy.cast() };
        legacy
    })
}

/// `ibv_query_qp` of 1.0: the creation attributes name the 1.0 CQs and SRQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_1_0(
    qp: *mut ibv_qp_1_0,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr_1_0,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and its own attributes.
        let (Some(legacy), Some(init)) = (unsafe { qp.as_ref() }, unsafe { init_attr.as_mut() })
        else {
            return libc::EINVAL;
        };
        // SAFETY: all-zero is a valid `ibv_qp_init_attr`: null pointers and integers.
        let mut today_init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the program's QP and attributes; the creation attributes are ours.
        let result = unsafe { qp::ibv_query_qp(legacy.real_qp, attr, attr_mask, &mut today_init) };
        if result == 0 {
            // SAFETY: today's query refreshed the QP's state.
            let state = unsafe { (*legacy.real_qp).state.load(Relaxed) };
            legacy.state.store(state, Relaxed);
            *init = ibv_qp_init_attr_1_0 {
                qp_context: legacy.qp_context,
                send_cq: legacy.send_cq,
                recv_cq: legacy.recv_cq,
                srq: legacy.srq,
                cap: today_init.cap,
                qp_type: today_init.qp_type,
                sq_sig_all: today_init.sq_sig_all,
            };
        }
        result
    })
}

/// `ibv_modify_qp` of 1.0: the 1.0 QP's `state` follows today's.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp_1_0(
    qp: *mut ibv_qp_1_0,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and its own attributes.
        let result = unsafe { qp::ibv_modify_qp(real_qp(qp), attr, attr_mask) };
        // SAFETY: today's verb took the QP: it is the program's, and live.
        if let (0, Some(legacy)) = (result, unsafe { qp.as_ref() }) {
            // SAFETY: as above.
            let state = unsafe { (*legacy.real_qp).state.load(Relaxed) };
            legacy.state.store(state, Relaxed);
        }
        result
    })
}

/// `ibv_destroy_qp` of 1.0: the 1.0 QP goes with today's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp_1_0(qp: *mut ibv_qp_1_0) -> c_int {
    // SAFETY: the program passes a QP it created.
    unsafe { qp::ibv_destroy_qp(real_qp(qp)) }
}

/// `ibv_create_ah` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_1_0(
    pd: *mut ibv_pd_1_0,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and its own attributes.
        let made = unsafe { qp::ibv_create_ah(real_pd(pd), attr) };
        // SAFETY: null, or the handle just created.
        let Some(ah) = (unsafe { made.as_ref() }) else {
            return ptr::null_mut();
        };
        Box::into_raw(Box::new(ibv_ah_1_0 {
            // SAFETY: today's verb took the PD: it is the program's.
            context: unsafe { context_of(pd) },
            pd,
            handle: ah.handle,
            real_ah: made,
        }))
    })
}

/// `ibv_destroy_ah` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah_1_0(ah: *mut ibv_ah_1_0) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a handle it created, once.
        unsafe { destroyed(ah, qp::ibv_destroy_ah(real_ah(ah))) }
    })
}

/// `ibv_attach_mcast` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast_1_0(
    qp: *mut ibv_qp_1_0,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    // SAFETY: the program passes a QP it created and its own GID.
    unsafe { qp::ibv_attach_mcast(real_qp(qp), gid, lid) }
}

/// `ibv_detach_mcast` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast_1_0(
    qp: *mut ibv_qp_1_0,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    // SAFETY: the program passes a QP it created and its own GID.
    unsafe { qp::ibv_detach_mcast(real_qp(qp), gid, lid) }
}

at_version! {
    "IBVERBS_1.0";
    ibv_alloc_pd_1_0 => "ibv_alloc_pd",
    ibv_dealloc_pd_1_0 => "ibv_dealloc_pd",
    ibv_reg_mr_1_0 => "ibv_reg_mr",
    ibv_dereg_mr_1_0 => "ibv_dereg_mr",
    ibv_create_cq_1_0 => "ibv_create_cq",
    ibv_resize_cq_1_0 => "ibv_resize_cq",
    ibv_destroy_cq_1_0 => "ibv_destroy_cq",
    ibv_get_cq_event_1_0 => "ibv_get_cq_event",
    ibv_ack_cq_events_1_0 => "ibv_ack_cq_events",
    ibv_create_srq_1_0 => "ibv_create_srq",
    ibv_modify_srq_1_0 => "ibv_modify_srq",
    ibv_query_srq_1_0 => "ibv_query_srq",
    ibv_destroy_srq_1_0 => "ibv_destroy_srq",
    ibv_create_qp_1_0 => "ibv_create_qp",
    ibv_query_qp_1_0 => "ibv_query_qp",
    ibv_modify_qp_1_0 => "ibv_modify_qp",
    ibv_destroy_qp_1_0 => "ibv_destroy_qp",
    ibv_create_ah_1_0 => "ibv_create_ah",
    ibv_destroy_ah_1_0 => "ibv_destroy_ah",
    ibv_attach_mcast_1_0 => "ibv_attach_mcast",
    ibv_detach_mcast_1_0 => "ibv_detach_mcast",
}
