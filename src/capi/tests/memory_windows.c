/* Memory windows through the C library: a type 1 window allocated with ibv_alloc_mw and bound
 * with ibv_bind_mw over a part of a region, its new rkey read from mw->rkey once the bind
 * returns, and its completion (IBV_WC_BIND_MW). The program connects to the test's server,
 * binds 512 bytes of its 4 KiB region from offset 1024 for remote READs, and SENDs the
 * window's address and rkey; the server READs through it, and disconnects.
 * Usage: memory_windows SERVER_IP PORT. Prints what it saw; the test reads it. Compiled after
 * c/common.h. */
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *event;
    CHECK(rdma_get_cm_event(ch, &event) == 0, "rdma_get_cm_event");
    if (event->event != type) {
        fprintf(stderr, "got %s, not %s\n", rdma_event_str(event->event), rdma_event_str(type));
        exit(1);
    }
    return event;
}

int main(int argc, char **argv) {
    static uint8_t region[4096];
    static struct { uint64_t addr; uint32_t rkey; } window_at;
    struct addrinfo *dst;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 1,
        .max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
    struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
                                     .retry_count = 7, .rnr_retry_count = 7 };
    if (argc != 3 || getaddrinfo(argv[1], argv[2], NULL, &dst)) { fprintf(stderr, "usage\n"); return 1; }
    for (int i = 0; i < (int)sizeof region; i++)
        region[i] = (uint8_t)(i * 7 + 3);
    CHECK(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(id, NULL, dst->ai_addr, 2000) == 0, "rdma_resolve_addr");
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    CHECK(rdma_create_qp(id, NULL, &attr) == 0, "rdma_create_qp");
    struct ibv_mr *mr = ibv_reg_mr(id->pd, region, sizeof region,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_mw *mw = ibv_alloc_mw(id->pd, IBV_MW_TYPE_1);
    CHECK(mw, "ibv_alloc_mw");
    printf("window type 1: %d\n", mw->type == IBV_MW_TYPE_1);
    uint32_t allocated = mw->rkey;
    CHECK(rdma_connect(id, &param) == 0, "rdma_connect");
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));

    struct ibv_mw_bind bind = {
        .wr_id = 7,
        .send_flags = IBV_SEND_SIGNALED,
        .bind_info = { .mr = mr, .addr = (uintptr_t)region + 1024, .length = 512,
                       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
    };
    CHECK(ibv_bind_mw(id->qp, mw, &bind) == 0, "ibv_bind_mw");
    printf("rkey changed by the bind: %d\n", mw->rkey != allocated);
    struct ibv_wc wc = next_wc(id->send_cq);
    printf("bind completion: wr_id %llu status %d opcode %d\n", (unsigned long long)wc.wr_id,
           wc.status, wc.opcode == IBV_WC_BIND_MW);

    window_at.addr = (uintptr_t)region + 1024;
    window_at.rkey = mw->rkey;
    struct ibv_sge sge = { .addr = (uintptr_t)&window_at, .length = 12, .lkey = 0 };
    struct ibv_send_wr send = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
                                .opcode = IBV_WR_SEND,
                                .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
    struct ibv_send_wr *bad;
    CHECK(ibv_post_send(id->qp, &send, &bad) == 0, "ibv_post_send");
    wc = next_wc(id->send_cq);
    printf("send completion: wr_id %llu status %d\n", (unsigned long long)wc.wr_id, wc.status);
    /* The server READs through the window, then disconnects. */
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
    CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
    rdma_destroy_qp(id);
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    printf("done\n");
    return 0;
}
