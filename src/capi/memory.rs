//! Protection domains, memory regions over the program's own memory, and memory windows.
//!
//! `ibv_reg_mr` registers the program's bytes in place ([`ForeignMemory`]), at any address,
//! length and alignment: a peer's WRITE lands in them, a READ reads them, and nothing is copied
//! to or from a shadow buffer. `ibv_dereg_mr` stops both keys at once, then waits until no
//! transfer still holds the memory before it returns, after which the program may free it;
//! the wait is bounded, as rxe bounds its own, and past it the call answers `EBUSY` (the keys
//! stay stopped, and the call may be made again). Only a packet queued and not yet built holds
//! the memory, and a running engine builds it within a turn, so the wait ends at once in
//! practice; on a device that failed, whose engines build nothing more, it ends at once. A
//! program that frees its memory after `EBUSY` all the same costs no more than the bytes of
//! such a packet: softroce's accesses to memory taken away fail rather than fault
//! (`softroce::memory::ForeignMemory`), and only reads remain after the keys stopped.

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use libc::{c_int, c_uint, c_void, size_t};
use softroce::memory::{Access, ForeignMemory, MemoryError, MwType};
use softroce::verbs::{Error, MemoryRegion, MemoryWindow, ProtectionDomain};

use crate::abi::*;
use crate::devices::Context;
use crate::fork::Born;
use crate::qp::Qp;
use crate::users::Users;
use crate::{guard, set_errno};

/// Regions a device holds at most: well inside its key tables' limit (`softroce::memory`,
/// where draws begin to fail near 3.3 million keys of a kind; regions and windows share the
/// rkeys).
pub(crate) const MAX_MR: c_int = 2_000_000;
/// Windows a device holds at most, beside as many regions as it holds at most.
pub(crate) const MAX_MW: c_int = 1_000_000;

/// How long `ibv_dereg_mr` waits for transfers still holding the memory.
const DEREG_WAIT: Duration = Duration::from_secs(5);

/// A protection domain: the program's `ibv_pd`, first.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub pd: ProtectionDomain,
    /// Its QPs, SRQs, regions, windows and address handles.
    pub users: Users,
    born: Born,
}

impl Pd {
    /// The PD behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `pd` is one `ibv_alloc_pd` returned and `ibv_dealloc_pd` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: per the contract, `pd` is the first field of a live `Pd`.
        unsafe { pd.cast::<Pd>().as_ref() }.filter(|pd| pd.born.ours())
    }

    /// A user of the PD `pd` names was destroyed.
    ///
    /// # Safety
    ///
    /// `pd` is null or the PD of a user being destroyed, which is alive: it could not be
    /// deallocated while the user counted.
    pub(crate) unsafe fn release(pd: *mut ibv_pd) {
        // SAFETY: per the contract.
        if let Some(pd) = unsafe { Pd::from_ibv(pd) } {
            pd.users.remove();
        }
    }
}

/// A memory region: the program's `ibv_mr`, first.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pd: ProtectionDomain,
    /// Until the memory is the program's again.
    region: Option<MemoryRegion>,
    /// The access flags it was registered with, as the program gave them.
    access_flags: c_uint,
    /// Deregistered already: a call that answered `EBUSY` is being made again.
    deregistered: bool,
    born: Born,
}

/// A memory window: the program's `ibv_mw`, first.
#[repr(C)]
pub(crate) struct Mw {
    /// In a cell: `ibv_bind_mw` writes the new rkey into it while another thread may hold the
    /// same window (posting a bind of it, or binding it too), which a `&mut Mw` would alias.
    /// The cell has the layout of the struct it holds.
    pub ibv: UnsafeCell<ibv_mw>,
    pub window: MemoryWindow,
    born: Born,
}

