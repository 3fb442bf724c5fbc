//! Queue pairs, shared receive queues and address handles: create, modify, query, destroy.
//!
//! `ibv_modify_qp` takes the attributes the program passes, by its mask, to softroce's
//! [`QpAttr`]. RoCE addresses a peer by its GID: an address vector needs its GRH
//! (`is_global`, the peer's GID in `grh.dgid`, `sgid_index` 0), as with rxe and ConnectX.

use std::net::{IpAddr, Ipv6Addr};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use libc::{c_int, c_uint};
use softroce::memory::{Access, BindMw};
use softroce::transport::{
    AddressVector, AsyncEvent, PathMtu, QpAttr, QpState, QpType, SendOp, SendWr, SgeList, SrqId,
    SrqModify,
};
use softroce::verbs::{AddressHandle, ProtectionDomain, QueuePair, SharedReceiveQueue};
use softroce::wire::{Psn, QKey, Qpn, RnrTimer};

use crate::abi::*;
use crate::cq::Cq;
use crate::devices::Context;
use crate::fork::Born;
use crate::held::HeldEvents;
use crate::memory::{access, Pd};
use crate::post::{MAX_INLINE, MAX_SGE};
use crate::users::Users;
use crate::verbs_1_0::abi::{ibv_qp_1_0, ibv_srq_1_0};
use crate::verbs_1_0::Legacy;
use crate::{errno_of, guard, set_errno, unsupported};

/// QPs a device holds at most: the QP number table's practical limit (`softroce::keyed`).
pub(crate) const MAX_QP: c_int = 1 << 19;
/// Requests a queue holds at most.
pub(crate) const MAX_WR: c_int = 1 << 16;
/// `ibv_device_cap_flags`: RNR NAKs, memory windows of type 1 and 2B, a system image GUID.
pub(crate) const DEVICE_CAP_FLAGS: c_uint = (1 << 12) | (1 << 17) | (1 << 24) | (1 << 11);

/// A queue pair: the program's `ibv_qp`, first, as the first part of an `ibv_qp_ex` (whose
/// `ibv_wr_*` calls are filled for a QP created with `send_ops_flags`: [`crate::qp_ex`]).
#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp_ex,
    /// The requests the `ibv_wr_*` calls are building.
    pub batch: Mutex<crate::qp_ex::Batch>,
    /// Held from `ibv_wr_start` to `ibv_wr_complete` or `ibv_wr_abort`.
    pub building: crate::section::Section,
    pub qp: Arc<QueuePair>,
    /// `sq_sig_all`: every send request completes, signalled or not.
    pub sq_sig_all: bool,
    /// The capacities it was created with, for `ibv_query_qp`.
    cap: ibv_qp_cap,
    /// Its asynchronous events the program holds: it stays allocated until they are
    /// acknowledged, as rdma-core's `ibv_destroy_qp` waits for them. Its engine QP goes at the
    /// destroy, as rdma-core destroys the QP in the kernel before it waits: a peer's packets
    /// reach nothing from then on, and a verb called on it meanwhile fails
    /// ([`QueuePair::destroy`]) without reading freed memory, since the handle stays.
    pub held: HeldEvents,
    /// Its libibverbs 1.0 structure, if a 1.0 program made it.
    pub legacy: Legacy<ibv_qp_1_0>,
    born: Born,
}

/// A shared receive queue: the program's `ibv_srq`, first.
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub srq: SharedReceiveQueue,
    /// Its size and limit as last set: `ibv_modify_srq` and `ibv_query_srq` may run in two
    /// threads at once.
    attr: Mutex<ibv_srq_attr>,
    /// Its asynchronous events the program holds (as [`Qp::held`]).
    pub held: HeldEvents,
    /// The QPs created with it.
    pub users: Users,
    /// Its libibverbs 1.0 structure, if a 1.0 program made it.
    pub legacy: Legacy<ibv_srq_1_0>,
    born: Born,
}

/// An address handle: the program's `ibv_ah`, first.
#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub handle: AddressHandle,
    pd: ProtectionDomain,
    born: Born,
}

