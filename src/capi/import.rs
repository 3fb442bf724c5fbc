//! Objects shared between processes through the kernel's uverbs file (`ibv_import_device`,
//! `ibv_import_pd`, `ibv_import_mr`, `ibv_import_dm`), which softroce, in each process on its
//! own, has not: each import fails with `EOPNOTSUPP`, as rdma-core's fails for a provider
//! without it. Since nothing is ever imported, the unimport calls have nothing to forget, and
//! leave the object they are given as it was (rdma-core's would free its structure but keep
//! the kernel's object: a PD or MR of the program's own stays usable here instead).

use libc::{c_int, c_void};

use crate::abi::*;
use crate::{guard, set_errno, unsupported};

/// Answers an import: null, with `errno` set to `EOPNOTSUPP`.
fn refuse<T>(verb: &str) -> *mut T {
    guard(std::ptr::null_mut(), || {
        set_errno(unsupported(verb));
        std::ptr::null_mut()
    })
}

/// `ibv_import_device`: no uverbs file to import from.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    refuse("ibv_import_device")
}

/// `ibv_import_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    refuse("ibv_import_pd")
}

/// `ibv_import_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    refuse("ibv_import_mr")
}

/// `ibv_import_dm` (device memory, which softroce has not either).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _handle: u32) -> *mut c_void {
    refuse("ibv_import_dm")
}

/// `ibv_unimport_pd`: nothing was imported.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// `ibv_unimport_mr`: nothing was imported.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// `ibv_unimport_dm`: nothing was imported.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}
