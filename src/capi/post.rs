//! Posting: `ibv_post_send`, `ibv_post_recv` and `ibv_post_srq_recv` (the inline verbs of
//! `verbs.h`, which call these through the context's ops table), from rdma-core's work
//! requests to softroce's.
//!
//! A chain of send requests goes to the engine in one batch, with one doorbell. A request that
//! cannot be posted stops the chain there: it and those after it are not posted, `*bad_wr`
//! points to it, and the call returns the error (`EINVAL` for a malformed request, `ENOMEM` for
//! a full queue), as rdma-core's providers do.

use std::ptr;

use libc::c_int;
use softroce::memory::BindMw;
use softroce::transport::{InlineData, Payload, RecvWr, SendOp, SendWr, Sge, SgeList, UdDest};
use softroce::wire::{LKey, QKey, Qpn, RKey};

use crate::abi::*;
use crate::memory::{access, Mr, Mw};
use crate::qp::{Ah, Qp, Srq};
use crate::{errno_of, guard};

/// SGEs one work request may name.
pub(crate) const MAX_SGE: c_int = 32;
/// Bytes an inline send may carry.
pub(crate) const MAX_INLINE: u32 = 256;

/// The request's SGEs, or `None` if there are more than [`MAX_SGE`] or the list is null.
///
/// # Safety
///
/// `sg_list` points to `num_sge` SGEs, or `num_sge` is 0.
pub(crate) unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> Option<SgeList> {
    let mut sges = SgeList::new();
    // SAFETY: per the contract.
    unsafe { append_sges(&mut sges, sg_list, num_sge) }.then_some(sges)
}

/// Appends the request's SGEs to the empty `sges`; false if there are more than [`MAX_SGE`]
/// or the list is null. Filled where it lies: a list returned would be moved into the
/// request, and on into the queue, at every post.
///
/// # Safety
///
/// As for [`sges`].
#[inline]
unsafe fn append_sges(sges: &mut SgeList, sg_list: *const ibv_sge, num_sge: c_int) -> bool {
    if num_sge == 0 {
        return true;
    }
    if !(0..=MAX_SGE).contains(&num_sge) || sg_list.is_null() {
        return false;
    }
    // SAFETY: per the contract.
    let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    for sge in list {
        sges.push(Sge {
            addr: sge.addr,
            len: sge.length,
            lkey: LKey(sge.lkey),
        });
    }
    true
}

/// The bytes an inline send carries: its SGEs' bytes, read now, from the program's memory
/// (inline data needs no registration).
///
/// # Safety
///
/// Each SGE names `length` readable bytes at `addr`, as `IBV_SEND_INLINE` requires.
unsafe fn inline_bytes(sg_list: *const ibv_sge, num_sge: c_int) -> Option<InlineData> {
    if num_sge == 0 {
        return Some(InlineData::new());
    }
    if !(0..=MAX_SGE).contains(&num_sge) || sg_list.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    // SAFETY: per the contract.
    unsafe {
        gather_inline(
            list.iter()
                .map(|s| (s.addr as *const u8, s.length as usize)),
        )
    }
}

/// The bytes of `parts` (each a pointer and a length), read now, in one inline payload; `None`
/// if they are more than [`MAX_INLINE`].
///
/// # Safety
///
/// Each part names that many readable bytes.
pub(crate) unsafe fn gather_inline(
    parts: impl Iterator<Item = (*const u8, usize)> + Clone,
) -> Option<InlineData> {
    // Checked: a program's lengths may add up past any integer.
    let total = parts
        .clone()
        .try_fold(0usize, |sum, (_, len)| sum.checked_add(len))?;
    if total > MAX_INLINE as usize {
        return None;
    }
    // Up to INLINE_BYTES in the request itself: a small inline post allocates nothing.
    let mut bytes = InlineData::with_capacity(total);
    for (addr, len) in parts {
        if len == 0 {
            continue;
        }
        // SAFETY: per the contract, `len` readable bytes at `addr`.
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
    }
    Some(bytes)
}

