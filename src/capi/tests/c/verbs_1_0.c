/* A program of libibverbs 1.0's time: it binds each verb at IBVERBS_1.0, as a binary linked
 * against libibverbs 1.0 does, takes 1.0's objects (verbs_1_0.h), and calls the inline verbs
 * of 1.0's header through the context's ops. Two RC QPs (one with an SRQ) and two UD QPs, on
 * two devices of one process (SOFTROCE_ADDR names two addresses). */
#include <arpa/inet.h>
#include <poll.h>
#include <stddef.h>

#define AT_1_0(ret, name, ...)                                                              \
    ret name##_1_0(__VA_ARGS__);                                                            \
    __asm__(".symver " #name "_1_0, " #name "@IBVERBS_1.0")

AT_1_0(struct ibv_device_1_0 **, ibv_get_device_list, int *num);
AT_1_0(void, ibv_free_device_list, struct ibv_device_1_0 **list);
AT_1_0(const char *, ibv_get_device_name, struct ibv_device_1_0 *device);
AT_1_0(uint64_t, ibv_get_device_guid, struct ibv_device_1_0 *device);
AT_1_0(struct ibv_context_1_0 *, ibv_open_device, struct ibv_device_1_0 *device);
AT_1_0(int, ibv_close_device, struct ibv_context_1_0 *context);
AT_1_0(int, ibv_get_async_event, struct ibv_context_1_0 *context, struct ibv_async_event *e);
AT_1_0(void, ibv_ack_async_event, struct ibv_async_event *event);
AT_1_0(int, ibv_query_device, struct ibv_context_1_0 *context, struct ibv_device_attr *attr);
AT_1_0(int, ibv_query_port, struct ibv_context_1_0 *context, uint8_t port,
       struct ibv_port_attr *attr);
AT_1_0(int, ibv_query_gid, struct ibv_context_1_0 *context, uint8_t port, int index,
       union ibv_gid *gid);
AT_1_0(int, ibv_query_pkey, struct ibv_context_1_0 *context, uint8_t port, int index,
       uint16_t *pkey);
AT_1_0(struct ibv_pd_1_0 *, ibv_alloc_pd, struct ibv_context_1_0 *context);
AT_1_0(int, ibv_dealloc_pd, struct ibv_pd_1_0 *pd);
AT_1_0(struct ibv_mr_1_0 *, ibv_reg_mr, struct ibv_pd_1_0 *pd, void *addr, size_t length,
       int access);
AT_1_0(int, ibv_dereg_mr, struct ibv_mr_1_0 *mr);
AT_1_0(struct ibv_cq_1_0 *, ibv_create_cq, struct ibv_context_1_0 *context, int cqe,
       void *cq_context, struct ibv_comp_channel *channel, int comp_vector);
AT_1_0(int, ibv_resize_cq, struct ibv_cq_1_0 *cq, int cqe);
AT_1_0(int, ibv_destroy_cq, struct ibv_cq_1_0 *cq);
AT_1_0(int, ibv_get_cq_event, struct ibv_comp_channel *channel, struct ibv_cq_1_0 **cq,
       void **cq_context);
AT_1_0(void, ibv_ack_cq_events, struct ibv_cq_1_0 *cq, unsigned int nevents);
AT_1_0(struct ibv_srq_1_0 *, ibv_create_srq, struct ibv_pd_1_0 *pd,
       struct ibv_srq_init_attr *attr);
AT_1_0(int, ibv_modify_srq, struct ibv_srq_1_0 *srq, struct ibv_srq_attr *attr, int mask);
AT_1_0(int, ibv_query_srq, struct ibv_srq_1_0 *srq, struct ibv_srq_attr *attr);
AT_1_0(int, ibv_destroy_srq, struct ibv_srq_1_0 *srq);
AT_1_0(struct ibv_qp_1_0 *, ibv_create_qp, struct ibv_pd_1_0 *pd,
       struct ibv_qp_init_attr_1_0 *attr);
AT_1_0(int, ibv_query_qp, struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int mask,
       struct ibv_qp_init_attr_1_0 *init);
AT_1_0(int, ibv_modify_qp, struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int mask);
AT_1_0(int, ibv_destroy_qp, struct ibv_qp_1_0 *qp);
AT_1_0(struct ibv_ah_1_0 *, ibv_create_ah, struct ibv_pd_1_0 *pd, struct ibv_ah_attr *attr);
AT_1_0(int, ibv_destroy_ah, struct ibv_ah_1_0 *ah);
AT_1_0(int, ibv_attach_mcast, struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid);
AT_1_0(int, ibv_detach_mcast, struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid);

/* 1.0's inline verbs: through the ops of the object's context. */
static int poll_cq(struct ibv_cq_1_0 *cq, int n, struct ibv_wc *wc) {
    return cq->context->ops.poll_cq(cq, n, wc);
}
static int post_send(struct ibv_qp_1_0 *qp, struct ibv_send_wr_1_0 *wr,
                     struct ibv_send_wr_1_0 **bad) {
    return qp->context->ops.post_send(qp, wr, bad);
}
static int post_recv(struct ibv_qp_1_0 *qp, struct ibv_recv_wr_1_0 *wr,
                     struct ibv_recv_wr_1_0 **bad) {
    return qp->context->ops.post_recv(qp, wr, bad);
}

static struct ibv_wc wait_wc(struct ibv_cq_1_0 *cq) {
    struct ibv_wc wc;
    int n;
    while ((n = poll_cq(cq, 1, &wc)) == 0)
        ;
    CHECK(n == 1, "poll_cq");
    return wc;
}

/* One end of 1.0: its context, PD, CQ, QP, and a registered buffer of 4 KiB. */
struct end {
    struct ibv_context_1_0 *ctx;
    struct ibv_pd_1_0 *pd;
    struct ibv_cq_1_0 *cq;
    struct ibv_qp_1_0 *qp;
    struct ibv_mr_1_0 *mr;
    char buf[4096];
};

/* A QP of `e`'s, sending to its CQ and receiving to `recv_cq`, with `srq` if not null. */
static struct ibv_qp_1_0 *make_qp(struct end *e, struct ibv_cq_1_0 *recv_cq, enum ibv_qp_type type,
                                  struct ibv_srq_1_0 *srq, void *marker) {
    struct ibv_qp_init_attr_1_0 init = {
        .qp_context = marker, .send_cq = e->cq, .recv_cq = recv_cq, .srq = srq, .qp_type = type,
        .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2 },
    };
    struct ibv_qp_1_0 *qp = ibv_create_qp_1_0(e->pd, &init);
    CHECK(qp && init.cap.max_send_wr >= 8, "ibv_create_qp@1.0");
    return qp;
}

