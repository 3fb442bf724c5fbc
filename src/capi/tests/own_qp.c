/* A librdmacm program that moves its own QP, as UCX and other middleware do: the QP comes from
 * ibv_create_qp, not rdma_create_qp; the IDs carry no QP; the connection names it by
 * conn_param.qp_num; the program takes it through INIT, RTR and RTS with rdma_init_qp_attr,
 * and the client ends the handshake with rdma_establish after CONNECT_RESPONSE
 * (rdma_establish(3), rdma_init_qp_attr(3)).
 *
 * Usage: own_qp server ADDR PORT | own_qp client ADDR PORT
 * The server shares a buffer in its accept's private data; the client WRITEs into it and
 * SENDs a message; both check what arrived, then the client disconnects. Compiled after
 * c/common.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

struct shared {
    uint64_t addr;
    uint32_t rkey;
};

static struct rdma_event_channel *channel;

/* The next CM event, which must be `expected`; its connection parameters are copied out. */
static struct rdma_cm_id *expect(enum rdma_cm_event_type expected, struct rdma_conn_param *param,
                                 void *data, size_t len) {
    struct rdma_cm_event *event;
    CHECK(rdma_get_cm_event(channel, &event) == 0, "rdma_get_cm_event");
    if (event->event != expected) {
        fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(event->event),
                event->status, rdma_event_str(expected));
        exit(1);
    }
    struct rdma_cm_id *id = event->id;
    if (param)
        *param = event->param.conn;
    if (data) {
        CHECK(event->param.conn.private_data_len >= len, "private data length");
        memcpy(data, event->param.conn.private_data, len);
    }
    rdma_ack_cm_event(event);
    return id;
}

/* Takes `qp` to `state` with what the ID's connection negotiated. */
static void move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state,
                    struct ibv_qp_attr *out) {
    struct ibv_qp_attr attr;
    int mask = 0;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = state;
    CHECK(rdma_init_qp_attr(id, &attr, &mask) == 0, "rdma_init_qp_attr");
    CHECK(mask & IBV_QP_STATE, "rdma_init_qp_attr's mask");
    CHECK(ibv_modify_qp(qp, &attr, mask) == 0, "ibv_modify_qp");
    if (out)
        *out = attr;
}

