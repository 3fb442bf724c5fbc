//! A port's GIDs as rdma-core's extended queries give them (`ibv_query_gid_ex`,
//! `ibv_query_gid_table`), and where sysfs is (`ibv_get_sysfs_path`). A softroce device has one
//! port with one GID: its IP address as a RoCE v2 GID (`ibv_query_gid` is in `devices`).

use std::ffi::CString;
use std::sync::OnceLock;

use libc::{c_char, c_int, size_t, ssize_t};

use crate::abi::*;
use crate::devices::Context;
use crate::guard;

/// The GID entry at `index` of `context`'s `port`, with the index of the network interface
/// that holds the address (0 if none does, as for a GID with no netdev).
fn entry(context: &Context, port: u32, index: u32) -> Result<ibv_gid_entry, c_int> {
    let (Ok(port_u8), Ok(index_int)) = (u8::try_from(port), c_int::try_from(index)) else {
        return Err(libc::EINVAL);
    };
    let gid = context.gid(port_u8, index_int)?;
    let ndev_ifindex = softroce::io::link_of(context.entry.addr).map_or(0, |link| link.index);
    Ok(ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex,
    })
}

/// `_ibv_query_gid_ex` (what `ibv_query_gid_ex` calls): the GID, its type (RoCE v2) and its
/// interface. 0, or an errno.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry_out: *mut ibv_gid_entry,
    flags: u32,
    entry_size: size_t,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            return libc::EINVAL;
        };
        if entry_out.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match entry(context, port_num, gid_index) {
            Ok(found) => {
                // SAFETY: `entry_out` points to at least one `ibv_gid_entry` (checked size).
                unsafe { entry_out.write(found) };
                0
            }
            Err(errno) => errno,
        }
    })
}

/// `_ibv_query_gid_table` (what `ibv_query_gid_table` calls): every valid GID of every port,
/// `entry_size` bytes apart. The number written, or a negative errno: `-EINVAL` for flags, an
/// entry smaller than rdma-core's, or fewer than `max_entries` places for them (as the kernel's
/// `UVERBS_METHOD_QUERY_GID_TABLE`).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: size_t,
    flags: u32,
    entry_size: size_t,
) -> ssize_t {
    guard(-(libc::EIO as ssize_t), || {
        let invalid = -(libc::EINVAL as ssize_t);
        // SAFETY: the program passes a context it opened and has not closed.
        let Some(context) = (unsafe { Context::from_ibv(context) }) else {
            return invalid;
        };
        let table = crate::devices::GID_TABLE_LEN as u32;
        if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return invalid;
        }
        if max_entries < table as usize {
            return invalid;
        }
        for index in 0..table {
            let found = match entry(context, 1, index) {
                Ok(found) => found,
                Err(errno) => return -(errno as ssize_t),
            };
            // SAFETY: the program gives `max_entries` places of `entry_size` bytes, each with
            // room for an `ibv_gid_entry` (checked), of which this is one; unaligned if the
            // program's size is not a multiple of the structure's alignment. What a larger
            // place holds past the structure is zeroed, as the kernel's copy does.
            unsafe {
                let place = entries.cast::<u8>().add(index as usize * entry_size);
                place.write_bytes(0, entry_size);
                place.cast::<ibv_gid_entry>().write_unaligned(found)
            };
        }
        table as ssize_t
    })
}

/// `ibv_get_sysfs_path`: where sysfs is mounted, as rdma-core finds it: `$SYSFS_PATH` (but
/// in a set-user-ID program), at most 256 bytes of it, without its trailing slashes (empty if
/// that is all it is); else `/sys`. Open MPI's verbs components ask.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    /// rdma-core's `IBV_SYSFS_PATH_MAX`, with the NUL.
    const MAX: usize = 256;
    static PATH: OnceLock<CString> = OnceLock::new();
    guard(std::ptr::null(), || {
        PATH.get_or_init(|| {
            // SAFETY: getuid and geteuid have no preconditions and cannot fail.
            let setuid = unsafe { libc::getuid() != libc::geteuid() };
            let given = std::env::var_os("SYSFS_PATH").filter(|_| !setuid);
            let mut path = given.map_or_else(
                || b"/sys".to_vec(),
                std::os::unix::ffi::OsStringExt::into_vec,
            );
            path.truncate(MAX - 1);
            while path.last() == Some(&b'/') {
                path.pop();
            }
            // An environment variable holds no NUL.
            CString::new(path).unwrap_or_default()
        })
        .as_ptr()
    })
}
