//! rdma-core's provider interface (`IBVERBS_PRIVATE_34`, Debian 12's node), which the vendor
//! libraries that perftest links (libmlx5, libefa) reference. The dynamic loader resolves their
//! references when it loads them, so each name must be here, at that node; softroce loads no
//! provider and has no device of theirs, so nothing calls them but a provider's registration
//! at load time, which is taken and ignored. Each of the others says so once on standard error
//! and answers `EOPNOTSUPP` (or null, or nothing).

use std::sync::atomic::AtomicBool;

use libc::{c_int, c_void};

use crate::{guard, unsupported};

/// `verbs_allow_disassociate_destroy`: a flag of rdma-core's, read by providers.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `verbs_register_driver_34`: a provider registering itself as it is loaded. softroce serves
/// every device itself: the provider is ignored.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_driver: *const c_void) {}

/// `ibv_register_driver`: the registration of a provider from before rdma-core 13, which
/// rdma-core keeps as a function that does nothing, for old libraries that call it; at
/// IBVERBS_1.1 but not its default, as rdma-core's, so that nothing new links with it.
#[no_mangle]
pub extern "C" fn ibv_register_driver_1_1(_name: *const libc::c_char, _init: *const c_void) {}

crate::at_version! {
    "IBVERBS_1.1";
    ibv_register_driver_1_1 => "ibv_register_driver",
}

/// `__verbs_log`: a provider's debug line, which rdma-core prints only when `VERBS_LOG_LEVEL`
/// asks; softroce has no provider log, and prints nothing. (libfabric's efa provider logs
/// through it as it looks for its devices, on every host.) Its arguments are C varargs, not
/// read.
#[no_mangle]
pub extern "C" fn __verbs_log() {}

/// `ibv_read_ibdev_sysfs_file`: a device's sysfs file, which a softroce device does not have
/// (as `ibv_read_sysfs_file`): -1, `ENOENT`. Its format's arguments, which rdma-core's takes
/// as C varargs, are not read.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut libc::c_char,
    _size: libc::size_t,
    _sysfs_dev: *const libc::c_char,
    _fnfmt: *const libc::c_char,
) -> c_int {
    crate::set_errno(libc::ENOENT);
    -1
}

/// Provider functions that return an errno.
macro_rules! errno_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a provider's, which softroce never calls.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            guard(libc::EOPNOTSUPP, || {
                unsupported(concat!(stringify!($name), " (rdma-core's provider interface)"))
            })
        }
    )*};
}

/// Provider functions that return a pointer: null.
macro_rules! null_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a provider's, which softroce never calls.")]
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            guard(std::ptr::null_mut(), || {
                unsupported(concat!(stringify!($name), " (rdma-core's provider interface)"));
                std::ptr::null_mut()
            })
        }
    )*};
}

/// Provider functions that return nothing.
macro_rules! void_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a provider's, which softroce never calls.")]
        #[no_mangle]
        pub extern "C" fn $name() {
            guard((), || {
                unsupported(concat!(stringify!($name), " (rdma-core's provider interface)"));
            })
        }
    )*};
}

errno_stubs!(
    __ioctl_final_num_attrs,
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_resolve_eth_l2_from_gid,
);

null_stubs!(_verbs_init_and_alloc_context, verbs_open_device);

void_stubs!(verbs_init_cq, verbs_set_ops, verbs_uninit_context);

/// `ibv_dontfork_range`: softroce pins nothing, so a child after `fork` changes nothing a
/// peer reaches; 0.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: libc::size_t) -> c_int {
    0
}

/// `ibv_dofork_range`: as `ibv_dontfork_range`; 0.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: libc::size_t) -> c_int {
    0
}
