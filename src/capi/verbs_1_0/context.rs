//! libibverbs 1.0's devices and contexts: the device list, opening and closing, the queries,
//! and the asynchronous events, whose objects a 1.0 program knows by their 1.0 structures.

use std::ptr;
use std::sync::Mutex;

use libc::{c_char, c_int, c_void};

use super::abi::*;
use super::ops;
use crate::abi::*;
use crate::at_version;
use crate::cq::Cq;
use crate::qp::{Qp, Srq};
use crate::{devices, guard};

/// A 1.0 device, made once for each device of today's list and never freed: a 1.0 context
/// names its device, which programs read after freeing the list.
struct Device(&'static ibv_device_1_0);

// SAFETY: the structure is never written after it is made; its pointers name devices that live
// as long as the process.
unsafe impl Send for Device {}

/// The 1.0 device that stands for `real`, a device of today's list.
fn device_1_0(real: *mut ibv_device) -> *mut ibv_device_1_0 {
    static MADE: Mutex<Vec<Device>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let found = match made.iter().find(|d| d.0.real_device == real) {
        Some(device) => device.0,
        None => {
            let device: &'static ibv_device_1_0 = Box::leak(Box::new(ibv_device_1_0 {
                obsolete_sysfs_dev: ptr::null_mut(),
                obsolete_sysfs_ibdev: ptr::null_mut(),
                real_device: real,
                _ops: _ibv_device_ops {
                    _dummy1: ptr::null_mut(),
                    _dummy2: ptr::null_mut(),
                },
            }));
            made.push(Device(device));
            device
        }
    };
    ptr::from_ref(found).cast_mut()
}

/// Today's device behind a 1.0 device; null for null.
///
/// # Safety
///
/// A non-null `device` is one of [`ibv_get_device_list_1_0`]'s.
unsafe fn real_device(device: *mut ibv_device_1_0) -> *mut ibv_device {
    // SAFETY: per the contract.
    unsafe { device.as_ref() }.map_or(ptr::null_mut(), |d| d.real_device)
}

/// Today's context behind a 1.0 context; null for null.
///
/// # Safety
///
/// A non-null `context` is one [`ibv_open_device_1_0`] returned and the program has not
/// closed.
pub(super) unsafe fn real_context(context: *mut ibv_context_1_0) -> *mut ibv_context {
    // SAFETY: per the contract.
    unsafe { context.as_ref() }.map_or(ptr::null_mut(), |c| c.real_context)
}

/// The 1.0 contexts open, by address, each with today's context it stands for:
/// [`today_context`] tells them from today's.
static OPEN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The 1.0 contexts open.
fn open_contexts() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Today's context that `context` stands for, if it is an open 1.0 context:
/// `ibv_create_comp_channel` has one version since 1.0, which a 1.0 program calls with its
/// 1.0 context (rdma-core would read it as today's).
pub(crate) fn today_context(context: *mut ibv_context) -> Option<*mut ibv_context> {
    let open = open_contexts();
    let found = open.iter().find(|&&(legacy, _)| legacy == context as usize);
    found.map(|&(_, today)| today as *mut ibv_context)
}

/// `ibv_get_device_list` of 1.0: the 1.0 devices, null-terminated. The slot before the first
/// holds today's list, which [`ibv_free_device_list_1_0`] frees.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list_1_0(num: *mut c_int) -> *mut *mut ibv_device_1_0 {
    guard(ptr::null_mut(), || {
        let mut n: c_int = 0;
        // SAFETY: `n` is ours.
        let real = unsafe { devices::ibv_get_device_list(&mut n) };
        if real.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: today's list holds `n` devices, then null.
        let devices = unsafe { std::slice::from_raw_parts(real, n as usize) };
        let list: Box<[*mut ibv_device_1_0]> = std::iter::once(real.cast())
            .chain(devices.iter().map(|&d| device_1_0(d)))
            .chain(std::iter::once(ptr::null_mut()))
            .collect();
        if !num.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *num = n };
        }
        // SAFETY: the list holds today's list, then the devices: one past its start is the
        // first device.
        unsafe { Box::into_raw(list).cast::<*mut ibv_device_1_0>().add(1) }
    })
}