impl Qp {
    /// The QP behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `qp` is one `ibv_create_qp` returned and `ibv_destroy_qp` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: per the contract, `qp` is the first field of a live `Qp`.
        unsafe { qp.cast::<Qp>().as_ref() }.filter(|qp| qp.born.ours())
    }

    /// Posts a type 1 window's bind (`ibv_bind_mw`).
    pub(crate) fn bind_mw(
        &self,
        wr_id: u64,
        signaled: bool,
        bind: BindMw,
    ) -> softroce::verbs::Result<()> {
        let mut wr = SendWr::new(
            wr_id,
            SendOp::BindMw(bind),
            softroce::transport::Payload::Sges(SgeList::new()),
        );
        wr.signaled = signaled || self.sq_sig_all;
        self.qp.post_send(wr)
    }
}

impl Srq {
    /// The SRQ behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `srq` is one `ibv_create_srq` returned and `ibv_destroy_srq` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> Option<&'a Srq> {
        // SAFETY: per the contract, `srq` is the first field of a live `Srq`.
        unsafe { srq.cast::<Srq>().as_ref() }.filter(|srq| srq.born.ours())
    }
}

impl Ah {
    /// The address handle behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `ah` is one `ibv_create_ah` returned and `ibv_destroy_ah` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(ah: *mut ibv_ah) -> Option<&'a Ah> {
        // SAFETY: per the contract, `ah` is the first field of a live `Ah`.
        unsafe { ah.cast::<Ah>().as_ref() }.filter(|ah| ah.born.ours())
    }
}

/// The program's pointer to the SRQ among `srqs` that has softroce's number `id`.
pub(crate) fn find_srq(srqs: &[usize], id: SrqId) -> Option<usize> {
    srqs.iter().copied().find(|&at| {
        // SAFETY: the context's list holds live SRQs only.
        let srq = unsafe { &*(at as *const Srq) };
        srq.srq.owns(id)
    })
}

/// The state `enum ibv_qp_state`'s `code` names.
pub(crate) fn state_of(code: c_uint) -> Option<QpState> {
    QpState::ALL.get(code as usize).copied()
}

/// `enum ibv_qp_state`'s value for `state`.
fn state_code(state: QpState) -> c_uint {
    QpState::ALL.iter().position(|&s| s == state).unwrap_or(7) as c_uint
}

/// The IP address a RoCE v2 GID names: IPv4-mapped GIDs are IPv4 addresses.
fn gid_addr(gid: &ibv_gid) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(gid.raw)).to_canonical()
}

/// The GID of `addr`.
fn addr_gid(addr: IpAddr) -> ibv_gid {
    let v6 = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    ibv_gid { raw: v6.octets() }
}

/// The peer an address vector names, or why not.
fn peer_of(ah: &ibv_ah_attr) -> Result<IpAddr, &'static str> {
    if ah.is_global == 0 {
        return Err(
            "the address vector has no GRH: RoCE finds a peer by its GID, so an address \
             vector needs is_global = 1 and the peer's GID in grh.dgid (the program's GID \
             option, index 0 here), or an RDMA-CM connection, which fills it in",
        );
    }
    if ah.grh.sgid_index != 0 {
        return Err("sgid_index: the device has one GID, index 0");
    }
    Ok(gid_addr(&ah.grh.dgid))
}