static void open_end(struct ibv_device_1_0 *device, struct end *e) {
    e->ctx = ibv_open_device_1_0(device);
    CHECK(e->ctx && e->ctx->device == device && e->ctx->async_fd >= 0, "ibv_open_device@1.0");
    e->pd = ibv_alloc_pd_1_0(e->ctx);
    CHECK(e->pd && e->pd->context == e->ctx, "ibv_alloc_pd@1.0");
    e->mr = ibv_reg_mr_1_0(e->pd, e->buf, sizeof e->buf,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ);
    CHECK(e->mr && e->mr->pd == e->pd && e->mr->rkey, "ibv_reg_mr@1.0");
    e->cq = ibv_create_cq_1_0(e->ctx, 32, e, NULL, 0);
    CHECK(e->cq && e->cq->context == e->ctx && e->cq->cqe >= 32, "ibv_create_cq@1.0");
}

/* Takes a 1.0 QP through `steps` with ibv_modify_qp@1.0. */
static void take_steps_1_0(struct ibv_qp_1_0 *qp, struct qp_step steps[3]) {
    for (int i = 0; i < 3; i++)
        CHECK(ibv_modify_qp_1_0(qp, &steps[i].attr, steps[i].mask) == 0, steps[i].what);
}

/* Takes an RC QP to RTS towards `peer_qp`, a QP of `peer`'s. */
static void connect_qp(struct ibv_qp_1_0 *qp, struct ibv_qp_1_0 *peer_qp, struct end *peer) {
    union ibv_gid dgid;
    CHECK(ibv_query_gid_1_0(peer->ctx, 1, 0, &dgid) == 0, "ibv_query_gid@1.0");
    struct qp_step steps[3];
    rc_steps(peer_qp->qp_num, &dgid, steps);
    take_steps_1_0(qp, steps);
}

