//! The extended QP: `ibv_create_qp_ex` (the context's `create_qp_ex`) with `send_ops_flags`,
//! `ibv_qp_to_qp_ex`, and the `ibv_wr_*` calls that build and post send requests through the
//! `ibv_qp_ex` the program holds.
//!
//! Between `ibv_wr_start` and `ibv_wr_complete` the calls build a batch of softroce's
//! [`SendWr`]s in the QP ([`Batch`]): each operation call (`ibv_wr_send`, `ibv_wr_rdma_write`,
//! ...) begins a request with the `wr_id` and `wr_flags` the program set in the `ibv_qp_ex`,
//! and the setters that follow give it its data (`ibv_wr_set_sge`, `ibv_wr_set_inline_data`,
//! ...) and, on UD, its destination. `ibv_wr_complete` posts the batch whole, with one
//! doorbell, or nothing: a call that could not be honoured (a malformed setter, an operation
//! softroce lacks) or a request the send queue has no room for makes it post nothing and
//! return the error, as `ibv_wr_post(3)` has it; `ibv_wr_abort` drops the batch. From start to
//! complete the batch is the thread's that started it ([`crate::section`]). Inline data is
//! copied when it is set, as verbs require. The operations a QP may ask for are rxe's for its
//! type.

use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::MutexGuard;

use libc::{c_int, c_void, size_t};
use softroce::transport::{Payload, SendOp, SendWr, SgeList};
use softroce::wire::{LKey, RKey};

use crate::abi::*;
use crate::post::{bind_of, gather_inline, sges, ud_dest, MAX_SGE};
use crate::qp::{self, Qp};
use crate::{errno_of, guard, set_errno, unsupported};

/// The operations rxe's extended QPs take, by QP type (rdma-core's `providers/rxe`).
fn send_ops_of(qp_type: u32) -> u64 {
    let unreliable = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    let connected = unreliable
        | IBV_QP_EX_WITH_RDMA_WRITE
        | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | IBV_QP_EX_WITH_LOCAL_INV
        | IBV_QP_EX_WITH_BIND_MW
        | IBV_QP_EX_WITH_SEND_WITH_INV;
    match qp_type {
        IBV_QPT_RC => {
            connected
                | IBV_QP_EX_WITH_RDMA_READ
                | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        }
        IBV_QPT_UC => connected,
        IBV_QPT_UD => unreliable,
        _ => 0,
    }
}

/// `ibv_qp_init_attr`, the first part of `attr`.
pub(crate) fn plain(attr: &ibv_qp_init_attr_ex) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: attr.qp_context,
        send_cq: attr.send_cq,
        recv_cq: attr.recv_cq,
        srq: attr.srq,
        cap: attr.cap,
        qp_type: attr.qp_type,
        sq_sig_all: attr.sq_sig_all,
    }
}

/// The `send_ops_flags` of `attr`, if it asks for the `ibv_wr_*` interface: `Ok(None)` if it
/// does not, `Err(errno)` if it names attributes beyond a PD and send operations, or operations
/// the QP's type cannot take.
pub(crate) fn send_ops(attr: &ibv_qp_init_attr_ex, verb: &str) -> Result<Option<u64>, c_int> {
    let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if attr.comp_mask & !known != 0 {
        return Err(unsupported(&format!(
            "{verb} beyond a PD and send operations"
        )));
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS == 0 {
        return Ok(None);
    }
    if attr.send_ops_flags & !send_ops_of(attr.qp_type) != 0 {
        return Err(unsupported(&format!(
            "{verb} with send operations this QP type lacks (TSO, atomic write, or more than \
             rxe's for the type)"
        )));
    }
    Ok(Some(attr.send_ops_flags))
}

/// The context op `create_qp_ex` (`ibv_create_qp_ex` with more than a PD).
pub(crate) unsafe extern "C" fn create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: the program's attributes, or null.
        let Some(ex) = (unsafe { attr.as_mut() }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let extended = match send_ops(ex, "ibv_create_qp_ex") {
            Ok(ops) => ops.is_some(),
            Err(errno) => {
                set_errno(errno);
                return ptr::null_mut();
            }
        };
        if ex.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        }
        let mut init = plain(ex);
        // SAFETY: the program's PD and attributes, as `ibv_create_qp` takes them.
        let made = unsafe { qp::create(ex.pd, &mut init, extended) };
        ex.cap = init.cap;
        made
    })
}

/// `ibv_qp_to_qp_ex`: the QP's `ibv_qp_ex` if it was created with `send_ops_flags`; else
/// null, as rdma-core answers (perftest and the pingpongs then post with `ibv_post_send`).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a QP it created and has not destroyed.
        match unsafe { Qp::from_ibv(qp) } {
            Some(this) if this.ibv.wr_start.is_some() => qp.cast(),
            _ => ptr::null_mut(),
        }
    })
}

