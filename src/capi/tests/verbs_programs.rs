//! rdma-core's own verbs programs, as Debian ships them, unmodified, over softroce's
//! libibverbs.so.1: two processes on loopback, each with an address of its own.

mod common;

use std::time::Duration;

use common::{finish, pair, program, succeeded};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_and_ibv_devinfo_describe_the_device() {
    let out = program("127.0.3.9", "ibv_devices", &[]).output().unwrap();
    let listed = succeeded("ibv_devices", &out);
    assert!(listed.contains("softroce0"), "{listed}");
    assert!(
        listed.contains("02007ffffe000309"),
        "the GUID from the address: {listed}"
    );

    let out = program("127.0.3.9", "ibv_devinfo", &["-v"])
        .output()
        .unwrap();
    let info = succeeded("ibv_devinfo", &out);
    for expected in [
        "hca_id:\tsoftroce0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.3.9, RoCE v2",
        "max_qp_rd_atom:\t\t\t128",
    ] {
        assert!(info.contains(expected), "{expected:?} in:\n{info}");
    }
}

/// Each pingpong of rdma-core: RC, UC, UD and SRQ, validating every buffer received (`-c`).
#[test]
fn the_pingpongs_run_between_two_processes() {
    for (n, name) in [
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18700 + n).to_string();
        let common = ["-g", "0", "-c", "-n", "200", "-p", &port];
        let client: Vec<&str> = common.iter().copied().chain(["127.0.0.1"]).collect();
        let (server, client) = pair(
            name,
            ("127.0.3.1", "127.0.3.2"),
            &common,
            &client,
            18700 + n as u16,
            LIMIT,
        );
        for out in [server, client] {
            assert!(out.contains("200 iters in"), "{name}: {out}");
        }
    }
}

/// The client sleeps on its completion channel (`-e`): ibv_req_notify_cq, poll(2) on the
/// channel's descriptor inside ibv_get_cq_event, ibv_ack_cq_events.
#[test]
fn rc_pingpong_with_completion_events() {
    let args = ["-g", "0", "-c", "-e", "-n", "200", "-p", "18710"];
    let client: Vec<&str> = args.iter().copied().chain(["127.0.0.1"]).collect();
    pair(
        "ibv_rc_pingpong",
        ("127.0.3.3", "127.0.3.4"),
        &args,
        &client,
        18710,
        LIMIT,
    );
}

/// An address whose UDP 4791 something other than this user's softroce processes holds (here a
/// plain socket, as kernel rxe's would be): the device does not open, and the program's standard
/// error says why, which process holds the address (this test's), and what to do. (Processes of
/// one user share an address: `shared_address.rs`.)
#[test]
fn a_taken_address_is_refused_with_what_to_do() {
    let holder = std::net::UdpSocket::bind("127.0.3.5:4791").unwrap();
    let second = program("127.0.3.5", "ibv_devinfo", &[]).output().unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        said.contains("127.0.3.5:4791 is bound by")
            && said.contains("held by process ")
            && said
                .split(|c: char| !c.is_ascii_digit())
                .any(|n| n == std::process::id().to_string())
            && said.contains("another address")
            && said.contains("SOFTROCE_ADDR="),
        "{said}"
    );
    drop(holder);
}

/// A thread blocked in `ibv_get_async_event` while another closes the context, as a program
/// whose thread watches a device for errors may stop it: the wait ends with -1 and `EIO` (what
/// a blocked read of rdma-core's `async_fd` gets), and does not read the freed context.
#[test]
fn closing_a_context_ends_a_wait_for_its_asynchronous_events() {
    let source = r#"#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <infiniband/verbs.h>
static struct ibv_context *ctx;
static void *watch(void *arg) {
    struct ibv_async_event event;
    announce_tid();
    int ret = ibv_get_async_event(ctx, &event);
    printf("wait returned %d, errno %s\n", ret, ret ? (errno == EIO ? "EIO" : "other") : "none");
    return arg;
}
int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    pthread_t watcher;
    if (!list || !list[0] || !(ctx = ibv_open_device(list[0]))) { perror("open"); return 1; }
    pthread_create(&watcher, NULL, watch, NULL);
    if (!wait_blocked()) { fprintf(stderr, "the watcher never blocked\n"); return 1; }
    if (ibv_close_device(ctx)) { perror("ibv_close_device"); return 1; }
    pthread_join(watcher, NULL);
    ibv_free_device_list(list);
    return 0;
}
"#;
    let watcher = common::compile_c(
        "async_close",
        &common::with_blocked_waiter(source),
        &["-libverbs", "-lpthread"],
    );
    let child = program("127.0.3.12", watcher.to_str().unwrap(), &[])
        .spawn()
        .unwrap();
    let output = finish("async_close", child, LIMIT);
    let out = succeeded("async_close", &output);
    assert!(out.contains("wait returned -1, errno EIO"), "{out}");
}