/* Takes a UD QP to RTS. */
static void ud_ready(struct ibv_qp_1_0 *qp) {
    struct qp_step steps[3];
    ud_steps(steps);
    take_steps_1_0(qp, steps);
}

int main(void) {
    int n = 0;
    struct ibv_device_1_0 **list = ibv_get_device_list_1_0(&n);
    CHECK(list && n >= 2 && list[n] == NULL, "ibv_get_device_list@1.0 (two addresses)");
    printf("devices: %d, named: %d, guid: %d\n", n,
           strncmp(ibv_get_device_name_1_0(list[0]), "softroce", 8) == 0,
           ibv_get_device_guid_1_0(list[1]) != 0);

    static struct end a, b;
    open_end(list[0], &a);
    open_end(list[1], &b);
    struct ibv_device_1_0 *kept = a.ctx->device;
    ibv_free_device_list_1_0(list);
    printf("device after the list is freed: %d\n",
           strncmp(ibv_get_device_name_1_0(kept), "softroce", 8) == 0);

    struct ibv_device_attr dev;
    struct ibv_port_attr port;
    uint16_t pkey = 0;
    CHECK(ibv_query_device_1_0(a.ctx, &dev) == 0 && ibv_query_port_1_0(a.ctx, 1, &port) == 0 &&
              ibv_query_pkey_1_0(a.ctx, 1, 0, &pkey) == 0,
          "the 1.0 queries");
    printf("queries: %d %d %d\n", dev.phys_port_cnt == 1, port.state == IBV_PORT_ACTIVE,
           pkey == 0xffff);

    /* RC: a WRITE, then a SEND with immediate whose completion b waits for on a channel, made
     * on the 1.0 context (the call has one version, and takes either context). */
    struct ibv_comp_channel *events = ibv_create_comp_channel((struct ibv_context *)b.ctx);
    CHECK(events, "ibv_create_comp_channel");
    struct ibv_cq_1_0 *b_events = ibv_create_cq_1_0(b.ctx, 8, &b, events, 0);
    CHECK(b_events, "ibv_create_cq@1.0 with a channel");
    a.qp = make_qp(&a, a.cq, IBV_QPT_RC, NULL, &a);
    b.qp = make_qp(&b, b_events, IBV_QPT_RC, NULL, &b);
    connect_qp(a.qp, b.qp, &b);
    connect_qp(b.qp, a.qp, &a);
    printf("state follows: %d\n", a.qp->state == IBV_QPS_RTS);

    struct ibv_qp_attr qattr;
    struct ibv_qp_init_attr_1_0 qinit;
    CHECK(ibv_query_qp_1_0(b.qp, &qattr, IBV_QP_STATE, &qinit) == 0, "ibv_query_qp@1.0");
    printf("query names 1.0 objects: %d\n",
           qinit.send_cq == b.cq && qinit.recv_cq == b_events && qinit.srq == NULL &&
               qinit.qp_context == &b && qattr.qp_state == IBV_QPS_RTS);
    /* 1.0's struct ibv_qp_attr ended where today's rate_limit begins: nothing is written past
     * it, and a modify reads no further. */
    const uint64_t CANARY = 0x5afe5afe5afe5afeull;
    struct {
        uint64_t attr[offsetof(struct ibv_qp_attr, rate_limit) / 8];
        uint64_t canary;
    } old = { .canary = CANARY };
    CHECK(ibv_query_qp_1_0(b.qp, (struct ibv_qp_attr *)old.attr, IBV_QP_STATE, &qinit) == 0,
          "ibv_query_qp@1.0 into 1.0's attributes");
    CHECK(ibv_modify_qp_1_0(b.qp, (struct ibv_qp_attr *)old.attr, IBV_QP_STATE) == 0,
          "ibv_modify_qp@1.0 from 1.0's attributes");
    printf("1.0's attributes, in bounds: %d %d\n", old.canary == CANARY,
           ((struct ibv_qp_attr *)old.attr)->qp_state == IBV_QPS_RTS);

    strcpy(a.buf, "written at 1.0");
    struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 15, .lkey = a.mr->lkey };
    struct ibv_send_wr_1_0 write = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
                                     .opcode = IBV_WR_RDMA_WRITE,
                                     .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
    write.wr.rdma.remote_addr = (uintptr_t)b.buf;
    write.wr.rdma.rkey = b.mr->rkey;
    CHECK(post_send(a.qp, &write, &bad) == 0, "post_send@1.0");
    struct ibv_wc wc = wait_wc(a.cq);
    printf("write: %d %d\n", wc.status == IBV_WC_SUCCESS && wc.wr_id == 7,
           strcmp(b.buf, "written at 1.0") == 0);

    struct ibv_sge rsge = { .addr = (uintptr_t)b.buf + 2048, .length = 64, .lkey = b.mr->lkey };
    struct ibv_recv_wr_1_0 recv = { .wr_id = 9, .sg_list = &rsge, .num_sge = 1 }, *rbad;
    CHECK(post_recv(b.qp, &recv, &rbad) == 0, "post_recv@1.0");
    CHECK(b_events->context->ops.req_notify_cq(b_events, 0) == 0, "req_notify_cq@1.0");
    struct ibv_send_wr_1_0 send = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
                                    .opcode = IBV_WR_SEND_WITH_IMM,
                                    .send_flags = IBV_SEND_SIGNALED,
                                    .imm_data = htonl(0x1234) };
    CHECK(post_send(a.qp, &send, &bad) == 0, "post_send@1.0");
    /* 1.0's channel is its descriptor: the program polls it. */
    struct pollfd readable = { .fd = ((struct ibv_comp_channel_1_0 *)events)->fd,
                               .events = POLLIN };
    printf("the 1.0 channel's descriptor polls: %d\n",
           poll(&readable, 1, 10000) == 1 && readable.revents == POLLIN);
    struct ibv_cq_1_0 *fired = NULL;
    void *fired_context = NULL;
    CHECK(ibv_get_cq_event_1_0(events, &fired, &fired_context) == 0, "ibv_get_cq_event@1.0");
    printf("event names the 1.0 CQ: %d\n", fired == b_events && fired_context == &b);
    ibv_ack_cq_events_1_0(fired, 1);
    wc = wait_wc(b_events);
    printf("send: %d %d\n",
           wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
               ntohl(wc.imm_data) == 0x1234,
           strcmp(b.buf + 2048, "written at 1.0") == 0);
    wait_wc(a.cq);

    /* A chain whose second request is malformed: the first is posted, bad_wr is the second. */
    struct ibv_send_wr_1_0 second = write;
    second.num_sge = 1000;
    struct ibv_send_wr_1_0 first = write;
    first.next = &second;
    int posted = post_send(a.qp, &first, &bad);
    printf("bad request: %d %d\n", posted == EINVAL, bad == &second);
    bad = NULL;
    posted = post_send(a.qp, &second, &bad);
    printf("a lone bad request: %d %d\n", posted == EINVAL, bad == &second);
    struct ibv_recv_wr_1_0 bad_recv = { .wr_id = 10, .sg_list = &rsge, .num_sge = 1000 };
    struct ibv_recv_wr_1_0 good_recv = { .wr_id = 10, .sg_list = &rsge, .num_sge = 1,
                                         .next = &bad_recv };
    rbad = NULL;
    posted = post_recv(b.qp, &good_recv, &rbad);
    printf("bad receive: %d %d\n", posted == EINVAL, rbad == &bad_recv);
    wc = wait_wc(a.cq);
    printf("the one before it completed: %d\n", wc.status == IBV_WC_SUCCESS);

    /* An SRQ of b's, serving a second QP pair. */
    struct ibv_srq_init_attr srq_init = { .srq_context = &b,
                                          .attr = { .max_wr = 8, .max_sge = 1 } };
    struct ibv_srq_1_0 *srq = ibv_create_srq_1_0(b.pd, &srq_init);
    CHECK(srq && srq->srq_context == &b && srq->pd == b.pd, "ibv_create_srq@1.0");
    struct ibv_srq_attr srq_attr = { .srq_limit = 1 };
    CHECK(ibv_modify_srq_1_0(srq, &srq_attr, IBV_SRQ_LIMIT) == 0, "ibv_modify_srq@1.0");
    CHECK(ibv_query_srq_1_0(srq, &srq_attr) == 0 && srq_attr.max_wr >= 8, "ibv_query_srq@1.0");
    struct ibv_qp_1_0 *a2 = make_qp(&a, a.cq, IBV_QPT_RC, NULL, NULL);
    struct ibv_qp_1_0 *b2 = make_qp(&b, b.cq, IBV_QPT_RC, srq, NULL);
    connect_qp(a2, b2, &b);
    connect_qp(b2, a2, &a);
    struct ibv_recv_wr_1_0 srq_recv = { .wr_id = 11, .sg_list = &rsge, .num_sge = 1 };
    CHECK(b.ctx->ops.post_srq_recv(srq, &srq_recv, &rbad) == 0, "post_srq_recv@1.0");
    struct ibv_send_wr_1_0 to_srq = send;
    to_srq.imm_data = htonl(0x5678);
    CHECK(post_send(a2, &to_srq, &bad) == 0, "post_send@1.0");
    wc = wait_wc(b.cq);
    printf("srq: %d\n", wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 &&
                            ntohl(wc.imm_data) == 0x5678 && wc.qp_num == b2->qp_num);
    wait_wc(a.cq);
    CHECK(ibv_query_qp_1_0(b2, &qattr, IBV_QP_STATE, &qinit) == 0 && qinit.srq == srq,
          "ibv_query_qp@1.0 with an SRQ");
    /* Its one receive taken, the SRQ is below its limit: an event names the 1.0 SRQ. */
    struct ibv_async_event event;
    CHECK(ibv_get_async_event_1_0(b.ctx, &event) == 0, "ibv_get_async_event@1.0");
    printf("limit event names the 1.0 SRQ: %d\n",
           event.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && event.element.srq == (void *)srq);
    ibv_ack_async_event_1_0(&event);

    /* UD: a 1.0 address handle in a 1.0 request. */
    struct ibv_qp_1_0 *ua = make_qp(&a, a.cq, IBV_QPT_UD, NULL, NULL);
    struct ibv_qp_1_0 *ub = make_qp(&b, b.cq, IBV_QPT_UD, NULL, NULL);
    ud_ready(ua);
    ud_ready(ub);
    struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
    CHECK(ibv_query_gid_1_0(b.ctx, 1, 0, &ah_attr.grh.dgid) == 0, "ibv_query_gid@1.0");
    struct ibv_ah_1_0 *ah = ibv_create_ah_1_0(a.pd, &ah_attr);
    CHECK(ah && ah->pd == a.pd, "ibv_create_ah@1.0");
    struct ibv_sge usge = { .addr = (uintptr_t)b.buf + 1024, .length = 40 + 64,
                            .lkey = b.mr->lkey };
    struct ibv_recv_wr_1_0 urecv = { .wr_id = 12, .sg_list = &usge, .num_sge = 1 };
    CHECK(post_recv(ub, &urecv, &rbad) == 0, "post_recv@1.0 UD");
    struct ibv_send_wr_1_0 usend = { .wr_id = 13, .sg_list = &sge, .num_sge = 1,
                                     .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
    usend.wr.ud.ah = ah;
    usend.wr.ud.remote_qpn = ub->qp_num;
    usend.wr.ud.remote_qkey = 0x11111111;
    CHECK(post_send(ua, &usend, &bad) == 0, "post_send@1.0 UD");
    wc = wait_wc(b.cq);
    printf("ud: %d %d\n", wc.status == IBV_WC_SUCCESS && wc.wr_id == 12 && wc.src_qp == ua->qp_num,
           strcmp(b.buf + 1024 + 40, "written at 1.0") == 0);
    wait_wc(a.cq);

    /* An asynchronous event names the 1.0 QP; destroyed with the event held, the QP is still
     * acknowledged through its 1.0 structure. */
    struct ibv_qp_attr to_error = { .qp_state = IBV_QPS_ERR };
    CHECK(ibv_modify_qp_1_0(b2, &to_error, IBV_QP_STATE) == 0, "to ERROR");
    CHECK(ibv_get_async_event_1_0(b.ctx, &event) == 0, "ibv_get_async_event@1.0");
    printf("async event names the 1.0 QP: %d (event %d)\n", event.element.qp == (void *)b2,
           event.event_type);
    CHECK(ibv_destroy_qp_1_0(b2) == 0, "ibv_destroy_qp@1.0 with its event held");
    ibv_ack_async_event_1_0(&event);

    union ibv_gid mgid = { .raw = { 0xff } };
    printf("no multicast: %d %d\n", ibv_attach_mcast_1_0(ua, &mgid, 0) == EOPNOTSUPP,
           ibv_detach_mcast_1_0(ua, &mgid, 0) == EOPNOTSUPP);
    printf("no resize: %d\n", ibv_resize_cq_1_0(a.cq, 64) == EOPNOTSUPP);
    printf("null refused: %d %d\n", ibv_alloc_pd_1_0(NULL) == NULL && errno == EINVAL,
           ibv_dealloc_pd_1_0(NULL) == EINVAL);

    CHECK(ibv_destroy_ah_1_0(ah) == 0, "ibv_destroy_ah@1.0");
    struct ibv_qp_1_0 *qps[] = { ua, ub, a2, a.qp, b.qp };
    for (unsigned i = 0; i < sizeof qps / sizeof *qps; i++)
        CHECK(ibv_destroy_qp_1_0(qps[i]) == 0, "ibv_destroy_qp@1.0");
    CHECK(ibv_destroy_srq_1_0(srq) == 0, "ibv_destroy_srq@1.0");
    CHECK(ibv_destroy_cq_1_0(b_events) == 0, "ibv_destroy_cq@1.0");
    CHECK(ibv_destroy_comp_channel(events) == 0, "ibv_destroy_comp_channel");
    struct end *ends[] = { &a, &b };
    for (int i = 0; i < 2; i++) {
        CHECK(ibv_destroy_cq_1_0(ends[i]->cq) == 0, "ibv_destroy_cq@1.0");
        CHECK(ibv_dereg_mr_1_0(ends[i]->mr) == 0, "ibv_dereg_mr@1.0");
        CHECK(ibv_dealloc_pd_1_0(ends[i]->pd) == 0, "ibv_dealloc_pd@1.0");
    }
    CHECK(ibv_close_device_1_0(a.ctx) == 0 && ibv_close_device_1_0(b.ctx) == 0,
          "ibv_close_device@1.0");
    printf("done\n");
    return 0;
}
