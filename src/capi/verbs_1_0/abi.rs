//! The structures of libibverbs 1.0's ABI (2005-2006), as programs built against it lay them
//! out: each object is the program's view, then (where 1.0 had a member no program reads) the
//! pointer to the object of today's ABI it stands for, as rdma-core's `compat-1_0.c` keeps
//! them. No header installs these any more; `tests/layout.rs` checks them against
//! `tests/c/verbs_1_0.h`, the 1.0 declarations as the old `<infiniband/verbs.h>` had them.
//!
//! What did not change shape since 1.0 (`ibv_wc`, `ibv_sge`, the device attributes, the
//! async event) is today's, from [`crate::abi`]. What grew at its end since (`ibv_qp_attr` by
//! `rate_limit`, `ibv_port_attr` by `link_layer` and more) is today's too, read and written
//! only as far as 1.0's went, as for any program built before the growth
//! (`crate::qp::with_qp_attr`, the compat `ibv_query_port`).

// The fields are the old header's.
#![allow(non_camel_case_types, missing_docs)]

use std::sync::atomic::AtomicU32;

use libc::{c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t};

use crate::abi::{
    _ibv_device_ops, ibv_ah, ibv_context, ibv_cq, ibv_device, ibv_mr, ibv_pd, ibv_qp, ibv_qp_cap,
    ibv_sge, ibv_srq, ibv_wc, send_wr_atomic, send_wr_rdma,
};

/// `struct ibv_device` of 1.0: its first two members pointed into libsysfs; the third, once the
/// driver, is the device of today's list.
#[repr(C)]
pub struct ibv_device_1_0 {
    pub obsolete_sysfs_dev: *mut c_void,
    pub obsolete_sysfs_ibdev: *mut c_void,
    pub real_device: *mut ibv_device,
    pub _ops: _ibv_device_ops,
}

/// The calls 1.0's inline verbs made through the context (`ibv_poll_cq`, `ibv_req_notify_cq`,
/// `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`), on 1.0's objects. The other
/// entries were the library's own in 1.0 too, which programs called by name: null, as
/// rdma-core leaves them.
#[repr(C)]
pub struct ibv_context_ops_1_0 {
    pub query_device: Unused,
    pub query_port: Unused,
    pub alloc_pd: Unused,
    pub dealloc_pd: Unused,
    pub reg_mr: Unused,
    pub dereg_mr: Unused,
    pub create_cq: Unused,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq_1_0, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq_1_0, c_int) -> c_int>,
    pub cq_event: Unused,
    pub resize_cq: Unused,
    pub destroy_cq: Unused,
    pub create_srq: Unused,
    pub modify_srq: Unused,
    pub query_srq: Unused,
    pub destroy_srq: Unused,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(
            *mut ibv_srq_1_0,
            *mut ibv_recv_wr_1_0,
            *mut *mut ibv_recv_wr_1_0,
        ) -> c_int,
    >,
    pub create_qp: Unused,
    pub query_qp: Unused,
    pub modify_qp: Unused,
    pub destroy_qp: Unused,
    pub post_send: Option<
        unsafe extern "C" fn(
            *mut ibv_qp_1_0,
            *mut ibv_send_wr_1_0,
            *mut *mut ibv_send_wr_1_0,
        ) -> c_int,
    >,
    pub post_recv: Option<
        unsafe extern "C" fn(
            *mut ibv_qp_1_0,
            *mut ibv_recv_wr_1_0,
            *mut *mut ibv_recv_wr_1_0,
        ) -> c_int,
    >,
    pub create_ah: Unused,
    pub destroy_ah: Unused,
    pub attach_mcast: Unused,
    pub detach_mcast: Unused,
}

/// An entry of [`ibv_context_ops_1_0`] that programs called by its exported name: null.
pub type Unused = Option<unsafe extern "C" fn()>;

/// `struct ibv_context` of 1.0; its last member, once `abi_compat`, is today's context.
#[repr(C)]
pub struct ibv_context_1_0 {
    pub device: *mut ibv_device_1_0,
    pub ops: ibv_context_ops_1_0,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub real_context: *mut ibv_context,
}

/// `struct ibv_comp_channel` of 1.0: its descriptor alone.
#[repr(C)]
pub struct ibv_comp_channel_1_0 {
    pub fd: c_int,
}

/// `struct ibv_pd` of 1.0.
#[repr(C)]
pub struct ibv_pd_1_0 {
    pub context: *mut ibv_context_1_0,
    pub handle: u32,
    pub real_pd: *mut ibv_pd,
}

/// `struct ibv_mr` of 1.0.
#[repr(C)]
pub struct ibv_mr_1_0 {
    pub context: *mut ibv_context_1_0,
    pub pd: *mut ibv_pd_1_0,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub real_mr: *mut ibv_mr,
}

/// `struct ibv_srq` of 1.0. The mutex, condition and counter served 1.0's destroy, which
/// waited for events; they are left as made.
#[repr(C)]
pub struct ibv_srq_1_0 {
    pub context: *mut ibv_context_1_0,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd_1_0,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
    pub real_srq: *mut ibv_srq,
}

/// `struct ibv_qp_init_attr` of 1.0: with 1.0's CQs and SRQ.
#[repr(C)]
pub struct ibv_qp_init_attr_1_0 {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq_1_0,
    pub recv_cq: *mut ibv_cq_1_0,
    pub srq: *mut ibv_srq_1_0,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// The `ud` member of 1.0's send request union: a 1.0 address handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct send_wr_ud_1_0 {
    pub ah: *mut ibv_ah_1_0,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of 1.0's send request.
#[repr(C)]
#[derive(Clone, Copy)]
pub union send_wr_union_1_0 {
    pub rdma: send_wr_rdma,
    pub atomic: send_wr_atomic,
    pub ud: send_wr_ud_1_0,
}

/// `struct ibv_send_wr` of 1.0: `next` before `wr_id`, and nothing after the union.
#[repr(C)]
pub struct ibv_send_wr_1_0 {
    pub next: *mut ibv_send_wr_1_0,
    pub wr_id: u64,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: send_wr_union_1_0,
}

/// `struct ibv_recv_wr` of 1.0: `next` before `wr_id`.
#[repr(C)]
pub struct ibv_recv_wr_1_0 {
    pub next: *mut ibv_recv_wr_1_0,
    pub wr_id: u64,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_qp` of 1.0.
#[repr(C)]
pub struct ibv_qp_1_0 {
    pub context: *mut ibv_context_1_0,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd_1_0,
    pub send_cq: *mut ibv_cq_1_0,
    pub recv_cq: *mut ibv_cq_1_0,
    pub srq: *mut ibv_srq_1_0,
    pub handle: u32,
    pub qp_num: u32,
    /// `enum ibv_qp_state` as the last modify left it, written while other threads of the
    /// program may read it: an atomic of `c_uint`'s layout, as today's `ibv_qp::state`.
    pub state: AtomicU32,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
    pub real_qp: *mut ibv_qp,
}

/// `struct ibv_cq` of 1.0: no channel member.
#[repr(C)]
pub struct ibv_cq_1_0 {
    pub context: *mut ibv_context_1_0,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub real_cq: *mut ibv_cq,
}

/// `struct ibv_ah` of 1.0.
#[repr(C)]
pub struct ibv_ah_1_0 {
    pub context: *mut ibv_context_1_0,
    pub pd: *mut ibv_pd_1_0,
    pub handle: u32,
    pub real_ah: *mut ibv_ah,
}