/// softroce's attributes for the program's `attr` under `mask`, or why not.
fn qp_attr(attr: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, &'static str> {
    let has = |bit: c_int| mask & bit != 0;
    let mut out = QpAttr::default();
    if has(IBV_QP_STATE) {
        out.state = Some(state_of(attr.qp_state).ok_or("qp_state is not a QP state")?);
    }
    if has(IBV_QP_CUR_STATE) {
        out.cur_state = Some(state_of(attr.cur_qp_state).ok_or("cur_qp_state is not a QP state")?);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        out.access = Some(access(attr.qp_access_flags).ok_or("qp_access_flags")?);
    }
    if has(IBV_QP_PKEY_INDEX) {
        out.pkey_index = Some(attr.pkey_index);
    }
    if has(IBV_QP_PORT) {
        out.port = Some(attr.port_num);
    }
    if has(IBV_QP_QKEY) {
        out.qkey = Some(QKey(attr.qkey));
    }
    if has(IBV_QP_AV) {
        out.av = Some(AddressVector {
            dest: peer_of(&attr.ah_attr)?,
        });
    }
    if has(IBV_QP_PATH_MTU) {
        out.path_mtu = Some(
            u8::try_from(attr.path_mtu)
                .ok()
                .and_then(PathMtu::from_ibv_enum)
                .ok_or("path_mtu is not an MTU")?,
        );
    }
    if has(IBV_QP_TIMEOUT) {
        out.timeout = Some(attr.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        out.retry_cnt = Some(attr.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        out.rnr_retry = Some(attr.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        out.rq_psn = Some(Psn::new(attr.rq_psn & 0xff_ffff));
    }
    if has(IBV_QP_SQ_PSN) {
        out.sq_psn = Some(Psn::new(attr.sq_psn & 0xff_ffff));
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        out.max_rd_atomic = Some(attr.max_rd_atomic);
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        out.max_dest_rd_atomic = Some(attr.max_dest_rd_atomic);
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(RnrTimer::new(attr.min_rnr_timer));
    }
    if has(IBV_QP_DEST_QPN) {
        out.dest_qpn = Some(Qpn::new(attr.dest_qp_num & 0xff_ffff));
    }
    if has(IBV_QP_ALT_PATH) || has(IBV_QP_PATH_MIG_STATE) {
        return Err("alternate paths (APM): softroce has one path");
    }
    if has(IBV_QP_RATE_LIMIT) && attr.rate_limit != 0 {
        return Err("rate_limit: softroce does not pace QPs");
    }
    Ok(out)
}

/// Writes the attributes `attr` holds into `out` and returns their `ibv_qp_attr_mask`: the
/// inverse of [`qp_attr`], for `ibv_query_qp` and `rdma_init_qp_attr`.
pub(crate) fn write_qp_attr(attr: &QpAttr, out: &mut ibv_qp_attr) -> c_int {
    let mut mask = 0;
    let mut has = |bit: c_int, present: bool| {
        if present {
            mask |= bit;
        }
    };
    has(IBV_QP_STATE, attr.state.is_some());
    out.qp_state = attr.state.map_or(out.qp_state, state_code);
    has(IBV_QP_ACCESS_FLAGS, attr.access.is_some());
    out.qp_access_flags = attr.access.map_or(out.qp_access_flags, access_flags);
    has(IBV_QP_PKEY_INDEX, attr.pkey_index.is_some());
    out.pkey_index = attr.pkey_index.unwrap_or(out.pkey_index);
    has(IBV_QP_PORT, attr.port.is_some());
    out.port_num = attr.port.unwrap_or(out.port_num);
    has(IBV_QP_QKEY, attr.qkey.is_some());
    out.qkey = attr.qkey.map_or(out.qkey, |q| q.0);
    has(IBV_QP_AV, attr.av.is_some());
    if let Some(av) = attr.av {
        out.ah_attr.is_global = 1;
        out.ah_attr.grh.dgid = addr_gid(av.dest);
        out.ah_attr.grh.sgid_index = 0;
        out.ah_attr.grh.hop_limit = 64;
        out.ah_attr.port_num = 1;
    }
    has(IBV_QP_PATH_MTU, attr.path_mtu.is_some());
    out.path_mtu = attr.path_mtu.map_or(out.path_mtu, |m| m.ibv_enum().into());
    has(IBV_QP_TIMEOUT, attr.timeout.is_some());
    out.timeout = attr.timeout.unwrap_or(out.timeout);
    has(IBV_QP_RETRY_CNT, attr.retry_cnt.is_some());
    out.retry_cnt = attr.retry_cnt.unwrap_or(out.retry_cnt);
    has(IBV_QP_RNR_RETRY, attr.rnr_retry.is_some());
    out.rnr_retry = attr.rnr_retry.unwrap_or(out.rnr_retry);
    has(IBV_QP_RQ_PSN, attr.rq_psn.is_some());
    out.rq_psn = attr.rq_psn.map_or(out.rq_psn, Psn::value);
    has(IBV_QP_SQ_PSN, attr.sq_psn.is_some());
    out.sq_psn = attr.sq_psn.map_or(out.sq_psn, Psn::value);
    has(IBV_QP_MAX_QP_RD_ATOMIC, attr.max_rd_atomic.is_some());
    out.max_rd_atomic = attr.max_rd_atomic.unwrap_or(out.max_rd_atomic);
    has(IBV_QP_MAX_DEST_RD_ATOMIC, attr.max_dest_rd_atomic.is_some());
    out.max_dest_rd_atomic = attr.max_dest_rd_atomic.unwrap_or(out.max_dest_rd_atomic);
    has(IBV_QP_MIN_RNR_TIMER, attr.min_rnr_timer.is_some());
    out.min_rnr_timer = attr.min_rnr_timer.map_or(out.min_rnr_timer, RnrTimer::code);
    has(IBV_QP_DEST_QPN, attr.dest_qpn.is_some());
    out.dest_qp_num = attr.dest_qpn.map_or(out.dest_qp_num, Qpn::value);
    mask
}

/// `ibv_create_qp`: RC, UC or UD, on `pd`, with the capacities asked (reported back, as
/// created, in `init_attr->cap`).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: the program's PD and attributes, or null.
        match unsafe { init_attr.as_mut() } {
            // SAFETY: as above.
            Some(init) => unsafe { create(pd, init, false) },
            None => {
                set_errno(libc::EINVAL);
                ptr::null_mut()
            }
        }
    })
}

