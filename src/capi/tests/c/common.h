/* What the C programs of the tests share: CHECK, and two RC QPs of one process connected to each
 * other, each on a device of its own (SOFTROCE_ADDR names two addresses), so that a test has a
 * peer without a second process. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <pthread.h>
#include <infiniband/verbs.h>

#define CHECK(cond, what)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s failed: %s (errno %d)\n", what, strerror(errno), errno);    \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* What a program prints reaches the test line by line, up to a crash. */
__attribute__((constructor)) static void line_buffered(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

/* One end: its device's context, a PD, one CQ for both queues, and the QP. */
struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
};

static const int ALL_ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

/* The device at `index` of the list, opened. */
static struct ibv_context *open_device(int index) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > index, "ibv_get_device_list (set SOFTROCE_ADDR to two addresses)");
    struct ibv_context *ctx = ibv_open_device(list[index]);
    CHECK(ctx, "ibv_open_device");
    ibv_free_device_list(list);
    return ctx;
}

/* A side on the device at `index`: its PD, a CQ of 64 and an RC QP in RESET. */
static void open_side(int index, struct side *s) {
    s->ctx = open_device(index);
    s->pd = ibv_alloc_pd(s->ctx);
    CHECK(s->pd, "ibv_alloc_pd");
    s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
    CHECK(s->cq, "ibv_create_cq");
    struct ibv_qp_init_attr init = {
        .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 4, .max_recv_sge = 4 },
    };
    s->qp = ibv_create_qp(s->pd, &init);
    CHECK(s->qp, "ibv_create_qp");
}

/* One modify of a QP's way from RESET to RTS: its attributes and mask, and what to call it. */
struct qp_step {
    struct ibv_qp_attr attr;
    int mask;
    const char *what;
};

/* The three steps that take an RC QP to RTS towards QP `dest_qpn` at `dgid`. */
static void rc_steps(uint32_t dest_qpn, const union ibv_gid *dgid, struct qp_step steps[3]) {
    memset(steps, 0, 3 * sizeof *steps);
    steps[0] = (struct qp_step){ .what = "to INIT",
        .attr = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS },
        .mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS };
    steps[1] = (struct qp_step){ .what = "to RTR",
        .attr = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest_qpn,
                  .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                  .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = *dgid } } },
        .mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER };
    steps[2] = (struct qp_step){ .what = "to RTS",
        .attr = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                  .max_rd_atomic = 1 },
        .mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC };
}

/* The three steps that take a UD QP to RTS, with Q_Key 0x11111111. */
static void ud_steps(struct qp_step steps[3]) {
    memset(steps, 0, 3 * sizeof *steps);
    steps[0] = (struct qp_step){ .what = "UD to INIT",
        .attr = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 },
        .mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY };
    steps[1] = (struct qp_step){ .what = "UD to RTR", .attr = { .qp_state = IBV_QPS_RTR },
                                 .mask = IBV_QP_STATE };
    steps[2] = (struct qp_step){ .what = "UD to RTS", .attr = { .qp_state = IBV_QPS_RTS },
                                 .mask = IBV_QP_STATE | IBV_QP_SQ_PSN };
}

/* Takes `qp` through `steps` with ibv_modify_qp. */
static void take_steps(struct ibv_qp *qp, struct qp_step steps[3]) {
    for (int i = 0; i < 3; i++)
        CHECK(ibv_modify_qp(qp, &steps[i].attr, steps[i].mask) == 0, steps[i].what);
}

/* Takes `s`'s QP through INIT and RTR to RTS, towards `peer`'s QP. */
static void to_rts(struct side *s, struct side *peer) {
    union ibv_gid dgid;
    CHECK(ibv_query_gid(peer->ctx, 1, 0, &dgid) == 0, "ibv_query_gid");
    struct qp_step steps[3];
    rc_steps(peer->qp->qp_num, &dgid, steps);
    take_steps(s->qp, steps);
}

/* A side on device 0 and one on device 1, their QPs connected to each other. */
static void connect_pair(struct side *a, struct side *b) {
    open_side(0, a);
    open_side(1, b);
    to_rts(a, b);
    to_rts(b, a);
}

/* The next completion of `cq`, spinning until it comes. */
static struct ibv_wc next_wc(struct ibv_cq *cq) {
    struct ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        ;
    CHECK(n == 1, "ibv_poll_cq");
    return wc;
}

/* Posts one signalled request of `opcode` on `s`'s QP, `len` bytes at `local` (`lkey`), to
 * `remote_addr` through `rkey` where the opcode names remote memory; its completion's status. */
static enum ibv_wc_status post_one(struct side *s, enum ibv_wr_opcode opcode, void *local,
                                   uint32_t len, uint32_t lkey, uint64_t remote_addr,
                                   uint32_t rkey) {
    struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
    struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(s->qp, &wr, &bad) == 0, "ibv_post_send");
    return next_wc(s->cq).status;
}

/* `handler` for SIGALRM, with `flags`: 0, and a wait it interrupts returns EINTR; SA_RESTART. */
static void catch_alarm(void (*handler)(int), int flags) {
    struct sigaction action = { .sa_handler = handler, .sa_flags = flags };
    sigemptyset(&action.sa_mask);
    CHECK(sigaction(SIGALRM, &action, NULL) == 0, "sigaction");
}

/* A one-shot SIGALRM `usec` microseconds from now. */
static void alarm_in(long usec) {
    struct itimerval soon = { .it_value = { .tv_sec = usec / 1000000, .tv_usec = usec % 1000000 } };
    CHECK(setitimer(ITIMER_REAL, &soon, NULL) == 0, "setitimer");
}

/* A CQ of `ctx` on a completion channel of its own, put in `channel`, armed for its next
 * completion. */
static struct ibv_cq *armed_cq(struct ibv_context *ctx, struct ibv_comp_channel **channel) {
    *channel = ibv_create_comp_channel(ctx);
    CHECK(*channel, "ibv_create_comp_channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, *channel, 0);
    CHECK(cq && ibv_req_notify_cq(cq, 0) == 0, "ibv_create_cq");
    return cq;
}

/* For a helper thread of a test of the waiting thread's alarms: the alarm kept off this
 * thread, then a pause of 200 ms, while the waiting thread waits. */
static void alarm_elsewhere_after_a_pause(void) {
    sigset_t alarm_only;
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm_only, NULL);
    struct timespec pause = { 0, 200 * 1000 * 1000 };
    nanosleep(&pause, NULL);
}

/* An RC QP of `pd` in INIT, both queues on `cq`, with a receive posted (`wr_id`, into a
 * buffer registered on `pd` for it, put in `mr`): once the QP fails, the receive is flushed,
 * a completion of `cq`. */
static struct ibv_qp *qp_with_a_receive(struct ibv_pd *pd, struct ibv_cq *cq, uint64_t wr_id,
                                        struct ibv_mr **mr) {
    struct ibv_qp_init_attr init = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp");
    struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    CHECK(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
          "ibv_modify_qp INIT");
    static char buffer[8];
    *mr = ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
    CHECK(*mr, "ibv_reg_mr");
    struct ibv_sge sge = { .addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = (*mr)->lkey };
    struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
    CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
    return qp;
}

/* Moves `qp` to ERROR. */
static void fail_qp(struct ibv_qp *qp) {
    struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
    CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0, "ibv_modify_qp ERR");
}