/// `ibv_free_device_list` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list_1_0(list: *mut *mut ibv_device_1_0) {
    guard((), || {
        if list.is_null() {
            return;
        }
        // SAFETY: `list` is one `ibv_get_device_list_1_0` returned: null-terminated, after
        // the slot holding today's list.
        unsafe {
            let mut n = 0;
            while !(*list.add(n)).is_null() {
                n += 1;
            }
            let start = list.sub(1);
            devices::ibv_free_device_list((*start).cast());
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(start, n + 2)));
        }
    })
}

/// `ibv_get_device_name` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name_1_0(device: *mut ibv_device_1_0) -> *const c_char {
    // SAFETY: the program passes a device of its list.
    unsafe { devices::ibv_get_device_name(real_device(device)) }
}

/// `ibv_get_device_guid` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid_1_0(device: *mut ibv_device_1_0) -> u64 {
    // SAFETY: the program passes a device of its list.
    unsafe { devices::ibv_get_device_guid(real_device(device)) }
}

/// `ibv_open_device` of 1.0: today's context, and a 1.0 context whose ops reach it.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device_1_0(device: *mut ibv_device_1_0) -> *mut ibv_context_1_0 {
    guard(ptr::null_mut(), || {
        // SAFETY: the program passes a device of its list.
        let real = unsafe { devices::ibv_open_device(real_device(device)) };
        // SAFETY: null, or the context just opened.
        let Some(opened) = (unsafe { real.as_ref() }) else {
            return ptr::null_mut();
        };
        let context = Box::into_raw(Box::new(ibv_context_1_0 {
            device,
            ops: ops::OPS_1_0,
            cmd_fd: opened.cmd_fd,
            async_fd: opened.async_fd,
            num_comp_vectors: opened.num_comp_vectors,
            real_context: real,
        }));
        open_contexts().push((context as usize, real as usize));
        context
    })
}

/// `ibv_close_device` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device_1_0(context: *mut ibv_context_1_0) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let result = unsafe { devices::ibv_close_device(real_context(context)) };
        if result == 0 {
            open_contexts().retain(|&(open, _)| open != context as usize);
            // SAFETY: closed: the program hands the context back once.
            drop(unsafe { Box::from_raw(context) });
        }
        result
    })
}

/// The kinds of object an asynchronous event names, as rdma-core's 1.0 layer sorts them.
enum Named {
    Cq,
    Qp,
    Srq,
    Other,
}

impl Named {
    fn of(event_type: libc::c_uint) -> Named {
        // enum ibv_event_type: CQ_ERR 0; QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, COMM_EST,
        // SQ_DRAINED, PATH_MIG, PATH_MIG_ERR 1 to 7; SRQ_ERR 14, SRQ_LIMIT_REACHED 15;
        // QP_LAST_WQE_REACHED 16. The others name a port or the device.
        match event_type {
            IBV_EVENT_CQ_ERR => Named::Cq,
            1..=7 | IBV_EVENT_QP_LAST_WQE_REACHED => Named::Qp,
            14 | IBV_EVENT_SRQ_LIMIT_REACHED => Named::Srq,
            _ => Named::Other,
        }
    }
}