/// A QP as `ibv_create_qp` makes it, with the `ibv_wr_*` interface if `extended`; null with
/// `errno` set if not.
///
/// # Safety
///
/// `pd` is null or a PD the program allocated and has not deallocated; `init`'s CQs and SRQ
/// are null or the program's live objects.
pub(crate) unsafe fn create(
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
    extended: bool,
) -> *mut ibv_qp {
    // SAFETY: per the contract.
    let Some(owner) = (unsafe { Pd::from_ibv(pd) }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    // SAFETY: the CQs and SRQ named are the program's live objects.
    let (Some(send_cq), Some(recv_cq)) = (unsafe { Cq::from_ibv(init.send_cq) }, unsafe {
        Cq::from_ibv(init.recv_cq)
    }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    // SAFETY: as above.
    let srq = unsafe { Srq::from_ibv(init.srq) };
    let qp_type = match init.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        _ => {
            set_errno(unsupported(
                "ibv_create_qp of this QP type (RC, UC and UD are)",
            ));
            return ptr::null_mut();
        }
    };
    let cap = &mut init.cap;
    let limits_ok = cap.max_send_wr <= MAX_WR as u32
        && cap.max_recv_wr <= MAX_WR as u32
        && cap.max_send_sge <= MAX_SGE as u32
        && cap.max_recv_sge <= MAX_SGE as u32
        && cap.max_inline_data <= MAX_INLINE;
    if !limits_ok {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let mut builder = owner
        .pd
        .create_qp()
        .qp_type(qp_type)
        .send_cq(&send_cq.cq)
        .recv_cq(&recv_cq.cq)
        .max_send_wr(cap.max_send_wr.max(1) as usize)
        .max_recv_wr(cap.max_recv_wr.max(1) as usize);
    if let Some(srq) = srq {
        builder = builder.srq(&srq.srq);
    }
    let qp = match builder.build() {
        Ok(qp) => Arc::new(qp),
        Err(e) => {
            set_errno(errno_of(&e));
            return ptr::null_mut();
        }
    };
    cap.max_send_wr = cap.max_send_wr.max(1);
    cap.max_recv_wr = if srq.is_some() {
        0
    } else {
        cap.max_recv_wr.max(1)
    };
    cap.max_send_sge = MAX_SGE as u32;
    cap.max_recv_sge = MAX_SGE as u32;
    cap.max_inline_data = MAX_INLINE;
    let qpn = qp.qpn();
    let base = ibv_qp {
        context: owner.ibv.context,
        qp_context: init.qp_context,
        pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: qpn.value(),
        qp_num: qpn.value(),
        state: AtomicU32::new(0),
        qp_type: init.qp_type,
        // SAFETY: all-zero pthread objects are their static initialisers on glibc.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        events_completed: 0,
    };
    let mut ibv = crate::qp_ex::unextended(base);
    if extended {
        crate::qp_ex::fill(&mut ibv);
    }
    let boxed = Box::new(Qp {
        ibv,
        batch: Mutex::default(),
        building: Default::default(),
        qp,
        sq_sig_all: init.sq_sig_all != 0,
        cap: *cap,
        held: HeldEvents::default(),
        legacy: Legacy::default(),
        born: Born::now(),
    });
    let raw = Box::into_raw(boxed);
    owner.users.add();
    send_cq.users.add();
    recv_cq.users.add();
    if let Some(srq) = srq {
        srq.users.add();
    }
    // SAFETY: the PD's context is open while the PD lives.
    if let Some(ctx) = unsafe { Context::from_ibv(owner.ibv.context) } {
        let mut objects = ctx.objects.lock().unwrap_or_else(|p| p.into_inner());
        objects.qps.push((qpn, raw as usize));
    }
    raw.cast()
}

/// `ibv_modify_qp`: 0, or the errno (`EINVAL` for a transition or attribute softroce
/// refuses, with one line on standard error saying which).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and its own attributes.
        let (Some(this), Some(attr)) = (unsafe { Qp::from_ibv(qp) }, unsafe {
            read_qp_attr(attr, attr_mask)
        }) else {
            return libc::EINVAL;
        };
        let mut wanted = match qp_attr(&attr, attr_mask) {
            Ok(wanted) => wanted,
            Err(why) => return crate::report("ibv_modify_qp", libc::EINVAL, why),
        };
        if wanted.state.is_none() {
            // A modify without IBV_QP_STATE changes attributes in the QP's current state
            // (RTS to RTS, say, for the minimum RNR timer).
            match this.qp.query() {
                Ok(now) => wanted.state = now.state,
                Err(e) => return errno_of(&e),
            }
        }
        match this.qp.modify(&wanted) {
            Ok(()) => {
                if let Some(state) = wanted.state {
                    this.ibv.qp_base.state.store(state_code(state), Relaxed);
                }
                0
            }
            Err(e) => crate::report("ibv_modify_qp", errno_of(&e), e),
        }
    })
}