/// The access flags a region or window grants, from `ibv_access_flags`; `None` for a flag
/// softroce does not know outside the optional range (bits 20 to 29), which it ignores, as
/// rdma-core lets providers do.
pub(crate) fn access(flags: c_uint) -> Option<Access> {
    const KNOWN: c_uint = 0xff; // through IBV_ACCESS_HUGETLB
    const OPTIONAL: c_uint = 0x3ff << 20;
    if flags & !(KNOWN | OPTIONAL) != 0 {
        return None;
    }
    let mut access = Access::NONE;
    for (bit, right) in [
        (1, Access::LOCAL_WRITE),
        (2, Access::REMOTE_WRITE),
        (4, Access::REMOTE_READ),
        (8, Access::REMOTE_ATOMIC),
        (16, Access::MW_BIND),
    ] {
        if flags & bit != 0 {
            access = access | right;
        }
    }
    Some(access)
}

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        match context.device.alloc_pd() {
            Ok(pd) => {
                let handle = pd_handle(&pd);
                let pd = Box::new(Pd {
                    ibv: ibv_pd {
                        context: context.ibv(),
                        handle,
                    },
                    pd,
                    users: Users::default(),
                    born: Born::now(),
                });
                Box::into_raw(pd).cast()
            }
            Err(_) => {
                set_errno(libc::ENODEV);
                ptr::null_mut()
            }
        }
    })
}

/// A PD's handle: softroce's number for it.
fn pd_handle(pd: &ProtectionDomain) -> u32 {
    pd.id().0
}

/// `ibv_dealloc_pd`: `EBUSY` while a QP, SRQ, region, window or address handle is on it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a PD it allocated and has not freed.
        let Some(this) = (unsafe { Pd::from_ibv(pd) }) else {
            return libc::EINVAL;
        };
        if this.users.busy() {
            return libc::EBUSY;
        }
        // SAFETY: every PD is a leaked `Box<Pd>` (`ibv_alloc_pd`), handed back once.
        drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
        0
    })
}

