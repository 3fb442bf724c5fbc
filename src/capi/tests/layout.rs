//! Every structure softroce's C library shares with programs, field by field, against
//! rdma-core's own header: a C program built with the system's `<infiniband/verbs.h>` (Debian's
//! libibverbs-dev) prints the size of each structure and the offset and size of each field,
//! and each must equal softroce's.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::process::Command;

use softroce_capi::abi::*;

mod common;

/// A field as softroce lays it out: its C name (an expression after `s.`), offset and size.
struct Field {
    c: &'static str,
    offset: usize,
    size: usize,
}

/// A structure: its C name, its size, and every field.
struct Layout {
    c: &'static str,
    size: usize,
    fields: Vec<Field>,
}

/// `layout!(rust_type, "struct c_name", field, field => "c.expr", ...)`.
macro_rules! layout {
    ($t:ty, $c:literal, $($f:ident $(=> $cf:literal)?),* $(,)?) => {
        Layout {
            c: $c,
            size: size_of::<$t>(),
            fields: vec![$(Field {
                c: layout!(@name $f $(, $cf)?),
                offset: offset_of!($t, $f),
                size: {
                    fn size_of_field<T>(_: fn(&$t) -> &T) -> usize { size_of::<T>() }
                    size_of_field(|s: &$t| &s.$f)
                },
            }),*],
        }
    };
    (@name $f:ident) => { stringify!($f) };
    (@name $f:ident, $cf:literal) => { $cf };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(ibv_gid, "union ibv_gid", raw),
        layout!(
            ibv_gid_entry,
            "struct ibv_gid_entry",
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        ),
        layout!(
            ibv_device_attr,
            "struct ibv_device_attr",
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt,
        ),
        layout!(
            ibv_port_attr,
            "struct ibv_port_attr",
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2,
        ),
        layout!(
            ibv_async_event,
            "struct ibv_async_event",
            element,
            event_type
        ),
        layout!(
            ibv_wc,
            "struct ibv_wc",
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits,
        ),
        layout!(
            ibv_mw_bind_info,
            "struct ibv_mw_bind_info",
            mr,
            addr,
            length,
            mw_access_flags
        ),
        layout!(ibv_pd, "struct ibv_pd", context, handle),
        layout!(
            ibv_mr,
            "struct ibv_mr",
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        ),
        layout!(ibv_mw, "struct ibv_mw", context, pd, rkey, handle, type_ => "type"),
        layout!(
            ibv_global_route,
            "struct ibv_global_route",
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class,
        ),
        layout!(
            ibv_grh,
            "struct ibv_grh",
            version_tclass_flow,
            paylen,
            next_hdr,
            hop_limit,
            sgid,
            dgid,
        ),
        layout!(
            ibv_ah_attr,
            "struct ibv_ah_attr",
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num,
        ),
        layout!(
            ibv_srq_attr,
            "struct ibv_srq_attr",
            max_wr,
            max_sge,
            srq_limit
        ),
        layout!(
            ibv_srq_init_attr,
            "struct ibv_srq_init_attr",
            srq_context,
            attr
        ),
        layout!(ibv_tm_cap, "struct ibv_tm_cap", max_num_tags, max_ops),
        layout!(
            ibv_srq_init_attr_ex,
            "struct ibv_srq_init_attr_ex",
            srq_context,
            attr,
            comp_mask,
            srq_type,
            pd,
            xrcd,
            cq,
            tm_cap
        ),
        layout!(ibv_ece, "struct ibv_ece", vendor_id, options, comp_mask),
        layout!(
            ibv_qp_cap,
            "struct ibv_qp_cap",
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data,
        ),
        layout!(
            ibv_qp_init_attr,
            "struct ibv_qp_init_attr",
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
        ),
        layout!(
            ibv_qp_attr,
            "struct ibv_qp_attr",
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit,
        ),
        layout!(ibv_sge, "struct ibv_sge", addr, length, lkey),
        layout!(
            ibv_rx_hash_conf,
            "struct ibv_rx_hash_conf",
            rx_hash_function,
            rx_hash_key_len,
            rx_hash_key,
            rx_hash_fields_mask,
        ),
        layout!(
            ibv_qp_init_attr_ex,
            "struct ibv_qp_init_attr_ex",
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
            comp_mask,
            pd,
            xrcd,
            create_flags,
            max_tso_header,
            rwq_ind_tbl,
            rx_hash_conf,
            source_qpn,
            send_ops_flags,
        ),
        layout!(
            ibv_send_wr, "struct ibv_send_wr",
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr,
            remote_srqn => "qp_type.xrc.remote_srqn", bind_mw,
        ),
        layout!(
            send_wr_rdma,
            "typeof(((struct ibv_send_wr *)0)->wr.rdma)",
            remote_addr,
            rkey
        ),
        layout!(
            send_wr_atomic,
            "typeof(((struct ibv_send_wr *)0)->wr.atomic)",
            remote_addr,
            compare_add,
            swap,
            rkey,
        ),
        layout!(
            send_wr_ud,
            "typeof(((struct ibv_send_wr *)0)->wr.ud)",
            ah,
            remote_qpn,
            remote_qkey
        ),
        layout!(
            send_wr_bind_mw,
            "typeof(((struct ibv_send_wr *)0)->bind_mw)",
            mw,
            rkey,
            bind_info
        ),
        layout!(
            ibv_recv_wr,
            "struct ibv_recv_wr",
            wr_id,
            next,
            sg_list,
            num_sge
        ),
        layout!(
            ibv_mw_bind,
            "struct ibv_mw_bind",
            wr_id,
            send_flags,
            bind_info
        ),
        layout!(
            ibv_srq,
            "struct ibv_srq",
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed,
        ),
        layout!(
            ibv_qp,
            "struct ibv_qp",
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
        ),
        layout!(
            ibv_comp_channel,
            "struct ibv_comp_channel",
            context,
            fd,
            refcnt
        ),
        layout!(
            ibv_cq,
            "struct ibv_cq",
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
        ),
        layout!(
            ibv_cq_ex,
            "struct ibv_cq_ex",
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
            comp_mask,
            status,
            wr_id,
            start_poll,
            next_poll,
            end_poll,
            read_opcode,
            read_vendor_err,
            read_byte_len,
            read_imm_data,
            read_qp_num,
            read_src_qp,
            read_wc_flags,
            read_slid,
            read_sl,
            read_dlid_path_bits,
            read_completion_ts,
            read_cvlan,
            read_flow_tag,
            read_tm_info,
            read_completion_wallclock_ns,
        ),
        layout!(ibv_poll_cq_attr, "struct ibv_poll_cq_attr", comp_mask),
        layout!(
            ibv_cq_init_attr_ex,
            "struct ibv_cq_init_attr_ex",
            cqe,
            cq_context,
            channel,
            comp_vector,
            wc_flags,
            comp_mask,
            flags,
            parent_domain,
        ),
        layout!(ibv_data_buf, "struct ibv_data_buf", addr, length),
        layout!(
            ibv_qp_ex,
            "struct ibv_qp_ex",
            qp_base,
            comp_mask,
            wr_id,
            wr_flags,
            wr_atomic_cmp_swp,
            wr_atomic_fetch_add,
            wr_bind_mw,
            wr_local_inv,
            wr_rdma_read,
            wr_rdma_write,
            wr_rdma_write_imm,
            wr_send,
            wr_send_imm,
            wr_send_inv,
            wr_send_tso,
            wr_set_ud_addr,
            wr_set_xrc_srqn,
            wr_set_inline_data,
            wr_set_inline_data_list,
            wr_set_sge,
            wr_set_sge_list,
            wr_start,
            wr_complete,
            wr_abort,
            wr_atomic_write,
        ),
        layout!(ibv_ah, "struct ibv_ah", context, pd, handle),
        layout!(
            ibv_device,
            "struct ibv_device",
            _ops,
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path,
        ),
        layout!(
            ibv_context_ops,
            "struct ibv_context_ops",
            _compat_query_device,
            _compat_query_port,
            _compat_alloc_pd,
            _compat_dealloc_pd,
            _compat_reg_mr,
            _compat_rereg_mr,
            _compat_dereg_mr,
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            _compat_cq_event,
            _compat_resize_cq,
            _compat_destroy_cq,
            _compat_create_srq,
            _compat_modify_srq,
            _compat_query_srq,
            _compat_destroy_srq,
            post_srq_recv,
            _compat_create_qp,
            _compat_query_qp,
            _compat_modify_qp,
            _compat_destroy_qp,
            post_send,
            post_recv,
            _compat_create_ah,
            _compat_destroy_ah,
            _compat_attach_mcast,
            _compat_detach_mcast,
            _compat_async_event,
        ),
        layout!(
            ibv_context,
            "struct ibv_context",
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat,
        ),
        layout!(
            verbs_context, "struct verbs_context",
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv_ => "priv", query_device_ex,
            ibv_destroy_flow, abi_placeholder2 => "ABI_placeholder2", ibv_create_flow,
            abi_placeholder1 => "ABI_placeholder1", open_qp, create_qp_ex, get_srq_num,
            create_srq_ex, open_xrcd, close_xrcd, _abi_placeholder3 => "_ABI_placeholder3", sz,
            context,
        ),
    ]
}

