//! Enhanced connection establishment (ECE) on an ID: `rdma_set_local_ece`,
//! `rdma_get_remote_ece`, `rdma_reject_ece`.
//!
//! With the kernel's CM, the options travel in the REQ's and REP's vendor ID fields and MAD
//! attribute modifier. softroce's CM does not carry them yet: the calls check their arguments
//! as librdmacm does, a local offer is accepted and not sent, every peer is reported as
//! offering nothing (vendor 0, as rxe and a kernel without ECE report), and a rejection for
//! an unsupported option is sent with its own reason (35).

use libc::{c_int, c_void};
use softroce::wire::cm::RejReason;

use super::id::{reject, with_id};
use crate::abi::*;

/// `rdma_set_local_ece`: `EINVAL` as librdmacm, for an ID with a QP of librdmacm's (ECE is
/// for a program's own QP), or an ECE without a vendor or with a `comp_mask`; else 0.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    with_id(id, |this| {
        // SAFETY: the program's ECE, or null.
        let ece = unsafe { ece.as_ref() }.ok_or(libc::EINVAL)?;
        if !this.ibv.qp.is_null() || ece.vendor_id == 0 || ece.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        Ok(0)
    })
}

/// `rdma_get_remote_ece`: what the peer offered, which is nothing (see the module). `EINVAL`
/// for an ID with a QP of librdmacm's, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    with_id(id, |this| {
        if !this.ibv.qp.is_null() || ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's ECE, checked above.
        unsafe { ece.write(ibv_ece::default()) };
        Ok(0)
    })
}

/// `rdma_reject_ece`: `rdma_reject`, with reason 35 (vendor option not supported).
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: as the program calls it.
    unsafe {
        reject(
            id,
            private_data,
            private_data_len,
            RejReason::VENDOR_OPTION_NOT_SUPPORTED,
        )
    }
}
