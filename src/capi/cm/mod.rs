//! librdmacm over softroce's connection manager: event channels (`channel.rs`), IDs and what
//! they do (`id.rs`), what a connected ID holds (`link.rs`: the QP the CM moved, or a QP the
//! program moves itself), an ID's SRQ (`srq.rs`), enhanced connection establishment
//! (`ece.rs`), `rdma_getaddrinfo` and the synchronous calls (`addrinfo.rs`), and rsockets'
//! calls, which have no protocol behind them yet (`rsocket.rs`).
//!
//! softroce's CM calls block (`softroce::verbs::Connection::connect`, `Listener::next_request`,
//! `ConnectionRequest::accept`, `Connection::disconnect`), where librdmacm's return at once
//! and report the outcome as an event. So each call that waits on the network runs on a thread
//! of its ID's, which posts the event when the CM answers: a listening ID has one that takes
//! its requests, and a connection one that waits for its end. An ID's device context
//! (`id->verbs`) is the one librdmacm opens for each device and keeps open, as rdma-core's
//! does (`rdma_get_devices`); it shares its softroce device with any the program opens itself.

mod addrinfo;
mod channel;
mod ece;
mod id;
mod link;
mod ports;
mod rsocket;
mod srq;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The socket address at `addr`, or `None` for null or a family other than IPv4 and IPv6.
///
/// # Safety
///
/// A non-null `addr` points to a `sockaddr` as long as its family says (`sockaddr_in` or
/// `sockaddr_in6`).
pub(crate) unsafe fn socket_addr(addr: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    let family = unsafe { addr.as_ref() }?.sa_family;
    match i32::from(family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a `sockaddr_in`.
            let sin = unsafe { &*addr.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
            let sin6 = unsafe { &*addr.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `addr` as a `sockaddr_storage`, and its length.
pub(crate) fn storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: `sockaddr_storage` is plain bytes, for which zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a `sockaddr_in` fits in a `sockaddr_storage`, which is aligned for it.
            unsafe {
                std::ptr::addr_of_mut!(storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for a `sockaddr_in6`.
            unsafe {
                std::ptr::addr_of_mut!(storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The calling thread's `errno`.
pub(crate) fn last_errno() -> libc::c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The IP address a sockaddr storage holds, or the unspecified IPv4 address.
pub(crate) fn ip_of(storage: &libc::sockaddr_storage) -> SocketAddr {
    // SAFETY: a storage holds a `sockaddr` of its family, or zeros (family 0: none).
    unsafe { socket_addr(std::ptr::from_ref(storage).cast()) }
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
}
