//! Completion queues (their channels: [`crate::comp_channel`]).

use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use libc::{c_int, c_void};
use softroce::transport::{AsyncEvent, CqId, WcOpcode, WcStatus, WorkCompletion};
use softroce::verbs::CompletionQueue;
use softroce::wire::Qpn;

use crate::abi::*;
use crate::devices::Context;
use crate::fork::Born;
use crate::held::HeldEvents;
use crate::users::Users;
use crate::verbs_1_0::abi::ibv_cq_1_0;
use crate::verbs_1_0::Legacy;
use crate::{comp_channel, guard, set_errno, unsupported};

/// CQs a device holds at most: as many as an engine's table grows to.
pub(crate) const MAX_CQ: c_int = 1 << 20;
/// Entries a CQ holds at most: the library's limit.
pub(crate) const MAX_CQE: c_int = softroce::verbs::MAX_CQ_CAPACITY as c_int;

/// A completion queue: the program's `ibv_cq`, first, as the first part of an `ibv_cq_ex`
/// (whose polling calls are filled for a CQ `ibv_create_cq_ex` made: [`crate::cq_ex`]).
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq_ex,
    pub cq: CompletionQueue,
    /// The completion `ibv_start_poll` or `ibv_next_poll` took last, which the `ibv_wc_read_*`
    /// calls read.
    pub current: Mutex<ibv_wc>,
    /// Held from an `ibv_start_poll` that found a completion to its `ibv_end_poll`.
    pub polling: crate::section::Section,
    /// Its completion and asynchronous events the program holds: a thread that got the CQ
    /// from its channel may still poll, re-arm and acknowledge it while another thread
    /// destroys it.
    pub held: HeldEvents,
    /// The QPs created with it.
    pub users: Users,
    /// Its libibverbs 1.0 structure, if a 1.0 program made it.
    pub legacy: Legacy<ibv_cq_1_0>,
    born: Born,
}

impl Cq {
    /// The CQ behind a program's pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// A non-null `cq` is one `ibv_create_cq` returned and `ibv_destroy_cq` has not freed.
    pub(crate) unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: per the contract, `cq` is the first field of a live `Cq`.
        unsafe { cq.cast::<Cq>().as_ref() }.filter(|cq| cq.born.ours())
    }
}

/// The program's pointer to the CQ among `cqs` that has softroce's number `id`.
pub(crate) fn find(cqs: &[usize], id: CqId) -> Option<usize> {
    cqs.iter().copied().find(|&at| {
        // SAFETY: the context's list holds live CQs only (`ibv_destroy_cq` takes them out
        // under the same lock).
        let cq = unsafe { &*(at as *const Cq) };
        cq.cq.owns(id)
    })
}

/// `ibv_create_cq`: a CQ of at least `cqe` entries (`cq->cqe` says how many), notifying
/// `channel` if it is not null.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: the program's context and channel, as `create` requires.
    guard(ptr::null_mut(), || unsafe {
        create(context, cqe, cq_context, channel, |_| {}).cast()
    })
}

