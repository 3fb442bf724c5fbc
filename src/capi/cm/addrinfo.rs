//! `rdma_getaddrinfo` and the endpoint calls built on it (`rdma_create_ep`,
//! `rdma_destroy_ep`), which make synchronous IDs.

use std::ffi::CStr;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ptr;

use libc::{c_char, c_int};

use super::id::{
    rdma_bind_addr, rdma_create_id, rdma_create_qp, rdma_destroy_id, rdma_destroy_qp,
    rdma_resolve_addr, rdma_resolve_route, remember_qp_attr,
};
use super::{socket_addr, storage};
use crate::abi::*;
use crate::{guard, set_errno};

/// The first address `node`:`service` names (`node` null: the wildcard), by the system's
/// resolver, as getaddrinfo(3) would give it.
///
/// # Safety
///
/// `node` and `service` are null or C strings.
unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    passive: bool,
) -> Result<SocketAddr, c_int> {
    let text = |s: *const c_char| -> Result<Option<String>, c_int> {
        if s.is_null() {
            return Ok(None);
        }
        // SAFETY: per the contract.
        let s = unsafe { CStr::from_ptr(s) };
        s.to_str()
            .map(|s| Some(s.to_string()))
            .map_err(|_| libc::EINVAL)
    };
    let port = match text(service)? {
        Some(service) => service.parse::<u16>().map_err(|_| libc::EINVAL)?,
        None => 0,
    };
    let host = match (text(node)?, passive) {
        (Some(host), _) => host,
        (None, true) => "0.0.0.0".to_string(),
        (None, false) => return Err(libc::EINVAL),
    };
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|_| libc::ENOENT)?
        .next()
        .ok_or(libc::ENOENT)
}

/// A malloc'd copy of `addr`, for the program to hand back to `rdma_freeaddrinfo`.
fn sockaddr_copy(addr: SocketAddr) -> (*mut libc::sockaddr, libc::socklen_t) {
    let (storage, len) = storage(addr);
    // SAFETY: malloc takes a size; null is handled by the caller.
    let copy = unsafe { libc::malloc(len as usize) }.cast::<libc::sockaddr>();
    if !copy.is_null() {
        // SAFETY: `copy` has room for `len` bytes, the start of `storage`.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::addr_of!(storage).cast::<u8>(),
                copy.cast(),
                len as usize,
            )
        };
    }
    (copy, len)
}

/// Where a lookup's result points: its source and destination.
type Ends = (Option<SocketAddr>, Option<SocketAddr>);

/// The ends `node` and `service` name, by the system's resolver: the source of a passive
/// lookup, else the destination, with the hints' source. With neither `node` nor `service`,
/// the hints' own addresses, as rdma-core takes them (libfabric's verbs provider looks up its
/// endpoints so): `EINVAL` if they have none.
///
/// # Safety
///
/// `node` and `service` are null or C strings; the hints' addresses are null or sockaddrs of
/// their lengths.
unsafe fn ends(
    node: *const c_char,
    service: *const c_char,
    hints: Option<&rdma_addrinfo>,
    passive: bool,
) -> Result<Ends, c_int> {
    // SAFETY: per the contract.
    let hinted = |addr: *mut libc::sockaddr| unsafe { socket_addr(addr) };
    let hint_src = hints.and_then(|h| hinted(h.ai_src_addr));
    if node.is_null() && service.is_null() {
        let hint_dst = hints.and_then(|h| hinted(h.ai_dst_addr));
        if hint_src.is_none() && hint_dst.is_none() {
            return Err(libc::EINVAL);
        }
        return Ok((hint_src, hint_dst));
    }
    // SAFETY: per the contract.
    let addr = unsafe { resolve(node, service, passive) }?;
    Ok(if passive {
        (Some(addr), None)
    } else {
        (hint_src, Some(addr))
    })
}