/// The `ibv_qp_ex` of a QP without the `ibv_wr_*` interface: `base`, and no calls.
pub(crate) fn unextended(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: AtomicU64::new(0),
        wr_flags: AtomicU32::new(0),
        wr_atomic_cmp_swp: None,
        wr_atomic_fetch_add: None,
        wr_bind_mw: None,
        wr_local_inv: None,
        wr_rdma_read: None,
        wr_rdma_write: None,
        wr_rdma_write_imm: None,
        wr_send: None,
        wr_send_imm: None,
        wr_send_inv: None,
        wr_send_tso: None,
        wr_set_ud_addr: None,
        wr_set_xrc_srqn: None,
        wr_set_inline_data: None,
        wr_set_inline_data_list: None,
        wr_set_sge: None,
        wr_set_sge_list: None,
        wr_start: None,
        wr_complete: None,
        wr_abort: None,
        wr_atomic_write: None,
    }
}

/// The `ibv_wr_*` calls, in the `ibv_qp_ex` of a QP created with `send_ops_flags`.
pub(crate) fn fill(ex: &mut ibv_qp_ex) {
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_send_tso = Some(wr_send_tso);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_atomic_write = Some(wr_atomic_write);
}

/// The requests an `ibv_wr_start` has begun, and the first error among the calls since.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Kept between batches: a batch allocates only when it is larger than any before.
    requests: Vec<SendWr>,
    /// The errno `ibv_wr_complete` returns, 0 for none.
    error: c_int,
}

impl Batch {
    fn clear(&mut self) {
        self.requests.clear();
        self.error = 0;
    }

    /// Records the batch's first error.
    fn fail(&mut self, errno: c_int) {
        if self.error == 0 {
            self.error = errno;
        }
    }

    /// The request the last operation call began, or the error recorded if there is none.
    fn last(&mut self) -> Option<&mut SendWr> {
        if self.requests.is_empty() {
            self.fail(libc::EINVAL);
        }
        self.requests.last_mut()
    }
}

/// Runs `body` on the QP behind `qp` and its batch; nothing for a QP that is not the program's.
///
/// # Safety
///
/// `qp` is an `ibv_qp_ex` that `ibv_qp_to_qp_ex` returned, of a QP not destroyed.
unsafe fn with_batch<T: Default>(
    qp: *mut ibv_qp_ex,
    body: impl FnOnce(&Qp, MutexGuard<'_, Batch>) -> T,
) -> T {
    guard(T::default(), || {
        // SAFETY: per the contract; the `ibv_qp_ex` is the first field of a `Qp`.
        match unsafe { Qp::from_ibv(qp.cast()) } {
            Some(this) => body(this, this.batch.lock().unwrap_or_else(|p| p.into_inner())),
            None => T::default(),
        }
    })
}

/// Begins a request of `op` with the `wr_id` and `wr_flags` the program set.
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn begin(qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: per the contract.
    unsafe {
        with_batch(qp, |this, mut batch| {
            let flags = this.ibv.wr_flags.load(Relaxed);
            let wr_id = this.ibv.wr_id.load(Relaxed);
            let mut request = SendWr::new(wr_id, op, Payload::Sges(SgeList::new()));
            request.signaled = flags & IBV_SEND_SIGNALED != 0 || this.sq_sig_all;
            request.fence = flags & IBV_SEND_FENCE != 0;
            request.solicited = flags & IBV_SEND_SOLICITED != 0;
            batch.requests.push(request);
        })
    }
}

/// Gives the current request `payload`, or records `EINVAL` for `None` (a malformed list, or
/// inline data beyond the limit) and for inline data on a READ or an atomic.
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn set_payload(qp: *mut ibv_qp_ex, payload: Option<Payload>) {
    // SAFETY: per the contract.
    unsafe {
        with_batch(qp, |_, mut batch| {
            let Some(payload) = payload else {
                return batch.fail(libc::EINVAL);
            };
            let Some(request) = batch.last() else {
                return;
            };
            if matches!(payload, Payload::Inline(_)) && request.op.is_read_or_atomic() {
                return batch.fail(libc::EINVAL);
            }
            request.payload = payload;
        })
    }
}

/// Records that the batch asked for what softroce lacks.
///
/// # Safety
///
/// As [`with_batch`].
unsafe fn lacks(qp: *mut ibv_qp_ex, verb: &str) {
    // SAFETY: per the contract.
    unsafe { with_batch(qp, |_, mut batch| batch.fail(unsupported(verb))) }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: the program's QP, as `ibv_wr_start` requires.
        if let Some(this) = unsafe { Qp::from_ibv(qp.cast()) } {
            // Until `ibv_wr_complete` or `ibv_wr_abort`, the QP's batch is this thread's.
            this.building.enter();
            this.batch.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    })
}

