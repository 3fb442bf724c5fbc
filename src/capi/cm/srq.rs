//! An ID's shared receive queue, as librdmacm makes it (`rdma_create_srq`, `rdma_create_srq_ex`,
//! `rdma_destroy_srq`): on the ID's device, named by `id->srq`, which `rdma_create_qp` then
//! gives the ID's QP unless its attributes name another, and which `rdma_destroy_ep` destroys.

use libc::c_int;

use super::id::with_id;
use crate::abi::*;
use crate::devices::Context;
use crate::unsupported;

/// `rdma_create_srq`: an SRQ on `pd` (the ID's PD, or its device's, if null) with `attr`,
/// whose capacities it updates. `EINVAL` for an ID without a device or with an SRQ already,
/// or a PD of another context.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program's attributes, or null.
        let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if this.ibv.verbs.is_null() || !this.ibv.srq.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the ID's context is one of librdmacm's, open for the process's life.
        let context = unsafe { Context::from_ibv(this.ibv.verbs) }.ok_or(libc::EINVAL)?;
        // The ID's PD when none is given, as librdmacm: one that lives (see `settle_pd`).
        let pd = match (pd.is_null(), this.ibv.pd.is_null()) {
            (false, _) => pd,
            (true, false) => this.ibv.pd,
            (true, true) => context.default_pd()?,
        };
        // SAFETY: a PD the program allocated and has not freed, or librdmacm's.
        let owner = unsafe { crate::memory::Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if owner.ibv.context != this.ibv.verbs {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live PD and the program's attributes.
        let srq = unsafe { crate::qp::ibv_create_srq(pd, attr) };
        if srq.is_null() {
            return Err(super::last_errno());
        }
        this.ibv.srq = srq;
        if this.ibv.pd.is_null() {
            this.ibv.pd = pd;
        }
        Ok(0)
    })
}

/// `rdma_create_srq_ex`: as [`rdma_create_srq`], with the extended attributes' PD. A basic SRQ
/// only: XRC and tag-matching SRQs are `EOPNOTSUPP`, as on a device without them. `EINVAL`
/// without `IBV_SRQ_INIT_ATTR_TYPE`, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    crate::guard(-1, || {
        // SAFETY: the program's attributes, or null.
        let Some(ex) = (unsafe { attr.as_mut() }) else {
            crate::set_errno(libc::EINVAL);
            return -1;
        };
        if ex.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
        let known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        if ex.srq_type != IBV_SRQT_BASIC || ex.comp_mask & !known != 0 {
            crate::set_errno(unsupported("rdma_create_srq_ex beyond a basic SRQ"));
            return -1;
        }
        let pd = if ex.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
            ex.pd
        } else {
            std::ptr::null_mut()
        };
        let mut plain = ibv_srq_init_attr {
            srq_context: ex.srq_context,
            attr: ex.attr,
        };
        // SAFETY: forwarded with the same meaning.
        let made = unsafe { rdma_create_srq(id, pd, &mut plain) };
        if made == 0 {
            ex.attr = plain.attr;
            if pd.is_null() {
                // SAFETY: the ID, which `rdma_create_srq` found live, names the PD it took.
                ex.pd = unsafe { (*id).pd };
                ex.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
            }
        }
        made
    })
}

/// `rdma_destroy_srq`: the ID's SRQ, and the CQs librdmacm made for the ID.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    with_id(id, |this| {
        let srq = std::mem::replace(&mut this.ibv.srq, std::ptr::null_mut());
        if !srq.is_null() {
            // SAFETY: the SRQ `rdma_create_srq` made, destroyed once.
            unsafe { crate::qp::ibv_destroy_srq(srq) };
        }
        this.destroy_cqs();
        this.settle_pd();
        Ok(0)
    });
}