/// `ibv_query_qp`: every attribute, whatever the mask, as the QP has them now.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and its own structures.
        let (Some(this), Some(init)) = (unsafe { Qp::from_ibv(qp) }, unsafe { init_attr.as_mut() })
        else {
            return libc::EINVAL;
        };
        let now = match this.qp.query() {
            Ok(now) => now,
            Err(e) => return errno_of(&e),
        };
        // SAFETY: the program's structure, or null.
        let written = unsafe {
            with_qp_attr(attr, |out| {
                // SAFETY: `ibv_qp_attr` is integers, for which zero is valid.
                *out = std::mem::zeroed();
                // What the QP lacks reads as a QP of the device's defaults: ERROR's code if it
                // has no state, path MTU 1024 (3), port 1.
                out.qp_state = 7;
                out.path_mtu = 3;
                out.port_num = 1;
                write_qp_attr(&now, out);
                this.ibv.qp_base.state.store(out.qp_state, Relaxed);
                out.cur_qp_state = out.qp_state;
                out.cap = this.cap;
            })
        };
        if written.is_none() {
            return libc::EINVAL;
        }
        *init = ibv_qp_init_attr {
            qp_context: this.ibv.qp_base.qp_context,
            send_cq: this.ibv.qp_base.send_cq,
            recv_cq: this.ibv.qp_base.recv_cq,
            srq: this.ibv.qp_base.srq,
            cap: this.cap,
            qp_type: this.ibv.qp_base.qp_type,
            sq_sig_all: this.sq_sig_all.into(),
        };
        0
    })
}

/// The bytes of `ibv_qp_attr` before `rate_limit`: all of it in libibverbs 1.0 and in
/// rdma-core's headers before `rate_limit` was added, so all a program built then has.
const QP_ATTR_BEFORE_RATE_LIMIT: usize = std::mem::offset_of!(ibv_qp_attr, rate_limit);

/// The program's attributes for a modify, read as far as a program of any header has them:
/// `rate_limit` only when `attr_mask` names it (a program built before it has no such field,
/// nor sets the bit). `None` for null.
///
/// # Safety
///
/// A non-null `attr` is the program's `ibv_qp_attr`.
unsafe fn read_qp_attr(attr: *const ibv_qp_attr, attr_mask: c_int) -> Option<ibv_qp_attr> {
    if attr.is_null() {
        return None;
    }
    // SAFETY: `ibv_qp_attr` is integers, for which zero is valid.
    let mut read: ibv_qp_attr = unsafe { std::mem::zeroed() };
    // SAFETY: per the contract, the bytes before `rate_limit` are the program's; `rate_limit`
    // too when the mask names it.
    unsafe {
        ptr::copy_nonoverlapping(
            attr.cast::<u8>(),
            ptr::from_mut(&mut read).cast::<u8>(),
            QP_ATTR_BEFORE_RATE_LIMIT,
        );
        if attr_mask & IBV_QP_RATE_LIMIT != 0 {
            read.rate_limit = ptr::addr_of!((*attr).rate_limit).read_unaligned();
        }
    }
    Some(read)
}

