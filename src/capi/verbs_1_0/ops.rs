//! The calls 1.0's inline verbs make through a 1.0 context's ops: polling and arming a CQ, and
//! posting, with 1.0's work requests read in place ([`SendRequest`], [`RecvRequest`]) and
//! posted as today's `ibv_post_*` post theirs.

use std::mem::{size_of, MaybeUninit};
use std::ptr;

use libc::c_int;
use softroce::transport::SendWr;

use super::abi::*;
use super::objects::{real_ah, real_cq, real_qp, real_srq};
use crate::abi::*;
use crate::post::{self, RecvRequest, SendRequest};
use crate::qp::Qp;

/// A 1.0 context's ops: the five its inline verbs call.
pub(super) const OPS_1_0: ibv_context_ops_1_0 = ibv_context_ops_1_0 {
    query_device: None,
    query_port: None,
    alloc_pd: None,
    dealloc_pd: None,
    reg_mr: None,
    dereg_mr: None,
    create_cq: None,
    poll_cq: Some(poll_cq),
    req_notify_cq: Some(req_notify_cq),
    cq_event: None,
    resize_cq: None,
    destroy_cq: None,
    create_srq: None,
    modify_srq: None,
    query_srq: None,
    destroy_srq: None,
    post_srq_recv: Some(post_srq_recv),
    create_qp: None,
    query_qp: None,
    modify_qp: None,
    destroy_qp: None,
    post_send: Some(post_send),
    post_recv: Some(post_recv),
    create_ah: None,
    destroy_ah: None,
    attach_mcast: None,
    detach_mcast: None,
};

/// `ibv_poll_cq` of 1.0.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq_1_0, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the program passes a CQ it created and room for `num_entries` completions.
    unsafe { crate::cq::poll_cq(real_cq(cq), num_entries, wc) }
}

/// `ibv_req_notify_cq` of 1.0.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq_1_0, solicited_only: c_int) -> c_int {
    // SAFETY: the program passes a CQ it created.
    unsafe { crate::cq::req_notify_cq(real_cq(cq), solicited_only) }
}

/// `ibv_post_send` of 1.0.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp_1_0,
    wr: *mut ibv_send_wr_1_0,
    bad_wr: *mut *mut ibv_send_wr_1_0,
) -> c_int {
    // SAFETY: the program passes a QP it created, its chain and its out-pointer.
    unsafe { post::post_send_chain(real_qp(qp), wr, bad_wr) }
}

/// `ibv_post_recv` of 1.0.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp_1_0,
    wr: *mut ibv_recv_wr_1_0,
    bad_wr: *mut *mut ibv_recv_wr_1_0,
) -> c_int {
    // SAFETY: the program passes a QP it created, its chain and its out-pointer.
    unsafe { post::post_recv_chain(real_qp(qp), wr, bad_wr) }
}

/// `ibv_post_srq_recv` of 1.0.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq_1_0,
    wr: *mut ibv_recv_wr_1_0,
    bad_wr: *mut *mut ibv_recv_wr_1_0,
) -> c_int {
    // SAFETY: the program passes an SRQ it created, its chain and its out-pointer.
    unsafe { post::post_srq_recv_chain(real_srq(srq), wr, bad_wr) }
}

// 1.0's union has today's members, the UD one naming a 1.0 handle: the same bytes.
const _: () = assert!(size_of::<send_wr_union_1_0>() == size_of::<send_wr_union>());

impl SendRequest for ibv_send_wr_1_0 {
    fn next(&self) -> *mut Self {
        self.next
    }

    /// Today's request with this one's members, read as today's is: `imm_data` and the union
    /// are copied as bytes, since the program sets only what its opcode names (a fetch-and-add
    /// has no `swap`) and only those are read; a UD request's 1.0 address handle becomes
    /// today's. 1.0 had no window binds: a request with that opcode has none, and is refused.
    unsafe fn request(&self, qp: &Qp) -> Option<SendWr> {
        let mut today = MaybeUninit::<ibv_send_wr>::zeroed();
        let at = today.as_mut_ptr();
        // SAFETY: `at` is ours; the program's members are copied from `self`, which it built,
        // the union as the bytes of today's (same size, same members). On a UD QP, the union's
        // `ud` is the member the program wrote, and its handle one it created.
        unsafe {
            (*at).wr_id = self.wr_id;
            (*at).sg_list = self.sg_list;
            (*at).num_sge = self.num_sge;
            (*at).opcode = self.opcode;
            (*at).send_flags = self.send_flags;
            ptr::copy_nonoverlapping(&raw const self.imm_data, &raw mut (*at).imm_data, 1);
            ptr::copy_nonoverlapping(
                (&raw const self.wr).cast::<u8>(),
                (&raw mut (*at).wr).cast::<u8>(),
                size_of::<send_wr_union_1_0>(),
            );
            if qp.ibv.qp_base.qp_type == IBV_QPT_UD {
                (*at).wr.ud.ah = real_ah(self.wr.ud.ah);
            }
            post::send_wr(qp, &*at)
        }
    }
}

impl RecvRequest for ibv_recv_wr_1_0 {
    fn next(&self) -> *mut Self {
        self.next
    }

    fn parts(&self) -> (u64, *const ibv_sge, c_int) {
        (self.wr_id, self.sg_list, self.num_sge)
    }
}