/// `ibv_wr_complete`: posts the batch whole (0), or nothing with the error: the first of its
/// calls' (`EINVAL` for a malformed one, `EOPNOTSUPP`), or the post's (`ENOMEM` for a send
/// queue without room for all of it, `EINVAL` for a request the QP cannot send). `EINVAL` for
/// a QP that is not the program's; `EIO` if softroce failed.
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's QP, as `ibv_wr_complete` requires.
        let Some(this) = (unsafe { Qp::from_ibv(qp.cast()) }) else {
            return libc::EINVAL;
        };
        let posted = {
            let mut batch = this.batch.lock().unwrap_or_else(|p| p.into_inner());
            let unaddressed = this.ibv.qp_base.qp_type == IBV_QPT_UD
                && batch.requests.iter().any(|r| r.ud.is_none());
            if unaddressed {
                batch.fail(libc::EINVAL);
            }
            let error = batch.error;
            let posted = if error != 0 {
                Err(error)
            } else {
                this.qp
                    .post_send_all(&mut batch.requests)
                    .map_err(|e| errno_of(&e))
            };
            batch.clear();
            posted
        };
        this.building.leave();
        posted.err().unwrap_or(0)
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: the program's QP, as `ibv_wr_abort` requires.
        if let Some(this) = unsafe { Qp::from_ibv(qp.cast()) } {
            this.batch.lock().unwrap_or_else(|p| p.into_inner()).clear();
            this.building.leave();
        }
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::Send) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
    let imm = u32::from_be(imm_data);
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::SendWithImm { imm }) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let rkey = RKey(invalidate_rkey);
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::SendWithInv { rkey }) }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = RKey(rkey);
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::Write { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    let (rkey, imm) = (RKey(rkey), u32::from_be(imm_data));
    let op = SendOp::WriteWithImm {
        remote_addr,
        rkey,
        imm,
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, op) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = RKey(rkey);
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::Read { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::CompareSwap {
        remote_addr,
        rkey: RKey(rkey),
        compare,
        swap,
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::FetchAdd {
        remote_addr,
        rkey: RKey(rkey),
        add,
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, op) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let rkey = RKey(invalidate_rkey);
    // SAFETY: the program's QP, as the call requires.
    unsafe { begin(qp, SendOp::LocalInv { rkey }) }
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    // SAFETY: the program's window and bind, its live objects or null.
    let bind = unsafe { bind_info.as_ref().and_then(|info| bind_of(mw, rkey, info)) };
    match bind {
        // SAFETY: the program's QP, as the call requires.
        Some(bind) => unsafe { begin(qp, SendOp::BindMw(bind)) },
        // SAFETY: as above.
        None => unsafe { with_batch(qp, |_, mut batch| batch.fail(libc::EINVAL)) },
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = softroce::transport::Sge {
        addr,
        len: length,
        lkey: LKey(lkey),
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { set_payload(qp, Some(Payload::Sges(std::iter::once(sge).collect()))) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: size_t, sg_list: *const ibv_sge) {
    let list = match c_int::try_from(num_sge) {
        // SAFETY: the program's list of `num_sge` SGEs (`sges` refuses more than MAX_SGE).
        Ok(n) => unsafe { sges(sg_list, n) },
        Err(_) => None,
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { set_payload(qp, list.map(Payload::Sges)) }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: size_t) {
    let data = if addr.is_null() && length > 0 {
        None
    } else {
        // SAFETY: the program's `length` bytes at `addr`, read now.
        unsafe { gather_inline(std::iter::once((addr.cast_const().cast::<u8>(), length))) }
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { set_payload(qp, data.map(Payload::Inline)) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: size_t,
    buf_list: *const ibv_data_buf,
) {
    let data = if num_buf > MAX_SGE as size_t || (buf_list.is_null() && num_buf > 0) {
        None
    } else if num_buf == 0 {
        Some(softroce::transport::InlineData::new())
    } else {
        // SAFETY: the program's list of `num_buf` buffers.
        let list = unsafe { std::slice::from_raw_parts(buf_list, num_buf) };
        // SAFETY: each buffer's bytes, read now.
        unsafe {
            gather_inline(
                list.iter()
                    .map(|b| (b.addr.cast_const().cast::<u8>(), b.length)),
            )
        }
    };
    // SAFETY: the program's QP, as the call requires.
    unsafe { set_payload(qp, data.map(Payload::Inline)) }
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the program's address handle, live or null.
    let dest = unsafe { ud_dest(ah, remote_qpn, remote_qkey) };
    // SAFETY: the program's QP, as the call requires.
    unsafe {
        with_batch(qp, |_, mut batch| {
            let Some(dest) = dest else {
                return batch.fail(libc::EINVAL);
            };
            if let Some(request) = batch.last() {
                request.ud = Some(dest);
            }
        })
    }
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: the program's QP, as the call requires.
    unsafe { lacks(qp, "ibv_wr_send_tso") }
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _remote_srqn: u32) {
    // SAFETY: the program's QP, as the call requires.
    unsafe { lacks(qp, "ibv_wr_set_xrc_srqn (XRC)") }
}

unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _atomic_wr: *const c_void,
) {
    // SAFETY: the program's QP, as the call requires.
    unsafe { lacks(qp, "ibv_wr_atomic_write") }
}