/// Runs `f` on a copy of the program's attributes at `attr` and writes the copy back, both as
/// far as a program of any header has them: the bytes before `rate_limit`, which `f` leaves
/// alone (rdma-core's query and `rdma_init_qp_attr` never write it). `None` for null.
///
/// # Safety
///
/// A non-null `attr` is the program's `ibv_qp_attr`, of any header's.
pub(crate) unsafe fn with_qp_attr<R>(
    attr: *mut ibv_qp_attr,
    f: impl FnOnce(&mut ibv_qp_attr) -> R,
) -> Option<R> {
    // SAFETY: per the contract.
    let mut copy = unsafe { read_qp_attr(attr, 0) }?;
    let result = f(&mut copy);
    // SAFETY: per the contract, the bytes before `rate_limit` are the program's.
    unsafe {
        ptr::copy_nonoverlapping(
            ptr::from_ref(&copy).cast::<u8>(),
            attr.cast::<u8>(),
            QP_ATTR_BEFORE_RATE_LIMIT,
        );
    }
    Some(result)
}

/// `ibv_access_flags` for `access`.
fn access_flags(access: Access) -> c_uint {
    [
        (Access::LOCAL_WRITE, 1),
        (Access::REMOTE_WRITE, 2),
        (Access::REMOTE_READ, 4),
        (Access::REMOTE_ATOMIC, 8),
        (Access::MW_BIND, 16),
    ]
    .into_iter()
    .filter(|&(right, _)| access.contains(right))
    .map(|(_, bit)| bit)
    .sum()
}

/// `ibv_destroy_qp`: its outstanding requests are flushed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and has not destroyed, or destroyed with
        // events held (then it is still allocated, and this changes nothing).
        let Some(this) = (unsafe { Qp::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        if !this.held.claim_destroy() {
            return libc::EINVAL;
        }
        let qpn = this.qp.qpn();
        // Gone from the engine now, whoever else holds the handle (a connection of the CM's)
        // and however long the program holds its events. The destroy goes on if the device has
        // stopped: there is nothing left to destroy then.
        let _ = this.qp.destroy();
        // SAFETY: the QP's context is open while the QP lives.
        if let Some(ctx) = unsafe { Context::from_ibv(this.ibv.qp_base.context) } {
            let mut objects = ctx.objects.lock().unwrap_or_else(|p| p.into_inner());
            objects.qps.retain(|&(q, _)| q != qpn);
            drop(objects);
            ctx.forget_events(|event| match *event {
                AsyncEvent::QpFatal { qpn: named }
                | AsyncEvent::QpAccessError { qpn: named }
                | AsyncEvent::QpLastWqeReached { qpn: named } => named == qpn,
                _ => false,
            });
        }
        // SAFETY: the QP's PD, CQs and SRQ, alive while the QP counted in them.
        unsafe {
            Pd::release(this.ibv.qp_base.pd);
            for cq in [this.ibv.qp_base.send_cq, this.ibv.qp_base.recv_cq] {
                if let Some(cq) = Cq::from_ibv(cq) {
                    cq.users.remove();
                }
            }
            if let Some(srq) = Srq::from_ibv(this.ibv.qp_base.srq) {
                srq.users.remove();
            }
        }
        if this.held.destroy() {
            // SAFETY: every QP is a leaked `Box<Qp>`, handed back once; no event of it is held,
            // and none names it any more (it is out of the context's list).
            drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
        }
        // Otherwise the acknowledgement of its last event frees it (`ibv_ack_async_event`).
        0
    })
}