/// Where a UD send goes: the address handle's peer, its QP and Q_Key; `None` for a handle
/// that is not the program's.
///
/// # Safety
///
/// A non-null `ah` is one the program created and has not destroyed.
pub(crate) unsafe fn ud_dest(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) -> Option<UdDest> {
    // SAFETY: per the contract.
    let ah = unsafe { Ah::from_ibv(ah) }?;
    Some(UdDest {
        ah: ah.handle,
        remote_qpn: Qpn::new(remote_qpn & 0xff_ffff),
        remote_qkey: QKey(remote_qkey),
    })
}

/// softroce's send request for the program's `wr` on `qp`; `None` if it is malformed.
///
/// # Safety
///
/// `wr` is a work request the program built, whose pointers are valid as verbs require.
pub(crate) unsafe fn send_wr(qp: &Qp, wr: &ibv_send_wr) -> Option<SendWr> {
    let flags = wr.send_flags;
    // Only the fields the opcode names are read, each by itself: the program wrote those, and
    // may have left the others unset (a request built on the stack), the union's larger
    // members' too: a fetch-and-add has no `swap` (verbs.h).
    let imm = || u32::from_be(wr.imm_data);
    // SAFETY: `rdma`'s fields, which the RDMA opcodes name.
    let rdma = || unsafe { (wr.wr.rdma.remote_addr, RKey(wr.wr.rdma.rkey)) };
    // SAFETY: `atomic`'s address, key and operand, which both atomic opcodes name.
    let atomic = || unsafe {
        let a = &raw const wr.wr.atomic;
        ((*a).remote_addr, RKey((*a).rkey), (*a).compare_add)
    };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm: imm() },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            rkey: RKey(wr.imm_data),
        },
        IBV_WR_RDMA_WRITE => {
            let (remote_addr, rkey) = rdma();
            SendOp::Write { remote_addr, rkey }
        }
        IBV_WR_RDMA_WRITE_WITH_IMM => {
            let (remote_addr, rkey) = rdma();
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: imm(),
            }
        }
        IBV_WR_RDMA_READ => {
            let (remote_addr, rkey) = rdma();
            SendOp::Read { remote_addr, rkey }
        }
        IBV_WR_ATOMIC_CMP_AND_SWP => {
            let (remote_addr, rkey, compare) = atomic();
            // SAFETY: a compare-and-swap names its `swap`.
            let swap = unsafe { wr.wr.atomic.swap };
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            }
        }
        IBV_WR_ATOMIC_FETCH_AND_ADD => {
            let (remote_addr, rkey, add) = atomic();
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            }
        }
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            rkey: RKey(wr.imm_data),
        },
        // SAFETY: the bind's pointers are the program's live objects.
        IBV_WR_BIND_MW => SendOp::BindMw(unsafe { bind(&wr.bind_mw) }?),
        _ => return None,
    };
    let inline = flags & IBV_SEND_INLINE != 0 && !op.is_read_or_atomic();
    let payload = if inline {
        // SAFETY: per the contract.
        Payload::Inline(unsafe { inline_bytes(wr.sg_list, wr.num_sge) }?)
    } else {
        Payload::Sges(SgeList::new())
    };
    let mut request = SendWr::new(wr.wr_id, op, payload);
    if let Payload::Sges(list) = &mut request.payload {
        // SAFETY: per the contract.
        unsafe { append_sges(list, wr.sg_list, wr.num_sge) }.then_some(())?;
    }
    request.signaled = flags & IBV_SEND_SIGNALED != 0 || qp.sq_sig_all;
    request.fence = flags & IBV_SEND_FENCE != 0;
    request.solicited = flags & IBV_SEND_SOLICITED != 0;
    if qp.ibv.qp_base.qp_type == IBV_QPT_UD {
        // SAFETY: on a UD QP, `wr.ud` is the member the program wrote.
        let ud = unsafe { wr.wr.ud };
        // SAFETY: a non-null `ah` is one the program created and has not destroyed.
        request.ud = Some(unsafe { ud_dest(ud.ah, ud.remote_qpn, ud.remote_qkey) }?);
    }
    Some(request)
}

/// A type 2 window's bind, from a send request's `bind_mw`.
///
/// # Safety
///
/// The window and region pointers are null or the program's live objects.
unsafe fn bind(b: &send_wr_bind_mw) -> Option<BindMw> {
    // SAFETY: per the contract.
    unsafe { bind_of(b.mw, b.rkey, &b.bind_info) }
}