/// `rdma_getaddrinfo`: one result, the address `node` and `service` name, as the source of a
/// passive (`RAI_PASSIVE`) lookup or the destination of an active one (or, with neither, the
/// hints' addresses), in the port space and QP type the hints ask (TCP and RC by default). 0,
/// or -1 with `errno`.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the program's hints, or null.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: the program's strings and hints.
        let (src, dst) = match unsafe { ends(node, service, hints, passive) } {
            Ok(ends) => ends,
            Err(errno) => {
                set_errno(errno);
                return -1;
            }
        };
        // SAFETY: calloc of one zeroed `rdma_addrinfo`, which is valid all zero.
        let info = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if info.is_null() {
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: `info` was just allocated and zeroed.
        let out = unsafe { &mut *info };
        out.ai_flags = flags;
        out.ai_family = if dst.or(src).is_some_and(|a| a.is_ipv4()) {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        out.ai_port_space = match hints.map(|h| h.ai_port_space) {
            Some(ps) if ps != 0 => ps,
            _ => RDMA_PS_TCP as c_int,
        };
        out.ai_qp_type = match hints.map(|h| h.ai_qp_type) {
            Some(t) if t != 0 => t,
            _ if out.ai_port_space == RDMA_PS_UDP as c_int => IBV_QPT_UD as c_int,
            _ => IBV_QPT_RC as c_int,
        };
        if let Some(src) = src {
            (out.ai_src_addr, out.ai_src_len) = sockaddr_copy(src);
        }
        if let Some(dst) = dst {
            (out.ai_dst_addr, out.ai_dst_len) = sockaddr_copy(dst);
        }
        // SAFETY: the program's out-pointer, checked above.
        unsafe { *res = info };
        0
    })
}

/// `rdma_freeaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut next = res;
        // SAFETY: each node and its addresses came from `rdma_getaddrinfo`'s mallocs.
        while let Some(info) = unsafe { next.as_ref() } {
            let after = info.ai_next;
            // SAFETY: as above; free ignores null.
            unsafe {
                libc::free(info.ai_src_addr.cast());
                libc::free(info.ai_dst_addr.cast());
                libc::free(next.cast());
            }
            next = after;
        }
    })
}

/// `rdma_create_ep`: a synchronous ID for `res`, bound (passive) or with its address and
/// route resolved (active), and its QP if `qp_init_attr` asks (on a passive ID, the QP each
/// request's ID gets from `rdma_get_request`). 0, or -1 with `errno`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's result from `rdma_getaddrinfo`.
        let Some(info) = (unsafe { res.as_ref() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if id.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the program's attributes, or null: the QP is of the lookup's type, as
        // librdmacm makes it.
        if let Some(attr) = unsafe { qp_init_attr.as_mut() } {
            attr.qp_type = info.ai_qp_type as u32;
        }
        let mut made = ptr::null_mut();
        let ps = info.ai_port_space as u32;
        // SAFETY: a synchronous ID (no channel) into `made`.
        if unsafe { rdma_create_id(ptr::null_mut(), &mut made, ptr::null_mut(), ps) } != 0 {
            return -1;
        }
        // SAFETY: `made` was just created; the addresses are `rdma_getaddrinfo`'s.
        let ready = unsafe {
            if info.ai_flags & RAI_PASSIVE != 0 {
                let bound = rdma_bind_addr(made, info.ai_src_addr);
                if bound == 0 && !qp_init_attr.is_null() {
                    remember_qp_attr(made, pd, &*qp_init_attr);
                }
                bound
            } else {
                let resolved = rdma_resolve_addr(made, info.ai_src_addr, info.ai_dst_addr, 2000);
                let routed = if resolved == 0 {
                    rdma_resolve_route(made, 2000)
                } else {
                    resolved
                };
                if routed == 0 && !qp_init_attr.is_null() {
                    rdma_create_qp(made, pd, qp_init_attr)
                } else {
                    routed
                }
            }
        };
        if ready != 0 {
            // SAFETY: `made` is ours still.
            unsafe { rdma_destroy_id(made) };
            return -1;
        }
        // SAFETY: the program's out-pointer, checked above.
        unsafe { *id = made };
        0
    })
}

/// `rdma_destroy_ep`: the ID's QP and SRQ (and the CQs librdmacm made for them), then the ID.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the program passes an ID it holds, once.
    guard((), || unsafe {
        rdma_destroy_qp(id);
        super::srq::rdma_destroy_srq(id);
        rdma_destroy_id(id);
    })
}