/// `ibv_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and its own attributes.
        let (Some(owner), Some(init)) =
            (unsafe { Pd::from_ibv(pd) }, unsafe { init_attr.as_mut() })
        else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if init.attr.max_wr == 0
            || init.attr.max_wr > MAX_WR as u32
            || init.attr.max_sge > MAX_SGE as u32
        {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let srq = match owner
            .pd
            .create_srq(init.attr.max_wr as usize, init.attr.srq_limit)
        {
            Ok(srq) => srq,
            Err(e) => {
                set_errno(errno_of(&e));
                return ptr::null_mut();
            }
        };
        init.attr.max_sge = MAX_SGE as u32;
        let boxed = Box::new(Srq {
            ibv: ibv_srq {
                context: owner.ibv.context,
                srq_context: init.srq_context,
                pd,
                handle: 0,
                // SAFETY: all-zero pthread objects are their static initialisers on glibc.
                mutex: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                cond: unsafe { std::mem::zeroed() },
                events_completed: 0,
            },
            srq,
            attr: Mutex::new(init.attr),
            held: HeldEvents::default(),
            users: Users::default(),
            legacy: Legacy::default(),
            born: Born::now(),
        });
        let raw = Box::into_raw(boxed);
        owner.users.add();
        // SAFETY: the PD's context is open while the PD lives.
        if let Some(ctx) = unsafe { Context::from_ibv(owner.ibv.context) } {
            ctx.objects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .srqs
                .push(raw as usize);
        }
        raw.cast()
    })
}