/// The bind of window `mw` to `info`'s region and range, under the new key `rkey`.
///
/// # Safety
///
/// `mw` and `info.mr` are null or the program's live objects.
pub(crate) unsafe fn bind_of(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Option<BindMw> {
    // SAFETY: per the contract.
    let (mw, mr) = unsafe { (mw.cast::<Mw>().as_ref()?, info.mr.cast::<Mr>().as_ref()?) };
    Some(BindMw {
        window: mw.window.rkey(),
        new_rkey: RKey(rkey),
        region: LKey(mr.ibv.lkey),
        addr: info.addr,
        len: info.length,
        access: access(info.mw_access_flags)?,
    })
}

/// A send request of a chain the program posts: today's `ibv_send_wr`, or libibverbs 1.0's
/// (`crate::verbs_1_0`), each read where it lies.
pub(crate) trait SendRequest {
    /// The request after this one; null at the chain's end.
    fn next(&self) -> *mut Self;

    /// softroce's request for this one on `qp`; `None` if it is malformed.
    ///
    /// # Safety
    ///
    /// A work request the program built, whose pointers are valid as verbs require.
    unsafe fn request(&self, qp: &Qp) -> Option<SendWr>;
}

impl SendRequest for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }

    unsafe fn request(&self, qp: &Qp) -> Option<SendWr> {
        // SAFETY: per the contract.
        unsafe { send_wr(qp, self) }
    }
}

/// The context op `post_send` (`ibv_post_send`).
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the program's QP, chain and out-pointer.
    unsafe { post_send_chain(qp, wr, bad_wr) }
}

/// Posts the chain from `wr` on `qp` in one batch; on a request that cannot be posted, points
/// `bad_wr` at it and returns the error.
///
/// # Safety
///
/// `qp` is null or a QP the program created; the chain is the program's list of live
/// requests, null-terminated; `bad_wr` is null or the program's out-pointer.
pub(crate) unsafe fn post_send_chain<W: SendRequest>(
    qp: *mut ibv_qp,
    wr: *mut W,
    bad_wr: *mut *mut W,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and has not destroyed.
        let Some(this) = (unsafe { Qp::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program's QP and chain.
        let Some((failed, errno)) = (unsafe { post_sends(this, wr) }) else {
            return 0;
        };
        if !bad_wr.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *bad_wr = failed };
        }
        errno
    })
}

/// Posts the chain from `wr` on `this`: `None` once all are posted; else the request that
/// was not, and the error.
///
/// # Safety
///
/// The chain is the program's list of live requests, null-terminated.
// Inlined into the post: called, it cost some 20 instructions more a post.
#[inline]
unsafe fn post_sends<W: SendRequest>(this: &Qp, wr: *mut W) -> Option<(*mut W, c_int)> {
    // SAFETY: per the contract.
    if let Some(only) = unsafe { wr.as_ref() }.filter(|w| w.next().is_null()) {
        // One request, the usual post, goes the short way: a batch moves each request once
        // more (some 35 instructions of 640 a post of perftest's 64-byte writes, callgrind).
        // SAFETY: per the contract.
        let Some(request) = (unsafe { only.request(this) }) else {
            return Some((wr, libc::EINVAL));
        };
        return this.qp.post_send(request).err().map(|e| (wr, errno_of(&e)));
    }
    let mut next = wr;
    let mut malformed = ptr::null_mut();
    let chain = std::iter::from_fn(|| {
        // SAFETY: per the contract.
        let current = unsafe { next.as_ref() }?;
        // SAFETY: as above.
        match unsafe { current.request(this) } {
            Some(request) => {
                next = current.next();
                Some(request)
            }
            None => {
                malformed = next;
                None
            }
        }
    });
    match this.qp.post_send_batch(chain) {
        Ok(_) if malformed.is_null() => None,
        Ok(_) => Some((malformed, libc::EINVAL)),
        // The chain stopped at the request the engine refused: the one after the posted.
        Err(partial) => Some((nth_send(wr, partial.posted), errno_of(&partial.error))),
    }
}

