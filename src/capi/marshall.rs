//! rdma-core's copy helpers between its structures and the kernel uverbs ABI's
//! (`ibv_copy_qp_attr_from_kern`, `ibv_copy_ah_attr_from_kern`, `ibv_copy_path_rec_from_kern`,
//! `ibv_copy_path_rec_to_kern`; rdma-core's `marshall.h`). softroce speaks to no kernel, but
//! programs and libraries that carry the kernel's structures (path records from the SA, QP
//! attributes from `rdma_user_cm`) use them, field by field as rdma-core copies: the fields both
//! structures have, and nothing else of the destination.

use crate::abi::*;
use crate::guard;

/// `dst.field = src.field` for each field named.
macro_rules! copy_fields {
    ($dst:expr, $src:expr; $($field:ident),+ $(,)?) => {
        $($dst.$field = $src.$field;)+
    };
}

/// The fields a path record has of the same type in rdma-core's structure and the kernel's.
macro_rules! copy_path_rec_fields {
    ($dst:expr, $src:expr) => {
        copy_fields!($dst, $src; dlid, slid, flow_label, pkey, hop_limit, traffic_class,
            numb_path, sl, mtu_selector, rate_selector, rate, packet_life_time_selector,
            packet_life_time, preference)
    };
}

/// `ibv_copy_ah_attr_from_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    // SAFETY: the program's structures, or null.
    if let Some((dst, src)) = unsafe { dst.as_mut().zip(src.as_ref()) } {
        guard((), || ah_attr_from_kern(dst, src));
    }
}

/// The address fields both structures have.
fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid = ibv_gid { raw: src.grh.dgid };
    copy_fields!(dst.grh, src.grh; flow_label, sgid_index, hop_limit, traffic_class);
    copy_fields!(dst, src; dlid, sl, src_path_bits, static_rate, is_global, port_num);
}

/// `ibv_copy_qp_attr_from_kern`: every field both have but `qp_state`, as rdma-core's.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    // SAFETY: the program's structure, or null.
    let Some(src) = (unsafe { src.as_ref() }) else {
        return;
    };
    guard((), || {
        // SAFETY: the program's structure (of any header's: `rate_limit` is not written), or
        // null.
        unsafe {
            crate::qp::with_qp_attr(dst, |dst| {
                // All but `qp_state`, which rdma-core's copy leaves as it was (the test
                // compares).
                copy_fields!(dst, src; cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
                    sq_psn, dest_qp_num, qp_access_flags);
                copy_fields!(dst.cap, src; max_send_wr, max_recv_wr, max_send_sge,
                    max_recv_sge, max_inline_data);
                ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
                ah_attr_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
                copy_fields!(dst, src; pkey_index, alt_pkey_index, en_sqd_async_notify,
                    sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num,
                    timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout);
            })
        };
    });
}

/// `ibv_copy_path_rec_from_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    // SAFETY: the program's structures, or null.
    let Some((dst, src)) = (unsafe { dst.as_mut().zip(src.as_ref()) }) else {
        return;
    };
    guard((), || {
        dst.dgid = ibv_gid { raw: src.dgid };
        dst.sgid = ibv_gid { raw: src.sgid };
        dst.raw_traffic = src.raw_traffic as i32;
        dst.reversible = src.reversible as i32;
        // A byte in rdma-core's structure, a word in the kernel's: its low byte, as C's
        // assignment takes it.
        dst.mtu = src.mtu as u8;
        copy_path_rec_fields!(dst, src);
    });
}

/// `ibv_copy_path_rec_to_kern`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    // SAFETY: the program's structures, or null.
    let Some((dst, src)) = (unsafe { dst.as_mut().zip(src.as_ref()) }) else {
        return;
    };
    guard((), || {
        (dst.dgid, dst.sgid) = (src.dgid.raw, src.sgid.raw);
        dst.raw_traffic = src.raw_traffic as u32;
        dst.reversible = src.reversible as u32;
        dst.mtu = src.mtu.into();
        copy_path_rec_fields!(dst, src);
    });
}