/// `ibv_reg_mr`: the program's `length` bytes at `addr`, in place, addressed by peers at `addr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded as the program gave them.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`: as `ibv_reg_mr`, addressed by peers at `iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded as the program gave them.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_reg_mr_iova2`, which the others and `verbs.h`'s `ibv_reg_mr` macro come to.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access_flags: c_uint,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and has not freed.
        let Some(owner) = (unsafe { Pd::from_ibv(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: the program's memory, as it registers it.
        match unsafe { register(owner, addr, length, iova, access_flags) } {
            Ok(region) => {
                let mr = Box::new(Mr {
                    ibv: ibv_mr {
                        context: owner.ibv.context,
                        pd,
                        addr,
                        length,
                        handle: region.lkey().0,
                        lkey: region.lkey().0,
                        rkey: region.rkey().0,
                    },
                    pd: owner.pd.clone(),
                    region: Some(region),
                    access_flags,
                    deregistered: false,
                    born: Born::now(),
                });
                owner.users.add();
                Box::into_raw(mr).cast()
            }
            Err(errno) => {
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

/// `ibv_reg_dmabuf_mr`: a region over a dma-buf (a GPU's or another device's memory), which
/// a process's own memory is not: `EOPNOTSUPP`, as rdma-core answers for rxe, whose provider
/// has no such call.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: size_t,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        set_errno(crate::unsupported("ibv_reg_dmabuf_mr"));
        ptr::null_mut()
    })
}

/// Registers the program's `length` bytes at `addr` on `owner`, addressed by peers at `iova`
/// (0 with `IBV_ACCESS_ZERO_BASED`), with `access_flags`: the region, or the errno.
///
/// # Safety
///
/// The memory is the program's, which it keeps until the region is deregistered and closed.
unsafe fn register(
    owner: &Pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access_flags: c_uint,
) -> Result<MemoryRegion, c_int> {
    let rights = access(access_flags).ok_or(libc::EINVAL)?;
    // On-demand paging, which softroce does not have (the kernel's ib_check_mr_access).
    if access_flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(crate::unsupported("ibv_reg_mr with IBV_ACCESS_ON_DEMAND"));
    }
    // IBTA C10-70 (and the kernel's ib_check_mr_access): remote write or atomic access needs
    // local write.
    let needs_local = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    if rights.intersects(needs_local) && !rights.contains(Access::LOCAL_WRITE) {
        return Err(libc::EINVAL);
    }
    let iova = if access_flags & IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    // What the kernel's pin would refuse: pages not mapped, or without the rights the region
    // grants (`ib_access_writable`: any write, or binding windows).
    let writes = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    let writable = rights.intersects(writes | Access::MW_BIND);
    crate::mapping::check(addr as usize, length, writable)?;
    // SAFETY: the program registers memory of its own, which verbs require it to keep until
    // `ibv_dereg_mr` (or `ibv_rereg_mr`) returns; those return only once `try_close` has
    // succeeded, after which softroce no longer reaches the memory (see `close`).
    let memory = unsafe { ForeignMemory::new(addr.cast(), length) }.ok_or(libc::EINVAL)?;
    owner
        .pd
        .register_foreign(memory, iova, rights)
        .map_err(|e| crate::errno_of(&e))
}

/// Stops `region`'s keys (unless `stopped` says they are), then waits until no transfer holds
/// its memory, which is then the program's: `Err` with the errno and the region if windows
/// are bound over it (nothing changed) or transfers still held it after the wait (its keys
/// stopped). A failed device's keys reach nothing any more, and a stopped device's engines
/// build nothing more: the memory is the program's at once. rdma-core answers a failed
/// device's deregistration with EIO unless RDMAV_ALLOW_DISASSOC_DESTROY is set; the memory is
/// the program's again either way.
fn close(
    region: MemoryRegion,
    pd: &ProtectionDomain,
    stopped: &mut bool,
) -> Result<(), (c_int, MemoryRegion)> {
    if !*stopped {
        match pd.deregister(&region) {
            Ok(()) | Err(Error::DeviceFailed(_) | Error::DeviceClosed) => {}
            Err(Error::Memory(MemoryError::WindowsBound { .. })) => {
                return Err((libc::EBUSY, region))
            }
            Err(_) => return Err((libc::EINVAL, region)),
        }
        *stopped = true;
    }
    let start = Instant::now();
    let mut region = region;
    loop {
        match region.try_close() {
            Ok(()) => return Ok(()),
            Err(_) if pd.device().is_stopped() => return Ok(()),
            Err(still) if start.elapsed() < DEREG_WAIT => {
                region = still;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(still) => return Err((libc::EBUSY, still)),
        }
    }
}

/// `ibv_dereg_mr`: both keys stop at once; the call returns once no transfer holds the memory,
/// or its device has stopped, and the memory is then the program's to free. `EBUSY` if windows
/// are bound over it (nothing changed), or if transfers still held it after a wait (the keys are
/// stopped; call again).
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: every MR is a leaked `Box<Mr>` (`ibv_reg_mr_iova2`), alive until this call
        // succeeds; the program does not use it from another thread meanwhile.
        let this = unsafe { &mut *mr.cast::<Mr>() };
        if !this.born.ours() {
            return libc::EINVAL;
        }
        let Some(region) = this.region.take() else {
            return libc::EINVAL;
        };
        if let Err((errno, region)) = close(region, &this.pd, &mut this.deregistered) {
            this.region = Some(region);
            return errno;
        }
        // SAFETY: the region's PD, alive while the region counted in it.
        unsafe { Pd::release(this.ibv.pd) };
        // SAFETY: as above; the region is gone, and so is the last use of the box.
        drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
        0
    })
}