static void wait_completions(struct ibv_cq *cq, int n) {
    struct ibv_wc wc;
    while (n > 0) {
        int got = ibv_poll_cq(cq, 1, &wc);
        CHECK(got >= 0, "ibv_poll_cq");
        if (got == 0)
            continue;
        if (wc.status != IBV_WC_SUCCESS) {
            fprintf(stderr, "completion %llu: %s\n", (unsigned long long)wc.wr_id,
                    ibv_wc_status_str(wc.status));
            exit(1);
        }
        n--;
    }
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    int server = strcmp(argv[1], "server") == 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    CHECK(inet_pton(AF_INET, argv[2], &addr.sin_addr) == 1, "inet_pton");
    channel = rdma_create_event_channel();
    CHECK(channel, "rdma_create_event_channel");
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct rdma_conn_param param;
    memset(&param, 0, sizeof param);
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    char buf[64];
    memset(buf, 0, sizeof buf);

    if (server) {
        CHECK(rdma_bind_addr(id, (struct sockaddr *)&addr) == 0, "rdma_bind_addr");
        CHECK(rdma_listen(id, 1) == 0, "rdma_listen");
        printf("server: listening\n");
        fflush(stdout);
        char hello[6];
        struct rdma_cm_id *conn = expect(RDMA_CM_EVENT_CONNECT_REQUEST, NULL, hello, 6);
        CHECK(memcmp(hello, "hello", 6) == 0, "the REQ's private data");
        struct ibv_pd *pd = ibv_alloc_pd(conn->verbs);
        struct ibv_cq *cq = ibv_create_cq(conn->verbs, 8, NULL, NULL, 0);
        CHECK(pd && cq, "ibv_alloc_pd and ibv_create_cq");
        struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                        .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                                .max_send_sge = 1, .max_recv_sge = 1}};
        struct ibv_qp *qp = ibv_create_qp(pd, &init);
        struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf,
                                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        CHECK(qp && mr, "ibv_create_qp and ibv_reg_mr");
        struct ibv_qp_attr rtr;
        move_qp(conn, qp, IBV_QPS_INIT, NULL);
        struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey};
        struct ibv_recv_wr recv = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
        CHECK(ibv_post_recv(qp, &recv, &bad) == 0, "ibv_post_recv");
        move_qp(conn, qp, IBV_QPS_RTR, &rtr);
        move_qp(conn, qp, IBV_QPS_RTS, NULL);
        struct shared target = {.addr = (uintptr_t)buf, .rkey = mr->rkey};
        param.qp_num = qp->qp_num;
        param.private_data = &target;
        param.private_data_len = sizeof target;
        CHECK(rdma_accept(conn, &param) == 0, "rdma_accept");
        /* (The kernel's ESTABLISHED after an RTU carries no parameters: cma.c
         * cma_ib_handler.) */
        expect(RDMA_CM_EVENT_ESTABLISHED, NULL, NULL, 0);
        CHECK(rtr.dest_qp_num != 0, "RTR names the client's QP");
        wait_completions(cq, 1);
        CHECK(strcmp(buf, "ping") == 0, "the SEND's bytes");
        CHECK(strcmp(buf + 32, "written") == 0, "the WRITE's bytes");
        expect(RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
        printf("server: received \"%s\" and \"%s\"\n", buf, buf + 32);
        fflush(stdout);
        rdma_destroy_id(conn);
        ibv_destroy_qp(qp);
        ibv_dereg_mr(mr);
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
    } else {
        CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0,
              "rdma_resolve_addr");
        expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, 0);
        CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
        expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, 0);
        /* librdmacm's ucma_valid_param: an ID without a QP must name one. */
        CHECK(rdma_connect(id, NULL) == -1 && errno == EINVAL,
              "rdma_connect of an ID without a QP and no parameters must fail with EINVAL");
        struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
        struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
        CHECK(pd && cq, "ibv_alloc_pd and ibv_create_cq");
        struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                        .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                                .max_send_sge = 1, .max_recv_sge = 1,
                                                .max_inline_data = 16}};
        struct ibv_qp *qp = ibv_create_qp(pd, &init);
        CHECK(qp, "ibv_create_qp");
        move_qp(id, qp, IBV_QPS_INIT, NULL);
        param.qp_num = qp->qp_num;
        param.private_data = "hello";
        param.private_data_len = 6;
        CHECK(rdma_connect(id, &param) == 0, "rdma_connect");
        struct shared target;
        struct rdma_conn_param response;
        expect(RDMA_CM_EVENT_CONNECT_RESPONSE, &response, &target, sizeof target);
        struct ibv_qp_attr rtr;
        move_qp(id, qp, IBV_QPS_RTR, &rtr);
        CHECK(rtr.dest_qp_num == response.qp_num, "RTR names the server's QP");
        move_qp(id, qp, IBV_QPS_RTS, NULL);
        CHECK(rdma_establish(id) == 0, "rdma_establish");
        struct ibv_send_wr write = {.wr_id = 1, .opcode = IBV_WR_RDMA_WRITE,
                                    .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
                                    .wr.rdma = {.remote_addr = target.addr + 32,
                                                .rkey = target.rkey}};
        struct ibv_sge written = {.addr = (uintptr_t) "written", .length = 8};
        write.sg_list = &written;
        write.num_sge = 1;
        struct ibv_send_wr send = write;
        struct ibv_sge ping = {.addr = (uintptr_t) "ping", .length = 5};
        send.wr_id = 2;
        send.opcode = IBV_WR_SEND;
        send.sg_list = &ping;
        write.next = &send;
        struct ibv_send_wr *bad;
        CHECK(ibv_post_send(qp, &write, &bad) == 0, "ibv_post_send");
        wait_completions(cq, 2);
        CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
        expect(RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
        printf("client: wrote and sent\n");
        fflush(stdout);
        ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
    }
    rdma_destroy_id(id);
    rdma_destroy_event_channel(channel);
    return 0;
}