/// `ibv_modify_srq`: resize (`IBV_SRQ_MAX_WR`) or arm the limit (`IBV_SRQ_LIMIT`).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes an SRQ it created and its own attributes.
        let (Some(this), Some(attr)) = (unsafe { Srq::from_ibv(srq) }, unsafe { attr.as_ref() })
        else {
            return libc::EINVAL;
        };
        let change = SrqModify {
            max_wr: (mask & IBV_SRQ_MAX_WR != 0).then_some(attr.max_wr as usize),
            srq_limit: (mask & IBV_SRQ_LIMIT != 0).then_some(attr.srq_limit),
        };
        match this.srq.modify(change) {
            Ok(()) => {
                let mut kept = this.attr.lock().unwrap_or_else(|p| p.into_inner());
                if mask & IBV_SRQ_MAX_WR != 0 {
                    kept.max_wr = attr.max_wr;
                }
                if mask & IBV_SRQ_LIMIT != 0 {
                    kept.srq_limit = attr.srq_limit;
                }
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_query_srq`: its size and limit as last set.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes an SRQ it created and its own attributes.
        let (Some(this), Some(out)) = (unsafe { Srq::from_ibv(srq) }, unsafe { attr.as_mut() })
        else {
            return libc::EINVAL;
        };
        *out = *this.attr.lock().unwrap_or_else(|p| p.into_inner());
        0
    })
}

/// `ibv_destroy_srq`: the program's handle goes; `EBUSY` while a QP uses it. softroce's engine
/// keeps the queue itself until the device closes (its core has no destroy for SRQs yet).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes an SRQ it created and has not destroyed.
        let Some(this) = (unsafe { Srq::from_ibv(srq) }) else {
            return libc::EINVAL;
        };
        if this.users.busy() {
            return libc::EBUSY;
        }
        if !this.held.claim_destroy() {
            return libc::EINVAL;
        }
        // SAFETY: the SRQ's context is open while the SRQ lives.
        if let Some(ctx) = unsafe { Context::from_ibv(this.ibv.context) } {
            let mut objects = ctx.objects.lock().unwrap_or_else(|p| p.into_inner());
            objects.srqs.retain(|&at| at != srq as usize);
            drop(objects);
            ctx.forget_events(|event| {
                matches!(*event, AsyncEvent::SrqLimitReached { srq: named } if this.srq.owns(named))
            });
        }
        // SAFETY: the SRQ's PD, alive while the SRQ counted in it.
        unsafe { Pd::release(this.ibv.pd) };
        if this.held.destroy() {
            // SAFETY: every SRQ is a leaked `Box<Srq>`, handed back once; no event of it is
            // held, and none names it any more.
            drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
        }
        // Otherwise the acknowledgement of its last event frees it (`ibv_ack_async_event`).
        0
    })
}

/// `ibv_create_ah`: a UD destination, by its GID.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and its own attributes.
        let (Some(owner), Some(attr)) = (unsafe { Pd::from_ibv(pd) }, unsafe { attr.as_ref() })
        else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let dest = match peer_of(attr) {
            Ok(dest) => dest,
            Err(why) => {
                set_errno(crate::report("ibv_create_ah", libc::EINVAL, why));
                return ptr::null_mut();
            }
        };
        match owner.pd.create_ah(dest) {
            Ok(handle) => {
                let ah = Box::new(Ah {
                    ibv: ibv_ah {
                        context: owner.ibv.context,
                        pd,
                        handle: 0,
                    },
                    handle,
                    pd: owner.pd.clone(),
                    born: Born::now(),
                });
                owner.users.add();
                Box::into_raw(ah).cast()
            }
            Err(e) => {
                set_errno(errno_of(&e));
                ptr::null_mut()
            }
        }
    })
}

/// `ibv_destroy_ah`: the handle is freed only once softroce has let go of it, so that a call
/// that fails may be made again.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes an AH it created and has not destroyed.
        let Some(this) = (unsafe { Ah::from_ibv(ah) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = this.pd.destroy_ah(this.handle) {
            return errno_of(&e);
        }
        // SAFETY: the AH's PD, alive while the AH counted in it.
        unsafe { Pd::release(this.ibv.pd) };
        // SAFETY: every AH is a leaked `Box<Ah>`, handed back once it is destroyed.
        drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
        0
    })
}

/// `ibv_init_ah_from_wc`: the address vector back to the sender of a UD receive, from the
/// GRH its buffer begins with (softroce writes the sender's GID there, as rxe does).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes its context, completion and attributes.
        let (Some(_), Some(wc), Some(out)) = (
            unsafe { Context::from_ibv(context) },
            unsafe { wc.as_ref() },
            unsafe { ah_attr.as_mut() },
        ) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if grh.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `grh` points to the 40 bytes a UD receive buffer begins with, at whatever
        // alignment the program's buffer has: copied out, never borrowed.
        let grh = unsafe { ptr::read_unaligned(grh) };
        if wc.wc_flags & IBV_WC_GRH == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: `ibv_ah_attr` is integers, for which zero is valid.
        *out = unsafe { std::mem::zeroed() };
        out.is_global = 1;
        out.grh.dgid = sender_gid(&grh);
        out.grh.sgid_index = 0;
        out.grh.hop_limit = 0xff;
        out.dlid = wc.slid;
        out.sl = wc.sl;
        out.port_num = port_num;
        0
    })
}

/// The sender's GID from the 40 bytes a UD receive begins with: over IPv6 the IPv6 header
/// (the GRH's own layout), over IPv4 20 unused bytes and the IPv4 header, as rxe writes them
/// and rdma-core reads them.
fn sender_gid(grh: &ibv_grh) -> ibv_gid {
    // SAFETY: `ibv_grh` is 40 bytes of plain data.
    let raw: &[u8; 40] = unsafe { &*ptr::from_ref(grh).cast() };
    if raw[20] >> 4 == 4 {
        let src = std::net::Ipv4Addr::new(raw[32], raw[33], raw[34], raw[35]);
        addr_gid(IpAddr::V4(src))
    } else {
        grh.sgid
    }
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated.
        let Some(owner) = (unsafe { Pd::from_ibv(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: `ibv_ah_attr` is integers, for which zero is valid.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwarded as the program gave them.
        if unsafe { ibv_init_ah_from_wc(owner.ibv.context, port_num, wc, grh, &mut attr) } != 0 {
            return ptr::null_mut();
        }
        // SAFETY: as above, with the attributes just made.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}

/// `ibv_attach_mcast`: softroce has no multicast.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EOPNOTSUPP, || unsupported("ibv_attach_mcast"))
}

/// `ibv_detach_mcast`: softroce has no multicast.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EOPNOTSUPP, || unsupported("ibv_detach_mcast"))
}

/// `ibv_query_ece`: a softroce QP has no vendor options to offer (`EOPNOTSUPP`, as rxe's
/// provider answers).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    guard(libc::EOPNOTSUPP, || unsupported("ibv_query_ece"))
}

/// `ibv_set_ece`: as [`ibv_query_ece`].
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    guard(libc::EOPNOTSUPP, || unsupported("ibv_set_ece"))
}

/// `ibv_query_qp_data_in_order`: 0, no promise that a message's data lands in order, as rxe's
/// provider answers (it has no such call, and rdma-core answers 0 for it). softroce places a
/// message's packets in PSN order, but its copies into the program's memory are not ordered
/// for another CPU's reads byte by byte, which is what the promise would mean.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: c_uint,
    _flags: u32,
) -> c_int {
    0
}