/// `ibv_rereg_mr`: the region again, with another range (`IBV_REREG_MR_CHANGE_TRANSLATION`),
/// PD (`_CHANGE_PD`) or access (`_CHANGE_ACCESS`), in the same `ibv_mr`, whose keys change
/// (as the kernel's rereg may change them). The new region is registered first, and the old
/// deregistered after, as `ibv_dereg_mr` does: a registration that fails, or windows bound
/// over the old region, leave the old as it was. 0, or `IBV_REREG_MR_ERR_INPUT` for arguments
/// rdma-core refuses, `IBV_REREG_MR_ERR_CMD` for what the kernel would refuse (no flag, a PD of
/// another context) and a registration or deregistration that failed, with `errno`; after
/// either the program still deregisters the `ibv_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    access_flags: c_int,
) -> c_int {
    guard(IBV_REREG_MR_ERR_CMD, || {
        let refused = |errno| {
            set_errno(errno);
            IBV_REREG_MR_ERR_INPUT
        };
        let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        let known = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD;
        if mr.is_null() || flags & !(known | IBV_REREG_MR_CHANGE_ACCESS) != 0 {
            return refused(libc::EINVAL);
        }
        if (translation && (length == 0 || addr.is_null()))
            || (access_flags != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0)
        {
            return refused(libc::EINVAL);
        }
        // SAFETY: a leaked `Box<Mr>` the program registered and has not deregistered; it does
        // not use it from another thread meanwhile.
        let this = unsafe { &mut *mr.cast::<Mr>() };
        let Some(old) = this.region.as_ref().filter(|_| this.born.ours()) else {
            return refused(libc::EINVAL);
        };
        // What rdma-core passes on and the kernel refuses (`ib_uverbs_rereg_mr`): no change
        // asked for, or a PD it does not find in the region's context.
        let failed = |errno| {
            set_errno(errno);
            IBV_REREG_MR_ERR_CMD
        };
        if flags == 0 {
            return failed(libc::EINVAL);
        }
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            pd
        } else {
            this.ibv.pd
        };
        // SAFETY: the program's PD, or the region's.
        let Some(owner) = (unsafe { Pd::from_ibv(new_pd) }) else {
            return failed(libc::EINVAL);
        };
        if owner.ibv.context != this.ibv.context {
            return failed(libc::EINVAL);
        }
        let (addr, length, iova) = if translation {
            (addr, length, addr as u64)
        } else {
            (this.ibv.addr, this.ibv.length, old.iova())
        };
        let access_flags = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            access_flags as c_uint
        } else {
            this.access_flags
        };
        // SAFETY: the program's memory, as it registers it again.
        let new = match unsafe { register(owner, addr, length, iova, access_flags) } {
            Ok(new) => new,
            Err(errno) => return failed(errno),
        };
        let old = this.region.take().expect("looked at above");
        if let Err((errno, old)) = close(old, &this.pd, &mut this.deregistered) {
            // Windows are bound over the old region (it stays as it was), or its keys are
            // stopped but a transfer still held its memory after the wait (as `ibv_dereg_mr`
            // answers EBUSY): the old region stays the `ibv_mr`'s, which the program
            // deregisters after a failed rereg, as verbs require. The new one, which nobody
            // has seen, goes.
            let mut stopped = false;
            let _ = close(new, &owner.pd, &mut stopped);
            this.region = Some(old);
            return failed(errno);
        }
        if new_pd != this.ibv.pd {
            owner.users.add();
            // SAFETY: the old region's PD, alive while the region counted in it.
            unsafe { Pd::release(this.ibv.pd) };
        }
        this.ibv.pd = new_pd;
        this.ibv.addr = addr;
        this.ibv.length = length;
        (this.ibv.lkey, this.ibv.rkey) = (new.lkey().0, new.rkey().0);
        this.ibv.handle = new.lkey().0;
        this.pd = owner.pd.clone();
        this.access_flags = access_flags;
        this.deregistered = false;
        this.region = Some(new);
        0
    })
}