/// The `n`th request of the chain from `wr`.
fn nth_send<W: SendRequest>(mut wr: *mut W, n: usize) -> *mut W {
    for _ in 0..n {
        // SAFETY: the chain holds more than `n` requests: the engine refused the one after
        // the `n` it posted.
        match unsafe { wr.as_ref() } {
            Some(current) => wr = current.next(),
            None => break,
        }
    }
    wr
}

/// A receive request of a chain the program posts: today's `ibv_recv_wr`, or libibverbs 1.0's
/// (`crate::verbs_1_0`), which has the same members in another order.
pub(crate) trait RecvRequest {
    /// The request after this one; null at the chain's end.
    fn next(&self) -> *mut Self;

    /// Its `wr_id`, `sg_list` and `num_sge`.
    fn parts(&self) -> (u64, *const ibv_sge, c_int);
}

impl RecvRequest for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }

    fn parts(&self) -> (u64, *const ibv_sge, c_int) {
        (self.wr_id, self.sg_list, self.num_sge)
    }
}

/// softroce's receive request for the program's `wr`; `None` if it is malformed.
///
/// # Safety
///
/// As for [`sges`].
unsafe fn recv_wr(wr: &impl RecvRequest) -> Option<RecvWr> {
    let (wr_id, sg_list, num_sge) = wr.parts();
    let mut request = RecvWr {
        wr_id,
        sges: SgeList::new(),
    };
    // SAFETY: per the contract.
    unsafe { append_sges(&mut request.sges, sg_list, num_sge) }.then_some(request)
}

/// Posts each receive of the chain from `wr` with `post`; on the first that fails, points
/// `bad_wr` at it and returns its error.
///
/// # Safety
///
/// The chain is the program's list of live requests, null-terminated; `bad_wr` is null or the
/// program's out-pointer.
unsafe fn post_receives<W: RecvRequest>(
    wr: *mut W,
    bad_wr: *mut *mut W,
    post: impl Fn(RecvWr) -> Result<(), c_int>,
) -> c_int {
    let mut next = wr;
    // SAFETY: per the contract.
    while let Some(current) = unsafe { next.as_ref() } {
        // SAFETY: per the contract.
        let outcome = match unsafe { recv_wr(current) } {
            Some(request) => post(request),
            None => Err(libc::EINVAL),
        };
        if let Err(errno) = outcome {
            if !bad_wr.is_null() {
                // SAFETY: per the contract.
                unsafe { *bad_wr = next };
            }
            return errno;
        }
        next = current.next();
    }
    0
}

/// The context op `post_recv` (`ibv_post_recv`).
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the program's QP, chain and out-pointer.
    unsafe { post_recv_chain(qp, wr, bad_wr) }
}

/// Posts each receive of the chain from `wr` on `qp`, as [`post_receives`].
///
/// # Safety
///
/// `qp` is null or a QP the program created; as [`post_receives`] for the rest.
pub(crate) unsafe fn post_recv_chain<W: RecvRequest>(
    qp: *mut ibv_qp,
    wr: *mut W,
    bad_wr: *mut *mut W,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a QP it created and has not destroyed.
        let Some(this) = (unsafe { Qp::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program's chain and out-pointer.
        unsafe {
            post_receives(wr, bad_wr, |request| {
                this.qp.post_recv(request).map_err(|e| errno_of(&e))
            })
        }
    })
}

/// The context op `post_srq_recv` (`ibv_post_srq_recv`).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the program's SRQ, chain and out-pointer.
    unsafe { post_srq_recv_chain(srq, wr, bad_wr) }
}

/// Posts each receive of the chain from `wr` on `srq`, as [`post_receives`].
///
/// # Safety
///
/// `srq` is null or an SRQ the program created; as [`post_receives`] for the rest.
pub(crate) unsafe fn post_srq_recv_chain<W: RecvRequest>(
    srq: *mut ibv_srq,
    wr: *mut W,
    bad_wr: *mut *mut W,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes an SRQ it created and has not destroyed.
        let Some(this) = (unsafe { Srq::from_ibv(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program's chain and out-pointer.
        unsafe {
            post_receives(wr, bad_wr, |request| {
                this.srq.post_recv(request).map_err(|e| errno_of(&e))
            })
        }
    })
}