/// A CQ destroyed while its completion event is held (by a thread between `ibv_get_cq_event`
/// and `ibv_ack_cq_events`), the two threads' steps made deterministic in one: the CQ stays
/// readable until the event is acknowledged (rdma-core's `ibv_destroy_cq` waits for that
/// acknowledgement; softroce's freed the CQ at once). The event is a flushed receive's
/// completion. `MALLOC_PERTURB_`, without glibc's per-thread cache, makes freed memory read as
/// its byte.
#[test]
fn a_cq_destroyed_while_its_event_is_held_stays_until_the_ack() {
    let source = r#"#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
    static int marker;
    static char buf[64];
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx;
    if (!list || !list[0] || !(ctx = ibv_open_device(list[0]))) { perror("open"); return 1; }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, &marker, channel, 0);
    struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
    struct ibv_sge sge = { .addr = (uintptr_t) buf, .length = sizeof buf, .lkey = mr ? mr->lkey : 0 };
    struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
    if (!qp || ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
            | IBV_QP_ACCESS_FLAGS) || ibv_post_recv(qp, &wr, &bad)) { perror("qp"); return 1; }
    ibv_req_notify_cq(cq, 0);
    attr.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp, &attr, IBV_QP_STATE)) { perror("to error"); return 1; }
    struct ibv_cq *fired;
    void *context;
    if (ibv_get_cq_event(channel, &fired, &context)) { perror("ibv_get_cq_event"); return 1; }
    struct ibv_wc wc;
    int n = ibv_poll_cq(fired, 1, &wc);
    printf("event for the cq: %d, flushed: %d\n", fired == cq && context == &marker,
           n == 1 && wc.wr_id == 7 && wc.status == IBV_WC_WR_FLUSH_ERR);
    ibv_destroy_qp(qp);
    if (ibv_destroy_cq(cq)) { perror("ibv_destroy_cq"); return 1; }
    printf("held cq intact: %d\n", fired->cq_context == &marker && fired->channel == channel);
    ibv_ack_cq_events(fired, 1);
    printf("channel destroyed: %d\n", ibv_destroy_comp_channel(channel) == 0);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
"#;
    let program_path = common::compile_c("held_cq_event", source, &["-libverbs"]);
    let child = program("127.0.3.13", program_path.to_str().unwrap(), &[])
        .env("MALLOC_PERTURB_", "165")
        .env("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
        .spawn()
        .unwrap();
    let output = finish("held_cq_event", child, LIMIT);
    let out = succeeded("held_cq_event", &output);
    for line in [
        "event for the cq: 1, flushed: 1",
        "held cq intact: 1",
        "channel destroyed: 1",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// A QP on an SRQ moved to ERROR raises `IBV_EVENT_QP_LAST_WQE_REACHED` for that QP, and no
/// other event (a modify is not an error): what SPDK's NVMe-oF target waits for before it
/// destroys a QP of its SRQ (IBTA 11.6.3.1; rxe_resp.c `flush_recv_queue`). The QP, destroyed
/// while the event is held, stays readable until the event's acknowledgement (rdma-core's
/// `ibv_destroy_qp` waits for it); `MALLOC_PERTURB_`, without glibc's per-thread cache, makes
/// freed memory read as its byte.
#[test]
fn a_qp_on_an_srq_moved_to_error_raises_last_wqe_reached() {
    let source = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx;
    if (!list || !list[0] || !(ctx = ibv_open_device(list[0]))) { perror("open"); return 1; }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 4, .max_sge = 1 } };
    struct ibv_srq *srq = pd ? ibv_create_srq(pd, &srq_init) : NULL;
    static int marker;
    struct ibv_qp_init_attr init = { .qp_context = &marker, .send_cq = cq, .recv_cq = cq,
        .srq = srq, .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 1, .max_send_sge = 1 } };
    struct ibv_qp *qp = cq && srq ? ibv_create_qp(pd, &init) : NULL;
    struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
    if (!qp || ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
            | IBV_QP_ACCESS_FLAGS)) { perror("qp"); return 1; }
    attr.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp, &attr, IBV_QP_STATE)) { perror("to error"); return 1; }
    struct ibv_async_event event;
    if (ibv_get_async_event(ctx, &event)) { perror("ibv_get_async_event"); return 1; }
    printf("last wqe reached: %d, for the qp: %d\n",
           event.event_type == IBV_EVENT_QP_LAST_WQE_REACHED, event.element.qp == qp);
    uint32_t qpn = qp->qp_num;
    if (ibv_destroy_qp(qp)) { perror("ibv_destroy_qp"); return 1; }
    printf("held qp intact: %d\n", event.element.qp->qp_num == qpn
           && event.element.qp->qp_context == &marker && event.element.qp->srq == srq);
    ibv_ack_async_event(&event);
    fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
    int more = ibv_get_async_event(ctx, &event);
    printf("no other event: %d\n", more == -1 && errno == EAGAIN);
    if (ibv_destroy_srq(srq) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd)) {
        perror("destroy"); return 1;
    }
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
"#;
    let program_path = common::compile_c("last_wqe_reached", source, &["-libverbs"]);
    let child = program("127.0.3.61", program_path.to_str().unwrap(), &[])
        .env("MALLOC_PERTURB_", "165")
        .env("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
        .spawn()
        .unwrap();
    let output = finish("last_wqe_reached", child, LIMIT);
    let out = succeeded("last_wqe_reached", &output);
    for line in [
        "last wqe reached: 1, for the qp: 1",
        "held qp intact: 1",
        "no other event: 1",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}