/// A CQ of at least `cqe` entries on `context`, notifying `channel` if it is not null, its
/// `ibv_cq_ex` part finished by `extend`; null with `errno` set if not.
///
/// # Safety
///
/// `context` and a non-null `channel` are the program's, open.
pub(crate) unsafe fn create(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    extend: impl FnOnce(&mut ibv_cq_ex),
) -> *mut Cq {
    // SAFETY: per the contract.
    let Some(ctx) = (unsafe { Context::from_ibv(context) }) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    if !(1..=MAX_CQE).contains(&cqe) {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let cq = match ctx.device.create_cq(cqe as usize) {
        Ok(cq) => cq,
        Err(e) => {
            set_errno(crate::errno_of(&e));
            return ptr::null_mut();
        }
    };
    let mut ibv = ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle: 0,
        cqe,
        // SAFETY: all-zero pthread objects are their static initialisers on glibc.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        comp_events_completed: AtomicU32::new(0),
        async_events_completed: 0,
        comp_mask: 0,
        status: AtomicU32::new(0),
        wr_id: AtomicU64::new(0),
        start_poll: None,
        next_poll: None,
        end_poll: None,
        read_opcode: None,
        read_vendor_err: None,
        read_byte_len: None,
        read_imm_data: None,
        read_qp_num: None,
        read_src_qp: None,
        read_wc_flags: None,
        read_slid: None,
        read_sl: None,
        read_dlid_path_bits: None,
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    };
    extend(&mut ibv);
    let boxed = Box::new(Cq {
        ibv,
        cq,
        // SAFETY: `ibv_wc` is plain integers, for which all zeroes are a value.
        current: Mutex::new(unsafe { std::mem::zeroed() }),
        polling: Default::default(),
        held: HeldEvents::default(),
        users: Users::default(),
        legacy: Legacy::default(),
        born: Born::now(),
    });
    let raw = Box::into_raw(boxed);
    // SAFETY: `raw` was just made; the program does not have it yet.
    let cq = unsafe { &*raw };
    // SAFETY: a non-null channel is one the program created and has not destroyed.
    if !channel.is_null()
        && !unsafe { comp_channel::add_cq(channel, cq, cq.cq.as_raw_fd(), &ctx.device) }
    {
        // SAFETY: `raw` is ours alone still.
        drop(unsafe { Box::from_raw(raw) });
        return ptr::null_mut();
    }
    ctx.objects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .cqs
        .push(raw as usize);
    raw
}

/// `ibv_destroy_cq`: `EBUSY` while a QP uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a CQ it created and has not destroyed.
        let Some(this) = (unsafe { Cq::from_ibv(cq) }) else {
            return libc::EINVAL;
        };
        if this.users.busy() {
            return libc::EBUSY;
        }
        if !this.held.claim_destroy() {
            return libc::EINVAL;
        }
        // SAFETY: the CQ's context is open while the CQ lives.
        if let Some(ctx) = unsafe { Context::from_ibv(this.ibv.context) } {
            let mut objects = ctx.objects.lock().unwrap_or_else(|p| p.into_inner());
            objects.cqs.retain(|&at| at != cq as usize);
            drop(objects);
            ctx.forget_events(|event| {
                matches!(*event, AsyncEvent::CqOverrun { cq: named, .. } if this.cq.owns(named))
            });
        }
        if !this.ibv.channel.is_null() {
            // SAFETY: the program created the channel and cannot destroy it while this CQ
            // holds it.
            unsafe { comp_channel::remove_cq(this.ibv.channel, this.cq.as_raw_fd()) };
        }
        if this.held.destroy() {
            // SAFETY: every CQ is a leaked `Box<Cq>`, handed back once; no event of it is held,
            // and its channel hands out no more.
            drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        }
        // Otherwise the acknowledgement of its last event frees it (`held`).
        0
    })
}

/// `ibv_resize_cq`: softroce's CQs keep their size.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(_cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    guard(libc::EOPNOTSUPP, || unsupported("ibv_resize_cq"))
}

/// The value `enum ibv_wc_status` gives `status`.
fn status_code(status: WcStatus) -> u32 {
    match status {
        WcStatus::Success => 0,
        WcStatus::LocLenErr => 1,
        WcStatus::LocQpOpErr => 2,
        WcStatus::LocProtErr => 4,
        WcStatus::WrFlushErr => 5,
        WcStatus::MwBindErr => 6,
        WcStatus::RemInvReqErr => 9,
        WcStatus::RemAccessErr => 10,
        WcStatus::RemOpErr => 11,
        WcStatus::RetryExcErr => 12,
        WcStatus::RnrRetryExcErr => 13,
    }
}

/// The value `enum ibv_wc_opcode` gives `opcode`.
fn opcode_code(opcode: WcOpcode) -> u32 {
    match opcode {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    }
}