/// The context op `alloc_mw` (what `verbs.h`'s `ibv_alloc_mw` calls).
pub(crate) unsafe extern "C" fn ibv_alloc_mw(pd: *mut ibv_pd, type_: c_uint) -> *mut ibv_mw {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a PD it allocated and has not freed.
        let Some(owner) = (unsafe { Pd::from_ibv(pd) }) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let kind = match type_ {
            IBV_MW_TYPE_1 => MwType::Type1,
            IBV_MW_TYPE_2 => MwType::Type2,
            _ => {
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
        };
        match owner.pd.alloc_mw(kind) {
            Ok(window) => {
                let mw = Box::new(Mw {
                    ibv: UnsafeCell::new(ibv_mw {
                        context: owner.ibv.context,
                        pd,
                        rkey: window.rkey().0,
                        handle: window.rkey().0,
                        type_,
                    }),
                    window,
                    born: Born::now(),
                });
                owner.users.add();
                Box::into_raw(mw).cast()
            }
            Err(e) => {
                set_errno(crate::errno_of(&e));
                ptr::null_mut()
            }
        }
    })
}

/// The context op `dealloc_mw`.
pub(crate) unsafe extern "C" fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a window it allocated and has not freed.
        match unsafe { mw.cast::<Mw>().as_ref() } {
            Some(window) if window.born.ours() => {}
            _ => return libc::EINVAL,
        }
        // SAFETY: every MW is a leaked `Box<Mw>` (`ibv_alloc_mw`), handed back once.
        let mw = unsafe { Box::from_raw(mw.cast::<Mw>()) };
        // SAFETY: the window's PD, alive while the window counted in it; `pd` is written only
        // when the window is made.
        unsafe { Pd::release((*mw.ibv.get()).pd) };
        0
    })
}

/// The context op `bind_mw` (`ibv_bind_mw`, type 1 windows): posts the bind on `qp`; the
/// window's rkey is the new one from now on, good once the bind completes. With no region
/// (`bind_info.mr` null, and a zero address and length, as `verbs.h` lets through), the bind
/// unbinds the window: it reaches nothing once the bind completes, and its region may be
/// deregistered (rxe_mw.c `rxe_do_bind_mw`).
pub(crate) unsafe extern "C" fn ibv_bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes objects it created and has not destroyed.
        let (Some(qp), Some(mw), Some(bind)) = (
            unsafe { Qp::from_ibv(qp) },
            unsafe { mw.cast::<Mw>().as_ref() },
            unsafe { bind.as_ref() },
        ) else {
            return libc::EINVAL;
        };
        let info = &bind.bind_info;
        // SAFETY: a non-null `mr` in the bind is one the program registered.
        let request = match unsafe { info.mr.cast::<Mr>().as_ref() } {
            None if info.addr == 0 && info.length == 0 => mw.window.unbind_request(),
            None => return libc::EINVAL,
            Some(mr) => {
                let (Some(region), Some(rights)) = (&mr.region, access(info.mw_access_flags))
                else {
                    return libc::EINVAL;
                };
                let offset = info.addr.wrapping_sub(region.iova()) as usize;
                mw.window
                    .bind_request(region, offset, info.length as usize, rights)
            }
        };
        let signaled = bind.send_flags & IBV_SEND_SIGNALED != 0;
        match qp.bind_mw(bind.wr_id, signaled, request) {
            Ok(()) => {
                // SAFETY: the field lies in the cell, so no reference to it exists, and it is a
                // live, aligned `u32` for as long as `mw` is. Stored atomically: two threads
                // may bind one window at once. The program reads it (`mw->rkey`) after the
                // call, as rdma-core's providers write it.
                let rkey = unsafe { AtomicU32::from_ptr(ptr::addr_of_mut!((*mw.ibv.get()).rkey)) };
                rkey.store(mw.window.rkey().0, Relaxed);
                0
            }
            Err(e) => crate::errno_of(&e),
        }
    })
}