/// The C program that prints, for each structure, `name size` and for each field
/// `name.field offset size`, from the real header.
fn c_program(layouts: &[Layout], include: &str) -> String {
    let mut c =
        format!("#include <stddef.h>\n#include <stdio.h>\n{include}\n\nint main(void)\n{{\n");
    for l in layouts {
        let _ = writeln!(c, "\tprintf(\"{0} %zu\\n\", sizeof({0}));", l.c);
        for f in &l.fields {
            let _ = writeln!(
                c,
                "\tprintf(\"{0}.{1} %zu %zu\\n\", offsetof({0}, {1}), sizeof((({0} *)0)->{1}));",
                l.c, f.c
            );
        }
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

/// The structures of the kernel's uverbs ABI and of rdma-core's `sa.h` that rdma-core's copy
/// helpers (`ibv_copy_*_kern`) convert between, against those headers.
#[test]
fn the_kernel_abi_structures_match_their_headers() {
    let layouts = vec![
        layout!(
            ibv_sa_path_rec,
            "struct ibv_sa_path_rec",
            dgid,
            sgid,
            dlid,
            slid,
            raw_traffic,
            flow_label,
            hop_limit,
            traffic_class,
            reversible,
            numb_path,
            pkey,
            sl,
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            packet_life_time_selector,
            packet_life_time,
            preference
        ),
        layout!(
            ib_user_path_rec,
            "struct ib_user_path_rec",
            dgid,
            sgid,
            dlid,
            slid,
            raw_traffic,
            flow_label,
            reversible,
            mtu,
            pkey,
            hop_limit,
            traffic_class,
            numb_path,
            sl,
            mtu_selector,
            rate_selector,
            rate,
            packet_life_time_selector,
            packet_life_time,
            preference
        ),
        layout!(
            ib_uverbs_global_route,
            "struct ib_uverbs_global_route",
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class,
            reserved
        ),
        layout!(
            ib_uverbs_ah_attr,
            "struct ib_uverbs_ah_attr",
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num,
            reserved
        ),
        layout!(
            ib_uverbs_qp_attr,
            "struct ib_uverbs_qp_attr",
            qp_attr_mask,
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            ah_attr,
            alt_ah_attr,
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            reserved
        ),
    ];
    check(
        &layouts,
        "#include <infiniband/sa.h>\n#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>",
    );
}

#[test]
fn every_shared_structure_matches_the_header() {
    check(&layouts(), "#include <infiniband/verbs.h>");
}

/// Builds and runs the C program for `layouts` with `include`, and compares every line.
fn check(layouts: &[Layout], include: &str) {
    // A directory per check: the two run at once, in two threads of this process.
    static CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let check = CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::own_dir().join(format!("layout-{check}"));
    std::fs::create_dir(&dir).unwrap();
    let (source, program) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&source, c_program(layouts, include)).unwrap();
    let built = Command::new("cc")
        .arg("-std=gnu11")
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        built.status.success(),
        "building against {include} failed (apt-get install libibverbs-dev librdmacm-dev):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let printed = Command::new(&program).output().unwrap();
    let printed = String::from_utf8(printed.stdout).unwrap();
    let mut expected = String::new();
    for l in layouts {
        let _ = writeln!(expected, "{} {}", l.c, l.size);
        for f in &l.fields {
            let _ = writeln!(expected, "{}.{} {} {}", l.c, f.c, f.offset, f.size);
        }
    }
    let differ: Vec<_> = printed
        .lines()
        .zip(expected.lines())
        .filter(|(c, rust)| c != rust)
        .map(|(c, rust)| format!("header: {c}\nsoftroce: {rust}"))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert_eq!(printed.lines().count(), expected.lines().count());
    let _ = std::fs::remove_dir_all(&dir);
}

/// libibverbs 1.0's structures (`verbs_1_0::abi`), which no installed header has any more,
/// against their declarations in `c/verbs_1_0.h`, as 1.0's header had them.
#[test]
fn the_libibverbs_1_0_structures_match_their_declarations() {
    use softroce_capi::verbs_1_0::abi::*;
    let layouts = vec![
        layout!(
            ibv_device_1_0,
            "struct ibv_device_1_0",
            obsolete_sysfs_dev,
            obsolete_sysfs_ibdev,
            real_device,
            _ops,
        ),
        layout!(
            ibv_context_ops_1_0,
            "struct ibv_context_ops_1_0",
            query_device,
            create_cq,
            poll_cq,
            req_notify_cq,
            cq_event,
            destroy_srq,
            post_srq_recv,
            create_qp,
            destroy_qp,
            post_send,
            post_recv,
            create_ah,
            detach_mcast,
        ),
        layout!(
            ibv_context_1_0,
            "struct ibv_context_1_0",
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            real_context,
        ),
        layout!(ibv_comp_channel_1_0, "struct ibv_comp_channel_1_0", fd),
        layout!(ibv_pd_1_0, "struct ibv_pd_1_0", context, handle, real_pd),
        layout!(
            ibv_mr_1_0,
            "struct ibv_mr_1_0",
            context,
            pd,
            handle,
            lkey,
            rkey,
            real_mr,
        ),
        layout!(
            ibv_srq_1_0,
            "struct ibv_srq_1_0",
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed,
            real_srq,
        ),
        layout!(
            ibv_qp_init_attr_1_0,
            "struct ibv_qp_init_attr_1_0",
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
        ),
        layout!(
            ibv_send_wr_1_0,
            "struct ibv_send_wr_1_0",
            next,
            wr_id,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            wr,
        ),
        layout!(
            ibv_recv_wr_1_0,
            "struct ibv_recv_wr_1_0",
            next,
            wr_id,
            sg_list,
            num_sge,
        ),
        layout!(
            ibv_qp_1_0,
            "struct ibv_qp_1_0",
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
            real_qp,
        ),
        layout!(
            ibv_cq_1_0,
            "struct ibv_cq_1_0",
            context,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
            real_cq,
        ),
        layout!(
            ibv_ah_1_0,
            "struct ibv_ah_1_0",
            context,
            pd,
            handle,
            real_ah
        ),
    ];
    check(&layouts, include_str!("c/verbs_1_0.h"));
}

/// The same for `<rdma/rdma_cma.h>`, whose `sockaddr` unions softroce keeps as their
/// `sockaddr_storage` members.
#[test]
fn every_shared_rdma_cm_structure_matches_the_header() {
    let layouts = vec![
        layout!(rdma_ib_addr, "struct rdma_ib_addr", sgid, dgid, pkey),
        layout!(
            rdma_addr, "struct rdma_addr",
            src_storage, dst_storage, ibaddr => "addr.ibaddr",
        ),
        layout!(rdma_route, "struct rdma_route", addr, path_rec, num_paths),
        layout!(rdma_event_channel, "struct rdma_event_channel", fd),
        layout!(
            rdma_cm_id,
            "struct rdma_cm_id",
            verbs,
            channel,
            context,
            qp,
            route,
            ps,
            port_num,
            event,
            send_cq_channel,
            send_cq,
            recv_cq_channel,
            recv_cq,
            srq,
            pd,
            qp_type,
        ),
        layout!(
            rdma_conn_param,
            "struct rdma_conn_param",
            private_data,
            private_data_len,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num,
        ),
        layout!(
            rdma_ud_param,
            "struct rdma_ud_param",
            private_data,
            private_data_len,
            ah_attr,
            qp_num,
            qkey,
        ),
        layout!(
            rdma_cm_event,
            "struct rdma_cm_event",
            id,
            listen_id,
            event,
            status,
            param
        ),
        layout!(
            rdma_addrinfo,
            "struct rdma_addrinfo",
            ai_flags,
            ai_family,
            ai_qp_type,
            ai_port_space,
            ai_src_len,
            ai_dst_len,
            ai_src_addr,
            ai_dst_addr,
            ai_src_canonname,
            ai_dst_canonname,
            ai_route_len,
            ai_route,
            ai_connect_len,
            ai_connect,
            ai_next,
        ),
    ];
    check(&layouts, "#include <rdma/rdma_cma.h>");
}
