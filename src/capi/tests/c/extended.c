/* The extended verbs, as rxe's provider has them: ibv_create_cq_ex and its polling calls,
 * ibv_create_qp_ex with send_ops_flags and the ibv_wr_* calls (RC: WRITE, WRITE with
 * immediate, SEND with immediate, READ, both atomics, inline data, SGE lists, a batch of two,
 * abort, malformed batches; UD: SEND with its address), ibv_qp_to_qp_ex, ibv_query_device_ex
 * and rdma_create_qp_ex; two threads building batches on one QP at once, which the library
 * serialises from ibv_wr_start to ibv_wr_complete. Two devices of one process (SOFTROCE_ADDR
 * names two addresses).
 * Prints what it saw. */
#include <arpa/inet.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <time.h>

static const uint64_t WC_FLAGS = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
                                 IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
                                 IBV_WC_EX_WITH_SL;
static const uint64_t RC_OPS = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                               IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                               IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                               IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

/* One end with an extended CQ and an extended QP of `type`. */
struct ex_side {
    struct side s;
    struct ibv_cq_ex *cq;
    struct ibv_qp_ex *qpx;
};

static void open_ex(int index, enum ibv_qp_type type, uint64_t ops, struct ex_side *e) {
    e->s.ctx = open_device(index);
    e->s.pd = ibv_alloc_pd(e->s.ctx);
    CHECK(e->s.pd, "ibv_alloc_pd");
    struct ibv_cq_init_attr_ex cq_attr = { .cqe = 64, .wc_flags = WC_FLAGS };
    e->cq = ibv_create_cq_ex(e->s.ctx, &cq_attr);
    CHECK(e->cq, "ibv_create_cq_ex");
    e->s.cq = ibv_cq_ex_to_cq(e->cq);
    struct ibv_qp_init_attr_ex init = {
        .send_cq = e->s.cq, .recv_cq = e->s.cq, .qp_type = type,
        .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 4, .max_recv_sge = 4,
                 .max_inline_data = 64 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = e->s.pd, .send_ops_flags = ops,
    };
    e->s.qp = ibv_create_qp_ex(e->s.ctx, &init);
    CHECK(e->s.qp, "ibv_create_qp_ex");
    e->qpx = ibv_qp_to_qp_ex(e->s.qp);
    CHECK(e->qpx, "ibv_qp_to_qp_ex");
}

/* One completion of `cq` by the extended calls, waiting up to a second: 1 with its fields in
 * `wc`, 0 if none came. */
static int poll_ex(struct ibv_cq_ex *cq, struct ibv_wc *wc) {
    struct ibv_poll_cq_attr attr = { 0 };
    for (int i = 0; i < 1000000; i++) {
        int ret = ibv_start_poll(cq, &attr);
        if (ret == ENOENT)
            continue;
        CHECK(ret == 0, "ibv_start_poll");
        wc->status = cq->status;
        wc->wr_id = cq->wr_id;
        wc->opcode = ibv_wc_read_opcode(cq);
        wc->byte_len = ibv_wc_read_byte_len(cq);
        wc->imm_data = ibv_wc_read_imm_data(cq);
        wc->qp_num = ibv_wc_read_qp_num(cq);
        wc->src_qp = ibv_wc_read_src_qp(cq);
        wc->wc_flags = ibv_wc_read_wc_flags(cq);
        wc->sl = ibv_wc_read_sl(cq);
        ibv_end_poll(cq);
        return 1;
    }
    return 0;
}