/// `ibv_get_async_event` of 1.0: today's event, naming the 1.0 object. An event of an object
/// that no 1.0 verb made (a program mixing the two ABIs) has no 1.0 structure to name it by,
/// nor to be acknowledged through: it is acknowledged here, and names no object. The wait,
/// today's, is a cancellation point (`crate::blocking`): it runs under no guard of this call's.
#[no_mangle]
pub unsafe extern "C-unwind" fn ibv_get_async_event_1_0(
    context: *mut ibv_context_1_0,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the program passes a context it opened (null is answered by today's call).
    let today = guard(ptr::null_mut(), || unsafe { real_context(context) });
    // SAFETY: the program passes a context it opened and its own event.
    let result = unsafe { devices::ibv_get_async_event(today, event) };
    if result != 0 {
        return result;
    }
    guard(-1, || {
        // SAFETY: today's call filled the program's event; the object it names stays
        // allocated until the event is acknowledged (`crate::held`).
        unsafe {
            let element = (*event).element;
            let legacy: *mut c_void = match Named::of((*event).event_type) {
                _ if element.is_null() => return 0,
                Named::Cq => (*element.cast::<Cq>()).legacy.get().cast(),
                Named::Qp => (*element.cast::<Qp>()).legacy.get().cast(),
                Named::Srq => (*element.cast::<Srq>()).legacy.get().cast(),
                Named::Other => return 0,
            };
            if legacy.is_null() {
                devices::ibv_ack_async_event(event);
            }
            (*event).element = legacy;
        }
        0
    })
}

/// `ibv_ack_async_event` of 1.0: acknowledges today's event the 1.0 one stands for.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event_1_0(event: *mut ibv_async_event) {
    guard((), || {
        // SAFETY: the program passes an event `ibv_get_async_event_1_0` gave it, whose object
        // is a 1.0 structure, allocated until this acknowledgement.
        unsafe {
            let Some(&ibv_async_event {
                element,
                event_type,
            }) = event.as_ref()
            else {
                return;
            };
            let real: *mut c_void = match Named::of(event_type) {
                _ if element.is_null() => element,
                Named::Cq => (*element.cast::<ibv_cq_1_0>()).real_cq.cast(),
                Named::Qp => (*element.cast::<ibv_qp_1_0>()).real_qp.cast(),
                Named::Srq => (*element.cast::<ibv_srq_1_0>()).real_srq.cast(),
                Named::Other => element,
            };
            let mut today = ibv_async_event {
                element: real,
                event_type,
            };
            devices::ibv_ack_async_event(&mut today);
        }
    })
}

/// `ibv_query_device` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device_1_0(
    context: *mut ibv_context_1_0,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the program passes a context it opened and its own structure.
    unsafe { devices::ibv_query_device(real_context(context), attr) }
}

/// `ibv_query_port` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port_1_0(
    context: *mut ibv_context_1_0,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the program passes a context it opened and its own structure.
    unsafe { devices::ibv_query_port(real_context(context), port_num, attr) }
}

/// `ibv_query_gid` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_1_0(
    context: *mut ibv_context_1_0,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: the program passes a context it opened and its own GID.
    unsafe { devices::ibv_query_gid(real_context(context), port_num, index, gid) }
}

/// `ibv_query_pkey` of 1.0.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey_1_0(
    context: *mut ibv_context_1_0,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the program passes a context it opened and its own P_Key.
    unsafe { devices::ibv_query_pkey(real_context(context), port_num, index, pkey) }
}

at_version! {
    "IBVERBS_1.0";
    ibv_get_device_list_1_0 => "ibv_get_device_list",
    ibv_free_device_list_1_0 => "ibv_free_device_list",
    ibv_get_device_name_1_0 => "ibv_get_device_name",
    ibv_get_device_guid_1_0 => "ibv_get_device_guid",
    ibv_open_device_1_0 => "ibv_open_device",
    ibv_close_device_1_0 => "ibv_close_device",
    ibv_get_async_event_1_0 => "ibv_get_async_event",
    ibv_ack_async_event_1_0 => "ibv_ack_async_event",
    ibv_query_device_1_0 => "ibv_query_device",
    ibv_query_port_1_0 => "ibv_query_port",
    ibv_query_gid_1_0 => "ibv_query_gid",
    ibv_query_pkey_1_0 => "ibv_query_pkey",
}
