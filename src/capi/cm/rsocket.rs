//! librdmacm's rsockets (`rdma/rsocket.h`): a socket API carried over RDMA connections by a
//! protocol of rdma-core's own. softroce does not have that protocol yet. The calls are here so
//! that a program that names them starts, and each answers as it must when no rsocket can be
//! made: `rsocket` fails with `EOPNOTSUPP` (said once on standard error), so every descriptor
//! another call is given is not an rsocket, and those that act on one fail with `EBADF`.
//! `rpoll` and `rselect`, whose descriptors are then all ordinary ones, are poll(2) and
//! select(2) (rping waits on its event channel's descriptor with `rpoll`).

use libc::{c_int, c_void, off_t, size_t, sockaddr, socklen_t, ssize_t};

use crate::{guard, set_errno, unsupported};

/// `rsocket`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn rsocket(_domain: c_int, _kind: c_int, _protocol: c_int) -> c_int {
    guard(-1, || {
        set_errno(unsupported("rsocket (rsockets)"));
        -1
    })
}

/// What a call on a descriptor that is not an rsocket answers: -1 as its type has it, `EBADF`.
fn not_an_rsocket<T: From<i8>>() -> T {
    set_errno(libc::EBADF);
    T::from(-1)
}

/// `rbind`.
#[no_mangle]
pub extern "C" fn rbind(_socket: c_int, _addr: *const sockaddr, _len: socklen_t) -> c_int {
    not_an_rsocket()
}

/// `rlisten`.
#[no_mangle]
pub extern "C" fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
    not_an_rsocket()
}

/// `raccept`.
#[no_mangle]
pub extern "C" fn raccept(_socket: c_int, _addr: *mut sockaddr, _len: *mut socklen_t) -> c_int {
    not_an_rsocket()
}

/// `rconnect`.
#[no_mangle]
pub extern "C" fn rconnect(_socket: c_int, _addr: *const sockaddr, _len: socklen_t) -> c_int {
    not_an_rsocket()
}

/// `rshutdown`.
#[no_mangle]
pub extern "C" fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
    not_an_rsocket()
}

/// `rclose`.
#[no_mangle]
pub extern "C" fn rclose(_socket: c_int) -> c_int {
    not_an_rsocket()
}

/// `rrecv`.
#[no_mangle]
pub extern "C" fn rrecv(_socket: c_int, _buf: *mut c_void, _len: size_t, _flags: c_int) -> ssize_t {
    not_an_rsocket()
}

/// `rrecvfrom`.
#[no_mangle]
pub extern "C" fn rrecvfrom(
    _socket: c_int,
    _buf: *mut c_void,
    _len: size_t,
    _flags: c_int,
    _src: *mut sockaddr,
    _src_len: *mut socklen_t,
) -> ssize_t {
    not_an_rsocket()
}

/// `rrecvmsg`.
#[no_mangle]
pub extern "C" fn rrecvmsg(_socket: c_int, _msg: *mut libc::msghdr, _flags: c_int) -> ssize_t {
    not_an_rsocket()
}

/// `rsend`.
#[no_mangle]
pub extern "C" fn rsend(
    _socket: c_int,
    _buf: *const c_void,
    _len: size_t,
    _flags: c_int,
) -> ssize_t {
    not_an_rsocket()
}

/// `rsendto`.
#[no_mangle]
pub extern "C" fn rsendto(
    _socket: c_int,
    _buf: *const c_void,
    _len: size_t,
    _flags: c_int,
    _dst: *const sockaddr,
    _dst_len: socklen_t,
) -> ssize_t {
    not_an_rsocket()
}

/// `rsendmsg`.
#[no_mangle]
pub extern "C" fn rsendmsg(_socket: c_int, _msg: *const libc::msghdr, _flags: c_int) -> ssize_t {
    not_an_rsocket()
}

/// `rread`.
#[no_mangle]
pub extern "C" fn rread(_socket: c_int, _buf: *mut c_void, _count: size_t) -> ssize_t {
    not_an_rsocket()
}

/// `rreadv`.
#[no_mangle]
pub extern "C" fn rreadv(_socket: c_int, _iov: *const libc::iovec, _count: c_int) -> ssize_t {
    not_an_rsocket()
}

/// `rwrite`.
#[no_mangle]
pub extern "C" fn rwrite(_socket: c_int, _buf: *const c_void, _count: size_t) -> ssize_t {
    not_an_rsocket()
}

/// `rwritev`.
#[no_mangle]
pub extern "C" fn rwritev(_socket: c_int, _iov: *const libc::iovec, _count: c_int) -> ssize_t {
    not_an_rsocket()
}

/// `rgetpeername`.
#[no_mangle]
pub extern "C" fn rgetpeername(
    _socket: c_int,
    _addr: *mut sockaddr,
    _len: *mut socklen_t,
) -> c_int {
    not_an_rsocket()
}

/// `rgetsockname`.
#[no_mangle]
pub extern "C" fn rgetsockname(
    _socket: c_int,
    _addr: *mut sockaddr,
    _len: *mut socklen_t,
) -> c_int {
    not_an_rsocket()
}

/// `rsetsockopt`.
#[no_mangle]
pub extern "C" fn rsetsockopt(
    _socket: c_int,
    _level: c_int,
    _name: c_int,
    _value: *const c_void,
    _len: socklen_t,
) -> c_int {
    not_an_rsocket()
}

/// `rgetsockopt`.
#[no_mangle]
pub extern "C" fn rgetsockopt(
    _socket: c_int,
    _level: c_int,
    _name: c_int,
    _value: *mut c_void,
    _len: *mut socklen_t,
) -> c_int {
    not_an_rsocket()
}

/// `rfcntl` (its third argument, a C vararg, is not read).
#[no_mangle]
pub extern "C" fn rfcntl(_socket: c_int, _cmd: c_int) -> c_int {
    not_an_rsocket()
}

/// `riomap`.
#[no_mangle]
pub extern "C" fn riomap(
    _socket: c_int,
    _buf: *mut c_void,
    _len: size_t,
    _prot: c_int,
    _flags: c_int,
    _offset: off_t,
) -> off_t {
    not_an_rsocket()
}

/// `riounmap`.
#[no_mangle]
pub extern "C" fn riounmap(_socket: c_int, _buf: *mut c_void, _len: size_t) -> c_int {
    not_an_rsocket()
}

/// `riowrite`: `(size_t) -1`.
#[no_mangle]
pub extern "C" fn riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: size_t,
    _offset: off_t,
    _flags: c_int,
) -> size_t {
    not_an_rsocket::<isize>() as size_t
}

/// `rpoll`: poll(2), a cancellation point as librdmacm's is: declared `C-unwind` (the
/// `libc` crate's `C` may not unwind), with nothing of the library's in the frame.
#[no_mangle]
pub unsafe extern "C-unwind" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the program's array of `nfds` pollfds, as poll(2) takes it.
    unsafe { poll(fds, nfds, timeout) }
}

/// `rselect`: select(2), a cancellation point as `rpoll` is.
#[no_mangle]
pub unsafe extern "C-unwind" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the program's descriptor sets and timeout, or nulls, as select(2) takes them.
    unsafe { select(nfds, readfds, writefds, exceptfds, timeout) }
}

extern "C-unwind" {
    fn poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    fn select(
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int;
}