/* Posts one receive of `len` bytes at `buf` (`lkey`) on `qp`. */
static void post_recv(struct ibv_qp *qp, void *buf, uint32_t len, uint32_t lkey) {
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr = { .wr_id = 99, .sg_list = &sge, .num_sge = 1 }, *bad;
    CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void rc(void) {
    struct ex_side a, b;
    open_ex(0, IBV_QPT_RC, RC_OPS, &a);
    open_ex(1, IBV_QPT_RC, RC_OPS, &b);
    to_rts(&a.s, &b.s);
    to_rts(&b.s, &a.s);
    static uint8_t local[4096], remote[4096], landing[4096];
    static uint64_t atomic_target = 40, atomic_result;
    struct ibv_mr *lmr = ibv_reg_mr(a.s.pd, local, sizeof local, ALL_ACCESS);
    struct ibv_mr *amr = ibv_reg_mr(a.s.pd, &atomic_result, 8, ALL_ACCESS);
    struct ibv_mr *rmr = ibv_reg_mr(b.s.pd, remote, sizeof remote, ALL_ACCESS);
    struct ibv_mr *tmr = ibv_reg_mr(b.s.pd, &atomic_target, 8, ALL_ACCESS);
    struct ibv_mr *landing_mr = ibv_reg_mr(b.s.pd, landing, sizeof landing, ALL_ACCESS);
    CHECK(lmr && amr && rmr && tmr && landing_mr, "ibv_reg_mr");
    for (int i = 0; i < 4096; i++)
        local[i] = (uint8_t)(i * 13 + 5);
    struct ibv_wc wc;

    /* A WRITE of 4 KiB through one SGE. */
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 1;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 4096);
    printf("write posted: %d\n", ibv_wr_complete(a.qpx));
    printf("write completed: %d\n", poll_ex(a.cq, &wc) && wc.status == IBV_WC_SUCCESS &&
                                    wc.wr_id == 1 && wc.opcode == IBV_WC_RDMA_WRITE);
    printf("write landed: %d\n", memcmp(local, remote, 4096) == 0);

    /* A WRITE with immediate of inline data from two buffers. */
    post_recv(b.s.qp, landing, 64, landing_mr->lkey);
    struct ibv_data_buf bufs[2] = { { local, 10 }, { local + 100, 6 } };
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 2;
    a.qpx->wr_flags = 0; /* unsignalled: no completion on a's side */
    ibv_wr_rdma_write_imm(a.qpx, rmr->rkey, (uintptr_t)remote + 2048, htobe32(0x1234));
    ibv_wr_set_inline_data_list(a.qpx, 2, bufs);
    printf("write with immediate posted: %d\n", ibv_wr_complete(a.qpx));
    int got = poll_ex(b.cq, &wc);
    printf("immediate received: %d\n", got && wc.status == IBV_WC_SUCCESS &&
           wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && be32toh(wc.imm_data) == 0x1234 &&
           wc.byte_len == 16 && (wc.wc_flags & IBV_WC_WITH_IMM) && wc.qp_num == b.s.qp->qp_num);
    printf("inline landed: %d\n", memcmp(remote + 2048, local, 10) == 0 &&
                                  memcmp(remote + 2058, local + 100, 6) == 0);

    /* A batch of two, a SEND with immediate of inline data and a READ, polled in one pass. */
    post_recv(b.s.qp, landing, 64, landing_mr->lkey);
    memset(local, 0, 512);
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 3;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(a.qpx, htobe32(7));
    ibv_wr_set_inline_data(a.qpx, "hello", 5);
    a.qpx->wr_id = 4;
    ibv_wr_rdma_read(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 512);
    printf("batch posted: %d\n", ibv_wr_complete(a.qpx));
    /* Both completions, each pass from ibv_start_poll through ibv_next_poll to the end. */
    uint64_t ids = 0, both = (1u << 3) | (1u << 4);
    struct ibv_poll_cq_attr attr = { 0 };
    for (int i = 0; i < 1000000 && ids != both; i++) {
        if (ibv_start_poll(a.cq, &attr) != 0)
            continue;
        do {
            if (a.cq->status == IBV_WC_SUCCESS)
                ids |= 1ull << a.cq->wr_id;
        } while (ibv_next_poll(a.cq) == 0);
        ibv_end_poll(a.cq);
    }
    printf("batch completed: %d\n", ids == both);
    got = poll_ex(b.cq, &wc);
    printf("send received: %d\n", got && wc.opcode == IBV_WC_RECV && wc.byte_len == 5 &&
           be32toh(wc.imm_data) == 7 && memcmp(landing, "hello", 5) == 0 &&
           wc.src_qp == a.s.qp->qp_num);
    printf("read returned: %d\n", memcmp(local, remote, 512) == 0);

    /* Both atomics. */
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 5;
    ibv_wr_atomic_fetch_add(a.qpx, tmr->rkey, (uintptr_t)&atomic_target, 2);
    ibv_wr_set_sge(a.qpx, amr->lkey, (uintptr_t)&atomic_result, 8);
    CHECK(ibv_wr_complete(a.qpx) == 0 && poll_ex(a.cq, &wc), "fetch and add");
    printf("fetch and add: %d\n", atomic_result == 40 && atomic_target == 42);
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 6;
    ibv_wr_atomic_cmp_swp(a.qpx, tmr->rkey, (uintptr_t)&atomic_target, 42, 100);
    ibv_wr_set_sge(a.qpx, amr->lkey, (uintptr_t)&atomic_result, 8);
    CHECK(ibv_wr_complete(a.qpx) == 0 && poll_ex(a.cq, &wc), "compare and swap");
    printf("compare and swap: %d\n", atomic_result == 42 && atomic_target == 100);

    /* An aborted batch posts nothing; malformed ones fail at complete and post nothing. */
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 7;
    ibv_wr_rdma_write(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 8);
    ibv_wr_abort(a.qpx);
    ibv_wr_start(a.qpx);
    ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 8);
    printf("setter before an operation: %d\n", ibv_wr_complete(a.qpx) == EINVAL);
    static uint8_t big[300];
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 8;
    ibv_wr_rdma_write(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_inline_data(a.qpx, big, sizeof big);
    printf("inline beyond the limit: %d\n", ibv_wr_complete(a.qpx) == EINVAL);
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 9;
    ibv_wr_rdma_read(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_inline_data(a.qpx, big, 8);
    printf("inline READ: %d\n", ibv_wr_complete(a.qpx) == EINVAL);
    /* A batch larger than the send queue (16) posts none of its requests: ENOMEM, and no
     * completion, though the first 16 would fit. */
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    for (int i = 0; i < 20; i++) {
        a.qpx->wr_id = 100 + i;
        ibv_wr_rdma_write(a.qpx, rmr->rkey, (uintptr_t)remote);
        ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 8);
    }
    printf("a batch beyond the queue: %d\n", ibv_wr_complete(a.qpx) == ENOMEM);
    struct timespec pause = { 0, 50 * 1000 * 1000 };
    nanosleep(&pause, NULL);
    printf("nothing posted: %d\n", ibv_start_poll(a.cq, &attr) == ENOENT);

    /* The plain poll reads the same CQ; a QP without send_ops_flags has no qp_ex. */
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 10;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a.qpx, rmr->rkey, (uintptr_t)remote);
    ibv_wr_set_sge(a.qpx, lmr->lkey, (uintptr_t)local, 8);
    CHECK(ibv_wr_complete(a.qpx) == 0, "write");
    wc = next_wc(a.s.cq);
    printf("ibv_poll_cq on it: %d\n", wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS);
    struct ibv_qp_init_attr plain = { .send_cq = a.s.cq, .recv_cq = a.s.cq,
                                      .qp_type = IBV_QPT_RC,
                                      .cap = { .max_send_wr = 1, .max_recv_wr = 1,
                                               .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *plain_qp = ibv_create_qp(a.s.pd, &plain);
    CHECK(plain_qp, "ibv_create_qp");
    printf("plain QP has no qp_ex: %d\n", ibv_qp_to_qp_ex(plain_qp) == NULL);
    ibv_destroy_qp(plain_qp);

    /* What the device says through the extended query; what it refuses at creation. */
    struct ibv_device_attr_ex dev;
    printf("ibv_query_device_ex: %d\n", ibv_query_device_ex(a.s.ctx, NULL, &dev) == 0 &&
                                        dev.orig_attr.max_qp > 0);
    struct ibv_cq_init_attr_ex stamped = { .cqe = 4,
                                           .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
    errno = 0;
    printf("timestamps refused: %d\n", !ibv_create_cq_ex(a.s.ctx, &stamped) &&
                                       errno == EOPNOTSUPP);
    struct ibv_qp_init_attr_ex tso = {
        .send_cq = a.s.cq, .recv_cq = a.s.cq, .qp_type = IBV_QPT_UD,
        .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = a.s.pd,
        .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
    };
    errno = 0;
    printf("UD WRITE refused: %d\n", !ibv_create_qp_ex(a.s.ctx, &tso) && errno == EOPNOTSUPP);
}

static void ud(void) {
    struct ex_side a, b;
    uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    open_ex(0, IBV_QPT_UD, ops, &a);
    open_ex(1, IBV_QPT_UD, ops, &b);
    struct ex_side *both[2] = { &a, &b };
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                                    .qkey = 0x11111111 };
        CHECK(ibv_modify_qp(both[i]->s.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                                      IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
        attr.qp_state = IBV_QPS_RTR;
        CHECK(ibv_modify_qp(both[i]->s.qp, &attr, IBV_QP_STATE) == 0, "RTR");
        attr.qp_state = IBV_QPS_RTS;
        CHECK(ibv_modify_qp(both[i]->s.qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
    }
    static uint8_t in[64 + 40], out[64];
    struct ibv_mr *in_mr = ibv_reg_mr(b.s.pd, in, sizeof in, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *out_mr = ibv_reg_mr(a.s.pd, out, sizeof out, IBV_ACCESS_LOCAL_WRITE);
    CHECK(in_mr && out_mr, "ibv_reg_mr");
    memcpy(out, "datagram", 8);
    post_recv(b.s.qp, in, sizeof in, in_mr->lkey);
    struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
    CHECK(ibv_query_gid(b.s.ctx, 1, 0, &ah_attr.grh.dgid) == 0, "ibv_query_gid");
    struct ibv_ah *ah = ibv_create_ah(a.s.pd, &ah_attr);
    CHECK(ah, "ibv_create_ah");

    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 11;
    ibv_wr_send(a.qpx);
    ibv_wr_set_sge(a.qpx, out_mr->lkey, (uintptr_t)out, 8);
    printf("UD send without an address: %d\n", ibv_wr_complete(a.qpx) == EINVAL);

    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 12;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(a.qpx, htobe32(3));
    ibv_wr_set_ud_addr(a.qpx, ah, b.s.qp->qp_num, 0x11111111);
    ibv_wr_set_sge(a.qpx, out_mr->lkey, (uintptr_t)out, 8);
    printf("UD send posted: %d\n", ibv_wr_complete(a.qpx));
    struct ibv_wc wc;
    int got = poll_ex(b.cq, &wc);
    printf("UD received: %d\n", got && wc.status == IBV_WC_SUCCESS && wc.byte_len == 48 &&
           be32toh(wc.imm_data) == 3 && wc.src_qp == a.s.qp->qp_num &&
           memcmp(in + 40, "datagram", 8) == 0);
    printf("UD sl says IPv4: %d\n", wc.sl == 10);
    got = poll_ex(a.cq, &wc);
    printf("UD send completed: %d\n", got && wc.wr_id == 12 && wc.opcode == IBV_WC_SEND);
}

static void cm(void) {
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *id;
    CHECK(channel && rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    const char *addrs = getenv("SOFTROCE_ADDR");
    struct sockaddr_in sin = { .sin_family = AF_INET };
    CHECK(inet_pton(AF_INET, strtok(strdup(addrs), ","), &sin.sin_addr) == 1, "address");
    CHECK(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr");
    struct ibv_qp_init_attr_ex attr = {
        .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = ibv_alloc_pd(id->verbs), .send_ops_flags = RC_OPS,
    };
    CHECK(rdma_create_qp_ex(id, &attr) == 0, "rdma_create_qp_ex");
    printf("rdma_create_qp_ex has qp_ex: %d\n", ibv_qp_to_qp_ex(id->qp) != NULL);
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(channel);
}

/* What each thread of concurrent() posts through. */
struct poster {
    struct ibv_qp_ex *qpx;
    uint32_t lkey, rkey;
    uint8_t *local, *remote;
    int refused; /* wr_complete's errors other than a full queue */
};

static void *post_many(void *arg) {
    struct poster *p = arg;
    for (int i = 0; i < 2000; i++) {
        int ret;
        do {
            ibv_wr_start(p->qpx);
            p->qpx->wr_id = i;
            p->qpx->wr_flags = 0;
            ibv_wr_rdma_write(p->qpx, p->rkey, (uintptr_t)p->remote);
            ibv_wr_set_sge(p->qpx, p->lkey, (uintptr_t)p->local, 8);
            ret = ibv_wr_complete(p->qpx);
        } while (ret == ENOMEM);
        if (ret)
            p->refused++;
    }
    return NULL;
}

static void concurrent(void) {
    struct ex_side a, b;
    open_ex(0, IBV_QPT_RC, RC_OPS, &a);
    open_ex(1, IBV_QPT_RC, RC_OPS, &b);
    to_rts(&a.s, &b.s);
    to_rts(&b.s, &a.s);
    static uint8_t local[8], remote[8];
    struct ibv_mr *lmr = ibv_reg_mr(a.s.pd, local, sizeof local, ALL_ACCESS);
    struct ibv_mr *rmr = ibv_reg_mr(b.s.pd, remote, sizeof remote, ALL_ACCESS);
    CHECK(lmr && rmr, "ibv_reg_mr");
    struct poster posters[2];
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) {
        posters[t] = (struct poster){ a.qpx, lmr->lkey, rmr->rkey, local, remote, 0 };
        CHECK(pthread_create(&threads[t], NULL, post_many, &posters[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL);
    printf("two threads' batches: %d refused\n", posters[0].refused + posters[1].refused);
}

int main(void) {
    rc();
    concurrent();
    ud();
    cm();
    printf("done\n");
    return 0;
}