/// What a UD receive's `sl` says on ConnectX, and so what UCX reads there (1.13 to 1.18,
/// `uct_ud_iface_check_grh`) to tell which header the receive buffer's 40-byte GRH area holds:
/// the packet type of the adapters' PRM, bit 3 for a UDP header (RoCE v2) and the L3 header
/// type below it, 2 for IPv4 (the area is 20 bytes of nothing, then the IPv4 header) and 1 for
/// IPv6. 0 for any other completion. Kernel rxe reports 0 here (its user CQ entry has no field
/// for the header type), and a UCX without `UCX_UD_ETH_DGID_CHECK=n` then compares the wrong
/// 16 bytes with its GID and drops every datagram.
fn roce_packet_type(wc: &WorkCompletion) -> u8 {
    const UDP: u8 = 1 << 3;
    match wc.src_addr.filter(|_| wc.grh).map(|a| a.to_canonical()) {
        Some(std::net::IpAddr::V4(_)) => UDP | 2,
        Some(std::net::IpAddr::V6(_)) => UDP | 1,
        None => 0,
    }
}

/// The program's `ibv_wc` for `wc`.
pub(crate) fn ibv_wc(wc: WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    let mut imm = 0;
    if let Some(data) = wc.imm_data {
        flags |= IBV_WC_WITH_IMM;
        imm = data.to_be();
    }
    if let Some(rkey) = wc.invalidated_rkey {
        flags |= IBV_WC_WITH_INV;
        imm = rkey.0;
    }
    if wc.grh {
        flags |= IBV_WC_GRH;
    }
    ibv_wc {
        sl: roce_packet_type(&wc),
        wr_id: wc.wr_id,
        status: status_code(wc.status),
        opcode: opcode_code(wc.opcode),
        vendor_err: 0,
        byte_len: wc.byte_len,
        imm_data: imm,
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.map_or(0, Qpn::value),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        dlid_path_bits: 0,
    }
}

/// The context op `poll_cq` (`ibv_poll_cq`): up to `num_entries` completions into `wc`; how
/// many, or -1 once the device has stopped and none are left.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program passes a CQ it created and has not destroyed.
        let Some(this) = (unsafe { Cq::from_ibv(cq) }) else {
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let mut n = 0;
        let polled = this.cq.poll_each(num_entries as usize, |completion| {
            // SAFETY: the program's array holds `num_entries` entries, and `poll_each` hands
            // at most that many.
            unsafe { wc.add(n).write(ibv_wc(completion)) };
            n += 1;
        });
        match polled {
            // An empty poll yields the processor. Programs spin on `ibv_poll_cq` (perftest and
            // most RDMA programs do), and on a host with fewer cores than spinning threads
            // another thread needs the core: the engine's own (thread progress, or a hybrid
            // engine's while the program sleeps elsewhere), or the peer process's on the same
            // host, which answers only when it runs. Kernel rxe works in the kernel's softirq,
            // which preempts the spinning program; without the yield, two programs spinning on
            // one core alternate only when the scheduler's time slice ends (4 ms), measured
            // with `ibv_rc_pingpong` under `taskset -c 0`. A yield with nothing else to run
            // costs one system call.
            Ok(0) => {
                std::thread::yield_now();
                0
            }
            Ok(count) => count as c_int,
            Err(_) => -1,
        }
    })
}

/// The context op `req_notify_cq` (`ibv_req_notify_cq`).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a CQ it created and has not destroyed.
        let Some(this) = (unsafe { Cq::from_ibv(cq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the CQ's channel, if any, lives while the CQ does.
        if unsafe { comp_channel::armed_for_driving_waits(this.ibv.channel) } {
            this.cq.req_notify_driving(solicited_only != 0);
        } else {
            this.cq.req_notify(solicited_only != 0);
        }
        0
    })
}

/// `ibv_ack_cq_events`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard((), || {
        // SAFETY: the program passes a CQ it created and has not destroyed, or destroyed with
        // events unacknowledged (then it is still allocated: `Cq::held`). Other threads may
        // poll it meanwhile: only shared references.
        let Some(this) = (unsafe { Cq::from_ibv(cq) }) else {
            return;
        };
        this.ibv.comp_events_completed.fetch_add(nevents, Relaxed);
        if this.held.ack(nevents) {
            // SAFETY: the CQ was destroyed and its last event is acknowledged:
            // `ibv_destroy_cq` left the box for this to free.
            drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        }
    })
}
